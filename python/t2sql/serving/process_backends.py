"""Backends that run the Grader's SQL in other processes: worker processes on this node, or Ray
actors; jobs go out and replies come back over pipes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import queue
import threading
from collections import OrderedDict

import t2sql
from t2sql import Cancel
from t2sql.serving.jobs import (
    GradeMemory,
    Job,
    WorkerLost,
    lower_priority,
    run_job_portable,
    set_worker_grade_memory,
    set_worker_heap_limit,
    unpack,
)


class _RemoteCancel:
    """cancel() for a job sent to a worker process or actor."""

    __slots__ = ("_backend", "_job", "_cfut")

    def __init__(self, backend: _DispatchedBackend, job: Job, cfut: concurrent.futures.Future):
        self._backend, self._job, self._cfut = backend, job, cfut

    def cancel(self) -> None:
        self._cfut.cancel()  # still queued: never runs
        self._backend.cancel(self._job)  # running: the worker interrupts SQLite


class _DispatchedBackend:
    """Jobs on `size` remote workers; one dispatcher thread per worker sends it one job at a
    time and waits for the reply, so at most `size` jobs run and a slow job blocks nobody
    else's worker."""

    name = "remote"

    def __init__(self, size: int):
        self.size = size
        self._queue: queue.Queue = queue.Queue()
        self._running: dict[int, int] = {}  # job_id -> worker index
        self._lock = threading.Lock()
        self._closed = False
        self._threads: list[threading.Thread] = []

    def _start_dispatchers(self) -> None:
        for index in range(self.size):
            t = threading.Thread(target=self._dispatch, args=(index,), name=f"t2sql-{self.name}-{index}",
                                 daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, job: Job) -> concurrent.futures.Future:
        if self._closed:
            raise RuntimeError("the Grader is closed")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((job, fut))
        return fut

    def submit_async(self, job: Job, loop: asyncio.AbstractEventLoop):
        cfut = self.submit(job)
        return asyncio.wrap_future(cfut, loop=loop), _RemoteCancel(self, job, cfut)

    def cancel(self, job: Job) -> None:
        with self._lock:
            index = self._running.get(job.job_id)
        if index is not None:
            try:
                self._cancel_on(index, job.job_id)
            except Exception:  # the worker is gone; its reply (or death) settles the job
                pass

    def _dispatch(self, index: int) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            job, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            with self._lock:
                self._running[job.job_id] = index
            try:
                reply = self._call_on(index, job)
            except WorkerLost as e:
                self._restart(index)  # before failing the job: the caller's next job has a worker
                fut.set_exception(e)
                continue
            except BaseException as e:  # noqa: BLE001 - the caller gets every failure
                fut.set_exception(e)
                continue
            finally:
                with self._lock:
                    self._running.pop(job.job_id, None)
            try:
                fut.set_result(unpack(reply))
            except BaseException as e:  # noqa: BLE001
                fut.set_exception(e)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Fail what is still queued, then stop each dispatcher.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[1].cancel()
        with self._lock:
            running = dict(self._running)
        for job_id, index in running.items():
            try:
                self._cancel_on(index, job_id)
            except Exception:
                pass
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self._close_workers()

    # Implemented by each backend.
    def _call_on(self, index: int, job: Job):
        raise NotImplementedError

    def _cancel_on(self, index: int, job_id: int) -> None:
        raise NotImplementedError

    def _restart(self, index: int) -> None:
        raise NotImplementedError

    def _close_workers(self) -> None:
        raise NotImplementedError


class _EarlyCancels:
    """Cancels that arrived before their job started (bounded: stale ids age out)."""

    def __init__(self, keep: int = 1024):
        self._ids: OrderedDict[int, None] = OrderedDict()
        self._keep = keep

    def add(self, job_id: int) -> None:
        self._ids[job_id] = None
        while len(self._ids) > self._keep:
            self._ids.popitem(last=False)

    def pop(self, job_id: int) -> bool:
        return self._ids.pop(job_id, False) is None


def _worker_main(job_conn, cancel_conn, secret: bytes | None, heap_limit: int | None, nice: int = 0,
                 grade_memory: GradeMemory | None = None) -> None:
    """A worker process: run jobs from job_conn; a side thread reads job ids to cancel."""
    lower_priority(nice)  # before the cancel thread starts: it inherits the niceness
    if secret is not None:
        t2sql.set_hash_secret(secret)
    set_worker_heap_limit(heap_limit)
    set_worker_grade_memory(grade_memory)
    current: list = [None, None]  # [job_id, Cancel]
    early = _EarlyCancels()
    lock = threading.Lock()

    def listen_for_cancels() -> None:
        while True:
            try:
                job_id = cancel_conn.recv()
            except (EOFError, OSError):
                return
            with lock:
                if current[0] == job_id and current[1] is not None:
                    current[1].cancel()
                else:  # it may not have started yet: the cancel can overtake the job
                    early.add(job_id)

    threading.Thread(target=listen_for_cancels, daemon=True).start()
    while True:
        try:
            job = job_conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        if job is None:
            return
        cancel = Cancel()
        with lock:
            current[0], current[1] = job.job_id, cancel
            if early.pop(job.job_id):
                cancel.cancel()
        reply = run_job_portable(job, cancel)
        with lock:
            current[0], current[1] = None, None
        try:
            job_conn.send(reply)
        except (OSError, BrokenPipeError):
            return


