"""Finding a database's invariants (t2sql.serving.invariants) in its file, once, and keeping them.

Mining runs SQL of our own on a read-only connection (Python's sqlite3, trusted statements only; the
model's SQL never comes here), each statement under a deadline and the whole under a budget. What
could not be checked in time is assumed to hold and listed under `assumed`: assuming more invariants
only makes the small databases more cautious, never less realistic. `InvariantStore` keeps them in
memory and on disk (t2sql.serving.diskcache), keyed by the file's identity.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterator

from t2sql.errors import DatabaseError, T2sqlError
from t2sql.serving.diskcache import DiskCache, database_key
from t2sql.serving.invariants import (
    FORMATS,
    OTHER_TEXT,
    Column,
    Copy,
    Invariants,
    Reference,
    Relation,
    Table,
    quote,
)

# The budget of one mining run, and of each statement in it.
DEFAULT_MINE_BUDGET_S = 60.0

STATEMENT_TIMEOUT_S = 20.0

MAX_RELATION_COLUMNS = 10  # numeric columns per table tried for a + b = c (10 columns: 360 triples)

MAX_COPY_PAIRS = 400  # column pairs per reference tried for a copy

class Deadline(T2sqlError):
    pass

@contextlib.contextmanager
def open_readonly(path: str) -> Iterator[sqlite3.Connection]:
    """A read-only connection of our own (immutable unless a writer's side file is there, as the core
    decides), for trusted statements only."""
    side = any(os.path.exists(f"{path}{s}") and os.path.getsize(f"{path}{s}") > 0 for s in ("-wal", "-journal"))
    uri = "file:" + path.replace("%", "%25").replace("?", "%3F").replace("#", "%23") + "?mode=ro"
    if not side:
        uri += "&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as e:
        raise DatabaseError(f"cannot open database {path}: {e}") from None
    try:
        yield conn
    finally:
        conn.close()

class Reader:
    """Trusted statements on one read-only connection, each under a deadline; a statement past it
    raises Deadline."""

    def __init__(self, conn: sqlite3.Connection, timeout_s: float = STATEMENT_TIMEOUT_S):
        self.conn = conn
        self.timeout_s = timeout_s
        self._until = 0.0
        conn.set_progress_handler(self._progress, 10_000)

    def _progress(self) -> int:
        return 1 if time.monotonic() > self._until else 0

    def rows(self, sql: str, params: tuple = (), timeout_s: float | None = None) -> list[tuple]:
        self._until = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.OperationalError as e:
            if "interrupted" in str(e):
                raise Deadline(sql) from None
            raise

    def one(self, sql: str, params: tuple = (), timeout_s: float | None = None) -> tuple:
        rows = self.rows(sql, params, timeout_s)
        return rows[0] if rows else ()

@dataclass
class _Miner:
    reader: Reader
    deadline: float
    assumed: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def try_rows(self, what: str, sql: str, params: tuple = ()) -> list[tuple] | None:
        """The rows, or None (noted in `assumed`) when the budget or the statement's deadline ran out."""
        left = self.left()
        if left <= 0:
            self.assumed.append(what)
            return None
        try:
            return self.reader.rows(sql, params, min(STATEMENT_TIMEOUT_S, left))
        except Deadline:
            self.assumed.append(what)
            return None

def _schema_statements(reader: Reader) -> tuple[tuple[str, ...], str]:
    """The CREATE statements a small database takes, and why none can be built ("" when one can)."""
    rows = reader.rows("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY rowid")
    out, unsupported = [], ""
    for kind, name, sql in rows:
        if kind == "trigger":
            continue  # a trigger would write when rows are inserted; the data already holds its effects
        if name.startswith("sqlite_"):
            continue
        if kind == "table" and re.match(r"\s*CREATE\s+VIRTUAL\b", sql, re.I):
            unsupported = unsupported or f"virtual table {name}"
            continue
        out.append(sql)
    return tuple(out), unsupported

