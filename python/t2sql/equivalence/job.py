"""The check as a job a Grader runs on one of its SQL workers without knowing what it is: the check
counts against the Grader's one concurrency limit, and the Grader imports nothing of it."""

from __future__ import annotations

import functools
from typing import Any, Callable, Protocol

from t2sql._grader import Cancel
from t2sql.equivalence.check import EquivalenceConfig, EquivalenceReport, default_checker

COUNTER = "equivalence_checks"  # the Grader's stats() key that counts checks


class RunsCalls(Protocol):
    """What the check needs of a Grader (t2sql.serving.grader.Grader.run_call)."""

    async def run_call(self, db_path: str, call: Callable[[Cancel | None], Any], *, counter: str) -> Any: ...


def check_job(db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig, evidence: str,
              cancel: Cancel | None) -> EquivalenceReport:
    """One check on the worker that runs it, with that worker's invariants, real rows and small databases."""
    return default_checker().check_sync(db_path, pred_sql, gold_sql, config, cancel=cancel, evidence=evidence)


async def check_on(grader: RunsCalls, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig,
                   evidence: str = "") -> EquivalenceReport:
    """The check of a correct prediction as one job on one of `grader`'s SQL workers (`evidence`: the
    task's, whose stated facts the check keeps). Cancelling the awaiting task interrupts the running
    query."""
    call = functools.partial(check_job, db_path, pred_sql, gold_sql, config, evidence)
    return await grader.run_call(db_path, call, counter=COUNTER)
