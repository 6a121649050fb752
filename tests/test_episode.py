"""The episode state machine on a real BIRD database through the real Grader: every rule of
episode.md and every row of the reward table, driven turn by turn as the adapters drive it."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import pytest

import t2sql
from conftest import bird_root, tool_limits
from t2sql import GradeSpec, ToolLimits
from t2sql.episode.machine import Episode
from t2sql.episode.presets import get_preset
from t2sql.equivalence.check import EquivalenceConfig
from t2sql.errors import EpisodeFinished, TaskError
from t2sql.serving.grader import Grader
from t2sql.tasks import Task

BIRD = bird_root()

RECIPE = get_preset("qwen3.6-35b-a3b")
BARE = get_preset("bare")
SLOW_SQL = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"


@pytest.fixture(scope="module")
def db_root(tmp_path_factory) -> Path:
    # A private copy: a rule that failed to stop a write would damage only the copy (and we check it).
    root = tmp_path_factory.mktemp("bird")
    shutil.copytree(BIRD / "superhero", root / "superhero")
    return root


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return [r for r in json.loads((BIRD / "dev.json").read_text()) if r["db_id"] == "superhero"]


@pytest.fixture
def grader():
    g = Grader(concurrency=2)
    yield g
    g.close()


def task(rows, db_root, qid: int = 772, **changes) -> Task:
    row = dict(next(r for r in rows if r["question_id"] == qid))
    row.update(changes)
    return Task.from_row(row, db_root)


def no_evidence_task(rows, db_root) -> Task:
    row = next(r for r in rows if not r["evidence"].strip())
    return Task.from_row(row, db_root)


def xml(sql: str) -> str:
    return (f"<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n{sql}\n"
            "</parameter>\n</function>\n</tool_call>")


def js(sql: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "execute_sql_query", "arguments": {"query": sql}}) + "\n</tool_call>"


def play(episode: Episode, *turns):
    """Feed turns (text, or (text, kwargs)) until the episode ends; return the last TurnOutcome."""

    async def go():
        outcome = None
        for t in turns:
            text, kwargs = (t, {}) if isinstance(t, str) else t
            outcome = await episode.on_turn(text, **kwargs)
            if outcome.done:
                break
        return outcome

    return asyncio.run(go())


def sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- the reward table, one row per test, through whole episodes ("bare": outcome table only)

def test_correct(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    out = play(e, "<think>look first</think>" + xml("SELECT publisher_name FROM publisher LIMIT 3"),
               f"<solution>\n{t.gold_sql}\n</solution>")
    r = e.result
    assert out.done and r.outcome == "correct" and r.reward == 1.0 and r.correct
    assert r.grade["outcome"] == "match" and r.solution == t.gold_sql
    assert r.turns == 2 and r.tool_calls == 1 and r.invalid_tool_calls == 0
    roles = [m["role"] for m in e.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert "publisher_name" in e.messages[3]["content"]


def test_incorrect(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    play(e, "<solution>SELECT eye_colour_id FROM superhero</solution>")
    assert e.result.outcome == "incorrect" and e.result.reward == 0.0 and not e.result.correct


def test_pred_error_is_rewarded_as_incorrect(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    play(e, "<solution>SELECT no_such_column FROM superhero</solution>")
    assert e.result.outcome == "pred_error" and e.result.reward == 0.0


def test_a_solution_sqlite_cannot_parse_is_a_pred_error_not_unsafe(rows, db_root, grader):
    # A typo writes nothing: it scores as a wrong answer (0), never as a write (-1).
    e = Episode(task(rows, db_root), BARE, grader)
    play(e, "<solution>SELEC count(*) FROM superhero</solution>")
    assert e.result.outcome == "pred_error" and e.result.reward == 0.0
    assert "syntax error" in e.result.grade["detail"]


def test_pred_timeout_is_rewarded_as_incorrect_after_one_retry(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE.replace(grading={"timeout_s": 0.3}), grader)
    # three columns like the gold's, so no early mismatch: it must run into the deadline
    play(e, f"<solution>{SLOW_SQL.replace('max(x)', 'max(x), 1, 1')}</solution>")
    assert e.result.outcome == "pred_timeout" and e.result.reward == 0.0
    assert e.result.grade["retried"] is True


def test_no_solution(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    out = play(e, "<think>I could answer with <solution>SELECT 1</solution></think>I am not sure.")
    assert out.done and e.result.outcome == "no_solution" and e.result.reward == -1.0
    assert e.result.solution is None  # a solution inside <think> does not count


def test_empty_solution_is_no_solution(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    play(e, "<solution>\n</solution>")
    assert e.result.outcome == "no_solution" and e.result.reward == -1.0 and e.result.grade is None


def test_unsafe_tool_call_ends_the_rollout(rows, db_root, grader):
    t = task(rows, db_root)
    before = sha(t.db_path)
    e = Episode(t, RECIPE, grader)
    out = play(e, xml("SELECT 1") + xml("DROP TABLE superhero") + xml("SELECT 2"),
               f"<solution>{t.gold_sql}</solution>")
    assert out.done and out.tool_messages == []
    r = e.result
    assert r.outcome == "unsafe" and r.reward == -1.0 and r.turns == 1
    assert r.tool_calls == 2  # the third call of the turn never happened
    assert e.messages[-1]["role"] == "assistant"  # never ends on tool text
    assert sha(t.db_path) == before


def test_unsafe_solution(rows, db_root, grader):
    t = task(rows, db_root)
    before = sha(t.db_path)
    e = Episode(t, RECIPE, grader)
    play(e, "<tool_call>{bad json</tool_call>", "<tool_call>[]</tool_call>",
         "<solution>DELETE FROM superhero</solution>")
    r = e.result
    assert r.outcome == "unsafe" and r.invalid_tool_calls == 2
    assert r.reward == -1.0  # penalties never go below the floor in the recipe
    assert sha(t.db_path) == before
    e = Episode(t, RECIPE.replace(reward={"penalties_below_floor": True}), grader)
    play(e, "<tool_call>{bad json</tool_call>", "<tool_call>[]</tool_call>",
         "<solution>DELETE FROM superhero</solution>")
    assert e.result.reward < -1.0


def test_gold_error_is_reported_never_rewarded(rows, db_root, grader):
    t = task(rows, db_root, SQL="SELECT x FROM no_such_table")
    e = Episode(t, RECIPE, grader)
    play(e, "<solution>SELECT x FROM no_such_table</solution>")  # even the "same" query
    assert e.result.outcome == "gold_error" and e.result.reward == 0.0 and not e.result.correct


def test_turn_cut_think_only(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    out = play(e, ("<think>" + "hmm " * 100, {"cut": "turn"}))
    r = e.result
    assert out.done and r.outcome == "turn_cut" and r.reward == -1.0
    assert r.metrics["think_tokens"] == [100]


def test_context_cut_is_never_graded_even_with_a_solution(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    play(e, (f"<solution>{t.gold_sql}</solution>", {"cut": "context"}))
    r = e.result
    assert r.outcome == "context_cut" and r.reward == -1.0 and r.grade is None and not r.correct


# -- tool calls

def test_json_form_and_sql_errors_are_shown_and_the_episode_goes_on(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    out = play(e, js("SELECT no_such_column FROM superhero"))
    assert not out.done
    (msg,) = out.tool_messages
    assert msg["content"].startswith("Error: ") and "no_such_column" in msg["content"]
    assert e.messages[-1] == msg
    play(e, js("SELECT count(*) FROM superhero"), f"<solution>{t.gold_sql}</solution>")
    assert e.result.outcome == "correct" and e.result.metrics["tool_errors"] == 1


def test_a_tool_call_sqlite_cannot_parse_shows_its_error_and_the_episode_goes_on(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    shown = []
    for typo in ("SELEC count(*) FROM superhero", "WITH x AS (SELEC 1) SELECT * FROM x",
                 "SELECT 1; SELEC 2", "EXPLAIN SELECT 1"):
        out = play(e, xml(typo))
        assert not out.done, typo
        (msg,) = out.tool_messages
        shown.append(msg["content"])
    assert all(m.startswith('Error: near "SELEC": syntax error') for m in shown[:3]), shown
    assert shown[3].startswith("Error: EXPLAIN shows SQLite's plan"), shown
    play(e, f"<solution>{t.gold_sql}</solution>")
    assert e.result.outcome == "correct" and e.result.metrics["tool_errors"] == 4


def test_tool_timeout_is_an_error_message(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE.replace(tool={"timeout_s": 0.3}), grader)
    out = play(e, xml(SLOW_SQL))
    assert not out.done
    assert out.tool_messages[0]["content"] == "Error: query timed out after 0.3s\n\n(4 tool calls left.)"


def test_a_presets_tool_limits_are_built_once_from_its_fields():
    preset = BARE.replace(tool={"max_rows": 3, "max_cell_chars": 30, "max_chars": 500, "count_cap": 40,
                                "timeout_s": 2.5})
    assert preset.tool_limits is preset.tool_limits  # one value per preset, not one per call
    assert preset.tool_limits == ToolLimits(timeout_s=2.5, max_rows=3, max_cell_chars=30, max_chars=500, count_cap=40)
    changed = preset.replace(tool={"max_rows": 4})
    assert changed.tool_limits.max_rows == 4 and preset.tool_limits.max_rows == 3  # replace() builds its own
    assert changed.to_dict() == {**preset.to_dict(), "tool": {**preset.to_dict()["tool"], "max_rows": 4}}  # not a field


def test_a_presets_tool_fields_are_the_preview_the_core_runs():
    # One place for those numbers: the preset's fields, which reach the core whole (the core has no default).
    wide = "SELECT id, superhero_name FROM superhero ORDER BY id"
    db = t2sql.Database(t2sql.tasks.sample_dir() / "superhero" / "superhero.sqlite")
    for preset in (RECIPE, BARE):
        limits = preset.tool_limits
        assert (limits.max_rows, limits.max_cell_chars, limits.max_chars, limits.count_cap, limits.timeout_s) == (
            preset.tool.max_rows, preset.tool.max_cell_chars, preset.tool.max_chars, preset.tool.count_cap,
            preset.tool.timeout_s)
        assert len(db.run_tool(wide, limits).rows) == preset.tool.max_rows


def test_a_tool_call_hands_the_grader_the_presets_limits_whole(rows, db_root, grader):
    preset = BARE.replace(tool={"max_rows": 2})
    seen: list = []

    class Recording:
        """The real Grader, its run_tool calls recorded."""

        def __getattr__(self, name):
            return getattr(grader, name)

        async def run_tool(self, db_path, sql, limits=None):
            seen.append(limits)
            return await grader.run_tool(db_path, sql, limits)

    e = Episode(no_evidence_task(rows, db_root), preset, Recording())
    out = play(e, xml("SELECT id FROM superhero ORDER BY id"))
    play(e, xml("SELECT 1"))
    assert len(seen) == 2 and all(limits is preset.tool_limits for limits in seen)
    assert out.tool_messages[0]["content"].startswith(grader.run_tool_sync(
        e.task.db_path, "SELECT id FROM superhero ORDER BY id", tool_limits(max_rows=2)).text)


def test_an_answer_is_graded_under_the_tasks_spec_built_once_and_handed_whole(rows, db_root, grader):
    """The preset builds a task's GradeSpec once (the core resolves its method then); the episode hands
    that very value to the Grader, and the equivalence check grades the copies as the episode did."""
    row = next(r for r in rows if t2sql.resolve_method(r["SQL"], "auto") == "ordered")
    t = dataclasses.replace(Task.from_row(row, db_root), grading_method="auto")
    preset = RECIPE.replace(grading={"float_digits": 6, "column_order": "ignore", "timeout_s": 7.0})
    seen: list = []

    class Recording:
        def __getattr__(self, name):
            return getattr(grader, name)

        async def grade(self, db_path, pred_sql, gold_sql, spec=None):
            seen.append(spec)
            return await grader.grade(db_path, pred_sql, gold_sql, spec)

    e = Episode(t, preset, Recording())
    assert e.grade_spec == GradeSpec("ordered", float_digits=6, column_order="ignore", timeout_s=7.0)
    assert preset.grade_spec(t) == e.grade_spec  # auto resolved against this gold's ORDER BY
    play(e, f"<solution>{t.gold_sql}</solution>")
    assert len(seen) == 1 and seen[0] is e.grade_spec and e.result.outcome == "correct"
    config = EquivalenceConfig.from_preset(preset, e.grade_spec)
    assert (config.spec.method, config.spec.float_digits, config.spec.column_order, config.spec.timeout_s) == (
        "ordered", 6, "ignore", preset.equivalence.timeout_s)


def test_every_tool_result_says_how_many_calls_are_left(rows, db_root, grader):
    e = Episode(no_evidence_task(rows, db_root), RECIPE, grader)
    notes = []
    for i in range(RECIPE.budgets.max_tool_calls):
        out = play(e, xml(f"SELECT {i}"))
        notes.append(out.tool_messages[0]["content"].rsplit("\n\n", 1)[1])
    assert notes == ["(4 tool calls left.)", "(3 tool calls left.)", "(2 tool calls left.)", "(1 tool call left.)",
                     "(That was your last tool call: 5 of 5 used. Answer next with <solution>...</solution>.)"]


def test_malformed_calls_count_as_calls_and_invalid_calls(rows, db_root, grader):
    t = no_evidence_task(rows, db_root)
    e = Episode(t, RECIPE, grader)
    turn = (xml("SELECT 1").replace("execute_sql_query", "run_sql")
            + "<tool_call><function=execute_sql_query><parameter=query> </parameter></function></tool_call>"
            + js("SELECT count(*) FROM superhero"))
    out = play(e, turn)
    contents = [m["content"] for m in out.tool_messages]
    assert "unknown tool 'run_sql'" in contents[0] and "<function=execute_sql_query>" in contents[0]
    assert "'query' argument is empty" in contents[1] and "not run" in contents[1]
    assert not contents[2].startswith("Error")
    assert e.tool_calls_left == 2
    play(e, f"<solution>{t.gold_sql}</solution>")
    r = e.result
    assert r.tool_calls == 3 and r.invalid_tool_calls == 2
    assert r.outcome == "correct" and r.reward_terms["invalid_tool_calls"] == pytest.approx(-0.1)


def test_sixth_call_is_not_run(rows, db_root, grader):
    t = no_evidence_task(rows, db_root)
    e = Episode(t, BARE, grader)
    queries = [f"SELECT id FROM superhero WHERE id = {i}" for i in range(1, 6)]
    outs = [play(e, xml(q)) for q in queries]
    assert "last tool call: 5 of 5" in outs[-1].tool_messages[0]["content"]
    sixth = play(e, xml("SELECT * FROM no_such_table"))
    content = sixth.tool_messages[0]["content"]
    assert "budget is spent" in content and "no such table" not in content  # never ran
    play(e, f"<solution>{t.gold_sql}</solution>")
    r = e.result
    assert r.tool_calls == 6 and r.invalid_tool_calls == 1 and r.metrics["executed_tool_calls"] == 5
    assert r.outcome == "correct"


def test_max_turns_stops_a_model_that_never_answers(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    turns = [xml(f"SELECT {i}") for i in range(20)]
    out = play(e, *turns)
    assert out.done and e.result.outcome == "no_solution" and e.result.turns == BARE.budgets.max_turns
    assert "max_turns" in e.result.detail


def test_structured_tool_calls_keep_their_ids(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    calls = [{"id": "call_7", "type": "function",
              "function": {"name": "execute_sql_query", "arguments": '{"query": "SELECT count(*) FROM publisher"}'}}]
    out = play(e, ("", {"tool_calls": calls}))
    (msg,) = out.tool_messages
    assert msg["tool_call_id"] == "call_7" and msg["role"] == "tool"
    assert e.messages[-2]["tool_calls"][0]["id"] == "call_7"


def test_database_gone_is_the_datas_fault(rows, db_root, grader, tmp_path):
    t = task(rows, db_root)
    gone = Task(t.question_id, t.db_id, str(tmp_path / "gone.sqlite"), t.question, t.evidence, t.gold_sql)
    e = Episode(gone, BARE, grader, prompt=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    out = play(e, xml("SELECT 1"))
    assert out.done and e.result.outcome == "gold_error" and e.result.reward == 0.0


# -- solutions and thinking

def test_last_solution_block_counts(rows, db_root, grader):
    t = task(rows, db_root)
    wrong = "SELECT id FROM superhero"
    e = Episode(t, BARE, grader)
    play(e, f"<solution>{wrong}</solution> on second thought <solution>{t.gold_sql}</solution>")
    assert e.result.outcome == "correct"
    e = Episode(t, BARE, grader)
    play(e, f"<solution>{t.gold_sql}</solution> on second thought <solution>{wrong}</solution>")
    assert e.result.outcome == "incorrect" and e.result.solution == wrong


def test_solution_wins_over_tool_calls_in_the_same_turn(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    play(e, xml("DROP TABLE superhero") + f"<solution>{t.gold_sql}</solution>")
    assert e.result.outcome == "correct" and e.result.tool_calls == 0


def test_template_opened_think(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, BARE, grader)
    play(e, f"the prompt opened the think block</think>\n<solution>{t.gold_sql}</solution>")
    assert e.result.outcome == "correct" and e.result.metrics["think_tokens"] == [6]


# -- evidence rules through episodes (recipe)

def _labels(t: Task, kind: str) -> str:
    from t2sql.episode.evidence import evidence_label_lines, evidence_pieces

    return evidence_label_lines(evidence_pieces(t.evidence), kind, "right.")


def test_evidence_rules_met(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, RECIPE, grader)
    play(e,
         f"<think>plan</think>{_labels(t, 'Requirement')}" + xml("SELECT id, gender FROM gender"),
         f"{_labels(t, 'Verification')}<solution>{t.gold_sql}</solution>")
    r = e.result
    assert r.evidence_restated and r.evidence_checked and r.metrics["evidence_rules_met"] == 2
    assert r.reward == 1.0


def test_evidence_rules_met_under_the_coverage_rule(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, RECIPE.replace(reward={"evidence_rule": "coverage"}), grader)
    play(e,
         f"<think>plan</think>Evidence, restated: {t.evidence}\n" + xml("SELECT id, gender FROM gender"),
         "Checking against the evidence: gender = 'Female', publisher_name = 'Dark Horse Comics', "
         f"and eye_colour_id, hair_colour_id, skin_colour_id are the columns.\n<solution>{t.gold_sql}</solution>")
    r = e.result
    assert r.evidence_restated and r.evidence_checked and r.reward == 1.0


def test_evidence_rules_missed(rows, db_root, grader):
    t = task(rows, db_root)
    e = Episode(t, RECIPE, grader)
    # the labels only inside <think>: thinking does not count
    play(e, f"<think>{_labels(t, 'Requirement')}</think>Let me look.\n" + xml(t.gold_sql),
         f"<think>{_labels(t, 'Verification')}</think><solution>{t.gold_sql}</solution>")
    r = e.result
    assert r.outcome == "correct" and not r.evidence_restated and not r.evidence_checked
    assert r.reward == pytest.approx(0.8)


def test_no_evidence_task_has_no_evidence_penalty(rows, db_root, grader):
    t = no_evidence_task(rows, db_root)
    e = Episode(t, RECIPE, grader)
    play(e, f"<solution>{t.gold_sql}</solution>")
    assert not e.result.has_evidence and e.result.reward == 1.0


# -- the machine's own contract

def test_on_turn_after_the_end_is_an_error(rows, db_root, grader):
    e = Episode(task(rows, db_root), BARE, grader)
    play(e, "nothing")
    with pytest.raises(EpisodeFinished, match="already ended"):
        play(e, "more")
    with pytest.raises(ValueError, match="cut must be"):
        play(Episode(task(rows, db_root), BARE, grader), ("x", {"cut": "length"}))


def test_turn_token_budget(rows, db_root, grader):
    e = Episode(task(rows, db_root), RECIPE, grader)
    assert e.turn_token_budget(0) == 3072
    assert e.turn_token_budget(RECIPE.budgets.max_context_tokens - 100) == 100
    assert e.turn_token_budget(RECIPE.budgets.max_context_tokens + 5) <= 0


def test_result_is_plain_json(rows, db_root, grader):
    import dataclasses

    t = task(rows, db_root)
    e = Episode(t, RECIPE, grader)
    play(e, xml("SELECT 1"), f"<solution>{t.gold_sql}</solution>")
    data = json.loads(json.dumps(dataclasses.asdict(e.result)))
    assert data["outcome"] == "correct" and data["metrics"]["turns"] == 2


# -- tasks from data rows

def test_task_from_bird_row_and_converted_row(rows, db_root):
    row = next(r for r in rows if r["question_id"] == 772)
    t = Task.from_row(row, db_root)
    assert t.question_id == "772" and t.db_path == str(db_root / "superhero" / "superhero.sqlite")
    assert t.gold_sql == row["SQL"] and t.difficulty == row["difficulty"]
    converted = {
        "prompt": [{"role": "system", "content": "s"}],
        "label": {"gold_sql": row["SQL"], "db_id": "superhero", "question_id": "772"},
        "metadata": {"question_id": "772", "db_id": "superhero", "db_path": "/elsewhere/superhero/superhero.sqlite",
                     "question": row["question"], "evidence": row["evidence"], "difficulty": "challenging"},
    }
    assert Task.from_row(converted) == Task(**{**t.__dict__, "db_path": "/elsewhere/superhero/superhero.sqlite"})
    assert Task.from_row(converted, db_root) == t  # a root wins over the recorded path
    assert Task.from_row({**converted, "label": "SELECT 1"}).gold_sql == "SELECT 1"


def test_task_errors_say_what_is_missing(rows, db_root):
    with pytest.raises(TaskError, match="lacks question, gold SQL"):
        Task.from_row({"question_id": 1, "db_id": "superhero"}, db_root)
    with pytest.raises(TaskError, match="no db_path; pass the database root"):
        Task.from_row({"question_id": 1, "db_id": "x", "question": "q", "SQL": "SELECT 1"})
    with pytest.raises(TaskError, match="must be a JSON object"):
        Task.from_row(["not", "a", "row"], db_root)


def test_one_rule_names_the_cut_for_every_transport():
    from t2sql.episode.budget import cut_reason

    assert cut_reason(False, 100, 100, 50, 200) is None  # stopped on its own
    assert cut_reason(True, 100, 100, 150, 200) == "turn"  # the per-turn limit stopped it
    assert cut_reason(True, 60, 100, 200, 200) == "context"  # the context budget set its limit
    assert cut_reason(True, 100, 100, 200, 200) == "context"  # full context, even at the turn limit
    assert cut_reason(True, 100, 100) == "turn"  # context use unknown
    assert cut_reason(False, 100, 100, 201, 200) == "context"  # ran past the budget (a short estimate)
