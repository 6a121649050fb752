"""The database schema as the prompt shows it: loaded once per file (CREATE statements, BIRD
column descriptions, example values), rendered within a budget."""

from __future__ import annotations

import csv
import io
import logging
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import t2sql
from t2sql._grader import ToolLimits
from t2sql.episode.evidence import content_tokens
from t2sql.episode.presets import Preset
from t2sql.errors import SchemaError
from t2sql.serving.manifest import file_identity

if TYPE_CHECKING:
    from t2sql import Database

log = logging.getLogger("t2sql.schema")

# A description CSV is a few kilobytes (BIRD's largest is under 100 KB); a larger file is not one, and is
# not read into memory.
MAX_DESCRIPTION_CSV_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    description: str  # BIRD's column_description (may be "")
    value_description: str  # BIRD's value_description (may be "")
    examples: tuple[str, ...]  # rendered as SQL literals


@dataclass(frozen=True)
class TableInfo:
    name: str
    sql: str  # the CREATE statement as stored in sqlite_master
    columns: tuple[ColumnInfo, ...]


@dataclass(frozen=True)
class SchemaInfo:
    path: str
    tables: tuple[TableInfo, ...]


@dataclass(frozen=True)
class RenderedSchema:
    text: str
    level: int  # 0 = full; 1..5 = the last shortening step taken (see the module doc)
    dropped_tables: tuple[str, ...]
    fits: bool  # False only when even the most relevant table alone is over the budget


def _literal(value: Any, max_chars: int) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return f"<blob {len(value)} bytes>"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return "'" + text.replace("'", "''").replace("\n", " ") + "'"


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_C1 = re.compile("[\x80-\x9f]")


def _fix_c1(ch: re.Match) -> str:
    try:
        return ch.group(0).encode("latin-1").decode("cp1252")
    except UnicodeDecodeError:
        return " "


def _clean(text: str) -> str:
    # BIRD's CSVs carry Windows-1252 bytes mis-read as C1 controls (U+0095 for a bullet) and
    # U+FFFD where a bullet was lost upstream: re-read the first, show the second as a dash.
    return " ".join(_C1.sub(_fix_c1, text).replace("\ufffd", "-").split())


def _decode(raw: bytes) -> str:
    # BIRD's CSVs come in utf-8, utf-8 with BOM, and Windows-1252/latin-1 (bullets as 0x95).
    for encoding in ("utf-8-sig", "cp1252"):
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            continue
    return raw.decode("latin-1")  # never fails


class _Unreadable(Exception):
    """A description file that is not read; the message says why."""


def _description_bytes(path: Path) -> bytes:
    """The file's bytes: a regular file (a FIFO or device is refused by its fstat, opened non-blocking, never
    read) of at most MAX_DESCRIPTION_CSV_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _Unreadable(f"cannot open it: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Unreadable("it is not a regular file")
        if st.st_size > MAX_DESCRIPTION_CSV_BYTES:
            raise _Unreadable(f"it is {st.st_size:,} bytes, above the {MAX_DESCRIPTION_CSV_BYTES:,} a description "
                              "file may have")
        os.set_blocking(fd, True)
        try:
            raw = f.read(MAX_DESCRIPTION_CSV_BYTES + 1)
        except OSError as e:
            raise _Unreadable(f"cannot read it: {e.strerror}") from None
    if len(raw) > MAX_DESCRIPTION_CSV_BYTES:
        raise _Unreadable(f"it is over {MAX_DESCRIPTION_CSV_BYTES:,} bytes")
    return raw


def _description_rows(text: str) -> dict[str, tuple[str, str]]:
    """{column (lower): (description, value description)} of one CSV's text; csv.Error when it is not CSV."""
    columns: dict[str, tuple[str, str]] = {}
    for row in csv.DictReader(io.StringIO(text)):
        row = {(k or "").strip().lower(): (v or "") for k, v in row.items() if isinstance(v, str)}
        name = row.get("original_column_name", "").strip()
        if not name:
            continue
        desc = _clean(row.get("column_description", ""))
        values = _clean(row.get("value_description", ""))
        values = re.sub(r"(?i)^commonsense evidence:\s*", "", values)
        columns[name.lower()] = (desc, values)
    return columns


_warned_files: set[str] = set()  # description files already reported unreadable in this process
_warned_lock = threading.Lock()


def _warn_unreadable(path: Path, why: str) -> None:
    """One warning per file per process: every task of a database reads the same files."""
    key = os.path.abspath(path)
    with _warned_lock:
        if key in _warned_files:
            return
        _warned_files.add(key)
    log.warning("t2sql: skipped the column descriptions in %s (%s); the prompt shows table %s without them",
                path, why, path.stem)


