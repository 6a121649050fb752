"""What one small database says about a pair: both queries run there (the gold's digest prepared once per gold), and
whether the result refutes the match (the rule: docs/recipe_extras.md, "Equivalence check", What a small database
says); a refuting database is shrunk to as few rows as still refute. Every query runs in the core under the
check's bounds (t2sql.equivalence.checkbounds)."""

from __future__ import annotations

from typing import Any

import t2sql
from t2sql._grader import GradeSpec, ToolLimits
from t2sql.equivalence import checkbounds, ordering, querytext
from t2sql.equivalence.smalldb import SmallDb

# Verdict outcomes on a small database, by what they say about the pair.
REFUTING = frozenset({"mismatch", "pred_error"})

AGREEING = frozenset({"match"})

WITNESS_RESULT_ROWS = 8  # rows of each query's result shown with a witness
# A witness's preview: the check's own numbers (a witness is read by people, not by the model).
_WITNESS_PREVIEW = {"max_rows": WITNESS_RESULT_ROWS, "max_cell_chars": 120, "max_chars": 1500, "count_cap": 10000}

SHRINK_TRIES = 40  # attempts to drop rows from a witness

# The detail of a database where a query's result changed from one run to the next.
NONDETERMINISTIC = "a query's result changes from run to run here (random(), the clock)"

TIMED_OUT = object()  # a query run again timed out: its result is not known

def with_method(spec: GradeSpec, method: str) -> GradeSpec:
    """`spec` with another method: float digits, column order, timeout and temp-disk cap kept."""
    return GradeSpec(method, float_digits=spec.float_digits, column_order=spec.column_order,
                     timeout_s=spec.timeout_s, max_temp_mb=spec.max_temp_mb)


def with_timeout(spec: GradeSpec, timeout_s: float) -> GradeSpec:
    """`spec` under another timeout (its method, digits, column order and temp-disk cap kept)."""
    return GradeSpec(spec.method, float_digits=spec.float_digits, column_order=spec.column_order,
                     timeout_s=timeout_s, max_temp_mb=spec.max_temp_mb)


def digest(core: Any, sql: str, spec: GradeSpec) -> Any:
    """`sql`'s digest on `core` under `spec`, its timeout cut at the check's deadline."""
    budget = checkbounds.current()
    return budget.run(spec.timeout_s, lambda t: core.digest(sql, with_timeout(spec, t), cancel=budget.cancel))


# The subset comparisons (the core's, t2sql._grader.Method.operator) that witness_spec's rule has been
# checked for: each asks that every predicted row be a gold row and, where the gold has a row, that there
# be one, so "subset,>=,1" never refutes a right answer under it. A comparison the core gains fails
# tests/test_equivalence.py until it is checked and listed here.
WITNESS_OPERATORS = frozenset({"=", ">="})


def witness_spec(spec: GradeSpec) -> GradeSpec:
    """How a pair is compared on a small database: as the task's method, except that a subset method
    ("name any N", any comparison of WITNESS_OPERATORS) asks only that each predicted row be a gold row
    (the gold may hold fewer than N rows there)."""
    if spec.method.startswith("subset"):
        return with_method(spec, "subset,>=,1")
    return spec

class Prepared:
    """A small database built in the core, with the gold's digest there (None: the gold failed, which
    makes the database uninformative). Kept per gold: every prediction of a task reuses it. Building it
    raises t2sql.ConstraintError when the schema refuses its rows (the database cannot exist)."""

    def __init__(self, db: SmallDb, gold: str, spec: GradeSpec, *, reverse: bool = False):
        self.db = db
        self.core = db.database("witness", reverse=reverse)
        self.spec = witness_spec(spec)
        self.gold_error = ""
        self.gold = self._gold_digest(gold)

    def _gold_digest(self, gold: str) -> Any:
        try:
            found = digest(self.core, gold, self.spec)
            if self.spec.method.startswith("subset") and found.rows == 0:
                # No gold row here: the prediction must return none either (compared as sets).
                self.spec = with_method(self.spec, "set")
                found = digest(self.core, gold, self.spec)
            return found
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError as e:
            self.gold_error = str(e)
            return None

    def close(self) -> None:
        self.core.close()

