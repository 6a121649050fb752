"""The equivalence check: a prediction that matches the gold only by luck of the data loses points.

A prediction graded `correct` returned the gold's result on the task's database. That does not make
it the same query: `SELECT name` where the gold says `SELECT DISTINCT name` matches whenever the
data happens to hold no duplicate names. The recipe refuted such matches with a verifier (VeriEQL);
t2sql runs both queries again on K perturbed in-memory copies of the database and refutes the match
when any copy tells them apart. The copies are made by the trusted core (`Database.perturbed`, with
its own SQL on a private connection; the model's SQL never touches a writable copy):

  sample     about a third of each table's rows deleted (foreign keys may dangle)
  duplicate  about a third of each table's rows inserted again under fresh keys (UNIQUE kept)
  shuffle    in each table, one non-key column's values permuted across rows
  nullify    in each table, a third of one nullable non-key column's values set to NULL

The rules (preset fields in t2sql.episode.reward, `equivalence_*`):

- Only an episode whose outcome is `correct` is checked. Copy i (0-based) of `equivalence_copies`
  is kind `KINDS[i % 4]` (sample, duplicate, shuffle, nullify, sample, ...) with a 64-bit seed derived from
  `equivalence_seed` and i (`copy_plan`). The seeds do not depend on the task, so the copies of a
  database are built once per process and shared by every task on it.
- Per copy, the core grades the prediction against the gold with the preset's semantics and
  float_digits, each query under `equivalence_timeout_s`. Copies run in plan order; the first one
  that tells the queries apart refutes the match and the rest are not run.
    match                      the copy agrees: not refuted by it
    mismatch                   refuted (the results differ)
    pred_error                 refuted: the gold runs on this valid state of the schema and the
                               prediction fails on it, so they are not the same query
    pred_timeout               not informative: speed is not meaning, and the copy's time limit is
                               shorter than grading's; a slow correct query must not lose points
    gold_error / gold_timeout  not informative: the copy says nothing about the gold's meaning
    unsafe                     not informative (cannot follow a match: same SQL, same checks)
- A refuted match loses `equivalence_penalty` (0.2 in the recipe preset, 0 = off in `bare`); the
  outcome stays `correct` (evaluation still scores it correct; only the training reward changes).
- Skipped, never refuted: a database larger than `equivalence_max_bytes`, or whose copies would not
  all fit in the copy cache at once ("too_large"; copies are in memory, and a cache that cannot
  hold them would rebuild them at every check), a database the core cannot copy
  ("database_error"), no copy informative ("no_informative_copy").
- Deterministic: the same (database file, prediction, gold, preset) gives the same verdict.
- Bounded: at most `equivalence_copies` x 2 queries, each under `equivalence_timeout_s` (the gold's
  digest on a copy is kept, so a group of samples of one task runs it once per copy); copies are
  kept in an LRU per process bounded by bytes (1 GiB, `T2SQL_EQUIVALENCE_CACHE_MIB`); the SQL runs
  on the checker's own threads with the GIL released, never on the event loop, and a cancelled
  episode interrupts it.

Metrics added to the episode (every episode scored with the term on):
  equivalence_checked (1.0 when at least one copy was informative), equivalence_refuted (1.0/0.0),
  equivalence_copy ("kind:seed" of the refuting copy, else ""), equivalence_skipped_reason ("" or
  not_correct / too_large / database_error / no_informative_copy / no_task),
  equivalence_copies_run (informative copies), equivalence_elapsed_s.

`t2sql equivalence --measure --data dev.json --db-root DIR`
(t2sql.commands.equivalence) measures the check on BIRD-layout data: derived false-positive pairs
refuted, gold against itself and equivalent rewrites never refuted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import t2sql
from t2sql.episode.presets import Preset
from t2sql.episode.reward import RewardTerm, TermResult, Trajectory
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
    timeout_s: float
    semantics: str = "multiset"
    float_digits: int | None = 12
    column_order: str = "strict"

    def __post_init__(self) -> None:
        if self.copies < 1:
            raise EquivalenceError(f"equivalence copies must be >= 1, got {self.copies}")
        if not 0 <= self.seed < 1 << 64:
            raise EquivalenceError(f"equivalence seed must be in [0, 2**64), got {self.seed}")
        if self.max_bytes < 1:
            raise EquivalenceError(f"equivalence max_bytes must be >= 1, got {self.max_bytes}")
        if not self.timeout_s > 0:
            raise EquivalenceError(f"equivalence timeout_s must be > 0, got {self.timeout_s}")

    @classmethod
    def from_preset(cls, preset: Any, task_method: str | None = None) -> EquivalenceConfig:
        """The check for a task under `preset`: its grading method (the task's own when the
        preset honors it), as the grade itself used."""
        return cls(
            copies=preset.equivalence_copies,
            seed=preset.equivalence_seed,
            max_bytes=preset.equivalence_max_bytes,
            timeout_s=preset.equivalence_timeout_s,
            semantics=preset.method_for(task_method),
            float_digits=preset.float_digits,
            column_order=preset.column_order,
        )


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
    """Runs the check on its own threads; one per process is enough (`default_checker()`)."""

    def __init__(self, *, concurrency: int | None = None, cache: CopyCache | None = None):
        size = concurrency or min(4, os.cpu_count() or 1)
        if size < 1:
            raise EquivalenceError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = size
        self.cache = cache if cache is not None else CopyCache()  # an empty cache is falsy (len 0)
        self._executor = concurrent.futures.ThreadPoolExecutor(size, thread_name_prefix="t2sql-equivalence")

    def check_sync(self, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig,
                   *, cancel: Any = None) -> EquivalenceReport:
        """The check, in the calling thread (scripts and the measurement)."""
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
        gold_key = (gold_sql, config.semantics, config.float_digits, config.column_order, t2sql.hash_secret_id())
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
                digest = copy.db.digest(gold_sql, config.semantics, config.float_digits, config.timeout_s,
                                        column_order=config.column_order, cancel=cancel)
            except t2sql.QueryTimeout as e:
                return "gold_timeout", f"gold query timed out: {e}"
            except (t2sql.SqlError, t2sql.UnsafeQuery) as e:
                return "gold_error", f"gold query failed: {e}"
            copy.keep_gold(gold_key, digest)  # failures are not kept: the next check tries again
        v = copy.db.grade_against(pred_sql, digest, config.timeout_s, cancel=cancel)
        return v.outcome, v.detail

    async def check(self, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig) -> EquivalenceReport:
        """The check on the checker's threads; cancelling the awaiting task interrupts SQLite."""
        cancel = t2sql.Cancel()
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._executor, lambda: self.check_sync(db_path, pred_sql, gold_sql, config,
                                                                          cancel=cancel))
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            cancel.cancel()  # the running query stops at SQLite's next progress check
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody awaits it now
            raise

    def close(self) -> None:
        self._executor.shutdown(wait=True)
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
    """The process's checker (created at first use; its threads are daemon-like pool threads)."""
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


