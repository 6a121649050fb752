"""The equivalence check's machinery: one check of a (prediction, gold) pair on small databases of the real one's kind
(`EquivalenceChecker.check_sync`, run by the Grader on one of its SQL workers). Whatever it meets it returns a
report: refuted with a witness, checked, or skipped for one of SKIP_REASONS. Its rules:
docs/episode.md, "The equivalence check" and docs/recipe_extras.md, "Equivalence check"."""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import t2sql
from t2sql._grader import MAX_SQL_BYTES, GradeSpec
from t2sql.equivalence import checkbounds
from t2sql.equivalence.checkbounds import BudgetSpent, CheckBudget, approx_bytes
from t2sql.equivalence.declared import mentions
from t2sql.equivalence.diskcache import DiskCache, database_key
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.invariants import INVARIANTS_VERSION, Invariants
from t2sql.equivalence.nondeterminism import nondeterministic
from t2sql.equivalence.presupposed import Presupposition, degenerate, one_row_answer, presupposition
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.refutation import NONDETERMINISTIC, Prepared, Trial, refutes, shrink
from t2sql.equivalence.smalldb import SmallDb
from t2sql.equivalence.suites import SUITE_VERSION, build_suite, suite_from_json, suite_to_json
from t2sql.equivalence.targeted import Covered, realistic, targeted
from t2sql.errors import EquivalenceError
from t2sql.lru import Lru

log = logging.getLogger("t2sql.equivalence.check")

# Why a check ends without a verdict (EquivalenceReport.skipped_reason; docs/episode.md states each):
SKIP_REASONS = (
    "not_correct",  # the episode's outcome is not correct: nothing to check
    "no_task",  # the trajectory carries no task or solution
    "unsupported_query",  # the prediction or the gold is not one statement the guard takes (or too long)
    "unsupported_schema",  # no small database of this kind can be built, or a query reads a part left out
    "database_error",  # the database file cannot be read
    "not_ready",  # the database's invariants are not mined yet (mining ahead: t2sql gold, t2sql-train prepare)
    "constraint",  # every small database built was refused by a constraint of the schema
    "nondeterministic",  # a query's result changes from run to run on one database (random(), the clock)
    "budget",  # the check's budget ran out before any small database told
    "no_informative_database",  # no small database where both queries ran and the verdict was certain
    "check_error",  # the check itself failed (a bug): reported, never raised
)

# What the check's caches hold at most, in bytes (besides each RealRows' own ANSWER_BYTES and each
# database's Invariants.memo): golds' prepared databases, each query's targeted ones, suites.
GOLD_CASE_BYTES = 128 * 1024 * 1024
GOLD_CASES = 64  # golds whose prepared small databases a checker keeps (a task's samples share one)
PREPARED_BYTES = 48 * 1024  # what one small database in the core costs besides its rows, about
TARGETED_BYTES = 64 * 1024 * 1024
TARGETED_QUERIES = 1024  # queries whose targeted small databases a checker keeps (samples repeat queries)
SUITE_BYTES = 32 * 1024 * 1024


NOT_READY = ("the database's invariants are not mined yet: mining started in the background in this process "
             "(`t2sql gold` and `t2sql-train prepare` mine every database of a split ahead)")


def rows_bytes(dbs: list[SmallDb]) -> int:
    """About what the rows of `dbs` hold."""
    return sum(approx_bytes(db.rows) + approx_bytes(db.note) for db in dbs)

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
        small database under equivalence.timeout_s."""
        return cls(
            suite_size=preset.equivalence.suite_size,
            seed=preset.equivalence.seed,
            budget_s=preset.equivalence.budget_s,
            spec=GradeSpec(spec.method if spec else preset.method_for(None),
                           float_digits=spec.float_digits if spec else preset.grading.float_digits,
                           column_order=spec.column_order if spec else preset.grading.column_order,
                           timeout_s=preset.equivalence.timeout_s, max_temp_mb=preset.grading.max_temp_mb),
        )

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {"suite_size": self.suite_size, "seed": self.seed, "budget_s": self.budget_s,
                "timeout_s": spec.timeout_s, "method": spec.method, "float_digits": spec.float_digits,
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
    refused: int = 0  # small databases the schema's constraints refused (not tried)
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
    in the core with the gold's digest on each (`refused`: those the schema's constraints refused)."""

    def __init__(self, prepared: list[Prepared], covered: Covered, refused: int = 0,
                 presupposed: Presupposition | None = None, one_row: bool | None = None):
        self.prepared = prepared
        self.covered = covered
        self.refused = refused
        self.keys = {p.db.key() for p in prepared}
        self.presupposed = presupposed  # what the gold and the evidence presuppose (t2sql.equivalence.presupposed)
        self._one_row = one_row  # the gold's real result is one row without NULL; None: not asked yet

    def one_row(self, real: RealRows, gold_sql: str) -> bool:
        """Whether the gold's real result is one row without NULL. Asked only of a refutation where the gold
        gives one row holding a NULL (rare): the gold runs on the real file, whose work grows with the
        table, once per gold and only then."""
        if self._one_row is None:
            self._one_row = one_row_answer(real, gold_sql)
        return self._one_row

    def nbytes(self) -> int:
        return rows_bytes([p.db for p in self.prepared]) + PREPARED_BYTES * len(self.prepared)


