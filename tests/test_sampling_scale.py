"""The real rows a check looks up: a lookup no index serves reads a bounded, fixed part of a large table
(the work of a check does not grow with the table); an indexed one reads the whole table."""

from __future__ import annotations

import sqlite3

from t2sql.serving import sampling
from t2sql.serving.diskcache import DiskCache
from t2sql.serving.invariant_store import InvariantStore
from t2sql.serving.sampling import RealRows


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
    monkeypatch.setattr(sampling, "SCAN_ROWS", 10)
    real = RealRows(path, inv)
    try:
        assert real.children(ref, (5,)) and not real.children(ref, (30,))  # row 30 is past the first 10
        assert real.by_key("child", ("tag",), ("tag30",)) is None  # no index on tag
        assert real.by_key("child", ("code",), ("c30",)) is not None  # CREATE INDEX serves it
        assert real.by_key("child", ("cid",), (30,)) is not None  # the rowid
        assert len(real.values("child", "tag")) == 10
    finally:
        real.close()
    monkeypatch.setattr(sampling, "SCAN_ROWS", 100)  # a table that small is read whole
    real = RealRows(path, inv)
    try:
        assert real.children(ref, (30,)) and real.by_key("child", ("tag",), ("tag30",)) is not None
    finally:
        real.close()


def test_a_querys_lineage_seeks_its_rows_among_a_large_tables_first_rows(tmp_path, monkeypatch):
    from t2sql.serving.lineage import fetch_lineage

    path = _db(tmp_path / "db.sqlite")
    inv = InvariantStore(DiskCache(tmp_path / "cache")).get(path)
    monkeypatch.setattr(sampling, "JOIN_SCAN_ROWS", 10)
    real = RealRows(path, inv)
    try:
        def found(sql):  # the rows the query keeps (not those that miss a condition)
            return [t for label, tuples in fetch_lineage(real, inv, sql) if label.endswith("its rows")
                    for t in tuples]

        assert found("SELECT tag FROM child WHERE tag = 'tag5'")
        assert not found("SELECT tag FROM child WHERE tag = 'tag30'")  # row 30 is past the first 10
        # a LEFT JOIN's missing side (a NULL rowid) stays in scope
        assert found("SELECT p.name FROM parent AS p LEFT JOIN child AS c ON c.parent_id = p.id AND c.tag = 'none' "
                     "WHERE p.id = 3")
    finally:
        real.close()
