"""Drawing small databases from a real one: real rows, closed under the database's references, and
variants of them that stay within what the database's invariants allow.

- `RealRows` fetches rows of the real file through the core's guard (`Database.rows`: the tool call's
  policy, each statement under its timeout cut at the check's deadline, the Cancel and the temporary-disk
  cap; t2sql.serving.checkbounds), some of them with a prediction's own WHERE (t2sql.serving.lineage),
  and keeps what it fetched, at most ANSWER_BYTES of it.
- `close` makes a set of rows a database of this kind: every reference names a row that is there
  (a parent is fetched; a row whose parent the real file lacks is dropped), and every parent of a
  reference with total participation keeps a child (one of its real children is fetched).
- The variants change rows the way another real database of this kind could differ: a row
  duplicated under fresh keys (values borrowed from other real rows), a value set beside a query's
  literal (the literal itself, one above and below, the same text in another case, as part of a
  longer text, a later time on the same day), NULL where the column holds NULLs, integer keys
  renumbered with every reference to them.

Nothing here decides that a database is realistic: `SmallDb.problems()` does, and the check throws away
every database with a problem.
"""

from __future__ import annotations

import hashlib
import random
import re
import threading
from typing import Any, Iterable

import t2sql
from t2sql.serving import checkbounds, realism
from t2sql.serving.checkbounds import approx_bytes
from t2sql.serving.gold_memory import Lru
from t2sql.serving.invariants import Invariants, Reference, Table, quote
from t2sql.serving.querytext import Comparison
from t2sql.serving.smalldb import Row, SmallDb, column_index, remember, sqlite_key

MAX_ROWS = 120  # a small database larger than this after closing is not used

CLOSE_ROUNDS = 64  # each round follows every reference one step; the size cap stops growth

VALUES_PER_COLUMN = 64  # other real values of a column kept for borrowing

# The answers kept per database: at most this many bytes of them (a few rows each; a check asks the
# same rows again and again: the lookups of closing, the values of a column).
ANSWER_BYTES = 16 * 1024 * 1024

ANSWER_MAX_ROWS = 1000  # rows one statement brings back (every statement here has a smaller LIMIT)

ANSWER_MAX_BYTES = 1024 * 1024  # bytes one statement brings back: a row past it is not fetched

# A lookup that no index serves (a child by its reference, a row holding a literal, a column's values)
# reads at most the first SCAN_ROWS rows of its table (in rowid order, the same rows every time): the
# work of a check does not grow with the table. Rows past them are not found, so a larger table gives
# fewer small databases, never an unrealistic one; a table of up to SCAN_ROWS rows is read whole.
SCAN_ROWS = 100_000

# A query's lineage (t2sql.serving.lineage: its own joins and subqueries, pasted) runs, where a table holds
# more than JOIN_SCAN_ROWS rows, on the database's first rows: every table's first JOIN_SCAN_ROWS rows under
# their real rowids, copied once into an in-memory database of the core (`RealRows.first_rows`). A join no
# index serves builds one over every row of its table, per statement: on the real file that grows with the
# table, there with the copy. A copy past FIRST_ROWS_BYTES (or one the schema refuses) is not made: the
# lineage then runs on the real file, its tables shadowed by their first rows.
JOIN_SCAN_ROWS = 32_768
FIRST_ROWS_BYTES = 64 * 1024 * 1024

# An equality lookup on one column that no index serves (a child by its reference, a row by a value) reads
# the column once per database instead of once per lookup: each value of it in the rows the lookup may
# reach (RealRows.scope) with the first LOOKUP_ROWIDS rowids holding it, kept in memory (at most
# LOOKUP_BYTES per database: a column past that is looked up by reading again); a lookup then fetches
# its rows by rowid. The rows found are those the reading would find, in the same order.
LOOKUP_ROWIDS = 16
LOOKUP_BYTES = 32 * 1024 * 1024
LOOKUP_PAGE = 16384  # rows one statement of that reading brings back

