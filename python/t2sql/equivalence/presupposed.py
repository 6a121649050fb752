"""What a question presupposes of every database it is asked on, kept by every small database of a check: fixed
lookup tables (`lookups`) with the keys the evidence states (`stated_keys`), the entities the gold names, and an
aggregate's one row never NULL where the real one is not (`degenerate`).
docs/episode.md, "What a question presupposes" states the rules and why."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from t2sql.equivalence import checkbounds, querytext
from t2sql.equivalence.invariants import Invariants, quote
from t2sql.equivalence.sampling import add_rows, close, duplicate, fresh_value, stable_rng
from t2sql.equivalence.smalldb import SmallDb, column_index, remember, sqlite_key

LOOKUP_MAX_ROWS = 64  # a referenced table of at most this many rows, with a unique name column, is a vocabulary

NAME_SHARE = 0.5  # a column whose distinct values are at least this share of its values names rows

ENTITY_CHILDREN = 8  # an entity added back comes with up to this many rows of each table it must have

NAMED_MAX_ROWS = 1  # a literal (or several, together) naming this many real rows names an entity

# The gold on the real file, asked whether its answer is one row without NULL, runs at most this long (its
# work grows with the tables): past it the answer is presumed to be one (its refutation stays uncertain).
ONE_ROW_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Lookup:
    """A fixed lookup table: its key (what other tables reference) and its name column."""

    table: str
    key: str
    name: str


def lookups(inv: Invariants) -> tuple[Lookup, ...]:
    """The database's fixed lookup tables (see the module doc)."""
    found = inv.memo.get(("presupposed", "lookups"))
    if found is None:
        found = remember(inv.memo, ("presupposed", "lookups"), _lookups(inv))
    return found


def _lookups(inv: Invariants) -> tuple[Lookup, ...]:
    out = []
    for t in inv.tables:
        if not 0 < t.rows <= LOOKUP_MAX_ROWS or not t.keys or len(t.keys[0]) != 1:
            continue
        key = t.keys[0][0]
        if any(r.child == t.name for r in inv.references):
            continue  # it names rows of another table: not a vocabulary of its own
        if not any(r.parent == t.name and r.child != t.name and r.parent_columns == (key,) for r in inv.references):
            continue
        name = next((c.name for c in t.columns if c.name != key and c.unique and c.mined and not c.may_be_null
                     and c.types == ("text",)), None)
        if name is not None:
            out.append(Lookup(t.name, key, name))
    return tuple(out)


def describe(inv: Invariants) -> list[str]:
    """Lines for `t2sql equivalence --invariants`."""
    return [f"fixed lookup table: {lk.table} (all {inv.table(lk.table).rows} rows, each once, named by {lk.name}; "
            f"{lk.key} may be renumbered except where the evidence states it)" for lk in lookups(inv)]


# ---------------------------------------------------------------------------------- the evidence

# `col = 12`, `table.col = 12` (a chain `a = b = 12` states it of b); not `= 12.5`, not `= 12abc`.
_STATED = re.compile(r"(?:([A-Za-z_]\w*)\s*\.\s*)?([A-Za-z_]\w*)\s*(?:=|==)\s*(-?\d+)(?![\w.])")


def stated_keys(evidence: str, inv: Invariants) -> frozenset[tuple[str, int]]:
    """(lookup table, key) pairs the evidence states: `table.key = n`, or `col = n` where col is a column
    that references a lookup table's key (`gender_id = 1`, `colour.id = 7`). A bare `id = n` names no table
    and states nothing."""
    if not evidence or not isinstance(evidence, str):
        return frozenset()
    fixed = {lk.table.lower(): lk for lk in lookups(inv)}
    refs: dict[str, set[str]] = {}
    for r in inv.references:
        parent = fixed.get(r.parent.lower())
        if parent is not None and r.parent_columns == (parent.key,) and len(r.child_columns) == 1:
            refs.setdefault(r.child_columns[0].lower(), set()).add(parent.table)
    out = set()
    for m in _STATED.finditer(evidence[:20000]):
        qualifier, column, value = m.group(1), m.group(2).lower(), int(m.group(3))
        if qualifier is not None and qualifier.lower() in fixed:
            lk = fixed[qualifier.lower()]
            if column == lk.key.lower():
                out.add((lk.table, value))
            continue
        tables = refs.get(column, set())
        if len(tables) == 1:
            out.add((next(iter(tables)), value))
    return frozenset(out)


