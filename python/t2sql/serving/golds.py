"""Many gold queries through one Grader, each reported on its own line: what `t2sql gold`,
`t2sql convert`'s gold check and `t2sql-train prepare`'s gold cache all run."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable

from t2sql._grader import GradeSpec
from t2sql.tasks import Task


@dataclass(frozen=True)
class GoldTask:
    """One row of a split whose gold is to run: the task, or why the row cannot run."""

    row: int  # line (jsonl) or position (JSON array), 1-based
    question_id: str
    db_id: str
    task: Task | None  # None when the row cannot run (then `problem` says why)
    problem: str | None = None
    method: str | None = None  # the row's own grading_method (canonical), read even when the row cannot run
    method_unreadable: bool = False  # its grading_method could not be read (then `problem` says why)
    method_note: str | None = None  # said when --grading-method-fallback replaced an unreadable method

    @classmethod
    def of(cls, row: int, task: Task) -> GoldTask:
        return cls(row, task.question_id, task.db_id, task, method=task.grading_method)

    @property
    def db_path(self) -> str | None:
        return self.task.db_path if self.task is not None else None


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


async def run_golds(tasks: list[GoldTask], grader, spec: Callable[[Task], GradeSpec],
                    on_done: Callable[[], None] | None = None) -> list[GoldRecord]:
    """Each task's gold through `grader.gold` under `spec(task)` (a preset's grade_spec, or one
    spec for every task), cache first; records in input order."""

    async def one(task: GoldTask) -> GoldRecord:
        try:
            if task.task is None:
                return GoldRecord(task.question_id, task.db_id, task.row, None, None, None, "skipped", task.problem)
            try:
                g = await grader.gold(task.task.db_path, task.task.gold_sql, spec(task.task))
            except Exception as e:  # a database error: this row fails, the others go on
                return GoldRecord(task.question_id, task.db_id, task.row, None, None, None, "failed",
                                  f"{type(e).__name__}: {e}")
            return GoldRecord(task.question_id, task.db_id, task.row, g.elapsed_s, g.rows, g.columns,
                              g.source, None if g.ok else g.detail)
        finally:
            if on_done is not None:
                on_done()

    return list(await asyncio.gather(*(one(t) for t in tasks)))