class ProcessBackend(_DispatchedBackend):
    """Jobs on `size` worker processes, each with its own SQLite heap.

    `heap_limit` (bytes) caps each worker's SQLite heap (sqlite3_hard_heap_limit64), so one
    query's sort or huge string fails with an SQL error instead of eating the machine.
    Workers use the 'spawn' start method: no fork of a process that holds threads and locks.
    """

    name = "process"

    def __init__(self, size: int, *, secret: bytes, heap_limit: int | None = None, nice: int = 0,
                 grade_memory: GradeMemory | None = None):
        super().__init__(size)
        self._secret = secret
        self._heap_limit = heap_limit
        self._grade_memory = grade_memory
        self._nice = nice
        self._ctx = multiprocessing.get_context("spawn")
        self._workers: list = [None] * size
        self._cancel_locks = [threading.Lock() for _ in range(size)]
        for index in range(size):
            self._spawn(index)
        self._start_dispatchers()

    def _spawn(self, index: int) -> None:
        job_parent, job_child = self._ctx.Pipe()
        cancel_parent, cancel_child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_worker_main,
            args=(job_child, cancel_child, self._secret, self._heap_limit, self._nice, self._grade_memory),
            name=f"t2sql-worker-{index}", daemon=True,
        )
        proc.start()
        job_child.close()
        cancel_child.close()
        self._workers[index] = (proc, job_parent, cancel_parent)

    def worker_pids(self) -> list[int]:
        return [w[0].pid for w in self._workers if w is not None]

    def _call_on(self, index: int, job: Job):
        proc, job_conn, _ = self._workers[index]
        try:
            job_conn.send(job)
            return job_conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            proc.join(timeout=1)
            code = proc.exitcode
            raise WorkerLost(
                f"the worker process running this query died (exit code {code}); "
                "a query that needs more memory than the worker's limit, or a crash, does this"
            ) from e

    def _cancel_on(self, index: int, job_id: int) -> None:
        _, _, cancel_conn = self._workers[index]
        with self._cancel_locks[index]:
            cancel_conn.send(job_id)

    def _restart(self, index: int) -> None:
        proc, job_conn, cancel_conn = self._workers[index]
        for conn in (job_conn, cancel_conn):
            conn.close()
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=5)
        if not self._closed:
            self._spawn(index)

    def _close_workers(self) -> None:
        for proc, job_conn, cancel_conn in self._workers:
            try:
                job_conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        for proc, job_conn, cancel_conn in self._workers:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
            job_conn.close()
            cancel_conn.close()


class _RayWorker:
    """The body of one Ray actor: runs one job at a time; `cancel` arrives on a second
    thread of the actor (max_concurrency=2)."""

    def __init__(self, secret: bytes, heap_limit: int | None, grade_memory: GradeMemory | None = None):
        t2sql.set_hash_secret(secret)
        set_worker_heap_limit(heap_limit)
        set_worker_grade_memory(grade_memory)
        self._lock = threading.Lock()
        self._current: tuple[int, Cancel] | None = None
        self._early = _EarlyCancels()

    def run(self, job: Job):
        cancel = Cancel()
        with self._lock:
            self._current = (job.job_id, cancel)
            if self._early.pop(job.job_id):
                cancel.cancel()
        try:
            return run_job_portable(job, cancel)
        finally:
            with self._lock:
                self._current = None

    def cancel(self, job_id: int) -> None:
        with self._lock:
            if self._current is not None and self._current[0] == job_id:
                self._current[1].cancel()
            else:
                self._early.add(job_id)

    def pid(self) -> int:
        return os.getpid()


class RayBackend(_DispatchedBackend):
    """Jobs on `size` Ray actors (num_cpus=1 each). Ray must be initialised by the caller
    (`ray.init(...)`, or inside a Ray job); database paths must exist on every node."""

    name = "ray"

    def __init__(self, size: int | None, *, secret: bytes, heap_limit: int | None = None,
                 grade_memory: GradeMemory | None = None):
        import ray

        if not ray.is_initialized():
            raise RuntimeError(
                "backend='ray' needs a running Ray: call ray.init() (or run inside a Ray job) "
                "before creating the Grader"
            )
        if size is None:
            size = max(1, int(ray.cluster_resources().get("CPU", 1)))
        super().__init__(size)
        self._ray = ray
        self._actor_cls = ray.remote(num_cpus=1, max_concurrency=2, max_restarts=-1)(_RayWorker)
        self._secret = secret
        self._heap_limit = heap_limit
        self._grade_memory = grade_memory
        self._actors = [self._new_actor() for _ in range(size)]
        ray.get([a.pid.remote() for a in self._actors])  # fail here, not at the first query
        self._start_dispatchers()

    def _new_actor(self):
        # SPREAD: place the actors over every node's CPUs, not packed onto the driver's node.
        return self._actor_cls.options(scheduling_strategy="SPREAD").remote(
            self._secret, self._heap_limit, self._grade_memory)

    def _call_on(self, index: int, job: Job):
        ray = self._ray
        try:
            return ray.get(self._actors[index].run.remote(job))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
            raise WorkerLost(f"the Ray actor running this query died: {e}") from e

    def _cancel_on(self, index: int, job_id: int) -> None:
        self._actors[index].cancel.remote(job_id)

    def _restart(self, index: int) -> None:
        # max_restarts=-1 lets Ray restart the actor; a fresh handle is cheap insurance.
        try:
            self._ray.kill(self._actors[index], no_restart=True)
        except Exception:
            pass
        if not self._closed:
            self._actors[index] = self._new_actor()

    def _close_workers(self) -> None:
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:
                pass
