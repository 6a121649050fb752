"""What the model sees, and how its turns are read.

- `build_prompt(task, preset, db)`: the system message (role, the one tool, the budget, the answer
  format, the evidence rules) and the user message (schema, evidence, question).
- `TOOL_SPEC` / `tool_specs()`: `execute_sql_query(query)` as an OpenAI function spec.
- Parsers, all total (they never raise on model text): `split_think` / `strip_think`,
  `parse_solution`, `parse_tool_calls` (qwen3_coder XML and JSON-in-`<tool_call>`),
  `parse_structured_tool_calls` (OpenAI `tool_calls`), `prose`.

The schema block is built per database once (`load_schema`, cached by path and file identity) and
rendered per task under `preset.schema_max_chars`. A schema over the budget is shortened in this
order, one step at a time, until it fits (the step taken is in `RenderedSchema.level`):

  1. drop the example values;
  2. drop BIRD's value descriptions (the long "value_description" notes);
  3. drop the column descriptions;
  4. collapse the whitespace inside each CREATE statement (nothing is lost);
  5. drop whole tables, the ones sharing the fewest words with the question and evidence first
     (ties: the later table first); the prompt names every dropped table.

A CREATE statement is never cut: at step 5 the most relevant table is always kept, even alone over
the budget.
"""

from __future__ import annotations

import asyncio
import copy
import csv
import io
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from t2sql.episode.reward import Preset, content_tokens, evidence_label_lines, evidence_pieces

if TYPE_CHECKING:
    from t2sql import Database
    from t2sql.episode.machine import Task

TOOL_NAME = "execute_sql_query"

TOOL_SPEC: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run one read-only SQLite query (a single SELECT or WITH ... SELECT statement) on the "
            "task's database and return the columns, the first rows and the total row count."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "One SQLite SELECT statement."},
            },
            "required": ["query"],
        },
    },
}


def tool_specs() -> list[dict[str, Any]]:
    """The tool list to give the chat template or the endpoint (a fresh copy each call)."""
    return [copy.deepcopy(TOOL_SPEC)]


EXPECTED_FORM = (
    "<tool_call>\n<function=execute_sql_query>\n<parameter=query>\nSELECT ...\n</parameter>\n"
    "</function>\n</tool_call>\n"
    'or <tool_call>{"name": "execute_sql_query", "arguments": {"query": "SELECT ..."}}</tool_call>'
)

_ORDER_RULE = {
    "multiset": "row order does not matter, duplicate rows do",
    "set": "row order and duplicate rows do not matter",
    "ordered": "row order matters, and so do duplicate rows",
    "auto": "row order matters only if the question asks for an ordering (then use ORDER BY)",
}


def order_rule(method: str) -> str:
    """How results are compared, in words, for the grading method of the task at hand."""
    if method.startswith("subset,"):
        _, op, n = method.split(",")
        count = f"exactly {n}" if op == "=" else f"at least {n}"
        return (f"return {count} distinct rows, each a row of the correct result (any of them will do; "
                "row order does not matter)")
    return _ORDER_RULE[method]


_EVIDENCE_RULES = {
    "coverage": (
        "1. In your first reply (at the latest your second), restate the evidence in your own words, naming the "
        "tables, columns and values it points to.\n"
        "2. In your final reply, check your query against every part of the evidence before you give it."
    ),
    "enumerated": (
        "The evidence comes in numbered pieces (listed with the question).\n"
        "1. In your first reply (at the latest your second), restate every piece on a line of its own, "
        "written exactly like this: Requirement of external knowledge <number> (<the piece>): <what it means "
        "for this database: tables, columns, values>\n"
        "2. In your final reply, verify every piece against your query on a line of its own, written exactly "
        "like this: Verification of external knowledge <number> (<the piece>): <how your query applies it>"
    ),
}

