"""The core's Python API takes its arguments as Python gives them: an integer out of the range the
core takes (a negative limit, a seed past 2**64) is an InvalidArgument naming the argument and the
range, never a bare OverflowError; paths may be str, bytes or os.PathLike; a Database closes, by
close() or a with block, and says so when used after."""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

import pytest

import t2sql
from conftest import tool_limits
from t2sql import (
    Database,
    DatabaseClosed,
    DatabaseError,
    GradeSpec,
    InvalidArgument,
    T2sqlError,
    UnsafeQuery,
)
from t2sql._grader import SqlPool
from t2sql.serving.jobs import DigestJob, ToolJob

U64 = "from 0 to 18446744073709551615"


@pytest.fixture
def db_file(tmp_path) -> Path:
    path = tmp_path / "people.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE people (id INTEGER, name TEXT)")
    con.executemany("INSERT INTO people VALUES (?, ?)", [(i, f"p{i}") for i in range(5)])
    con.commit()
    con.close()
    return path


def refused(call, name: str, range_text: str) -> str:
    with pytest.raises(InvalidArgument) as info:
        call()
    e = info.value
    assert isinstance(e, ValueError) and isinstance(e, T2sqlError) and not isinstance(e, OverflowError)
    assert str(e).startswith(f"{name} must be ") and range_text in str(e), str(e)
    return str(e)


def test_invalid_argument_is_one_of_the_core_errors_and_a_value_error():
    assert issubclass(InvalidArgument, T2sqlError) and issubclass(InvalidArgument, ValueError)
    assert t2sql.errors.InvalidArgument is InvalidArgument and t2sql.errors.DatabaseClosed is DatabaseClosed
    assert issubclass(DatabaseClosed, DatabaseError)


@pytest.mark.parametrize("name", ["max_rows", "max_cell_chars", "max_chars", "count_cap"])
@pytest.mark.parametrize("value", [-1, 2**64, 10**5000], ids=["-1", "2**64", "10**5000"])
def test_tool_limits_out_of_range(db_file, name, value):
    db = Database(db_file)
    message = refused(lambda: tool_limits(**{name: value}), name, U64)  # a tool call's limits, one value
    shown = {-1: "got -1", 2**64: f"got {2**64}"}.get(value, "got an integer of 16610 bits")  # not 5000 digits
    assert message.endswith(shown), message
    assert db.run_tool("SELECT id FROM people", tool_limits(**{name: 2})).columns == ["id"]  # in range: taken


@pytest.mark.parametrize("value", [-1, 0, 18, 2**70])
@pytest.mark.parametrize("method", ["digest", "grade"])
def test_float_digits_out_of_range(db_file, method, value):
    db = Database(db_file)
    args = ("SELECT id FROM people",) if method == "digest" else ("SELECT id FROM people", "SELECT id FROM people")
    # A digest's and a grade's digits are their GradeSpec's, checked when it is built.
    message = refused(lambda: GradeSpec(float_digits=value), "float_digits",
                      f"from 1 to {t2sql._grader.MAX_FLOAT_DIGITS}, or None (exact)")
    assert message.endswith(f"got {value}")
    assert getattr(db, method)(*args, GradeSpec(float_digits=None)) is not None


@pytest.mark.parametrize("value", [-1, 0, float("nan"), float("inf"), 10**400],
                         ids=["-1", "0", "nan", "inf", "10**400"])
def test_timeouts_are_positive_seconds(db_file, value):
    db = Database(db_file)
    gold = db.digest("SELECT id FROM people")
    calls = [lambda: tool_limits(timeout_s=value), lambda: GradeSpec(timeout_s=value),
             lambda: db.grade_against("SELECT 1", gold, value), lambda: db.count_rows("SELECT 1", value)]
    for call in calls:
        refused(call, "timeout_s", "positive")


def test_a_tally_counts_one_column_under_the_guard_and_its_bound():
    """Database.tally: one checked statement of one column, its parameters bound, NULLs skipped, the
    groups in the order met; None past max_bytes; a second column, a write, a negative bound refused."""
    rows = [(i, ("a", "b", None)[i % 3], float(i % 2)) for i in range(30)]
    db = Database.from_rows("w", ["CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, x)"],
                            [("t", ["id", "name", "x"], rows)])
    assert db.tally("SELECT name FROM t") == [("a", 10, ("text",)), ("b", 10, ("text",))]
    assert db.tally("SELECT x FROM t WHERE id < ?", [4]) == [(0, 2, ("real",)), (1, 2, ("real",))]
    assert db.tally("SELECT id FROM t", max_bytes=500) is None
    with pytest.raises(InvalidArgument, match="one column"):
        db.tally("SELECT id, name FROM t")
    with pytest.raises(UnsafeQuery):
        db.tally("DELETE FROM t")
    refused(lambda: db.tally("SELECT id FROM t", max_bytes=-1), "max_bytes", U64)


