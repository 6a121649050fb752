"""Databases that are being written, or were changed behind the Grader's back.

The core opens databases immutable (no locks). These tests build what breaks that trust, with
real SQLite writers in real processes, and check that nothing stale or uncommitted is graded
silently: a committed WAL is read, a hot journal or a writer's lock is refused with an error that
names the file, and an edit whose mtime was restored still reaches the Grader and its manifest.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import t2sql
from conftest import SAMPLE_ROOT, tool_limits
from t2sql.serving.grader import Grader
from t2sql.serving.manifest import DatabaseChanged, Manifest, file_identity

SUPERHERO = SAMPLE_ROOT / "superhero" / "superhero.sqlite"
COUNT = "SELECT count(*) FROM t"


def make_db(path: Path, journal_mode: str, rows: int = 2000) -> str:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA journal_mode={journal_mode}")
    con.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")
    con.executemany("INSERT INTO t(v) VALUES (?)", [("x" * 200,)] * rows)
    con.commit()
    con.close()
    return str(path)


# A writer in its own process: a large transaction whose pages spill into the database file
# (cache_size=5), then it either dies (SIGKILL) or waits holding its lock.
WRITER = """
import os, signal, sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA cache_size=5")
con.execute("BEGIN")
con.execute("UPDATE t SET v = 'uncommitted'")
con.execute("INSERT INTO t(v) SELECT v FROM t")
if sys.argv[2] == "die":
    os.kill(os.getpid(), signal.SIGKILL)