# ---------------------------------------------------------------------------------- named entities


Entity = tuple  # (table, ((column, text literal), ...), real count): the rows holding all those values


def named(real: Any, inv: Invariants, sqls: list[str]) -> tuple[Entity, ...]:
    """The entities each query names: per table, the text literals it compares one column each with `=`
    (a reference column's literal: in the parent it names), taken together (`first_name = 'Angela' AND
    last_name = 'Sanders'` is one person), when one of those columns names rows (`_names_rows`) and
    NAMED_MAX_ROWS real rows hold them all."""
    fixed = {lk.table for lk in lookups(inv)}
    out: dict[tuple, int] = {}
    for sql in sqls:
        st = querytext.read(sql) if isinstance(sql, str) else None
        if st is None:
            continue
        values: dict[str, dict[str, set]] = {}
        for c in querytext.comparisons(st, inv):
            # `LIKE 'Emil Blonsky'` without a wildcard names its value too.
            plain = c.op.upper() == "LIKE" and all(isinstance(v, str) and not set(v) & {"%", "_"} for v in c.literals)
            if c.op not in ("=", "IN") and not plain:
                continue
            table, column = _entity_column(inv, c.table, c.column)
            if table not in fixed:  # a lookup table's rows are all there already
                values.setdefault(table, {}).setdefault(column, set()).update(c.literals)
        for table, columns in values.items():
            # The columns compared with one value each name one entity together; a column compared with
            # several (IN, OR, two subqueries) names one entity by each.
            together = tuple(sorted((col, next(iter(lits))) for col, lits in columns.items()
                                    if len(lits) == 1 and isinstance(next(iter(lits)), str)))
            each = [((col, lit),) for col, lits in sorted(columns.items()) if len(lits) > 1
                    for lit in sorted(v for v in lits if isinstance(v, str))]
            for conds in ([together] if together else []) + each:
                if (table, conds) in out or not any(_names_rows(real, inv, table, col) for col, _ in conds):
                    continue
                n = len(_entity_rows(real, table, conds))
                if 1 <= n <= NAMED_MAX_ROWS:
                    out[(table, conds)] = n
    return tuple((t, conds, n) for (t, conds), n in out.items())


def _entity_rows(real: Any, table: str, conds: tuple) -> list[tuple]:
    """The first NAMED_MAX_ROWS + 1 real rows holding all of `conds` (within what RealRows.scope allows: an
    index's rows, or a large table's first rows)."""
    return real.equal_rows(table, tuple(col for col, _ in conds), tuple(v for _, v in conds), NAMED_MAX_ROWS + 1)


def _names_rows(real: Any, inv: Invariants, table: str, column: str) -> bool:
    """Whether the column names rows (most of its values name one row: a name, an id), not kinds of them
    (an element, a position, a department): a unique column does; another by its values in the rows
    RealRows.scope allows (a large table's first rows)."""
    t = inv.table(table)
    col = t.column(column) if t is not None else None
    if col is not None and col.unique and col.mined:
        return True
    scope, bound = real.scope(t) if t is not None else ("1", ())
    got = real.rows(f"SELECT count(DISTINCT {quote(column)}), count({quote(column)}) FROM {quote(table)} "
                    f"WHERE {scope}", bound)
    return bool(got) and got[0][1] > 0 and got[0][0] >= NAME_SHARE * got[0][1]


def _same_key(t: Any, a: tuple, b: tuple) -> bool:
    idx = [column_index(t, c) for c in t.keys[0]]
    return sqlite_key(tuple(a[i] for i in idx)) == sqlite_key(tuple(b[i] for i in idx))


def _holds(t: Any, conds: tuple, row: tuple) -> bool:
    return all(row[column_index(t, col)] == lit for col, lit in conds)


def _in_another_case(t: Any, conds: tuple, row: tuple, real: Any) -> bool:
    """Whether `row` holds the entity's name in another letter case, in a unique column whose real values
    stay apart in case."""
    if len(conds) != 1:
        return False
    column, lit = conds[0]
    c, v = t.column(column), row[column_index(t, column)]
    return (c is not None and c.unique and isinstance(v, str) and isinstance(lit, str) and v.lower() == lit.lower()
            and real.apart_in_case(t.name, column))


