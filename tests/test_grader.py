"""The Grader (thread backend): tool calls, grades, the gold cache, retries, cancellation,
the manifest, and bad input — on real BIRD databases, checked against Python's sqlite3."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import shutil
import sqlite3
import threading
import time

import pytest

import t2sql
import t2sql.serving.gold_cache as gold_cache_module
from conftest import bird_root, tool_limits
from t2sql import GradeSpec, ToolLimits
from t2sql.episode.rollout import open_grader
from t2sql.serving.grader import Grader
from t2sql.serving.manifest import DatabaseChanged, Manifest
from t2sql.serving.results import GradeResult
from t2sql.serving.settings import GraderSettings

DATA_ROOT = bird_root()
SUPERHERO = str(DATA_ROOT / "superhero" / "superhero.sqlite")

COUNT_HEROES = "SELECT COUNT(*) FROM superhero"
# Runs until interrupted: only a deadline or a cancel stops it.
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"


def sqlite_rows(path: str, sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture
def grader():
    g = Grader(concurrency=2)
    yield g
    g.close()


def test_tool_call_shows_what_sqlite_returns(grader):
    sql = "SELECT superhero_name, height_cm FROM superhero ORDER BY id LIMIT 7"
    result = grader.run_tool_sync(SUPERHERO, sql, tool_limits(max_rows=5))
    expected = sqlite_rows(SUPERHERO, sql)
    assert result.columns == ["superhero_name", "height_cm"]
    assert [tuple(r) for r in result.rows] == expected[:5]
    assert result.row_count == 7 and result.truncated
    assert expected[0][0] in result.text


def test_tool_errors_are_typed(grader):
    with pytest.raises(t2sql.SqlError, match="no such table"):
        grader.run_tool_sync(SUPERHERO, "SELECT * FROM no_such_table", tool_limits())
    with pytest.raises(t2sql.UnsafeQuery):
        grader.run_tool_sync(SUPERHERO, "DELETE FROM superhero", tool_limits())
    with pytest.raises(t2sql.QueryTimeout):
        grader.run_tool_sync(SUPERHERO, ENDLESS, tool_limits(timeout_s=0.2))
    # ...and the grader keeps serving.
    assert grader.run_tool_sync(SUPERHERO, COUNT_HEROES, tool_limits()).rows == sqlite_rows(SUPERHERO, COUNT_HEROES)


def test_a_tool_call_runs_under_the_limits_it_is_given():
    # The Grader has no tool timeout or preview of its own: each call names its limits (an episode, its preset's).
    assert "tool_timeout_s" not in {f.name for f in dataclasses.fields(GraderSettings)}
    with Grader(concurrency=1) as g:
        with pytest.raises(TypeError):
            g.run_tool_sync(SUPERHERO, COUNT_HEROES)  # type: ignore[call-arg]
        with pytest.raises(t2sql.QueryTimeout, match="after 0.3s"):
            g.run_tool_sync(SUPERHERO, ENDLESS, tool_limits(timeout_s=0.3))
        wide = "SELECT id FROM superhero ORDER BY id"
        assert len(g.run_tool_sync(SUPERHERO, wide, tool_limits(max_rows=7)).rows) == 7


def test_a_grader_runs_under_one_settings_value(tmp_path):
    # Everything a Grader is opened with is one frozen value; keywords are its fields, changed from the defaults
    # or from a given value. An episode's Grader takes its preset's grading timeout and temporary-disk cap.
    base = GraderSettings(concurrency=2, grade_timeout_s=7.0)
    with Grader(base) as a, Grader(concurrency=2, grade_timeout_s=7.0) as b, Grader(base, concurrency=1) as c:
        assert a.settings == b.settings == base and a.concurrency == 2
        assert c.settings == dataclasses.replace(base, concurrency=1) and c.concurrency == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.concurrency = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        Grader(tool_timeout_s=1.0)  # not a setting: a tool call's limits are its own
    for bad in ({"backend": "nope"}, {"concurrency": 0}, {"grade_timeout_s": 0}):
        with pytest.raises(ValueError):
            GraderSettings(**bad)
    preset = t2sql.get_preset().replace(grading={"timeout_s": 12.0, "max_temp_mb": 64})
    with open_grader(preset, concurrency=1, cache_dir=tmp_path) as g:
        assert g.settings == GraderSettings(concurrency=1, cache_dir=tmp_path, grade_timeout_s=12.0, max_temp_mb=64)
        assert g.temp_disk_bound_mb == 64


def test_grade_outcomes(grader):
    (count,), = sqlite_rows(SUPERHERO, COUNT_HEROES)
    cases = {
        "match": COUNT_HEROES,
        "mismatch": f"SELECT {count + 1}",
        "pred_error": "SELECT * FROM no_such_table",
        "unsafe": "DROP TABLE superhero",
    }
    for expected, pred in cases.items():
        r = grader.grade_sync(SUPERHERO, pred, COUNT_HEROES)
        assert isinstance(r, GradeResult)
        assert r.outcome == expected, (pred, r)
        assert r.gold_rows == 1 and not r.retried
    bad_gold = grader.grade_sync(SUPERHERO, COUNT_HEROES, "SELECT * FROM no_such_table")
    assert bad_gold.outcome == "gold_error" and "no such table" in bad_gold.detail
    unsafe_gold = grader.grade_sync(SUPERHERO, COUNT_HEROES, "DELETE FROM superhero")
    assert unsafe_gold.outcome == "gold_error"


def test_gold_runs_once_for_many_concurrent_grades(grader):
    gold = "SELECT superhero_name FROM superhero WHERE height_cm > 180"
    n_rows = len(sqlite_rows(SUPERHERO, gold))

    async def main():
        return await asyncio.gather(*(grader.grade(SUPERHERO, gold, gold) for _ in range(64)))

    results = asyncio.run(main())
    assert all(r.outcome == "match" and r.gold_rows == n_rows for r in results)
    stats = grader.stats()
    assert stats["gold_computed"] == 1, stats
    assert grader.grade_sync(SUPERHERO, gold, gold).gold_cached


def test_cache_key_includes_method_and_float_digits(grader):
    gold = "SELECT gender_id FROM superhero"  # duplicates: multiset and set differ
    multiset = grader.gold_sync(SUPERHERO, gold, GradeSpec("multiset", gold_sql=gold))
    as_set = grader.gold_sync(SUPERHERO, gold, GradeSpec("set", gold_sql=gold))
    rows = sqlite_rows(SUPERHERO, gold)
    assert multiset.rows == len(rows)
    assert as_set.rows == len(set(rows))
    grader.gold_sync(SUPERHERO, gold, GradeSpec("multiset", gold_sql=gold, float_digits=None))
    assert grader.stats()["gold_computed"] == 3
    # A prediction with the same distinct rows matches only under the set method.
    pred = "SELECT DISTINCT gender_id FROM superhero"
    assert grader.grade_sync(SUPERHERO, pred, gold, GradeSpec("set", gold_sql=gold)).outcome == "match"
    assert grader.grade_sync(SUPERHERO, pred, gold, GradeSpec("multiset", gold_sql=gold)).outcome == "mismatch"


def test_failed_gold_is_not_cached(grader):
    for _ in range(2):
        r = grader.grade_sync(SUPERHERO, COUNT_HEROES, "SELECT nope FROM superhero")
        assert r.outcome == "gold_error"
    assert grader.stats()["gold_failures"] == 2


def test_prediction_timeout_is_retried_once(grader):
    started = time.perf_counter()
    r = grader.grade_sync(SUPERHERO, ENDLESS, COUNT_HEROES, GradeSpec(timeout_s=0.3))
    assert r.outcome == "pred_timeout" and r.retried
    assert time.perf_counter() - started >= 0.55  # two attempts of 0.3 s each
    assert grader.stats()["retries"] == 1
    ok = grader.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES)
    assert ok.outcome == "match" and not ok.retried


def test_gold_timeout_is_retried_and_not_cached(grader):
    r = grader.grade_sync(SUPERHERO, COUNT_HEROES, ENDLESS, GradeSpec(timeout_s=0.2))
    assert r.outcome == "gold_timeout" and r.retried
    stats = grader.stats()
    assert stats["gold_failures"] == 2 and stats["gold_computed"] == 0


def test_retry_false_keeps_the_first_attempt_as_t2sql_grade_does(grader):
    """`t2sql grade --pairs` grades through the Grader with retry=False: a timeout is one attempt."""
    started = time.perf_counter()
    r = asyncio.run(grader.grade(SUPERHERO, ENDLESS, COUNT_HEROES, GradeSpec(timeout_s=0.3), retry=False))
    assert r.outcome == "pred_timeout" and not r.retried
    assert time.perf_counter() - started < 0.55  # one attempt of 0.3 s, not two
    assert grader.stats()["retries"] == 0


@pytest.mark.parametrize("gold", ["SELECT nope FROM superhero", "DELETE FROM superhero", "", ENDLESS])
def test_a_failed_gold_reads_as_t2sql_grade_says_it(grader, gold):
    """One pair, two APIs, one record: the Grader's gold failures carry the core's outcome and detail."""
    spec = GradeSpec("multiset", gold_sql=gold, timeout_s=0.3)
    core = t2sql.Database(SUPERHERO).grade(COUNT_HEROES, gold, spec)
    r = asyncio.run(grader.grade(SUPERHERO, COUNT_HEROES, gold, spec, retry=False))
    assert (r.outcome, r.detail, r.method) == (core.outcome, core.detail, core.method)
    assert r.outcome in ("gold_error", "gold_timeout")


def test_cancelling_the_task_stops_sqlite_at_once():
    async def main(g):
        task = asyncio.create_task(g.run_tool(SUPERHERO, ENDLESS, tool_limits(timeout_s=60)))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # One worker only: this query runs only once the endless one has really stopped.
        started = time.perf_counter()
        result = await g.run_tool(SUPERHERO, COUNT_HEROES, tool_limits())
        return result, time.perf_counter() - started

    with Grader(concurrency=1) as g:
        result, waited = asyncio.run(main(g))
    assert result.rows == sqlite_rows(SUPERHERO, COUNT_HEROES)
    assert waited < 2.0


def test_event_loop_keeps_ticking_while_sql_runs(grader):
    async def main():
        lateness = []
        stop = asyncio.Event()

        async def ticker():
            while not stop.is_set():
                t = time.perf_counter()
                await asyncio.sleep(0.005)
                lateness.append(time.perf_counter() - t - 0.005)

        tick = asyncio.create_task(ticker())
        with pytest.raises(t2sql.QueryTimeout):
            await grader.run_tool(SUPERHERO, ENDLESS, tool_limits(timeout_s=1.0))
        stop.set()
        await tick
        return lateness

    lateness = asyncio.run(main())
    assert len(lateness) > 20
    # A loop blocked by the query would be late by the whole second; the margin is for a
    # busy 2-core CI machine, where the OS alone can delay a wakeup by tens of ms.
    assert max(lateness) < 0.5, max(lateness)


def test_missing_database_is_a_typed_error(grader, tmp_path):
    missing = str(tmp_path / "nope" / "nope.sqlite")
    with pytest.raises(t2sql.DatabaseError, match="not found"):
        grader.run_tool_sync(missing, "SELECT 1", tool_limits())
    with pytest.raises(t2sql.DatabaseError, match="not found"):
        grader.grade_sync(missing, "SELECT 1", "SELECT 1")
    not_sqlite = tmp_path / "junk.sqlite"
    not_sqlite.write_bytes(b"this is not a database" * 100)
    with pytest.raises(t2sql.DatabaseError):
        grader.run_tool_sync(str(not_sqlite), "SELECT * FROM sqlite_master", tool_limits())
    assert grader.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"


def test_manifest_refuses_a_changed_database(tmp_path):
    db_dir = tmp_path / "superhero"
    db_dir.mkdir()
    db = db_dir / "superhero.sqlite"
    shutil.copyfile(SUPERHERO, db)
    manifest = Manifest.build(tmp_path)
    manifest.save(tmp_path / "manifest.json")
    with Grader(concurrency=1, manifest=tmp_path / "manifest.json") as g:
        assert g.grade_sync(str(db), COUNT_HEROES, COUNT_HEROES).outcome == "match"
        # Same bytes, new mtime (a copy): re-hashed and accepted.
        os.utime(db, ns=(time.time_ns(), time.time_ns() + 10**9))
        assert g.run_tool_sync(str(db), COUNT_HEROES, tool_limits()).row_count == 1
        # Different bytes: refused with a typed error, for tools and grades alike.
        with open(db, "ab") as f:
            f.write(b"\0" * 4096)
        with pytest.raises(DatabaseChanged, match="changed since the manifest"):
            g.run_tool_sync(str(db), COUNT_HEROES, tool_limits())
        with pytest.raises(t2sql.DatabaseError):
            g.grade_sync(str(db), COUNT_HEROES, COUNT_HEROES)
        # A database the manifest never recorded is refused too.
        with pytest.raises(t2sql.DatabaseError, match="not in the database manifest"):
            g.run_tool_sync(SUPERHERO, COUNT_HEROES, tool_limits())


def test_disk_cache_is_shared_by_graders(tmp_path):
    gold = "SELECT full_name FROM superhero WHERE eye_colour_id = 7"
    with Grader(concurrency=1, cache_dir=tmp_path) as first:
        assert first.grade_sync(SUPERHERO, gold, gold).outcome == "match"
    secret = tmp_path / "secret"
    assert len(secret.read_bytes()) == 32
    assert (secret.stat().st_mode & 0o777) == 0o600
    entries = list((tmp_path / "gold").rglob("*.digest"))
    assert len(entries) == 1
    with Grader(concurrency=1, cache_dir=tmp_path) as second:
        r = second.grade_sync(SUPERHERO, gold, gold)
        assert r.outcome == "match" and r.gold_cached
        assert r.gold_rows == len(sqlite_rows(SUPERHERO, gold))
        assert second.stats()["gold_disk_hits"] == 1
        assert second.stats()["gold_computed"] == 0
        # A wrong prediction still mismatches against the cached digest.
        assert second.grade_sync(SUPERHERO, "SELECT full_name FROM superhero", gold).outcome == "mismatch"


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_damaged_cache_entry_is_reported_deleted_and_recomputed(tmp_path, damage, caplog):
    gold = "SELECT COUNT(*) FROM superhero WHERE gender_id = 1"
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        g.gold_sync(SUPERHERO, gold)
    (entry,) = (tmp_path / "gold").rglob("*.digest")
    blob = entry.read_bytes()
    damaged = {
        "truncate": blob[: len(blob) // 2],
        "flip": blob[:40] + bytes([blob[40] ^ 1]) + blob[41:],
        "garbage": os.urandom(len(blob)),
        "empty": b"",
    }[damage]
    entry.write_bytes(damaged)
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        r = g.grade_sync(SUPERHERO, gold, gold)
        stats = g.stats()
    assert r.outcome == "match" and not r.gold_cached
    assert stats["cache_corrupt"] == 1 and stats["gold_computed"] == 1
    assert "unusable" in caplog.text
    with Grader(concurrency=1, cache_dir=tmp_path) as g:  # the rewritten entry is whole again
        assert g.gold_sync(SUPERHERO, gold).source == "disk"


def test_unreadable_cache_entry_keeps_the_grader_serving(tmp_path, caplog):
    gold = "SELECT COUNT(*) FROM superhero WHERE gender_id = 2"
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        g.gold_sync(SUPERHERO, gold)
    (entry,) = (tmp_path / "gold").rglob("*.digest")
    entry.unlink()
    entry.mkdir()  # something that cannot be read as a file, nor replaced by one
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        r = g.grade_sync(SUPERHERO, gold, gold)
        stats = g.stats()
    assert r.outcome == "match" and r.gold_rows == 1
    assert stats["cache_corrupt"] == 1 and stats["cache_write_errors"] == 1
    assert "unusable" in caplog.text and "could not write" in caplog.text


def test_full_disk_when_writing_the_cache(tmp_path, monkeypatch):
    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gold_cache_module, "_os_write", disk_full)
    gold = "SELECT COUNT(*) FROM hero_power"
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        r = g.grade_sync(SUPERHERO, gold, gold)
        assert r.outcome == "match"
        assert g.stats()["cache_write_errors"] == 1
        assert g.grade_sync(SUPERHERO, gold, gold).gold_cached  # still cached in memory
    leftovers = [p for p in (tmp_path / "gold").rglob("*") if p.is_file()]
    assert leftovers == []  # no entry, no temp file
    monkeypatch.undo()
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        assert g.grade_sync(SUPERHERO, gold, gold).outcome == "match"
        assert g.stats()["gold_computed"] == 1 and g.stats()["cache_writes"] == 1


def test_thousands_of_concurrent_requests(grader):
    heroes = sqlite_rows(SUPERHERO, "SELECT id, superhero_name FROM superhero ORDER BY id LIMIT 40")
    golds = [f"SELECT superhero_name FROM superhero WHERE id = {i}" for i, _ in heroes]

    async def main():
        jobs = []
        for k in range(2000):
            gold = golds[k % len(golds)]
            if k % 4 == 0:
                jobs.append(grader.run_tool(SUPERHERO, gold, tool_limits()))
            elif k % 4 == 1:
                jobs.append(grader.grade(SUPERHERO, gold, gold))
            elif k % 4 == 2:
                jobs.append(grader.grade(SUPERHERO, "SELECT 'not a hero'", gold))
            else:
                jobs.append(grader.grade(SUPERHERO, "SELECT * FROM nowhere", gold))
        return await asyncio.gather(*jobs)

    results = asyncio.run(main())
    for k, r in enumerate(results):
        expected_name = heroes[k % len(heroes)][1]
        if k % 4 == 0:
            assert [tuple(x) for x in r.rows] == [(expected_name,)]
        else:
            assert r.outcome == ["match", "mismatch", "pred_error"][k % 4 - 1], (k, r)
    graded_golds = {k % len(golds) for k in range(2000) if k % 4}
    assert grader.stats()["gold_computed"] == len(graded_golds)
    assert grader.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"


def test_every_bird_gold_matches_itself():
    questions = json.loads((DATA_ROOT / "dev.json").read_text())
    with Grader() as g:

        async def main():
            return await asyncio.gather(*(
                g.grade(str(DATA_ROOT / q["db_id"] / f"{q['db_id']}.sqlite"), q["SQL"], q["SQL"])
                for q in questions
            ))

        results = asyncio.run(main())
    bad = [(q["question_id"], r.outcome, r.detail) for q, r in zip(questions, results) if not r.matched]
    assert bad == []


def test_bad_arguments_say_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="thread, process, ray"):
        Grader(backend="gpu")
    with pytest.raises(ValueError, match="at least 1"):
        Grader(concurrency=0)
    g = Grader(concurrency=1)
    g.close()
    with pytest.raises(RuntimeError, match="closed"):
        g.run_tool_sync(SUPERHERO, COUNT_HEROES, tool_limits())
    (tmp_path / "secret").write_bytes(b"short")
    with pytest.raises(gold_cache_module.GoldCacheError, match="32-byte"):
        Grader(cache_dir=tmp_path)


def test_close_interrupts_running_queries():
    g = Grader(concurrency=1)

    async def main():
        task = asyncio.create_task(g.run_tool(SUPERHERO, ENDLESS, tool_limits(timeout_s=60)))
        await asyncio.sleep(0.3)
        started = time.perf_counter()
        await g.aclose()
        closed_in = time.perf_counter() - started
        with pytest.raises(t2sql.QueryCancelled):
            await task
        return closed_in

    assert asyncio.run(main()) < 2.0


def test_a_changed_hash_secret_never_gives_a_wrong_verdict(grader):
    gold = "SELECT superhero_name FROM superhero WHERE id < 20"
    assert grader.grade_sync(SUPERHERO, gold, gold).outcome == "match"
    previous = gold_cache_module._installed_secret
    t2sql.set_hash_secret(os.urandom(32))  # e.g. another library in the process fixed a secret
    try:
        r = grader.grade_sync(SUPERHERO, gold, gold)
        assert r.outcome == "match" and not r.gold_cached  # the old digest is never compared
        assert grader.grade_sync(SUPERHERO, "SELECT 1", gold).outcome == "mismatch"
    finally:
        if previous is not None:
            t2sql.set_hash_secret(previous[0])


def _calls_per_iteration(g: Grader, make_calls) -> tuple[list, dict[int, int]]:
    """Run the calls `make_calls(g)` returns, all at once, and count how many of them start
    their set-up (the identity check) in each iteration of the event loop."""
    iteration = [0]
    started: dict[int, int] = {}
    known_identity = g._known_identity

    def counting_identity(db_path):
        started[iteration[0]] = started.get(iteration[0], 0) + 1
        return known_identity(db_path)

    g._known_identity = counting_identity

    async def main():
        loop = asyncio.get_running_loop()
        running = True

        def next_iteration():  # runs once per iteration: it always reschedules itself
            iteration[0] += 1
            if running:
                loop.call_soon(next_iteration)

        loop.call_soon(next_iteration)
        results = await asyncio.gather(*make_calls(g))
        running = False
        return results

    return asyncio.run(main()), started


def test_a_burst_of_calls_is_spread_over_loop_iterations(grader):
    golds = [f"SELECT superhero_name FROM superhero WHERE id = {i}" for i in range(1, 101)]

    def calls(g):
        limits = tool_limits()
        return [g.grade(SUPERHERO, sql, sql) for sql in golds] + [g.run_tool(SUPERHERO, sql, limits) for sql in golds]

    results, started = _calls_per_iteration(grader, calls)
    assert sum(started.values()) == 200
    # Without admission all 200 would start in the iteration that runs the new tasks; with it
    # each iteration starts at most CALLS_PER_ITERATION (16) of them, so the loop stays live.
    assert max(started.values()) <= 16, started
    assert len(started) >= 200 // 16, started
    assert [r.outcome for r in results[:100]] == ["match"] * 100
    assert [r.row_count for r in results[100:]] == [1] * 100


def test_calls_in_a_burst_start_in_arrival_order():
    order = []

    async def main(g):
        async def one(k):
            await g.run_tool(SUPERHERO, f"SELECT {k}", tool_limits())
            order.append(k)

        await asyncio.gather(*(one(k) for k in range(64)))

    # With one worker the job queue is FIFO, so the finishing order is the admission order.
    with Grader(concurrency=1) as g:
        asyncio.run(main(g))
    assert order == list(range(64))


def test_a_cancelled_waiting_call_gives_its_turn_to_the_next(grader):
    async def main():
        tasks = [asyncio.ensure_future(grader.run_tool(SUPERHERO, f"SELECT {k}", tool_limits())) for k in range(100)]
        await asyncio.sleep(0)  # all 100 have asked; most wait for their turn
        for k in range(20, 60):
            tasks[k].cancel()
        # A turn lost to a cancelled waiter would leave the later calls waiting for ever.
        return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

    results = asyncio.run(main())
    for k, r in enumerate(results):
        if 20 <= k < 60:
            assert isinstance(r, asyncio.CancelledError), (k, r)
        else:
            assert [tuple(x) for x in r.rows] == [(k,)], (k, r)
    # The Grader keeps serving after the cancellations.
    assert grader.run_tool_sync(SUPERHERO, "SELECT 7", tool_limits()).rows == [(7,)]


def _sql_worker_thread_ids() -> list[int]:
    """Native ids of this process's SQL worker threads (the Rust core names them t2sql-sql-N)."""
    tids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read()
        except FileNotFoundError:  # the thread ended after listdir
            continue
        if name.startswith("t2sql-sql-"):
            tids.append(int(task))
    return tids


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread niceness is per thread on Linux")
def test_worker_threads_run_nicer_than_the_event_loop():
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before = set(_sql_worker_thread_ids())
    with Grader(concurrency=2, worker_nice=5) as g:
        g.run_tool_sync(SUPERHERO, "SELECT 1", tool_limits())
        # A worker names itself once it runs: on a busy machine the second may not have yet.
        deadline = time.monotonic() + 10
        while len(workers := [tid for tid in _sql_worker_thread_ids() if tid not in before]) < 2:
            assert time.monotonic() < deadline, workers
            time.sleep(0.01)
        assert len(workers) == 2
        nice = {os.getpriority(os.PRIO_PROCESS, tid) for tid in workers}
    if nice == {base}:
        pytest.skip("this system does not let a thread lower its own priority")
    assert nice == {min(base + 5, 19)}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    # close() joins the workers.
    assert not set(_sql_worker_thread_ids()) & set(workers)


