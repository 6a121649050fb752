"""Past one process: the process-pool and Ray backends serve the same API as threads, with
real worker processes (and a real local Ray on loopback)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time

import pytest

import t2sql
from conftest import bird_root, tool_limits
from t2sql import GradeSpec, ToolResult
from t2sql.serving.grader import Grader
from t2sql.serving.jobs import WorkerLost

DATA_ROOT = bird_root()
SUPERHERO = str(DATA_ROOT / "superhero" / "superhero.sqlite")
COUNT_HEROES = "SELECT COUNT(*) FROM superhero"
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"
# Sorting ~3M wide rows needs far more than 64 MiB of SQLite heap.
# Each value is under SQLite's LENGTH limit; ten in one row (100 MB) are over a 64 MiB heap.
# (A sort is no memory bomb: the sorter spills to temporary files.)
MEMORY_BOMB = "SELECT " + ", ".join(["randomblob(10000000)"] * 10)


def sqlite_rows(sql: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{SUPERHERO}?mode=ro", uri=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def exercise(g: Grader) -> None:
    """The same checks for every backend: tools, typed errors, grades, shared golds."""
    sql = "SELECT superhero_name FROM superhero ORDER BY id LIMIT 3"
    tool = g.run_tool_sync(SUPERHERO, sql, tool_limits())
    assert [tuple(r) for r in tool.rows] == sqlite_rows(sql)
    assert tool.row_count == 3 and "superhero_name" in tool.columns
    with pytest.raises(t2sql.SqlError, match="no such table"):
        g.run_tool_sync(SUPERHERO, "SELECT * FROM nowhere", tool_limits())
    with pytest.raises(t2sql.UnsafeQuery):
        g.run_tool_sync(SUPERHERO, "DELETE FROM superhero", tool_limits())
    with pytest.raises(t2sql.QueryTimeout):
        g.run_tool_sync(SUPERHERO, ENDLESS, tool_limits(timeout_s=0.2))

    golds = [f"SELECT superhero_name FROM superhero WHERE publisher_id = {p}" for p in range(1, 9)]

    async def many():
        # Gold digests made on one worker are graded on the others: workers share the secret.
        jobs = [g.grade(SUPERHERO, gold, gold) for gold in golds for _ in range(6)]
        jobs += [g.grade(SUPERHERO, "SELECT 1", gold) for gold in golds]
        return await asyncio.gather(*jobs)

    results = asyncio.run(many())
    assert [r.outcome for r in results] == ["match"] * 48 + ["mismatch"] * 8
    assert g.stats()["gold_computed"] == len(golds)
    r = g.grade_sync(SUPERHERO, ENDLESS, COUNT_HEROES, GradeSpec(timeout_s=0.2))
    assert r.outcome == "pred_timeout" and r.retried


def cancel_frees_the_worker(g: Grader) -> float:
    async def main():
        task = asyncio.create_task(g.run_tool(SUPERHERO, ENDLESS, tool_limits(timeout_s=60)))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        started = time.perf_counter()
        result = await g.run_tool(SUPERHERO, COUNT_HEROES, tool_limits())
        assert result.rows[0][0] == sqlite_rows(COUNT_HEROES)[0][0]
        return time.perf_counter() - started

    return asyncio.run(main())


def test_process_backend_serves_the_same_api():
    with Grader(backend="process", concurrency=2) as g:
        assert isinstance(g.run_tool_sync(SUPERHERO, COUNT_HEROES, tool_limits()), ToolResult)
        exercise(g)


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="niceness is a POSIX feature")
def test_worker_processes_run_nicer_than_the_grader():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    with Grader(backend="process", concurrency=2, worker_nice=3) as g:
        assert g.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"
        nice = {os.getpriority(os.PRIO_PROCESS, pid) for pid in g._backend.worker_pids()}
    if nice == {base}:
        pytest.skip("this system does not let a process lower its own priority")
    assert nice == {min(base + 3, 19)}


def test_process_workers_share_the_disk_cache_secret(tmp_path):
    gold = "SELECT superhero_name FROM superhero WHERE hair_colour_id = 9"
    with Grader(backend="process", concurrency=2, cache_dir=tmp_path) as g:
        assert g.gold_sync(SUPERHERO, gold).source == "computed"
    # A thread-backed Grader (this process) grades against the digest a worker made.
    with Grader(concurrency=1, cache_dir=tmp_path) as g:
        r = g.grade_sync(SUPERHERO, gold, gold)
        assert r.outcome == "match" and r.gold_cached and g.stats()["cache_corrupt"] == 0
        assert r.gold_rows == len(sqlite_rows(gold))


def test_process_backend_cancel_interrupts_the_worker():
    with Grader(backend="process", concurrency=1) as g:
        assert cancel_frees_the_worker(g) < 2.0


def test_a_dead_worker_is_replaced_and_its_query_fails_typed():
    with Grader(backend="process", concurrency=1) as g:
        (pid,) = g._backend.worker_pids()
        assert g.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"  # gold cached

        async def main():
            task = asyncio.create_task(g.grade(SUPERHERO, ENDLESS, COUNT_HEROES, GradeSpec(timeout_s=60)))
            await asyncio.sleep(0.5)  # the gold is done; the prediction is running
            os.kill(pid, signal.SIGKILL)
            return await task

        r = asyncio.run(main())
        assert r.outcome == "pred_error" and "died" in r.detail
        (new_pid,) = g._backend.worker_pids()
        assert new_pid != pid

        async def tool():
            t = asyncio.create_task(g.run_tool(SUPERHERO, ENDLESS, tool_limits(timeout_s=60)))
            await asyncio.sleep(0.5)
            os.kill(new_pid, signal.SIGKILL)
            return await t

        with pytest.raises(WorkerLost, match="died"):
            asyncio.run(tool())
        assert issubclass(WorkerLost, t2sql.SqlError)
        assert g.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"


def test_a_memory_bomb_fails_alone():
    with Grader(backend="process", concurrency=2, worker_heap_limit=64 << 20) as g:

        async def main():
            # A gold of ten columns too, so the bomb is not a mismatch before it runs.
            bomb = asyncio.create_task(g.grade(SUPERHERO, MEMORY_BOMB, "SELECT " + ", ".join(["1"] * 10),
                                               GradeSpec(timeout_s=60)))
            others = [g.grade(SUPERHERO, COUNT_HEROES, COUNT_HEROES) for _ in range(20)]
            return await bomb, await asyncio.gather(*others)

        bomb, others = asyncio.run(main())
        assert bomb.outcome == "pred_error", bomb
        assert all(r.outcome == "match" for r in others)
        assert g.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install ray) ")
    # Ray's session files go to a pytest temporary directory, not /tmp/ray.
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False, _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield ray
    ray.shutdown()


def test_ray_backend_serves_the_same_api(local_ray):
    with Grader(backend="ray", concurrency=2) as g:
        assert g.concurrency == 2
        exercise(g)
        assert cancel_frees_the_worker(g) < 5.0


def test_a_dead_ray_actor_is_replaced(local_ray):
    with Grader(backend="ray", concurrency=1) as g:
        assert g.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"  # gold cached
        actor = g._backend._actors[0]

        async def main():
            task = asyncio.create_task(g.grade(SUPERHERO, ENDLESS, COUNT_HEROES, GradeSpec(timeout_s=60)))
            await asyncio.sleep(1.0)
            local_ray.kill(actor, no_restart=True)
            return await task

        r = asyncio.run(main())
        assert r.outcome == "pred_error" and "died" in r.detail
        assert g._backend._actors[0] is not actor
        assert g.grade_sync(SUPERHERO, COUNT_HEROES, COUNT_HEROES).outcome == "match"


def test_ray_backend_needs_ray_initialised(local_ray):
    local_ray.shutdown()  # the last Ray test: nothing needs Ray after it
    with pytest.raises(RuntimeError, match="ray.init"):
        Grader(backend="ray")
