"""What a database file declares, read through the core (t2sql.Database.catalog and .rows): the
objects a small database takes (no triggers, no virtual tables and their storage, no view over a table
left out), each table's columns and keys, its foreign keys. A part that cannot be held faithfully is
left out (noted with why), never the whole database. Mining (t2sql.equivalence.mining) reads the data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from t2sql.equivalence.invariants import Table
from t2sql.errors import DatabaseError
from t2sql.sqltext import tokens


class StatementReader(Protocol):
    """What reads the database for mining (t2sql.equivalence.mining_reader.Reader): None for a statement that
    failed or ran out of time."""

    def rows(self, sql: str, params: tuple = ()) -> list[tuple] | None: ...

    def catalog(self, pragma: str, name: str | None = None) -> list[tuple] | None: ...


def unquote_name(text: str) -> str:
    if len(text) >= 2 and text[0] in "\"`[" and text[-1] in "\"`]":
        return text[1:-1].replace('""', '"')
    return text


def mentions(sql: str, names: frozenset[str]) -> bool:
    """Whether `sql` names one of `names` (lower case) as a word or a quoted identifier (a column of the
    same name counts too: this errs on the side of saying yes)."""
    if not names:
        return False
    return any(t.kind in ("word", "quoted") and unquote_name(t.text).lower() in names for t in tokens(sql))


@dataclass(frozen=True)
class Listed:
    kind: str  # sqlite_master's type: table, index, view
    name: str
    table: str  # the table an index belongs to
    sql: str


def listing(reader: StatementReader, path: str) -> tuple[list[Listed], dict[str, tuple[str, bool]]]:
    """sqlite_master's objects a small database may take (no triggers, no SQLite's own), and each
    table's (pragma_table_list type, WITHOUT ROWID). A database whose schema cannot be read is a
    DatabaseError."""
    listed = reader.rows("SELECT type, name, tbl_name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
    kinds_rows = reader.catalog("table_list")
    if listed is None or kinds_rows is None:
        raise DatabaseError(f"cannot read the schema of database {path}")
    kinds = {str(r[1]): (str(r[2]), bool(r[4])) for r in kinds_rows if r[0] == "main"}
    out = []
    for kind, name, table, sql in listed:
        if kind == "trigger" or not isinstance(name, str) or name.startswith("sqlite_") or not isinstance(sql, str):
            continue  # a trigger would write when rows are inserted; the data already holds its effects
        out.append(Listed(kind, name, table if isinstance(table, str) else "", sql))
    return out, kinds


def statements(listed: list[Listed], left: set[str], left_out: list[tuple[str, str, str]]) -> tuple[str, ...]:
    """The CREATE statements a small database takes: those of the tables kept, their indexes, and the
    views that name no table left out (a view over one is left out too)."""
    out = []
    for item in listed:
        if item.kind == "table" and item.name.lower() in left:
            continue
        if item.kind == "index" and item.table.lower() in left:
            continue
        if item.kind == "view" and mentions(item.sql, frozenset(left)):
            left_out.append(("table", item.name, "a view over a table left out"))
            left.add(item.name.lower())
            continue
        out.append(item.sql)
    return tuple(out)


@dataclass(frozen=True)
class Shape:
    info: list[tuple[str, str, int, int]]  # (name, declared type, notnull, pk) per column
    rowid: bool
    keys: list[tuple[str, ...]]


def table_shape(reader: StatementReader, name: str, without_rowid: bool) -> Shape | None:
    """The table's columns and keys from the catalog; None when the catalog cannot describe it."""
    info = reader.catalog("table_info", name)
    if not info or any(not isinstance(r[1], str) for r in info):
        return None
    columns = [(r[1], r[2] if isinstance(r[2], str) else "", int(r[3] or 0), int(r[5] or 0)) for r in info]
    keys: list[tuple[str, ...]] = []
    pk = tuple(c[0] for c in sorted((c for c in columns if c[3]), key=lambda c: c[3]))
    if pk:
        keys.append(pk)
    for _seq, index_name, unique, origin, *partial in reader.catalog("index_list", name) or []:
        # A partial index keeps apart only the rows its WHERE names: no key of the table.
        if not unique or origin == "pk" or not isinstance(index_name, str) or any(partial):
            continue
        cols = tuple(r[2] for r in reader.catalog("index_info", index_name) or [])
        # An index on an expression names no column there: not a key of columns (the core refuses
        # the rows that break it, and the check skips that small database).
        if cols and all(isinstance(c, str) for c in cols) and cols not in keys:
            keys.append(cols)
    return Shape(columns, not without_rowid, keys)


def declared_references(reader: StatementReader, tables: dict[str, Table],
                        left_out: list[tuple[str, str, str]]) -> list[tuple[str, tuple, str, tuple]]:
    """Every declared foreign key as (child, columns, parent, columns); one that names a table or a
    column the schema lacks (SQLite does not check) is left out, noted in `left_out`."""
    out = []
    for t in tables.values():
        groups: dict[int, list[tuple]] = {}
        for row in reader.catalog("foreign_key_list", t.name) or []:
            groups.setdefault(row[0], []).append(row)
        for rows in groups.values():
            rows.sort(key=lambda r: r[1])
            named = f"{t.name}({', '.join(str(r[3]) for r in rows)}) -> {rows[0][2]}"
            parent = resolve(tables, rows[0][2]) if isinstance(rows[0][2], str) else None
            if parent is None:
                left_out.append(("reference", named, "its parent table is not in the small databases"))
                continue
            child_cols = tuple(r[3] for r in rows)
            to = [r[4] for r in rows]
            if any(x is None for x in to):  # REFERENCES parent with no column: its primary key
                pk = next((k for k in parent.keys if all(parent.column(c) and parent.column(c).pk for c in k)), None)
                if pk is None or len(pk) != len(child_cols):
                    left_out.append(("reference", named, "its parent has no primary key of that width"))
                    continue
                to = list(pk)
            missing = [f"{t.name}.{c}" for c in child_cols if not isinstance(c, str) or t.column(c) is None]
            missing += [f"{parent.name}.{c}" for c in to if not isinstance(c, str) or parent.column(c) is None]
            if missing:
                left_out.append(("reference", named, f"it names {', '.join(map(str, missing))}, which the "
                                                       "schema lacks"))
                continue
            parent_cols = tuple(parent.column(c).name for c in to)
            child_cols = tuple(t.column(c).name for c in child_cols)
            out.append((t.name, child_cols, parent.name, parent_cols))
    return out


def resolve(tables: dict[str, Table], name: str) -> Table | None:
    low = name.lower()
    return next((t for t in tables.values() if t.name.lower() == low), None)
