"""Hints for missed tasks: the gold query's parts (tables, joins, filters) revealed level by level."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from t2sql import sqltext
from t2sql.errors import CurriculumError

HINT_HEADER = "Hint (this question was missed before):"


_JOIN_WORDS = {"JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "OUTER"}


@dataclass(frozen=True)
class GoldParts:
    from_skeleton: str  # e.g. "FROM superhero AS T1 INNER JOIN colour AS T2"; "" if none
    select_list: str  # e.g. "COUNT(T1.id)"; "" if not found
    tables: tuple[str, ...] = ()  # every table named after FROM/JOIN at any depth, first-seen order


def gold_parts(sql: str) -> GoldParts:
    """The FROM/JOIN skeleton and SELECT list of the main (outermost) SELECT of a query.

    Both are cut from the query's own text (whitespace collapsed), so they read as written.
    """
    sql = sql or ""
    matches = sqltext.tokens(sql)
    toks = [(t.text, t.upper) for t in matches]
    depth_of = [t.depth for t in matches]
    tables: list[str] = []
    for i, (_, upper) in enumerate(toks[:-1]):
        name = toks[i + 1][0]
        if upper in ("FROM", "JOIN") and name != "(" and name not in tables:
            tables.append(name)
    top = [i for i, d in enumerate(depth_of) if d == 0]
    select_at = next((i for i in top if toks[i][1] == "SELECT"), None)
    if select_at is None:
        return GoldParts("", "", tuple(tables))
    from_at = next((i for i in top if i > select_at and toks[i][1] == "FROM"), None)
    start = select_at + 1
    while start < len(toks) and toks[start][1] in ("DISTINCT", "ALL"):
        start += 1
    end = from_at if from_at is not None else next(
        (i for i in top if i > select_at and toks[i][1] in sqltext.CLAUSE_KEYWORDS | {";"}), len(toks)
    )
    select_list = _squash(sql[matches[start].start : matches[end - 1].end]) if end > start else ""
    if from_at is None:
        return GoldParts("", select_list, tuple(tables))

    segments: list[str] = []
    run_start: int | None = None  # first kept token of the current run of consecutive kept tokens

    def close_run(upto: int) -> None:
        nonlocal run_start
        if run_start is not None:
            segments.append(_squash(sql[matches[run_start].start : matches[upto - 1].end]))
            run_start = None

    i = from_at
    skipping = False  # inside an ON/USING condition
    while i < len(toks):
        text, upper = toks[i]
        d = depth_of[i]
        if d < 0 or (d == 0 and (upper in sqltext.CLAUSE_KEYWORDS or text == ";")):
            break
        if d == 0 and upper in ("ON", "USING"):
            skipping = True
        elif d == 0 and (upper in _JOIN_WORDS or text == ","):
            skipping = False
        if skipping:
            close_run(i)
            i += 1
            continue
        if text == "(" and d == 0:  # a derived table or a parenthesised join: shown as a subquery
            close_run(i)
            j = i + 1
            while j < len(toks) and depth_of[j] > 0:
                j += 1
            segments.append("(subquery)")
            i = j + 1
            continue
        if run_start is None:
            run_start = i
        i += 1
    close_run(i)
    return GoldParts(" ".join(segments).replace(" ,", ","), select_list, tuple(tables))


def _squash(text: str) -> str:
    return " ".join(text.split())


def build_hint(evidence: str, gold_sql: str, level: int) -> str:
    """The hint text for a level (0 = no hint, ""); see the module doc for what each level adds."""
    if level <= 0:
        return ""
    parts = gold_parts(gold_sql)
    lines = [HINT_HEADER]
    evidence = " ".join((evidence or "").split())
    if evidence:
        lines.append(f"- Evidence, restated: {evidence}")
    if level >= 2 or not evidence:
        if parts.from_skeleton:
            lines.append(f"- The answer's FROM/JOIN skeleton: {parts.from_skeleton}")
        elif parts.tables:  # e.g. SELECT (SELECT ...) - (SELECT ...): no FROM of its own
            lines.append(f"- The answer reads the tables: {', '.join(parts.tables)}")
    if level >= 3 and parts.select_list:
        lines.append(f"- The answer's SELECT list: {parts.select_list}")
    return "\n".join(lines) if len(lines) > 1 else ""


def apply_hint(messages: Sequence[Mapping[str, Any]], hint: str) -> list[dict[str, Any]]:
    """A copy of the chat messages with the hint appended to the last user message."""
    out = [dict(m) for m in messages]
    if not hint:
        return out
    for m in reversed(out):
        if m.get("role") == "user":
            m["content"] = f"{m.get('content') or ''}\n\n{hint}"
            return out
    raise CurriculumError("the prompt has no user message to add a hint to")