_INDEX = re.compile(r'CREATE\s+(?:UNIQUE\s+)?INDEX\s+(?:IF\s+NOT\s+EXISTS\s+)?\S+\s+ON\s+'
                    r'("(?:[^"]|"")+"|\[[^\]]+\]|`[^`]+`|[^\s(]+)\s*\(\s*("(?:[^"]|"")+"|\[[^\]]+\]|`[^`]+`|[^\s,)]+)',
                    re.I)

_UNREAD = object()


def stable_rng(*parts: Any) -> random.Random:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))

class RealRows:
    """Rows of one real database file, fetched on demand through the core's guard and kept (bounded in
    bytes). Thread-safe (one lock: one connection)."""

    def __init__(self, path: str, inv: Invariants, *, timeout_s: float = 5.0):
        self.path = path
        self.inv = inv
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self.db = t2sql.Database(path)
        self._answers: Lru[list[tuple]] = Lru(1 << 30, ANSWER_BYTES, lambda k, v: approx_bytes(k) + approx_bytes(v))
        self._index_list: list[tuple[str, str]] | None = None
        self._lookups: dict[tuple[str, str], dict[Any, list[int]] | None] = {}  # (table, column) -> rowids
        self._lookup_bytes = 0
        self._first_rows: Any = _UNREAD  # the in-memory copy of the first rows, None where not made

    def close(self) -> None:
        with self._lock:
            self.db.close()
            if self._first_rows not in (_UNREAD, None):
                self._first_rows.close()

    def first_rows(self) -> Any:
        """The core's in-memory copy of every table's first JOIN_SCAN_ROWS rows (under their real rowids),
        made at first use; None when no table holds more, or when it cannot be made (FIRST_ROWS_BYTES, a
        constraint of the schema). A check's deadline or Cancel that stops the copy raises, and the next
        check makes it again."""
        if self._first_rows is not _UNREAD:
            return self._first_rows
        if not any(t.rows > JOIN_SCAN_ROWS for t in self.inv.tables):
            self._first_rows = None
            return None
        tables, size = [], 0
        for t in self.inv.tables:
            cols = ", ".join(quote(c) for c in t.column_names)
            rows: list[tuple] = []
            while len(rows) < JOIN_SCAN_ROWS and t.rowid:
                after = rows[-1][0] if rows else None
                sql = (f"SELECT rowid, {cols} FROM {quote(t.name)} WHERE {'1' if after is None else 'rowid > ?'} "
                       f"ORDER BY rowid LIMIT {min(LOOKUP_PAGE, JOIN_SCAN_ROWS - len(rows))}")
                checkbounds.wait_for(lambda w: self._lock.acquire(timeout=w))
                try:
                    page = self._run(sql, () if after is None else (after,), LOOKUP_PAGE, FIRST_ROWS_BYTES)
                finally:
                    self._lock.release()
                size += approx_bytes(page) if page else 0
                if page is None or size > FIRST_ROWS_BYTES:
                    self._first_rows = None
                    return None
                rows += page
                if len(page) < LOOKUP_PAGE:
                    break
            if not t.rowid:  # a table without rowid cannot be cut by one: no copy
                self._first_rows = None
                return None
            tables.append((t.name, ["rowid", *t.column_names], rows))
        budget = checkbounds.current()
        try:
            made = budget.run(self.timeout_s, lambda w: t2sql.Database.from_rows(
                "first rows", list(self.inv.schema), tables, timeout_s=w, cancel=budget.cancel,
                max_temp_mb=budget.max_temp_mb))
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:
            made = None
        with self._lock:
            if self._first_rows is _UNREAD:
                self._first_rows = made
            elif made is not None:
                made.close()  # another thread made it first
        return self._first_rows

    def first_rows_answer(self, sql: str) -> list[tuple]:
        """`rows` of a statement run on `first_rows()` (which must be there): kept alike."""
        key = ("first rows", sql)
        got = self._answers.get(key)
        if got is not None:
            return got
        core = self._first_rows
        budget = checkbounds.current()
        checkbounds.wait_for(lambda w: self._lock.acquire(timeout=w))
        try:
            got = budget.run(self.timeout_s, lambda w: core.rows(
                sql, [], timeout_s=w, max_temp_mb=budget.max_temp_mb, max_rows=ANSWER_MAX_ROWS,
                max_bytes=ANSWER_MAX_BYTES, cancel=budget.cancel))
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:
            got = []
        finally:
            self._lock.release()
        self._answers.put(key, got)
        return got

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows of a statement (ours, or holding a prediction's clauses: the core's policy either
        way); [] when it fails or runs past its timeout. Answers are kept (the file's content is what
        names this RealRows, and the checks of one task ask alike); a statement the check's deadline
        or Cancel stopped raises (BudgetSpent, QueryCancelled) and is not kept."""
        key = (sql, params)
        got = self._answers.get(key)
        if got is not None:
            return got
        checkbounds.wait_for(lambda t: self._lock.acquire(timeout=t))
        try:
            got = self._answers.get(key)
            if got is not None:
                return got
            got = self._run(sql, params, ANSWER_MAX_ROWS, ANSWER_MAX_BYTES)
        finally:
            self._lock.release()
        got = got if got is not None else []
        self._answers.put(key, got)
        return got

    def answer(self, sql: str, timeout_s: float, max_rows: int = ANSWER_MAX_ROWS) -> list[tuple] | None:
        """The first `max_rows` rows of a statement run under `timeout_s` (cut at the check's deadline), or None
        when it fails or runs past it; not kept."""
        checkbounds.wait_for(lambda t: self._lock.acquire(timeout=t))
        try:
            return self._run(sql, (), max_rows, ANSWER_MAX_BYTES, min(timeout_s, self.timeout_s))
        finally:
            self._lock.release()

    def _run(self, sql: str, params: tuple, max_rows: int, max_bytes: int,
             timeout_s: float | None = None) -> list[tuple] | None:
        """One statement on the connection (the caller holds the lock); None when it fails."""
        budget = checkbounds.current()
        try:
            return budget.run(timeout_s or self.timeout_s, lambda t: self.db.rows(
                sql, list(params), timeout_s=t, max_temp_mb=budget.max_temp_mb, max_rows=max_rows,
                max_bytes=max_bytes, cancel=budget.cancel))
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:
            return None

    def _select(self, t: Table) -> str:
        return f"SELECT {', '.join(quote(c) for c in t.column_names)} FROM {quote(t.name)}"

    def scope(self, t: Table, columns: tuple[str, ...] = ()) -> tuple[str, tuple]:
        """(condition, parameters) that keep a lookup on `columns` within the table's first SCAN_ROWS rows,
        or ("1", ()) when an index serves it or the table is that small (or has no rowid to range on)."""
        bound = None if columns and self._indexed(t, columns) else self.first_rows_bound(t)
        return ("1", ()) if bound is None else ("rowid <= ?", (bound,))

    def first_rows_bound(self, t: Table, rows: int | None = None) -> int | None:
        """The rowid that ends the table's first `rows` rows (SCAN_ROWS), or None when the table is no larger
        (or has no rowid to range on)."""
        rows = SCAN_ROWS if rows is None else rows
        if t.rows <= rows or not t.rowid:
            return None
        got = self.rows(f"SELECT max(rowid) FROM (SELECT rowid FROM {quote(t.name)} ORDER BY rowid "
                        f"LIMIT {rows})")
        return got[0][0] if got and isinstance(got[0][0], int) else 0

    def _indexed(self, t: Table, columns: tuple[str, ...]) -> bool:
        """Whether an index of the real file leads with one of `columns` (the rowid alias, a declared key,
        a CREATE INDEX of the schema)."""
        low = {c.lower() for c in columns}
        if t.integer_key is not None and t.integer_key.lower() in low:
            return True
        declared = any(c.pk for c in t.columns) or not (len(t.keys) == 1 and len(t.keys[0]) == len(t.columns))
        if declared and any(k and k[0].lower() in low for k in t.keys):
            return True
        return any(table == t.name.lower() and column in low for table, column in self._indexes())

    def _indexes(self) -> list[tuple[str, str]]:
        """(table, first column) of each CREATE INDEX in the schema, lower case and unquoted."""
        if self._index_list is None:
            found = [m.groups() for m in (_INDEX.match(sql.strip()) for sql in self.inv.schema) if m]
            self._index_list = [(_unquote(a).lower(), _unquote(b).lower()) for a, b in found]
        return self._index_list

    def _equal_rows(self, t: Table, column: str, value: Any, limit: int) -> list[Row] | None:
        """The rows (the first `limit` by rowid, within `scope`) whose `column` equals `value`, found through
        the column's lookup (LOOKUP_ROWIDS); None where it does not serve (an index does, the column holds
        more than one storage class or `value` is of another, a collation, a lookup past LOOKUP_BYTES)."""
        col = t.column(column)
        kind = {("text",): str, ("integer",): int}.get(col.types) if col is not None and col.mined else None
        if (kind is None or type(value) is not kind or not t.rowid or limit > LOOKUP_ROWIDS
                or self._indexed(t, (column,)) or self._collates(t)):
            return None
        key = (t.name, column)
        if key not in self._lookups:
            self._lookups[key] = self._read_lookup(t, column)
        found = self._lookups[key]
        if found is None:
            return None
        ids = found.get(value, [])[:limit]
        if not ids:
            return []
        marks = ", ".join("?" * len(ids))
        return self.rows(f"{self._select(t)} WHERE rowid IN ({marks}) AND {quote(column)} = ? ORDER BY rowid "
                         f"LIMIT {limit}", (*ids, value))

    def _read_lookup(self, t: Table, column: str) -> dict[Any, list[int]] | None:
        """Each value of `column` in the rows `scope` allows, with its first LOOKUP_ROWIDS rowids (in order);
        None when it fails or would pass LOOKUP_BYTES."""
        scope, bound = self.scope(t)
        q = quote(column)
        found: dict[Any, list[int]] = {}
        size, after = 0, None
        while True:
            start = "1" if after is None else "rowid > ?"
            sql = (f"SELECT rowid, {q} FROM {quote(t.name)} WHERE {scope} AND {start} AND {q} IS NOT NULL "
                   f"ORDER BY rowid LIMIT {LOOKUP_PAGE}")
            checkbounds.wait_for(lambda w: self._lock.acquire(timeout=w))
            try:
                page = self._run(sql, bound + (() if after is None else (after,)), LOOKUP_PAGE, 64 * LOOKUP_PAGE * 1024)
            finally:
                self._lock.release()
            if page is None:
                return None
            for rowid, value in page:
                ids = found.get(value)
                if ids is None:
                    found[value] = [rowid]
                    size += 160 + approx_bytes(value)
                elif len(ids) < LOOKUP_ROWIDS:
                    ids.append(rowid)
                    size += 8
            if self._lookup_bytes + size > LOOKUP_BYTES:
                return None
            if len(page) < LOOKUP_PAGE:
                break
            after = page[-1][0]
        self._lookup_bytes += size
        return found

    def _collates(self, t: Table) -> bool:
        """Whether the table's schema names a collation (equality there is not Python's)."""
        name = t.name.lower()
        return any("collate" in sql.lower() and name in sql.lower() for sql in self.inv.schema)

    def by_rowids(self, table: str, rowids: Iterable[Any]) -> list[Row]:
        t = self.inv.table(table)
        ids = [r for r in rowids if r is not None]
        if t is None or not ids:
            return []
        if t.rowid:
            marks = ", ".join("?" * len(ids))
            return self.rows(f"{self._select(t)} WHERE rowid IN ({marks}) ORDER BY rowid", tuple(ids))
        return []

    def equal_rows(self, table: str, columns: tuple[str, ...], values: tuple, limit: int) -> list[Row]:
        """The first `limit` real rows of `table` (by rowid, within `scope`) whose `columns` hold `values`."""
        t = self.inv.table(table)
        got = self._equal_rows(t, columns[0], values[0], limit) if len(columns) == 1 else None
        if got is None:
            cond = " AND ".join(f"{quote(c)} = ?" for c in columns)
            scope, bound = self.scope(t, columns)
            order = " ORDER BY rowid" if t.rowid else ""
            got = self.rows(f"{self._select(t)} WHERE {scope} AND {cond}{order} LIMIT {limit}", bound + tuple(values))
        return got

    def by_key(self, table: str, columns: tuple[str, ...], values: tuple) -> Row | None:
        """One real row of `table` whose `columns` hold `values` (the lowest rowid), or None."""
        got = self.equal_rows(table, columns, values, 1)
        return got[0] if got else None

    def children(self, ref: Reference, parent_key: tuple, limit: int = 1) -> list[Row]:
        return self.equal_rows(ref.child, ref.child_columns, parent_key, limit)

    def values(self, table: str, column: str) -> list[Any]:
        """Up to VALUES_PER_COLUMN distinct non-NULL real values of a column (the same ones every time)."""
        q = quote(column)
        t = self.inv.table(table)
        scope, bound = self.scope(t, (column,)) if t is not None else ("1", ())
        got = self.rows(f"SELECT DISTINCT {q} FROM {quote(table)} WHERE {scope} AND {q} IS NOT NULL "
                        f"LIMIT {VALUES_PER_COLUMN}", bound)
        return [r[0] for r in got]

    def values_with_prefix(self, table: str, column: str, prefix: str) -> list[Any]:
        """Up to VALUES_PER_COLUMN distinct real values of a text column that start with `prefix` and are longer."""
        q = quote(column)
        t = self.inv.table(table)
        col = t.column(column) if t is not None else None
        upper = _after_prefixed(prefix)
        if col is not None and col.types == ("text",) and upper is not None and self._indexed(t, (column,)):
            # The index's range (texts sort by their code points, as their UTF-8 bytes do): the same values,
            # found without reading the table.
            scope, bound = f"{q} >= ?2 AND {q} < ?3", (prefix, upper)
        elif t is not None:
            scope, bound = self.scope(t)
            scope = scope.replace("?", "?2")
        else:
            scope, bound = "1", ()
        got = self.rows(f"SELECT DISTINCT {q} FROM {quote(table)} WHERE {scope} AND substr({q}, 1, length(?1)) = ?1 "
                        f"AND length({q}) > length(?1) LIMIT {VALUES_PER_COLUMN}", (prefix, *bound))
        return [r[0] for r in got]

    def random_rows(self, table: str, k: int, rng: random.Random) -> list[Row]:
        t = self.inv.table(table)
        if t is None or t.rows == 0 or k <= 0:
            return []
        if not t.rowid:
            offsets = sorted({rng.randrange(t.rows) for _ in range(k)})
            return [r for off in offsets for r in self.rows(f"{self._select(t)} LIMIT 1 OFFSET {off}")]
        # Each its own statement: SQLite reads a min() or a max() alone off the b-tree, the two together by a scan.
        got = self.rows(f"SELECT (SELECT min(rowid) FROM {quote(table)}), (SELECT max(rowid) FROM {quote(table)})")
        lo, hi = got[0] if got and got[0][0] is not None else (0, 0)
        out = []
        for _ in range(k):
            at = rng.randint(lo, hi)
            out += self.rows(f"{self._select(t)} WHERE rowid >= ? ORDER BY rowid LIMIT 1", (at,))
        return out

    def matching(self, c: Comparison, limit: int) -> list[Row]:
        """Real rows of c.table whose column equals one of c's literals, or is nearest to it (numbers),
        or holds it in another case or inside a longer text."""
        t = self.inv.table(c.table)
        if t is None:
            return []
        q = quote(c.column)
        out: list[Row] = []
        near, near_bound = self.scope(t)  # the nearest value: every row is a candidate
        for lit in c.literals[:4]:
            if isinstance(lit, (int, float)):
                out += self.rows(f"{self._select(t)} WHERE {near} AND {q} IS NOT NULL AND typeof({q}) IN "
                                 f"('integer', 'real') ORDER BY abs({q} - ?) LIMIT {limit}", near_bound + (lit,))
            elif isinstance(lit, str):
                plain = lit.strip("%")
                out += self.equal_rows(t.name, (c.column,), (lit,), limit)
                if plain:
                    out += self.rows(f"{self._select(t)} WHERE {near} AND {q} LIKE ? LIMIT {limit}",
                                     near_bound + (f"%{plain}%",))
        return out

def _after_prefixed(prefix: str) -> str | None:
    """The least text past every text that starts with `prefix` (its last character the next code point), or
    None when there is none to name (an empty prefix, or one ending in the last code point)."""
    if not prefix or ord(prefix[-1]) >= 0x10FFFF or 0xD7FF <= ord(prefix[-1]) < 0xE000:
        return None
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] + name[-1] in ('""', "[]", "``"):
        return name[1:-1].replace('""', '"') if name[0] == '"' else name[1:-1]
    return name


def entity_present(db: SmallDb, table: Table, row: Row) -> bool:
    """Whether a row with `row`'s primary key is in `db` (False for a table without one)."""
    if not table.keys:
        return False
    idx = [column_index(table, c) for c in table.keys[0]]
    key = sqlite_key(tuple(row[i] for i in idx))
    return any(sqlite_key(tuple(r[i] for i in idx)) == key for r in db.rows.get(table.name, []))