def _table_shape(reader: Reader, name: str) -> tuple[list[tuple], bool, list[tuple[str, ...]]]:
    info = reader.rows(f"SELECT name, type, \"notnull\", pk FROM pragma_table_info({_lit(name)})")
    try:
        reader.rows(f"SELECT rowid FROM {quote(name)} LIMIT 0")
        rowid = True
    except sqlite3.Error:
        rowid = False
    keys: list[tuple[str, ...]] = []
    pk = tuple(r[0] for r in sorted((r for r in info if r[3]), key=lambda r: r[3]))
    if pk:
        keys.append(pk)
    for index_name, unique, origin in reader.rows(
            f"SELECT name, \"unique\", origin FROM pragma_index_list({_lit(name)})"):
        if not unique or origin == "pk":
            continue
        cols = tuple(r[0] for r in reader.rows(f"SELECT name FROM pragma_index_info({_lit(index_name)})"))
        if cols and all(c is not None for c in cols) and cols not in keys:
            keys.append(cols)
    return info, rowid, keys

def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"

def _mine_table(m: _Miner, name: str) -> Table:
    info, rowid, keys = _table_shape(m.reader, name)
    cols = [r[0] for r in info]
    t = quote(name)
    stats: dict[str, dict[str, Any]] = {c: {} for c in cols}
    n_rows = 0
    counted = m.try_rows(f"row count of {name}", f"SELECT count(*) FROM {t}")
    if counted:
        n_rows = counted[0][0]
    # Per column: NULLs, storage classes and text shapes in one scan; distinct counts one column each
    # (they sort), so a slow one costs only its own invariant.
    parts = []
    for c in cols:
        q = quote(c)
        parts.append(f"count({q})")
        parts += [f"sum(typeof({q}) = '{k}')" for k in ("integer", "real", "text", "blob")]
        shape = " ".join(f"WHEN {cond.format(q=q)} THEN '{fmt}'" for fmt, cond, _ in FORMATS)
        parts.append(f"group_concat(DISTINCT CASE WHEN typeof({q}) <> 'text' THEN NULL {shape} "
                     f"ELSE '{OTHER_TEXT}' END)")
        parts += [f"max(typeof({q}) = 'text' AND {q} GLOB '*[a-z]*')",
                  f"max(typeof({q}) = 'text' AND {q} GLOB '*[A-Z]*')"]
    scan = m.try_rows(f"NULLs, types and formats of {name}", f"SELECT {', '.join(parts)} FROM {t}") if cols else None
    for i, c in enumerate(cols):
        s = stats[c]
        if scan is None:
            s.update(nulls=False, types=(), formats=(), mined=False, cases=())
            continue
        row = scan[0]
        base = i * 8
        non_null = row[base] or 0
        s["nulls"] = non_null < n_rows
        s["types"] = tuple(k for k, v in zip(("integer", "real", "text", "blob"), row[base + 1:base + 5]) if v)
        s["formats"] = tuple(sorted(set((row[base + 5] or "").split(",")) - {""}))
        s["cases"] = tuple(k for k, v in zip(("lower", "upper"), row[base + 6:base + 8]) if v)
        s["mined"] = True
    declared_unique = {k[0] for k in keys if len(k) == 1}
    for c in cols:
        if c in declared_unique:
            stats[c]["unique"] = True
            continue
        got = m.try_rows(f"repeats in {name}.{c}",
                         f"SELECT count({quote(c)}) = count(DISTINCT {quote(c)}) FROM {t}")
        stats[c]["unique"] = True if got is None else bool(got[0][0])
    pk_cols = [r for r in info if r[3]]
    integer_key = (pk_cols[0][0] if rowid and len(pk_cols) == 1 and (pk_cols[0][1] or "").upper() == "INTEGER"
                   else None)
    columns = []
    for c, decl_type, not_null, pk in info:
        s = stats[c]
        columns.append(Column(c, (decl_type or "").upper(), bool(pk), bool(not_null) or c == integer_key,
                              bool(s["nulls"]), bool(s["unique"]), s["types"], s["formats"], s["mined"],
                              s["cases"]))
    if not keys and cols:
        # A table without a key (a link table, say) whose rows never repeat keeps them apart: the whole row
        # is its key (a hero does not hold one power twice).
        got = m.try_rows(f"repeated rows in {name}",
                         f"SELECT count(*) = (SELECT count(*) FROM (SELECT DISTINCT * FROM {t})) FROM {t}")
        if got is None or got[0][0]:
            keys.append(tuple(cols))
    return Table(name, tuple(columns), n_rows, rowid, integer_key, tuple(keys))

