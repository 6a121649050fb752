"""One column's facts in one statement of mining's (t2sql.equivalence.mining): its distinct and non-NULL
values, the pairs of rows sharing one, storage classes, text shapes and letter cases, and how many of its
values each declared parent key holds."""

from __future__ import annotations

from typing import Any

import t2sql
from t2sql.equivalence.invariants import FORMAT_LEAD, FORMATS, OTHER_TEXT, quote


def column_sql(name: str, c: str, parents: list[tuple[str, str]] = (), *, unique: bool = False,
                mirrored: tuple[str, str] | None = None) -> str:
    """One column's values in one statement, grouped (a sort, or a walk of an index that starts with the
    column): how many distinct and non-NULL values and pairs of rows sharing one (BINARY: letter case
    counts), its storage classes, text shapes and letter cases. Shapes and cases are functions of a text
    value and texts equal under BINARY are the same bytes, so one value a group says what every row of
    it would; a group may mix integer 1 and real 1.0, so its types are taken from every row. For each
    (table, column) of `parents` (a declared reference's parent key), how many of the distinct values it
    holds (t2sql.equivalence.mining._references).

    `unique`: a key of the column alone is declared (its index keeps two rows from sharing a value under
    the column's collation, hence under BINARY): each row is its own group, so the rows are read as they
    lie, without the grouping (a 12M-row key at 1000x: about half the time). `mirrored` = (a, b): the
    table is stored both ways in (a, b) (realism_mining.mirror_sql proves it; the caller uses the answer
    only then): the rows with a > b are the mirrors of those with a < b, with this column's value, so
    only the rows with NOT (a > b) are sorted, those with a < b counted twice."""
    return _facts(parents) + _column_rows(name, quote(c), unique, mirrored)


def tally_sql(name: str, c: str) -> str:
    """The statement whose tally (Database.tally: the distinct values counted in a bounded hash, not
    sorted) gives column_sql's groups, for a column column_sql would group whole with no parents."""
    q = quote(c)
    return f"SELECT {q} FROM {quote(name)} WHERE {q} IS NOT NULL"


def tallied_stats(groups: list[tuple]) -> dict[str, Any]:
    """column_stats of a tally's groups: column_sql's facts read by the same SQL over them, in a small
    database of their own (one row a group: a value, its rows, its storage classes)."""
    rows = [(v, k, min(classes), max(classes)) for v, k, classes in groups]
    with t2sql.Database.from_rows("tally", ["CREATE TABLE g (v, k, low, high)"],
                                  [("g", ["v", "k", "low", "high"], rows)]) as db:
        return column_stats(db.rows(_facts([]) + " FROM g"))


def _facts(parents: list[tuple[str, str]]) -> str:
    """column_sql's SELECT over one row a group (v, k, low, high)."""
    shape = " ".join(f"WHEN {cond.format(q='v')} THEN '{fmt}'" for fmt, cond, _ in FORMATS)
    return (f"SELECT count(*), sum(k), sum(k * (k - 1) / 2), group_concat(DISTINCT low), "
            f"group_concat(DISTINCT high), group_concat(DISTINCT CASE WHEN typeof(v) <> 'text' THEN NULL "
            f"WHEN {FORMAT_LEAD.format(q='v')} THEN CASE {shape} ELSE '{OTHER_TEXT}' END "
            f"ELSE '{OTHER_TEXT}' END), max({_has_case('a-z', 'upper')}), max({_has_case('A-Z', 'lower')})"
            + "".join(f", sum(EXISTS (SELECT 1 FROM {quote(p)} WHERE {quote(pc)} = v))" for p, pc in parents))


def _has_case(letters: str, fold: str) -> str:
    """Whether a text value holds a letter of `letters`, as smalldb.letter_cases reads it: ASCII `fold`()
    changes it. GLOB's character class says it without a copy of the value (upper() allocates one per value,
    and SQLite's allocator takes one lock for every connection of the process: two such statements side by
    side ran 3.5 times slower each); GLOB reads up to the first NUL, so a text with one (its length in
    characters then differs from its bytes, as it does for any character past ASCII) is asked `fold`().
    A CASE, as AND and OR evaluate both sides."""
    return (f"CASE WHEN typeof(v) <> 'text' THEN 0 WHEN v GLOB '*[{letters}]*' THEN 1 "
            f"WHEN length(v) <> octet_length(v) THEN {fold}(v) <> v COLLATE BINARY ELSE 0 END")


def _column_rows(name: str, q: str, unique: bool, mirrored: tuple[str, str] | None) -> str:
    """column_sql's FROM: one row per distinct value, with how many rows hold it (k) and its storage classes."""
    if unique:
        return (f" FROM (SELECT {q} AS v, 1 AS k, typeof({q}) AS low, NULL AS high FROM {quote(name)} "
                f"WHERE {q} IS NOT NULL)")
    counted, half = "count(*)", ""
    if mirrored:
        a, b = quote(mirrored[0]), quote(mirrored[1])
        counted, half = f"sum(CASE WHEN {a} < {b} THEN 2 ELSE 1 END)", f" AND NOT ({a} > {b})"
    return (f" FROM (SELECT {q} AS v, {counted} AS k, min(typeof({q})) AS low, max(typeof({q})) AS high "
            f"FROM {quote(name)} WHERE {q} IS NOT NULL{half} GROUP BY {q} COLLATE BINARY)")


def column_stats(got: list[tuple]) -> dict[str, Any]:
    distinct, non_null, pairs, low, high, formats, lower, upper = got[0][:8]
    seen = set(str(low or "").split(",")) | set(str(high or "").split(","))
    return dict(distinct=distinct or 0, non_null=non_null or 0, pairs=pairs or 0,
                types=tuple(k for k in ("integer", "real", "text", "blob") if k in seen),
                formats=tuple(sorted(set(str(formats or "").split(",")) - {""})),
                cases=tuple(k for k, v in (("lower", lower), ("upper", upper)) if v), mined=True,
                found=tuple(got[0][8:]))