def read_descriptions(db_dir: str | os.PathLike) -> dict[str, dict[str, tuple[str, str]]]:
    """BIRD's `database_description/<table>.csv`: {table (lower): {column (lower): (desc, values)}}.

    A missing directory gives {}. Descriptions are optional: a file that cannot be read as CSV (not a
    regular file, over MAX_DESCRIPTION_CSV_BYTES, a field past the csv module's limit, an unreadable
    byte) is skipped with one warning per file per process (logged to "t2sql.schema"), and its table is
    shown without descriptions; a row without a column name is passed over.
    """
    folder = Path(db_dir) / "database_description"
    out: dict[str, dict[str, tuple[str, str]]] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.csv")):
        try:
            out[path.stem.strip().lower()] = _description_rows(_decode(_description_bytes(path)))
        except _Unreadable as e:
            _warn_unreadable(path, str(e))
        except csv.Error as e:
            _warn_unreadable(path, f"not a CSV file this reads: {e}")
    return out


# The schema's own queries: only their rows and columns are read, never the preview text.
_COLUMNS_QUERY_LIMITS = ToolLimits(timeout_s=5.0, max_rows=0, max_cell_chars=1, max_chars=1, count_cap=1)


def _table_columns(db: Database, table: str) -> list[str]:
    # PRAGMA is denied by the core's authorizer; an empty SELECT names the columns.
    return list(db.run_tool(f"SELECT * FROM {_quote_ident(table)} LIMIT 0", _COLUMNS_QUERY_LIMITS).columns)


def _examples(db: Database, table: str, column: str, n: int, max_chars: int) -> tuple[str, ...]:
    if n <= 0:
        return ()
    sql = (
        f"SELECT DISTINCT {_quote_ident(column)} FROM {_quote_ident(table)} "
        f"WHERE {_quote_ident(column)} IS NOT NULL LIMIT {n}"
    )
    try:
        rows = db.run_tool(sql, ToolLimits(timeout_s=2.0, max_rows=n, max_cell_chars=max_chars + 1, max_chars=1,
                                          count_cap=n)).rows
    except t2sql.T2sqlError:  # examples are a courtesy: a slow or odd column just shows none
        return ()
    return tuple(v for v in (_literal(r[0], max_chars) for r in rows) if v is not None)


def load_schema(db_path: str, *, example_values: int, example_value_chars: int,
                db: Database | None = None) -> SchemaInfo:
    """The schema of one database, with `example_values` example values a column (each cut at
    `example_value_chars`: the preset's prompt part gives both) and BIRD descriptions.

    Cached per file (path, size, mtime) and options: every episode of a database reuses it. `db`,
    when given, is the open core Database to read through (else one is opened).
    """

    try:
        identity = file_identity(db_path)
    except OSError as e:
        raise SchemaError(f"cannot read database {db_path}: {e.strerror}; check --db-root / db_path") from None
    key = (os.path.abspath(db_path), identity, example_values, example_value_chars)
    with _schema_lock:
        hit = _schema_cache.get(key)
    if hit is None:
        hit = _build_schema(key[0], example_values, example_value_chars, db)
        with _schema_lock:
            if len(_schema_cache) >= 512:  # many databases: forget the oldest
                _schema_cache.pop(next(iter(_schema_cache)))
            _schema_cache[key] = hit
    return hit


_schema_cache: dict[tuple, SchemaInfo] = {}


_schema_lock = threading.Lock()


def _build_schema(path: str, example_values: int, example_value_chars: int,
                  db: Database | None) -> SchemaInfo:

    if db is None:
        try:
            db = t2sql.Database(path)
        except t2sql.DatabaseError as e:
            raise SchemaError(f"cannot open database {path}: {e}") from None
    try:
        entries = db.schema()
    except t2sql.T2sqlError as e:
        raise SchemaError(f"cannot read the schema of {path}: {e}") from None
    descriptions = read_descriptions(Path(path).parent)
    tables = []
    for kind, name, sql in entries:
        # Tables and views only: indexes and triggers are noise to the model; sqlite_* are internal.
        if kind not in ("table", "view") or not sql or name.startswith("sqlite_"):
            continue
        try:
            names = _table_columns(db, name)
        except t2sql.T2sqlError:
            names = []
        described = descriptions.get(name.lower(), {})
        columns = []
        for col in names:
            desc, values = described.get(col.lower(), ("", ""))
            columns.append(ColumnInfo(col, desc, values,
                                      _examples(db, name, col, example_values, example_value_chars)))
        tables.append(TableInfo(name, sql.strip(), tuple(columns)))
    if not tables:
        raise SchemaError(f"database {path} has no tables")
    return SchemaInfo(path, tuple(tables))


