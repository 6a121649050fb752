"""Where the SQL of a `t2sql.Grader` runs: threads (here; `t2sql._grader.SqlPool`, outcomes reaching the event loop
through one wake socket), worker processes or Ray actors (t2sql.serving.process_backends). Every backend runs the
same jobs (t2sql.serving.jobs) and is the Grader's one concurrency limit. docs/grader.md, "Backends"."""

from __future__ import annotations

import asyncio
import functools
import weakref

from t2sql._grader import SqlPool
from t2sql.serving.jobs import CallJob, DigestJob, GradeJob, Job, ToolJob, run_job


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
        elif type(job) is CallJob:
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


