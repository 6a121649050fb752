"""What a database's memo (Invariants.memo) keeps checks under: TableRows keys that stand for the plain tuple
of the same rows, counted in bytes as the plain tuple is, so the memo stays within MEMO_BYTES."""

from __future__ import annotations

from t2sql.equivalence.invariants import TableRows, _memo_bytes
from t2sql.lru import Lru


def test_table_rows_are_the_plain_tuple_as_a_key():
    rows = ((1, "a"), (2.0, None), (3, "x" * 100))
    kept = TableRows(rows)
    assert kept == rows and hash(kept) == hash(rows) and hash(kept) == hash(kept)
    memo = {("table", "t", kept): ["found"]}
    assert memo[("table", "t", rows)] == ["found"]  # a key of either kind finds the other's entry
    assert TableRows(rows[:2]) != rows and ("table", "t", TableRows(rows[:2])) not in memo


def test_table_rows_count_what_the_plain_tuple_counts_and_their_own_dict():
    rows = ((1, "a"), (2, "y" * 1000), (3, "z" * 10))
    plain = _memo_bytes(("table", "t", rows), [])
    kept = TableRows(rows)
    counted = _memo_bytes(("table", "t", kept), [])
    assert counted == plain + TableRows._OWN_BYTES  # the long cell included
    short = _memo_bytes(("table", "t", TableRows(((1, "a"), (2, "y"), (3, "z" * 10)))), [])
    assert counted >= short + 1000  # a long cell counts its length
    assert _memo_bytes(("table", "t", kept), []) == counted  # remembered, the same again
    assert _memo_bytes(("reference", "r", kept, kept), []) \
        == _memo_bytes(("reference", "r", rows, rows), []) + 2 * TableRows._OWN_BYTES  # each part counted


def test_a_memo_of_table_rows_stays_within_its_bytes():
    memo = Lru(1 << 20, 64 * 1024, _memo_bytes)
    for n in range(2000):
        memo.put(("table", "t", TableRows(((n, "v" * 200),) * 5)), [])
        assert memo.nbytes <= 64 * 1024
    assert memo.evicted > 0