def add_rows(db: SmallDb, table: str, rows: Iterable[Row]) -> None:
    present = set(db.table_rows(table))
    for r in rows:
        if r not in present:
            db.table_rows(table).append(r)
            present.add(r)

def close(db: SmallDb, real: RealRows, *, max_rows: int = MAX_ROWS) -> SmallDb | None:
    """`db` made whole: parents fetched for every reference, a child fetched for every parent that must
    have one, rows whose parent the real file lacks dropped. None when it grows past `max_rows`. The
    answer is remembered by the rows it starts from (Invariants.memo): variants repeat them."""
    key = ("closed", db.key(), max_rows)
    found = db.inv.memo.get(key)
    if found is not None:
        if found is False:  # it could not be closed
            return None
        db.rows = {t: list(r) for t, r in found.items()}
        return db
    closed = _close(db, real, max_rows)
    remember(db.inv.memo, key, False if closed is None else {t: tuple(r) for t, r in closed.rows.items()})
    return closed


def _close(db: SmallDb, real: RealRows, max_rows: int) -> SmallDb | None:
    inv = db.inv
    doomed: set[tuple[str, Row]] = set()  # rows whose parent the real file lacks: never added again
    for _ in range(CLOSE_ROUNDS):
        changed = realism.add_mirrors(inv, db.rows)  # a symmetric table's rows come both ways
        for ref in inv.references:
            child, parent = inv.table(ref.child), inv.table(ref.parent)
            ci = [column_index(child, c) for c in ref.child_columns]
            pi = [column_index(parent, c) for c in ref.parent_columns]
            have = {sqlite_key(tuple(r[i] for i in pi)) for r in db.rows.get(parent.name, [])}
            keep = []
            for r in db.rows.get(child.name, []):
                k = tuple(r[i] for i in ci)
                if any(v is None for v in k) or sqlite_key(k) in have:
                    keep.append(r)
                    continue
                p = real.by_key(parent.name, ref.parent_columns, k)
                if p is None or (parent.name, p) in doomed:
                    changed = True  # the real file holds no such parent: this row cannot come along
                    doomed.add((child.name, r))
                    continue
                add_rows(db, parent.name, [p])
                have.add(sqlite_key(k))
                keep.append(r)
                changed = True
            db.rows[child.name] = keep
        for ref in inv.references:
            if not ref.total:
                continue
            child, parent = inv.table(ref.child), inv.table(ref.parent)
            ci = [column_index(child, c) for c in ref.child_columns]
            pi = [column_index(parent, c) for c in ref.parent_columns]
            named = {sqlite_key(tuple(r[i] for i in ci)) for r in db.rows.get(child.name, [])}
            keep = []
            for p in db.rows.get(parent.name, []):
                k = tuple(p[i] for i in pi)
                if sqlite_key(k) in named:
                    keep.append(p)
                    continue
                # A real child whose entity is here already (changed by a variant) cannot come in again.
                kids = [c for c in real.children(ref, k, limit=4)
                        if (child.name, c) not in doomed and not entity_present(db, child, c)]
                changed = True
                if not kids:
                    doomed.add((parent.name, p))  # no child it could keep: it cannot stay, nor come back
                    continue
                add_rows(db, child.name, kids[:1])
                named.add(sqlite_key(k))
                keep.append(p)
            db.rows[parent.name] = keep
        if db.size > max_rows:
            return None
        if not changed:
            return db
    return None

