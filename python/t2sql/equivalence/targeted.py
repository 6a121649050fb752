"""The small databases the equivalence check builds for one query of a pair (t2sql.equivalence.check
says how they are used): the real rows the query touches and those meeting all but one of its
conditions, closed under the database's references; variants of them that stay realistic (values at
and beside each literal, duplicates under fresh keys, one more result row, more rows than a LIMIT
keeps, NULLs, integer keys renumbered). Every database returned has passed `SmallDb.problems()`."""

from __future__ import annotations

from dataclasses import dataclass, field

from t2sql.equivalence import ordering, querytext
from t2sql.equivalence.distinguishing import childless, repointed
from t2sql.equivalence.invariants import Invariants
from t2sql.equivalence.lineage import alike, another_value, duplicate_tuple, fetch_lineage
from t2sql.equivalence.presupposed import rotate_lookup_keys
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.sampling import add_rows, close, duplicate, rekey, repair_relations, stable_rng
from t2sql.equivalence.smalldb import SmallDb, column_index
from t2sql.equivalence.variants import literal_variants

MAX_LIMIT_FILLED = 64  # a query's LIMIT n up to this is filled with n + 1 result rows

MAX_ROWS_FILLED = 400  # the rows such a database may reach

@dataclass
class Covered:
    """What a gold's targeted databases already hold: the real rows its lineage queries touch and the
    literals it compares columns with. A prediction's own databases add only what is not here."""

    rows: set = field(default_factory=set)  # (table, row)
    literals: set = field(default_factory=set)  # (table, column, literal)
    nullable: set = field(default_factory=set)  # (table, column) it names that may hold NULL

    def key(self) -> int:
        return hash((frozenset(self.rows), frozenset(self.literals), frozenset(self.nullable)))

def literal_keys(c: querytext.Comparison) -> set[tuple]:
    return {(c.table, c.column, lit.replace("%", "") if isinstance(lit, str) else lit) for lit in c.literals}

