"""The real rows a query touches: for each of its SELECTs, the keys of the rows its FROM joins and its WHERE keeps,
and of those meeting all but one of its conditions, fetched from the real file (or the core's copy of a large
table's first rows) through RealRows; and how to copy what one result row joins as new entities."""

from __future__ import annotations

import re
from typing import Any

from t2sql.equivalence import querytext, real_rows
from t2sql.equivalence.invariants import Invariants, quote
from t2sql.equivalence.querytext import FromItem, Statement, from_items, top_conjuncts
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.sampling import duplicate
from t2sql.equivalence.smalldb import SmallDb, column_index

LINEAGE_ROWS = 3  # real rows kept per lineage query

def lineage_queries(st: Statement, inv: Invariants, *, limit: int,
                    bounds: dict[str, int] | None = None) -> list[tuple[str, str, list[FromItem]]]:
    """(label, SQL, FROM items): queries that return the keys of the real rows each SELECT of `st` joins
    and keeps (its FROM and WHERE, no grouping), and of the rows that meet all but one of its WHERE's
    top-level conditions: the rows that can tell a query from a near neighbour. `bounds` (table -> rowid):
    a large table's rows are sought among its first rows only (t2sql.equivalence.real_rows.JOIN_SCAN_ROWS): the query
    runs as if the table were those rows (a WITH of its name shadows it, in the query's subqueries too),
    so that no join or subquery reads the whole table."""
    bounds = bounds or {}
    out = []
    sql = st.sql
    shadowed, with_prefix = _shadowing(st.with_prefix, bounds)
    for n, part in enumerate(st.parts):
        items = from_items(st, part, inv)
        keyed = [i for i in items if inv.table(i.table) is not None]
        if not keyed or part.from_clause is None:
            continue
        cols = []
        for item in keyed:
            t = inv.table(item.table)
            if t.rowid:
                cols.append(f"{quote(item.alias)}.rowid")
            else:
                cols += [f"{quote(item.alias)}.{quote(k)}" for k in t.keys[0]] if t.keys else []
        if not cols:
            continue
        head = f"{with_prefix}SELECT {', '.join(cols)} FROM {sql[part.from_clause[0]:part.from_clause[1]]}"
        # A table the query's own WITH names is scoped here instead; a row of a LEFT JOIN's missing side has a
        # NULL rowid: it stays in scope.
        scope = "".join(f" AND ({quote(i.alias)}.rowid <= {bounds[i.table]} OR {quote(i.alias)}.rowid IS NULL)"
                        for i in keyed if i.table in bounds and i.table not in shadowed)
        if part.where is None:
            out.append((f"part {n}: its rows", f"{head}{' WHERE 1' + scope if scope else ''} LIMIT {limit}", keyed))
            continue
        where = sql[part.where[0]:part.where[1]]
        out.append((f"part {n}: its rows", f"{head} WHERE {f'({where}){scope}' if scope else where} LIMIT {limit}",
                    keyed))
        conj = top_conjuncts(sql, part.where)
        if len(conj) > 1:
            for i in range(len(conj)):
                rest = " AND ".join(f"({sql[x:y]})" for k, (x, y) in enumerate(conj) if k != i)
                miss = sql[conj[i][0]:conj[i][1]]
                out.append((f"part {n}: all but condition {i + 1}",
                            f"{head} WHERE {rest} AND NOT ({miss}){scope} LIMIT {limit}", keyed))
        elif conj:
            out.append((f"part {n}: not its condition",
                        f"{head} WHERE NOT ({where}){scope} LIMIT {limit}", keyed))
    return out


def _shadowing(with_prefix: str, bounds: dict[str, int]) -> tuple[set[str], str]:
    """(tables shadowed, the WITH to put before a lineage query): each bounded table a WITH entry of its
    own name (its first rows), besides the query's own WITH; a table whose name that WITH mentions is left
    to the query (a WITH name given twice is an error)."""
    own = with_prefix.lower()
    shadowed = {t for t in bounds if not re.search(rf"(?<![\w]){re.escape(t.lower())}(?![\w])", own)}
    if not shadowed:
        return shadowed, with_prefix
    entries = ", ".join(f"{quote(t)} AS NOT MATERIALIZED (SELECT rowid AS rowid, * FROM main.{quote(t)} "
                        f"WHERE rowid <= {bounds[t]})" for t in sorted(shadowed))
    m = re.match(r"\s*WITH(\s+RECURSIVE)?\s", with_prefix, re.I)
    if m is None:
        return shadowed, f"WITH {entries} {with_prefix}"
    return shadowed, f"{with_prefix[:m.end()]}{entries}, {with_prefix[m.end():]}"


def fetch_lineage(real: RealRows, inv: Invariants, sql: str,
                  limit: int = LINEAGE_ROWS) -> list[tuple[str, list[list[tuple[str, tuple]]]]]:
    """(label, tuples) per lineage query of `sql` (t2sql.equivalence.lineage.lineage_queries): each tuple the
    real rows (table, row) one result row of that query joins (at most `limit` a query)."""
    st = querytext.read(sql)
    if st is None:
        return []
    first = real.first_rows()  # where a table is large: its first rows, copied (t2sql.equivalence.real_rows)
    bounds = {}
    for t in inv.tables if first is None else ():
        bound = real.first_rows_bound(t, real_rows.JOIN_SCAN_ROWS)
        if bound is not None:
            bounds[t.name] = bound
    out = []
    for label, lineage_sql, items in lineage_queries(st, inv, limit=limit, bounds=bounds):
        got = real.rows(lineage_sql) if first is None else real.first_rows_answer(lineage_sql)
        tuples: list[list[tuple[str, tuple]]] = [[] for _ in got]
        col = 0
        for item in items:
            t = inv.table(item.table)
            width = 1 if t.rowid else len(t.keys[0]) if t.keys else 0
            for n, row in enumerate(got):
                value = row[col:col + width]
                if t.rowid:
                    found = real.by_rowids(t.name, [value[0]])
                    fetched = found[0] if found else None
                else:
                    fetched = real.by_key(t.name, t.keys[0], tuple(value)) if width else None
                if fetched is not None:
                    tuples[n].append((t.name, fetched))
            col += width
        out.append((label, [tp for tp in tuples if tp]))
    return out