def test_the_sql_pool_reads_a_jobs_fields_by_name(tmp_path):
    """The Rust pool takes the job itself and reads its fields by name: a job type with the same
    fields in another order runs the same query, and one lacking a field is refused at submit. A tool
    job's limits are one ToolLimits, read whole: anything else in their place is refused."""
    from typing import NamedTuple

    from t2sql._grader import SqlPool
    from t2sql.serving.jobs import ToolJob

    class Reordered(NamedTuple):
        limits: ToolLimits
        sql: str
        identity: tuple[int, int]
        db_path: str
        job_id: int

    class Incomplete(NamedTuple):
        job_id: int
        db_path: str
        identity: tuple[int, int]
        sql: str

    limits = ToolLimits(timeout_s=5.0, max_rows=3, max_cell_chars=40, max_chars=1000, count_cap=100)
    pool = SqlPool(1)
    try:
        pool.submit_tool(ToolJob(SUPERHERO, (0, 0), "SELECT 7", limits, job_id=1))
        pool.submit_tool(Reordered(limits, "SELECT 8", (0, 0), SUPERHERO, 2))
        with pytest.raises(AttributeError, match="limits"):
            pool.submit_tool(Incomplete(3, SUPERHERO, (0, 0), "SELECT 9"))
        with pytest.raises(TypeError, match="ToolLimits"):
            pool.submit_tool(ToolJob(SUPERHERO, (0, 0), "SELECT 9", (5.0, 3, 40, 1000, 100), job_id=3))
        done: dict[int, object] = {}
        deadline = time.monotonic() + 10
        while len(done) < 2 and time.monotonic() < deadline:
            for job_id, value, error in pool.drain():
                assert error is None, error
                done[job_id] = value
            time.sleep(0.01)
    finally:
        pool.close()
    assert sorted(done) == [1, 2]
    assert done[1].rows == [(7,)] and done[2].rows == [(8,)]
