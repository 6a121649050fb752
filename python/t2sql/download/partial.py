"""A download's state on disk: `DEST.part`, which grows in place, and its sidecar `DEST.part.json` (which version of
which file the kept bytes are of); a kept prefix is resumable when its size is known and a validator can guard the
Range request. `bytes_to_fetch`, `free_bytes` and `check_free_space` are the disk a download still needs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from t2sql.errors import NoSpaceError
from t2sql.progress import format_bytes

SIDECAR_FORMAT = 1


def part_path(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".part")


def sidecar_path(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".part.json")


def bytes_to_fetch(dest: str | os.PathLike, size: int, url: str | None = None) -> int:
    """Bytes a download of `dest` (a file of `size` bytes) still has to fetch, which is also the disk it
    still needs: 0 when `dest` exists; `size` minus the kept prefix when a `.part` of that size's file can
    be resumed (from `url`, when given: a size and a validator recorded); else `size`."""
    dest = Path(dest)
    if dest.exists():
        return 0
    meta = read_sidecar(sidecar_path(dest))
    try:
        have = part_path(dest).stat().st_size
    except OSError:
        have = 0
    if meta is None or not rangeable(meta) or meta["size"] != size or have > size or (
            url is not None and meta.get("url") != url):
        return size
    return size - have


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes (for this user) on the file system that holds `path`, or would hold it once created."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def check_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Raise NoSpaceError unless the file system of `path` has `needed` bytes free; `what` says what for."""
    free = free_bytes(path)
    if free < needed:
        raise NoSpaceError(
            f"not enough disk space in {path} for {what}: {format_bytes(needed)} needed, {format_bytes(free)} "
            f"free; free {format_bytes(needed - free)} there or choose a folder on a larger disk",
            path=str(path), needed=needed, free=free)


def read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == SIDECAR_FORMAT else None


def rangeable(meta: dict[str, Any]) -> bool:
    """A kept prefix can be asked to continue: its file's size is known, and a validator guards the Range."""
    return isinstance(meta.get("size"), int) and bool(strong_etag(meta.get("etag")) or meta.get("last_modified"))


def strong_etag(etag: object) -> bool:
    return isinstance(etag, str) and etag.startswith('"')
