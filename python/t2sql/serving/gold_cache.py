"""The gold digest cache on disk, safe for many processes sharing one directory (the digests a Grader keeps
in memory: t2sql.serving.gold_memory)."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import struct
import threading
from pathlib import Path

from t2sql import (
    Digest,
    GradeSpec,
    hash_secret_id,
    set_hash_secret,
)
from t2sql.errors import GoldCacheError

log = logging.getLogger("t2sql.serving.gold_cache")


# Which cache's hash secret this process runs with (set_hash_secret is process-wide).
_installed_secret: tuple[bytes, str] | None = None
_secret_lock = threading.Lock()


def installed_secret() -> bytes | None:
    """The hash secret this process grades with, if a cache installed one."""
    return _installed_secret[0] if _installed_secret else None


def install_process_secret(secret: bytes, owner: str) -> None:
    global _installed_secret
    with _secret_lock:
        if _installed_secret is None:
            set_hash_secret(secret)
            _installed_secret = (secret, owner)
        elif _installed_secret[0] != secret:
            raise GoldCacheError(
                f"this process already grades with the hash secret of {_installed_secret[1]}; "
                f"the gold cache {owner} was made with another secret and cannot be used in the "
                "same process: use one cache directory per process (or delete that cache)"
            )


def gold_key(cache_id: str, gold_sql: str, spec: GradeSpec, version: str) -> str:
    """The cache key of a gold under a spec (the timeout is not part of it: a digest is a digest)."""
    parts = [cache_id, gold_sql, spec.method, spec.float_digits, version]
    if spec.column_order != "strict":  # strict keys stay what they were before column order existed
        parts.append(spec.column_order)
    text = json.dumps(parts, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


_MAGIC = b"t2sql-gold-digest-v1\n"


class DiskGoldCache:
    """Gold digests on disk: `<root>/gold/<k[:2]>/<k>.digest`, one file per key.

    A file is MAGIC + u32 header length + header JSON (key, secret id, the gold's SQLite
    seconds) + Digest.to_bytes() + sha256 of everything before it. Written to a temp file, fsynced
    and renamed, so a reader (in any process) sees a whole entry or none; a file that fails
    any check is reported, deleted and recomputed. `<root>/secret` holds the 32-byte hash
    secret every process using this cache installs, so their digests compare.
    """

    def __init__(self, root: Path, new_secret: bytes | None = None):
        self.root = root.resolve()
        self._new_secret = new_secret
        try:
            (self.root / "gold").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise GoldCacheError(f"cannot create the gold cache under {self.root}: {e}") from e
        self.secret = self._read_or_create_secret()
        self._lock = threading.Lock()
        self._counters = {"cache_corrupt": 0, "cache_write_errors": 0, "cache_writes": 0}

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def _count(self, name: str) -> None:
        with self._lock:
            self._counters[name] += 1

    def _read_or_create_secret(self) -> bytes:
        path = self.root / "secret"
        if not path.exists():
            try:
                self._create_secret(path)
            except OSError as e:  # a cache problem, whatever the OS said (the caller tells it from others)
                raise GoldCacheError(f"cannot create the gold cache secret {path}: {e}") from e
        try:
            secret = path.read_bytes()
        except OSError as e:
            raise GoldCacheError(f"cannot read the gold cache secret {path}: {e}") from e
        if len(secret) != 32:
            raise GoldCacheError(
                f"{path} holds {len(secret)} bytes, not a 32-byte hash secret; delete {path} and "
                f"{self.root / 'gold'} to start a fresh cache"
            )
        return secret

    def _create_secret(self, path: Path) -> None:
        # Create under a private name, then link: os.link never overwrites, so when two
        # processes race, exactly one secret wins and both read it.
        tmp = self.root / f".secret.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, self._new_secret or os.urandom(32))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)

    def path_for(self, key: str) -> Path:
        return self.root / "gold" / key[:2] / f"{key}.digest"

    def load(self, key: str, spec: GradeSpec) -> tuple[bytes, float] | None:
        """(digest bytes, the gold's SQLite seconds when it ran), or None to run the gold."""
        path = self.path_for(key)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            return self._reject(path, f"unreadable ({e})")
        try:
            if not blob.startswith(_MAGIC) or len(blob) < len(_MAGIC) + 4 + 32:
                raise ValueError("not a t2sql gold digest file")
            body, checksum = blob[:-32], blob[-32:]
            if hashlib.sha256(body).digest() != checksum:
                raise ValueError("checksum mismatch (torn or altered file)")
            (header_len,) = struct.unpack_from(">I", body, len(_MAGIC))
            start = len(_MAGIC) + 4
            header = json.loads(body[start:start + header_len])
            data = body[start + header_len:]
            if header.get("key") != key:
                raise ValueError("entry belongs to another key")
            digest = Digest.from_bytes(data)
            if digest.secret_id != hash_secret_id():
                raise ValueError("made with another hash secret")
            if (digest.method, digest.float_digits, digest.column_order) != (spec.method, spec.float_digits,
                                                                                spec.column_order):
                raise ValueError("method, float_digits or column order differ from the key")
            elapsed_s = float(header.get("elapsed_s", 0.0))
        except Exception as e:  # any fault in a cache file means: drop it and run the gold
            return self._reject(path, f"{type(e).__name__}: {e}")
        return data, elapsed_s

    def _reject(self, path: Path, why: str) -> None:
        log.warning("gold cache entry %s is unusable (%s): deleted, the gold runs again", path, why)
        self._count("cache_corrupt")
        try:
            path.unlink()
        except OSError:
            pass
        return None

    def store(self, key: str, data: bytes, elapsed_s: float = 0.0) -> bool:
        """Write one entry; a failure (full disk, read-only) is reported and the grader goes
        on without it: the digest stays in memory."""
        path = self.path_for(key)
        header = json.dumps({"key": key, "secret_id": hash_secret_id(), "elapsed_s": elapsed_s}).encode()
        body = _MAGIC + struct.pack(">I", len(header)) + header + data
        blob = body + hashlib.sha256(body).digest()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                view = memoryview(blob)
                while view:
                    n = _os_write(fd, view)
                    view = view[n:]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            what = "the disk is full" if e.errno == errno.ENOSPC else str(e)
            log.warning("could not write gold cache entry %s (%s); continuing without it", path, what)
            self._count("cache_write_errors")
            return False
        self._count("cache_writes")
        return True


_os_write = os.write  # the cache's only write path (tests make it fail with ENOSPC)
