"""Realism rules a table's data keeps beyond its columns and references, mined with the invariants and kept by every
small database: `symmetries` (a relation stored both ways), `unique_sets`, `vocabularies`, `path_copies` and
`prefixes`. Each rule and why: docs/recipe_extras.md, "Equivalence check"; mined by
t2sql.equivalence.realism_mining (a statement that fails makes the database unsupported)."""

from __future__ import annotations

from typing import Any, Callable

from t2sql.equivalence.invariants import (
    Invariants,
    PathCopy,
    Prefix,
    Reference,
    Symmetry,
    Table,
    UniqueSet,
    Vocabulary,
    sqlite_key,
)

# ------------------------------------------------------------------------------ checks on a small database


def problems(inv: Invariants, rows: dict[str, tuple], remembered: Callable[[tuple, Any], list[str]]) -> list[str]:
    """Every way a small database's rows (table -> rows) break a realism rule; `remembered(key, compute)`
    keeps each check by the rows it reads (SmallDb's memo)."""
    out: list[str] = []
    empty: tuple = ()
    for sym in inv.symmetries:
        mine = rows.get(sym.table, empty)
        out += remembered(("symmetry", sym, mine), lambda: _symmetry_problems(inv, sym, mine))
    for us in inv.unique_sets:
        mine = rows.get(us.table, empty)
        out += remembered(("unique set", us, mine), lambda: _unique_set_problems(inv, us, mine))
    for v in inv.vocabularies:
        mine = rows.get(v.table, empty)
        out += remembered(("vocabulary", v, mine), lambda: _vocabulary_problems(inv, v, mine))
    for pc in inv.path_copies:
        mine, one, two = (rows.get(x, empty) for x in (pc.first.child, pc.first.parent, pc.second.parent))
        out += remembered(("path copy", pc, mine, one, two), lambda: _path_copy_problems(inv, pc, mine, one, two))
    for px in inv.prefixes:
        mine = rows.get(px.table, empty)
        out += remembered(("prefix", px, mine), lambda: _prefix_problems(inv, px, mine))
    return out


def _path_copy_problems(inv: Invariants, pc: PathCopy, rows: tuple, first: tuple, second: tuple) -> list[str]:
    child = inv.table(pc.first.child)

    def values(ref: Reference, parents: tuple, column: str) -> dict[tuple, Any]:
        p = inv.table(ref.parent)
        keys, at = [p.position(c) for c in ref.parent_columns], p.position(column)
        return {sqlite_key(tuple(r[i] for i in keys)): r[at] for r in parents}

    one, two = values(pc.first, first, pc.first_column), values(pc.second, second, pc.second_column)
    k1 = [child.position(c) for c in pc.first.child_columns]
    k2 = [child.position(c) for c in pc.second.child_columns]
    for r in rows:
        a, b = sqlite_key(tuple(r[i] for i in k1)), sqlite_key(tuple(r[i] for i in k2))
        if a in one and b in two and sqlite_key((one[a],)) != sqlite_key((two[b],)):
            return [f"{pc.first.child} row {r!r}: {pc.first.parent}.{pc.first_column} no longer equals "
                    f"{pc.second.parent}.{pc.second_column}"]
    return []


def _prefix_problems(inv: Invariants, px: Prefix, rows: tuple) -> list[str]:
    t = inv.table(px.table)
    x, y = t.position(px.column), t.position(px.source_column)
    for r in rows:
        if not (type(r[x]) is str and type(r[y]) is str and len(r[x]) > len(r[y]) and r[x].startswith(r[y])):
            return [f"{px.table}.{px.column} {r[x]!r} does not start with {px.source_column} {r[y]!r}"]
    return []


def mirror(t: Table, sym: Symmetry, row: tuple) -> tuple:
    """`row` the other way round."""
    a, b = t.position(sym.left), t.position(sym.right)
    out = list(row)
    out[a], out[b] = row[b], row[a]
    return tuple(out)


