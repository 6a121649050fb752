"""The attack suite: every way a model could try to escape the read-only SELECT sandbox.

Each attack must give its typed outcome, leave the database file's bytes unchanged, create no
file, keep the process alive and end within its timeout plus a small margin.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import t2sql
from conftest import tool_limits
from t2sql import Cancel, Database, GradeSpec, QueryCancelled, QueryTimeout, SqlError, UnsafeQuery

TIMEOUT_S = 1.0
MARGIN_S = 1.0

# (name, sql, exception run_tool must raise, or None when it must run)
ATTACKS: list[tuple[str, str, type | None]] = [
    ("insert", "INSERT INTO people VALUES (99, 'x', 1.5)", UnsafeQuery),
    ("update", "UPDATE people SET name = 'x'", UnsafeQuery),
    ("delete", "DELETE FROM people", UnsafeQuery),
    ("replace", "REPLACE INTO people VALUES (1, 'x', 1.0)", UnsafeQuery),
    ("cte_then_delete", "WITH x AS (SELECT 1) DELETE FROM people", UnsafeQuery),
    ("create_table", "CREATE TABLE evil(x)", UnsafeQuery),
    ("create_temp_table", "CREATE TEMP TABLE evil(x)", UnsafeQuery),
    ("create_temp_view", "CREATE TEMP VIEW evil AS SELECT 1", UnsafeQuery),
    ("create_index", "CREATE INDEX evil ON people(name)", UnsafeQuery),
    ("create_trigger", "CREATE TEMP TRIGGER evil AFTER INSERT ON people BEGIN SELECT 1; END", UnsafeQuery),
    ("drop_table", "DROP TABLE people", UnsafeQuery),
    ("alter_table", "ALTER TABLE people RENAME TO gone", UnsafeQuery),
    ("attach", "ATTACH DATABASE '{tmp}/attached.db' AS evil", UnsafeQuery),
    ("detach", "DETACH DATABASE main", UnsafeQuery),
    ("vacuum", "VACUUM", UnsafeQuery),
    ("vacuum_into", "VACUUM INTO '{tmp}/copy.db'", UnsafeQuery),
    ("pragma_query_only", "PRAGMA query_only = 0", UnsafeQuery),
    ("pragma_writable_schema", "PRAGMA writable_schema = 1", UnsafeQuery),
    ("pragma_read", "PRAGMA table_info(people)", UnsafeQuery),
    ("pragma_function", "SELECT * FROM pragma_table_info('people')", UnsafeQuery),
    ("pragma_function_list", "SELECT name FROM pragma_function_list", UnsafeQuery),
    ("pragma_in_subquery", "SELECT (SELECT count(*) FROM pragma_database_list) AS n", UnsafeQuery),
    ("load_extension", "SELECT load_extension('{tmp}/evil.so')", UnsafeQuery),
    ("fts3_tokenizer", "SELECT fts3_tokenizer('simple')", UnsafeQuery),
    ("begin", "BEGIN", UnsafeQuery),
    ("begin_immediate", "BEGIN IMMEDIATE", UnsafeQuery),
    ("commit", "COMMIT", UnsafeQuery),
    ("savepoint", "SAVEPOINT s1", UnsafeQuery),
    ("release", "RELEASE s1", UnsafeQuery),
    ("analyze", "ANALYZE", UnsafeQuery),
    ("reindex", "REINDEX", UnsafeQuery),
    ("explain_drop", "EXPLAIN DROP TABLE people", UnsafeQuery),
    ("two_statements", "SELECT 1; DROP TABLE people", UnsafeQuery),
    ("typo_then_drop", "SELEC 1; DROP TABLE people", UnsafeQuery),
    ("drop_missing_table", "DROP TABLE no_such_table", UnsafeQuery),
    ("delete_missing_table", "WITH x AS (SELECT 1) DELETE FROM no_such_table", UnsafeQuery),
    ("pragma_unknown", "PRAGMA no_such_pragma", UnsafeQuery),
    ("statement_after_comment", "SELECT 1 /* c */ ; -- x\n DELETE FROM people", UnsafeQuery),
    # What SQLite cannot parse, or what is not one query though it writes nothing: the query's error.
    ("syntax_error", "SELEC 1", SqlError),
    ("typo_inside_with", "WITH x AS (SELEC 1) SELECT * FROM x", SqlError),
    ("select_then_typo", "SELECT 1; SELEC 2", SqlError),
    ("incomplete", "SELECT (1", SqlError),
    ("explain", "EXPLAIN SELECT 1", SqlError),
    ("explain_query_plan", "EXPLAIN QUERY PLAN SELECT * FROM people", SqlError),
    ("two_selects", "SELECT 1; SELECT 2", SqlError),
    ("nul_then_statement", "SELECT 1\x00; DROP TABLE people", SqlError),
    ("empty", "", SqlError),
    ("whitespace", "   \n\t ", SqlError),
    ("comment_only", "-- nothing here", SqlError),
    ("semicolons_only", ";;", SqlError),
    ("endless_recursive_cte", "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
     QueryTimeout),
    ("billions_cross_join",
     "SELECT count(*) FROM people a, people b, people c, people d, people e, people f, people g, people h",
     QueryTimeout),
    ("sort_of_billions",
     "SELECT a.name FROM people a, people b, people c, people d, people e, people f ORDER BY random() LIMIT 1",
     QueryTimeout),
    ("huge_randomblob", "SELECT randomblob(2000000000)", SqlError),
    ("huge_zeroblob", "SELECT length(zeroblob(1000000000))", SqlError),
    ("huge_string", "SELECT length(replace(hex(zeroblob(10000000)), '0', '0000'))", SqlError),
    ("huge_group_concat", "SELECT length(group_concat(hex(randomblob(1000)))) FROM people a, people b", SqlError),
    ("huge_printf", "SELECT length(printf('%.*c', 2000000000, 'x'))", SqlError),
    ("deep_nesting", "SELECT " + "(" * 5000 + "1" + ")" * 5000, SqlError),
    ("deep_expression", "SELECT " + " + ".join(["1"] * 5000), SqlError),
    ("oversized_sql", "SELECT 1" + " " * 200_000, SqlError),
    ("many_unions", " UNION ALL ".join(["SELECT 1"] * 1000), SqlError),
    ("missing_table", "SELECT * FROM no_such_table", SqlError),
    ("json_each_is_fine", "SELECT value FROM json_each('[1,2,3]')", None),
    ("schema_read_is_fine", "SELECT name FROM sqlite_master WHERE type = 'table'", None),
    ("plain_select", "SELECT name FROM people ORDER BY id", None),
]


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A fresh database in its own folder; the cwd moves there too, so any file an attack
    manages to create lands where the test looks."""
    db_path = tmp_path / "victim.sqlite"
    con = sqlite3.connect(db_path)
    con.executescript(
        "CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT, score REAL);"
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 200) "
        "INSERT INTO people SELECT x, 'p' || x, x / 7.0 FROM n;"
    )
    con.close()
    monkeypatch.chdir(tmp_path)
    return tmp_path, db_path


