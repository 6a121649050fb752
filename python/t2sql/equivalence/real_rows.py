"""The rows of a real database file the equivalence check reads (`RealRows`): fetched on demand through
the core's guard (`Database.rows`: the tool call's policy, each statement under its timeout cut at the
check's deadline, the Cancel and the temporary-disk cap; t2sql.equivalence.checkbounds), some of them with a
prediction's own WHERE (t2sql.equivalence.lineage), and kept, at most ANSWER_BYTES of them. What a lookup
reads of a large table is bounded (below), so a check's work does not grow with the table.
"""

from __future__ import annotations

import random
import re
import threading
from typing import Any, Iterable

import t2sql
from t2sql.equivalence import checkbounds
from t2sql.equivalence.checkbounds import approx_bytes
from t2sql.equivalence.invariants import Invariants, Reference, Table, quote
from t2sql.equivalence.querytext import Comparison
from t2sql.equivalence.smalldb import Row
from t2sql.lru import Lru

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

# A query's lineage (t2sql.equivalence.lineage: its own joins and subqueries, pasted) runs, where a table holds
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

    def __enter__(self) -> RealRows:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def apart_in_case(self, table: str, column: str) -> bool:
        """Whether a column's real values (those `values` keeps of it) stay apart in lower case too."""
        texts = [v for v in self.values(table, column) if isinstance(v, str)]
        return len({v.lower() for v in texts}) == len(texts)

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