def test_from_rows_takes_schema_statements_and_plain_cells_only():
    schema = ["CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, x REAL, b BLOB)"]
    rows = [(1, "a", 1.5, b"\x00"), (2, None, 2.0, None)]
    db = Database.from_rows("w", schema, [("t", ["id", "name", "x", "b"], rows)])
    assert db.count_rows("SELECT * FROM t WHERE typeof(x) = 'real' AND typeof(b) IN ('blob', 'null')") == 2
    with pytest.raises(InvalidArgument, match="CREATE TABLE, INDEX or VIEW statements only"):
        Database.from_rows("w", ["DROP TABLE t"], [])
    with pytest.raises(InvalidArgument, match="64-bit int"):
        Database.from_rows("w", schema, [("t", ["id"], [(2**70,)])])
    with pytest.raises(InvalidArgument, match="a cell must be"):
        Database.from_rows("w", schema, [("t", ["id"], [(object(),)])])
    with pytest.raises(InvalidArgument, match="1 values for 2 columns"):
        Database.from_rows("w", schema, [("t", ["id", "name"], [(3,)])])
    with pytest.raises(DatabaseError, match="UNIQUE"):
        Database.from_rows("w", schema, [("t", ["id"], [(1,), (1,)])])
    with pytest.raises(UnsafeQuery):
        db.run_tool("DELETE FROM t", tool_limits())


def test_pool_and_process_settings(db_file):
    refused(lambda: SqlPool(-1), "size", U64)
    refused(lambda: SqlPool(1, nice=2**40), "nice", "from -2147483648 to 2147483647")
    refused(lambda: t2sql._grader.lower_thread_priority(2**40), "nice", "from -2147483648 to 2147483647")
    refused(lambda: t2sql.set_heap_limit(2**70), "bytes", "from -9223372036854775808 to 9223372036854775807")
    with pytest.raises(InvalidArgument, match="at least one worker"):
        SqlPool(0)
    pool = SqlPool(1)
    try:
        refused(lambda: pool.cancel(-1), "job_id", U64)
        refused(lambda: pool.submit_call(-1, lambda cancel: None), "job_id", U64)
        st = os.stat(db_file)
        # A ToolJob's limits were checked when its ToolLimits was built (test_tool_limits_out_of_range).
        tool = ToolJob(str(db_file), (st.st_size, st.st_mtime_ns), "SELECT 1", tool_limits(count_cap=100), job_id=1)
        refused(lambda: pool.submit_tool(tool._replace(job_id=-1)), "job_id", U64)
        # A DigestJob's spec is one GradeSpec, read whole (its digits were checked when it was built).
        digest = DigestJob(str(db_file), (st.st_size, st.st_mtime_ns), "SELECT 1", GradeSpec(), job_id=2)
        refused(lambda: pool.submit_digest(digest._replace(job_id=-1)), "job_id", U64)
        with pytest.raises(TypeError):
            pool.submit_digest(digest._replace(spec="multiset"))
    finally:
        pool.close()


class _BytesPath:
    def __init__(self, path: bytes):
        self.path = path

    def __fspath__(self) -> bytes:
        return self.path


def test_paths_may_be_str_bytes_or_path_like(db_file):
    for given in (str(db_file), os.fsencode(db_file), db_file, _BytesPath(os.fsencode(db_file))):
        db = Database(given)
        assert db.path == str(db_file) and db.run_tool("SELECT count(*) FROM people", tool_limits()).rows == [(5,)]
    with pytest.raises(DatabaseError, match="not found"):
        Database(os.fsencode(db_file) + b".missing")
    with pytest.raises(InvalidArgument, match="not valid UTF-8"):
        Database(b"/tmp/\xff.sqlite")
    with pytest.raises(TypeError, match="str, bytes or os.PathLike"):
        Database(3)


def test_close_is_idempotent_and_every_later_call_says_the_database_is_closed(db_file):
    db = Database(db_file)
    gold = db.digest("SELECT id FROM people")
    assert not db.closed
    db.close()
    db.close()
    assert db.closed and "closed" in repr(db)
    calls = [lambda: db.run_tool("SELECT 1", tool_limits()), lambda: db.digest("SELECT 1"),
             lambda: db.grade("SELECT 1", "SELECT 1"),
             lambda: db.grade_against("SELECT id FROM people", gold), lambda: db.count_rows("SELECT 1"),
             lambda: db.schema()]
    for call in calls:
        with pytest.raises(DatabaseClosed, match=r"is closed; open a new Database"):
            call()
    assert Database(db_file).count_rows("SELECT * FROM people") == 5  # the file itself is fine


def test_with_block_closes_the_database_even_when_the_block_raises(db_file):
    with Database(db_file) as db:
        assert isinstance(db, Database) and db.count_rows("SELECT * FROM people") == 5
    assert db.closed
    with pytest.raises(KeyError):  # the block's exception goes on; the database is closed
        with Database(db_file) as other:
            raise KeyError("x")
    assert other.closed
    with pytest.raises(DatabaseClosed):
        other.schema()


def test_close_from_another_thread_waits_for_the_running_query(db_file):
    db = Database(db_file)
    results: list[object] = []
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) SELECT count(*) FROM c"
    def query() -> None:
        try:
            results.append(db.run_tool(slow, tool_limits(timeout_s=60)).rows)
        except DatabaseClosed as e:
            results.append(e)

    worker = threading.Thread(target=query)
    worker.start()
    db.close()
    worker.join(120)
    # Either the query ran first and finished, or close() came first and it was refused: never a crash.
    assert db.closed and len(results) == 1
    assert results[0] == [(3000000,)] or isinstance(results[0], DatabaseClosed), results
    with pytest.raises(DatabaseClosed):
        db.run_tool("SELECT 1", tool_limits())