def parents_first(inv: Invariants, tables: list[str]) -> list[str]:
    """`tables` ordered so that a reference's parent comes before its child (cycles kept in order)."""
    order: list[str] = []
    pending = list(dict.fromkeys(tables))
    while pending:
        for t in pending:
            parents = {r.parent for r in inv.references if r.child == t and r.parent != t and r.parent in pending}
            if not parents:
                break
        else:
            t = pending[0]
        order.append(t)
        pending.remove(t)
    return order

def _selected_free(inv: Invariants, sql: str, table: str) -> list[str]:
    """Columns of `table` a query selects and does not filter on, free to take another row's value (no key,
    reference or unique column)."""
    st = querytext.read(sql)
    if st is None or not st.parts:
        return []
    part = st.parts[-1]
    selected = sql[part.select_list[0]:part.select_list[1]].lower()
    filtered = sql[part.select_list[1]:].lower()
    t = inv.table(table)
    frozen = inv.frozen(table)
    return [c.name for c in t.columns if c.name not in frozen and not c.unique and c.name.lower() in selected
            and not re.search(rf"(?<![\w]){re.escape(c.name.lower())}(?![\w])", filtered)]


def alike(db: SmallDb, first: list[tuple[str, tuple]], second: list[tuple[str, tuple]], sql: str) -> bool:
    """The rows of a second result row given the first's values in the free columns the query selects (two
    result rows the same: what DISTINCT merges and a LIMIT counts); False when none changed."""
    inv = db.inv
    changed = False
    for table, row in second:
        other = next((r for t, r in first if t == table and r != row), None)
        rows = db.rows.get(table, [])
        if other is None or row not in rows:
            continue
        t = inv.table(table)
        at = {column_index(t, c) for c in _selected_free(inv, sql, table)}
        new = tuple(other[i] if i in at else v for i, v in enumerate(row))
        if new != row:
            rows[rows.index(row)] = new
            changed = True
    return changed


def another_value(inv: Invariants, real: RealRows, rows: list[tuple[str, tuple]], rng: Any,
                   sql: str = "") -> dict:
    """For one row of a result row's join: one free column set to another real value of it (with `sql`,
    a column the query selects and does not filter on, so the copy is another result row)."""
    st = querytext.read(sql) if sql else None
    selected = filtered = ""
    if st is not None and st.parts:
        part = st.parts[-1]
        selected = sql[part.select_list[0]:part.select_list[1]].lower()
        filtered = sql[part.select_list[1]:].lower()
    for table, row in rows:
        t = inv.table(table)
        frozen = inv.frozen(table)
        for c in t.columns:
            if c.name in frozen or c.unique:
                continue
            if st is not None and (c.name.lower() not in selected or
                                   re.search(rf"(?<![\w]){re.escape(c.name.lower())}(?![\w])", filtered)):
                continue
            i = column_index(t, c.name)
            others = [v for v in real.values(table, c.name) if v != row[i]]
            if others:
                return {(table, row): {c.name: others[rng.randrange(len(others))]}}
    return {}

def duplicate_tuple(db: SmallDb, rows: list[tuple[str, tuple]], real: RealRows, rng: Any,
                    changes_of: dict[tuple[str, tuple], dict[str, Any]] | None = None) -> bool:
    """One more result row: the rows one result row of a query joins, duplicated as new entities under
    fresh keys (`changes_of` (table, row) -> column values to set in that row's copy), each copy's
    references pointed at the copies of its parents. False when a row cannot be."""
    inv = db.inv
    new_keys: dict[tuple[str, tuple], tuple] = {}  # (parent table, old key of a reference) -> new key
    by_table: dict[str, list[tuple]] = {}
    for table, row in rows:
        by_table.setdefault(table, []).append(row)
    for table in parents_first(inv, list(by_table)):
        t = inv.table(table)
        for row in by_table[table]:
            changes: dict[str, Any] = dict((changes_of or {}).get((table, row), {}))
            hold: set[str] = set()  # references to a parent the copy shares with the original
            for ref in inv.references:
                if ref.child != table:
                    continue
                old = tuple(row[column_index(t, c)] for c in ref.child_columns)
                new = new_keys.get((ref.parent, ref.parent_columns, old))
                if new is not None:
                    changes.update(zip(ref.child_columns, new))
                else:
                    hold.update(ref.child_columns)
            copy = duplicate(db, table, row, real, rng, changes, frozenset(hold))
            if copy is None:
                return False
            for ref in inv.references:
                if ref.parent == table:
                    old = tuple(row[column_index(t, c)] for c in ref.parent_columns)
                    new = tuple(copy[column_index(t, c)] for c in ref.parent_columns)
                    new_keys[(table, ref.parent_columns, old)] = new
    return True