def _declared_references(reader: Reader, tables: dict[str, Table]) -> list[tuple[str, tuple, str, tuple]]:
    out = []
    for t in tables.values():
        groups: dict[int, list[tuple]] = {}
        listed = reader.rows('SELECT id, seq, "table", "from", "to" FROM '
                             f"pragma_foreign_key_list({_lit(t.name)})")
        for row in listed:
            groups.setdefault(row[0], []).append(row)
        for rows in groups.values():
            rows.sort(key=lambda r: r[1])
            parent = _resolve(tables, rows[0][2])
            if parent is None:
                continue
            child_cols = tuple(r[3] for r in rows)
            to = [r[4] for r in rows]
            if any(x is None for x in to):  # REFERENCES parent with no column: its primary key
                pk = next((k for k in parent.keys if all(parent.column(c) and parent.column(c).pk for c in k)), None)
                if pk is None or len(pk) != len(child_cols):
                    continue
                to = list(pk)
            parent_cols = tuple(parent.column(c).name if parent.column(c) else c for c in to)
            child_cols = tuple(t.column(c).name if t.column(c) else c for c in child_cols)
            out.append((t.name, child_cols, parent.name, parent_cols))
    return out

def _resolve(tables: dict[str, Table], name: str) -> Table | None:
    low = name.lower()
    return next((t for t in tables.values() if t.name.lower() == low), None)

def _is_key(table: Table, cols: tuple[str, ...]) -> bool:
    low = {c.lower() for c in cols}
    if any({k.lower() for k in key} == low for key in table.keys):
        return True
    return len(cols) == 1 and bool(table.column(cols[0]) and table.column(cols[0]).unique
                                   and not table.column(cols[0]).nulls)

def _candidate_references(tables: dict[str, Table], declared: set[tuple]) -> list[tuple[str, tuple, str, tuple]]:
    """Undeclared references worth checking: a column named like another table's single-column key
    (the key's own name, `<table>_<key>`, `<table>_id`, `<table>id`), of a compatible type."""
    out = []
    for parent in tables.values():
        for key in parent.keys:
            if len(key) != 1:
                continue
            key_col = parent.column(key[0])
            if key_col is None:
                continue
            p, k = parent.name.lower(), key_col.name.lower()
            names = {k, f"{p}_{k}", f"{p}_id", f"{p}id"} if k != "id" else {f"{p}_id", f"{p}id"}
            for child in tables.values():
                if child.name == parent.name:
                    continue
                for c in child.columns:
                    if c.name.lower() not in names:
                        continue
                    if c.types and key_col.types and not set(c.types) & set(key_col.types):
                        continue
                    cand = (child.name, (c.name,), parent.name, (key_col.name,))
                    if cand not in declared:
                        out.append(cand)
    return out

