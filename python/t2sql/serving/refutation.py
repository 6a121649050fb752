"""What one small database says about a pair: the queries run there (the gold's digest prepared once per
gold), and whether the result refutes the match: they differ there and on its mirror (rows reversed,
unordered scans reversed), the gold's result does not depend on the order rows come in, and no ORDER
BY ... LIMIT keeps one of tied rows. A refuting database is shrunk to as few rows as still refute."""

from __future__ import annotations

from typing import Any

import t2sql
from t2sql._grader import GradeSpec, ToolLimits
from t2sql.serving import ordering, querytext
from t2sql.serving.smalldb import SmallDb

# Verdict outcomes on a small database, by what they say about the pair.
# Verdict outcomes on a small database, by what they say about the pair.
REFUTING = frozenset({"mismatch", "pred_error"})

AGREEING = frozenset({"match"})

WITNESS_RESULT_ROWS = 8  # rows of each query's result shown with a witness

SHRINK_TRIES = 40  # attempts to drop rows from a witness

def with_method(spec: GradeSpec, method: str) -> GradeSpec:
    """`spec` with another method: float digits, column order, timeout and temp-disk cap kept."""
    return GradeSpec(method, float_digits=spec.float_digits, column_order=spec.column_order,
                     timeout_s=spec.timeout_s, max_temp_mb=spec.max_temp_mb)


def witness_spec(spec: GradeSpec) -> GradeSpec:
    """How a pair is compared on a small database: as the task's method, except that a subset method
    ("name any N") asks only that each predicted row be a gold row (the gold may hold fewer than N rows
    there)."""
    if spec.method.startswith("subset"):
        return with_method(spec, "subset,>=,1")
    return spec

class Prepared:
    """A small database built in the core, with the gold's digest there (None: the gold failed, which
    makes the database uninformative). Kept per gold: every prediction of a task reuses it."""

    def __init__(self, db: SmallDb, gold: str, spec: GradeSpec, cancel: Any = None, *, reverse: bool = False):
        self.db = db
        self.core = db.database("witness", reverse=reverse)
        self.spec = witness_spec(spec)
        self.gold_error = ""
        self.gold = self._gold_digest(gold, cancel)

    def _gold_digest(self, gold: str, cancel: Any) -> Any:
        try:
            digest = self.core.digest(gold, self.spec, cancel=cancel)
            if self.spec.method.startswith("subset") and digest.rows == 0:
                # No gold row here: the prediction must return none either (compared as sets).
                self.spec = with_method(self.spec, "set")
                digest = self.core.digest(gold, self.spec, cancel=cancel)
            return digest
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError as e:
            self.gold_error = str(e)
            return None

    def close(self) -> None:
        self.core.close()

class Trial:
    """One small database and the two queries on it."""

    def __init__(self, prepared: Prepared, pred: str, gold: str, cancel: Any):
        self.prepared, self.db, self.pred, self.gold, self.cancel = prepared, prepared.db, pred, gold, cancel
        self.spec = prepared.spec

    def verdict(self, reverse: bool = False) -> tuple[str, str, Any, Any]:
        """(outcome, detail, gold digest, prediction digest or None) on the database (or its mirror)."""
        if not reverse:
            core, gold = self.prepared.core, self.prepared.gold
            if gold is None:
                return "gold_error", self.prepared.gold_error, None, None
            return self._grade(core, gold)
        mirror = Prepared(self.db, self.gold, self.spec, self.cancel, reverse=True)
        try:
            if mirror.gold is None:
                return "gold_error", mirror.gold_error, None, None
            return self._grade(mirror.core, mirror.gold)
        finally:
            mirror.close()

    def _grade(self, core: Any, gold: Any) -> tuple[str, str, Any, Any]:
        v = core.grade_against(self.pred, gold, self.spec.timeout_s, cancel=self.cancel)
        pred = None
        if v.outcome == "mismatch":  # its digest tells a refutation's row counts apart (a match needs none)
            try:
                pred = core.digest(self.pred, with_method(self.spec, gold.semantics), cancel=self.cancel)
            except t2sql.QueryCancelled:
                raise
            except t2sql.T2sqlError:
                pred = None
        return v.outcome, v.detail, gold, pred

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
        try:
            return (core.count_rows(sql, self.spec.timeout_s, cancel=self.cancel),
                    core.count_rows(f"SELECT DISTINCT * FROM ({sql})", self.spec.timeout_s, cancel=self.cancel))
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:
            return None

    def results_text(self) -> tuple[str, str]:
        limits = ToolLimits(timeout_s=self.spec.timeout_s, max_rows=WITNESS_RESULT_ROWS, max_chars=1500)
        out = []
        for sql in (self.gold, self.pred):
            try:
                out.append(self.prepared.core.run_tool(sql, limits, cancel=self.cancel).text)
            except t2sql.QueryCancelled:
                raise
            except t2sql.T2sqlError as e:
                out.append(f"Error: {e}")
        return out[0], out[1]

def refutes(trial: Trial) -> tuple[str, str]:
    """("refutes" | "agrees" | "uncertain", detail) for one small database."""
    try:
        outcome, detail, gold, pred = trial.verdict()
    except t2sql.QueryCancelled:
        raise
    except t2sql.T2sqlError as e:
        return "uncertain", str(e)
    if outcome in AGREEING:
        return "agrees", detail
    if outcome not in REFUTING:
        return "uncertain", detail
    ties = trial.ties()
    if ties:
        return "uncertain", "an ORDER BY ... LIMIT keeps one of tied rows here"
    mirrored = trial.verdict(reverse=True)
    if mirrored[0] not in REFUTING:
        return "uncertain", "the mirror database (rows reversed) does not tell them apart"
    if ties is None and outcome == "mismatch":
        # A LIMIT this cannot read keeps rows of its choice: only how many rows, the same on the mirror,
        # can refute.
        counts = [(g.rows if g is not None else None, p.rows if p is not None else None)
                  for g, p in ((gold, pred), (mirrored[2], mirrored[3]))]
        if None in counts[0] or counts[0] != counts[1] or counts[0][0] == counts[0][1]:
            return "uncertain", "a LIMIT without a readable ORDER BY keeps rows of its choice"
        return "refutes", detail
    # The gold's result must not depend on the order rows come in (it is what the answer is held to); the
    # prediction's may (a scalar subquery that picks one of two rows), since it misses the gold either way.
    there = mirrored[2]
    if (gold is None) != (there is None) or (gold is not None and not gold.same_result(there)):
        return "uncertain", "the gold's result depends on the order rows come in"
    return "refutes", detail

def shrink(trial: Trial, spec: GradeSpec) -> Trial:
    """A smaller database that still refutes: rows dropped, half a table at a time and then one at a time,
    while it stays realistic and the two queries still differ there; the smallest is checked in full
    (mirror and ties) once, and the original kept when that check fails."""
    original, best = trial, trial
    db = trial.db
    tries = 0

    def attempt(smaller: SmallDb) -> bool:
        nonlocal db, best, tries
        tries += 1
        if smaller.problems():
            return False
        candidate = Trial(Prepared(smaller, trial.gold, spec, trial.cancel), trial.pred, trial.gold, trial.cancel)
        try:
            outcome = candidate.verdict()[0]
        except t2sql.QueryCancelled:
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
    if best is not original and refutes(best)[0] != "refutes":
        best.prepared.close()
        return original
    return best