print("holding", flush=True)
sys.stdin.readline()
"""


def test_committed_rows_still_in_the_wal_are_read(tmp_path):
    path = make_db(tmp_path / "w.sqlite", "WAL")
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA wal_autocheckpoint=0")  # the rows stay in the -wal file
    writer.executemany("INSERT INTO t(v) VALUES (?)", [("y",)] * 500)
    writer.commit()
    try:
        assert os.path.getsize(path + "-wal") > 0
        db = t2sql.Database(path)
        assert not db.immutable  # read with locks, not immutable
        assert db.run_tool(COUNT, tool_limits()).rows == [(2500,)]
        assert db.grade("SELECT 2500", COUNT).outcome == "match"
    finally:
        writer.close()


def test_the_grader_sees_rows_committed_after_it_cached_the_database(tmp_path):
    path = make_db(tmp_path / "w.sqlite", "WAL")
    with Grader(concurrency=1) as g:
        assert g.run_tool_sync(path, COUNT, tool_limits()).rows == [(2000,)]
        assert g.grade_sync(path, "SELECT 2000", COUNT).outcome == "match"  # gold cached: 2000
        writer = sqlite3.connect(path)
        writer.execute("PRAGMA wal_autocheckpoint=0")
        writer.executemany("INSERT INTO t(v) VALUES (?)", [("y",)] * 500)
        writer.commit()
        try:
            # The -wal beside it is a new identity: connections reopen, the gold runs again.
            assert g.run_tool_sync(path, COUNT, tool_limits()).rows == [(2500,)]
            r = g.grade_sync(path, "SELECT 2500", COUNT)
            assert r.outcome == "match" and not r.gold_cached
        finally:
            writer.close()


def test_a_writer_killed_mid_transaction_is_refused_by_name(tmp_path):
    path = make_db(tmp_path / "h.sqlite", "DELETE")
    proc = subprocess.run([sys.executable, "-c", WRITER, path, "die"], capture_output=True, timeout=60)
    assert proc.returncode == -9
    assert os.path.getsize(path + "-journal") > 0  # a hot journal; uncommitted pages in the file
    with pytest.raises(t2sql.DatabaseError, match="hot journal") as info:
        t2sql.Database(path)
    assert f"{path}-journal" in str(info.value)
    with Grader(concurrency=1) as g:
        with pytest.raises(t2sql.DatabaseError, match="hot journal"):
            g.run_tool_sync(path, COUNT, tool_limits())
    # Once rolled back by a read-write open, the committed state grades as before.
    con = sqlite3.connect(path)  # what the error message tells the user to do
    con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    con.close()
    assert not os.path.exists(path + "-journal")
    assert t2sql.Database(path).run_tool(COUNT, tool_limits()).rows == [(2000,)]


def test_a_writer_holding_its_lock_is_refused_within_a_second(tmp_path):
    path = make_db(tmp_path / "l.sqlite", "DELETE")
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path, "hold"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        started = time.monotonic()
        with pytest.raises(t2sql.DatabaseError, match="locked by a writer"):
            t2sql.Database(path).run_tool(COUNT, tool_limits())
        assert time.monotonic() - started < 3
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    # The writer ended without committing: its transaction rolled back.
    assert t2sql.Database(path).run_tool(COUNT, tool_limits()).rows == [(2000,)]


def test_the_schema_is_read_through_the_guarded_path_like_any_statement(tmp_path):
    # Database.schema() reads sqlite_master with a statement prepared and stepped like every other:
    # a writer's lock is answered with the guarded path's error (it was "<path>: database is locked").
    path = make_db(tmp_path / "s.sqlite", "DELETE")
    db = t2sql.Database(path, immutable=False)  # read with locks, opened before the writer came
    assert db.schema() == [("table", "t", "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")]
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path, "hold"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        errors = []
        for call in (lambda: db.run_tool(COUNT, tool_limits()), db.schema):
            with pytest.raises(t2sql.DatabaseError, match="locked by a writer") as info:
                call()
            errors.append(str(info.value))
        assert errors[0] == errors[1]
    finally:
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(timeout=30)
    assert db.schema() == [("table", "t", "CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT)")]


def _edit_keeping_size_and_mtime(path: Path) -> None:
    """Change one value in place (same length, same file size) and put the mtime back."""
    st = path.stat()
    con = sqlite3.connect(path)
    con.execute("UPDATE superhero SET superhero_name = upper(superhero_name) WHERE id = 1")
    con.commit()
    con.close()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -d: mtime restored
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns


NAME_OF_1 = "SELECT superhero_name FROM superhero WHERE id = 1"


def test_restored_mtime_does_not_fake_the_manifest(tmp_path):
    db = tmp_path / "superhero" / "superhero.sqlite"
    db.parent.mkdir()
    shutil.copyfile(SUPERHERO, db)
    Manifest.build(tmp_path).save(tmp_path / "manifest.json")
    recorded = json.loads((tmp_path / "manifest.json").read_text())["databases"]["superhero"]
    assert recorded["inode"] == db.stat().st_ino and recorded["ctime_ns"] == db.stat().st_ctime_ns
    with Grader(concurrency=1, manifest=tmp_path / "manifest.json") as g:
        assert g.grade_sync(str(db), NAME_OF_1, NAME_OF_1).outcome == "match"
        _edit_keeping_size_and_mtime(db)
        with pytest.raises(DatabaseChanged, match="different sha256"):
            g.run_tool_sync(str(db), NAME_OF_1, tool_limits())


def test_restored_mtime_does_not_fake_the_gold_cache(tmp_path):
    db = tmp_path / "superhero.sqlite"
    shutil.copyfile(SUPERHERO, db)
    before = sqlite3.connect(db).execute(NAME_OF_1).fetchone()[0]
    with Grader(concurrency=1, cache_dir=tmp_path / "cache") as g:
        assert g.grade_sync(str(db), f"SELECT '{before}'", NAME_OF_1).outcome == "match"
        _edit_keeping_size_and_mtime(db)
        # The edited file is a new identity: its gold is computed again, not served from the cache.
        r = g.grade_sync(str(db), f"SELECT '{before.upper()}'", NAME_OF_1)
        assert r.outcome == "match" and not r.gold_cached


def test_hash_databases_checks_content_even_when_the_stat_matches(tmp_path):
    db = tmp_path / "superhero" / "superhero.sqlite"
    db.parent.mkdir()
    shutil.copyfile(SUPERHERO, db)
    Manifest.build(tmp_path).save(tmp_path / "manifest.json")
    # A manifest whose stat fields match but whose recorded hash does not: only hashing can tell.
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["databases"]["superhero"]["sha256"] = "0" * 64
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with Grader(concurrency=1, manifest=tmp_path / "manifest.json") as trusting:
        assert trusting.run_tool_sync(str(db), NAME_OF_1, tool_limits()).row_count == 1
    with Grader(concurrency=1, manifest=tmp_path / "manifest.json", hash_databases=True) as hashing:
        with pytest.raises(DatabaseChanged, match="different sha256"):
            hashing.run_tool_sync(str(db), NAME_OF_1, tool_limits())


def test_a_writer_side_file_is_refused_under_a_manifest(tmp_path):
    root = tmp_path / "data"
    db = Path(make_db(tmp_path / "w.sqlite", "WAL"))
    (root / "w").mkdir(parents=True)
    db = Path(shutil.move(str(db), root / "w" / "w.sqlite"))
    Manifest.build(root).save(tmp_path / "manifest.json")
    writer = sqlite3.connect(db)
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("INSERT INTO t(v) VALUES ('new')")
    writer.commit()
    try:
        assert file_identity(db).writer_file(db) == f"{db}-wal"
        with Grader(concurrency=1, manifest=tmp_path / "manifest.json") as g:
            with pytest.raises(DatabaseChanged, match="-wal is not empty"):
                g.run_tool_sync(str(db), COUNT, tool_limits())
    finally:
        writer.close()