# ---------------------------------------------------------------------------------- the reward term

TERM_NAME = "equivalence"


async def check_trajectory(trajectory: Trajectory, preset: Preset,
                           checker: EquivalenceChecker | None = None) -> EquivalenceReport:
    """The report for a finished episode (a t2sql.episode.reward.Trajectory)."""
    if trajectory.outcome != "correct":
        return skipped("not_correct")
    task = trajectory.task
    if task is None or not trajectory.solution:
        return skipped("no_task", "the trajectory carries no task or solution")
    checker = checker if checker is not None else default_checker()
    config = EquivalenceConfig.from_preset(preset, getattr(task, "grading_method", None))
    return await checker.check(task.db_path, trajectory.solution, task.gold_sql, config)


async def equivalence_term(trajectory: Trajectory, preset: Preset) -> Any:
    report = await check_trajectory(trajectory, preset)
    amount = -preset.equivalence_penalty if report.refuted else 0.0
    return TermResult(amount, report.to_metrics())


def reward_terms() -> list[RewardTerm]:
    """The RewardTerm t2sql.episode.reward registers (switch: equivalence_penalty)."""
    return [RewardTerm(TERM_NAME, equivalence_term, switch="equivalence_penalty")]


# ---------------------------------------------------------------------------------- measurement
#
# False-positive pairs are derived from gold queries by edits that change a query's meaning but,
# on a given database, often not its result; only the edits whose result still matches the gold on
# the real database are kept (those are the matches a grader would wrongly call correct). Some kept
# pairs are equivalent under the schema's constraints (dropping DISTINCT over a primary key, say),
# so the share refuted is a lower bound on the share of truly different pairs caught.
# Equivalent rewrites must never be refuted.