def _prepared(dbs: list[SmallDb], gold_sql: str, spec: GradeSpec) -> Iterator[Prepared | None]:
    """Each database built in the core with the gold's digest, or None for one its schema refuses."""
    for db in dbs:
        checkbounds.checkpoint()
        try:
            yield Prepared(db, gold_sql, spec)
        except t2sql.ConstraintError:
            yield None


class EquivalenceChecker:
    """The check over the databases' invariants, real rows and suites, each kept per database content; one
    per process is enough (`default_checker()`). It runs in the calling thread, under one deadline.

    `mine_inline`: a database whose invariants are not mined yet is mined before the check's deadline
    starts (a command that checks given pairs); without it (training's checks) the check is skipped as
    not_ready at once and this process mines the database in the background, once."""

    def __init__(self, *, invariants: InvariantStore | None = None, disk: DiskCache | None = None,
                 keep_databases: int = 16, mine_inline: bool = True):
        self.disk = disk if disk is not None else DiskCache()
        self._own_store = invariants is None
        self.invariants = invariants if invariants is not None else InvariantStore(self.disk)
        self.mine_inline = mine_inline
        self.keep = keep_databases
        self._lock = threading.Lock()
        self._real: OrderedDict[str, RealRows] = OrderedDict()
        self._suites: Lru[list[SmallDb]] = Lru(keep_databases, SUITE_BYTES, lambda k, v: rows_bytes(v))
        self._golds: Lru[GoldCase] = Lru(GOLD_CASES, GOLD_CASE_BYTES, lambda k, v: approx_bytes(k) + v.nbytes())
        self._targeted: Lru[tuple[list[SmallDb], Covered]] = Lru(
            TARGETED_QUERIES, TARGETED_BYTES, lambda k, v: approx_bytes(k) + rows_bytes(v[0]))
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
        real = RealRows(path, inv)  # opened outside the lock (a DatabaseError for a bad file)
        with self._lock:
            if key in self._real:  # another thread got there first
                real.close()
                return self._real[key]
            self._real[key] = real
            while len(self._real) > self.keep:
                self._real.popitem(last=False)[1].close()
            return real

    def suite(self, path: str, inv: Invariants, real: RealRows, config: EquivalenceConfig) -> list[SmallDb]:
        key = (database_key(path), config.suite_size, config.seed)
        while True:
            with self._lock:
                got = self._suites.get(key)
                if got is not None:
                    return got
                pending = self._building.get(key)
                owner = pending is None
                if owner:
                    pending = self._building[key] = concurrent.futures.Future()
            if owner:
                break
            checkbounds.wait_for(lambda t: bool(concurrent.futures.wait([pending], t).done))
            try:
                return pending.result()
            except (BudgetSpent, t2sql.QueryCancelled):
                continue  # its builder's check ran out or was cancelled: build it under this one
        try:
            suite = self._build_suite(key, inv, real, config)
            self._suites.put(key, suite)
            pending.set_result(suite)
            return suite
        except BaseException as e:
            pending.set_exception(e)
            raise
        finally:
            with self._lock:
                self._building.pop(key, None)

    def _build_suite(self, key: tuple, inv: Invariants, real: RealRows, config: EquivalenceConfig) -> list[SmallDb]:
        """The suite from disk when an entry for this very content reads back whole and realistic, else built
        (and stored)."""
        name = f"{key[0]}.suite-v{SUITE_VERSION}-inv{INVARIANTS_VERSION}-{config.suite_size}-{config.seed}.json"
        data = self.disk.load(name)
        if data is not None and data.get("database") == key[0]:
            try:
                suite = suite_from_json(inv, data.get("suite"), real)
                if not any(db.problems() for db in suite):
                    return suite
            except ValueError:
                pass  # malformed: built again
        started = time.perf_counter()
        suite = build_suite(real, inv, size=config.suite_size, seed=config.seed)
        with self._lock:
            self.suite_builds += 1
            self.suite_build_s += time.perf_counter() - started
        self.disk.store(name, {"database": key[0], "suite": suite_to_json(suite)})
        return suite

    def targeted(self, db_path: str, inv: Invariants, real: RealRows, sql: str, seed: int,
                 covered: Covered | None = None) -> tuple[list[SmallDb], Covered]:
        """`targeted` kept per (database, query, seed, what the gold covers): a task's samples repeat
        queries."""
        key = (database_key(db_path), sql, seed, covered.key() if covered is not None else None)
        got = self._targeted.get(key)
        if got is None:
            got = targeted(real, inv, sql, seed, covered)
            self._targeted.put(key, got)
        return got

    def gold_case(self, db_path: str, inv: Invariants, real: RealRows, gold_sql: str,
                  config: EquivalenceConfig, evidence: str = "") -> GoldCase:
        """The gold's targeted databases and the suite, each fitted to what the gold and the task's
        evidence presuppose (t2sql.equivalence.presupposed), prepared once per (database, gold, grading
        spec, evidence)."""
        spec = config.spec
        key = (database_key(db_path), gold_sql, spec.method, spec.float_digits, spec.column_order,
               config.suite_size, config.seed, evidence)
        case = self._golds.get(key)
        if case is not None:
            return case
        dbs, covered = self.targeted(db_path, inv, real, gold_sql, config.seed)
        dbs = dbs + self.suite(db_path, inv, real, config)
        presupposed = presupposition(real, inv, [gold_sql], evidence)
        fitted = realistic([f for f in (presupposed.fit(db, real) for db in realistic(dbs)) if f is not None])
        built = list(_prepared(fitted, gold_sql, spec))
        case = GoldCase([p for p in built if p is not None], covered, sum(p is None for p in built), presupposed)
        self._golds.put(key, case)
        return case

    def check_sync(self, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig,
                   *, cancel: Any = None, evidence: str = "") -> EquivalenceReport:
        """The check, in the calling thread, under one deadline (`config.budget_s` from now, everything
        included: mining, small databases built, queries run); `cancel` (a t2sql.Cancel) stops it at
        once (QueryCancelled). `evidence` is the task's: the facts it states hold on every small
        database (t2sql.equivalence.presupposed). Whatever the queries, the database or the caches hold, it
        returns a report: refuted with a witness, or not refuted (checked, or skipped for one of
        SKIP_REASONS)."""
        started = time.perf_counter()

        def done(**kw: Any) -> EquivalenceReport:
            kw.setdefault("checked", False)
            kw.setdefault("refuted", False)
            kw.setdefault("skipped_reason", None)
            return EquivalenceReport(elapsed_s=time.perf_counter() - started, **kw)

        if self.mine_inline:
            try:
                self.invariants.get(db_path, cancel)
            except t2sql.QueryCancelled:
                raise
            except Exception:  # noqa: S110 -- the check meets it again and reports it
                pass
        budget = CheckBudget.starting_now(config.budget_s, cancel, config.spec.max_temp_mb)
        with budget.active():
            try:
                return self._check(db_path, pred_sql, gold_sql, config, done,
                                   evidence if isinstance(evidence, str) else "")
            except BudgetSpent:  # (a QueryCancelled of the check's own: first)
                return done(skipped_reason="budget",
                            detail=f"the check's budget of {config.budget_s:g}s ran out before a small database told")
            except t2sql.QueryCancelled:
                raise
            except Exception as e:  # a bug of the check: the reward goes on, the report says what happened
                detail = f"{type(e).__name__}: {e}"[:500]
                log.warning("equivalence check failed on %s: %s", db_path, detail)
                return done(skipped_reason="check_error", detail=detail)

    def _check(self, db_path: str, pred_sql: str, gold_sql: str, config: EquivalenceConfig,
               done: Any, evidence: str = "") -> EquivalenceReport:
        for name, sql in (("prediction", pred_sql), ("gold", gold_sql)):
            if not isinstance(sql, str):
                return done(skipped_reason="unsupported_query", detail=f"the {name} is not text")
            size = len(sql.encode("utf-8", "surrogatepass"))
            if size > MAX_SQL_BYTES:
                return done(skipped_reason="unsupported_query",
                            detail=f"the {name} is {size} bytes; a query is at most {MAX_SQL_BYTES}")
        try:
            with t2sql.Database(db_path) as db:
                for name, sql in (("prediction", pred_sql), ("gold", gold_sql)):
                    budget = checkbounds.current()
                    try:
                        db.rows(sql, max_rows=0, timeout_s=budget.timeout(5.0), cancel=budget.cancel)
                    except (t2sql.UnsafeQuery, t2sql.SqlError) as e:
                        return done(skipped_reason="unsupported_query",
                                    detail=f"the {name} is not one statement the guard runs: {e}")
            inv = self.invariants.ready(db_path)
            if inv is None and self.mine_inline:
                inv = self.invariants.get(db_path, checkbounds.current().cancel)  # its error, reported
            if inv is None:
                self.invariants.start(db_path)
                return done(skipped_reason="not_ready", detail=NOT_READY)
            if inv.unsupported:
                return done(skipped_reason="unsupported_schema",
                            detail=f"no small database can be built: {inv.unsupported}")
            for name, sql in (("prediction", pred_sql), ("gold", gold_sql)):
                why = nondeterministic(sql, inv)
                if why:  # a result that changes from run to run proves nothing on any database
                    return done(skipped_reason="nondeterministic",
                                detail=f"the {name}'s result may change from run to run: {why}")
                if mentions(sql, inv.left_out_tables):
                    parts = "; ".join(f"{n} ({why})" for kind, n, why in inv.left_out if kind == "table")
                    return done(skipped_reason="unsupported_schema",
                                detail=f"the {name} may read a table the small databases leave out: {parts}")
            real = self.real_rows(db_path, inv)
            case = self.gold_case(db_path, inv, real, gold_sql, config, evidence)
            # The question's entities are the gold's: a prediction that names fewer (a dropped condition)
            # is told apart where more rows hold its values.
            own = [db for db in (case.presupposed.fit(raw, real) for raw in
                                 self.targeted(db_path, inv, real, pred_sql, config.seed, case.covered)[0])
                   if db is not None and db.key() not in case.keys]
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError as e:
            return done(skipped_reason="database_error", detail=str(e))
        tried = informative = 0
        refused = case.refused
        uncertain: list[str] = []
        fresh: list[Prepared] = []
        out_of_time = False
        try:
            for prepared in itertools.chain(case.prepared, self._fresh(own, gold_sql, config, fresh)):
                if prepared is None:
                    refused += 1
                    continue
                tried += 1
                trial = Trial(prepared, pred_sql, gold_sql)
                verdict, detail = refutes(trial)
                if (verdict == "refutes" and degenerate(prepared.core, gold_sql, config.spec.timeout_s)
                        and case.one_row(real, gold_sql)):
                    verdict, detail = "uncertain", "the gold's one-row answer is empty or NULL here"
                if verdict == "agrees":
                    informative += 1
                elif detail == NONDETERMINISTIC:
                    return done(skipped_reason="nondeterministic", databases=tried, informative=informative,
                                refused=refused, detail=detail)
                elif verdict == "uncertain":
                    uncertain.append(detail)
                else:
                    smallest, shrunk = shrink(trial, config.spec, detail)
                    if (smallest is not trial and degenerate(smallest.prepared.core, gold_sql, config.spec.timeout_s)
                            and case.one_row(real, gold_sql)):
                        smallest.prepared.close()  # shrunk past an answer: the witness is the database unshrunk
                        smallest = trial
                    else:
                        detail = shrunk
                    gold_text, pred_text = smallest.results_text()
                    witness = Witness(smallest.db.to_sql(), smallest.db.size, smallest.db.note, gold_text, pred_text,
                                      detail)
                    if smallest is not trial:
                        smallest.prepared.close()
                    return done(checked=True, refuted=True, witness=witness, databases=tried,
                                informative=informative + 1, refused=refused, detail=witness.detail)
        except BudgetSpent:
            out_of_time = True  # past the deadline no further small database is tried
        finally:
            for p in fresh:
                p.close()
        if informative:
            return done(checked=True, databases=tried, informative=informative, refused=refused)
        if out_of_time:
            return done(skipped_reason="budget", databases=tried, refused=refused,
                        detail=f"the check's budget of {config.budget_s:g}s ran out before a small database told")
        if refused and not tried:
            return done(skipped_reason="constraint", refused=refused,
                        detail=f"the schema's constraints refused all {refused} small databases built")
        why = "; ".join(dict.fromkeys(uncertain)) or "no small database could be built"
        if refused:
            why += f" ({refused} more refused by the schema's constraints)"
        return done(skipped_reason="no_informative_database", databases=tried, refused=refused, detail=why)

    @staticmethod
    def _fresh(own: list[SmallDb], gold_sql: str, config: EquivalenceConfig, fresh: list[Prepared]) -> Iterator[Any]:
        """The prediction's own databases, built as they are tried (kept in `fresh` to be closed)."""
        for p in _prepared(own, gold_sql, config.spec):
            if p is not None:
                fresh.append(p)
            yield p

    def close(self) -> None:
        if self._own_store:
            self.invariants.close()
        with self._lock:
            for real in self._real.values():
                real.close()
            self._real.clear()
        self._suites = Lru(self.keep, SUITE_BYTES, lambda k, v: rows_bytes(v))
        self._golds = Lru(GOLD_CASES, GOLD_CASE_BYTES, lambda k, v: approx_bytes(k) + v.nbytes())
        self._targeted = Lru(TARGETED_QUERIES, TARGETED_BYTES, lambda k, v: approx_bytes(k) + rows_bytes(v[0]))

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
            _default = EquivalenceChecker(mine_inline=False)
        return _default
