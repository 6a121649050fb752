"""Where the equivalence check keeps what it learns about a database file (its invariants, its suite):
JSON entries on disk named by the file's identity, written atomically, safe for many processes."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from t2sql.atomic import write_bytes_atomic
from t2sql.errors import DatabaseError
from t2sql.home import default_dir

CACHE_ENV = "T2SQL_EQUIVALENCE_CACHE"  # where invariants and suites are kept on disk

def cache_dir() -> Path:
    """Where invariants and suites are kept: $T2SQL_EQUIVALENCE_CACHE, else t2sql.home's rule
    ($T2SQL_HOME/cache/equivalence, else $XDG_CACHE_HOME/t2sql/equivalence, else ~/.cache/t2sql/equivalence)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    return default_dir("equivalence")

def database_key(path: str) -> str:
    """What names a database file's cache entries: its size, mtime and the SQLite header's first 100
    bytes (its change counter included), hashed. A changed file is another key."""
    import hashlib

    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO or a device is never opened (a read would block)
            raise DatabaseError(f"{path} is not a regular file; the equivalence check reads database files only")
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as e:
        raise DatabaseError(f"cannot read database file {path}: {e.strerror}") from None
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{st.st_size}:{st.st_mtime_ns}:".encode() + header)
    return f"{Path(path).stem[:40]}-{h.hexdigest()}"


class DiskCache:
    """JSON entries under one directory, written atomically; an unreadable or stale entry is rebuilt.
    Safe for many processes (the last writer of identical content wins)."""

    def __init__(self, root: Path | None = None):
        self.root = root

    def _root(self) -> Path:
        return self.root if self.root is not None else cache_dir()

    def load(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self._root() / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def store(self, name: str, data: dict[str, Any]) -> bool:
        """False when the directory cannot be written (the entry is then kept in memory only)."""
        root = self._root()
        try:
            root.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(root / name, json.dumps(data, separators=(",", ":")).encode())
            return True
        except OSError:
            return False
