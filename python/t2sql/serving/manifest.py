"""Database identity (`file_identity`: size, times, inode and device, and a writer's side files) and the database
manifest (each file's size, times, inode and sha256), which guard a Grader whose connections open databases
`immutable=1` against a file that changes under it. docs/grader.md, "What one Grader owns" (file identity,
manifest) and its `t2sql gold` section (the manifest's format)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

from t2sql import DatabaseError
from t2sql.atomic import OutputFile
from t2sql.databases import file_kind
from t2sql.errors import UnknownDatabase
from t2sql.tasks import find_database, list_databases

MANIFEST_VERSION = 1
MANIFEST_FORMAT = "t2sql-database-manifest"
# How a manifest begins as `save` writes it (json.dumps, indent 1); before "format" it began with the version.
_MANIFEST_HEAD = re.compile(rb'\{\s*("format":\s*"' + MANIFEST_FORMAT.encode() + rb'"|"version":\s*1,\s*"db_root":)')


# The most a manifest file may hold: about 200 bytes a database, so some 80,000 databases. A manifest is
# parsed whole; the bound keeps a path such as /dev/zero or a stray multi-GB file from filling memory.
MAX_MANIFEST_BYTES = 16 << 20


def manifest_file_problem(st: os.stat_result) -> str | None:
    """Why a file with this stat cannot be read as a manifest (not a regular file, over MAX_MANIFEST_BYTES),
    or None: the one rule the settings check (t2sql.episode.rollout) and `Manifest.load` apply."""
    if not stat.S_ISREG(st.st_mode):
        return f"is {file_kind(st.st_mode)}, not a regular file"
    if st.st_size > MAX_MANIFEST_BYTES:
        return f"is {st.st_size:,} bytes, over the {MAX_MANIFEST_BYTES:,} a manifest may have"
    return None


def _manifest_bytes(path: str | os.PathLike) -> bytes:
    """The manifest file's bytes: opened without blocking (a FIFO is refused by its fstat, never waited
    on), read up to MAX_MANIFEST_BYTES. FileNotFoundError, or ValueError saying what the path is."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        problem = manifest_file_problem(os.fstat(fd))
        if problem is not None:
            raise ValueError(f"{path} {problem}")
        os.set_blocking(fd, True)
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path} grew past the {MAX_MANIFEST_BYTES:,} bytes a manifest may have while it was read")
    return data


def is_manifest(head: bytes) -> bool:
    """Whether a file that begins with `head` is a database manifest t2sql wrote."""
    return _MANIFEST_HEAD.match(head) is not None


def manifest_output(path: str | os.PathLike, *, flag: str = "manifest", force: bool = False,
                    inputs: Iterable[tuple[str, str | os.PathLike]] = (), instead: str | None = None) -> OutputFile:
    """Where a manifest is written, under t2sql.atomic's rule: a manifest is replaced, any other file only
    with `force`, and never one of the run's `inputs`."""
    return OutputFile(path, flag=flag, kind="a t2sql database manifest", own=is_manifest, force=force,
                      inputs=inputs, instead=instead)


class DatabaseChanged(DatabaseError):
    """A database file differs from the manifest recorded when the data was prepared."""


# Files beside a database that mean a writer is (or was) at work on it.
WRITER_SIDE_FILES = ("-wal", "-journal")


class FileIdentity(NamedTuple):
    """What a database file is, as cheaply as the file system can say it (three stat calls)."""

    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int
    side: tuple[tuple[int, int, int], ...]  # (index in WRITER_SIDE_FILES, size, mtime_ns) per side file

    @property
    def version(self) -> int:
        """One number that changes whenever any field but the size does (connection caches key
        on (size, version))."""
        return hash((self.mtime_ns, self.ctime_ns, self.inode, self.device, self.side)) & (2**63 - 1)

    def writer_file(self, path: str | os.PathLike) -> str | None:
        """The first non-empty side file (a writer at work, or one that died mid-transaction)."""
        for index, size, _ in self.side:
            if size > 0:
                return f"{path}{WRITER_SIDE_FILES[index]}"
        return None


def file_identity(path: str | os.PathLike) -> FileIdentity:
    """The identity of the file at `path`; raises OSError (FileNotFoundError) as os.stat does."""
    st = os.stat(path)
    side = []
    for index, suffix in enumerate(WRITER_SIDE_FILES):
        try:
            sst = os.stat(f"{path}{suffix}")
        except OSError:
            continue
        side.append((index, sst.st_size, sst.st_mtime_ns))
    return FileIdentity(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, tuple(side))


@dataclass(frozen=True)
class GraderIdentity:
    """What a Grader records of a database at its first use (or after it changed)."""

    file: FileIdentity  # when first seen (size, times, inode, a writer's side files)
    stat: tuple[int, int]  # (size, version): what connection caches compare
    cache_id: str  # what the gold cache keys on: manifest sha256, or path + the file identity


