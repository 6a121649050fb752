"""Where the equivalence check keeps what it learns about a database file (its invariants, its suite): JSON entries
on disk named by the file's content digest (`database_key`), written atomically, with a lock file beside each
(`DiskCache.lock`) so one process builds an entry while others wait. An entry that does not read back whole is
no entry: the caller builds it again."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Iterator

from t2sql._grader import file_digest
from t2sql.atomic import read_head, write_bytes_atomic
from t2sql.equivalence import checkbounds
from t2sql.errors import DatabaseError
from t2sql.home import default_dir

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

# A lock file's owner touches it this often; one untouched for LOCK_STALE_S (its owner killed, its machine
# gone) or whose owner process is gone from this machine is taken over.
LOCK_TOUCH_S = 30.0
LOCK_STALE_S = 300.0

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

    @contextlib.contextmanager
    def lock(self, name: str) -> Iterator[bool]:
        """Hold the lock file `name` for the block: True when this process holds it (or the directory
        cannot be written, so no other process can build the entry there either), False when another
        live process holds it. Taken atomically (O_EXCL); a stale lock is taken over. At worst two
        processes build the same entry, never a wrong one (entries are written atomically)."""
        path = self._root() / name
        held = _take(path)
        if held is None:
            yield True
            return
        if not held:
            yield False
            return
        stop = threading.Event()
        toucher = threading.Thread(target=_touch, args=(path, stop), daemon=True, name="t2sql-lock")
        toucher.start()
        try:
            yield True
        finally:
            stop.set()
            toucher.join()
            with contextlib.suppress(OSError):
                os.unlink(path)


def _take(path: Path) -> bool | None:
    """True: taken; False: another's; None: cannot be taken here (no writable directory)."""
    owner = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}).encode()
    for _ in range(3):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if not _stale(path):
                return False
            # Moved aside before removal, so that of two processes taking over one stale lock the second
            # finds nothing to move and goes back to O_EXCL.
            aside = path.with_name(f"{path.name}.stale-{os.getpid()}-{threading.get_ident()}")
            with contextlib.suppress(OSError):
                os.rename(path, aside)
                os.unlink(aside)
            continue
        except OSError:
            return None
        try:
            os.write(fd, owner)
        finally:
            os.close(fd)
        return True
    return False


def _stale(path: Path) -> bool:
    try:
        st = os.stat(path)
        owner = json.loads(read_head(path, 4096).decode("utf-8") or "{}")
    except (OSError, ValueError):
        return False  # gone (retried), or being written this instant
    if time.time() - st.st_mtime > LOCK_STALE_S:
        return True
    if isinstance(owner, dict) and owner.get("host") == socket.gethostname() and isinstance(owner.get("pid"), int):
        try:
            os.kill(owner["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
    return False


def _touch(path: Path, stop: threading.Event) -> None:
    while not stop.wait(LOCK_TOUCH_S):
        with contextlib.suppress(OSError):
            os.utime(path)