def fresh_value(db: SmallDb, table: str, column: str, real: RealRows, rng: random.Random,
                prefix: str | None = None) -> Any:
    """A real value of the column that no row of `db` holds there (None when there is none); with `prefix`,
    one that starts with it (t2sql.serving.realism's prefixes)."""
    t = db.inv.table(table)
    i = column_index(t, column)
    used = {sqlite_key((r[i],)) for r in db.rows.get(t.name, [])}
    values = real.values(t.name, column) if prefix is None else real.values_with_prefix(t.name, column, prefix)
    pool = [v for v in values if sqlite_key((v,)) not in used]
    if prefix is not None:
        return pool[rng.randrange(len(pool))] if pool else None
    if pool:
        return pool[rng.randrange(len(pool))]
    col = t.column(column)
    if col is not None and "integer" in col.types:  # an integer key beyond every value in use
        ints = [r[i] for r in db.rows.get(t.name, []) if isinstance(r[i], int)]
        return (max(ints) + 1) if ints else 1
    return None

def duplicate(db: SmallDb, table: str, row: Row, real: RealRows, rng: random.Random,
              changes: dict[str, Any] | None = None, hold: frozenset[str] = frozenset()) -> Row | None:
    """A copy of `row` as a new entity: every key and unique column given a fresh value (a reference
    column of a key points to another parent that is in `db`, one in `hold` only when no other will do),
    `changes` applied. Appended to `db`."""
    inv = db.inv
    t = inv.table(table)
    new = list(row)
    for name, value in (changes or {}).items():
        new[column_index(t, name)] = value
        new = list(repair_relations(inv, table, tuple(new), name))
    for c, ref in realism.pair_names(inv, t):
        if changes and c in changes:
            continue
        parent = inv.table(ref.parent)
        ci, pi = column_index(t, c), column_index(parent, ref.parent_columns[0])
        named = next((p for p in db.rows.get(parent.name, []) if same_value(p[pi], row[ci])), None)
        copied = duplicate(db, parent.name, named, real, rng) if named is not None else None
        if copied is None:
            return None
        new[ci] = copied[pi]
    # A mined unique set the changes already made new (a budget row copied for a new event keeps its
    # category) needs no fresh values: fresh ones would change what the copy means (no longer 'Food'),
    # and a closed vocabulary soon runs out of them.
    mined_sets = [s for s in realism.unique_sets(inv, t.name)
                  if not _new_combination(t, s, new, db.rows.get(t.name, []))]
    keys = (*t.keys, *mined_sets)  # column sets that never repeat, declared or mined
    fresh_cols: list[str] = []
    for key in keys:
        fresh_cols += [c for c in key if c not in fresh_cols]
    fresh_cols += [c.name for c in t.columns if c.unique and c.name not in fresh_cols]
    if not fresh_cols and t.rowid:
        db.table_rows(table).append(tuple(new))  # no key: the same values again are another row
        return tuple(new)
    ref_cols = {c: ref for ref in inv.references if ref.child == t.name and len(ref.child_columns) == 1
                for c in ref.child_columns}
    for key in keys:
        # A composite key made of references (a link table): point one part at another parent that is in
        # `db`, such that the key is new.
        if all(c in ref_cols for c in key) and not any(c in (changes or {}) for c in key):
            idx = [column_index(t, c) for c in key]
            present = {sqlite_key(tuple(r[i] for i in idx)) for r in db.rows.get(t.name, [])}
            done = False
            for c in sorted(key, key=lambda name: name in hold):
                ref = ref_cols[c]
                parent = inv.table(ref.parent)
                pi = column_index(parent, ref.parent_columns[0])
                mine = row[column_index(t, c)]
                options = [p[pi] for p in db.rows.get(parent.name, []) if not same_value(p[pi], mine)]
                rng.shuffle(options)
                for option in options:
                    trial = list(new)
                    trial[column_index(t, c)] = option
                    if sqlite_key(tuple(trial[i] for i in idx)) not in present:
                        new, done = trial, True
                        break
                if done:
                    break
            if not done:
                return None
            fresh_cols = [c for c in fresh_cols if c not in key]
    for c in fresh_cols:
        if (c in ref_cols and not t.column(c).unique) or (changes and c in changes):
            continue  # a unique reference (one member a zip code) takes another real value: close fetches its row
        value = fresh_value(db, table, c, real, rng, realism.prefix_of(inv, t, c, tuple(new)))
        if value is None:
            return None
        new[column_index(t, c)] = value
    out = tuple(new)
    db.table_rows(table).append(out)
    return out

