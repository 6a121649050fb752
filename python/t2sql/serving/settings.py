"""GraderSettings: everything a Grader is opened with, as one frozen value (t2sql.serving.grader)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from t2sql._grader import GRADE_DEFAULTS

if TYPE_CHECKING:
    from t2sql.serving.manifest import Manifest

BACKENDS = ("thread", "process", "ray")

# How much nicer than the event loop's thread the SQL workers run (see GraderSettings.worker_nice).
DEFAULT_WORKER_NICE = 10


@dataclass(frozen=True)
class GraderSettings:
    """How a Grader runs. `Grader(settings)`; `Grader(concurrency=2)` is `Grader(GraderSettings(concurrency=2))`.

    concurrency: SQL jobs at once (default: os.cpu_count(); for Ray: the cluster's CPUs).
    cache_dir: keep gold digests on disk here too (shared safely by several processes).
    grade_timeout_s, max_temp_mb: what a grade or gold given no GradeSpec runs under (the core's defaults;
        an episode's Grader takes its preset's: t2sql.episode.rollout.open_grader). max_temp_mb also bounds
        the whole Grader: N workers hold N times it at most (temp_disk_bound_mb, in stats():
        t2sql.serving.temp_disk).
    backend: "thread" | "process" | "ray" (Ray must already be initialised).
    manifest: a Manifest or the path of one; databases not matching it are refused.
    hash_databases: with a manifest, check each database's sha256 at its first use in this
        Grader even when its size, times and inode match the manifest (t2sql.serving.manifest).
    worker_heap_limit: bytes of SQLite heap per worker process/actor (process and ray only).
    worker_nice: OS niceness added to the SQL worker threads and processes (Linux; 0 to
        leave them alone), so that the thread running the event loop wins a core the moment
        it wakes: on a machine with no idle core this cuts the loop's 99th-percentile stall
        from about 4 ms (one scheduler slice) to 1-3 ms on the 2-core test VM.
    grade_memory_mb: MiB of row keys one set or subset digest holds before it spills to disk
        (t2sql.set_grade_memory; default GRADE_DEFAULTS["memory_mb"]). Per running digest:
        with N workers, up to N times this. With the thread backend it is the whole process's
        setting while this Grader is open (close() puts the previous one back).
    tmp_dir: where digests past their memory spill (anonymous files, gone when the digest
        is); default: the process's setting (the system's temporary directory), not cache_dir,
        which a thread backend's process-wide setting would outlive.
    gold_memory_entries, gold_memory_bytes: bounds of the gold digests kept in memory (serving.gold_memory).
    """

    concurrency: int | None = None
    cache_dir: str | os.PathLike | None = None
    grade_timeout_s: float = GRADE_DEFAULTS["timeout_s"]
    max_temp_mb: int = GRADE_DEFAULTS["max_temp_mb"]
    backend: str = "thread"
    manifest: Manifest | str | os.PathLike | None = None
    hash_databases: bool = False
    worker_heap_limit: int | None = None
    worker_nice: int = DEFAULT_WORKER_NICE
    grade_memory_mb: int | None = None
    tmp_dir: str | os.PathLike | None = None
    gold_memory_entries: int | None = None
    gold_memory_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}: choose one of {', '.join(BACKENDS)}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.grade_timeout_s <= 0:
            raise ValueError("grade_timeout_s must be positive")