def _symmetry_problems(inv: Invariants, sym: Symmetry, rows: tuple) -> list[str]:
    t = inv.table(sym.table)
    have = {sqlite_key(r) for r in rows}
    lonely = next((r for r in rows if sqlite_key(mirror(t, sym, r)) not in have), None)
    if lonely is not None:
        return [f"{sym.table}: row {lonely!r} lacks its mirror ({sym.left} and {sym.right} swapped)"]
    if sym.keyed:
        a, b = t.position(sym.left), t.position(sym.right)
        rest = [i for i in range(len(t.columns)) if i not in (a, b)]
        pairs: dict[tuple, frozenset] = {}
        for r in rows:
            pair = frozenset(sqlite_key((r[a], r[b])))
            if pairs.setdefault(sqlite_key(tuple(r[i] for i in rest)), pair) != pair:
                return [f"{sym.table}: {r!r} names a second pair for the same other columns"]
    return []


def _unique_set_problems(inv: Invariants, us: UniqueSet, rows: tuple) -> list[str]:
    t = inv.table(us.table)
    idx = [t.position(c) for c in us.columns]
    seen = set()
    for r in rows:
        k = sqlite_key(tuple(r[i] for i in idx))
        if None in k:
            continue
        if k in seen:
            return [f"{us.table}: ({', '.join(us.columns)}) {k!r} repeats"]
        seen.add(k)
    return []


def _vocabulary_problems(inv: Invariants, v: Vocabulary, rows: tuple) -> list[str]:
    i = inv.table(v.table).position(v.column)
    allowed = vocabulary(inv, v.table, v.column)
    bad = next((r[i] for r in rows if type(r[i]) is str and r[i] not in allowed), None)
    return [] if bad is None else [f"{v.table}.{v.column}: {bad!r} is not one of its values"]


# ------------------------------------------------------------------------------ what builders ask


def vocabulary(inv: Invariants, table: str, column: str) -> frozenset[str] | None:
    """The closed set of a column's text values, or None when the column is open."""
    return _vocabularies_of(inv).get((table.lower(), column.lower()))


def _vocabularies_of(inv: Invariants) -> dict[tuple[str, str], frozenset[str]]:
    found = inv.memo.get(("vocabularies",))
    if found is None:
        found = {(v.table.lower(), v.column.lower()): frozenset(v.values) for v in inv.vocabularies}
        inv.memo.put(("vocabularies",), found)
    return found


def unique_sets(inv: Invariants, table: str) -> tuple[tuple[str, ...], ...]:
    """The column sets of `table` that never repeat together (beside its keys)."""
    return tuple(us.columns for us in inv.unique_sets if us.table.lower() == table.lower())


def prefix_of(inv: Invariants, t: Table, column: str, row: tuple) -> str | None:
    """The text `row`'s value in `column` must start with (a prefix rule's source value), or None."""
    for px in inv.prefixes:
        if px.table == t.name and px.column == column:
            value = row[t.position(px.source_column)]
            if type(value) is str:
                return value
    return None


def pair_names(inv: Invariants, t: Table) -> list[tuple[str, Reference]]:
    """The columns (with their reference) that name a pair of a keyed symmetric table `t`: a copy of a row
    (a new pair) needs a copy of the parent they name (a new bond for the new pair of atoms)."""
    out = []
    for sym in inv.symmetries:
        if sym.table != t.name or not sym.keyed:
            continue
        for r in inv.references:
            if (r.child == t.name and len(r.child_columns) == 1
                    and r.child_columns[0] not in (sym.left, sym.right)):
                out.append((r.child_columns[0], r))
    return out


def add_mirrors(inv: Invariants, tables: dict[str, list[tuple]]) -> bool:
    """Every row of a symmetric table given its mirror (appended); True when one was missing."""
    changed = False
    for sym in inv.symmetries:
        t = inv.table(sym.table)
        rows = tables.get(sym.table)
        if t is None or not rows:
            continue
        have = {sqlite_key(r) for r in rows}
        for r in list(rows):
            m = mirror(t, sym, r)
            if sqlite_key(m) not in have:
                rows.append(m)
                have.add(sqlite_key(m))
                changed = True
    return changed
