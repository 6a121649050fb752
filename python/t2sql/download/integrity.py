"""The integrity check of a database t2sql lays out or is given (a user's own copy): `database_problem(path)`,
which opens it the way the Grader does and runs `PRAGMA quick_check`."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["database_problem"]


def database_problem(path: Path) -> str | None:
    """Why the SQLite file at `path` is not a database to use (empty, unreadable, or failing `PRAGMA
    quick_check`), or None. It is opened read-only and immutable, as the Grader opens it: SQLite writes
    nothing beside it (no -wal, no -shm) and reads no -wal or journal it finds there."""
    try:
        if path.stat().st_size == 0:
            return "it is empty"
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
    except (OSError, sqlite3.Error) as e:
        return str(getattr(e, "strerror", None) or e)
    if rows == [("ok",)]:
        return None
    problem = "; ".join(str(r[0]) for r in rows[:3]).replace("\n", "; ")
    problem = problem if len(problem) <= 200 else problem[:200] + " ..."
    return f"it fails its integrity check (PRAGMA quick_check: {problem})"
