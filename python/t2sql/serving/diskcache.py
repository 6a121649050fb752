"""Where the equivalence check keeps what it learns about a database file (its invariants, its suite):
JSON entries on disk named by the file's content (`database_key`: a digest of every byte, never its
name, size or mtime, which another file can share), written atomically, safe for many processes. An
entry that cannot be read whole (too large, not JSON, nested past any real entry) is no entry: the
caller builds it again."""

from __future__ import annotations

import json
import os
import stat
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from t2sql._grader import file_digest
from t2sql.atomic import read_head, write_bytes_atomic
from t2sql.errors import DatabaseError
from t2sql.home import default_dir
from t2sql.serving import checkbounds

CACHE_ENV = "T2SQL_EQUIVALENCE_CACHE"  # where invariants and suites are kept on disk

def cache_dir() -> Path:
    """Where invariants and suites are kept: $T2SQL_EQUIVALENCE_CACHE, else t2sql.home's rule
    ($T2SQL_HOME/cache/equivalence, else $XDG_CACHE_HOME/t2sql/equivalence, else ~/.cache/t2sql/equivalence)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return default_dir("equivalence")

# Content digests remembered per file version in this process: (dev, inode, size, mtime_ns, ctime_ns) ->
# digest. A write changes the ctime (to the nanosecond), so a changed file is read again.
DIGESTS_KEPT = 4096
_digests: OrderedDict[tuple[int, ...], str] = OrderedDict()
_digests_lock = threading.Lock()

# An entry larger than this is not one the check wrote (a suite of a few dozen small databases, a
# schema's invariants): it is not read.
MAX_ENTRY_BYTES = 64 * 1024 * 1024


def database_key(path: str) -> str:
    """What names a database file's cache entries: the XXH3-128 of its bytes (t2sql._grader.file_digest,
    read once per file version in a process), after the file's stem for a reader of the folder. Another
    file with the same content shares the key; any changed byte makes another."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise DatabaseError(f"cannot read database file {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or a device is never opened (a read would block)
        raise DatabaseError(f"{path} is not a regular file; the equivalence check reads database files only")
    version = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _digests_lock:
        digest = _digests.get(version)
    if digest is None:
        # Read once per file version, at disk speed (a 1 GB database: about a second, the first check of
        # it pays), stopped by the check's Cancel.
        digest = file_digest(path, cancel=checkbounds.current().cancel)
        with _digests_lock:
            _digests[version] = digest
            while len(_digests) > DIGESTS_KEPT:
                _digests.popitem(last=False)
    return f"{Path(path).stem[:40]}-{digest}"


class DiskCache:
    """JSON entries under one directory, written atomically; an unreadable or stale entry is rebuilt.
    Safe for many processes (the last writer of identical content wins)."""

    def __init__(self, root: Path | None = None):
        self.root = root

    def _root(self) -> Path:
        return self.root if self.root is not None else cache_dir()

    def load(self, name: str) -> dict[str, Any] | None:
        """The entry as a dict, or None when there is none or it cannot be read whole (a FIFO or device
        in its place, over MAX_ENTRY_BYTES, not UTF-8 JSON, nested too deep to parse, not an object)."""
        try:
            data = read_head(self._root() / name, MAX_ENTRY_BYTES + 1)
        except OSError:
            return None
        if not data or len(data) > MAX_ENTRY_BYTES:
            return None
        try:
            entry = json.loads(data.decode("utf-8"))
        except (ValueError, RecursionError):
            return None
        return entry if isinstance(entry, dict) else None

    def store(self, name: str, data: dict[str, Any]) -> bool:
        """False when the directory cannot be written (the entry is then kept in memory only)."""
        root = self._root()
        try:
            root.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(root / name, json.dumps(data, separators=(",", ":")).encode())
            return True
        except OSError:
            return False
