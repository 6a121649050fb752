"""`t2sql bench serving`: the Grader under training-like load, side by side with its peers: docs/grader.md,
"Measuring it: `t2sql bench serving`". The Grader is imported inside the functions that run it: `t2sql bench
grader` loads this module too, and a benchmark child's peak memory counts the parent's pages from before its exec,
so the parent stays as light as `import t2sql`."""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from typing import Any

import t2sql


def say(message: str) -> None:
    """A progress line on a terminal's stderr, written over the last one (nothing when stderr is a file)."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{message}")
        sys.stderr.flush()


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _small_queries(db_path: str, n: int) -> list[str]:
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    table = con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    ).fetchone()[0]
    ids = [r[0] for r in con.execute(f'SELECT rowid FROM "{table}" LIMIT 200')]
    con.close()
    return [f'SELECT * FROM "{table}" WHERE rowid = {ids[i % len(ids)]}' for i in range(n)]


TOOL_PATHS = {
    "python_sqlite3": "Python sqlite3 (open connection)",
    "core_run_tool": "t2sql Database.run_tool",
    "sqlite3_run_in_executor": "await run_in_executor(sqlite3)",
    "grader_async": "await Grader.run_tool",
}


def bench_tool_latency(db_path: str, n: int) -> dict[str, Any]:
    from t2sql.serving.grader import Grader  # lazily: see the module's note on peak memory

    queries = _small_queries(db_path, n)
    out: dict[str, Any] = {"queries": n, "query": queries[0]}

    con = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True)
    for q in queries[:100]:
        con.execute(q).fetchall()
    times = []
    for q in queries:
        t = time.perf_counter()
        con.execute(q).fetchall()
        times.append(time.perf_counter() - t)
    con.close()
    out["python_sqlite3"] = times

    limits = t2sql.get_preset().tool_limits  # the recipe's tool call
    db = t2sql.Database(db_path)
    for q in queries[:100]:
        db.run_tool(q, limits)
    times = []
    for q in queries:
        t = time.perf_counter()
        db.run_tool(q, limits)
        times.append(time.perf_counter() - t)
    out["core_run_tool"] = times

    async def through_grader(g: Grader) -> list[float]:
        for q in queries[:100]:
            await g.run_tool(db_path, q, limits)
        times = []
        for q in queries:
            t = time.perf_counter()
            await g.run_tool(db_path, q, limits)
            times.append(time.perf_counter() - t)
        return times

    with Grader(concurrency=1) as g:
        out["grader_async"] = asyncio.run(through_grader(g))

    # The peer an asyncio user reaches for without t2sql: sqlite3 on a worker thread.
    import concurrent.futures

    con = sqlite3.connect(f"file:{db_path}?mode=ro&immutable=1", uri=True, check_same_thread=False)
    executor = concurrent.futures.ThreadPoolExecutor(1)

    async def through_executor() -> list[float]:
        loop = asyncio.get_running_loop()
        for q in queries[:100]:
            await loop.run_in_executor(executor, lambda q=q: con.execute(q).fetchall())
        times = []
        for q in queries:
            t = time.perf_counter()
            await loop.run_in_executor(executor, lambda q=q: con.execute(q).fetchall())
            times.append(time.perf_counter() - t)
        return times

    out["sqlite3_run_in_executor"] = asyncio.run(through_executor())
    executor.shutdown()
    con.close()
    base = statistics.median(out["python_sqlite3"])
    summary = {"queries": n, "query": out["query"]}
    for path in TOOL_PATHS:
        summary[path] = {
            "p50_us": round(statistics.median(out[path]) * 1e6, 1),
            "p99_us": round(_percentile(out[path], 0.99) * 1e6, 1),
            "p50_overhead_us": round((statistics.median(out[path]) - base) * 1e6, 1),
        }
    return summary


class _StallMeter:
    """A ticker on the loop: how late does a 1 ms sleep wake up? The worst lateness is the
    longest time the loop was blocked. It also times Python's garbage collector meanwhile
    (gc.callbacks): a collection stops every thread's Python, the loop's included, so the
    longest pause says how much of the worst stall was the runtime's rather than the Grader's."""

    def __init__(self) -> None:
        self.lateness: list[float] = []
        self.gc_pauses: list[float] = []
        self._gc_started = 0.0
        self._stop = False
        self._task: asyncio.Task | None = None

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pauses.append(time.perf_counter() - self._gc_started)

    @property
    def gc_max(self) -> float:
        return max(self.gc_pauses, default=0.0)

    async def _tick(self) -> None:
        while not self._stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            self.lateness.append(time.perf_counter() - t - 0.001)

    def start(self) -> None:
        import gc

        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._tick())

    async def stop(self) -> tuple[float, float]:
        """(worst lateness, 99th percentile lateness) in seconds."""
        import gc

        self._stop = True
        await self._task
        gc.callbacks.remove(self._on_gc)
        return max(self.lateness, default=0.0), _percentile(self.lateness or [0.0], 0.99)


async def _grade_all(grader, pairs, tasks: int | None) -> tuple[float, tuple, list[str]]:
    """Grade every (db_path, sql) pair as pred = gold; `tasks` concurrent tasks pull from the
    list (None: one task per pair). Returns (seconds, (worst stall, p99 stall, longest GC
    pause), outcomes).
    A stall also counts time the OS ran other threads instead of the loop: on a machine with
    no idle core it measures the machine as much as the Grader."""
    meter = _StallMeter()
    meter.start()
    outcomes: list[str] = [""] * len(pairs)
    started = time.perf_counter()
    if tasks is None:
        results = await asyncio.gather(*(grader.grade(p, sql, sql) for p, sql in pairs))
        outcomes = [r.outcome for r in results]
    else:
        index = iter(range(len(pairs)))

        async def worker() -> None:
            for i in index:
                p, sql = pairs[i]
                outcomes[i] = (await grader.grade(p, sql, sql)).outcome

        await asyncio.gather(*(worker() for _ in range(tasks)))
    seconds = time.perf_counter() - started
    worst, p99 = await meter.stop()
    return seconds, (worst, p99, meter.gc_max), outcomes


def bench_grades(pairs, workers: int, tasks: int, backend: str, repeat: int = 1) -> dict[str, Any]:
    """Each configuration `repeat` times, round-robin (so drifting load on a shared machine
    hits every configuration alike); the median run of each is reported."""
    from t2sql.serving.grader import Grader  # lazily: see the module's note on peak memory

    other = "process" if backend == "thread" else "thread"
    # label -> (backend, workers, concurrent tasks or None = one task per pair, warm golds)
    configs = {
        "1 worker": (backend, 1, None, False),
        f"{workers} workers": (backend, workers, None, False),
        f"{workers} workers, {tasks} tasks": (backend, workers, tasks, False),
        f"{workers} workers, {tasks} tasks, warm golds": (backend, workers, tasks, True),
        f"1 worker ({other})": (other, 1, None, False),
        f"{workers} workers ({other})": (other, workers, None, False),
        # The peer of the speedup: the core alone on plain threads, no Grader, no event loop.
        "1 thread (core, no Grader)": ("core", 1, None, False),
        f"{workers} threads (core, no Grader)": ("core", workers, None, False),
    }

    def once(kind: str, concurrency: int, n_tasks: int | None, warm: bool):
        if kind == "core":
            return _grade_on_plain_threads(pairs, concurrency)
        with Grader(concurrency=concurrency, backend=kind) as g:
            asyncio.run(_grade_all(g, pairs[:8], None))  # workers up, connections open
            if warm:
                asyncio.run(_grade_all(g, pairs, None))
            return asyncio.run(_grade_all(g, pairs, n_tasks))

    runs: dict[str, list] = {label: [] for label in configs}
    for i in range(repeat):
        for label, config in configs.items():
            say(f"grades: {label} ({i + 1}/{repeat})")
            runs[label].append(once(*config))
    rows = {}
    for label, (kind, concurrency, n_tasks, warm) in configs.items():
        seconds, (stall, stall_p99, gc_max), outcomes = sorted(runs[label], key=lambda r: r[0])[len(runs[label]) // 2]
        rows[label] = {
            "backend": kind,
            "workers": concurrency,
            "tasks": n_tasks or len(pairs),
            "gold_cache": "warm" if warm else "cold",
            "seconds": round(seconds, 3),
            "grades_per_s": round(len(pairs) / seconds, 1),
            "loop_max_stall_ms": None if stall is None else round(stall * 1e3, 2),
            "loop_p99_stall_ms": None if stall_p99 is None else round(stall_p99 * 1e3, 2),
            "gc_max_pause_ms": None if gc_max is None else round(gc_max * 1e3, 2),
            "not_matched": sum(o != "match" for o in outcomes),
        }
    for single, multi in (("1 worker", f"{workers} workers"),
                          (f"1 worker ({other})", f"{workers} workers ({other})"),
                          ("1 thread (core, no Grader)", f"{workers} threads (core, no Grader)")):
        rows[multi]["speedup"] = round(rows[multi]["grades_per_s"] / rows[single]["grades_per_s"], 2)
    return rows


class _PlainConnections:
    """One thread's own t2sql.Database per file: the core used directly, with no Grader."""

    def __init__(self) -> None:
        self._dbs: dict[str, t2sql.Database] = {}

    def grade_against_itself(self, path: str, sql: str) -> str:
        db = self._dbs.get(path)
        if db is None:
            db = self._dbs[path] = t2sql.Database(path)
        return db.grade(sql, sql).outcome