SYSTEM_TEMPLATE = """\
You are an expert data analyst. You answer a question about a SQLite database by writing one SQLite query.

Tool: you can explore the database with `execute_sql_query`, which runs one read-only SELECT \
(or WITH ... SELECT) statement and shows the columns, the first {max_rows} rows and the total row count. \
You may call it at most {max_tool_calls} times in total; after that you must answer. \
Anything but a single read-only query (writing, changing the schema, PRAGMA, ATTACH, several statements) \
ends the task at once with the worst score.

Evidence rules (when the question comes with evidence, i.e. domain knowledge and how it maps to the schema):
{evidence_rules}

Answer: when you are ready, give exactly one SQLite query inside <solution>...</solution>, for example
<solution>
SELECT name FROM people WHERE age > 30
</solution>
The reply holding <solution> ends the task (if it holds several, the last one counts). The query is run \
and its result compared with the correct result: {order_rule}; {column_rule}. Return only the columns the question asks for. A reply with neither a tool call nor \
a <solution> ends the task without an answer."""


def system_prompt(preset: Preset, method: str | None = None) -> str:
    """The system message. `method`: the task's grading method (default: the preset's)."""
    return SYSTEM_TEMPLATE.format(
        max_rows=preset.tool_max_rows,
        max_tool_calls=preset.max_tool_calls,
        order_rule=order_rule(method or preset.semantics),
        column_rule=("the number and order of columns matter, their names do not" if preset.column_order == "strict"
                     else "the number of columns matters, their order and names do not"),
        evidence_rules=_EVIDENCE_RULES[preset.evidence_rule],
    )


# ---------------------------------------------------------------------------------------------
# Schema: loaded once per database, rendered per task


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    description: str  # BIRD's column_description (may be "")
    value_description: str  # BIRD's value_description (may be "")
    examples: tuple[str, ...]  # rendered as SQL literals


@dataclass(frozen=True)
class TableInfo:
    name: str
    sql: str  # the CREATE statement as stored in sqlite_master
    columns: tuple[ColumnInfo, ...]


@dataclass(frozen=True)
class SchemaInfo:
    path: str
    tables: tuple[TableInfo, ...]


@dataclass(frozen=True)
class RenderedSchema:
    text: str
    level: int  # 0 = full; 1..5 = the last shortening step taken (see the module doc)
    dropped_tables: tuple[str, ...]
    fits: bool  # False only when even the most relevant table alone is over the budget


class SchemaError(ValueError):
    """The database's schema cannot be read (missing file, not SQLite, no tables)."""


def _literal(value: Any, max_chars: int) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return f"<blob {len(value)} bytes>"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return "'" + text.replace("'", "''").replace("\n", " ") + "'"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_C1 = re.compile("[\x80-\x9f]")


def _fix_c1(ch: re.Match) -> str:
    try:
        return ch.group(0).encode("latin-1").decode("cp1252")
    except UnicodeDecodeError:
        return " "


def _clean(text: str) -> str:
    # BIRD's CSVs carry Windows-1252 bytes mis-read as C1 controls (U+0095 for a bullet) and
    # U+FFFD where a bullet was lost upstream: re-read the first, show the second as a dash.
    return " ".join(_C1.sub(_fix_c1, text).replace("\ufffd", "-").split())


def _decode(raw: bytes) -> str:
    # BIRD's CSVs come in utf-8, utf-8 with BOM, and Windows-1252/latin-1 (bullets as 0x95).
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return raw.decode("latin-1")  # never fails