class Trial:
    """One small database and the two queries on it."""

    def __init__(self, prepared: Prepared, pred: str, gold: str):
        self.prepared, self.db, self.pred, self.gold = prepared, prepared.db, pred, gold
        self.spec = prepared.spec

    def verdict(self, reverse: bool = False) -> tuple[str, str, Any, Any]:
        """(outcome, detail, gold digest, prediction digest or None) on the database (or its mirror)."""
        if not reverse:
            core, gold = self.prepared.core, self.prepared.gold
            if gold is None:
                return "gold_error", self.prepared.gold_error, None, None
            return self._grade(core, gold)
        mirror = Prepared(self.db, self.gold, self.spec, reverse=True)
        try:
            if mirror.gold is None:
                return "gold_error", mirror.gold_error, None, None
            return self._grade(mirror.core, mirror.gold)
        finally:
            mirror.close()

    def _grade(self, core: Any, gold: Any) -> tuple[str, str, Any, Any]:
        budget = checkbounds.current()
        v = budget.run(self.spec.timeout_s, lambda t: core.grade_against(
            self.pred, gold, t, cancel=budget.cancel, max_temp_mb=self.spec.max_temp_mb))
        pred = None
        if v.outcome == "mismatch":  # its digest tells a refutation's row counts apart (a match needs none)
            try:
                pred = digest(core, self.pred, with_method(self.spec, gold.method))
            except t2sql.QueryCancelled:
                raise
            except t2sql.T2sqlError:
                pred = None
        return v.outcome, v.detail, gold, pred

    def repeatable(self) -> bool | None:
        """Whether both queries give here, run again, what they gave: the gold its digest, the prediction
        the same digest (or the same error) twice. A result that changes from run to run is a draw, not
        a fact about the queries. None when a run again timed out (nothing is known)."""
        core, gold = self.prepared.core, self.prepared.gold
        if gold is None:
            return None
        again = self._result(core, self.gold, self.spec)
        spec = with_method(self.spec, gold.method)
        first, second = self._result(core, self.pred, spec), self._result(core, self.pred, spec)
        if TIMED_OUT in (again, first, second):
            return None
        if isinstance(again, str) or not gold.same_result(again):
            return False
        if isinstance(first, str) or isinstance(second, str):
            return first == second
        return first.same_result(second)

    @staticmethod
    def _result(core: Any, sql: str, spec: GradeSpec) -> Any:
        """The digest, the error's text, or TIMED_OUT."""
        try:
            return digest(core, sql, spec)
        except t2sql.QueryCancelled:
            raise
        except t2sql.QueryTimeout:
            return TIMED_OUT
        except t2sql.T2sqlError as e:
            return f"{type(e).__name__}: {e}"

    def ties(self) -> bool | None:
        """True when a query's ORDER BY ... LIMIT keeps one of tied rows here (its result is then a
        choice, not a fact); None when a LIMIT cannot be read (then only row counts can refute)."""
        core = self.prepared.core
        unknown = False
        for sql in (self.gold, self.pred):
            st = querytext.read(sql)
            if st is None:
                continue
            cut = ordering.cut(st)
            if cut is False:
                unknown = True
                continue
            if cut is None:
                continue
            at_cut = self._rows_and_distinct(core, cut.keys_sql)
            if at_cut is None:
                unknown = True
                continue
            if at_cut == (2, 1):  # the row the LIMIT keeps last and the next one tie
                return True
            if self.spec.method == "ordered":
                every = self._rows_and_distinct(core, cut.ordered_sql)
                if every is None:
                    unknown = True
                    continue
                if every[0] != every[1]:  # ties anywhere: the order among them is a choice
                    return True
        return None if unknown else False

    def _rows_and_distinct(self, core: Any, sql: str) -> tuple[int, int] | None:
        """(rows, distinct rows) of `sql` here, or None when it does not run."""
        budget = checkbounds.current()

        def count(text: str) -> int:
            return budget.run(self.spec.timeout_s, lambda t: core.count_rows(
                text, t, cancel=budget.cancel, max_temp_mb=self.spec.max_temp_mb))

        try:
            return count(sql), count(f"SELECT DISTINCT * FROM ({sql})")
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:
            return None

    def results_text(self) -> tuple[str, str]:
        budget = checkbounds.current()
        out = []
        for sql in (self.gold, self.pred):
            try:
                out.append(budget.run(self.spec.timeout_s, lambda t, sql=sql: self.prepared.core.run_tool(
                    sql, ToolLimits(timeout_s=t, **_WITNESS_PREVIEW,
                                    max_temp_mb=self.spec.max_temp_mb), cancel=budget.cancel).text))
            except checkbounds.BudgetSpent:
                out.append("(not run: the check's budget ran out)")
            except t2sql.QueryCancelled:
                raise
            except t2sql.T2sqlError as e:
                out.append(f"Error: {e}")
        return out[0], out[1]