def targeted(real: RealRows, inv: Invariants, sql: str, seed: int,
             covered: Covered | None = None) -> tuple[list[SmallDb], Covered]:
    """Small databases built for one query of a pair (see the module doc), each already checked (no
    problems), and what they cover. With `covered` (the gold's), only rows and literals outside it make
    databases: a prediction that joins the gold's rows and compares its literals adds none."""
    rng = stable_rng(seed, "targeted", sql)
    seeds = SmallDb(inv, note="the real rows the query touches")
    marked: dict[str, set] = {}  # table -> the seed rows (what the variants change)
    comparisons: list[querytext.Comparison] = []  # those the gold's databases do not cover
    every_comparison: list[querytext.Comparison] = []
    tables: list[str] = []
    lineages: list[tuple[str, list[list[tuple[str, tuple]]]]] = []  # those the gold's do not cover
    first_tuple: list[tuple[str, tuple]] = []  # what the query's first result row joins
    mine = Covered()
    for label, tuples in fetch_lineage(real, inv, sql):
        # In the order the query returned them (a set's order changes with the process's hash seed, and the
        # check must give the same verdict and witness in every process).
        ordered = list(dict.fromkeys((t, r) for tp in tuples for t, r in tp))
        rows = set(ordered)
        mine.rows |= rows
        for table, row in ordered:  # the rows this query touches are where its literals' variants go
            add_rows(seeds, table, [row])
            marked.setdefault(table, set()).add(row)
        if tuples and not first_tuple:
            first_tuple.extend(tuples[0])
        if covered is None or not rows <= covered.rows:
            lineages.append((label, tuples))
    st = querytext.read(sql)
    if st is not None:
        for c in querytext.comparisons(st, inv):
            keys = literal_keys(c)
            mine.literals |= keys
            every_comparison.append(c)
            if covered is not None and keys <= covered.literals:
                continue
            comparisons.append(c)
            rows = real.matching(c, 2)
            add_rows(seeds, c.table, rows)
            marked.setdefault(c.table, set()).update(rows)
        for part in st.parts:
            tables += [i.table for i in querytext.from_items(st, part, inv)]
    text = sql.lower()
    for t in inv.tables:
        for c in t.columns:
            if c.may_be_null and c.name.lower() in text:
                mine.nullable.add((t.name, c.name))
    new_nulls = mine.nullable - covered.nullable if covered is not None else mine.nullable
    if (covered is not None and not lineages and not comparisons and not new_nulls
            and ordering.outer_limit(st) is None):
        return [], mine
    for name in dict.fromkeys(tables):
        add_rows(seeds, name, real.random_rows(name, 2, rng))
    base = close(seeds, real)
    if base is None:
        return [], mine
    # For a prediction (`covered`: the gold's), what the gold's databases already hold (its rows' base,
    # their duplicates, renumbered keys) is not built again: only its own rows, literals and NULLs.
    out = [base] if covered is None or lineages else []

    def keep(db: SmallDb | None, *, closing: bool = True) -> None:
        """A variant; `closing=False` for one that changed values only (no key, no reference)."""
        if db is not None:
            closed = close(db, real) if closing else db
            if closed is not None:
                out.append(closed)

    # Each lineage query's rows alone: where a condition one query has and the other lacks decides.
    for label, tuples in lineages:
        alone = SmallDb(inv, note=f"the real rows of {label}")
        for tp in tuples:
            for table, row in tp:
                add_rows(alone, table, [row])
        keep(alone)
    # The same entities again under fresh keys: DISTINCT, LIMIT n, COUNT over joins.
    if covered is None or lineages:
        dup = base.copy("seed rows duplicated under fresh keys")
        for table, rows in marked.items():
            for row in [r for r in base.rows.get(table, []) if r in rows][:2]:
                duplicate(dup, table, row, real, rng)
        keep(dup)
    # One more result row: what a query's first result rows join, again as new entities; the same with
    # one value of theirs another real value (a new distinct row); and sharing one parent (a row that
    # repeats under DISTINCT).
    for label, tuples in lineages[:2]:
        if not tuples:
            continue
        more = base.copy(f"one more result row of {label}")
        for tp in tuples[:2]:
            duplicate_tuple(more, tp, real, rng)
        keep(more)
        first = tuples[0]
        other = base.copy(f"one more, different result row of {label}")
        if duplicate_tuple(other, first, real, rng, another_value(inv, real, first, rng, sql)):
            keep(other)
        for shared_table, shared_row in first:
            if any(r.parent == shared_table for r in inv.references for t, _ in first if r.child == t):
                shared = base.copy(f"one more result row of {label} sharing its {shared_table} row")
                if duplicate_tuple(shared, [x for x in first if x != (shared_table, shared_row)], real, rng):
                    keep(shared)
    # A result row's row pointed at another real parent that a comparison meets or misses (a row that
    # meets all but one condition of one query, t2sql.equivalence.distinguishing): every comparison for rows the
    # gold's do not cover, the new ones for the rest.
    reached = [tuples[0] for _, tuples in lineages if tuples]
    if first_tuple and first_tuple not in reached:
        reached.append(first_tuple)
    for db in repointed(base, real, reached, every_comparison if lineages else comparisons, rng):
        keep(db)
    # A parent row it reaches without its children in one table (what an outer join keeps).
    for db in childless(base, reached):
        keep(db, closing=False)
    # Two result rows made alike in what the query selects (a repeat that DISTINCT merges).
    for label, tuples in lineages[:1]:
        if len(tuples) >= 2:
            same = base.copy(f"two result rows of {label} alike in what it selects")
            if alike(same, tuples[0], tuples[1], sql):
                keep(same, closing=False)
            # ... and apart: the second given another real value in a column it selects and no condition
            # reads (a bond's two atoms of two elements), so DISTINCT keeps two rows where a LIMIT keeps one.
            apart = base.copy(f"two result rows of {label} apart in what it selects")
            for (table, row), changes in another_value(inv, real, tuples[1], rng, sql).items():
                rows = apart.rows.get(table, [])
                if row in rows and (table, row) not in tuples[0]:
                    t = inv.table(table)
                    new = row
                    for name, value in changes.items():
                        new = tuple(value if j == column_index(t, name) else v for j, v in enumerate(new))
                        new = repair_relations(inv, table, new, name)
                    rows[rows.index(row)] = new
                    keep(apart, closing=False)
    # As many result rows as the query's LIMIT keeps, and one more: where a LIMIT that cut nothing cuts.
    limit = ordering.outer_limit(st) if st is not None else None
    if limit is not None and first_tuple and limit < MAX_LIMIT_FILLED:
        # Copies of what the first result row joins, whole or sharing one parent (the one a filter may
        # name), each with another value in a column it selects (so DISTINCT keeps them apart).
        parents = [(t, r) for t, r in first_tuple
                   if any(ref.parent == t and ref.child == c for ref in inv.references for c, _ in first_tuple)]
        for shared in [None, *parents]:
            copied = [x for x in first_tuple if x != shared]
            filled = base.copy(f"more result rows than its LIMIT {limit}"
                               + (f", sharing its {shared[0]} row" if shared else ""))
            for _ in range(limit + 1):
                if not duplicate_tuple(filled, copied, real, rng, another_value(inv, real, copied, rng, sql)):
                    break
            closed = close(filled, real, max_rows=MAX_ROWS_FILLED)
            if closed is not None:
                out.append(closed)
        # Where copies cannot be made (named entities, unique names): as many real result rows as the LIMIT
        # keeps, and a row meeting all but one condition re-pointed into the result.
        many = fetch_lineage(real, inv, sql, limit + 1)
        if many and many[0][1]:
            filled = base.copy()
            for tp in many[0][1]:
                for table, row in tp:
                    add_rows(filled, table, [row])
            near = [tuples[0] for _, tuples in many[1:] if tuples]
            for db in repointed(filled, real, near, every_comparison, rng, meeting_only=True)[:4]:
                db.note = f"more result rows than its LIMIT {limit}: real ones and " + db.note
                closed = close(db, real, max_rows=MAX_ROWS_FILLED)
                if closed is not None:
                    out.append(closed)
    # NULL where a column the query names holds NULLs (COUNT(col), IS NULL, outer joins); a reference
    # that holds NULLs may name nothing.
    if new_nulls:
        nulled = base.copy("NULL in columns the query names")
        for t in inv.tables:
            rows = [r for r in nulled.rows.get(t.name, []) if r in marked.get(t.name, set())]
            fixed = inv.frozen(t.name) - inv.reference_columns(t.name)
            for c in t.columns:
                if rows and (t.name, c.name) in mine.nullable and c.name not in fixed:
                    ci = column_index(t, c.name)
                    table_rows = nulled.rows[t.name]
                    table_rows[table_rows.index(rows[0])] = tuple(None if j == ci else v
                                                                  for j, v in enumerate(rows[0]))
                    rows = [r for r in table_rows if r in marked.get(t.name, set())]
        keep(nulled)
    # Values at and beside each literal, in place on the seed rows (a few databases, the values spread).
    for c in dict.fromkeys(comparisons):
        t = inv.table(c.table)
        variants = literal_variants(c, t, real)
        if not variants:
            continue
        rows = [r for r in base.rows.get(c.table, []) if r in marked.get(c.table, set())][:4]
        if not rows:
            continue
        ci = column_index(t, c.column)
        unique = t.columns[ci].unique or any(key == (t.columns[ci].name,) for key in t.keys)
        # A unique name keeps apart from the others in letter case too, as the real ones do (no power
        # 'STEALTH' beside 'Stealth': the same power twice).
        same = _name_key if unique and real.apart_in_case(t.name, c.column) else _value_key
        free = [v for v in variants if not unique or all(same(r[ci]) != same(v.value) for r in base.rows[c.table])]
        if c.column in inv.frozen(t.name):
            # A key or reference column: the values go into duplicates (new entities), not in place.
            added = base.copy(f"rows added with {c.table}.{c.column} beside {c.literals[0]!r}")
            for v in free[:6]:
                duplicate(added, c.table, rows[0], real, rng, {c.column: v.value})
            keep(added)
            continue
        for k in range(min(3, len(variants))):
            db = base.copy(f"{c.table}.{c.column} set beside {c.literals[0]!r}")
            table_rows = db.rows[c.table]
            held = {same(r[ci]) for r in table_rows}
            if same is _name_key:
                # The literal names an entity the check puts back where a variant moved it away: no other
                # row takes its name in another case.
                held |= {same(lit.strip("%")) for lit in c.literals if isinstance(lit, str)}
            for i, row in enumerate(rows):
                # The values spread over the rows; a unique column takes only values no other row holds.
                for step in range(len(variants)):
                    v = variants[(i * 3 + k + step) % len(variants)]
                    if not unique or same(v.value) not in held or v.value == row[ci]:
                        break
                else:
                    continue
                if same is _value_key:
                    held.discard(row[ci])
                held.add(same(v.value))
                new = repair_relations(inv, c.table, tuple(v.value if j == ci else x for j, x in enumerate(row)),
                                       t.columns[ci].name)
                table_rows[table_rows.index(row)] = new
            keep(db, closing=False)
        # The literal's neighbours in new rows beside the old ones (rows that meet all but one condition):
        # what a result row joins, copied whole, the copy of this row holding the value.
        added = base.copy(f"rows added with {c.table}.{c.column} beside {c.literals[0]!r}")
        joined = next((tp for _, tuples in lineages for tp in tuples if (c.table, rows[0]) in tp), None)
        for v in free[:6]:
            if joined is not None:
                duplicate_tuple(added, joined, real, rng, {(c.table, rows[0]): {c.column: v.value}})
            else:
                duplicate(added, c.table, rows[0], real, rng, {c.column: v.value})
        keep(added)
    # Integer keys renumbered (a query that hard-codes a key it looked up today finds another row).
    if covered is None or lineages:
        renumbered = base.copy("integer keys renumbered")
        if any([rekey(renumbered, t.name) for t in inv.tables if renumbered.rows.get(t.name)]):
            keep(renumbered, closing=False)
        # Lookup keys rotated over the whole vocabulary: the hard-coded key then names a row nothing here points at.
        rotated = base.copy("lookup keys rotated")
        if rotate_lookup_keys(rotated, real):
            keep(rotated, closing=False)
    return realistic(out), mine

def _value_key(v: object) -> object:
    return v


def _name_key(v: object) -> object:
    return v.lower() if isinstance(v, str) else v


def realistic(dbs: list[SmallDb]) -> list[SmallDb]:
    seen, out = set(), []
    for db in dbs:
        if db.size == 0 or db.problems():
            continue
        key = db.key()
        if key not in seen:
            seen.add(key)
            out.append(db)
    return out
