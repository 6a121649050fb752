"""The real rows a check looks up: a lookup no index serves reads a bounded, fixed part of a large table
(the work of a check does not grow with the table); an indexed one reads the whole table."""

from __future__ import annotations

import sqlite3

from t2sql.equivalence import real_rows
from t2sql.equivalence.diskcache import DiskCache
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.real_rows import RealRows


def _db(path):
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE parent (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
        CREATE TABLE child (cid INTEGER PRIMARY KEY, parent_id INTEGER NOT NULL REFERENCES parent(id), tag TEXT,
                            code TEXT);
        CREATE INDEX child_code ON child (code);
    """)
    conn.executemany("INSERT INTO parent VALUES (?, ?)", [(i, f"p{i}") for i in range(1, 51)])
    conn.executemany("INSERT INTO child VALUES (?, ?, ?, ?)",
                     [(i, i, f"tag{i}", f"c{i}") for i in range(1, 51)])
    conn.commit()
    conn.close()
    return str(path)


def test_a_lookup_no_index_serves_reads_only_the_first_rows_of_a_large_table(tmp_path, monkeypatch):
    path = _db(tmp_path / "db.sqlite")
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    [ref] = [r for r in inv.references if r.child == "child"]
    monkeypatch.setattr(real_rows, "SCAN_ROWS", 10)
    with RealRows(path, inv) as real:
        assert real.children(ref, (5,)) and not real.children(ref, (30,))  # row 30 is past the first 10
        assert real.by_key("child", ("tag",), ("tag30",)) is None  # no index on tag
        assert real.by_key("child", ("code",), ("c30",)) is not None  # CREATE INDEX serves it
        assert real.by_key("child", ("cid",), (30,)) is not None  # the rowid
        assert len(real.values("child", "tag")) == 10
    monkeypatch.setattr(real_rows, "SCAN_ROWS", 100)  # a table that small is read whole
    with RealRows(path, inv) as real:
        assert real.children(ref, (30,)) and real.by_key("child", ("tag",), ("tag30",)) is not None


def test_a_querys_lineage_seeks_its_rows_among_a_large_tables_first_rows(tmp_path, monkeypatch):
    from t2sql.equivalence.lineage import fetch_lineage

    path = _db(tmp_path / "db.sqlite")
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    monkeypatch.setattr(real_rows, "JOIN_SCAN_ROWS", 10)
    with RealRows(path, inv) as real:
        def found(sql):  # the rows the query keeps (not those that miss a condition)
            return [t for label, tuples in fetch_lineage(real, inv, sql) if label.endswith("its rows")
                    for t in tuples]

        assert found("SELECT tag FROM child WHERE tag = 'tag5'")
        assert not found("SELECT tag FROM child WHERE tag = 'tag30'")  # row 30 is past the first 10
        # a LEFT JOIN's missing side (a NULL rowid) stays in scope
        assert found("SELECT p.name FROM parent AS p LEFT JOIN child AS c ON c.parent_id = p.id AND c.tag = 'none' "
                     "WHERE p.id = 3")


def _truth(path, sql, params=()):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def test_an_unindexed_lookup_reads_its_column_once_and_finds_what_the_scan_finds(tmp_path, monkeypatch):
    path = _db(tmp_path / "db.sqlite")
    conn = sqlite3.connect(path)  # repeated tags: a lookup returns the first rows holding one, by rowid
    conn.executemany("INSERT INTO child VALUES (?, ?, ?, ?)", [(100 + i, 1 + i % 3, f"tag{i % 4}", f"d{i}")
                                                              for i in range(40)])
    conn.commit()
    conn.close()
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    [ref] = [r for r in inv.references if r.child == "child"]
    statements = []
    with RealRows(path, inv) as real:
        run = real._run
        monkeypatch.setattr(real, "_run", lambda sql, *a: statements.append(sql) or run(sql, *a))
        for parent in (1, 2, 3, 7):
            want = _truth(path, "SELECT * FROM child WHERE parent_id = ? ORDER BY rowid LIMIT 4", (parent,))
            assert real.children(ref, (parent,), limit=4) == want
        for tag in ("tag1", "tag3", "tag30", "nope"):
            want = _truth(path, "SELECT * FROM child WHERE tag = ? ORDER BY rowid LIMIT 1", (tag,))
            assert real.by_key("child", ("tag",), (tag,)) == (want[0] if want else None)
        reads = [s for s in statements if "rowid IN" not in s and ('"parent_id" = ?' in s or '"tag" = ?' in s)]
        assert reads == []  # no statement looked for a value by reading the table
        assert sum('SELECT rowid, "tag"' in s for s in statements) == 1  # the column, read once


def test_a_lookup_a_row_of_another_storage_class_asks_is_not_served_by_the_column_read(tmp_path):
    path = _db(tmp_path / "db.sqlite")
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    # 5 against a text column: SQLite's affinity finds no 'tag' equal to it, nor does the lookup
    with RealRows(path, inv) as real:
        assert real.by_key("child", ("tag",), (5,)) is None
        assert real.by_key("child", ("parent_id",), ("5",)) == _truth(path, "SELECT * FROM child WHERE cid = 5")[0]


def test_a_prefix_lookup_through_an_index_finds_what_the_scan_finds(tmp_path, monkeypatch):
    path = _db(tmp_path / "db.sqlite")
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    monkeypatch.setattr(real_rows, "SCAN_ROWS", 10)
    with RealRows(path, inv) as real:
        want = sorted(r[0] for r in _truth(path, "SELECT code FROM child WHERE code LIKE 'c1_%'"))
        assert sorted(real.values_with_prefix("child", "code", "c1")) == want  # indexed: every row
        assert real.values_with_prefix("child", "tag", "tag1") == ["tag10"]  # tag11.. lie past the first 10
        assert sorted(real.values_with_prefix("child", "tag", "tag")) == sorted(f"tag{i}" for i in range(1, 11))


def test_lineage_runs_on_a_copy_of_the_first_rows_or_on_the_file_when_none_is_made(tmp_path, monkeypatch):
    from t2sql.equivalence.lineage import fetch_lineage

    path = _db(tmp_path / "db.sqlite")
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    monkeypatch.setattr(real_rows, "JOIN_SCAN_ROWS", 10)
    for cap, copied in ((real_rows.FIRST_ROWS_BYTES, True), (1, False)):
        monkeypatch.setattr(real_rows, "FIRST_ROWS_BYTES", cap)
        with RealRows(path, inv) as real:
            assert (real.first_rows() is not None) is copied

            def found(sql):
                return [t for label, tuples in fetch_lineage(real, inv, sql) if label.endswith("its rows")
                        for t in tuples]

            # the rows come from the real file by their rowids: the same tuples either way
            assert found("SELECT c.tag FROM child AS c JOIN parent AS p ON p.id = c.parent_id WHERE p.name = 'p5'") == [
                [("child", (5, 5, "tag5", "c5")), ("parent", (5, "p5"))]]
            assert not found("SELECT tag FROM child WHERE parent_id IN (SELECT id FROM parent WHERE name = 'p30')")
    monkeypatch.setattr(real_rows, "JOIN_SCAN_ROWS", 100)
    with RealRows(path, inv) as real:
        assert real.first_rows() is None  # every table that small: the file itself


def test_the_golds_one_row_answer_is_presumed_when_the_gold_does_not_finish():
    from t2sql.equivalence.presupposed import one_row_answer

    class Real:
        def __init__(self, got):
            self.got = got

        def answer(self, sql, timeout_s, max_rows=1000):
            return self.got

    assert one_row_answer(Real(None), "SELECT 1") is True  # ran past its time: a doubt refutes nothing
    assert one_row_answer(Real([(3,)]), "SELECT 1") is True
    assert one_row_answer(Real([(None,)]), "SELECT 1") is False
    assert one_row_answer(Real([(1,), (2,)]), "SELECT 1") is False