TIED = "an ORDER BY ... LIMIT keeps one of tied rows here"


def refutes(trial: Trial) -> tuple[str, str]:
    """("refutes" | "agrees" | "uncertain", detail) for one small database; a query that fails or runs
    out of its time makes it uncertain (the check's deadline and Cancel go on up)."""
    try:
        return _refutes(trial)
    except t2sql.QueryCancelled:
        raise
    except t2sql.T2sqlError as e:
        return "uncertain", str(e)


def _refutes(trial: Trial) -> tuple[str, str]:
    outcome, detail, gold, pred = trial.verdict()
    if outcome in AGREEING:
        return "agrees", detail
    if outcome not in REFUTING:
        return "uncertain", detail
    ties = trial.ties()
    if ties and outcome != "mismatch":
        return "uncertain", TIED
    repeatable = trial.repeatable()
    if repeatable is None:
        return "uncertain", "a query timed out when run again here"
    if not repeatable:
        return "uncertain", NONDETERMINISTIC
    mirrored = trial.verdict(reverse=True)
    if mirrored[0] not in REFUTING:
        return "uncertain", "the mirror database (rows reversed) does not tell them apart"
    if ties is not False and outcome == "mismatch":
        # A LIMIT this cannot read keeps rows of its choice, but not how many: only how many rows, the same on
        # the mirror, can refute. Where it cuts through tied rows, only rows against none: a query that keeps
        # every tied row (`= (SELECT MAX(...))`) answers a question the tie makes ambiguous.
        counts = [(g.rows if g is not None else None, p.rows if p is not None else None)
                  for g, p in ((gold, pred), (mirrored[2], mirrored[3]))]
        if (None in counts[0] or counts[0] != counts[1] or counts[0][0] == counts[0][1]
                or (ties and 0 not in counts[0])):
            return "uncertain", TIED if ties else "a LIMIT without a readable ORDER BY keeps rows of its choice"
        return "refutes", detail
    # The gold's result must not depend on the order rows come in (it is what the answer is held to); the
    # prediction's may (a scalar subquery that picks one of two rows), since it misses the gold either way.
    there = mirrored[2]
    if (gold is None) != (there is None) or (gold is not None and not gold.same_result(there)):
        return "uncertain", "the gold's result depends on the order rows come in"
    return "refutes", detail

def shrink(trial: Trial, spec: GradeSpec, detail: str) -> tuple[Trial, str]:
    """A smaller database that still refutes, and its verdict's detail (`detail`: the original's): rows
    dropped, half a table at a time and then one at a time, while it stays realistic and the two queries
    still differ there; the smallest is checked in full (mirror, ties, runs again) once, and the original
    kept when that check fails or the check's deadline comes first."""
    original, best = trial, trial
    db = trial.db
    tries = 0

    def attempt(smaller: SmallDb) -> bool:
        nonlocal db, best, tries
        tries += 1
        if smaller.problems():
            return False
        try:
            candidate = Trial(Prepared(smaller, trial.gold, spec), trial.pred, trial.gold)
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:  # its rows are refused (a constraint), or it cannot be built in time
            return False
        try:
            outcome = candidate.verdict()[0]
        except (t2sql.QueryCancelled, checkbounds.BudgetSpent):
            candidate.prepared.close()
            raise
        except t2sql.T2sqlError:
            outcome = "error"
        if outcome not in REFUTING:
            candidate.prepared.close()
            return False
        if best is not original:
            best.prepared.close()
        db, best = smaller, candidate
        return True

    try:
        for table in sorted(db.rows, key=lambda t: -len(db.rows[t])):
            # Halves first: most rows of a closed sample are there only to close it.
            while len(db.rows.get(table, [])) > 1 and tries < SHRINK_TRIES:
                smaller = db.copy()
                rows = smaller.rows[table]
                smaller.rows[table] = rows[: len(rows) // 2]
                if not attempt(smaller):
                    break
            i = 0
            while i < len(db.rows.get(table, [])) and tries < SHRINK_TRIES:
                smaller = db.copy()
                del smaller.rows[table][i]
                if not attempt(smaller):
                    i += 1
        if best is not original:
            verdict, best_detail = refutes(best)
            if verdict != "refutes":
                best.prepared.close()
                return original, detail
            return best, best_detail
    except checkbounds.BudgetSpent:  # out of time: the witness is the database that refuted, unshrunk
        if best is not original:
            best.prepared.close()
    return original, detail
