"""Many gold queries through one Grader, each reported on its own line: what `t2sql gold`,
`t2sql convert`'s gold check and `t2sql-train prepare`'s gold cache all run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(frozen=True)
class GoldTask:
    row: int  # line (jsonl) or position (JSON array), 1-based
    question_id: str
    db_id: str
    gold_sql: str
    db_path: str | None  # None when the db_id is unknown (then `problem` says why)
    problem: str | None = None
    method: str | None = None  # the task's own grading_method (canonical), if it has one
    method_unreadable: bool = False  # its grading_method could not be read (then `problem` says why)
    method_note: str | None = None  # said when --grading-method-fallback replaced an unreadable method


@dataclass
class GoldRecord:
    """One line of the report."""

    question_id: str
    db_id: str
    row: int
    seconds: float | None
    rows: int | None
    columns: int | None
    source: str  # computed | disk | memory | failed | skipped
    error: str | None

    @property
    def failed(self) -> bool:
        return self.error is not None


async def run_golds(tasks: list[GoldTask], grader, *, semantics, float_digits: int | None,
                    timeout_s: float, on_done=None, column_order: str = "strict") -> list[GoldRecord]:
    """Each task's gold through `grader.gold` (cache first); records in input order.
    `semantics`: one method for every task, or a function of the task (its own method)."""

    async def one(task: GoldTask) -> GoldRecord:
        try:
            if task.problem is not None:
                return GoldRecord(task.question_id, task.db_id, task.row, None, None, None, "skipped", task.problem)
            try:
                method = semantics(task) if callable(semantics) else semantics
                g = await grader.gold(task.db_path, task.gold_sql, semantics=method,
                                      float_digits=float_digits, timeout_s=timeout_s, column_order=column_order)
            except Exception as e:  # a database error: this row fails, the others go on
                return GoldRecord(task.question_id, task.db_id, task.row, None, None, None, "failed",
                                  f"{type(e).__name__}: {e}")
            return GoldRecord(task.question_id, task.db_id, task.row, g.elapsed_s, g.rows, g.columns,
                              g.source, None if g.ok else g.detail)
        finally:
            if on_done is not None:
                on_done()

    return list(await asyncio.gather(*(one(t) for t in tasks)))
