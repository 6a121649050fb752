"""The temporary disk a Grader can fill at worst (`concurrency x max_temp_mb`, each query's SQLite temporary files
capped by the core), and the one-line warning at start when the disk holds less.
docs/grader.md, "What one Grader owns"."""

from __future__ import annotations

import logging
import shutil

from t2sql._grader import sqlite_temp_dir

log = logging.getLogger("t2sql.serving.temp_disk")

MIB = 2**20


def temp_disk_bound(max_temp_mb: int, concurrency: int, *, local: bool = True) -> int:
    """MiB of temporary files `concurrency` queries capped at `max_temp_mb` each can hold at once. When
    the queries run on this machine (`local`), a bound above the free space of SQLite's temporary
    directory is warned about in one line (check_free_space)."""
    bound = max_temp_mb * concurrency
    if local:
        check_free_space(bound, max_temp_mb, concurrency)
    return bound


def check_free_space(bound_mb: int, max_temp_mb: int, concurrency: int) -> str | None:
    """Warn (one line, on the `t2sql.serving.temp_disk` logger) when SQLite's temporary directory has
    less than `bound_mb` MiB free; returns the warning, or None when there is room (or no directory to
    check)."""
    directory = sqlite_temp_dir()
    if directory is None:
        return None
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return None
    if free >= bound_mb * MIB:
        return None
    warning = (f"temporary disk: {directory} has {free // MIB} MiB free, below the {bound_mb} MiB that "
               f"{concurrency} queries of up to {max_temp_mb} MiB each (max_temp_mb) could hold at once; "
               "a query may then fail on a full disk: lower max_temp_mb or the concurrency, or point "
               "SQLITE_TMPDIR at a larger disk")
    log.warning(warning)
    return warning
