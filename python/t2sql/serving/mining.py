"""Finding a database's invariants (t2sql.serving.invariants) in its file.

Mining runs SQL of our own through the core's guard: the schema through `Database.catalog` (the
pragmas no query may name, read on a connection that can read nothing else; t2sql.serving.declared
says what a small database takes of it and what is left out), everything else through
`Database.rows` (one read-only statement under the tool call's policy, a Cancel and mining's own
cap on temporary disk). Mining runs to the end: its work is bounded by what it reads (each statement
one pass over a table, a join along a reference, or a sort of one column), never by the clock, so the
same file gives the same invariants whatever the machine's load. A statement that fails (past the
temporary-disk cap, an answer too large) leaves its invariant unverified, and an unverified invariant
is never used: the database is then `unsupported`, with the reason, and the check skips it.

Mining is done ahead (`t2sql gold`, `t2sql-train prepare`, t2sql.serving.mine_ahead), not inside a
check; t2sql.serving.invariant_store keeps what it finds.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import t2sql
from t2sql.errors import T2sqlError
from t2sql.serving import realism
from t2sql.serving.declared import Shape, declared_references, listing, statements, table_shape
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

log = logging.getLogger("t2sql.serving.mining")

# No statement of mining's is timed out by load: this only ends one that hangs (a file on a dead mount).
STATEMENT_TIMEOUT_S = 6 * 3600.0

# Temporary disk per mining statement (a count(DISTINCT) sorts one column of one table): large enough for
# the release's largest columns; a statement past it leaves its invariant unverified (same file, same
# outcome).
MINE_TEMP_MB = 16 * 1024

MAX_RELATION_COLUMNS = 10  # numeric columns per table tried for a + b = c (10 columns: 360 triples)

MAX_COPY_PAIRS = 400  # column pairs per reference tried for a copy

SCAN_COLUMNS = 24  # columns per statement of a table's scan (8 results each: far below SQLite's 2,000)

ANSWER_BYTES = 4 * 1024 * 1024  # what one mining statement may return


class Unverified(T2sqlError):
    """A statement of mining's failed: what it was to verify, and why (caught inside mine(), which
    then reports the database unsupported)."""


class Reader:
    """Mining's statements on the core, each to its end (a hang guard aside), under mining's Cancel and
    temporary-disk cap. `rows` raises Unverified when a statement fails; `catalog` answers None (the
    part is left out, t2sql.serving.declared)."""

    def __init__(self, db: t2sql.Database, cancel: Any = None, max_temp_mb: int = MINE_TEMP_MB):
        self.db = db
        self.cancel = cancel
        self.max_temp_mb = max_temp_mb
        self.statements = 0

    def _ask(self, run: Callable[[], list[tuple]], fail: Callable[[str], Any]) -> Any:
        self.statements += 1
        try:
            return run()
        except t2sql.QueryCancelled:
            raise
        except t2sql.QueryTimeout:
            raise Unverified(f"a statement ran past {STATEMENT_TIMEOUT_S:g}s") from None
        except t2sql.T2sqlError as e:
            return fail(f"{type(e).__name__}: {e}"[:300])

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows of a statement of ours (through the guard); Unverified when it failed."""
        def fail(why: str) -> Any:
            raise Unverified(why)
        return self._ask(lambda: self.db.rows(
            sql, list(params), timeout_s=STATEMENT_TIMEOUT_S, max_temp_mb=self.max_temp_mb,
            max_bytes=ANSWER_BYTES, cancel=self.cancel), fail)

    def catalog(self, pragma: str, name: str | None = None) -> list[tuple] | None:
        """The rows of a catalog pragma (t2sql.Database.catalog), or None when it failed (the same for
        the same file)."""
        return self._ask(lambda: self.db.catalog(pragma, name, timeout_s=STATEMENT_TIMEOUT_S, cancel=self.cancel),
                         lambda why: None)


