"""Where the SQL of a `t2sql.Grader` runs: threads, worker processes, or Ray actors.

Every backend runs the same four jobs (a tool call, a gold digest, a grade, an equivalence
check) with connections cached per worker per database file, and exposes
`submit_async(job, loop) -> (asyncio future, an object whose cancel() cancels the job)`. At most
`size` jobs run at once: the pool itself is the Grader's one concurrency limit, shared by tool
calls, golds, predictions and equivalence checks.

- thread: `size` SQL threads of the Rust core (`t2sql._grader.SqlPool`) that never take the
  GIL for a query; their outcomes reach the event loop through one wake socket. Cheapest, one
  heap for everything. An equivalence check is Python that drives the core on perturbed copies:
  the worker takes the GIL to call it, and the core releases it around each of its queries.
- process: one worker process per slot, each with its own SQLite heap (and an optional
  heap limit), so a memory bomb in one query cannot starve the others; a dead worker is
  replaced and its job fails with a typed error.
- ray: one Ray actor per slot, so SQL spreads over the CPU cores of a whole cluster.

Results that cross a process boundary are the values the thread backend returns too: the core's
ToolResult (it pickles as itself), (digest bytes, seconds), a GradeResult; errors cross as (class
name, message) and are re-raised as the same t2sql exception.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import threading
import weakref
from collections import OrderedDict
from typing import NamedTuple, Union

import t2sql
from t2sql import Cancel, Database, Digest, GradeSpec, ToolLimits
from t2sql._grader import SqlPool, lower_thread_priority
from t2sql.serving.equivalence import EquivalenceConfig, default_checker
from t2sql.serving.results import GradeResult

# Connections kept per thread; an RL run touches a few dozen databases, BIRD train ~70.
MAX_CONNECTIONS_PER_THREAD = 128

_local = threading.local()


class ToolJob(NamedTuple):
    """One tool call under `limits` (its preview limits and timeout, one value the core reads
    whole). `identity` is the file's (size, version) seen by the Grader
    (t2sql.serving.manifest.FileIdentity): a cached connection opened on another identity is
    reopened (the file was replaced or written, or a writer's side file came or went).
    Jobs are named tuples, not dataclasses: one is made per SQL call on the event loop's thread,
    and a named tuple is the cheaper of the two to build."""

    db_path: str
    identity: tuple[int, int]
    sql: str
    limits: ToolLimits
    job_id: int = 0


class DigestJob(NamedTuple):
    """One gold query's digest under a grading spec, read whole by the core (fields as ToolJob's
    where they share a name)."""

    db_path: str
    identity: tuple[int, int]
    sql: str
    spec: GradeSpec
    job_id: int = 0


class GradeJob(NamedTuple):
    """One prediction graded against a gold digest (`gold`: Digest.to_bytes())."""

    db_path: str
    identity: tuple[int, int]
    sql: str
    gold: bytes
    timeout_s: float
    job_id: int = 0


class EquivalenceJob(NamedTuple):
    """One equivalence check (t2sql.serving.equivalence): the whole check, on one worker, with that
    worker's copy cache."""

    db_path: str
    identity: tuple[int, int]
    pred_sql: str
    gold_sql: str
    config: EquivalenceConfig
    job_id: int = 0


Job = Union[ToolJob, DigestJob, GradeJob, EquivalenceJob]


class WorkerLost(t2sql.SqlError):
    """The worker process or actor running a query died (killed, out of memory, crashed).

    A subclass of SqlError: for a tool call it reads like any failed query, and a grade
    reports it as the prediction's (or gold's) error; the worker is replaced."""


def set_worker_heap_limit(limit: int | None) -> None:
    """This worker process's SQLite heap limit (the core keeps a chosen limit; without one, the
    first connection installs its 2 GiB default)."""
    if limit:
        t2sql.set_heap_limit(limit)


# Make the calling thread `nice` steps nicer: the SQL workers yield the CPU to the event loop's
# thread this way. One implementation, the core's, serves the Rust pool's threads and the
# Python threads and worker processes alike.
lower_priority = lower_thread_priority


def connection(db_path: str, identity: tuple[int, int]) -> Database:
    """This thread's open connection to `db_path`, reopened if the file's identity changed."""
    cache: OrderedDict | None = getattr(_local, "connections", None)
    if cache is None:
        cache = _local.connections = OrderedDict()
    entry = cache.get(db_path)
    if entry is not None and entry[0] == identity:
        cache.move_to_end(db_path)
        return entry[1]
    db = Database(db_path)
    cache[db_path] = (identity, db)
    cache.move_to_end(db_path)
    while len(cache) > MAX_CONNECTIONS_PER_THREAD:
        cache.popitem(last=False)
    return db


