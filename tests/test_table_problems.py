"""A small database's per-column checks (t2sql.equivalence.smalldb): each mined invariant a value breaks is
named, with the first value that breaks it, and a column whose values all keep them gives nothing."""

from __future__ import annotations

import pytest

from t2sql.equivalence.invariants import Column, Table
from t2sql.equivalence.smalldb import _table_problems


def _table() -> Table:
    code = Column("code", "TEXT", False, False, False, False, ("text",), ("text",), cases=("upper",))
    day = Column("day", "TEXT", False, False, True, False, ("text",), ("date",))
    n = Column("n", "INTEGER", False, False, True, False, ("integer",), ())
    return Table("t", (code, day, n), 3, True, None, ())


GOOD = [("AB", "2020-01-02", 1), ("CD", None, -(1 << 63)), ("AB", "2021-12-31", (1 << 63) - 1)]


def test_rows_that_keep_every_invariant_have_no_problem():
    assert _table_problems(_table(), GOOD, frozenset({"code"})) == []
    assert _table_problems(_table(), [("ab", "2020-01-02", 1)]) == []  # not an identifier: any case


@pytest.mark.parametrize("bad, message", [
    (("Ab", "2020-01-02", 1), "t.code: 'Ab' has letters in a case the identifier never uses"),
    (("AB", "2020-01-02 10:00", 1), "t.day: '2020-01-02 10:00' is not of the column's formats (date)"),
    (("AB", "2020-01-02", 1.5), "t.n holds no real values (1.5)"),
    (("AB", "2020-01-02", "7"), "t.n holds no text values ('7')"),
    (("AB", "2020-01-02", 1 << 63), f"t.n: {1 << 63} is past SQLite's 64-bit integers"),
    ((None, "2020-01-02", 1), "t.code never holds NULL"),
])
def test_a_value_that_breaks_an_invariant_is_named(bad, message):
    got = _table_problems(_table(), [*GOOD, bad, bad], frozenset({"code"}))
    assert got == [message]  # named once, by the first value that breaks it