def _references(m: _Miner, tables: dict[str, Table]) -> list[Reference]:
    declared = _declared_references(m.reader, tables)
    declared_set = set(declared)
    out: list[Reference] = []
    for child, ccols, parent, pcols in declared + _candidate_references(tables, declared_set):
        is_declared = (child, ccols, parent, pcols) in declared_set
        c, p = quote(child), quote(parent)
        # Row values with IN (an ephemeral index, n log n), not a correlated NOT EXISTS (n x m without an index).
        child_cols = "(" + ", ".join(quote(a) for a in ccols) + ")"
        parent_cols = "(" + ", ".join(quote(b) for b in pcols) + ")"
        not_null = " AND ".join(f"{quote(a)} IS NOT NULL" for a in ccols)
        if not is_declared:
            if not _is_key(tables[parent], pcols):
                continue
            dangling = m.try_rows(f"reference {child}({', '.join(ccols)}) -> {parent}",
                                  f"SELECT EXISTS (SELECT 1 FROM {c} WHERE {not_null} AND {child_cols} NOT IN "
                                  f"(SELECT {', '.join(quote(b) for b in pcols)} FROM {p})), "
                                  f"EXISTS (SELECT 1 FROM {c} WHERE {not_null})")
            if dangling is None or dangling[0][0] or not dangling[0][1]:
                continue  # an undeclared reference counts only when the data proves it closed
        orphans = m.try_rows(f"every {parent} row has a {child} row",
                             f"SELECT EXISTS (SELECT 1 FROM {p} WHERE {parent_cols} NOT IN "
                             f"(SELECT {', '.join(quote(a) for a in ccols)} FROM {c} WHERE {not_null})), "
                             f"EXISTS (SELECT 1 FROM {p})")
        total = True if orphans is None else (not orphans[0][0] and bool(orphans[0][1]))
        out.append(Reference(child, ccols, parent, pcols, is_declared, total))
    return out

def _comparable(a: Column, b: Column) -> bool:
    return bool(a.types and b.types and set(a.types) == set(b.types))

def _copies(m: _Miner, tables: dict[str, Table], references: list[Reference]) -> list[Copy]:
    out: list[Copy] = []
    for t in tables.values():  # the same row: a = b
        cols = [c for c in t.columns if c.types]
        pairs = [(a, b) for i, a in enumerate(cols) for b in cols[i + 1:] if _comparable(a, b)][:MAX_COPY_PAIRS]
        if not pairs or t.rows == 0:
            continue
        sums = ", ".join(f"sum({quote(a.name)} IS NOT {quote(b.name)})" for a, b in pairs)
        got = m.try_rows(f"equal columns of {t.name}", f"SELECT {sums} FROM {quote(t.name)}")
        if got is None:
            continue  # not known; the columns are not assumed equal (they are not frozen either way)
        out += [Copy(t.name, b.name, t.name, a.name, None) for (a, b), diff in zip(pairs, got[0]) if diff == 0]
    for r in references:  # through a reference: child.x = parent.y
        child, parent = tables[r.child], tables[r.parent]
        skip_c, skip_p = set(r.child_columns), set(r.parent_columns)
        pairs = [(x, y) for x in child.columns if x.name not in skip_c
                 for y in parent.columns if y.name not in skip_p and _comparable(x, y)][:MAX_COPY_PAIRS]
        if not pairs:
            continue
        join = " AND ".join(f"c.{quote(a)} = p.{quote(b)}" for a, b in zip(r.child_columns, r.parent_columns))
        sums = ", ".join(f"sum(c.{quote(x.name)} IS NOT p.{quote(y.name)})" for x, y in pairs)
        got = m.try_rows(f"copies along {r.name}",
                         f"SELECT count(*), {sums} FROM {quote(r.child)} AS c JOIN {quote(r.parent)} AS p ON {join}")
        if got is None or not got[0][0]:
            continue
        out += [Copy(r.child, x.name, r.parent, y.name, r) for (x, y), diff in zip(pairs, got[0][1:]) if diff == 0]
    return out

