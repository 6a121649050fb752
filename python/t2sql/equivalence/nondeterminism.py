"""What makes a query's result change from one run to the next on one database: random(), randomblob(),
the clock ('now', CURRENT_DATE/TIME/TIMESTAMP, a date function of no time value), in its own text or in
a view it reads. The equivalence check skips such a query (skipped: nondeterministic): a result that is
a draw refutes nothing. What the text does not show, the check finds by running both queries again on
a database that would refute (t2sql.equivalence.refutation.Trial.repeatable)."""

from __future__ import annotations

from t2sql.equivalence.declared import mentions
from t2sql.equivalence.invariants import Invariants
from t2sql.equivalence.querytext import unquote
from t2sql.sqltext import tokens


def nondeterministic(sql: str, inv: Invariants) -> str:
    """Why `sql`'s result may change from run to run on a database of `inv`'s kind ("" when nothing shows)."""
    return in_text(sql) or through_views(sql, inv)


RANDOM_FUNCTIONS = frozenset({"random", "randomblob"})
CLOCK_FUNCTIONS = frozenset({"date", "time", "datetime", "julianday", "unixepoch", "strftime", "timediff"})
CLOCK_WORDS = frozenset({"CURRENT_DATE", "CURRENT_TIME", "CURRENT_TIMESTAMP"})


def in_text(sql: str) -> str:
    """Why `sql`'s result may change from one run to the next on one database (a call of random() or
    randomblob(), the clock: 'now', CURRENT_DATE/TIME/TIMESTAMP, a date function with no time value),
    or "" when its text shows nothing of the kind. Read from the text's tokens, so it errs on the side of
    yes (a column named like the function is not called)."""
    if not isinstance(sql, str):
        return ""
    toks = tokens(sql)
    for j, t in enumerate(toks):
        if t.kind == "quoted" and t.text[:1] == "'" and t.text[1:-1].strip().lower() == "now":
            return "it reads the clock ('now')"
        if t.kind == "word" and t.upper in CLOCK_WORDS:
            return f"it reads the clock ({t.upper})"
        if t.kind not in ("word", "quoted") or j + 1 >= len(toks) or toks[j + 1].kind != "open":
            continue
        if j > 0 and toks[j - 1].text == ".":
            continue
        name = unquote(t.text).lower()
        if name in RANDOM_FUNCTIONS:
            return f"it calls {name}()"
        if name in CLOCK_FUNCTIONS:
            args = 0  # a date function of no time value reads the clock: date(), strftime('%Y')
            for k in range(j + 2, len(toks)):
                if toks[k].depth <= toks[j + 1].depth:
                    break
                if toks[k].depth == toks[j + 1].depth + 1 and toks[k].text == ",":
                    args += 1
            empty = toks[j + 2].kind == "close" if j + 2 < len(toks) else True
            if empty or (name == "strftime" and args == 0):
                return f"it reads the clock ({name} of no time value)"
    return ""


def created_view(sql: str) -> str | None:
    """The name a CREATE VIEW statement gives its view, or None for any other statement."""
    words = [t for t in tokens(sql) if t.kind in ("word", "quoted")][:8]
    uppers = [t.upper for t in words]
    if len(uppers) < 3 or uppers[0] != "CREATE" or "VIEW" not in uppers:
        return None
    k = uppers.index("VIEW") + 1
    if uppers[k:k + 3] == ["IF", "NOT", "EXISTS"]:
        k += 3
    return unquote(words[k].text) if k < len(words) else None


def through_views(sql: str, inv: Invariants) -> str:
    """Why a view `sql` reads makes its result change from run to run ("" when none does)."""
    for statement in inv.schema:
        view = created_view(statement)
        if view is not None and mentions(sql, frozenset({view.lower()})):
            why = in_text(statement)
            if why:
                return f"through the view {view}, {why}"
    return ""
