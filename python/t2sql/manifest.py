"""The database manifest: each database file's size, mtime and sha256, recorded at prepare.

Connections open databases with `immutable=1` (SQLite takes no locks and trusts that nobody
writes the file), so a file that changes under a running grader can give wrong results
silently. A Grader given a manifest checks every file at first use and whenever its size or
mtime moves: a different size is refused at once; a different mtime (a copy, an rsync
without -t) is re-hashed and accepted only if the sha256 still matches.

Format (JSON, written atomically):
    {"version": 1, "db_root": "/abs/root",
     "databases": {"<db_id>": {"path": "<db_id>/<db_id>.sqlite", "size": N, "mtime_ns": N,
                               "sha256": "..."}}}
Paths are relative to db_root; `Manifest.load(path, db_root=...)` re-roots a moved tree.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from t2sql import DatabaseError
from t2sql.atomic import write_bytes_atomic

MANIFEST_VERSION = 1


class DatabaseChanged(DatabaseError):
    """A database file differs from the manifest recorded when the data was prepared."""


class UnknownDatabase(DatabaseError):
    """A db_id (or path) that the data root or the manifest does not have."""


@dataclass(frozen=True)
class ManifestEntry:
    db_id: str
    path: str  # relative to the manifest's db_root
    size: int
    mtime_ns: int
    sha256: str


def database_path(db_root: str | os.PathLike, db_id: str) -> str:
    """The file of `db_id` in BIRD's layout `<root>/<db_id>/<db_id>.sqlite`.

    Raises UnknownDatabase (naming a few db_ids that do exist) when it is missing."""
    root = Path(db_root)
    if not db_id or "/" in db_id or "\\" in db_id or db_id in (".", ".."):
        raise UnknownDatabase(f"invalid db_id {db_id!r}: expected a directory name under {root}")
    path = root / db_id / f"{db_id}.sqlite"
    if path.is_file():
        return str(path)
    available = sorted(list_databases(root))
    hint = ", ".join(available[:8]) + (" ..." if len(available) > 8 else "") if available else "none"
    raise UnknownDatabase(
        f"unknown db_id {db_id!r}: {path} does not exist (databases under {root}: {hint}); "
        "check --db-root and the data file's db_id"
    )


def list_databases(db_root: str | os.PathLike) -> list[str]:
    """db_ids under `db_root` laid out as `<db_id>/<db_id>.sqlite`."""
    root = Path(db_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / f"{p.name}.sqlite").is_file())


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
        entries = {}
        for db_id in db_ids if db_ids is not None else list_databases(root):
            path = Path(database_path(root, db_id))
            st = path.stat()
            entries[db_id] = ManifestEntry(
                db_id, str(path.relative_to(root)), st.st_size, st.st_mtime_ns, sha256_file(path)
            )
        return cls(root, entries)

    @classmethod
    def record(cls, paths_by_id: dict[str, str | os.PathLike]) -> Manifest:
        """Hash the given files (db_id -> path); the root is their common ancestor."""
        if not paths_by_id:
            raise ValueError("no databases to record")
        absolute = {db_id: Path(p).resolve() for db_id, p in paths_by_id.items()}
        root = Path(os.path.commonpath([str(p.parent.parent) for p in absolute.values()]))
        entries = {}
        for db_id, path in sorted(absolute.items()):
            st = path.stat()
            entries[db_id] = ManifestEntry(
                db_id, str(path.relative_to(root)), st.st_size, st.st_mtime_ns, sha256_file(path)
            )
        return cls(root, entries)

    @classmethod
    def load(cls, path: str | os.PathLike, db_root: str | os.PathLike | None = None) -> Manifest:
        try:
            data = json.loads(Path(path).read_text())
            if data.get("version") != MANIFEST_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {MANIFEST_VERSION}")
            entries = {
                db_id: ManifestEntry(db_id, e["path"], int(e["size"]), int(e["mtime_ns"]), str(e["sha256"]))
                for db_id, e in data["databases"].items()
            }
            root = db_root if db_root is not None else data["db_root"]
        except FileNotFoundError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(
                f"{path} is not a t2sql database manifest ({e}); rebuild it with `t2sql gold`"
            ) from e
        return cls(root, entries)

    def save(self, path: str | os.PathLike) -> None:
        data = {
            "version": MANIFEST_VERSION,
            "db_root": str(self.db_root),
            "databases": {
                db_id: {k: v for k, v in asdict(e).items() if k != "db_id"}
                for db_id, e in sorted(self.entries.items())
            },
        }
        write_atomic(Path(path), (json.dumps(data, indent=1) + "\n").encode())

    def entry_for(self, db_path: str | os.PathLike) -> ManifestEntry | None:
        return self._by_path.get(str(Path(db_path).resolve()))

    def verify(self, db_path: str | os.PathLike, st: os.stat_result | None = None) -> ManifestEntry:
        """The entry of `db_path` if the file is the one recorded; else a typed error."""
        entry = self.entry_for(db_path)
        if entry is None:
            raise UnknownDatabase(
                f"{db_path} is not in the database manifest (root {self.db_root}); "
                "re-run `t2sql gold` to record it, or use the db_root the manifest was built for"
            )
        if st is None:
            st = os.stat(db_path)
        if st.st_size != entry.size:
            raise DatabaseChanged(
                f"{db_path} changed since the manifest was written: {st.st_size} bytes, recorded "
                f"{entry.size}. Databases are opened immutable, so a changed file can give wrong "
                "grades: restore the original file, or re-run `t2sql gold` to re-record it"
            )
        if st.st_mtime_ns != entry.mtime_ns and sha256_file(db_path) != entry.sha256:
            raise DatabaseChanged(
                f"{db_path} changed since the manifest was written (same size, different sha256). "
                "Restore the original file, or re-run `t2sql gold` to re-record it"
            )
        return entry


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so readers see the old file or the whole new one, never half."""
    write_bytes_atomic(path, data)
