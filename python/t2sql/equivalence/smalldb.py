"""A small database of a real one's kind: a few dozen rows under the real schema. `SmallDb.problems()` is the check's
safety net (a database that breaks any invariant is thrown away before a query sees it), `to_sql()` the witness a
refutation shows, `database()` builds it in the core, hardened like any other database."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from t2sql._grader import Database
from t2sql.equivalence import checkbounds, realism
from t2sql.equivalence.invariants import (
    TEXT_CACHED,
    Invariants,
    Table,
    TableRows,
    quote,
    sqlite_key,
    storage_class,
    text_format,
)

Row = tuple  # one row's values in its table's column order

BUILD_TIMEOUT_S = 5.0  # building one small database in the core, at most (a schema's CHECKs run per row)

INT64 = (-(1 << 63), (1 << 63) - 1)  # what an INTEGER cell can hold



@dataclass
class SmallDb:
    inv: Invariants
    rows: dict[str, list[Row]] = field(default_factory=dict)  # table name -> rows, in insertion order
    note: str = ""  # how it was made, for the witness
    # What the check's question presupposes (t2sql.equivalence.presupposed.Presupposition), checked with the
    # invariants; None: the invariants alone.
    presupposition: Any = None

    def copy(self, note: str | None = None) -> SmallDb:
        return SmallDb(self.inv, {t: list(r) for t, r in self.rows.items()}, self.note if note is None else note,
                       self.presupposition)

    def table_rows(self, table: str) -> list[Row]:
        return self.rows.setdefault(table, [])

    @property
    def size(self) -> int:
        return sum(len(r) for r in self.rows.values())

    def key(self) -> tuple:
        """What makes two small databases the same (their rows, in order)."""
        return tuple((t, tuple(rows)) for t, rows in sorted(self.rows.items()) if rows)

    # ------------------------------------------------------------------------------------ checks

    def problems(self) -> list[str]:
        """Every way this database breaks a declared constraint or a mined invariant ([] = none). Each check
        is remembered by the rows it reads (Invariants.memo): the variants of one database share most
        tables, so most checks of a variant are looked up, not redone."""
        out: list[str] = []
        tables = {t.name: t for t in self.inv.tables}
        rows = {name: TableRows(r) for name, r in self.rows.items()}
        empty: tuple = ()
        for name, table_rows in rows.items():
            t = tables.get(name)
            if t is None:
                out.append(f"no table {name}")
                continue
            out += self._remembered(("table", name, table_rows),
                                    lambda: _table_problems(t, table_rows, self.inv.identifiers(name)))
        fixed = self.presupposition.fixed_tables if self.presupposition is not None else frozenset()
        for ref in self.inv.references:
            if ref.total and ref.parent in fixed:
                # A vocabulary is whole whether or not each of its rows is in use here.
                ref = dataclasses.replace(ref, total=False)
            child, parent = rows.get(ref.child, empty), rows.get(ref.parent, empty)
            out += self._remembered(("reference", ref, child, parent),
                                    lambda: _reference_problems(tables, ref, child, parent))
        for cp in self.inv.copies:
            mine = rows.get(cp.table, empty)
            source = rows.get(cp.via.parent, empty) if cp.via is not None else empty
            out += self._remembered(("copy", cp, mine, source), lambda: _copy_problems(tables, cp, mine, source))
        for rel in self.inv.relations:
            mine = rows.get(rel.table, empty)
            out += self._remembered(("relation", rel, mine), lambda: _relation_problems(tables, rel, mine))
        out += realism.problems(self.inv, rows, self._remembered)
        if self.presupposition is not None:
            out += self.presupposition.problems(self)
        return out

    def _remembered(self, key: tuple, compute: Any) -> list[str]:
        found = self.inv.memo.get(key)
        if found is None:
            found = remember(self.inv.memo, key, compute())
        return found

    # ------------------------------------------------------------------------------------ outputs

    def tables_for_core(self, reverse: bool = False) -> list[tuple[str, list[str], list[Row]]]:
        out = []
        for t in self.inv.tables:
            rows = self.rows.get(t.name, [])
            out.append((t.name, list(t.column_names), list(reversed(rows)) if reverse else list(rows)))
        return out

    def database(self, label: str = "witness", *, reverse: bool = False,
                 timeout_s: float = BUILD_TIMEOUT_S) -> Database:
        """The database in the core (rows in reverse insertion order and reversed scans with `reverse`, to
        see whether a query's result depends on the order rows happen to come in), built under
        `timeout_s` cut at the check's deadline, and its Cancel (t2sql.equivalence.checkbounds). A row the
        schema refuses (a CHECK, a UNIQUE under a collation, a unique expression index: rules
        `problems()` cannot see) is t2sql.ConstraintError: that database cannot exist."""
        budget = checkbounds.current()
        return budget.run(timeout_s, lambda t: Database.from_rows(
            label, list(self.inv.schema), self.tables_for_core(reverse), reverse_scans=reverse, timeout_s=t,
            cancel=budget.cancel, max_temp_mb=budget.max_temp_mb))

    def to_sql(self) -> str:
        """The rows as INSERT statements (the schema is the real database's)."""
        lines = []
        for t in self.inv.tables:
            rows = self.rows.get(t.name, [])
            if not rows:
                continue
            cols = ", ".join(quote(c) for c in t.column_names)
            for r in rows:
                lines.append(f"INSERT INTO {quote(t.name)} ({cols}) VALUES ({', '.join(sql_literal(v) for v in r)});")
        return "\n".join(lines)


def remember(memo: Any, key: Any, value: Any) -> Any:
    """Keep `value` (never None) under `key` in a database's memo (Invariants.memo, bounded in bytes);
    returns the value."""
    memo.put(key, value)
    return value


def _projection(table: Table, rows: tuple, columns: Iterable[str]) -> list[tuple]:
    idx = [column_index(table, c) for c in columns]
    return [tuple(r[i] for i in idx) for r in rows]


def _reference_problems(tables: dict[str, Table], ref: Any, child_rows: tuple, parent_rows: tuple) -> list[str]:
    out = []
    child, parent = tables[ref.child], tables[ref.parent]
    parents = {sqlite_key(k) for k in _projection(parent, parent_rows, ref.parent_columns)}
    children = [k for k in _projection(child, child_rows, ref.child_columns) if None not in k]
    dangling = next((k for k in children if sqlite_key(k) not in parents), None)
    if dangling is not None:
        out.append(f"{ref.name}: {dangling!r} names no {ref.parent} row")
    if ref.total:
        named = {sqlite_key(k) for k in children}
        orphan = next((k for k in parents if k not in named), None)
        if orphan is not None:
            out.append(f"{ref.name}: {ref.parent} row {orphan!r} has no {ref.child} row")
    return out


def _copy_problems(tables: dict[str, Table], cp: Any, rows: tuple, source_rows: tuple) -> list[str]:
    t = tables[cp.table]
    col = column_index(t, cp.column)
    if cp.via is None:
        src = column_index(t, cp.source_column)
        bad = any(not _same(r[col], r[src]) for r in rows)
    else:
        parent = tables[cp.via.parent]
        keys = _projection(parent, source_rows, cp.via.parent_columns)
        by_key = {sqlite_key(k): r for k, r in zip(keys, source_rows)}
        src = column_index(parent, cp.source_column)
        bad = False
        for k, r in zip(_projection(t, rows, cp.via.child_columns), rows):
            p = by_key.get(sqlite_key(k))
            if p is not None and not _same(r[col], p[src]):
                bad = True
                break
    return [f"{cp.table}.{cp.column} no longer equals {cp.source}.{cp.source_column}"] if bad else []


def _relation_problems(tables: dict[str, Table], rel: Any, rows: tuple) -> list[str]:
    t = tables[rel.table]
    s, a, b = (column_index(t, c) for c in (rel.total, rel.left, rel.right))
    for r in rows:
        if None in (r[s], r[a], r[b]):
            continue
        if abs(r[a] + r[b] - r[s]) > 1e-9 * max(1.0, abs(r[s])):
            return [f"{rel.table}.{rel.total} is no longer {rel.left} + {rel.right}"]
    return []


def sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("9e999" if value > 0 else "-9e999")
    if isinstance(value, bytes):
        return "X'" + value.hex() + "'"
    return "'" + str(value).replace("'", "''") + "'"


def column_index(table: Table, column: str) -> int:
    i = table.position(column)
    if i is None:
        raise KeyError(f"{table.name} has no column {column}")
    return i


def _same(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return sqlite_key((a,)) == sqlite_key((b,))


def letter_cases(text: str) -> frozenset[str]:
    """The letter cases (ASCII) a text uses; remembered for short texts only (a cell may hold megabytes)."""
    return _letter_cases_short(text) if len(text) <= TEXT_CACHED else _letter_cases(text)


def _letter_cases(text: str) -> frozenset[str]:
    out = set()
    if any("a" <= ch <= "z" for ch in text):
        out.add("lower")
    if any("A" <= ch <= "Z" for ch in text):
        out.add("upper")
    return frozenset(out)


_letter_cases_short = functools.lru_cache(maxsize=65536)(_letter_cases)


def _table_problems(t: Table, rows: list[Row], identifiers: frozenset[str] = frozenset()) -> list[str]:
    out = []
    width = len(t.columns)
    if any(len(r) != width for r in rows):
        return [f"{t.name}: a row without {width} values"]
    for key in t.keys:
        idx = [column_index(t, c) for c in key]
        seen = set()
        for r in rows:
            k = sqlite_key(tuple(r[i] for i in idx))
            if any(v is None for v in k):
                continue  # SQLite lets NULLs repeat in a UNIQUE key (a NULL primary key is caught below)
            if k in seen:
                out.append(f"{t.name}: key ({', '.join(key)}) {k!r} repeats")
                break
            seen.add(k)
    for i, c in enumerate(t.columns):
        values = [r[i] for r in rows]
        if any(v is None for v in values) and (c.pk or c.not_null or (c.mined and not c.nulls)):
            out.append(f"{t.name}.{c.name} never holds NULL")
        present = [v for v in values if v is not None]
        if c.unique:
            normed = [sqlite_key((v,)) for v in present]
            if len(set(normed)) != len(normed):
                out.append(f"{t.name}.{c.name} never repeats a value")
        if not c.mined or _column_keeps(c, present, c.name in identifiers):
            continue
        for v in present:  # which value breaks it first (the message names it)
            if type(v) is int and not INT64[0] <= v <= INT64[1]:
                out.append(f"{t.name}.{c.name}: {v} is past SQLite's 64-bit integers")
                break
            kind = storage_class(v)
            if kind not in c.types:
                out.append(f"{t.name}.{c.name} holds no {kind} values ({v!r})")
                break
            if kind == "text" and text_format(v) not in c.formats:
                out.append(f"{t.name}.{c.name}: {v!r} is not of the column's formats ({', '.join(c.formats)})")
                break
            if kind == "text" and c.name in identifiers and not letter_cases(v) <= set(c.cases):
                out.append(f"{t.name}.{c.name}: {v!r} has letters in a case the identifier never uses")
                break
    return out


def _column_keeps(c: Any, present: list, identifier: bool) -> bool:
    """Whether the column's non-NULL values keep its mined invariants (64-bit integers, storage classes,
    text formats, an identifier's letter cases): the same answer as `_table_problems`' loop over them,
    found a type and a distinct text at a time."""
    by_type = {type(v): v for v in present}
    if int in by_type:
        ints = [v for v in present if type(v) is int]
        if min(ints) < INT64[0] or max(ints) > INT64[1]:
            return False
    if not {storage_class(v) for v in by_type.values()} <= set(c.types):
        return False
    if any(isinstance(v, str) for v in by_type.values()):
        texts = {v for v in present if isinstance(v, str)}
        if not {text_format(v) for v in texts} <= set(c.formats):
            return False
        if identifier:
            cases = set(c.cases)
            if not all(letter_cases(v) <= cases for v in texts):
                return False
    return True