def _cut(text: str, n: int) -> str:
    if len(text) <= n:
        return text
    cut = text.rfind(" ", 0, n - 1)
    return text[: cut if cut > n // 2 else n - 1] + "…"


def _render_table(t: TableInfo, *, examples: bool, values: bool, descriptions: bool, compact: bool,
                  description_max_chars: int) -> str:
    sql = _clean(t.sql) if compact else t.sql
    lines = [sql.rstrip(";") + ";"]
    notes = []
    for c in t.columns:
        parts = []
        if descriptions and c.description:
            parts.append(_cut(c.description, description_max_chars))
        if descriptions and values and c.value_description:
            parts.append("values: " + _cut(c.value_description, description_max_chars))
        if examples and c.examples:
            parts.append("examples: " + ", ".join(c.examples))
        if parts:
            notes.append(f"--   {c.name}: " + "; ".join(parts))
    if notes:
        lines.append(f"-- {t.name} columns:")
        lines.extend(notes)
    return "\n".join(lines)


def render_schema(schema: SchemaInfo, preset: Preset, *, question: str = "", evidence: str = "") -> RenderedSchema:
    """The schema block under `preset.prompt.schema_max_chars`, shortened in the documented order.

    Levels 0-4 do not depend on the task, so their result is cached per schema and settings;
    only step 5 (dropping tables by relevance) is rendered per task.
    """
    key = (id(schema), preset.prompt.schema_max_chars, preset.prompt.example_values, preset.prompt.column_descriptions,
           preset.prompt.description_max_chars)
    with _schema_lock:
        hit = _render_cache.get(key)
    if hit is not None and hit[0] is schema and hit[1] is not None:
        return hit[1]
    rendered = _render(schema, preset, question, evidence)
    with _schema_lock:
        if len(_render_cache) >= 512:
            _render_cache.pop(next(iter(_render_cache)))
        # Keep the schema itself in the value: its id() cannot be reused while cached.
        _render_cache[key] = (schema, rendered if rendered.level < 5 else None)
    return rendered


_render_cache: dict[tuple, tuple[SchemaInfo, RenderedSchema | None]] = {}


def _render(schema: SchemaInfo, preset: Preset, question: str, evidence: str) -> RenderedSchema:
    budget = preset.prompt.schema_max_chars
    has_examples = preset.prompt.example_values > 0
    has_desc = preset.prompt.column_descriptions
    steps = [  # (level, examples, value descriptions, descriptions, compact)
        (0, has_examples, has_desc, has_desc, False),
        (1, False, has_desc, has_desc, False),
        (2, False, False, has_desc, False),
        (3, False, False, False, False),
        (4, False, False, False, True),
    ]
    blocks: list[str] = []
    level = 0
    for level, ex, vals, desc, compact in steps:
        blocks = [
            _render_table(t, examples=ex, values=vals, descriptions=desc, compact=compact,
                          description_max_chars=preset.prompt.description_max_chars)
            for t in schema.tables
        ]
        text = "\n\n".join(blocks)
        if len(text) <= budget:
            return RenderedSchema(text, level, (), True)
    # Step 5: drop whole tables, least related to the question and evidence first.
    wanted = content_tokens(question + " " + evidence)

    def relevance(i: int) -> tuple[int, int]:
        t = schema.tables[i]
        words = content_tokens(t.name + " " + " ".join(c.name for c in t.columns))
        return (len(words & wanted), -i)

    order = sorted(range(len(blocks)), key=relevance, reverse=True)  # most relevant first
    keep: list[int] = []
    used = 0
    for i in order:
        cost = len(blocks[i]) + (2 if keep else 0)
        if not keep or used + cost <= budget - 200:  # leave room for the note naming dropped tables
            keep.append(i)
            used += cost
    kept = sorted(keep)
    dropped = tuple(schema.tables[i].name for i in range(len(blocks)) if i not in keep)
    text = "\n\n".join(blocks[i] for i in kept)
    if dropped:
        note = ("-- Not shown (the schema is too long for the prompt): tables "
                + ", ".join(dropped) + ". Query them with execute_sql_query if needed.")
        text = text + "\n\n" + note
    return RenderedSchema(text, 5, dropped, len(text) <= budget)
