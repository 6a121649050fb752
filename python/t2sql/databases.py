"""Where a task's database lives: the one path rule every command resolves a database by,
`<root>/<db_id>/<db_id>.sqlite` (`database_path`, `find_database`, `find_at`; a task's: `existing_database`). The rule:
docs/cli.md, "What every command reads". `Task.from_row` applies it without touching the disk; the commands check
the file before they run anything on it."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

from t2sql.errors import TaskError, UnknownDatabase

# A db_id names one folder: a file name, which no file system takes longer than this (NAME_MAX).
MAX_DB_ID_BYTES = 255


def _shown(text: str, limit: int = 80) -> str:
    """`text` as a message quotes it: repr, and at most `limit` characters of it."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def db_id_problem(db_id: str) -> str | None:
    """Why `db_id` cannot name a database folder, or None. Decided from the text alone."""
    if not db_id:
        return "it is empty"
    if db_id in (".", ".."):
        return "it is '.' or '..'"
    for bad, name in (("/", "'/'"), ("\\", "'\\'"), ("\0", "a NUL character")):
        if bad in db_id:
            return f"it holds {name}"
    try:
        size = len(db_id.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not text (a lone surrogate)"
    if size > MAX_DB_ID_BYTES:
        return f"it is {size:,} bytes long, above the {MAX_DB_ID_BYTES} a folder name can have"
    return None


def _invalid_db_id(db_id: str, why: str) -> UnknownDatabase:
    return UnknownDatabase(
        f"invalid db_id {_shown(db_id)}: {why}; a db_id is the name of one folder under the database root "
        "(<db-root>/<db_id>/<db_id>.sqlite), never a path: fix the data file's db_id"
    )


def database_path(db_root: str | os.PathLike, db_id: str) -> Path:
    """BIRD's layout: <root>/<db_id>/<db_id>.sqlite. Raises UnknownDatabase, without looking at the disk,
    for a db_id that is not one folder name (db_id_problem): the path never leaves the root."""
    why = db_id_problem(db_id)
    if why is not None:
        raise _invalid_db_id(db_id, why)
    return Path(db_root) / db_id / f"{db_id}.sqlite"


def list_databases(db_root: str | os.PathLike) -> list[str]:
    """db_ids under `db_root` laid out as `<db_id>/<db_id>.sqlite` (regular files)."""
    root = Path(db_root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if db_id_problem(p.name) is None and database_path(root, p.name).is_file())


def _file_problem(path: Path) -> tuple[str, bool] | None:
    """(why `path` is not a database file to open, whether it is simply missing), or None for a regular
    file. Only `stat` looks at it: a FIFO or a device is never opened."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return f"{path} does not exist", True
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return f"{path} is longer than a path can be", True
        return f"cannot look at {path}: {e.strerror}", False
    if stat.S_ISREG(mode):
        return None
    return f"{path} is {file_kind(mode)}, not a SQLite file (it is not opened)", False


def file_kind(mode: int) -> str:
    """What a stat's mode says a path is, in words (for messages)."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return kind
    return "not a regular file"


def find_database(db_root: str | os.PathLike, db_id: str) -> str:
    """The file of `db_id` under `db_root`: the one rule every command resolves a database by.

    Raises UnknownDatabase when the db_id is not one folder name (database_path), when the file is
    missing (naming a few db_ids that do exist), or when what is there is not a regular file (checked
    by stat; never opened)."""
    root = Path(db_root)
    path = database_path(root, db_id)
    problem = _file_problem(path)
    if problem is None:
        return str(path)
    why, missing = problem
    if not missing:
        raise UnknownDatabase(f"db_id {_shown(db_id)}: {why}; put the database file there, or check --db-root")
    available = list_databases(root)
    hint = ", ".join(available[:8]) + (" ..." if len(available) > 8 else "") if available else "none"
    raise UnknownDatabase(
        f"unknown db_id {_shown(db_id)}: {why} (databases under {root}: {hint}); "
        "check --db-root and the data file's db_id"
    )


def recorded_database_path(db_path: Any, db_id: str, question_id: Any = None) -> str:
    """A converted row's recorded `db_path`, checked against the rule without looking at the disk: an
    absolute path, without `..`, laid out as `<dir>/<db_id>/<db_id>.sqlite` for the row's own db_id.
    Raises TaskError without one, UnknownDatabase for one that is not that."""
    if not isinstance(db_path, str) or not db_path:
        raise TaskError(f"task {question_id!r} has no db_path; pass the database root (--db-root DIR holding "
                        "<db_id>/<db_id>.sqlite)")
    path = Path(db_path)
    layout = database_path(path.parent.parent, db_id)  # the db_id itself first: the same words as everywhere
    if "\0" in db_path or not path.is_absolute() or ".." in path.parts or path != layout:
        raise UnknownDatabase(
            f"task {question_id!r}: its recorded db_path {_shown(db_path)} is not an absolute "
            f"<dir>/<db_id>/<db_id>.sqlite for its db_id {_shown(db_id)}, as `t2sql convert` writes it; pass "
            "--db-root DIR holding <db_id>/<db_id>.sqlite"
        )
    return str(path)


def find_at(db_path: str | os.PathLike, db_id: str, question_id: Any = None) -> str:
    """find_database for a path already laid out as `<dir>/<db_id>/<db_id>.sqlite` (a task's db_path,
    from a root or recorded at conversion); UnknownDatabase for a path that is not that layout."""
    path = Path(db_path)
    if database_path(path.parent.parent, db_id) != path:
        raise UnknownDatabase(f"task {question_id!r}: its db_path {_shown(str(db_path))} is not "
                              f"<dir>/<db_id>/<db_id>.sqlite for its db_id {_shown(db_id)}")
    return find_database(path.parent.parent, db_id)