def run_job(job: Job, cancel: Cancel | None):
    """Run one job on this thread's connection. Raises the core's exceptions unchanged."""
    if type(job) is EquivalenceJob:  # on copies of the database, not on its connection
        return default_checker().check_sync(job.db_path, job.pred_sql, job.gold_sql, job.config, cancel=cancel)
    db = connection(job.db_path, job.identity)
    if type(job) is ToolJob:
        return db.run_tool(job.sql, job.limits, cancel=cancel)
    if type(job) is DigestJob:
        digest = db.digest(job.sql, job.spec, cancel=cancel)
        # The time travels beside the bytes: Digest.to_bytes() does not carry elapsed_s.
        return digest.to_bytes(), digest.elapsed_s
    if type(job) is GradeJob:
        v = db.grade_against(job.sql, Digest.from_bytes(job.gold), job.timeout_s, cancel=cancel)
        return GradeResult.from_verdict(v)
    raise TypeError(f"not a job: {job!r}")


def run_job_portable(job: Job, cancel: Cancel | None):
    """run_job for another process: ("ok", value) or ("error", class name, message)."""
    try:
        value = run_job(job, cancel)
    except t2sql.T2sqlError as e:
        return ("error", type(e).__name__, str(e))
    except Exception as e:  # a bug or an unexpected failure: report it, keep the worker alive
        return ("error", "RuntimeError", f"{type(e).__name__}: {e}")
    return ("ok", value)


def unpack(reply):
    """The value of a run_job_portable reply, or its exception raised as the same type."""
    if reply[0] == "ok":
        return reply[1]
    _, name, message = reply
    cls = getattr(t2sql, name, None)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = RuntimeError
    raise cls(message)


class ThreadBackend:
    """Jobs on `size` SQL threads of the Rust core (`t2sql._grader.SqlPool`).

    The workers never take the GIL: a job goes in as plain values, runs on the worker's own
    connection, and its outcome waits on a completion list. The first completion after a drain
    makes the pool's wake socket readable; every event loop that submitted work watches that
    socket (`loop.add_reader`), and the one that wakes first drains all outcomes at once,
    settling its own futures directly and handing the others to their loops. So a job boundary
    never waits for the event loop's thread or the garbage collector to release Python, and a
    burst of completions costs the loop one wake-up."""

    name = "thread"

    def __init__(self, size: int, *, nice: int = 0):
        self.size = size
        self._pool = SqlPool(size, nice=nice)
        self._fd = self._pool.wake_fd()
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._watching: weakref.WeakSet = weakref.WeakSet()  # loops with a reader on the wake socket
        self._closed = False

    def submit_async(self, job: Job, loop: asyncio.AbstractEventLoop):
        """(asyncio future of the result, an object whose cancel() cancels the job)."""
        if self._closed:
            raise RuntimeError("the Grader is closed")
        if loop not in self._watching:
            loop.add_reader(self._fd, self._drain, loop)
            self._watching.add(loop)
        fut = loop.create_future()
        self._waiting[job.job_id] = (loop, fut)
        try:
            self._send(job)
        except BaseException:
            del self._waiting[job.job_id]
            raise
        return fut, _PoolCancel(self._pool, job.job_id)

    def _send(self, job: Job) -> None:
        # The pool reads each job's fields by name (grader_rs/src/py/pool.rs).
        if type(job) is ToolJob:
            self._pool.submit_tool(job)
        elif type(job) is DigestJob:
            self._pool.submit_digest(job)
        elif type(job) is GradeJob:
            self._pool.submit_grade(job)
        elif type(job) is EquivalenceJob:
            self._pool.submit_call(job.job_id, functools.partial(run_job, job))
        else:
            raise TypeError(f"not a job: {job!r}")

    def _drain(self, current: asyncio.AbstractEventLoop | None) -> None:
        """Settle every finished job: on `current` (the loop running this) directly, on any
        other loop through call_soon_threadsafe."""
        for job_id, value, error in self._pool.drain():
            entry = self._waiting.pop(job_id, None)
            if entry is None:
                continue
            loop, fut = entry
            if loop is current:
                _settle_async(fut, value, error)
                continue
            try:
                loop.call_soon_threadsafe(_settle_async, fut, value, error)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.close()  # cancels what runs or waits, joins the workers
        self._drain(None)  # the cancelled jobs: their callers get QueryCancelled
        for loop in list(self._watching):
            if loop.is_closed():
                continue
            try:
                loop.call_soon_threadsafe(loop.remove_reader, self._fd)
            except RuntimeError:
                pass


class _PoolCancel:
    """cancel() for a job on the SqlPool."""

    __slots__ = ("_pool", "_job_id")

    def __init__(self, pool: SqlPool, job_id: int):
        self._pool, self._job_id = pool, job_id

    def cancel(self) -> None:
        self._pool.cancel(self._job_id)


def _settle_async(fut: asyncio.Future, value, error) -> None:
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


_job_ids = itertools.count(1)


def next_job_id() -> int:
    return next(_job_ids)