def _entity_column(inv: Invariants, table: str, column: str) -> tuple[str, str]:
    """The (table, column) an entity's name is held in: a reference column's parent column, else itself."""
    for r in inv.references:
        if r.child == table and r.child_columns == (column,) and r.parent != table:
            return r.parent, r.parent_columns[0]
    return table, column


# ---------------------------------------------------------------------------------- the presupposition


@dataclass(frozen=True)
class Presupposition:
    """What one check's small databases keep (see the module doc): built by `presupposition`, applied by
    `fit`, checked by `problems` (SmallDb.problems asks it, so a witness shrunk stays admissible)."""

    inv: Invariants
    fixed: tuple[tuple[Lookup, tuple[tuple, ...]], ...]  # each lookup table and its real rows
    stated: frozenset[tuple[str, int]]  # (lookup table, key) the evidence states
    entities: tuple[Entity, ...]
    entity_rows: tuple[tuple[str, tuple], ...]  # the real rows the entities are, to add where absent

    @property
    def fixed_tables(self) -> frozenset[str]:
        return frozenset(lk.table for lk, _ in self.fixed)

    def key(self) -> tuple:
        return (self.stated, self.entities)

    def with_entities(self, more: tuple[Entity, ...],
                      rows: tuple[tuple[str, tuple], ...]) -> Presupposition:
        return dataclasses.replace(self, entities=tuple(dict.fromkeys(self.entities + more)),
                                   entity_rows=tuple(dict.fromkeys(self.entity_rows + rows)))

    # ------------------------------------------------------------------------------ checks

    def problems(self, db: SmallDb) -> list[str]:
        """Every way `db` breaks what the question presupposes ([] = none)."""
        out = []
        for lk, real_rows in self.fixed:
            out += self._lookup_problems(db, lk, real_rows)
        out += self.entity_problems(db)
        return out

    def entity_problems(self, db: SmallDb) -> list[str]:
        out = []
        for table, conds, n in self.entities:
            t = self.inv.table(table)
            held = sum(1 for r in db.rows.get(t.name, []) if _holds(t, conds, r))
            if held != n:
                out.append(f"{table} rows with {dict(conds)!r}: {held} here, {n} in the real database")
        return out

    def _lookup_problems(self, db: SmallDb, lk: Lookup, real_rows: tuple[tuple, ...]) -> list[str]:
        t = self.inv.table(lk.table)
        ki, ni = column_index(t, lk.key), column_index(t, lk.name)
        by_name = {r[ni]: r for r in real_rows}
        rows = db.rows.get(t.name, [])
        seen = set()
        for r in rows:
            real = by_name.get(r[ni])
            # A row equal to its real row (most often the very same object) agrees on every value.
            if real is None or (r != real and any(j != ki and sqlite_key((v,)) != sqlite_key((real[j],))
                                                  for j, v in enumerate(r))):
                return [f"{t.name}: {r!r} is not one of its {len(real_rows)} real rows"]
            if r[ni] in seen:
                return [f"{t.name}: {r[ni]!r} is there twice"]
            seen.add(r[ni])
        if len(seen) != len(real_rows):
            return [f"{t.name} holds {len(seen)} of its {len(real_rows)} rows"]
        for table, key in self.stated:
            if table != t.name:
                continue
            real = next((r for r in real_rows if sqlite_key((r[ki],)) == sqlite_key((key,))), None)
            if real is not None and not any(r[ni] == real[ni] and sqlite_key((r[ki],)) == sqlite_key((key,))
                                            for r in rows):
                return [f"{t.name}: the evidence states {lk.key} = {key} is {real[ni]!r}"]
        return []

    # ------------------------------------------------------------------------------ fitting

    def fit(self, db: SmallDb, real: Any) -> SmallDb | None:
        """`db` with what the question presupposes (its named entities added where absent, its lookup
        tables completed, stated keys back on their rows), or None when it cannot hold it."""
        out = db.copy()
        out.presupposition = None
        absent = []
        for table, conds, n in self.entities:
            t = self.inv.table(table)
            if not any(_holds(t, conds, r) for r in out.rows.get(t.name, [])):
                absent += [(tb, row, conds) for tb, row in self.entity_rows if tb == t.name and _holds(t, conds, row)]
        if absent:
            rng = stable_rng("presupposed", db.note)
            for table, row, conds in absent:
                t = self.inv.table(table)
                rows = out.table_rows(t.name)
                # A variant changed the entity's own values: the changed row is another entity beside it
                # (under fresh keys), and the entity is itself again.
                changed = next((r for r in rows if t.keys and _same_key(t, r, row)), None)
                if changed is not None:
                    rows[rows.index(changed)] = row
                    # A reference column that never repeats names another real parent (closed below).
                    changes = {c: changed[column_index(t, c)] for c, _ in conds}
                    for ref in self.inv.references:
                        if ref.child == t.name and len(ref.child_columns) == 1:
                            c = t.column(ref.child_columns[0])
                            if c is not None and c.unique and c.name not in changes:
                                changes[c.name] = fresh_value(out, t.name, c.name, real, rng)
                    # Its unique name in another case only ('aGILITY'): not another entity where the real names
                    # stay apart in case (t2sql.equivalence.targeted keeps them so), just the entity again.
                    if None not in changes.values() and not _in_another_case(t, conds, changed, real):
                        duplicate(out, t.name, changed, real, rng, changes)
                else:
                    add_rows(out, table, [row])
                    # As it is: with its real rows of every table each of its kind must have (a bond's
                    # both connections), a few at most, not just the one closing would bring.
                    for ref in self.inv.references:
                        if ref.parent == t.name and ref.total:
                            key = tuple(row[column_index(t, c)] for c in ref.parent_columns)
                            add_rows(out, ref.child, real.children(ref, key, limit=ENTITY_CHILDREN))
            closed = close(out, real, max_rows=max(out.size, 1) * 4 + 64)
            if closed is None:
                return None
            out = closed
        for lk, real_rows in self.fixed:
            if not self._complete(out, lk, real_rows):
                return None
        out.presupposition = self
        return None if out.problems() else out

    def _complete(self, db: SmallDb, lk: Lookup, real_rows: tuple[tuple, ...]) -> bool:
        t = self.inv.table(lk.table)
        ki, ni = column_index(t, lk.key), column_index(t, lk.name)
        rows = db.rows.setdefault(t.name, [])
        names = {r[ni] for r in rows}
        used = {sqlite_key((r[ki],)) for r in rows}
        free = None  # the real keys not in use, listed when first needed (`used` only grows: the same next)
        for r in real_rows:
            if r[ni] in names:
                continue
            if sqlite_key((r[ki],)) not in used:
                key = r[ki]
            else:
                if free is None:
                    free = [x[ki] for x in real_rows if sqlite_key((x[ki],)) not in used]
                key = next((k for k in free if sqlite_key((k,)) not in used), None)
                if key is None:
                    ints = [k for k in (x[ki] for x in rows) if isinstance(k, int)]
                    key = (max(ints) + 1) if ints else None
                if key is None:
                    return False
            used.add(sqlite_key((key,)))
            # Under its own key the real row itself comes in (the same values, and the same object).
            rows.append(r if key is r[ki] else tuple(key if j == ki else v for j, v in enumerate(r)))
            names.add(r[ni])
        for table, key in sorted(self.stated):
            if table != t.name:
                continue
            real = next((r for r in real_rows if sqlite_key((r[ki],)) == sqlite_key((key,))), None)
            here = next((r for r in rows if real is not None and r[ni] == real[ni]), None)
            if here is not None and sqlite_key((here[ki],)) != sqlite_key((key,)):
                _swap_keys(db, lk, here[ki], key)
                rows = db.rows[t.name]
        return True