def read_descriptions(db_dir: str | os.PathLike) -> dict[str, dict[str, tuple[str, str]]]:
    """BIRD's `database_description/<table>.csv`: {table (lower): {column (lower): (desc, values)}}.

    A missing directory gives {}; an unreadable file or row is skipped (descriptions are optional).
    """
    folder = Path(db_dir) / "database_description"
    out: dict[str, dict[str, tuple[str, str]]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.csv")):
        try:
            text = _decode(path.read_bytes())
        except OSError:
            continue
        columns: dict[str, tuple[str, str]] = {}
        for row in csv.DictReader(io.StringIO(text)):
            row = {(k or "").strip().lower(): (v or "") for k, v in row.items() if isinstance(v, str)}
            name = row.get("original_column_name", "").strip()
            if not name:
                continue
            desc = _clean(row.get("column_description", ""))
            values = _clean(row.get("value_description", ""))
            values = re.sub(r"(?i)^commonsense evidence:\s*", "", values)
            columns[name.lower()] = (desc, values)
        out[path.stem.strip().lower()] = columns
    return out


def _table_columns(db: Database, table: str) -> list[str]:
    # PRAGMA is denied by the core's authorizer; an empty SELECT names the columns.
    return list(db.run_tool(f"SELECT * FROM {_quote_ident(table)} LIMIT 0", 5.0).columns)


def _examples(db: Database, table: str, column: str, n: int, max_chars: int) -> tuple[str, ...]:
    import t2sql

    if n <= 0:
        return ()
    sql = (
        f"SELECT DISTINCT {_quote_ident(column)} FROM {_quote_ident(table)} "
        f"WHERE {_quote_ident(column)} IS NOT NULL LIMIT {n}"
    )
    try:
        rows = db.run_tool(sql, 2.0, max_rows=n, max_cell_chars=max_chars + 1).rows
    except t2sql.T2sqlError:  # examples are a courtesy: a slow or odd column just shows none
        return ()
    return tuple(v for v in (_literal(r[0], max_chars) for r in rows) if v is not None)


def load_schema(db_path: str, *, example_values: int = 3, example_value_chars: int = 40,
                db: Database | None = None) -> SchemaInfo:
    """The schema of one database, with example values and BIRD descriptions.

    Cached per file (path, size, mtime) and options: every episode of a database reuses it. `db`,
    when given, is the open core Database to read through (else one is opened).
    """
    from t2sql.serving.manifest import file_identity

    try:
        identity = file_identity(db_path)
    except OSError as e:
        raise SchemaError(f"cannot read database {db_path}: {e.strerror}; check --db-root / db_path") from None
    key = (os.path.abspath(db_path), identity, example_values, example_value_chars)
    with _schema_lock:
        hit = _schema_cache.get(key)
    if hit is None:
        hit = _build_schema(key[0], example_values, example_value_chars, db)
        with _schema_lock:
            if len(_schema_cache) >= 512:  # many databases: forget the oldest
                _schema_cache.pop(next(iter(_schema_cache)))
            _schema_cache[key] = hit
    return hit


_schema_cache: dict[tuple, SchemaInfo] = {}
_schema_lock = threading.Lock()


def _build_schema(path: str, example_values: int, example_value_chars: int,
                  db: Database | None) -> SchemaInfo:
    import t2sql

    if db is None:
        try:
            db = t2sql.Database(path)
        except t2sql.DatabaseError as e:
            raise SchemaError(f"cannot open database {path}: {e}") from None
    try:
        entries = db.schema()
    except t2sql.T2sqlError as e:
        raise SchemaError(f"cannot read the schema of {path}: {e}") from None
    descriptions = read_descriptions(Path(path).parent)
    tables = []
    for kind, name, sql in entries:
        # Tables and views only: indexes and triggers are noise to the model; sqlite_* are internal.
        if kind not in ("table", "view") or not sql or name.startswith("sqlite_"):
            continue
        try:
            names = _table_columns(db, name)
        except t2sql.T2sqlError:
            names = []
        described = descriptions.get(name.lower(), {})
        columns = []
        for col in names:
            desc, values = described.get(col.lower(), ("", ""))
            columns.append(ColumnInfo(col, desc, values,
                                      _examples(db, name, col, example_values, example_value_chars)))
        tables.append(TableInfo(name, sql.strip(), tuple(columns)))
    if not tables:
        raise SchemaError(f"database {path} has no tables")
    return SchemaInfo(path, tuple(tables))


def _cut(text: str, n: int) -> str:
    if len(text) <= n:
        return text
    cut = text.rfind(" ", 0, n - 1)
    return text[: cut if cut > n // 2 else n - 1] + "…"


def _render_table(t: TableInfo, *, examples: bool, values: bool, descriptions: bool, compact: bool,
                  description_max_chars: int) -> str:
    sql = _clean(t.sql) if compact else t.sql
    lines = [sql.rstrip(";") + ";"]
    notes = []
    for c in t.columns:
        parts = []
        if descriptions and c.description:
            parts.append(_cut(c.description, description_max_chars))
        if descriptions and values and c.value_description:
            parts.append("values: " + _cut(c.value_description, description_max_chars))
        if examples and c.examples:
            parts.append("examples: " + ", ".join(c.examples))
        if parts:
            notes.append(f"--   {c.name}: " + "; ".join(parts))
    if notes:
        lines.append(f"-- {t.name} columns:")
        lines.extend(notes)
    return "\n".join(lines)


def render_schema(schema: SchemaInfo, preset: Preset, *, question: str = "", evidence: str = "") -> RenderedSchema:
    """The schema block under `preset.schema_max_chars`, shortened in the documented order.

    Levels 0-4 do not depend on the task, so their result is cached per schema and settings;
    only step 5 (dropping tables by relevance) is rendered per task.
    """
    key = (id(schema), preset.schema_max_chars, preset.example_values, preset.column_descriptions,
           preset.description_max_chars)
    with _schema_lock:
        hit = _render_cache.get(key)
    if hit is not None and hit[0] is schema and hit[1] is not None:
        return hit[1]
    rendered = _render(schema, preset, question, evidence)
    with _schema_lock:
        if len(_render_cache) >= 512:
            _render_cache.pop(next(iter(_render_cache)))
        # Keep the schema itself in the value: its id() cannot be reused while cached.
        _render_cache[key] = (schema, rendered if rendered.level < 5 else None)
    return rendered


_render_cache: dict[tuple, tuple[SchemaInfo, RenderedSchema | None]] = {}


def _render(schema: SchemaInfo, preset: Preset, question: str, evidence: str) -> RenderedSchema:
    budget = preset.schema_max_chars
    has_examples = preset.example_values > 0
    has_desc = preset.column_descriptions
    steps = [  # (level, examples, value descriptions, descriptions, compact)
        (0, has_examples, has_desc, has_desc, False),
        (1, False, has_desc, has_desc, False),
        (2, False, False, has_desc, False),
        (3, False, False, False, False),
        (4, False, False, False, True),
    ]
    blocks: list[str] = []
    level = 0
    for level, ex, vals, desc, compact in steps:
        blocks = [
            _render_table(t, examples=ex, values=vals, descriptions=desc, compact=compact,
                          description_max_chars=preset.description_max_chars)
            for t in schema.tables
        ]
        text = "\n\n".join(blocks)
        if len(text) <= budget:
            return RenderedSchema(text, level, (), True)
    # Step 5: drop whole tables, least related to the question and evidence first.
    wanted = content_tokens(question + " " + evidence)

    def relevance(i: int) -> tuple[int, int]:
        t = schema.tables[i]
        words = content_tokens(t.name + " " + " ".join(c.name for c in t.columns))
        return (len(words & wanted), -i)

    order = sorted(range(len(blocks)), key=relevance, reverse=True)  # most relevant first
    keep: list[int] = []
    used = 0
    for i in order:
        cost = len(blocks[i]) + (2 if keep else 0)
        if not keep or used + cost <= budget - 200:  # leave room for the note naming dropped tables
            keep.append(i)
            used += cost
    kept = sorted(keep)
    dropped = tuple(schema.tables[i].name for i in range(len(blocks)) if i not in keep)
    text = "\n\n".join(blocks[i] for i in kept)
    if dropped:
        note = ("-- Not shown (the schema is too long for the prompt): tables "
                + ", ".join(dropped) + ". Query them with execute_sql_query if needed.")
        text = text + "\n\n" + note
    return RenderedSchema(text, 5, dropped, len(text) <= budget)


# ---------------------------------------------------------------------------------------------
# The prompt


def user_prompt(task: Task, schema_text: str, evidence_rule: str = "coverage") -> str:
    evidence = task.evidence.strip() or "(none)"
    text = f"Database: {task.db_id}\n\nSchema:\n{schema_text}\n\nEvidence: {evidence}\n\n"
    pieces = evidence_pieces(task.evidence)
    if evidence_rule == "enumerated" and pieces:
        text += (f"The evidence has {len(pieces)} piece{'s' if len(pieces) != 1 else ''}. Restate them as\n"
                 + evidence_label_lines(pieces, "Requirement", "...")
                 + "and verify them in your answer as\n"
                 + evidence_label_lines(pieces, "Verification", "...")
                 + "\n")
    return text + f"Question: {task.question.strip()}"


def render_task_schema(task: Task, preset: Preset, db: Database | None = None) -> RenderedSchema:
    schema = load_schema(task.db_path, example_values=preset.example_values,
                         example_value_chars=preset.example_value_chars, db=db)
    return render_schema(schema, preset, question=task.question, evidence=task.evidence)


def build_prompt(task: Task, preset: Preset, db: Database | None = None) -> list[dict[str, Any]]:
    """[system, user] chat messages for one task. Runs SQL the first time a database is seen
    (example values); from async code prefer `build_prompt_async`."""
    rendered = render_task_schema(task, preset, db)
    return [
        {"role": "system", "content": system_prompt(preset, preset.method_for(task.grading_method))},
        {"role": "user", "content": user_prompt(task, rendered.text, preset.evidence_rule)},
    ]


async def build_prompt_async(task: Task, preset: Preset, db: Database | None = None) -> list[dict[str, Any]]:
    """`build_prompt` off the event loop (the first call per database runs SQL)."""
    return await asyncio.to_thread(build_prompt, task, preset, db)


def clear_schema_cache() -> None:
    with _schema_lock:
        _schema_cache.clear()
        _render_cache.clear()


# ---------------------------------------------------------------------------------------------
# Parsers of one assistant turn. Total functions: model text never makes them raise.

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"


def split_think(text: str) -> tuple[str, str]:
    """(thinking, visible) of one turn.

    `<think>...</think>` blocks are thinking. An unclosed `<think>` (a turn cut by the limit)
    makes the rest of the turn thinking. A `</think>` with no `<think>` before it means the chat
    template opened the block in the prompt (Qwen3.x with thinking on): everything before it is
    thinking.
    """
    thinking: list[str] = []
    visible: list[str] = []
    rest = text
    close = rest.find(_THINK_CLOSE)
    opening = rest.find(_THINK_OPEN)
    if close != -1 and (opening == -1 or opening > close):
        thinking.append(rest[:close])
        rest = rest[close + len(_THINK_CLOSE):]
    while True:
        start = rest.find(_THINK_OPEN)
        if start == -1:
            visible.append(rest)
            break
        visible.append(rest[:start])
        end = rest.find(_THINK_CLOSE, start)
        if end == -1:
            thinking.append(rest[start + len(_THINK_OPEN):])
            break
        thinking.append(rest[start + len(_THINK_OPEN):end])
        rest = rest[end + len(_THINK_CLOSE):]
    return "".join(thinking), "".join(visible)


def strip_think(text: str) -> str:
    """The visible text of a turn: everything outside `<think>` (see `split_think`)."""
    return split_think(text)[1]


_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.S)
_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?```$", re.S)


def _clean_sql(sql: str) -> str:
    sql = sql.strip()
    fenced = _FENCE.match(sql)
    return fenced.group(1).strip() if fenced else sql


def parse_solution(visible: str) -> str | None:
    """The answer of a turn's visible text: the LAST `<solution>` block, or None if there is none.

    A final `<solution>` that is never closed counts too (adapters may stop generation at the
    `</solution>` stop string and trim it). Markdown code fences inside the block are removed.
    The query may be "" (an empty block): grading decides what that earns.
    """
    blocks = [m for m in _SOLUTION.finditer(visible)]
    tail_start = blocks[-1].end() if blocks else 0
    unclosed = visible.find("<solution>", tail_start)
    if unclosed != -1:
        return _clean_sql(visible[unclosed + len("<solution>"):])
    if blocks:
        return _clean_sql(blocks[-1].group(1))
    return None


@dataclass(frozen=True)
class ToolCall:
    """One tool call the model made. `error` says why it is malformed (None = valid)."""

    name: str | None
    query: str | None
    error: str | None
    raw: str
    id: str | None = None  # the endpoint's tool_call id, for structured calls

    @property
    def valid(self) -> bool:
        return self.error is None


def _checked(name: Any, args: Any, raw: str, call_id: str | None = None) -> ToolCall:
    if not isinstance(name, str) or not name.strip():
        return ToolCall(None, None, "the tool call has no function name", raw, call_id)
    name = name.strip()
    if name != TOOL_NAME:
        return ToolCall(name, None, f"unknown tool {name!r}; the only tool is {TOOL_NAME}", raw, call_id)
    if not isinstance(args, dict):
        return ToolCall(name, None, "the arguments are not an object with a 'query' field", raw, call_id)
    query = args.get("query")
    if not isinstance(query, str):
        return ToolCall(name, None, "the 'query' argument is missing (or not a string)", raw, call_id)
    if not query.strip():
        return ToolCall(name, None, "the 'query' argument is empty", raw, call_id)
    return ToolCall(name, query.strip(), None, raw, call_id)


_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.S)


def _parse_xml_call(body: str, raw: str) -> ToolCall:
    m = _FUNCTION.match(body)
    if not m:
        return ToolCall(None, None, "the <function=...> block is not closed with </function>", raw)
    name, inner = m.group(1).strip(), m.group(2)
    args: dict[str, str] = {}
    for p in _PARAMETER.finditer(inner):
        key = p.group(1).strip()
        if key in args:
            return ToolCall(name, None, f"parameter {key!r} is given twice", raw)
        args[key] = p.group(2).strip("\n")
    leftover = _PARAMETER.sub("", inner)
    if "<parameter=" in leftover:
        return ToolCall(name, None, "a <parameter=...> block is not closed with </parameter>", raw)
    return _checked(name, args, raw)


def _parse_json_call(body: str, raw: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, None, f"the tool call is not valid JSON ({e.msg} at position {e.pos})", raw)
    if not isinstance(obj, dict):
        return ToolCall(None, None, "the tool call JSON is not an object", raw)
    args = obj.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return ToolCall(obj.get("name") if isinstance(obj.get("name"), str) else None, None,
                            f"the arguments string is not valid JSON ({e.msg})", raw)
    return _checked(obj.get("name"), args, raw)


_TOOL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


def parse_tool_calls(visible: str) -> list[ToolCall]:
    """Every tool call in a turn's visible text, in order; malformed ones carry `error`.

    Forms: `<tool_call><function=NAME><parameter=query>SQL</parameter></function></tool_call>`
    (qwen3_coder) and `<tool_call>{"name": NAME, "arguments": {...} or "<json>"}</tool_call>`.
    A final `<tool_call>` never closed (generation stopped at the stop string) is parsed as if
    closed. A `<function=...>` outside any `<tool_call>` claims to be a tool call: it is malformed.
    """
    calls: list[ToolCall] = []
    pos = 0
    while True:
        start = visible.find("<tool_call>", pos)
        if start == -1:
            _stray_functions(visible[pos:], calls)
            break
        _stray_functions(visible[pos:start], calls)
        end = visible.find("</tool_call>", start)
        body_start = start + len("<tool_call>")
        if end == -1:
            body, pos = visible[body_start:], len(visible)
            raw = visible[start:]
        else:
            body, pos = visible[body_start:end], end + len("</tool_call>")
            raw = visible[start:pos]
        body = body.strip()
        if body.startswith("<function="):
            calls.append(_parse_xml_call(body, raw))
        elif body.startswith(("{", "[")):
            calls.append(_parse_json_call(body, raw))
        elif not body:
            calls.append(ToolCall(None, None, "the <tool_call> block is empty", raw))
        else:
            calls.append(ToolCall(None, None, "the <tool_call> block is neither the XML nor the JSON form", raw))
    return calls


def _stray_functions(segment: str, calls: list[ToolCall]) -> None:
    for m in re.finditer(r"<function=[^>\n]*>", segment):
        calls.append(ToolCall(None, None, "a <function=...> block outside <tool_call>...</tool_call>", m.group(0)))


def parse_structured_tool_calls(tool_calls: Sequence[Any]) -> list[ToolCall]:
    """OpenAI-style `tool_calls` ([{"id", "type": "function", "function": {"name", "arguments"}}])."""
    calls: list[ToolCall] = []
    for item in tool_calls:
        raw = json.dumps(item, ensure_ascii=False, default=str)
        if not isinstance(item, dict) or not isinstance(item.get("function"), dict):
            calls.append(ToolCall(None, None, "the tool call has no 'function' object", raw))
            continue
        call_id = item.get("id") if isinstance(item.get("id"), str) else None
        fn = item["function"]
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                calls.append(ToolCall(fn.get("name") if isinstance(fn.get("name"), str) else None, None,
                                      f"the arguments string is not valid JSON ({e.msg})", raw, call_id))
                continue
        calls.append(_checked(fn.get("name"), args, raw, call_id))
    return calls


_BLOCKS = re.compile(r"<tool_call>.*?(?:</tool_call>|$)|<solution>.*?(?:</solution>|$)", re.S)


def prose(visible: str) -> str:
    """Visible text without its `<tool_call>` and `<solution>` blocks (what the evidence rules read)."""
    return _BLOCKS.sub(" ", visible)
