"""What the model sees: `build_prompt` (the system and user messages; a question or evidence over its preset limit is
a TaskError) and the one tool's spec (`tool_specs()`, `EXPECTED_FORM`). The schema block is t2sql.episode.schema's;
both are in docs/episode.md, "What the model sees"."""

from __future__ import annotations

import asyncio
import copy
from typing import TYPE_CHECKING, Any

from t2sql._grader import Method
from t2sql.episode.evidence import evidence_label_lines, evidence_pieces
from t2sql.episode.presets import Preset
from t2sql.episode.schema import RenderedSchema, load_schema, render_schema
from t2sql.errors import TaskError
from t2sql.tasks import Task

if TYPE_CHECKING:
    from t2sql import Database

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

# By the kind of the parsed method (t2sql._grader.Method, the core's one reading of a method name).
_ORDER_RULE = {
    "multiset": "row order does not matter, duplicate rows do",
    "set": "row order and duplicate rows do not matter",
    "ordered": "row order matters, and so do duplicate rows",
    "auto": "row order matters only if the question asks for an ordering (then use ORDER BY)",
}


def order_rule(method: str | Method) -> str:
    """How results are compared, in words, for the grading method of the task at hand: the method as
    the core parses it for grading (any spelling it reads: "list", " Subset, ==, 3"), never a second
    reading of its name. An unreadable name is InvalidArgument saying what is wrong."""
    parsed = method if isinstance(method, Method) else Method(method)
    if parsed.kind == "subset":
        count = f"{parsed.operator_words} {parsed.count}"  # the core's words for its comparison
        return (f"return {count} distinct rows, each a row of the correct result (any of them will do; "
                "row order does not matter)")
    return _ORDER_RULE[parsed.kind]


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
and its result compared with the correct result: {order_rule}; {column_rule}. \
Return only the columns the question asks for. A reply with neither a tool call nor \
a <solution> ends the task without an answer."""


def system_prompt(preset: Preset, method: str | None = None) -> str:
    """The system message. `method`: the task's grading method (default: the preset's)."""
    return SYSTEM_TEMPLATE.format(
        max_rows=preset.tool.max_rows,
        max_tool_calls=preset.budgets.max_tool_calls,
        order_rule=order_rule(method or preset.grading.method),
        column_rule=("the number and order of columns matter, their names do not"
                     if preset.grading.column_order == "strict"
                     else "the number of columns matters, their order and names do not"),
        evidence_rules=_EVIDENCE_RULES[preset.reward.evidence_rule],
    )


# ---------------------------------------------------------------------------------------------
# The prompt


def task_text_problem(task: Task, preset: Preset) -> str | None:
    """Why the task's question or evidence is too long for the preset's prompt, or None. A prompt never
    cuts them (a cut question is another question), so such a task is bad input."""
    for name, text, limit in (("question", task.question, preset.prompt.question_max_chars),
                              ("evidence", task.evidence, preset.prompt.evidence_max_chars)):
        if len(text) > limit:
            return (f"its {name} is {len(text):,} characters, above the preset's prompt.{name}_max_chars "
                    f"({limit:,}); shorten it, or use a preset with a larger prompt.{name}_max_chars")
    return None


def check_task_text(task: Task, preset: Preset) -> None:
    """Raise TaskError, naming the task, when task_text_problem finds one."""
    problem = task_text_problem(task, preset)
    if problem is not None:
        raise TaskError(f"task {task.question_id}: {problem}")


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
    schema = load_schema(task.db_path, example_values=preset.prompt.example_values,
                         example_value_chars=preset.prompt.example_value_chars, db=db)
    return render_schema(schema, preset, question=task.question, evidence=task.evidence)


def build_prompt(task: Task, preset: Preset, db: Database | None = None) -> list[dict[str, Any]]:
    """[system, user] chat messages for one task. Runs SQL the first time a database is seen
    (example values); from async code prefer `build_prompt_async`. A question or evidence over the
    preset's limits is a TaskError (check_task_text), before anything is read."""
    check_task_text(task, preset)
    rendered = render_task_schema(task, preset, db)
    return [
        {"role": "system", "content": system_prompt(preset, preset.method_for(task.grading_method))},
        {"role": "user", "content": user_prompt(task, rendered.text, preset.reward.evidence_rule)},
    ]


async def build_prompt_async(task: Task, preset: Preset, db: Database | None = None) -> list[dict[str, Any]]:
    """`build_prompt` off the event loop (the first call per database runs SQL)."""
    return await asyncio.to_thread(build_prompt, task, preset, db)
