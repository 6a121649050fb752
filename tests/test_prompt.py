"""The prompt, the schema block (descriptions, examples, shortening, cache), the tool spec, the parsers."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

import t2sql
from conftest import bird_root
from t2sql import errors
from t2sql._grader import METHODS, Method
from t2sql.episode import parsing
from t2sql.episode import prompt as P
from t2sql.episode import schema as schema_module
from t2sql.episode.presets import get_preset
from t2sql.tasks import Task

BIRD = bird_root()
RECIPE = get_preset()
# The schema's example values as the recipe's prompt asks for them (the preset owns the numbers).
EXAMPLES = {"example_values": RECIPE.prompt.example_values, "example_value_chars": RECIPE.prompt.example_value_chars}



def bird_task(question_id: int) -> Task:
    rows = json.loads((BIRD / "dev.json").read_text())
    row = next(r for r in rows if r["question_id"] == question_id)
    return Task.from_row(row, BIRD)


# -- tool spec and system prompt

def test_tool_spec_is_an_openai_function_spec_and_a_fresh_copy():
    specs = P.tool_specs()
    assert len(specs) == 1
    fn = specs[0]["function"]
    assert specs[0]["type"] == "function" and fn["name"] == "execute_sql_query"
    assert fn["parameters"]["required"] == ["query"]
    assert fn["parameters"]["properties"]["query"]["type"] == "string"
    specs[0]["function"]["name"] = "changed"
    assert P.tool_specs()[0]["function"]["name"] == "execute_sql_query"


def test_system_prompt_states_budget_format_and_evidence_rules():
    text = P.system_prompt(RECIPE)
    assert "at most 5 times" in text and "execute_sql_query" in text
    assert "<solution>" in text and "the last one counts" in text
    # The recipe's enumerated evidence protocol, with both line formats.
    assert "Requirement of external knowledge <number> (<the piece>):" in text
    assert "Verification of external knowledge <number> (<the piece>):" in text
    coverage = P.system_prompt(RECIPE.replace(reward={"evidence_rule": "coverage"}))
    assert "restate the evidence" in coverage and "check your query against every part of the evidence" in coverage
    assert "at most 3 times" in P.system_prompt(RECIPE.replace(budgets={"max_tool_calls": 3}))
    assert f"the first {RECIPE.tool.max_rows} rows" in text
    assert "the first 7 rows" in P.system_prompt(RECIPE.replace(tool={"max_rows": 7}))  # the preset's, read
    assert "row order does not matter" in text and "the number and order of columns matter" in text
    assert "row order matters" in P.system_prompt(RECIPE.replace(grading={"method": "ordered"}))
    ignore = RECIPE.replace(grading={"column_order": "ignore"})
    assert "columns matters, their order and names do not" in P.system_prompt(ignore)
    # A task's own method states its comparison.
    assert "return exactly 5 distinct rows, each a row of the correct result" in P.system_prompt(RECIPE, "subset,=,5")
    assert "at least 2 distinct rows" in P.system_prompt(RECIPE, "subset,>=,2")


# Every way the core's parser (grader_rs/src/digest/method.rs) reads a method: any case, any spaces,
# `list` for ordered, `==` for a subset's `=`, any count; each form of the core's METHODS.
METHOD_SPELLINGS = (
    "multiset", " MultiSet ", "set", "SET", "ordered", " Ordered", "list", "LIST ",
    "subset,==,3", "SUBSET,==,1",
    *(spelling for form in METHODS if form.startswith("subset,")
      for spelling in (form.replace("N", "3"), " " + form.replace(",", " , ").replace("N", "1").title(),
                       form.upper().replace("N", "2"))),
    "auto", " AUTO ",
)
COLOURS = "SELECT id, colour FROM colour WHERE id <= 4"  # four distinct rows


def _prompt_rule(method: str, gold: str) -> str:
    """The ordering rule the system prompt of a task graded by `method` states."""
    task = Task("m", "superhero", str(BIRD / "superhero" / "superhero.sqlite"), "Which colours?", "", gold,
                grading_method=method)
    system = P.build_prompt(task, RECIPE)[0]["content"]
    rule = re.search(r"compared with the correct result: (.*?); the number", system, re.S)
    assert rule, system
    return rule.group(1)


@pytest.mark.parametrize("method", METHOD_SPELLINGS)
def test_the_prompt_states_the_rule_the_answer_is_graded_by(method):
    db = str(BIRD / "superhero" / "superhero.sqlite")
    outcome = lambda pred, gold: t2sql.grade(db, pred, gold, method).outcome  # noqa: E731
    gold = f"{COLOURS} ORDER BY id"
    rule = _prompt_rule(method, gold)
    parsed = method.replace(" ", "").lower()
    if parsed.startswith("subset"):
        n = int(parsed.rsplit(",", 1)[1])
        # n distinct gold rows always do; the rule says the count in the core's words for the comparison
        # (what those words mean is checked against a reference in test_core_property.py).
        assert outcome(f"{COLOURS} LIMIT {n}", gold) == "match"
        words = Method(method).operator_words
        assert f"return {words} {n} distinct rows" in rule, (method, rule)
        assert "row order does not matter" in rule
        return
    reversed_rows = outcome(f"{COLOURS} ORDER BY id DESC", gold)
    duplicated = outcome(f"{gold.replace(' ORDER BY id', '')} UNION ALL SELECT 4, 'Black' ORDER BY id", gold)
    if parsed == "auto":
        # Ordered exactly when the gold orders its rows: what the prompt tells the model to do.
        assert rule.startswith("row order matters only if the question asks for an ordering"), rule
        assert reversed_rows == "mismatch" and outcome(f"{COLOURS} ORDER BY id DESC", COLOURS) == "match"
        return
    assert rule.startswith("row order matters") == (reversed_rows == "mismatch"), (method, rule)
    assert ("duplicate rows do not matter" in rule) == (duplicated == "match"), (method, rule)


def test_user_prompt_lists_each_evidence_piece_with_both_labels():
    from t2sql.tasks import Task

    task = Task("1", "db", "db.sqlite", "How many?", "a refers to x = 1; b refers to y = 'B';", "SELECT 1")
    text = P.user_prompt(task, "CREATE TABLE t(x)", "enumerated")
    assert "The evidence has 2 pieces." in text
    assert "Requirement of external knowledge 1 (a refers to x = 1): ...\n" in text
    assert "Requirement of external knowledge 2 (b refers to y = 'B'): ...\n" in text
    assert "Verification of external knowledge 2 (b refers to y = 'B'): ...\n" in text
    assert "Requirement of external knowledge 3" not in text  # the trailing ';' is no piece
    assert "external knowledge" not in P.user_prompt(task, "CREATE TABLE t(x)", "coverage")
    no_evidence = Task("2", "db", "db.sqlite", "How many?", "", "SELECT 1")
    assert "external knowledge" not in P.user_prompt(no_evidence, "CREATE TABLE t(x)", "enumerated")


# -- the prompt on a real BIRD database

def test_build_prompt_on_superhero():
    task = bird_task(772)  # Dark Horse Comics, female heroes: has evidence
    msgs = P.build_prompt(task, RECIPE)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert user.startswith("Database: superhero\n\nSchema:\nCREATE TABLE alignment")
    assert "CREATE TABLE superhero" in user and "CREATE TABLE hero_power" in user
    assert "--   full_name: the full name of the superhero" in user  # BIRD description
    assert "'Dark Horse Comics'" in user  # an example value of publisher_name
    assert f"Evidence: {task.evidence.strip()}" in user
    assert user.endswith(f"Question: {task.question}")
    # every CREATE statement of sqlite_master is there whole
    import sqlite3

    con = sqlite3.connect(f"file:{task.db_path}?mode=ro", uri=True)
    for (sql,) in con.execute("SELECT sql FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"):
        assert sql.strip() in user
    con.close()


def test_no_evidence_is_shown_as_none():
    rows = json.loads((BIRD / "dev.json").read_text())
    row = next(r for r in rows if not r["evidence"].strip())
    user = P.build_prompt(Task.from_row(row, BIRD), RECIPE)[1]["content"]
    assert "Evidence: (none)" in user


# -- descriptions: BIRD's CSVs and their encodings

def _write_desc(tmp: Path, name: str, data: bytes) -> Path:
    folder = tmp / "database_description"
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(data)
    return tmp


HEADER = "original_column_name,column_name,column_description,data_format,value_description\r\n"


@pytest.mark.parametrize(
    "encoding, text, expected",
    [
        ("utf-8", "name,,the café name,text,\r\n", "the café name"),
        ("utf-8-sig", "name,,the café name,text,\r\n", "the café name"),
        ("cp1252", 'name,,kinds,text,"\u2022 Standard \u2022 PO Box"\r\n', "\u2022 Standard \u2022 PO Box"),
        # 0x81 is undefined in Windows-1252: only the latin-1 fallback reads this file
        ("latin-1", "name,,the café name \x81,text,\r\n", "the café name"),
    ],
)
def test_descriptions_in_odd_encodings(tmp_path, encoding, text, expected):
    _write_desc(tmp_path, "Things.csv", (HEADER + text).encode(encoding))
    desc = schema_module.read_descriptions(tmp_path)
    assert desc == {"things": {"name": (expected if encoding != "cp1252" else "kinds",
                                        "" if encoding != "cp1252" else expected)}}


def test_descriptions_missing_folder_and_bad_rows(tmp_path):
    assert schema_module.read_descriptions(tmp_path) == {}
    _write_desc(tmp_path, "t.csv",
                (HEADER + ",,no column name,text,\r\nok,,fine,text,commonsense evidence: x\r\n").encode())
    assert schema_module.read_descriptions(tmp_path) == {"t": {"ok": ("fine", "x")}}


def test_bird_mojibake_bullets_are_read_back():
    # toxicology's CSVs are UTF-8 holding U+0095 (a Windows-1252 bullet decoded as Latin-1)
    values = schema_module.read_descriptions(BIRD / "toxicology")["atom"]["element"][1]
    assert values.startswith("\u2022 cl: chlorine \u2022 c: carbon") and "\x95" not in values


def test_bird_replacement_characters_become_dashes():
    desc = schema_module.read_descriptions(BIRD / "student_club")
    assert "\ufffd" not in desc["zip_code"]["type"][1]
    assert desc["zip_code"]["type"][1].startswith("- Standard:")


# -- shortening, in the stated order

def test_schema_shortening_order():
    schema = P.load_schema(str(BIRD / "student_club" / "student_club.sqlite"), **EXAMPLES)
    full = P.render_schema(schema, RECIPE)
    assert full.level == 0 and "examples: " in full.text and "values: " in full.text
    lengths = {}
    # find each level's length by shrinking the budget just below the previous level
    previous = full
    for expected_level in (1, 2, 3, 4):
        r = P.render_schema(schema, RECIPE.replace(prompt={"schema_max_chars": len(previous.text) - 1}))
        assert r.level == expected_level, (expected_level, r.level)
        assert len(r.text) < len(previous.text)
        lengths[expected_level] = r
        previous = r
    assert "examples: " not in lengths[1].text and "values: " in lengths[1].text  # 1: examples dropped
    assert "values: " not in lengths[2].text and "columns:" in lengths[2].text  # 2: value descriptions
    assert "columns:" not in lengths[3].text and "\n    event_id" in lengths[3].text  # 3: descriptions
    assert "\n    " not in lengths[4].text and "CREATE TABLE event ( event_id TEXT" in lengths[4].text


def test_schema_drops_least_relevant_tables_whole_and_names_them():
    schema = P.load_schema(str(BIRD / "student_club" / "student_club.sqlite"), **EXAMPLES)
    compact = P.render_schema(schema, RECIPE.replace(prompt={"schema_max_chars": len(P.render_schema(
        schema, RECIPE.replace(prompt={"schema_max_chars": 10**6})).text)}))  # sanity: fits at level 0
    assert compact.level == 0
    r = P.render_schema(schema, RECIPE.replace(prompt={"schema_max_chars": 900}),
                        question="What is the total cost of expenses?", evidence="cost refers to expense.cost")
    assert r.level == 5 and r.dropped_tables
    assert 'CREATE TABLE "expense"' in r.text  # the most relevant table is kept
    assert "Not shown" in r.text and all(t in r.text.split("Not shown")[1] for t in r.dropped_tables)
    kept = [t for t in schema.tables if t.name not in r.dropped_tables]
    for t in kept:  # never cut mid-statement: every kept statement is whole
        assert schema_module._clean(t.sql).rstrip(";") + ";" in r.text
    shown = r.text.split("Not shown")[0]
    for t in schema.tables:
        if t.name in r.dropped_tables:
            assert schema_module._clean(t.sql) not in shown and f"-- {t.name} columns:" not in shown


def test_one_table_over_budget_is_kept_whole_and_reported():
    schema = P.load_schema(str(BIRD / "superhero" / "superhero.sqlite"), **EXAMPLES)
    r = P.render_schema(schema, RECIPE.replace(prompt={"schema_max_chars": 50}), question="superhero names")
    assert r.level == 5 and not r.fits
    assert len([t for t in schema.tables if t.name not in r.dropped_tables]) == 1


def test_schema_cache_per_file(tmp_path):
    src = BIRD / "superhero"
    dst = tmp_path / "superhero"
    shutil.copytree(src, dst)
    path = str(dst / "superhero.sqlite")
    a = P.load_schema(path, **EXAMPLES)
    assert P.load_schema(path, **EXAMPLES) is a
    os.utime(path, ns=(1, 1))  # a changed file is loaded again
    assert P.load_schema(path, **EXAMPLES) is not a
    with pytest.raises(errors.SchemaError, match="check --db-root"):
        P.load_schema(str(tmp_path / "missing.sqlite"), **EXAMPLES)


# -- think

@pytest.mark.parametrize(
    "text, think, visible",
    [
        ("<think>a</think>b", "a", "b"),
        ("x<think>a</think>b<think>c</think>d", "ac", "xbd"),
        ("<think>cut off by the limit", "cut off by the limit", ""),
        ("a</think>b", "a", "b"),  # the template opened <think> in the prompt
        ("no thinking", "", "no thinking"),
        ("<think>a</think>b<think>unclosed", "aunclosed", "b"),
    ],
)
def test_split_think(text, think, visible):
    assert parsing.split_think(text) == (think, visible)
    assert parsing.strip_think(text) == visible


# -- solutions

@pytest.mark.parametrize(
    "visible, expected",
    [
        ("<solution>SELECT 1</solution>", "SELECT 1"),
        ("<solution>SELECT 1</solution> then <solution>\nSELECT 2\n</solution>", "SELECT 2"),  # the last counts
        ("<solution>```sql\nSELECT 3\n```</solution>", "SELECT 3"),
        ("done <solution>\nSELECT 4", "SELECT 4"),  # stop string trimmed
        ("<solution>SELECT 1</solution> and <solution>SELECT 5", "SELECT 5"),
        ("<solution></solution>", ""),
        ("no answer here", None),
    ],
)
def test_parse_solution(visible, expected):
    assert parsing.parse_solution(visible) == expected


# -- tool calls

XML = ("<tool_call>\n<function=execute_sql_query>\n<parameter=query>\nSELECT * FROM t\n</parameter>\n"
       "</function>\n</tool_call>")


def test_xml_and_json_forms():
    (call,) = parsing.parse_tool_calls("let me look " + XML)
    assert call.valid and call.query == "SELECT * FROM t" and call.name == "execute_sql_query"
    j = '<tool_call>\n{"name": "execute_sql_query", "arguments": {"query": "SELECT 2"}}\n</tool_call>'
    (call,) = parsing.parse_tool_calls(j)
    assert call.valid and call.query == "SELECT 2"
    s = '<tool_call>{"name": "execute_sql_query", "arguments": "{\\"query\\": \\"SELECT 3\\"}"}</tool_call>'
    (call,) = parsing.parse_tool_calls(s)
    assert call.valid and call.query == "SELECT 3"
    calls = parsing.parse_tool_calls(XML + "\n" + j)
    assert [c.query for c in calls] == ["SELECT * FROM t", "SELECT 2"]
    (call,) = parsing.parse_tool_calls(XML.replace("</tool_call>", ""))  # stop string trimmed
    assert call.valid


def test_multiline_sql_survives_the_xml_form():
    sql = "SELECT a,\n       b\nFROM t\nWHERE x = '<y>'"
    (call,) = parsing.parse_tool_calls(
        f"<tool_call><function=execute_sql_query><parameter=query>{sql}</parameter></function></tool_call>")
    assert call.query == sql


@pytest.mark.parametrize(
    "text, error",
    [
        ("<tool_call>\n<function=run_sql>\n<parameter=query>SELECT 1</parameter>\n</function>\n</tool_call>",
         "unknown tool 'run_sql'"),
        ("<tool_call><function=execute_sql_query><parameter=sql>SELECT 1</parameter></function></tool_call>",
         "'query' argument is missing"),
        ("<tool_call><function=execute_sql_query><parameter=query>  \n </parameter></function></tool_call>",
         "'query' argument is empty"),
        ("<tool_call><function=execute_sql_query><parameter=query>SELECT 1</parameter></tool_call>",
         "not closed with </function>"),
        ("<tool_call><function=execute_sql_query><parameter=query>SELECT 1</function></tool_call>",
         "not closed with </parameter>"),
        ("<tool_call><function=execute_sql_query><parameter=query>a</parameter><parameter=query>b</parameter>"
         "</function></tool_call>", "given twice"),
        ('<tool_call>{"name": "execute_sql_query", "arguments": {"query": "SELECT 1"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "execute_sql_query", "arguments": "{query: 1}"}</tool_call>',
         "arguments string is not valid JSON"),
        ('<tool_call>{"name": "execute_sql_query", "arguments": {"query": 7}}</tool_call>',
         "missing (or not a string)"),
        ('<tool_call>{"name": "execute_sql_query", "arguments": ["SELECT 1"]}</tool_call>', "not an object"),
        ('<tool_call>{"arguments": {"query": "SELECT 1"}}</tool_call>', "no function name"),
        ('<tool_call>["execute_sql_query"]</tool_call>', "JSON is not an object"),
        ("<tool_call>execute_sql_query(SELECT 1)</tool_call>", "neither the XML nor the JSON form"),
        ("<tool_call></tool_call>", "is empty"),
        ("<function=execute_sql_query><parameter=query>SELECT 1</parameter></function>", "outside <tool_call>"),
    ],
)
def test_malformed_tool_calls_are_invalid_never_exceptions(text, error):
    (call,) = parsing.parse_tool_calls(text)
    assert not call.valid and error in call.error


def test_structured_tool_calls():
    calls = parsing.parse_structured_tool_calls([
        {"id": "c1", "type": "function",
         "function": {"name": "execute_sql_query", "arguments": '{"query": "SELECT 1"}'}},
        {"id": "c2", "type": "function",
         "function": {"name": "execute_sql_query", "arguments": {"query": "SELECT 2"}}},
        {"id": "c3", "type": "function", "function": {"name": "execute_sql_query", "arguments": "{bad"}},
        {"id": "c4", "type": "function", "function": {"name": "other", "arguments": "{}"}},
        {"id": "c5"},
        "not a dict",
    ])
    assert [(c.id, c.query) for c in calls[:2]] == [("c1", "SELECT 1"), ("c2", "SELECT 2")]
    assert [c.valid for c in calls] == [True, True, False, False, False, False]
    assert calls[2].id == "c3" and "not valid JSON" in calls[2].error
    assert "unknown tool 'other'" in calls[3].error


def test_prose_drops_tool_calls_and_solutions():
    text = "I restate it. " + XML + " more <solution>SELECT secret_column</solution> end"
    out = parsing.prose(text)
    assert "restate" in out and "end" in out and "secret_column" not in out and "SELECT * FROM t" not in out
    assert "secret" not in parsing.prose("a <solution>SELECT secret")


def test_render_is_cached_per_schema_unless_tables_are_dropped():
    schema = P.load_schema(str(BIRD / "student_club" / "student_club.sqlite"), **EXAMPLES)
    a = P.render_schema(schema, RECIPE, question="q1")
    assert P.render_schema(schema, RECIPE, question="another question") is a
    tight = RECIPE.replace(prompt={"schema_max_chars": 900})
    expense = P.render_schema(schema, tight, question="total cost of expenses")
    member = P.render_schema(schema, tight, question="member first_name last_name email")
    assert 'CREATE TABLE "expense"' in expense.text and 'CREATE TABLE "member"' in member.text
    assert expense.dropped_tables != member.dropped_tables
