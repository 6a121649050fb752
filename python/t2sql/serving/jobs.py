"""The Grader's jobs (a tool call, a gold digest, a grade, and a call it does not know the insides of) as named
tuples the Rust pool reads by field name; `run_job` runs one on the worker's cached connection, and
`run_job_portable` / `unpack` carry its value or its error across a process boundary (errors as (class name,
message), re-raised as the same t2sql exception)."""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from typing import Any, Callable, NamedTuple, Union

import t2sql
from t2sql import Cancel, Database, Digest, GradeSpec, ToolLimits
from t2sql._grader import lower_thread_priority
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
    """One prediction graded against a gold digest (`gold`: Digest.to_bytes()), under its grading
    spec's timeout and cap on temporary disk."""

    db_path: str
    identity: tuple[int, int]
    sql: str
    gold: bytes
    timeout_s: float
    max_temp_mb: int
    job_id: int = 0


class CallJob(NamedTuple):
    """`call(cancel)` run on one SQL worker, counted against the one concurrency limit like any job;
    what it does is its own (the equivalence check opens small databases of its own). `call` is a
    module-level function or a functools.partial of one, so that a process or Ray worker unpickles
    it by reference."""

    db_path: str
    identity: tuple[int, int]
    call: Callable[[Cancel | None], Any]
    job_id: int = 0


Job = Union[ToolJob, DigestJob, GradeJob, CallJob]


class WorkerLost(t2sql.SqlError):
    """The worker process or actor running a query died (killed, out of memory, crashed).

    A subclass of SqlError: for a tool call it reads like any failed query, and a grade
    reports it as the prediction's (or gold's) error; the worker is replaced."""


def set_worker_heap_limit(limit: int | None) -> None:
    """This worker process's SQLite heap limit (the core keeps a chosen limit; without one, the
    first connection installs its 2 GiB default)."""
    if limit:
        t2sql.set_heap_limit(limit)


# A process's grading memory as t2sql.grade_memory() gives it: (bytes, spill directory or None).
GradeMemory = tuple[int, "str | None"]


def set_worker_grade_memory(memory: GradeMemory | None) -> None:
    """This worker process's grading memory (the Grader's, handed to each worker it starts)."""
    if memory is not None:
        t2sql.set_grade_memory(memory[0], memory[1])


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
    if type(job) is CallJob:  # it opens what it needs itself, not the real file's cached connection
        return job.call(cancel)
    db = connection(job.db_path, job.identity)
    if type(job) is ToolJob:
        return db.run_tool(job.sql, job.limits, cancel=cancel)
    if type(job) is DigestJob:
        digest = db.digest(job.sql, job.spec, cancel=cancel)
        # The time travels beside the bytes: Digest.to_bytes() does not carry elapsed_s.
        return digest.to_bytes(), digest.elapsed_s
    if type(job) is GradeJob:
        v = db.grade_against(job.sql, Digest.from_bytes(job.gold), job.timeout_s, cancel=cancel,
                             max_temp_mb=job.max_temp_mb)
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


_job_ids = itertools.count(1)


def next_job_id() -> int:
    return next(_job_ids)
