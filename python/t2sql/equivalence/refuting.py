"""Refuting a statement's candidates on a table's leading rows first (t2sql.equivalence.mining): a rule
broken by one of them is broken on the whole table, so only the candidates they leave are verified on
every row. Most candidates (two columns that are copies, a sum, a prefix) fail at once; the few that hold
cost one pass as before, the others almost nothing. The answer is the one the whole table gives."""

from __future__ import annotations

from typing import Callable

LEAD_ROWS = 1000  # rows read to refute candidates before a pass over the whole table

Rows = Callable[[str], "list[tuple] | None"]


def lead(table: str) -> str:
    """A FROM source of the table's first LEAD_ROWS rows (in its own order), with the table's columns."""
    return f"(SELECT * FROM {table} LIMIT {LEAD_ROWS})"


def unrefuted(rows: Rows, broken: list[str], source: str) -> list[int]:
    """The indexes of the candidates that no row of `source` (a FROM clause over leading rows) breaks;
    `broken[i]` is an SQL expression true on a row that breaks candidate i."""
    if not broken:
        return []
    got = rows(f"SELECT {', '.join(f'sum({b})' for b in broken)} FROM {source}")
    if not got:
        return list(range(len(broken)))
    return [i for i, v in enumerate(got[0]) if not v]