def _new_combination(t: Table, columns: tuple[str, ...], row: list, rows: list[Row]) -> bool:
    """Whether `row` holds `columns` together as no row of `rows` does (a NULL among them: never a repeat)."""
    idx = [column_index(t, c) for c in columns]
    mine = sqlite_key(tuple(row[i] for i in idx))
    return None in mine or all(sqlite_key(tuple(r[i] for i in idx)) != mine for r in rows)


def repair_relations(inv: Invariants, table: str, row: Row, changed: str) -> Row:
    """`row` after `changed` got a new value, with every sum it takes part in made whole again: a changed
    total moves its right term, a changed term moves the other term (a budget's amount stays, what is
    spent and what remains trade). Values keep their column's storage class; the database's check
    throws away what cannot be mended."""
    t = inv.table(table)
    out = list(row)
    for rel in inv.relations:
        if rel.table != t.name or changed not in (rel.total, rel.left, rel.right):
            continue
        s, a, b = (column_index(t, c) for c in (rel.total, rel.left, rel.right))
        if None in (out[s], out[a], out[b]) or not all(isinstance(out[i], (int, float)) for i in (s, a, b)):
            continue
        if changed == rel.total:
            target, value = b, out[s] - out[a]
        elif changed == rel.left:
            target, value = b, out[s] - out[a]
        else:
            target, value = a, out[s] - out[b]
        col = t.columns[target]
        if col.types == ("integer",) and isinstance(value, float):
            if not value.is_integer():
                continue
            value = int(value)
        elif "real" in col.types and "integer" not in col.types:
            value = float(value)
        out[target] = value
    return tuple(out)

def same_value(a: Any, b: Any) -> bool:
    return sqlite_key((a,)) == sqlite_key((b,))

def rekey(db: SmallDb, table: str) -> bool:
    """Renumber `table`'s INTEGER PRIMARY KEY among the values its rows hold (in reverse), and every
    reference to it: the same entities under other numbers. False when there is nothing to renumber."""
    inv = db.inv
    t = inv.table(table)
    if t is None or t.integer_key is None:
        return False
    ki = column_index(t, t.integer_key)
    rows = db.rows.get(t.name, [])
    keys = [r[ki] for r in rows]
    if len(keys) < 2:
        return False
    mapping = dict(zip(keys, reversed(keys)))
    db.rows[t.name] = [tuple(mapping.get(v, v) if i == ki else v for i, v in enumerate(r)) for r in rows]
    for ref in inv.references:
        if ref.parent != t.name or len(ref.parent_columns) != 1 or ref.parent_columns[0] != t.integer_key:
            continue
        child = inv.table(ref.child)
        ci = column_index(child, ref.child_columns[0])
        db.rows[child.name] = [tuple(mapping.get(v, v) if i == ci else v for i, v in enumerate(r))
                               for r in db.rows.get(child.name, [])]
    return True