def rotate_lookup_keys(db: SmallDb, real: Any) -> bool:
    """The fixed lookup tables' rows `db` holds, each under the key of a real row some steps on (the keys in
    order, turned), every reference following: the same vocabulary under other numbers, where a key hard-coded
    from today's data names a row the query's own rows do not reference (rather than other rows, which may
    tie). Made whole by `Presupposition.fit`. False when there is none to rotate."""
    inv = db.inv
    done = False
    for lk in lookups(inv):
        t = inv.table(lk.table)
        if not db.rows.get(t.name):
            continue
        ki = column_index(t, lk.key)
        keys = [r[0] for r in real.rows(f"SELECT {quote(lk.key)} FROM {quote(t.name)} ORDER BY {quote(lk.key)}")]
        if len(keys) < 2 or len(keys) != t.rows:
            continue  # not read whole
        # The shortest turn that leaves every key in use here to a row not held here (else one step).
        at = {sqlite_key((k,)): i for i, k in enumerate(keys)}
        held = {at[sqlite_key((r[ki],))] for r in db.rows[t.name] if sqlite_key((r[ki],)) in at}
        n = len(keys)
        turn = next((s for s in range(1, n) if not {(i - s) % n for i in held} & held), 1)
        _move_keys(db, lk, {sqlite_key((k,)): keys[(i + turn) % n] for i, k in enumerate(keys)})
        done = True
    return done


