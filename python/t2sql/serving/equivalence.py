"""The equivalence check's machinery: perturbed copies, their cache, and the check itself.

The rules (which copies, what each verdict on a copy means, when the check is skipped) are stated
in t2sql.episode.equivalence, which also holds the reward term. This module runs the check in the
calling thread (`EquivalenceChecker.check_sync`); `Grader.equivalence` runs that on one of the
Grader's SQL workers, so the check's SQL counts against the Grader's one concurrency limit. With
the thread backend the process keeps one copy cache; a worker process or Ray actor keeps its own.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import t2sql
from t2sql._grader import GradeSpec
from t2sql.errors import DatabaseTooLarge, EquivalenceError
from t2sql.serving.manifest import file_identity

KINDS: tuple[str, ...] = ("sample", "duplicate", "shuffle", "nullify")

# Verdict outcomes on a copy, by what they say about the pair (see the module doc).
REFUTING = frozenset({"mismatch", "pred_error"})
AGREEING = frozenset({"match"})
# Everything else (pred_timeout, gold_error, gold_timeout, unsafe) is not informative.

SKIP_REASONS = ("not_correct", "too_large", "database_error", "no_informative_copy", "no_task")

# The per-process copy cache: bytes are the real bound (1 GiB); the count only caps bookkeeping.
DEFAULT_CACHE_COPIES = 64
DEFAULT_CACHE_BYTES = 1 << 30
CACHE_MIB_ENV = "T2SQL_EQUIVALENCE_CACHE_MIB"  # the process's copy cache size, for big databases


@dataclass(frozen=True)
class EquivalenceConfig:
    copies: int
    seed: int
    max_bytes: int
    # How each copy is graded: the task's method, float digits and column order, each query under
    # the spec's timeout (a preset's equivalence_timeout_s) and cap on temporary disk (its max_temp_mb).
    spec: GradeSpec = GradeSpec()

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise EquivalenceError(f"equivalence copies must be >= 1, got {self.copies}")
        if not 0 <= self.seed < 1 << 64:
            raise EquivalenceError(f"equivalence seed must be in [0, 2**64), got {self.seed}")
        if self.max_bytes < 1:
            raise EquivalenceError(f"equivalence max_bytes must be >= 1, got {self.max_bytes}")

    @classmethod
    def from_preset(cls, preset: Any, spec: GradeSpec | None = None) -> EquivalenceConfig:
        """The check for a task under `preset`, graded as the task's own grade was (`spec`: its
        grading spec's method, float digits and column order; None: the preset's own, for a task
        without a method), each query on a copy under equivalence_timeout_s."""
        return cls(
            copies=preset.equivalence_copies,
            seed=preset.equivalence_seed,
            max_bytes=preset.equivalence_max_bytes,
            spec=GradeSpec(spec.method if spec else preset.method_for(None),
                           float_digits=spec.float_digits if spec else preset.float_digits,
                           column_order=spec.column_order if spec else preset.column_order,
                           timeout_s=preset.equivalence_timeout_s, max_temp_mb=preset.max_temp_mb),
        )

    def to_dict(self) -> dict[str, Any]:
        """The configuration as plain JSON (what `t2sql equivalence --measure` reports)."""
        spec = self.spec
        return {"copies": self.copies, "seed": self.seed, "max_bytes": self.max_bytes, "timeout_s": spec.timeout_s,
                "semantics": spec.method, "float_digits": spec.float_digits, "column_order": spec.column_order}


def copy_seed(seed: int, index: int) -> int:
    """The 64-bit seed of copy `index` under the preset seed `seed` (stable across versions)."""
    digest = hashlib.blake2b(f"t2sql-equivalence:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def copy_plan(copies: int, seed: int) -> list[tuple[str, int]]:
    """(kind, seed) of every copy, in the order they are run."""
    return [(KINDS[i % len(KINDS)], copy_seed(seed, i)) for i in range(copies)]


@dataclass(frozen=True)
class CopyVerdict:
    kind: str
    seed: int
    outcome: str  # the core's verdict outcome on this copy
    detail: str
    refutes: bool
    informative: bool
    elapsed_s: float

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.seed}"


@dataclass(frozen=True)
class EquivalenceReport:
    checked: bool  # at least one copy was informative
    refuted: bool
    refuting_copy: str | None  # "kind:seed"
    skipped_reason: str | None  # one of SKIP_REASONS, or None when checked
    copies: tuple[CopyVerdict, ...] = ()
    detail: str = ""
    elapsed_s: float = 0.0

    def to_metrics(self) -> dict[str, Any]:
        return {
            "equivalence_checked": 1.0 if self.checked else 0.0,
            "equivalence_refuted": 1.0 if self.refuted else 0.0,
            "equivalence_copy": self.refuting_copy or "",
            "equivalence_skipped_reason": self.skipped_reason or "",
            "equivalence_copies_run": float(sum(c.informative for c in self.copies)),
            "equivalence_elapsed_s": round(self.elapsed_s, 4),
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def skipped(reason: str, detail: str = "") -> EquivalenceReport:
    return EquivalenceReport(False, False, None, reason, (), detail, 0.0)


# ---------------------------------------------------------------------------------- the copy cache


# Gold digests kept per copy: a group of 16 samples of one task grades against the same gold.
GOLDS_PER_COPY = 4096


@dataclass
class CopyEntry:
    db: Any  # t2sql.Database, the perturbed copy
    nbytes: int
    golds: OrderedDict = field(default_factory=OrderedDict)  # (gold, semantics, digits, secret) -> Digest
    lock: threading.Lock = field(default_factory=threading.Lock)

    def gold(self, key: tuple) -> Any:
        with self.lock:
            digest = self.golds.get(key)
            if digest is not None:
                self.golds.move_to_end(key)
            return digest

    def keep_gold(self, key: tuple, digest: Any) -> None:
        with self.lock:
            self.golds[key] = digest
            while len(self.golds) > GOLDS_PER_COPY:
                self.golds.popitem(last=False)


def _copy_bytes(file_size: int, kind: str) -> int:
    """Estimated memory of one copy: the file, plus up to a third more rows for a duplicate."""
    return file_size + (file_size // 3 if kind == "duplicate" else 0)


class CopyCache:
    """Perturbed copies by (file identity, kind, seed): an LRU bounded by count and bytes.

    Thread-safe; concurrent requests for the same copy share one build. The bytes of a copy are
    estimated from the file size (a duplicate copy grows by up to a third)."""

    def __init__(self, max_copies: int = DEFAULT_CACHE_COPIES, max_bytes: int = DEFAULT_CACHE_BYTES):
        if max_copies < 1 or max_bytes < 1:
            raise EquivalenceError("the copy cache needs room for at least one copy")
        self.max_copies = max_copies
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, CopyEntry] = OrderedDict()
        self._building: dict[tuple, concurrent.futures.Future] = {}
        self.builds = 0
        self.hits = 0
        self.evictions = 0
        self.build_s = 0.0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(e.nbytes for e in self._entries.values())

    def get(self, db_path: str, kind: str, seed: int, *, max_bytes: int) -> Any:
        """The copy (a t2sql.Database), built now if needed. Raises DatabaseTooLarge when the file
        is above `max_bytes`, t2sql.DatabaseError when it cannot be read or copied."""
        return self.entry(db_path, kind, seed, max_bytes=max_bytes).db

    def entry(self, db_path: str, kind: str, seed: int, *, max_bytes: int) -> CopyEntry:
        """The copy with its gold digests (see `get`)."""
        if kind not in KINDS:
            raise EquivalenceError(f"unknown perturbation {kind!r}; use one of {', '.join(KINDS)}")
        try:
            identity = file_identity(db_path)
        except OSError as e:
            raise t2sql.DatabaseError(f"cannot read database file {db_path}: {e}") from None
        if identity.size > max_bytes:
            raise DatabaseTooLarge(
                f"database {db_path} is {identity.size} bytes, above equivalence_max_bytes={max_bytes}"
            )
        key = (os.path.realpath(db_path), identity, kind, seed)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry
            pending = self._building.get(key)
            owner = pending is None
            if owner:
                pending = self._building[key] = concurrent.futures.Future()
        if not owner:
            return pending.result()
        try:
            started = time.perf_counter()
            try:
                db = t2sql.Database(db_path).perturbed(kind, seed, max_bytes=max_bytes)
            except ValueError as e:  # the core's own size check (the file grew since the stat)
                raise DatabaseTooLarge(str(e)) from None
            nbytes = _copy_bytes(identity.size, kind)
            entry = CopyEntry(db, nbytes)
            with self._lock:
                self.builds += 1
                self.build_s += time.perf_counter() - started
                self._entries[key] = entry
                self._evict()
            pending.set_result(entry)
            return entry
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._lock:
                self._building.pop(key, None)

    def _evict(self) -> None:
        # Called with the lock held; the newest entry always stays.
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_copies or sum(e.nbytes for e in self._entries.values()) > self.max_bytes
        ):
            self._entries.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "copies": len(self._entries),
                "bytes": sum(e.nbytes for e in self._entries.values()),
                "builds": self.builds,
                "hits": self.hits,
                "evictions": self.evictions,
                "build_s": round(self.build_s, 3),
            }


# ---------------------------------------------------------------------------------- the checker


class EquivalenceChecker:
    """The check over a copy cache; one per process is enough (`default_checker()`). It runs in
    the calling thread: `Grader.equivalence` calls it on one of the Grader's SQL workers."""

    def __init__(self, *, cache: CopyCache | None = None):
        self.cache = cache if cache is not None else CopyCache()  # an empty cache is falsy (len 0)

    def check_sync(self, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig,
                   *, cancel: Any = None) -> EquivalenceReport:
        """The check, in the calling thread; `cancel` (a t2sql.Cancel) interrupts its SQL."""
        started = time.perf_counter()
        verdicts: list[CopyVerdict] = []
        try:
            size = os.path.getsize(db_path)
        except OSError as e:
            return _done(False, None, "database_error", verdicts, f"cannot read database file {db_path}: {e}", started)
        needed = sum(_copy_bytes(size, kind) for kind, _ in copy_plan(config.copies, config.seed))
        if needed > self.cache.max_bytes:
            # All copies of one database must fit at once, or every check would rebuild them.
            return _done(False, None, "too_large", verdicts,
                         f"{config.copies} copies of {db_path} ({size} bytes each) need about {needed} bytes, "
                         f"above the copy cache's {self.cache.max_bytes}", started)
        spec = config.spec
        gold_key = (gold_sql, spec.method, spec.float_digits, spec.column_order, t2sql.hash_secret_id())
        for kind, seed in copy_plan(config.copies, config.seed):
            try:
                copy = self.cache.entry(db_path, kind, seed, max_bytes=config.max_bytes)
            except DatabaseTooLarge as e:
                return _done(False, None, "too_large", verdicts, str(e), started)
            except t2sql.T2sqlError as e:
                return _done(False, None, "database_error", verdicts, str(e), started)
            t0 = time.perf_counter()
            try:
                outcome, detail = self._grade_on(copy, pred_sql, gold_sql, gold_key, config, cancel)
            except t2sql.QueryCancelled:
                raise
            except t2sql.DatabaseError as e:
                return _done(False, None, "database_error", verdicts, str(e), started)
            except t2sql.HashSecretMismatch as e:  # the process's secret changed between digest and grade
                outcome, detail = "gold_error", f"gold digest not comparable: {e}"
            verdict = CopyVerdict(kind, seed, outcome, detail, outcome in REFUTING,
                                  outcome in REFUTING or outcome in AGREEING, time.perf_counter() - t0)
            verdicts.append(verdict)
            if verdict.refutes:
                return _done(True, verdict.name, None, verdicts, detail, started)
        if not any(v.informative for v in verdicts):
            return _done(False, None, "no_informative_copy", verdicts,
                         "; ".join(f"{v.name}: {v.outcome}" for v in verdicts), started)
        return _done(False, None, None, verdicts, "", started)

    @staticmethod
    def _grade_on(copy: CopyEntry, pred_sql: str, gold_sql: str, gold_key: tuple, config: EquivalenceConfig,
                  cancel: Any) -> tuple[str, str]:
        """(verdict outcome, detail) on one copy; the gold's digest on it is computed once."""
        digest = copy.gold(gold_key)
        if digest is None:
            try:
                digest = copy.db.digest(gold_sql, config.spec, cancel=cancel)
            except t2sql.QueryTimeout as e:
                return "gold_timeout", f"gold query timed out: {e}"
            except (t2sql.SqlError, t2sql.UnsafeQuery) as e:
                return "gold_error", f"gold query failed: {e}"
            copy.keep_gold(gold_key, digest)  # failures are not kept: the next check tries again
        v = copy.db.grade_against(pred_sql, digest, config.spec.timeout_s, cancel=cancel,
                                  max_temp_mb=config.spec.max_temp_mb)
        return v.outcome, v.detail

    def close(self) -> None:
        self.cache.clear()

    def __enter__(self) -> EquivalenceChecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _done(refuted: bool, copy_name: str | None, reason: str | None, verdicts: list[CopyVerdict], detail: str,
          started: float) -> EquivalenceReport:
    checked = any(v.informative for v in verdicts)
    return EquivalenceReport(checked, refuted, copy_name, reason, tuple(verdicts), detail,
                             time.perf_counter() - started)


_default: EquivalenceChecker | None = None
_default_lock = threading.Lock()


def default_checker() -> EquivalenceChecker:
    """The process's checker (created at first use), whose copy cache every check in this process
    shares."""
    global _default
    with _default_lock:
        if _default is None:
            mib = os.environ.get(CACHE_MIB_ENV)
            try:
                cache_bytes = int(mib) * 1024 * 1024 if mib else DEFAULT_CACHE_BYTES
            except ValueError:
                raise EquivalenceError(f"{CACHE_MIB_ENV}={mib!r}: give the copy cache's size in MiB") from None
            _default = EquivalenceChecker(cache=CopyCache(max_bytes=cache_bytes))
        return _default
