"""The equivalence check's bounds: one check's deadline, Cancel and temporary-disk cap (`CheckBudget`, the current
thread's while the check runs: every query takes its timeout from it), and what its caches count an entry as
(`approx_bytes`: caches keyed by a prediction's text are bounded in bytes, not entries)."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, TypeVar

import t2sql
from t2sql._grader import GRADE_DEFAULTS

T = TypeVar("T")

DEFAULT_MAX_TEMP_MB = int(GRADE_DEFAULTS["max_temp_mb"])


class BudgetSpent(t2sql.QueryCancelled):
    """The check's deadline passed: its work stops as a cancelled query's does (every handler of a
    failed query passes a cancel on, never taking it for a failure), and the check ends as skipped:
    budget."""


@dataclass(frozen=True)
class CheckBudget:
    deadline: float  # time.monotonic() past which the check stops
    cancel: Any = None  # a t2sql.Cancel, or None
    max_temp_mb: int = DEFAULT_MAX_TEMP_MB  # each query's temporary disk

    @classmethod
    def starting_now(cls, budget_s: float, cancel: Any = None, max_temp_mb: int | None = None) -> CheckBudget:
        return cls(time.monotonic() + budget_s, cancel, DEFAULT_MAX_TEMP_MB if max_temp_mb is None else max_temp_mb)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.cancelled

    def checkpoint(self) -> None:
        """Raise QueryCancelled when the Cancel fired, BudgetSpent past the deadline."""
        if self.cancelled():
            raise t2sql.QueryCancelled("query cancelled")
        if self.left() <= 0:
            raise BudgetSpent("the check's budget ran out")

    def timeout(self, per_query_s: float) -> float:
        """A query's timeout: its own, cut at the deadline (checkpoint first)."""
        self.checkpoint()
        return max(0.001, min(per_query_s, self.left()))

    def run(self, per_query_s: float, query: Callable[[float], T]) -> T:
        """`query(timeout_s)` under this budget: a timeout that was the deadline's is BudgetSpent."""
        timeout_s = self.timeout(per_query_s)
        try:
            return query(timeout_s)
        except t2sql.QueryTimeout:
            if self.left() <= 0:
                raise BudgetSpent("the check's budget ran out") from None
            raise

    @contextlib.contextmanager
    def active(self) -> Iterator[CheckBudget]:
        """Make this the calling thread's current budget for the block."""
        previous = getattr(_local, "budget", None)
        _local.budget = self
        try:
            yield self
        finally:
            _local.budget = previous


_local = threading.local()

UNBOUNDED = CheckBudget(math.inf)  # outside a check: each query under its own timeout only


def current() -> CheckBudget:
    """The calling thread's check budget (UNBOUNDED outside a check)."""
    return getattr(_local, "budget", None) or UNBOUNDED


def checkpoint() -> None:
    current().checkpoint()


def wait_for(event_wait: Callable[[float], bool]) -> None:
    """Wait on `event_wait(timeout) -> done` (an Event's wait, a Future's done-with-timeout) within the
    current budget, a slice at a time so that a Cancel is seen within 0.1 s."""
    budget = current()
    while True:
        budget.checkpoint()
        if event_wait(min(0.1, max(0.0, budget.left()))):
            return


# What one object costs, roughly (CPython 3.11, 64-bit): enough that many small entries count.
_OBJECT_BYTES = 56
_SLOT_BYTES = 8
_NUMBER_BYTES = 32
_SCALARS = (int, float, bool, type(None))


def approx_bytes(value: Any, depth: int = 0) -> int:
    """About how many bytes `value` holds (str, bytes, numbers, None, and tuples, lists, sets and dicts
    of them; anything else counts as one object). Deep nesting past 32 levels counts as one object
    each: the check's values are rows, keys and small records. Fast on rows (flat tuples of scalars):
    the caches count every entry they take."""
    kind = type(value)
    if kind is str or kind is bytes:
        return _OBJECT_BYTES + len(value)
    if kind in _SCALARS:
        return _NUMBER_BYTES
    if depth >= 32:
        return _OBJECT_BYTES
    if kind is tuple or kind is list or kind is set or kind is frozenset:
        total = _OBJECT_BYTES + _SLOT_BYTES * len(value)
        for v in value:
            k = type(v)
            if k is str or k is bytes:
                total += _OBJECT_BYTES + len(v)
            elif k in _SCALARS:
                total += _NUMBER_BYTES
            else:
                total += approx_bytes(v, depth + 1)
        return total
    if kind is dict:
        return _OBJECT_BYTES + sum(2 * _SLOT_BYTES + approx_bytes(k, depth + 1) + approx_bytes(v, depth + 1)
                                   for k, v in value.items())
    return _OBJECT_BYTES
