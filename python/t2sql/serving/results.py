"""What the Grader returns: a grade (GradeResult) and a gold query's digest (GoldResult)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from t2sql._grader import QueryTimeout, UnsafeQuery


@dataclass(frozen=True)
class GradeResult:
    """One prediction graded against one gold query.

    outcome: match | mismatch | pred_error | pred_timeout | unsafe | gold_error | gold_timeout.
    retried: the first attempt timed out (prediction or gold) and this is the second.
    gold_cached: the gold digest came from the cache (memory or disk), not a fresh run.
    elapsed_s: wall time of the whole call, queueing included.
    """

    outcome: str
    detail: str
    retried: bool
    pred_rows: int | None
    gold_rows: int | None
    elapsed_s: float
    method: str
    gold_cached: bool = False
    pred_digest: bytes | None = None  # the prediction's digest (t2sql.Digest.from_bytes) when it ran to its end

    @classmethod
    def from_verdict(cls, v: Any) -> GradeResult:
        """The core's verdict (a t2sql.Verdict, or this type back from a worker process) as a
        GradeResult; `grade` then fills in the call's own fields (retried, elapsed_s, gold_cached)."""
        return cls(v.outcome, v.detail, False, v.pred_rows, v.gold_rows, v.elapsed_s, v.method,
                   pred_digest=v.pred_digest)

    @property
    def matched(self) -> bool:
        return self.outcome == "match"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pred_digest"] = self.pred_digest.hex() if self.pred_digest else None  # JSON-safe
        return d


@dataclass(frozen=True)
class GoldResult:
    """A gold query's digest (or its failure), as `Grader.gold` returns it."""

    outcome: str  # "ok" | "gold_error" | "gold_timeout"
    detail: str
    rows: int | None
    columns: int | None
    elapsed_s: float  # SQLite's time for the gold query when it ran (kept in the digest)
    source: str  # "memory" | "disk" | "computed" | "failed"
    digest: bytes | None = None  # Digest.to_bytes(), for grading against

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


def gold_failure_detail(e: Exception) -> str:
    """A failed gold's detail in the words of the core's own grade (t2sql.grade), so one pair reads
    the same through either API: "gold query timed out after 2s", "gold query is unsafe: ...",
    "gold query failed: ..." (a gold past its temporary disk: "gold query failed: the query needed
    more than N MiB of temporary disk ...")."""
    text = str(e)
    if isinstance(e, QueryTimeout):
        return f"gold {text}" if text.startswith("query timed out") else f"gold query timed out: {text}"
    if isinstance(e, UnsafeQuery):
        return f"gold query is unsafe: {text.removeprefix('unsafe query: ')}"
    return f"gold query failed: {text}"
