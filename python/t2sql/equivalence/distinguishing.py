"""Distinguishing rows made of real ones, where the realism rules refuse new rows: a real row re-pointed at another
real parent that a comparison meets, nearly meets or misses (`repointed`), and a parent without its children in
one table (`childless`). docs/recipe_extras.md, "Equivalence check"."""

from __future__ import annotations

from typing import Any

from t2sql.equivalence import querytext
from t2sql.equivalence.invariants import quote, sqlite_key
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.sampling import add_rows
from t2sql.equivalence.smalldb import SmallDb, column_index

PARENTS_PER_COMPARISON = 4  # real parent rows tried per comparison
MAX_MADE = 8  # databases each kind of distinguishing row makes, per query (re-pointing: per comparison)


def candidate_parents(real: RealRows, c: querytext.Comparison, rng: Any, meeting_only: bool = False) -> list[tuple]:
    """Real rows of c.table a reference could be pointed at: first those beside c's literals (a longer text
    or another case holding it, the nearest numbers above and below), then those meeting them, then
    rows c does not name."""
    t = real.inv.table(c.table)
    if t is None or t.position(c.column) is None:
        return []
    q = quote(c.column)
    select = f"SELECT {', '.join(quote(x) for x in t.column_names)} FROM {quote(t.name)}"
    beside: list[tuple] = []
    meeting: list[tuple] = []
    # Each lookup within the rows RealRows.scope allows (an index's, or a large table's first rows).
    ordered, ordered_bound = real.scope(t, (c.column,))
    near, near_bound = real.scope(t)
    for lit in c.literals[:2]:
        if isinstance(lit, (int, float)) and not isinstance(lit, bool):
            beside += real.rows(f"{select} WHERE {ordered} AND {q} > ? ORDER BY {q} LIMIT 1", (*ordered_bound, lit))
            beside += real.rows(f"{select} WHERE {ordered} AND {q} < ? ORDER BY {q} DESC LIMIT 1",
                                (*ordered_bound, lit))
            meeting += real.equal_rows(t.name, (c.column,), (lit,), 1)
        elif isinstance(lit, str) and lit.strip("%"):
            plain = lit.strip("%")
            beside += real.rows(f"{select} WHERE {near} AND {q} LIKE ? AND {q} IS NOT ? LIMIT 2",
                                (*near_bound, f"%{plain}%", plain))
            meeting += real.equal_rows(t.name, (c.column,), (plain,), 1)
    if meeting_only:
        return list(dict.fromkeys(meeting))
    out = list(dict.fromkeys(beside + meeting))
    out += [r for r in real.random_rows(c.table, 2, rng) if r not in out]
    return out[:PARENTS_PER_COMPARISON + 2]


def _compares(c: querytext.Comparison, ref: Any) -> bool:
    """Whether `c` compares the one column of reference `ref` itself."""
    return c.table.lower() == ref.child.lower() and ref.child_columns == (c.column,)


def _named_parents(real: RealRows, c: querytext.Comparison, ref: Any, rng: Any, meeting_only: bool) -> list[tuple]:
    """The parent rows c's literals name through `ref`, then (unless `meeting_only`) other real ones."""
    out = [r for lit in c.literals[:2] if (r := real.by_key(ref.parent, ref.parent_columns, (lit,))) is not None]
    if not meeting_only:
        out += [r for r in real.random_rows(ref.parent, 2, rng) if r not in out]
    return out