def _relations(m: _Miner, tables: dict[str, Table]) -> list[Relation]:
    out: list[Relation] = []
    for t in tables.values():
        nums = [c for c in t.columns if c.types and set(c.types) <= {"integer", "real"} and not c.pk]
        nums = nums[:MAX_RELATION_COLUMNS]
        triples = [(total, a, b) for total in nums for i, a in enumerate(nums) for b in nums[i + 1:]
                   if total is not a and total is not b]
        if not triples or t.rows == 0:
            continue
        terms = []
        for total, a, b in triples:
            s, x, y = quote(total.name), quote(a.name), quote(b.name)
            terms.append(f"sum(CASE WHEN {s} IS NULL OR {x} IS NULL OR {y} IS NULL THEN 0 "
                         f"WHEN abs({x} + {y} - {s}) <= 1e-9 * max(1.0, abs({s})) THEN 0 ELSE 1 END), "
                         f"sum({s} IS NOT NULL AND {x} IS NOT NULL AND {y} IS NOT NULL AND {x} <> 0 AND {y} <> 0)")
        got = m.try_rows(f"sums in {t.name}", f"SELECT {', '.join(terms)} FROM {quote(t.name)}")
        if got is None:
            continue
        row = got[0]
        for i, (total, a, b) in enumerate(triples):
            # Held in every row, and in at least three rows where neither term is 0 (else a + 0 = a is luck).
            if row[2 * i] == 0 and (row[2 * i + 1] or 0) >= 3:
                out.append(Relation(t.name, total.name, a.name, b.name))
    return out

def mine(path: str, *, budget_s: float = DEFAULT_MINE_BUDGET_S) -> Invariants:
    """The invariants of the database file at `path` (no cache)."""
    started = time.monotonic()
    with open_readonly(path) as conn:
        reader = Reader(conn)
        try:
            schema, unsupported = _schema_statements(reader)
            names = [r[0] for r in reader.rows(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
                "AND sql NOT LIKE 'CREATE VIRTUAL%' ORDER BY rowid")]
            m = _Miner(reader, started + budget_s)
            tables = {n: _mine_table(m, n) for n in names}
            references = _references(m, tables)
            copies = _copies(m, tables, references)
            relations = _relations(m, tables)
        except sqlite3.DatabaseError as e:
            raise DatabaseError(f"cannot read database {path}: {e}") from None
    return Invariants(path, schema, tuple(tables.values()), tuple(references), tuple(copies), tuple(relations),
                      unsupported, tuple(m.assumed), round(time.monotonic() - started, 3))

class InvariantStore:
    """Invariants per database file, mined once: in memory (an LRU) and on disk."""

    def __init__(self, disk: DiskCache | None = None, *, keep: int = 64, budget_s: float = DEFAULT_MINE_BUDGET_S):
        self.disk = disk if disk is not None else DiskCache()
        self.keep = keep
        self.budget_s = budget_s
        self._lock = threading.Lock()
        self._mem: OrderedDict[str, Invariants] = OrderedDict()
        self._building: dict[str, threading.Event] = {}

    def get(self, path: str) -> Invariants:
        key = database_key(path)
        while True:
            with self._lock:
                inv = self._mem.get(key)
                if inv is not None:
                    self._mem.move_to_end(key)
                    return inv
                event = self._building.get(key)
                if event is None:
                    event = self._building[key] = threading.Event()
                    break
            event.wait()
        try:
            inv = self._load(key, path)
            if inv is None:
                inv = mine(path, budget_s=self.budget_s)
                self.disk.store(f"{key}.invariants.json", inv.to_dict())
            with self._lock:
                self._mem[key] = inv
                while len(self._mem) > self.keep:
                    self._mem.popitem(last=False)
            return inv
        finally:
            with self._lock:
                self._building.pop(key, None)
            event.set()

    def _load(self, key: str, path: str) -> Invariants | None:
        data = self.disk.load(f"{key}.invariants.json")
        if data is None:
            return None
        try:
            inv = Invariants.from_dict(data)
        except (KeyError, TypeError, ValueError):
            return None
        return inv if inv.path == path else Invariants.from_dict({**data, "path": path})
