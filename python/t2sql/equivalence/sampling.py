"""Drawing small databases from a real one: real rows (t2sql.equivalence.real_rows), closed under the database's
references (`close`), and variants of them another real database of this kind could hold. Nothing here decides
that a database is realistic: `SmallDb.problems()` does."""

from __future__ import annotations

import hashlib
import random
from typing import Any, Iterable

from t2sql.equivalence import realism
from t2sql.equivalence.invariants import Invariants, Table
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.smalldb import Row, SmallDb, column_index, remember, sqlite_key

MAX_ROWS = 120  # a small database larger than this after closing is not used

CLOSE_ROUNDS = 64  # each round follows every reference one step; the size cap stops growth
def stable_rng(*parts: Any) -> random.Random:
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


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
    one that starts with it (t2sql.equivalence.realism's prefixes)."""
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