def repointed(base: SmallDb, real: RealRows, tuples: list[list[tuple[str, tuple]]],
              comparisons: list[querytext.Comparison], rng: Any, meeting_only: bool = False) -> list[SmallDb]:
    """Copies of `base`, each with one row of a result row's join (`tuples`) pointed, by one reference, at
    another real parent row of a table a comparison names (see the module doc; `meeting_only`: only rows
    meeting it, to bring a row that misses one condition into the result); not yet closed."""
    inv = base.inv
    out: list[SmallDb] = []
    seen: set = set()
    for c in comparisons:
        # The references by which a row of the join names a row of c's table (or the reference c
        # compares itself: `link_to_major = 'rec...'`) ...
        slots = []
        for tp in tuples:
            for child_table, row in tp:
                if row not in base.rows.get(child_table, []):
                    continue
                for ref in inv.references:
                    if ref.child == child_table and ref.parent != ref.child and (
                            ref.parent.lower() == c.table.lower() or _compares(c, ref)):
                        slots.append((child_table, row, ref))
        if not slots:
            continue
        # ... each pointed at each candidate in turn, the candidates beside the literal first.
        made = 0
        named = next((ref for _, _, ref in slots if _compares(c, ref)), None)
        candidates = (candidate_parents(real, c, rng, meeting_only) if named is None
                      else _named_parents(real, c, named, rng, meeting_only))
        for parent in candidates:
            if made >= MAX_MADE:
                break
            for child_table, row, ref in slots:
                if named is not None and ref != named:
                    continue
                t, p = inv.table(child_table), inv.table(ref.parent)
                at = [column_index(t, col) for col in ref.child_columns]
                old = sqlite_key(tuple(row[i] for i in at))
                new = tuple(parent[column_index(p, col)] for col in ref.parent_columns)
                if None in old or sqlite_key(new) == old or (child_table, row, ref, new) in seen:
                    continue
                seen.add((child_table, row, ref, new))
                moved = dict(zip(at, new))
                for cp in inv.copies:  # a column copied along this reference follows it
                    if cp.table == child_table and cp.via == ref:
                        moved[column_index(t, cp.column)] = parent[column_index(p, cp.source_column)]
                db = base.copy(f"a {child_table} row of a result row pointed at another real "
                               f"{ref.parent} row (beside {c.table}.{c.column} {c.op} {c.literals[0]!r})")
                rows = db.rows[child_table]
                rows[rows.index(row)] = tuple(moved.get(i, v) for i, v in enumerate(row))
                add_rows(db, ref.parent, [parent])
                out.append(db)
                made += 1
                if made >= MAX_MADE:
                    break
    return out


def childless(base: SmallDb, tuples: list[list[tuple[str, tuple]]]) -> list[SmallDb]:
    """Copies of `base`, each with the rows of one table that name a parent row of a result row's join
    (by any of its references to that parent's table) removed, where no reference requires them; not
    closed (closing would bring them back)."""
    inv = base.inv
    out: list[SmallDb] = []
    seen: set = set()
    for tp in tuples:
        for parent_table, parent in tp:
            p = inv.table(parent_table)
            for ref in inv.references:
                if (ref.parent != parent_table or ref.child == parent_table or ref.total
                        or (ref.child, parent_table, parent) in seen or not base.rows.get(ref.child)):
                    continue
                seen.add((ref.child, parent_table, parent))
                c = inv.table(ref.child)
                naming = [r for r in inv.references if r.child == ref.child and r.parent == parent_table
                          and r.parent_columns == ref.parent_columns]
                key = sqlite_key(tuple(parent[column_index(p, col)] for col in ref.parent_columns))

                def names(row: tuple) -> bool:
                    return any(sqlite_key(tuple(row[column_index(c, col)] for col in r.child_columns)) == key
                               for r in naming)

                kept = [r for r in base.rows[ref.child] if not names(r)]
                if len(kept) == len(base.rows[ref.child]):
                    continue
                db = base.copy(f"a {parent_table} row of a result row without its {ref.child} rows")
                db.rows[ref.child] = kept
                if _drop_orphans(db, (parent_table, parent)):
                    out.append(db)
                if len(out) >= MAX_MADE:
                    return out
    return out


def _drop_orphans(db: SmallDb, keep: tuple[str, tuple]) -> bool:
    """What removing rows left behind, removed too: parents a total reference leaves without a child (a
    bond whose connections went), then rows naming a removed parent; False when `keep` goes with them."""
    inv = db.inv

    def keys(table: str, rows: list[tuple], columns: tuple[str, ...]) -> set:
        t = inv.table(table)
        at = [column_index(t, c) for c in columns]
        return {sqlite_key(tuple(r[i] for i in at)) for r in rows}

    changed = True
    while changed:
        changed = False
        for ref in inv.references:
            child, parent = db.rows.get(ref.child, []), db.rows.get(ref.parent, [])
            if not parent:
                continue
            p, c = inv.table(ref.parent), inv.table(ref.child)
            named = keys(ref.child, child, ref.child_columns)
            pa = [column_index(p, x) for x in ref.parent_columns]
            if ref.total:
                left = [r for r in parent if sqlite_key(tuple(r[i] for i in pa)) in named]
                if len(left) != len(parent):
                    db.rows[ref.parent] = parent = left
                    changed = True
            held = keys(ref.parent, parent, ref.parent_columns)
            ca = [column_index(c, x) for x in ref.child_columns]
            kept = [r for r in db.rows.get(ref.child, []) if None in (k := tuple(r[i] for i in ca))
                    or sqlite_key(k) in held]
            if len(kept) != len(db.rows.get(ref.child, [])):
                db.rows[ref.child] = kept
                changed = True
    return keep[1] in db.rows.get(keep[0], [])
