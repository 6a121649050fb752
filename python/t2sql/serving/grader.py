"""The Grader: tool calls and grades at training scale, over the Rust core. One Grader owns the SQL workers (the one
concurrency limit), connections per worker per database, the jobs it runs without knowing their insides (the
equivalence check), the gold cache, timeouts and retry, the temporary-disk bound and the manifest check; its calls
never block the event loop. docs/grader.md, "What one Grader owns"."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from t2sql import (
    Cancel,
    DatabaseError,
    Digest,
    GradeSpec,
    HashSecretMismatch,
    QueryTimeout,
    SqlError,
    ToolLimits,
    ToolResult,
    UnsafeQuery,
    hash_secret_id,
    set_grade_memory,
    sqlite_version,
)
from t2sql.grading import grade_memory_setting
from t2sql.serving.admission import CALLS_PER_ITERATION, Admission
from t2sql.serving.gold_cache import DiskGoldCache, gold_key, install_process_secret, installed_secret
from t2sql.serving.gold_memory import GoldKey, gold_memory
from t2sql.serving.jobs import (
    CallJob,
    DigestJob,
    GradeJob,
    Job,
    ToolJob,
    WorkerLost,
    next_job_id,
)
from t2sql.serving.manifest import FileIdentity, GraderIdentity, Manifest, file_identity
from t2sql.serving.process_backends import ProcessBackend, RayBackend
from t2sql.serving.results import GoldResult, GradeResult, gold_failure_detail
from t2sql.serving.settings import GraderSettings
from t2sql.serving.temp_disk import temp_disk_bound
from t2sql.serving.thread_backend import ThreadBackend


class Grader:
    def __init__(self, settings: GraderSettings | None = None, /, **changes: Any):
        """`settings`: how it runs (GraderSettings, every field described there); keyword arguments are
        GraderSettings fields, changed from `settings` or from the defaults: `Grader(concurrency=2)`."""
        s = settings or GraderSettings()
        if changes:
            s = dataclasses.replace(s, **changes)
        self.settings = s
        manifest = s.manifest
        if manifest is not None and not isinstance(manifest, Manifest):
            manifest = Manifest.load(manifest)
        self.manifest: Manifest | None = manifest  # loaded
        self._sqlite_version = sqlite_version()

        self._disk: DiskGoldCache | None = None
        secret: bytes | None = None
        if s.cache_dir is not None:
            # A new cache adopts the secret this process already grades with, so one process
            # can use several cache directories; an existing cache keeps its own secret.
            self._disk = DiskGoldCache(Path(s.cache_dir), installed_secret())
            secret = self._disk.secret
            install_process_secret(secret, str(self._disk.root))

        memory = grade_memory_setting(s.grade_memory_mb, s.tmp_dir)
        self._restore_memory: tuple | None = None  # the process's setting, put back by close()
        if s.backend == "thread":
            if memory is not None:
                self._restore_memory = set_grade_memory(*memory)
            self._backend = ThreadBackend(s.concurrency or os.cpu_count() or 1, nice=s.worker_nice)
            self._secret_tag = None  # the process secret, read per call (hash_secret_id)
        else:
            if secret is None:
                secret = os.urandom(32)  # workers share it, so a digest made by one grades on any
            self._secret_tag = hashlib.sha256(secret).hexdigest()[:16]
            if s.backend == "process":
                self._backend = ProcessBackend(
                    s.concurrency or os.cpu_count() or 1, secret=secret, heap_limit=s.worker_heap_limit,
                    nice=s.worker_nice, grade_memory=memory,
                )
            else:
                self._backend = RayBackend(s.concurrency, secret=secret, heap_limit=s.worker_heap_limit,
                                           grade_memory=memory)
        self.concurrency = self._backend.size
        self.temp_disk_bound_mb = temp_disk_bound(s.max_temp_mb, self.concurrency, local=s.backend != "ray")

        self._lock = threading.Lock()
        self._identities: dict[str, GraderIdentity] = {}
        self._memory = gold_memory(s.gold_memory_entries, s.gold_memory_bytes)
        self._inflight: dict[tuple, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._admissions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> Admission
        self._last_admission: tuple[weakref.ref, Admission] | None = None  # the common case: one loop
        self._io = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="t2sql-cache-io")
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        self._sync_thread: threading.Thread | None = None
        self._closed = False
        self._counters = {
            "tool_calls": 0,
            "grades": 0,
            "retries": 0,
            "gold_memory_hits": 0,
            "gold_disk_hits": 0,
            "gold_computed": 0,
            "gold_failures": 0,
        }

    # ------------------------------------------------------------------ public asyncio API

    async def run_tool(self, db_path: str, sql: str, limits: ToolLimits) -> ToolResult:
        """One `execute_sql_query` call under `limits` (a preset's: Preset.tool_limits; the preview is
        the preset's alone, so there is no default). Raises UnsafeQuery / SqlError / QueryTimeout /
        DatabaseError exactly like Database.run_tool."""
        identity = await self._enter(db_path)
        self._count("tool_calls")
        return await self._submit(ToolJob(db_path, identity.stat, sql, limits, job_id=next_job_id()))

    async def grade(self, db_path: str, pred_sql: str, gold_sql: str, spec: GradeSpec | None = None, *,
                    retry: bool = True) -> GradeResult:
        """Grade `pred_sql` against `gold_sql` under `spec` (a task's: Preset.grade_spec(task), its
        method resolved against this gold; None: GradeSpec() with this Grader's grade_timeout_s).
        SQL problems are outcomes, never exceptions; a missing or changed database raises
        DatabaseError. A prediction or gold that timed out is tried once more (a busy machine
        should not cost a rollout its reward); retry=False keeps the first attempt's verdict, as
        t2sql.grade gives it (`t2sql grade --pairs`)."""
        started = time.perf_counter()
        identity = await self._enter(db_path)
        spec = self._grade_spec if spec is None else spec
        self._count("grades")
        retried = False
        for attempt in (0, 1) if retry else (1,):
            gold = await self._gold(db_path, identity, gold_sql, spec)
            if not gold.ok:
                if gold.outcome == "gold_timeout" and attempt == 0:
                    retried = True
                    self._count("retries")
                    continue
                return _gold_failed(gold, retried, started, spec.method)
            try:
                verdict = await self._grade_prediction(db_path, identity, pred_sql, gold, spec)
            except HashSecretMismatch:
                # The process's secret changed (set_hash_secret) after this gold was made: its
                # cache key no longer matches, so this runs the gold again under the new one.
                gold = await self._gold(db_path, identity, gold_sql, spec)
                if not gold.ok:
                    return _gold_failed(gold, retried, started, spec.method)
                verdict = await self._grade_prediction(db_path, identity, pred_sql, gold, spec)
            if verdict.outcome == "pred_timeout" and attempt == 0:
                retried = True
                self._count("retries")
                continue
            return dataclasses.replace(
                verdict, retried=retried, gold_rows=verdict.gold_rows if verdict.gold_rows is not None else gold.rows,
                elapsed_s=time.perf_counter() - started, method=verdict.method or spec.method,
                gold_cached=gold.source != "computed",
            )
        raise AssertionError("unreachable: the second attempt always returns")

    async def gold(self, db_path: str, gold_sql: str, spec: GradeSpec | None = None) -> GoldResult:
        """The gold query's digest under `spec` (as grade's), from the cache or run now (and cached
        if it succeeded).

        Concurrent requests for the same gold share one run. A failed or timed-out gold is
        not cached: the next request runs it again."""
        identity = await self._enter(db_path)
        return await self._gold(db_path, identity, gold_sql, self._grade_spec if spec is None else spec)

    async def run_call(self, db_path: str, call: Callable[[Cancel | None], Any], *, counter: str) -> Any:
        """`call(cancel)` as one job on one SQL worker, for work the Grader does not know the insides of
        (t2sql.equivalence.job): the manifest check and admission of `db_path` as for any job, one
        slot of the one concurrency limit, counted in stats() under `counter`. `call` must pickle
        (a module-level function or a partial of one) for the process and Ray backends. Cancelling
        the awaiting task fires the Cancel it was handed."""
        identity = await self._enter(db_path)
        self._count(counter)
        return await self._submit(CallJob(db_path, identity.stat, call, job_id=next_job_id()))

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    # ------------------------------------------------------------------ blocking API

    def run_tool_sync(self, db_path: str, sql: str, limits: ToolLimits) -> ToolResult:
        self._check_open()
        return self._run_sync(self.run_tool(db_path, sql, limits))

    def grade_sync(self, db_path: str, pred_sql: str, gold_sql: str, spec: GradeSpec | None = None) -> GradeResult:
        self._check_open()
        return self._run_sync(self.grade(db_path, pred_sql, gold_sql, spec))

    def gold_sync(self, db_path: str, gold_sql: str, spec: GradeSpec | None = None) -> GoldResult:
        self._check_open()
        return self._run_sync(self.gold(db_path, gold_sql, spec))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._backend.close()
        self._io.shutdown(wait=True)
        if self._restore_memory is not None:
            previous_bytes, previous_dir = self._restore_memory
            try:
                set_grade_memory(previous_bytes, previous_dir)
            except ValueError:  # the earlier directory is gone: the system's then
                set_grade_memory(previous_bytes, None)
        if self._sync_loop is not None:
            self._sync_loop.call_soon_threadsafe(self._sync_loop.stop)
            self._sync_thread.join(timeout=10)
            self._sync_loop.close()

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    async def __aenter__(self) -> Grader:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    def stats(self) -> dict[str, int]:
        """Counters since creation (calls, retries, gold cache hits/misses, cache faults), temp_disk_bound_mb."""
        with self._lock:
            out = dict(self._counters, temp_disk_bound_mb=self.temp_disk_bound_mb)
        out["gold_memory_held"], out["gold_memory_evicted"] = len(self._memory), self._memory.evicted
        if self._disk is not None:
            out.update(self._disk.counters())
        return out

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this Grader is closed; create a new one")

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] = self._counters.get(name, 0) + n

    @functools.cached_property
    def _grade_spec(self) -> GradeSpec:
        """What grade and gold get without a spec: GradeSpec() with this Grader's grade_timeout_s
        and max_temp_mb, built at the first such call, which is where an unusable grade_timeout_s
        (inf, nan) is refused."""
        return GradeSpec(timeout_s=float(self.settings.grade_timeout_s), max_temp_mb=self.settings.max_temp_mb)

    def _secret_id(self) -> str:
        return self._secret_tag or hash_secret_id()

    async def _submit(self, job: Job):
        fut, cancel = self._backend.submit_async(job, asyncio.get_running_loop())
        try:
            return await fut
        except asyncio.CancelledError:
            cancel.cancel()  # queued: never runs; running: SQLite stops at its next progress check
            raise

    async def _enter(self, db_path: str) -> GraderIdentity:
        """The start of every public call: refuse a closed Grader, wait for admission, and
        return the file's identity (checked again if it changed)."""
        self._check_open()
        ticket = self._admit()
        if ticket is not None:
            await ticket
        return self._known_identity(db_path) or await self._new_identity(db_path)

    def _admit(self) -> asyncio.Future | None:
        """None, or a future to await first if a burst of calls is under way on this loop
        (see Admission)."""
        loop = asyncio.get_running_loop()
        last = self._last_admission
        if last is not None and last[0]() is loop:
            return last[1].enter(loop)
        admission = self._admissions.get(loop)  # one per loop: the sync API has a loop of its own
        if admission is None:
            admission = self._admissions[loop] = Admission(CALLS_PER_ITERATION)
        self._last_admission = (weakref.ref(loop), admission)
        return admission.enter(loop)

    def _identity_now(self, db_path: str) -> FileIdentity:
        try:
            return file_identity(db_path)
        except FileNotFoundError:
            raise DatabaseError(
                f"database file not found: {db_path}; check --db-root and the task's db_id"
            ) from None
        except OSError as e:
            raise DatabaseError(f"cannot read database file {db_path}: {e}") from None

    def _known_identity(self, db_path: str) -> GraderIdentity | None:
        """The file's identity if it is unchanged since it was checked, else None (then
        _new_identity checks it). Three stats cost microseconds, so they run on the loop, for
        every call: a file changed under a running Grader (its content, its times, its inode, or
        a writer's -wal/-journal beside it) is seen at the next call that touches it."""
        now = self._identity_now(db_path)
        known = self._identities.get(db_path)
        if known is not None and known.file == now:
            return known
        return None

    async def _new_identity(self, db_path: str) -> GraderIdentity:
        """A file seen for the first time or changed: checked against the manifest (whose
        sha256 runs in a thread) and recorded."""
        now = self._identity_now(db_path)
        if self.manifest is not None:
            entry = await asyncio.get_running_loop().run_in_executor(
                self._io, functools.partial(self.manifest.verify, db_path, now,
                                            hash_always=bool(self.settings.hash_databases))
            )
            cache_id = "sha256:" + entry.sha256
        else:
            cache_id = (f"file:{os.path.realpath(db_path)}:{now.size}:{now.mtime_ns}:{now.ctime_ns}:"
                        f"{now.inode}:{now.device}:{now.side}")
        identity = GraderIdentity(now, (now.size, now.version), cache_id)
        with self._lock:
            self._identities[db_path] = identity
        return identity

    async def _gold(self, db_path, identity, gold_sql: str, spec: GradeSpec) -> GoldResult:
        memory_key = GoldKey(identity.cache_id, gold_sql, spec.method, spec.float_digits, spec.column_order,
                             self._secret_id())
        hit = self._memory.get(memory_key)
        if hit is not None:
            self._count("gold_memory_hits")
            return hit
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._inflight.get(memory_key)
            if entry is None or entry[0] is not loop:
                task = loop.create_task(self._load_or_run_gold(memory_key, db_path, identity, gold_sql, spec))
                self._inflight[memory_key] = (loop, task)
            else:
                task = entry[1]
        # Shielded: one waiter's cancellation must not fail the others waiting on this gold.
        return await asyncio.shield(task)

    async def _load_or_run_gold(self, memory_key: GoldKey, db_path, identity, gold_sql: str,
                                spec: GradeSpec) -> GoldResult:
        loop = asyncio.get_running_loop()
        key = gold_key(identity.cache_id, gold_sql, spec, self._sqlite_version)  # the disk cache's
        try:
            result = None
            if self._disk is not None:
                found = await loop.run_in_executor(self._io, self._disk.load, key, spec)
                if found is not None:
                    data, elapsed_s = found
                    d = Digest.from_bytes(data)
                    result = GoldResult("ok", "", d.rows, d.columns, elapsed_s, "disk", data)
                    self._count("gold_disk_hits")
            if result is None:
                result = await self._run_gold(db_path, identity, gold_sql, spec)
                if result.ok and self._disk is not None:
                    await loop.run_in_executor(self._io, self._disk.store, key, result.digest, result.elapsed_s)
            if result.ok:
                self._memory.put(memory_key, dataclasses.replace(result, source="memory"))
            return result
        finally:
            with self._lock:
                entry = self._inflight.get(memory_key)
                if entry is not None and entry[1] is asyncio.current_task():
                    del self._inflight[memory_key]

    async def _run_gold(self, db_path, identity, gold_sql: str, spec: GradeSpec) -> GoldResult:
        job = DigestJob(db_path, identity.stat, gold_sql, spec, job_id=next_job_id())
        started = time.perf_counter()
        try:
            data, elapsed_s = await self._submit(job)
        except (QueryTimeout, UnsafeQuery, SqlError) as e:  # WorkerLost is an SqlError
            self._count("gold_failures")
            outcome = "gold_timeout" if isinstance(e, QueryTimeout) else "gold_error"
            return GoldResult(outcome, gold_failure_detail(e), None, None, time.perf_counter() - started, "failed")
        d = Digest.from_bytes(data)
        self._count("gold_computed")
        return GoldResult("ok", "", d.rows, d.columns, elapsed_s, "computed", data)

    async def _grade_prediction(self, db_path, identity, pred_sql, gold: GoldResult, spec: GradeSpec) -> GradeResult:
        """The core's verdict as a GradeResult (grade() then fills in the call's own fields)."""
        job = GradeJob(db_path, identity.stat, pred_sql, gold.digest, spec.timeout_s, spec.max_temp_mb, next_job_id())
        try:
            return GradeResult.from_verdict(await self._submit(job))
        except UnsafeQuery as e:
            return GradeResult("unsafe", str(e), False, None, gold.rows, 0.0, "")
        except QueryTimeout as e:
            return GradeResult("pred_timeout", str(e), False, None, gold.rows, 0.0, "")
        except WorkerLost as e:
            return GradeResult("pred_error", str(e), False, None, gold.rows, 0.0, "")
        except DatabaseError:
            raise
        except SqlError as e:
            return GradeResult("pred_error", str(e), False, None, gold.rows, 0.0, "")

    def _run_sync(self, coro):
        self._check_open()
        with self._lock:
            if self._sync_loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="t2sql-grader-sync", daemon=True)
                thread.start()
                self._sync_loop, self._sync_thread = loop, thread
        return asyncio.run_coroutine_threadsafe(coro, self._sync_loop).result()


def _gold_failed(gold: GoldResult, retried: bool, started: float, method: str) -> GradeResult:
    """grade()'s result when the gold query itself failed or timed out."""
    return GradeResult(gold.outcome, gold.detail, retried, None, None, time.perf_counter() - started,
                       method, False)