def _snapshot(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name,sql,expected", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_contained(sandbox, name, sql, expected):
    tmp, db_path = sandbox
    sql = sql.replace("{tmp}", str(tmp))
    before_files, before_bytes = _snapshot(tmp), _digest(db_path)
    db = Database(str(db_path))

    start = time.monotonic()
    if expected is None:
        result = db.run_tool(sql, tool_limits(timeout_s=TIMEOUT_S))
        assert result.row_count >= 1
    else:
        with pytest.raises(expected) as err:
            db.run_tool(sql, tool_limits(timeout_s=TIMEOUT_S))
        assert str(err.value), "every error carries a message"
    assert time.monotonic() - start < TIMEOUT_S + MARGIN_S

    # The grading path applies the same policy and maps it to an outcome.
    start = time.monotonic()
    verdict = db.grade(sql, "SELECT name FROM people ORDER BY id", GradeSpec(timeout_s=TIMEOUT_S))
    assert time.monotonic() - start < 2 * TIMEOUT_S + MARGIN_S
    outcome_for = {UnsafeQuery: {"unsafe"}, SqlError: {"pred_error"}, QueryTimeout: {"pred_timeout", "mismatch"}}
    if expected is None:
        assert verdict.outcome in {"match", "mismatch"}
    else:
        assert verdict.outcome in outcome_for[expected], verdict

    assert _digest(db_path) == before_bytes, "the database file changed"
    assert _snapshot(tmp) == before_files, "a file was created"
    # The connection keeps serving after the attack.
    assert db.run_tool("SELECT count(*) FROM people", tool_limits()).rows == [(200,)]


def test_unsafe_message_names_what_was_refused(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    with pytest.raises(UnsafeQuery, match="PRAGMA|pragma_table_info"):
        db.run_tool("SELECT * FROM pragma_table_info('people')", tool_limits())
    with pytest.raises(UnsafeQuery, match="DROP"):
        db.run_tool("DROP TABLE people", tool_limits())
    with pytest.raises(UnsafeQuery, match="DROP"):
        db.run_tool("SELECT 1; DROP TABLE people", tool_limits())
    # Not one query, but nothing that writes: SQLite's message, or the policy's, as an SQL error.
    with pytest.raises(SqlError, match="more than one statement"):
        db.run_tool("SELECT 1; SELECT 2", tool_limits())
    with pytest.raises(SqlError, match='near "SELEC": syntax error'):
        db.run_tool("SELEC count(*) FROM people", tool_limits())
    assert db.grade("SELEC count(*) FROM people", "SELECT count(*) FROM people").outcome == "pred_error"
    assert db.grade("DROP TABLE no_such_table", "SELECT count(*) FROM people").outcome == "unsafe"


def test_invalid_utf8_is_a_typed_error(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    with pytest.raises(SqlError, match="UTF-8"):
        db.run_tool("SELECT '\udcff'", tool_limits())
    with pytest.raises(SqlError, match="UTF-8"):
        db.run_tool(b"SELECT '\xff'", tool_limits())
    assert db.grade("SELECT '\udcff'", "SELECT 1").outcome == "pred_error"


def test_cross_join_of_billions_exits_early_when_graded(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    start = time.monotonic()
    v = db.grade("SELECT a.id FROM people a, people b, people c, people d, people e", "SELECT id FROM people",
                 GradeSpec(timeout_s=30))
    assert v.outcome == "mismatch" and "stopped early" in v.detail
    assert time.monotonic() - start < 2.0, "the early exit costs gold-count rows, not billions"


def test_cancel_interrupts_a_running_query_from_another_thread(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    token = Cancel()
    errors: list[BaseException] = []

    def run():
        try:
            db.run_tool("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                        tool_limits(timeout_s=60), cancel=token)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.2)
    cancelled_at = time.monotonic()
    token.cancel()
    t.join(5)
    assert not t.is_alive()
    assert time.monotonic() - cancelled_at < 1.5  # far below the 60 s limit; loose for a loaded CI machine
    assert len(errors) == 1 and isinstance(errors[0], QueryCancelled)
    assert token.cancelled
    # A token that already fired stops the next query before it starts.
    with pytest.raises(QueryCancelled):
        db.run_tool("SELECT 1", tool_limits(), cancel=token)


def test_the_gil_is_released_while_sqlite_works(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    ticks = 0
    done = threading.Event()

    def slow():
        with pytest.raises(QueryTimeout):
            db.run_tool("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                        tool_limits(timeout_s=1.0))
        done.set()

    t = threading.Thread(target=slow)
    t.start()
    while not done.is_set():
        ticks += 1
        time.sleep(0.001)
    t.join()
    assert ticks > 100, f"the main thread ran only {ticks} times during a 1 s query"


def test_many_threads_grade_one_file_at_once(sandbox):
    _, db_path = sandbox
    results: list[str] = []
    lock = threading.Lock()

    def work(i: int):
        db = Database(str(db_path))
        for _ in range(20):
            v = db.grade(f"SELECT id, name FROM people WHERE id > {i}",
                         f"SELECT id, name FROM people WHERE id >= {i + 1}")
            with lock:
                results.append(v.outcome)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["match"] * 160


def test_one_database_shared_by_threads_serializes_safely(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    out: list[int] = []

    def work():
        for _ in range(50):
            out.append(db.run_tool("SELECT count(*) FROM people", tool_limits()).rows[0][0])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == [200] * 200


@pytest.mark.parametrize("content,match", [
    (None, "not found"),
    (b"this is not a database, just text" * 100, "not a readable SQLite database"),
    (b"SQLite format 3\x00" + b"\xff" * 4000, "not a readable SQLite database|malformed|corrupt"),
])
def test_bad_database_files_are_database_errors(tmp_path, content, match):
    path = tmp_path / "bad.sqlite"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(t2sql.DatabaseError, match=match):
        Database(str(path))


def test_a_directory_is_not_a_database(tmp_path):
    with pytest.raises(t2sql.DatabaseError, match="directory"):
        Database(str(tmp_path))


# Opens a path as a Database in a fresh process: the core that opened a FIFO waited there for a writer
# forever, so this runs under a timeout that fails the test instead of hanging it.
_OPEN_CHILD = """
import sys, t2sql
try:
    t2sql.Database(sys.argv[1])
    print("opened")
except t2sql.DatabaseError as e:
    print(e)
"""


@pytest.mark.parametrize("kind", ["fifo", "character device"])
def test_a_path_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path, kind):
    import subprocess
    import sys

    if kind == "fifo":
        path = str(tmp_path / "pipe.sqlite")
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    try:
        opened = subprocess.run([sys.executable, "-c", _OPEN_CHILD, path], capture_output=True, text=True, timeout=20)
        graded = subprocess.run([sys.executable, "-m", "t2sql.cli", "grade", "--db", path, "--pred", "SELECT 1",
                                 "--gold", "SELECT 1"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"opening {path} hung: {e}")
    refusal = f"{path} is a {'FIFO (named pipe)' if kind == 'fifo' else kind}, not a regular file"
    assert opened.returncode == 0 and opened.stdout.strip().startswith(refusal), opened
    assert graded.returncode == 2 and refusal in graded.stderr and "Traceback" not in graded.stderr, graded


def test_paths_with_uri_characters_open(tmp_path, sandbox):
    _, db_path = sandbox
    odd = tmp_path / "we?ird#name%20.sqlite"
    shutil.copy(db_path, odd)
    assert Database(str(odd)).run_tool("SELECT count(*) FROM people", tool_limits()).rows == [(200,)]
    assert Database(odd).path == str(odd)


def test_bad_arguments_are_value_errors(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    with pytest.raises(ValueError, match="timeout_s"):
        db.run_tool("SELECT 1", tool_limits(timeout_s=0))
    with pytest.raises(ValueError, match="float_digits"):
        db.grade("SELECT 1", "SELECT 1", GradeSpec(float_digits=0))
    with pytest.raises(ValueError, match="grading method"):
        db.grade("SELECT 1", "SELECT 1", GradeSpec("bag", gold_sql="SELECT 1"))
    with pytest.raises(ValueError, match="the count must be a whole number of rows, at least 1"):
        db.grade("SELECT 1", "SELECT 1", GradeSpec("subset,=,0", gold_sql="SELECT 1"))
    with pytest.raises(ValueError, match="column_order"):
        db.grade("SELECT 1", "SELECT 1", GradeSpec(column_order="sideways"))


def test_heap_limit_turns_a_memory_bomb_into_an_error(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    previous = t2sql.set_heap_limit(64 * 1024 * 1024)
    try:
        # Each value is under the LENGTH limit; ten of them in one row are not under the heap limit.
        with pytest.raises(SqlError, match="memory"):
            db.run_tool("SELECT " + ", ".join(["randomblob(10000000)"] * 10), tool_limits(timeout_s=60))
    finally:
        t2sql.set_heap_limit(previous)
    assert db.run_tool("SELECT count(*) FROM people", tool_limits()).rows == [(200,)]


def test_a_sort_that_spills_leaves_no_file(sandbox, tmp_path):
    # A large sort spills runs to SQLite's temporary files, which are unlinked when opened: nothing
    # appears beside the database or in the working directory.
    _, db_path = sandbox
    db = Database(str(db_path))
    before = set(os.listdir(tmp_path))
    db.run_tool("SELECT a.name, b.name FROM people a, people b, people c ORDER BY random()", tool_limits(timeout_s=30))
    assert set(os.listdir(tmp_path)) == before


# ---- deadlines inside SQLite's sorter: sorts, GROUP BY, window functions, DISTINCT

SAMPLE_DB = Path(t2sql.__file__).parent / "sample" / "superhero" / "superhero.sqlite"
SORT_DEADLINE_S = 1.5
# 16M rows. With 4M (SQLite produced them in about 1 s here; sorting them in one in-memory list took
# 7 s more, outside every check, at about 200 MB) a faster CI machine finished some of these sorts
# inside the deadline and the test proved nothing about it; 16M is about 4x past it there.
BIG = "hero_power a, (SELECT hero_id FROM hero_power LIMIT 2800) b"
SORTS = {
    "order_by": f"SELECT a.hero_id FROM {BIG} ORDER BY random()",
    "group_by": f"SELECT a.hero_id, a.power_id, b.hero_id, count(*) FROM {BIG} GROUP BY 1, 2, 3",
    "window": f"SELECT row_number() OVER (ORDER BY random()) FROM {BIG}",
    "distinct": f"SELECT DISTINCT a.hero_id, random() FROM {BIG}",
    "count_distinct": f"SELECT count(DISTINCT a.hero_id || '-' || random()) FROM {BIG}",
    "order_by_text": f"SELECT printf('%0200d', a.hero_id) || random() AS k FROM {BIG} ORDER BY k",
}
# Runs in a fresh process, so its peak resident memory is the query's own.
_SORT_CHILD = """
import json, sys, time
import t2sql
db = t2sql.Database(sys.argv[1])
start = time.monotonic()
try:
    if sys.argv[2] == "tool":
        p = t2sql.get_preset().tool_limits
        db.run_tool(sys.argv[3], t2sql.ToolLimits(timeout_s=float(sys.argv[4]), max_rows=20,
                                                  max_cell_chars=p.max_cell_chars, max_chars=p.max_chars,
                                                  count_cap=p.count_cap))
        outcome = "ran"
    else:
        outcome = db.grade(sys.argv[3], sys.argv[3], t2sql.GradeSpec(timeout_s=float(sys.argv[4]))).outcome
except t2sql.QueryTimeout:
    outcome = "timeout"
elapsed = time.monotonic() - start
# VmHWM: this process's own peak (ru_maxrss would carry the forking parent's over exec).
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"outcome": outcome, "elapsed": elapsed, "peak_mib": int(hwm.split()[1]) / 1024}))
"""


@pytest.mark.parametrize("path", ["tool", "grade"])
@pytest.mark.parametrize("name", list(SORTS))
def test_deadline_holds_inside_sorts_and_memory_stays_bounded(name, path):
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _SORT_CHILD, str(SAMPLE_DB), path, SORTS[name],
                           str(SORT_DEADLINE_S)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["outcome"] in ({"ran", "timeout"} if path == "tool" else {"match", "gold_timeout"}), result
    # docs/grader.md: a deadline holds within MARGIN_S whatever the query does. The deadline is each
    # query's: a grade whose gold finished runs the prediction under a deadline of its own (CI once saw
    # a gold and a prediction each finish in 1.4 s, a match in 2.9 s).
    queries = 2 if result["outcome"] == "match" else 1
    assert result["elapsed"] <= queries * SORT_DEADLINE_S + MARGIN_S, result
    assert result["peak_mib"] < 100, result


# About 4x the cancel point on this machine (5.8 s alone): a sort of 4M rows took 1.4 s, so on a
# quiet machine it could end before a cancel at 1.3 s and the test proved nothing (CI saw this).
LONG_SORT = "SELECT a.hero_id FROM hero_power a, (SELECT hero_id FROM hero_power LIMIT 2800) b ORDER BY random()"


def test_cancel_reaches_a_grader_task_inside_a_sort():
    import asyncio

    from t2sql.serving.grader import Grader

    async def scenario() -> tuple[float, float]:
        grader = Grader(concurrency=1)
        try:
            sort = asyncio.ensure_future(grader.run_tool(str(SAMPLE_DB), LONG_SORT, tool_limits(timeout_s=60)))
            await asyncio.sleep(1.3)  # SQLite is filling (and flushing) its sorter
            assert not sort.done(), "the sort finished before the cancel: make LONG_SORT bigger"
            cancelled = time.monotonic()
            sort.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sort
            # The one worker is free again: a small query runs at once.
            await grader.run_tool(str(SAMPLE_DB), "SELECT count(*) FROM superhero", tool_limits(timeout_s=10))
            return cancelled, time.monotonic()
        finally:
            grader.close()

    cancelled, next_done = asyncio.run(scenario())
    assert next_done - cancelled <= MARGIN_S


def test_a_heap_limit_chosen_before_the_first_open_is_kept():
    # In a fresh process: the core's default must not overwrite the caller's choice.
    import subprocess
    import sys

    code = (
        "import t2sql\n"
        "t2sql.set_heap_limit(123456789)\n"
        "t2sql.Database(t2sql.__file__.replace('__init__.py', 'sample/superhero/superhero.sqlite'))\n"
        "print(t2sql.set_heap_limit(0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "123456789"


# ---- the deadline inside one built-in call: the replacements of grader_rs/src/guard/functions/

LIMIT = 16 * 1024 * 1024 - 1  # the longest value a query may make (SQLite's LENGTH limit, 16 MiB)
FUNCTION_DEADLINE_S = 1.0
HALF = LIMIT // 2


def _rep(n: int, ch: str) -> str:
    return f"printf('%.*c', {n}, '{ch}')"


A, B = _rep(LIMIT, "a"), _rep(HALF, "b")
# name -> (a query whose one call SQLite's built-in runs for minutes to days at the value limit,
#          its answer when the replacement finishes it, or None when it must stop at the deadline)
LONG_CALLS: dict[str, tuple[str, object]] = {
    # linear now: they finish
    "instr": (f"SELECT instr({A}, {_rep(HALF, 'a')} || 'b')", 0),
    "instr_counts_characters": (  # N/4 two-byte characters, then a run of 'a' that ends in the needle
        f"SELECT instr(replace({_rep(LIMIT // 4, 'x')}, 'x', 'é') || {_rep(HALF - 1, 'a')} || 'b', "
        f"{_rep(LIMIT // 4, 'a')} || 'b')", LIMIT // 4 + (HALF - 1 - LIMIT // 4) + 1),
    "instr_blobs": (f"SELECT instr(CAST({A} AS BLOB), CAST({_rep(HALF, 'a')} || 'b' AS BLOB))", 0),
    "replace": (f"SELECT length(replace({A}, {_rep(HALF, 'a')} || 'b', 'x'))", LIMIT),
    "trim_ascii_set": (f"SELECT length(trim({A}, {_rep(LIMIT - 1, 'b')} || 'a'))", 0),
    "unhex_ascii_set": (f"SELECT length(unhex({_rep(LIMIT, 'g')}, {_rep(LIMIT - 1, 'h')} || 'g'))", 0),
    # the string's length times the pattern's (the pattern limit is 10,000 bytes): they stop
    "like": (f"SELECT {A} LIKE '%' || {_rep(9990, 'a')} || 'b'", None),
    "like_escape": (f"SELECT {A} LIKE '%' || {_rep(9990, 'a')} || '!%' ESCAPE '!'", None),
    "not_like": (f"SELECT {A} NOT LIKE '%' || {_rep(9990, 'a')} || 'b'", None),
    "glob": (f"SELECT {A} GLOB '*' || {_rep(9990, 'a')} || 'b'", None),
    "glob_class": (f"SELECT {A} GLOB '*[' || {_rep(9990, 'b')} || ']x'", None),
    # a set with characters of more than one byte is looked through in SQLite's order: they stop
    "trim_wide_set": (f"SELECT length(trim({A}, replace({B}, 'b', 'é') || 'a'))", None),
    "ltrim_wide_set": (f"SELECT length(ltrim({A}, replace({B}, 'b', 'é') || 'a'))", None),
    "rtrim_wide_set": (f"SELECT length(rtrim({A}, replace({B}, 'b', 'é') || 'a'))", None),
    "unhex_wide_set": (f"SELECT length(unhex(replace({_rep(HALF, 'x')}, 'x', 'é'), replace({B}, 'b', 'ü') || 'é'))",
                       None),
}


def _within(seconds: float, call):
    """call() in a thread, waited for `seconds`: a call that outruns its deadline fails the test at
    once instead of holding it for the minutes SQLite's own built-in would take."""
    done: list = []

    def run():
        try:
            done.append(("ok", call()))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            done.append(("error", e))

    thread = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still running {seconds:.1f}s after it started: the deadline did not hold")
    return done[0], time.monotonic() - start


@pytest.mark.parametrize("name", list(LONG_CALLS))
def test_a_long_built_in_call_ends_within_its_deadline_on_the_tool_path(sandbox, name):
    _, db_path = sandbox
    sql, answer = LONG_CALLS[name]
    db = Database(str(db_path))
    (how, got), elapsed = _within(FUNCTION_DEADLINE_S + 0.5, lambda: db.run_tool(
        sql, tool_limits(timeout_s=FUNCTION_DEADLINE_S)))
    if answer is None:
        assert how == "error" and isinstance(got, QueryTimeout), got
    else:
        assert how == "ok" and got.rows == [(answer,)], got
    assert elapsed < FUNCTION_DEADLINE_S + 0.5
    assert db.run_tool("SELECT count(*) FROM people", tool_limits()).rows == [(200,)]


@pytest.mark.parametrize("name", list(LONG_CALLS))
def test_a_long_built_in_call_ends_within_its_deadline_on_the_grade_path(sandbox, name):
    _, db_path = sandbox
    sql, answer = LONG_CALLS[name]
    db = Database(str(db_path))
    gold = f"SELECT {answer!r}" if answer is not None else "SELECT 1"
    (how, verdict), elapsed = _within(FUNCTION_DEADLINE_S + 0.5, lambda: db.grade(
        sql, gold, GradeSpec(timeout_s=FUNCTION_DEADLINE_S)))
    assert how == "ok", verdict
    assert verdict.outcome == ("pred_timeout" if answer is None else "match"), verdict
    assert elapsed < FUNCTION_DEADLINE_S + 0.5


def test_a_cancel_stops_a_long_built_in_call(sandbox):
    _, db_path = sandbox
    db = Database(str(db_path))
    token = Cancel()
    sql, _ = LONG_CALLS["like"]
    timer = threading.Timer(0.5, token.cancel)
    timer.start()
    (how, got), elapsed = _within(1.5, lambda: db.run_tool(sql, tool_limits(timeout_s=60), cancel=token))
    timer.join()
    assert how == "error" and isinstance(got, QueryCancelled), got
    assert elapsed < 1.0


# ---- the deadline inside one JSON call: grader_rs/src/guard/functions/json.rs

def _array(n: int) -> str:
    """SQL for the text of a JSON array of n + 1 ones (2n + 3 bytes), built in linear time."""
    return f"('[' || replace({_rep(n, 'x')}, 'x', '1,') || '1]')"


def _object(n: int, entry: str) -> str:
    """SQL for a JSON object of n copies of `entry` (keys may repeat in SQLite's JSON) and a last key."""
    return f"('{{' || replace({_rep(n, 'x')}, 'x', '{entry},') || '\"last\":0}}')"


MiB = 1024 * 1024
Y_KEY, X_DELETE = '"y":0', '"x":null'
TWO_PASSES = "json_extract(d, '$[#-1]', '$[0]')"
PATHS = ", ".join(["'$[#-1]'"] * 999)
APPENDS = ", ".join(["'$[#]', 1"] * 499)
# name -> (a query whose one JSON call SQLite's built-in ran for seconds to minutes, or that built
#          past the value limit until the heap limit stopped it; what it ends with now: an SqlError
#          whose message holds the text given, or QueryTimeout)
JSON_CALLS: dict[str, tuple[str, object]] = {
    # 999 passes over 1 MiB: 2.6 s before (over 30 s at 15 MiB); past the bound on passes x bytes
    "json_extract_999_paths": (f"SELECT json_extract({_array(MiB // 2)}, {PATHS})", "more work than one call"),
    "jsonb_extract_999_paths": (f"SELECT jsonb_extract(jsonb({_array(MiB // 2)}), {PATHS})",
                                "more work than one call"),
    "json_remove_999_paths": (f"SELECT json_remove({_array(MiB // 2)}, {PATHS})", "more work than one call"),
    # 499 appends to 1 MiB: 1.3 s before (20 s at 15 MiB)
    "json_insert_499_edits": (f"SELECT length(json_insert({_array(MiB // 2)}, {APPENDS}))", "more work than one call"),
    "json_set_499_edits": (f"SELECT length(json_set({_array(MiB // 2)}, {APPENDS}))", "more work than one call"),
    # every key of a 240 KB patch compared with every key of a 240 KB target: seconds before
    "json_patch_quadratic": (f"SELECT length(json_patch({_object(40_000, Y_KEY)}, {_object(26_000, X_DELETE)}))",
                             "more work than one call"),
    # arguments past the value limit in all: SQLite built their whole text before checking it (999
    # copies of 1 MiB: 1 GB, 1.5-2.2 s; of 15 MiB: until the heap limit); refused before building.
    # (Evaluating 999 arguments of 1 MiB takes about 1 s by itself, whatever the function: max()
    # too. That is the general case of many large values in one step: docs/grader.md.)
    "json_array_999_values": (f"SELECT length(json_array({', '.join(['x'] * 999)})) "
                              f"FROM (SELECT {_rep(32 * 1024, 'a')} AS x)", "more than one call may build"),
    "json_object_499_values": (f"SELECT length(json_object({', '.join(['x, x'] * 499)})) "
                               f"FROM (SELECT {_rep(32 * 1024, 'a')} AS x)", "more than one call may build"),
    # every line of a 1 MiB array 998 levels deep indented 998 times: 2 s to the heap limit before
    "json_pretty_deep": (f"SELECT length(json_pretty({_rep(998, '[')} || {_array(MiB // 2)} || {_rep(998, ']')}))",
                         "too big"),
    "json_pretty_deep_wide_indent": (
        f"SELECT length(json_pretty({_rep(998, '[')} || '1' || {_rep(998, ']')}, {_rep(100_000, ' ')}))",
        "too big"),
    # 100 calls in one row, each within its bound (two passes over 15 MiB) but together 20 s:
    # each call asks the deadline first
    "json_calls_in_one_row": (f"SELECT max({', '.join([TWO_PASSES] * 100)}) FROM (SELECT {_array(15 * MiB // 2)} AS d)",
                              QueryTimeout),
}


@pytest.mark.parametrize("name", list(JSON_CALLS))
def test_a_long_json_call_ends_within_its_deadline_on_the_tool_path(sandbox, name):
    _, db_path = sandbox
    sql, ending = JSON_CALLS[name]
    db = Database(str(db_path))
    (how, got), elapsed = _within(FUNCTION_DEADLINE_S + 0.5, lambda: db.run_tool(
        sql, tool_limits(timeout_s=FUNCTION_DEADLINE_S)))
    assert how == "error", got
    if isinstance(ending, str):
        assert type(got) is SqlError and ending in str(got), got
    else:
        assert isinstance(got, ending), got
    assert elapsed < FUNCTION_DEADLINE_S + 0.5
    assert db.run_tool("SELECT json_extract('[1,[2]]', '$[1][0]', '$[0]')", tool_limits()).rows == [("[2,1]",)]


@pytest.mark.parametrize("name", list(JSON_CALLS))
def test_a_long_json_call_ends_within_its_deadline_on_the_grade_path(sandbox, name):
    _, db_path = sandbox
    sql, ending = JSON_CALLS[name]
    db = Database(str(db_path))
    (how, verdict), elapsed = _within(FUNCTION_DEADLINE_S + 0.5, lambda: db.grade(
        sql, "SELECT 1", GradeSpec(timeout_s=FUNCTION_DEADLINE_S)))
    assert how == "ok", verdict
    assert verdict.outcome == ("pred_error" if isinstance(ending, str) else "pred_timeout"), verdict
    assert elapsed < FUNCTION_DEADLINE_S + 0.5