def _grade_on_plain_threads(pairs, threads: int) -> tuple[float, tuple, list[str]]:
    """Every pair graded (pred = gold, so gold and prediction both run) by `threads` plain
    threads calling t2sql.Database directly, each with its own connections, taking pairs in
    order from a shared counter: the core's own scaling, the ceiling for the Grader's."""
    import itertools
    import threading

    counter = itertools.count()  # next() on it is atomic under the GIL
    outcomes: list[str] = [""] * len(pairs)
    ready = threading.Barrier(threads + 1)

    def grade_some() -> None:
        grade = _PlainConnections().grade_against_itself
        for path, sql in pairs[:8]:  # untimed warm-up, as the Grader runs have
            grade(path, sql)
        ready.wait()
        for i in counter:
            if i >= len(pairs):
                return
            outcomes[i] = grade(*pairs[i])

    workers = [threading.Thread(target=grade_some) for _ in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    started = time.perf_counter()
    for w in workers:
        w.join()
    return time.perf_counter() - started, (None, None, None), outcomes


def bench_stall_floor(pairs, workers: int, tasks: int, seconds: float = 2.0) -> dict[str, Any]:
    """The peers of the Grader's loop stalls: the same ticker on a loop that does nothing else
    (what the machine alone does to a sleeping thread); beside `workers` plain threads grading
    the same pairs straight on the core, no Grader, at the niceness the Grader gives its
    workers (what busy cores add); and while `tasks` tasks that only await a future start at
    once, five times (what asyncio itself costs for the benchmark's burst of tasks)."""
    import threading

    from t2sql.serving.jobs import lower_priority
    from t2sql.serving.settings import DEFAULT_WORKER_NICE  # lazily, as above

    async def meter_for(duration: float) -> tuple[float, float]:
        meter = _StallMeter()
        meter.start()
        await asyncio.sleep(duration)
        return await meter.stop()

    stop = threading.Event()

    def grade_until_stopped() -> None:
        lower_priority(DEFAULT_WORKER_NICE)
        grade = _PlainConnections().grade_against_itself
        while not stop.is_set():
            for path, sql in pairs:
                if stop.is_set():
                    return
                grade(path, sql)

    out = {}
    worst, p99 = asyncio.run(meter_for(seconds))
    out["idle"] = {"loop_max_stall_ms": round(worst * 1e3, 2), "loop_p99_stall_ms": round(p99 * 1e3, 2)}
    threads = [threading.Thread(target=grade_until_stopped, daemon=True) for _ in range(workers)]
    for t in threads:
        t.start()
    try:
        worst, p99 = asyncio.run(meter_for(seconds))
    finally:
        stop.set()
        for t in threads:
            t.join()
    out["raw_sql_threads"] = {"threads": workers, "loop_max_stall_ms": round(worst * 1e3, 2),
                              "loop_p99_stall_ms": round(p99 * 1e3, 2)}

    async def start_tasks_only() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        meter = _StallMeter()
        meter.start()
        for _ in range(5):
            pending = [loop.create_future() for _ in range(tasks)]

            async def wait_for(fut: asyncio.Future) -> None:
                await fut

            burst = asyncio.gather(*(wait_for(f) for f in pending))
            await asyncio.sleep(0.02)
            for f in pending:
                f.set_result(None)
            await burst
            await asyncio.sleep(0.02)
        return await meter.stop()

    worst, p99 = asyncio.run(start_tasks_only())
    out["asyncio_tasks_only"] = {"tasks": tasks, "loop_max_stall_ms": round(worst * 1e3, 2),
                                 "loop_p99_stall_ms": round(p99 * 1e3, 2)}
    return out


def _burn(n: int = 5_000_000) -> float:
    started = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - started


def _burn_after(barrier, results) -> None:
    barrier.wait()  # all children start burning together, after their start-up
    results.put(_burn())


def effective_cores(workers: int) -> float:
    """How many cores this machine gives right now: a fixed pure-CPU job alone vs in
    `workers` processes at once. On a shared VM this caps every speedup in the table."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_burn_after, args=(barrier, results)) for _ in range(workers)]
    for p in procs:
        p.start()
    times = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join()
    alone = _burn()
    return round(workers * alone / max(times), 2)


def bench_rollout(pairs, workers: int, trajectories: int, backend: str, seed: int = 0) -> dict[str, Any]:
    """A rollout's shape: `trajectories` episodes at once, each five tool calls and one grade,
    with a random 5-50 ms 'model turn' before each call (the loop is otherwise idle then, as
    when sglang generates). Golds are cold. Reports SQL calls/s and the loop's stalls."""
    import random

    from t2sql.serving.grader import Grader  # lazily: see the module's note on peak memory

    limits = t2sql.get_preset().tool_limits  # the recipe's tool call
    rng = random.Random(seed)
    plan = [(pairs[i % len(pairs)], [rng.uniform(0.005, 0.05) for _ in range(6)]) for i in range(trajectories)]

    async def episode(g, pair, pauses) -> str:
        db_path, sql = pair
        for pause in pauses[:5]:
            await asyncio.sleep(pause)
            try:
                await g.run_tool(db_path, sql, limits)
            except t2sql.T2sqlError:
                pass
        await asyncio.sleep(pauses[5])
        return (await g.grade(db_path, sql, sql)).outcome

    async def main(g):
        meter = _StallMeter()
        meter.start()
        started = time.perf_counter()
        outcomes = await asyncio.gather(*(episode(g, pair, pauses) for pair, pauses in plan))
        seconds = time.perf_counter() - started
        worst, p99 = await meter.stop()
        return seconds, worst, p99, meter.gc_max, outcomes

    with Grader(concurrency=workers, backend=backend) as g:
        seconds, worst, p99, gc_max, outcomes = asyncio.run(main(g))
    return {
        "trajectories": trajectories,
        "sql_calls": trajectories * 6,
        "seconds": round(seconds, 3),
        "sql_calls_per_s": round(trajectories * 6 / seconds, 1),
        "loop_max_stall_ms": round(worst * 1e3, 2),
        "loop_p99_stall_ms": round(p99 * 1e3, 2),
        "gc_max_pause_ms": round(gc_max * 1e3, 2),
        "not_matched": sum(o != "match" for o in outcomes),
    }


def bench_gold_precompute(pairs, workers: int, backend: str) -> dict[str, Any]:
    from t2sql.serving.grader import Grader  # lazily: see the module's note on peak memory

    async def all_golds(g) -> int:
        results = await asyncio.gather(*(g.gold(p, sql) for p, sql in pairs))
        return sum(not r.ok for r in results)

    out = {}
    with tempfile.TemporaryDirectory(prefix="t2sql-bench-gold-") as cache:
        for label in ("cold", "warm"):
            say(f"gold precompute: {label}")
            with Grader(concurrency=workers, cache_dir=cache, backend=backend) as g:
                started = time.perf_counter()
                failed = asyncio.run(all_golds(g))
                seconds = time.perf_counter() - started
                stats = g.stats()
            out[label] = {"seconds": round(seconds, 3), "failed": failed,
                          "computed": stats["gold_computed"], "from_disk": stats["gold_disk_hits"]}
    return out


