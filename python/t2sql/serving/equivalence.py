"""The equivalence check's machinery: small databases of the real one's kind, and the check on them.

The rules (when the check runs, what a verdict on a small database means, the reward term) are stated
in t2sql.episode.equivalence. This module runs one check in the calling thread
(`EquivalenceChecker.check_sync`); `Grader.equivalence` runs that on one of the Grader's SQL workers,
so its SQL counts against the Grader's one concurrency limit.

A check tries two kinds of small databases (t2sql.serving.smalldb), each a few dozen rows that keep
every declared constraint and every invariant mined from the real data (t2sql.serving.invariants):

- targeted ones, built for this pair: the real rows each query joins and keeps, the real rows that
  meet all but one of its WHERE's conditions, rows holding its literals, all closed under the
  database's references; then those rows with values at and beside each literal (the literal, one
  above and below, another case, inside a longer text, a later time of the same day), NULL where
  the column holds NULLs, duplicated under fresh keys, and with integer keys renumbered;
- the database's suite: small databases drawn from random real rows and their variants, distilled
  greedily against neighbour queries derived from the schema (a test-suite approach), built once per
  database file and kept on disk (t2sql.serving.diskcache.cache_dir()).

A small database refutes the match when the queries' results there differ (or the prediction fails
where the gold runs), on it and on its mirror (the rows in reverse order, SQLite's unordered scans
reversed), with neither result depending on which of tied rows an ORDER BY ... LIMIT keeps. The
first that does is the witness: its rows as INSERT statements and both results there.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

import t2sql
from t2sql._grader import GradeSpec
from t2sql.errors import EquivalenceError
from t2sql.serving.diskcache import DiskCache, database_key
from t2sql.serving.invariants import Invariants
from t2sql.serving.mining import InvariantStore
from t2sql.serving.refutation import Prepared, Trial, refutes, shrink
from t2sql.serving.sampling import RealRows
from t2sql.serving.smalldb import SmallDb
from t2sql.serving.suites import SUITE_VERSION, build_suite, suite_from_json, suite_to_json
from t2sql.serving.targeted import Covered, realistic, targeted

SKIP_REASONS = ("not_correct", "unsupported_schema", "database_error", "no_informative_database", "no_task")

GOLD_CASES = 64  # golds whose prepared small databases a checker keeps (a task's samples share one)

TARGETED_QUERIES = 1024  # queries whose targeted small databases a checker keeps (samples repeat queries)

@dataclass(frozen=True)
class EquivalenceConfig:
    suite_size: int  # small databases kept in a database's suite
    seed: int  # what the random draws derive from (with the database's identity)
    budget_s: float  # the whole check: past it no further small database is tried
    # How each small database is graded: the task's method, float digits and column order, each query
    # under the spec's timeout (a preset's equivalence_timeout_s) and cap on temporary disk (max_temp_mb).
    spec: GradeSpec = GradeSpec()

    def __post_init__(self) -> None:
        if self.suite_size < 0:
            raise EquivalenceError(f"equivalence suite size must be >= 0, got {self.suite_size}")
        if not 0 <= self.seed < 1 << 64:
            raise EquivalenceError(f"equivalence seed must be in [0, 2**64), got {self.seed}")
        if not self.budget_s > 0:
            raise EquivalenceError(f"equivalence budget must be > 0 seconds, got {self.budget_s}")

    @classmethod
    def from_preset(cls, preset: Any, spec: GradeSpec | None = None) -> EquivalenceConfig:
        """The check for a task under `preset`, graded as the task's own grade was (`spec`: its
        grading spec's method, float digits and column order; None: the preset's own), each query on a
        small database under equivalence_timeout_s."""
        return cls(
            suite_size=preset.equivalence_suite_size,
            seed=preset.equivalence_seed,
            budget_s=preset.equivalence_budget_s,
            spec=GradeSpec(spec.method if spec else preset.method_for(None),
                           float_digits=spec.float_digits if spec else preset.float_digits,
                           column_order=spec.column_order if spec else preset.column_order,
                           timeout_s=preset.equivalence_timeout_s, max_temp_mb=preset.max_temp_mb),
        )

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {"suite_size": self.suite_size, "seed": self.seed, "budget_s": self.budget_s,
                "timeout_s": spec.timeout_s, "semantics": spec.method, "float_digits": spec.float_digits,
                "column_order": spec.column_order}

@dataclass(frozen=True)
class Witness:
    """A small database where the two queries differ: its rows as INSERT statements (the schema is the
    real database's), how it was made, and what each query returns there."""

    database: str
    rows: int
    made_by: str
    gold_result: str
    pred_result: str
    detail: str  # the verdict there ("row count 3 vs 4 (multiset)", the prediction's error, ...)

    def to_text(self) -> str:
        return (f"-- witness ({self.rows} rows; {self.made_by}): {self.detail}\n{self.database}\n"
                f"-- gold returns:\n{self.gold_result}\n-- prediction returns:\n{self.pred_result}")

@dataclass(frozen=True)
class EquivalenceReport:
    checked: bool  # at least one small database was informative
    refuted: bool
    skipped_reason: str | None  # one of SKIP_REASONS, or None when checked
    witness: Witness | None = None
    databases: int = 0  # small databases tried
    informative: int = 0  # of them, those where both queries ran and nothing made the verdict uncertain
    detail: str = ""
    elapsed_s: float = 0.0

    def to_metrics(self) -> dict[str, Any]:
        return {
            "equivalence_checked": 1.0 if self.checked else 0.0,
            "equivalence_refuted": 1.0 if self.refuted else 0.0,
            "equivalence_skipped_reason": self.skipped_reason or "",
            "equivalence_databases": float(self.databases),
            "equivalence_elapsed_s": round(self.elapsed_s, 4),
            "equivalence_witness": self.witness.to_text() if self.witness else "",
        }

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

def skipped(reason: str, detail: str = "", elapsed_s: float = 0.0) -> EquivalenceReport:
    return EquivalenceReport(False, False, reason, None, 0, 0, detail, elapsed_s)

class GoldCase:
    """What every prediction of one gold is tried on: the gold's targeted databases and the suite, built
    in the core with the gold's digest on each."""

    def __init__(self, prepared: list[Prepared], covered: Covered):
        self.prepared = prepared
        self.covered = covered
        self.keys = {p.db.key() for p in prepared}
        self.lock = threading.Lock()

    def close(self) -> None:
        for p in self.prepared:
            p.close()

class EquivalenceChecker:
    """The check over the databases' invariants, real rows and suites, each kept per database file; one
    per process is enough (`default_checker()`). It runs in the calling thread."""

    def __init__(self, *, invariants: InvariantStore | None = None, disk: DiskCache | None = None,
                 keep_databases: int = 16):
        self.disk = disk if disk is not None else DiskCache()
        self.invariants = invariants if invariants is not None else InvariantStore(self.disk)
        self.keep = keep_databases
        self._lock = threading.Lock()
        self._real: OrderedDict[str, RealRows] = OrderedDict()
        self._suites: OrderedDict[tuple, list[SmallDb]] = OrderedDict()
        self._golds: OrderedDict[tuple, GoldCase] = OrderedDict()
        self._targeted: OrderedDict[tuple, list[SmallDb]] = OrderedDict()
        self._building: dict[tuple, concurrent.futures.Future] = {}
        self.suite_builds = 0
        self.suite_build_s = 0.0

    def real_rows(self, path: str, inv: Invariants) -> RealRows:
        key = database_key(path)
        with self._lock:
            real = self._real.get(key)
            if real is not None:
                self._real.move_to_end(key)
                return real
            real = self._real[key] = RealRows(path, inv)
            while len(self._real) > self.keep:
                self._real.popitem(last=False)[1].close()
            return real

    def suite(self, path: str, inv: Invariants, real: RealRows, config: EquivalenceConfig) -> list[SmallDb]:
        key = (database_key(path), config.suite_size, config.seed)
        with self._lock:
            got = self._suites.get(key)
            if got is not None:
                self._suites.move_to_end(key)
                return got
            pending = self._building.get(key)
            owner = pending is None
            if owner:
                pending = self._building[key] = concurrent.futures.Future()
        if not owner:
            return pending.result()
        try:
            name = f"{key[0]}.suite-v{SUITE_VERSION}-{config.suite_size}-{config.seed}.json"
            data = self.disk.load(name)
            suite = None
            if isinstance(data, dict) and isinstance(data.get("suite"), list):
                try:
                    suite = suite_from_json(inv, data["suite"])
                    if any(db.problems() for db in suite):
                        suite = None  # made under other invariants: build it again
                except (KeyError, TypeError, ValueError):
                    suite = None
            if suite is None:
                started = time.perf_counter()
                suite = build_suite(real, inv, size=config.suite_size, seed=config.seed)
                with self._lock:
                    self.suite_builds += 1
                    self.suite_build_s += time.perf_counter() - started
                self.disk.store(name, {"suite": suite_to_json(suite)})
            with self._lock:
                self._suites[key] = suite
                while len(self._suites) > self.keep:
                    self._suites.popitem(last=False)
            pending.set_result(suite)
            return suite
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._lock:
                self._building.pop(key, None)

    def targeted(self, db_path: str, inv: Invariants, real: RealRows, sql: str, seed: int,
                 covered: Covered | None = None) -> tuple[list[SmallDb], Covered]:
        """`targeted` kept per (database, query, seed, what the gold covers): a task's samples repeat
        queries."""
        key = (database_key(db_path), sql, seed, covered.key() if covered is not None else None)
        with self._lock:
            got = self._targeted.get(key)
            if got is not None:
                self._targeted.move_to_end(key)
                return got
        got = targeted(real, inv, sql, seed, covered)
        with self._lock:
            self._targeted[key] = got
            while len(self._targeted) > TARGETED_QUERIES:
                self._targeted.popitem(last=False)
        return got

    def gold_case(self, db_path: str, inv: Invariants, real: RealRows, gold_sql: str,
                  config: EquivalenceConfig, cancel: Any = None) -> GoldCase:
        """The gold's targeted databases and the suite, prepared once per (database, gold, grading spec)."""
        spec = config.spec
        key = (database_key(db_path), gold_sql, spec.method, spec.float_digits, spec.column_order,
               config.suite_size, config.seed)
        with self._lock:
            case = self._golds.get(key)
            if case is not None:
                self._golds.move_to_end(key)
                return case
        dbs, covered = self.targeted(db_path, inv, real, gold_sql, config.seed)
        dbs = dbs + self.suite(db_path, inv, real, config)
        case = GoldCase([Prepared(db, gold_sql, spec, cancel) for db in realistic(dbs)], covered)
        with self._lock:
            self._golds[key] = case
            while len(self._golds) > GOLD_CASES:
                self._golds.popitem(last=False)[1].close()
        return case

    def check_sync(self, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig,
                   *, cancel: Any = None) -> EquivalenceReport:
        """The check, in the calling thread; `cancel` (a t2sql.Cancel) interrupts its SQL."""
        started = time.perf_counter()

        def done(**kw: Any) -> EquivalenceReport:
            return EquivalenceReport(elapsed_s=time.perf_counter() - started, **kw)

        try:
            inv = self.invariants.get(db_path)
            if inv.unsupported:
                return done(checked=False, refuted=False, skipped_reason="unsupported_schema",
                            detail=f"no small database can be built: {inv.unsupported}")
            real = self.real_rows(db_path, inv)
            case = self.gold_case(db_path, inv, real, gold_sql, config, cancel)
            own = [db for db in self.targeted(db_path, inv, real, pred_sql, config.seed, case.covered)[0]
                   if db.key() not in case.keys]
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError as e:
            return done(checked=False, refuted=False, skipped_reason="database_error", detail=str(e))
        tried = informative = 0
        uncertain: list[str] = []
        fresh: list[Prepared] = []
        try:
            candidates = itertools.chain(case.prepared, (fresh.append(Prepared(db, gold_sql, config.spec, cancel))
                                                         or fresh[-1] for db in own))
            for prepared in candidates:
                if time.perf_counter() - started > config.budget_s and tried:
                    break
                tried += 1
                trial = Trial(prepared, pred_sql, gold_sql, cancel)
                verdict, detail = refutes(trial)
                if verdict == "agrees":
                    informative += 1
                elif verdict == "uncertain":
                    uncertain.append(detail)
                else:
                    informative += 1
                    smallest = shrink(trial, config.spec)
                    gold_text, pred_text = smallest.results_text()
                    witness = Witness(smallest.db.to_sql(), smallest.db.size, smallest.db.note, gold_text, pred_text,
                                      refutes(smallest)[1])
                    if smallest is not trial:
                        smallest.prepared.close()
                    return done(checked=True, refuted=True, skipped_reason=None, witness=witness, databases=tried,
                                informative=informative, detail=witness.detail)
        finally:
            for p in fresh:
                p.close()
        if not informative:
            why = "; ".join(dict.fromkeys(uncertain)) or "no small database could be built"
            return done(checked=False, refuted=False, skipped_reason="no_informative_database",
                        databases=tried, detail=why)
        return done(checked=True, refuted=False, skipped_reason=None, databases=tried, informative=informative)

    def close(self) -> None:
        with self._lock:
            for real in self._real.values():
                real.close()
            self._real.clear()
            self._suites.clear()
            for case in self._golds.values():
                case.close()
            self._golds.clear()
            self._targeted.clear()

    def __enter__(self) -> EquivalenceChecker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

_default: EquivalenceChecker | None = None

_default_lock = threading.Lock()

def default_checker() -> EquivalenceChecker:
    """The process's checker (created at first use): every check in this process shares its
    invariants, real rows and suites."""
    global _default
    with _default_lock:
        if _default is None:
            _default = EquivalenceChecker()
        return _default
