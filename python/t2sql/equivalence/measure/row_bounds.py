"""What one SELECT's rows are bound to on every database of its kind: a row is pinned when the values around it leave
one choice (a key it meets by `=`, a named entity held once, a keyed symmetry's one pair). The labeller
(t2sql.equivalence.measure.labels) reads from it when DISTINCT changes nothing and when LIMIT n cuts nothing.
Only inner joins of schema tables are bounded; anything else is not."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from t2sql.equivalence import querytext, realism
from t2sql.equivalence.invariants import Invariants
from t2sql.equivalence.measure.derive import COLREF, colref, masked_sql, never_null
from t2sql.equivalence.measure.presupposed_labels import WholeFile
from t2sql.equivalence.presupposed import named

# `x = y` where each side is a column or a literal (a string, a number).
_LITERAL = r"'(?:[^']|'')*'|-?\d+(?:\.\d+)?"
_EQUALITY = re.compile(rf"\s*(?:{COLREF}|({_LITERAL}))\s*=\s*(?:{COLREF}|({_LITERAL}))\s*", re.S)

# `x IN ('a', 'b')`: one of a few literals.
_IN_LIST = re.compile(rf"\s*{COLREF}\s+IN\s*\((.*)\)\s*", re.I | re.S)

_OUTER = re.compile(r"(?<!\w)(LEFT|RIGHT|FULL|CROSS|NATURAL)(?!\w)|(?<!\w)USING(?!\w)", re.I)


@dataclass
class _Query:
    st: querytext.Statement
    part: querytext.SelectPart
    items: list[querytext.FromItem]
    pins: dict[tuple[str, str], set]  # (alias, column) -> the literals it is set equal to
    equalities: list[tuple[tuple[str, str], tuple[str, str]]]  # column = column
    inv: Invariants
    in_lists: dict[tuple[str, str], set] = field(default_factory=dict)  # column IN (literals, ...)

    def found(self, column: str) -> list[tuple[str, str]]:
        return querytext.resolve(self.st, self.inv, None, column)


def distinct_rows(sql: str, inv: Invariants, lookup: Any = None) -> bool:
    """Whether the outer SELECT of `sql` (one part, no GROUP BY) returns each row once on every database of
    its kind: the columns it selects, with its constants, pin one row of every FROM item, so two result
    rows that agree come from the same rows."""
    q = _read(sql, inv)
    if q is None or q.part.group is not None:
        return False
    # A NULL in a unique column pins nothing (unique columns may repeat NULL), so only never-NULL ones.
    selected = {ref for ref in _refs(q, q.part.select_list)
                if ref is not None and never_null(inv.table(_table(q, ref[0])), ref[1])}
    pinned, choices = _pinned(q, inv, lookup, selected)
    return choices == 1 and len(pinned) == len(q.items)


def rows_at_most(sql: str, inv: Invariants, lookup: Any = None) -> int | None:
    """A bound on the rows the outer SELECT of `sql` (one part) returns on every database of its kind, from
    its constants alone: 1 when they pin a row of every FROM item, times 2 for each keyed symmetric pair
    they name both ways (a bond's two rows) and k for each column set to one of k literals (`IN (...)`);
    as many when it groups by (or selects DISTINCT) columns of pinned rows only; the combinations of closed
    vocabularies a DISTINCT selects; None when nothing bounds it."""
    q = _read(sql, inv)
    if q is None:
        return None
    pinned, choices = _pinned(q, inv, lookup, set())
    # Rows merged by GROUP BY (or DISTINCT) on columns of rows the constants pin: one group for each choice
    # (a molecule's label, grouped over its many bonds).
    merged = _merged_columns(q)
    pins = len(pinned) == len(q.items) or (merged is not None and all(alias in pinned for alias, _ in merged))
    bounds = [b for b in (_distinct_values(q, inv), choices if pins else None) if b is not None]
    return min(bounds) if bounds else None


def _merged_columns(q: _Query) -> list[tuple[str, str]] | None:
    """The (alias, column) references the outer SELECT groups by, or (no GROUP BY) selects DISTINCT; None
    when one of them is not a plain column of a FROM item."""
    if q.part.group is not None:
        refs = _refs(q, q.part.group, COLREF)
    elif q.part.distinct:
        refs = _refs(q, q.part.select_list)
    else:
        return None
    return refs if refs and None not in refs else None


_SELECTED = rf"{COLREF}(?:\s+(?:AS\s+)?\w+)?"  # a select item that is a column, perhaps named


def _refs(q: _Query, span: tuple[int, int], pattern: str = _SELECTED) -> list[tuple[str, str] | None]:
    """Each comma-separated item of a clause of the outer SELECT as the (alias, column) it plainly is, or
    None where it is something else."""
    sql = q.st.sql
    out = []
    for x, y in querytext.split_top(sql, span):
        m = re.fullmatch(pattern, sql[x:y].strip(), re.I | re.S)
        out.append(_column(q, *colref(m)) if m else None)
    return out


def _distinct_values(q: _Query, inv: Invariants) -> int | None:
    """For SELECT DISTINCT of columns that each hold a closed vocabulary (t2sql.equivalence.realism: no other
    text ever), the number of their combinations (NULL counting as one more where it may be); else None."""
    if not q.part.distinct:
        return None
    refs = _refs(q, q.part.select_list)
    if None in refs:
        return None
    bound = 1
    for ref in refs:
        t = inv.table(_table(q, ref[0]))
        c = t.column(ref[1])
        values = realism.vocabulary(inv, t.name, c.name) if c is not None and c.types == ("text",) else None
        if values is None:
            return None
        bound *= len(values) + (1 if c.may_be_null else 0)
    return bound


def _read(sql: str, inv: Invariants) -> _Query | None:
    st = querytext.read(sql)
    if st is None or len(st.parts) != 1 or st.with_prefix:
        return None
    part = st.parts[0]
    items = querytext.from_items(st, part, inv)
    if not items or part.from_clause is None or len({i.alias.lower() for i in items}) != len(items):
        return None
    masked = masked_sql(sql)[0]
    from_text = masked[part.from_clause[0]:part.from_clause[1]]
    if _OUTER.search(from_text) or "(" in from_text:
        return None  # outer joins, derived tables: rows this reading does not follow
    if any(inv.table(i.table) is None or not inv.table(i.table).keys for i in items):
        return None  # a table without a key may hold a row twice
    q = _Query(st, part, items, {}, [], inv)
    conditions = [sql[x:y] for x, y in querytext.top_conjuncts(sql, part.where)] if part.where else []
    # The ON conditions of inner joins are conditions like the WHERE's.
    for on in re.finditer(r"(?<!\w)ON(?!\w)(.*?)(?=(?<!\w)(?:INNER\s+JOIN|JOIN)(?!\w)|$)", from_text, re.I | re.S):
        a, b = part.from_clause[0] + on.start(1), part.from_clause[0] + on.end(1)
        conditions += [sql[x:y] for x, y in querytext.top_conjuncts(sql, (a, b))]
    for text in conditions:
        listed = _IN_LIST.fullmatch(text)
        if listed is not None:
            ref = _column(q, *_side(listed.group(1), listed.group(2)))
            values = re.findall(_LITERAL, listed.group(3))
            if ref is not None and values and re.fullmatch(rf"\s*(?:(?:{_LITERAL})\s*,\s*)*(?:{_LITERAL})\s*",
                                                             listed.group(3)):
                q.in_lists[ref] = {_literal(v) for v in values}
            continue
        m = _EQUALITY.fullmatch(text)
        if m is None:
            continue
        left = _column(q, *_side(m.group(1), m.group(2))) if m.group(2) else None
        right = _column(q, *_side(m.group(4), m.group(5))) if m.group(5) else None
        if left and right:
            q.equalities.append((left, right))
        elif left and m.group(6):
            q.pins.setdefault(left, set()).add(_literal(m.group(6)))
        elif right and m.group(3):
            q.pins.setdefault(right, set()).add(_literal(m.group(3)))
    return q


def _literal(text: str) -> Any:
    return text[1:-1].replace("''", "'") if text.startswith("'") else float(text) if "." in text else int(text)


def _side(qualifier: str | None, column: str) -> tuple[str | None, str]:
    qual = querytext.unquote(qualifier.strip().rstrip(".").strip()) if qualifier else None
    return qual, querytext.unquote(column)


def _column(q: _Query, qualifier: str | None, column: str) -> tuple[str, str] | None:
    """(alias, column) of a reference to a FROM item's column (lower case), or None when it cannot be told."""
    if qualifier is not None:
        holders = [i for i in q.items if i.alias.lower() == qualifier.lower()]
    else:
        holders = [i for i in q.items if i.table in {t for t, _ in q.found(column)}]
    return (holders[0].alias.lower(), column.lower()) if len(holders) == 1 else None


def _table(q: _Query, alias: str) -> str:
    return next(i.table for i in q.items if i.alias.lower() == alias)


def _pinned(q: _Query, inv: Invariants, lookup: Any, known: set[tuple[str, str]]) -> tuple[set[str], int]:
    """The aliases whose row the `known` columns and the query's constants pin, and how many choices were
    left: 2 for each keyed symmetric pair named both ways, k for each column set to one of k literals."""
    known = set(known) | set(q.pins)
    pinned: set[str] = set()
    keys: dict[str, list[tuple[str, ...]]] = {}
    for item in q.items:
        t = inv.table(item.table)
        # A key pins a row when none of its columns is NULL there: a never-NULL column, or one the query
        # compares with `=` (NULL meets no `=`).
        keys[item.alias.lower()] = [tuple(c.lower() for c in k) for k in t.keys]
        keys[item.alias.lower()] += [(c.name.lower(),) for c in t.columns if c.unique]
        keys[item.alias.lower()] += [tuple(c.lower() for c in s.columns) for s in inv.unique_sets
                                     if s.table == t.name]
        # A keyed symmetric table's other columns name one pair, stored both ways: with one side, one row.
        for sym in inv.symmetries:
            if sym.keyed and sym.table == t.name:
                rest = [c.name.lower() for c in t.columns if c.name not in (sym.left, sym.right)]
                keys[item.alias.lower()] += [(*rest, sym.left.lower()), (*rest, sym.right.lower())]
    compared = set(q.pins) | {c for pair in q.equalities for c in pair}
    entities = _entities(q, inv, lookup)
    pins = {ref: set(values) for ref, values in q.pins.items()}
    choices = 1
    while True:
        changed = True
        while changed:
            changed = False
            for item in q.items:
                alias = item.alias.lower()
                if alias in pinned:
                    continue
                t = inv.table(item.table)
                if any(all((alias, c) in known and ((alias, c) in compared or never_null(t, c)) for c in key)
                       for key in keys[alias]) or _entity_pinned(alias, t.name, pins, entities):
                    pinned.add(alias)
                    known |= {(alias, c.name.lower()) for c in t.columns}
                    changed = True
            for a, b in q.equalities:
                for x, y in ((a, b), (b, a)):
                    if x in known and y not in known:
                        known.add(y)
                        changed = True
        # A keyed symmetric table whose other columns are known holds one pair there: two rows, one each
        # way; naming one side pins one of them.
        step = next(((item.alias.lower(), sym) for item in q.items if item.alias.lower() not in pinned
                     for sym in inv.symmetries if sym.keyed and sym.table == item.table
                     and all((item.alias.lower(), c.name.lower()) in known
                             for c in inv.table(item.table).columns
                             if c.name not in (sym.left, sym.right))), None)
        if step is not None:
            alias, sym = step
            known.add((alias, sym.left.lower()))
            compared.add((alias, sym.left.lower()))
            choices *= 2
            continue
        # A column set to one of a few literals: as many choices, each a literal it is set equal to.
        listed = next((ref for ref in q.in_lists if ref not in known and ref[0] not in pinned), None)
        if listed is None:
            return pinned, choices
        known.add(listed)
        compared.add(listed)
        pins.setdefault(listed, set()).update(q.in_lists[listed])
        choices *= len(q.in_lists[listed])


def _entity_pinned(alias: str, table: str, pins: dict, entities: list) -> bool:
    """Whether the literals the query sets columns of `alias` to name entities held once: one entity's
    columns all set to its literals, or a column whose every literal (one of an IN list) names one alone."""
    named_by = [conds for name, conds in entities if name == table]
    if any(all(pins.get((alias, c)) == {v} for c, v in conds) for conds in named_by):
        return True
    return any(values and all([(column, v)] in named_by for v in values)
               for (a, column), values in pins.items() if a == alias)


def _entities(q: _Query, inv: Invariants, lookup: Any) -> list[tuple[str, list[tuple[str, Any]]]]:
    """(table, (column, literal) pairs) of the entities the query names that the real database holds once:
    every database of this kind holds each once (t2sql.equivalence.presupposed)."""
    if lookup is None:
        return []

    return [(table, [(c.lower(), v) for c, v in conds]) for table, conds, n in named(WholeFile(lookup), inv, [q.st.sql])
            if n == 1]