@dataclass(frozen=True)
class ManifestEntry:
    db_id: str
    path: str  # relative to the manifest's db_root
    size: int
    mtime_ns: int
    sha256: str
    ctime_ns: int | None = None  # None in manifests written before ctime and inode were recorded
    inode: int | None = None

    @classmethod
    def of(cls, db_id: str, relative: str, path: Path) -> ManifestEntry:
        st = path.stat()
        return cls(db_id, relative, st.st_size, st.st_mtime_ns, sha256_file(path), st.st_ctime_ns, st.st_ino)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class Manifest:
    def __init__(self, db_root: str | os.PathLike, entries: dict[str, ManifestEntry]):
        self.db_root = Path(db_root).resolve()
        self.entries = dict(entries)
        self._by_path = {str((self.db_root / e.path).resolve()): e for e in self.entries.values()}

    @classmethod
    def build(cls, db_root: str | os.PathLike, db_ids: list[str] | None = None) -> Manifest:
        """Hash every database under `db_root` (or just `db_ids`)."""
        root = Path(db_root).resolve()
        ids = db_ids if db_ids is not None else list_databases(root)
        return cls.record({db_id: find_database(root, db_id) for db_id in ids}, root=root)

    @classmethod
    def record(cls, paths_by_id: dict[str, str | os.PathLike], *, root: str | os.PathLike | None = None) -> Manifest:
        """Hash the given files (db_id -> path) under `root` (default: their common ancestor)."""
        if not paths_by_id:
            raise ValueError("no databases to record")
        if root is None:
            absolute = {db_id: Path(p).resolve() for db_id, p in paths_by_id.items()}
            base = Path(os.path.commonpath([str(p.parent.parent) for p in absolute.values()]))
        else:  # the files as named under root (a symlinked database stays at its place in the tree)
            base = Path(root).resolve()
            absolute = {db_id: base / Path(p).relative_to(base) for db_id, p in paths_by_id.items()}
        entries = {db_id: ManifestEntry.of(db_id, str(path.relative_to(base)), path)
                   for db_id, path in sorted(absolute.items())}
        return cls(base, entries)

    @classmethod
    def load(cls, path: str | os.PathLike, db_root: str | os.PathLike | None = None) -> Manifest:
        """The manifest at `path` (a regular file of at most MAX_MANIFEST_BYTES). FileNotFoundError when
        there is none; ValueError, one line saying why, for anything that is not a manifest."""
        try:
            raw = _manifest_bytes(path)
        except (FileNotFoundError, ValueError):
            raise
        except OSError as e:
            raise ValueError(f"cannot read the manifest {path}: {e.strerror or e}") from None
        try:
            data = json.loads(raw)
            if data.get("version") != MANIFEST_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {MANIFEST_VERSION}")
            entries = {
                db_id: ManifestEntry(db_id, e["path"], int(e["size"]), int(e["mtime_ns"]), str(e["sha256"]),
                                     _int_or_none(e.get("ctime_ns")), _int_or_none(e.get("inode")))
                for db_id, e in data["databases"].items()
            }
            root = db_root if db_root is not None else data["db_root"]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
            raise ValueError(
                f"{path} is not a t2sql database manifest ({e}); rebuild it with `t2sql gold`"
            ) from e
        return cls(root, entries)

    def to_dict(self) -> dict:
        """The manifest as saved (a file that holds these keys and others still loads as a manifest)."""
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "db_root": str(self.db_root),
            "databases": {
                db_id: {k: v for k, v in asdict(e).items() if k != "db_id"}
                for db_id, e in sorted(self.entries.items())
            },
        }

    def to_bytes(self) -> bytes:
        return (json.dumps(self.to_dict(), indent=1) + "\n").encode()

    def save(self, path: str | os.PathLike | OutputFile) -> None:
        """Write the manifest at `path` (an OutputFile: a command's checked output), atomically; a file there
        that is not a manifest is refused (OutputPathError) unless the OutputFile says --force."""
        (path if isinstance(path, OutputFile) else manifest_output(path)).write_bytes(self.to_bytes())

    def entry_for(self, db_path: str | os.PathLike) -> ManifestEntry | None:
        return self._by_path.get(str(Path(db_path).resolve()))

    def verify(self, db_path: str | os.PathLike, identity: FileIdentity | None = None, *,
               hash_always: bool = False) -> ManifestEntry:
        """The entry of `db_path` if the file is the one recorded; else a typed error (the rules
        are in the module doc). `identity`: the file's, when the caller has it already."""
        entry = self.entry_for(db_path)
        if entry is None:
            raise UnknownDatabase(
                f"{db_path} is not in the database manifest (root {self.db_root}); "
                "re-run `t2sql gold` to record it, or use the db_root the manifest was built for"
            )
        if identity is None:
            identity = file_identity(db_path)
        writer = identity.writer_file(db_path)
        if writer is not None:
            raise DatabaseChanged(
                f"{db_path} is being written, or a writer died in a transaction: {writer} is not empty, so "
                "its content is not what the manifest recorded. Let the writer finish (or open the "
                "database once read-write to roll back), then re-run `t2sql gold` if it changed"
            )
        if identity.size != entry.size:
            raise DatabaseChanged(
                f"{db_path} changed since the manifest was written: {identity.size} bytes, recorded "
                f"{entry.size}. Databases are opened immutable, so a changed file can give wrong "
                "grades: restore the original file, or re-run `t2sql gold` to re-record it"
            )
        same_stat = ((identity.mtime_ns, identity.ctime_ns, identity.inode)
                     == (entry.mtime_ns, entry.ctime_ns, entry.inode))
        if (hash_always or not same_stat) and sha256_file(db_path) != entry.sha256:
            raise DatabaseChanged(
                f"{db_path} changed since the manifest was written (same size, different sha256). "
                "Restore the original file, or re-run `t2sql gold` to re-record it"
            )
        return entry


def _int_or_none(value: object) -> int | None:
    return None if value is None else int(value)  # type: ignore[arg-type]