def _swap_keys(db: SmallDb, lk: Lookup, a: Any, b: Any) -> None:
    """Keys `a` and `b` of a lookup table trade places, in it and in every reference to it."""
    _move_keys(db, lk, {sqlite_key((a,)): b, sqlite_key((b,)): a})


def _move_keys(db: SmallDb, lk: Lookup, move: dict) -> None:
    """A lookup table's keys moved as `move` says (sqlite_key of a key -> its new key), in it and in every
    reference to it; a key `move` does not name stays."""
    inv = db.inv

    def moved(v: Any) -> Any:
        return move.get(sqlite_key((v,)), v) if v is not None else v

    t = inv.table(lk.table)
    ki = column_index(t, lk.key)
    db.rows[t.name] = [tuple(moved(v) if j == ki else v for j, v in enumerate(r)) for r in db.rows.get(t.name, [])]
    for ref in inv.references:
        if ref.parent != t.name or ref.parent_columns != (lk.key,) or len(ref.child_columns) != 1:
            continue
        child = inv.table(ref.child)
        ci = column_index(child, ref.child_columns[0])
        db.rows[child.name] = [tuple(moved(v) if j == ci else v for j, v in enumerate(r))
                               for r in db.rows.get(child.name, [])]


def presupposition(real: Any, inv: Invariants, sqls: list[str], evidence: str = "") -> Presupposition:
    """What the queries `sqls` and the task's evidence presuppose of every database of this kind."""
    fixed = []
    for lk in lookups(inv):
        t = inv.table(lk.table)
        rows = real.rows(f"SELECT {', '.join(quote(c) for c in t.column_names)} FROM {quote(t.name)}")
        if len(rows) != t.rows:
            continue  # not read whole: not kept whole
        fixed.append((lk, tuple(rows)))
    entities = named(real, inv, sqls)
    return Presupposition(inv, tuple(fixed), stated_keys(evidence, inv), entities, entity_rows(real, inv, entities))


def entity_rows(real: Any, inv: Invariants, entities: tuple[Entity, ...]) -> tuple:
    """The real rows the entities are."""
    out = []
    for table, conds, n in entities:
        out += [(inv.table(table).name, tuple(r)) for r in _entity_rows(real, table, conds)]
    return tuple(out)


# ---------------------------------------------------------------------------------- one-row answers


def one_row_answer(real: Any, gold_sql: str) -> bool:
    """Whether the gold's result on the real database is one row without NULL (presumed when the gold does
    not finish within ONE_ROW_TIMEOUT_S: a doubt never makes a refutation)."""
    got = real.answer(gold_sql, ONE_ROW_TIMEOUT_S, max_rows=2)
    if got is None:
        return True
    return len(got) == 1 and all(v is not None for v in got[0])


def degenerate(core: Any, gold_sql: str, timeout_s: float) -> bool:
    """Whether the gold gives one row holding a NULL on a small database (`core`); a gold that cannot be
    read back is not called degenerate."""
    budget = checkbounds.current()
    try:
        got = budget.run(timeout_s, lambda t: core.rows(gold_sql, timeout_s=t, max_rows=2, cancel=budget.cancel))
    except checkbounds.BudgetSpent:
        raise
    except Exception as e:  # noqa: BLE001 -- a failed read says nothing; QueryCancelled goes on up
        if type(e).__name__ == "QueryCancelled":
            raise
        return False
    return len(got) == 1 and any(v is None for v in got[0])