@dataclass
class _Miner:
    reader: Reader
    left_out: list[tuple[str, str, str]] = field(default_factory=list)

    def try_rows(self, what: str, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows; Unverified naming `what` when the statement failed (never None: an invariant is
        verified or the database is unsupported)."""
        try:
            return self.reader.rows(sql, params)
        except Unverified as e:
            raise Unverified(f"{what}: {e}") from None


def _scan(m: _Miner, name: str, cols: list[str], n_rows: int) -> dict[str, dict[str, Any]]:
    """NULLs, storage classes, text shapes and letter cases per column, SCAN_COLUMNS columns a statement
    (a table of hundreds of columns stays under SQLite's result width); a part that did not finish
    leaves its columns unmined."""
    stats: dict[str, dict[str, Any]] = {}
    t = quote(name)
    for at in range(0, len(cols), SCAN_COLUMNS):
        part_cols = cols[at:at + SCAN_COLUMNS]
        parts = []
        for c in part_cols:
            q = quote(c)
            parts.append(f"count({q})")
            parts += [f"sum(typeof({q}) = '{k}')" for k in ("integer", "real", "text", "blob")]
            shape = " ".join(f"WHEN {cond.format(q=q)} THEN '{fmt}'" for fmt, cond, _ in FORMATS)
            parts.append(f"group_concat(DISTINCT CASE WHEN typeof({q}) <> 'text' THEN NULL {shape} "
                         f"ELSE '{OTHER_TEXT}' END)")
            parts += [f"max(typeof({q}) = 'text' AND {q} GLOB '*[a-z]*')",
                      f"max(typeof({q}) = 'text' AND {q} GLOB '*[A-Z]*')"]
        what = f"NULLs, types and formats of {name}" + (f" (columns {at + 1}-{at + len(part_cols)})"
                                                          if len(cols) > SCAN_COLUMNS else "")
        scan = m.try_rows(what, f"SELECT {', '.join(parts)} FROM {t}")
        for i, c in enumerate(part_cols):
            row = scan[0]
            base = i * 8
            non_null = row[base] or 0
            stats[c] = dict(
                nulls=non_null < n_rows,
                types=tuple(k for k, v in zip(("integer", "real", "text", "blob"), row[base + 1:base + 5]) if v),
                formats=tuple(sorted(set(str(row[base + 5] or "").split(",")) - {""})),
                cases=tuple(k for k, v in zip(("lower", "upper"), row[base + 6:base + 8]) if v),
                mined=True)
    return stats


def _mine_table(m: _Miner, name: str, shape: Shape) -> Table:
    info, rowid, keys = shape.info, shape.rowid, list(shape.keys)
    cols = [r[0] for r in info]
    t = quote(name)
    n_rows = 0
    counted = m.try_rows(f"row count of {name}", f"SELECT count(*) FROM {t}")
    if counted and isinstance(counted[0][0], int):
        n_rows = counted[0][0]
    # NULLs, storage classes and text shapes in a scan; distinct counts one column each (they sort), so
    # a slow one costs only its own invariant.
    stats = _scan(m, name, cols, n_rows)
    declared_unique = {k[0] for k in keys if len(k) == 1}
    for c in cols:
        if c in declared_unique:
            stats[c]["unique"] = True
            continue
        got = m.try_rows(f"repeats in {name}.{c}",
                         f"SELECT count({quote(c)}) = count(DISTINCT {quote(c)}) FROM {t}")
        stats[c]["unique"] = bool(got[0][0])
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
        if got[0][0]:
            keys.append(tuple(cols))
    return Table(name, tuple(columns), n_rows, rowid, integer_key, tuple(keys))


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
    declared = declared_references(m.reader, tables, m.left_out)
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
            if dangling[0][0] or not dangling[0][1]:
                continue  # an undeclared reference counts only when the data proves it closed
        orphans = m.try_rows(f"every {parent} row has a {child} row",
                             f"SELECT EXISTS (SELECT 1 FROM {p} WHERE {parent_cols} NOT IN "
                             f"(SELECT {', '.join(quote(a) for a in ccols)} FROM {c} WHERE {not_null})), "
                             f"EXISTS (SELECT 1 FROM {p})")
        total = not orphans[0][0] and bool(orphans[0][1])
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
        if not got[0][0]:
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
        row = got[0]
        for i, (total, a, b) in enumerate(triples):
            # Held in every row, and in at least three rows where neither term is 0 (else a + 0 = a is luck).
            if row[2 * i] == 0 and (row[2 * i + 1] or 0) >= 3:
                out.append(Relation(t.name, total.name, a.name, b.name))
    return out

def mine(path: str, *, cancel: Any = None, max_temp_mb: int = MINE_TEMP_MB) -> Invariants:
    """The invariants of the database file at `path` (no cache), mined to the end; `cancel` (a
    t2sql.Cancel) stops it (QueryCancelled). A statement that fails makes them `unsupported`, naming the
    invariant it was to verify; a file that is not a readable database raises DatabaseError."""
    started = time.monotonic()
    with t2sql.Database(path) as db:  # a file that is not a readable database: DatabaseError
        m = _Miner(Reader(db, cancel, max_temp_mb))
        try:
            return _mine(path, m, started)
        except Unverified as e:
            return unsupported(path, f"mining could not verify {e}", time.monotonic() - started)


def unsupported(path: str, why: str, mine_s: float = 0.0) -> Invariants:
    """Invariants that say no small database of this file is built, and why (kept like any others, so
    that the file is not mined again)."""
    return Invariants(path, (), (), (), (), (), why, round(mine_s, 3))


def _mine(path: str, m: _Miner, started: float) -> Invariants:
    listed, kinds = listing(m.reader, path)
    left: set[str] = set()
    shapes: dict[str, Shape] = {}
    for item in listed:
        if item.kind != "table":
            continue
        kind, without_rowid = kinds.get(item.name, ("table", False))
        if kind == "virtual" or re.match(r"\s*CREATE\s+VIRTUAL\b", item.sql, re.I):
            why = "a virtual table"
        elif kind == "shadow":
            why = "a virtual table's own storage"
        else:
            shape = table_shape(m.reader, item.name, without_rowid)
            if shape is not None:
                shapes[item.name] = shape
                continue
            why = "the catalog cannot describe it"
        m.left_out.append(("table", item.name, why))
        left.add(item.name.lower())
    schema = statements(listed, left, m.left_out)
    tables = {n: _mine_table(m, n, shape) for n, shape in shapes.items()}
    references = _references(m, tables)
    copies = _copies(m, tables, references)
    relations = _relations(m, tables)
    realistic = realism.mine(m.reader.rows, tables, references)
    why = "" if tables else "no table a small database can hold"
    return Invariants(path, schema, tuple(tables.values()), tuple(references), tuple(copies), tuple(relations),
                      why, round(time.monotonic() - started, 3), tuple(dict.fromkeys(m.left_out)), **realistic)
