"""Derived edits that what a question presupposes (t2sql.equivalence.presupposed) makes moot, labelled
equivalent by t2sql.equivalence.measure.labels: a filter on a fixed vocabulary that picks the gold's rows,
LIMIT or DISTINCT over a named entity's one row, a dropped condition the entity's unique partner value
keeps, a unique name the entity holds compared in any letter case."""

from __future__ import annotations

import re
from typing import Any

from t2sql.equivalence import querytext
from t2sql.equivalence.invariants import Invariants, quote
from t2sql.equivalence.measure.derive import COLREF, colref, column_of, edited, masked_sql, where_conjuncts
from t2sql.equivalence.presupposed import lookups, named


def parents_of(root: Any, items: list, text: str, inv: Invariants) -> bool:
    """Every FROM item besides `root` is the parent of a reference from one already counted, joined on
    that reference (`text`: the SQL, lower case, without spaces): each row of root has one partner."""
    covered = {root.alias.lower(): root}
    changed = True
    while changed:
        changed = False
        for item in items:
            if item.alias.lower() in covered:
                continue
            for ref in inv.references:
                if ref.parent != item.table or len(ref.child_columns) != 1:
                    continue
                for child in list(covered.values()):
                    if child.table != ref.child:
                        continue
                    a = f"{child.alias}.{ref.child_columns[0]}".lower()
                    b = f"{item.alias}.{ref.parent_columns[0]}".lower()
                    if f"{a}={b}" in text or f"{b}={a}" in text:
                        covered[item.alias.lower()] = item
                        changed = True
    return len(covered) == len(items)

def pinned_columns(sql: str, part: Any, st: querytext.Statement, inv: Invariants, root: Any) -> set[str]:
    """Columns of `root` that a top-level WHERE condition sets equal to a literal."""
    out: set[str] = set()
    if part.where is None:
        return out
    for x, y in querytext.top_conjuncts(sql, part.where):
        m = re.fullmatch(rf"\s*{COLREF}\s*=\s*('(?:[^']|'')*'|-?\d+(?:\.\d+)?)\s*", sql[x:y])
        if not m:
            continue
        qual, column = colref(m)
        if qual is not None and qual.lower() != root.alias.lower():
            continue
        found = column_of(st, inv, qual, column)
        if found and found[0].name == root.table:
            out.add(found[1].name.lower())
    return out


def same_rows_of_a_vocabulary(gold: str, pred: str, st: querytext.Statement, inv: Invariants, lookup: Any) -> bool:
    """The edited condition is on a fixed lookup table's name column (t2sql.equivalence.presupposed: every
    database of this kind holds its real rows, as they are) and picks the very rows the gold's `=` picks
    there: the same on every such database."""
    if lookup is None:
        return False
    m, gold_literal = _edited_comparison(gold, pred)
    if m is None:
        return False
    found = column_of(st, inv, *colref(m))
    fixed = next((lk for lk in lookups(inv) if found and lk.table == found[0].name and lk.name == found[1].name), None)
    if fixed is None:
        return False
    if gold_literal is None:
        return False
    t, c, k = quote(fixed.table), quote(fixed.name), quote(fixed.key)
    test = "lower({c}) = ?" if m.group(0).lower().startswith("lower") else "{c} LIKE ?"
    picked = lookup(f"SELECT {k} FROM {t} WHERE {test.format(c=c)}", (m.group(3).replace("''", "'"),))
    wanted = lookup(f"SELECT {k} FROM {t} WHERE {c} = ?", (gold_literal,))
    return bool(wanted) and sorted(map(repr, picked)) == sorted(map(repr, wanted))


def _edited_comparison(gold: str, pred: str) -> tuple[re.Match | None, str | None]:
    """The edited `lower(col) = 'x'` or `col LIKE 'x'` of `pred`, and the gold's literal there."""
    m, literal = edited(rf"lower\s*\(\s*{COLREF}\s*\)\s*=\s*'((?:[^']|'')*)'", gold, pred)
    return (m, literal) if m is not None else edited(rf"{COLREF}\s+LIKE\s+'((?:[^']|'')*)'", gold, pred)


class WholeFile:
    """`lookup` (a statement's rows on the real file) as t2sql.equivalence.presupposed reads the real database:
    the labels read every row, where the check reads a bounded part (t2sql.equivalence.real_rows.RealRows)."""

    def __init__(self, lookup: Any):
        self.rows = lookup

    # Every row: the labels read the whole database.
    def scope(self, table: Any, columns: tuple = ()) -> tuple[str, tuple]:
        return "1", ()

    def equal_rows(self, table: str, columns: tuple, values: tuple, limit: int) -> list[tuple]:
        where = " AND ".join(f"{quote(c)} = ?" for c in columns)
        return self.rows(f"SELECT * FROM {quote(table)} WHERE {where} LIMIT {limit}", tuple(values))


def _entities(gold: str, inv: Invariants, lookup: Any) -> list[tuple]:
    return list(named(WholeFile(lookup), inv, [gold])) if lookup is not None else []


def one_entity_row(gold: str, st: querytext.Statement, inv: Invariants, lookup: Any) -> bool:
    """The gold reads one table, and its WHERE pins every value an entity it names is held by: it returns
    that entity's one row at most on every database that holds the entity once (t2sql.equivalence.presupposed)."""
    if len(st.parts) != 1 or st.parts[0].group is not None:
        return False
    part = st.parts[0]
    items = querytext.from_items(st, part, inv)
    from_text = masked_sql(gold)[0][part.from_clause[0]:part.from_clause[1]] if part.from_clause else ""
    if not items or re.search(r"(?<!\w)(LEFT|RIGHT|FULL|CROSS)\s+(OUTER\s+)?JOIN(?!\w)|,", from_text, re.I):
        return False
    text = re.sub(r"\s+", "", gold.lower())
    entities = _entities(gold, inv, lookup)
    for root in items:
        pinned = pinned_columns(gold, part, st, inv, root)
        if any(table == root.table and n == 1 and all(c.lower() in pinned for c, _ in conds)
               for table, conds, n in entities) and parents_of(root, items, text, inv):
            return True
    return False


def entity_pinned_by_another(gold: str, pred: str, st: querytext.Statement, inv: Invariants, lookup: Any) -> bool:
    """The edited condition's column is one of an entity's values, and another of them is a column that
    never repeats, compared with `=` in the prediction as in the gold: the one row holding that value is the
    entity, whose edited value is the gold's literal (t2sql.equivalence.presupposed), so both pick it alone."""
    m, gold_literal = _edited_comparison(gold, pred)
    if m is None:
        return False
    found = column_of(st, inv, *colref(m))
    if found is None:
        return False
    table, edited = found[0], found[1].name
    return _pinned_by_unique_partner(gold, pred, inv, lookup, table, edited)


def entity_kept_by_another(gold: str, pred: str, inv: Invariants, lookup: Any) -> bool:
    """The dropped condition is one of an entity's values, and another is a column that never repeats,
    kept by the prediction: the one row holding that value is the entity itself, which meets the dropped
    condition too (t2sql.equivalence.presupposed)."""
    parts = where_conjuncts(gold)
    if parts is None:
        return False
    dropped = [c for c in parts[2] if c not in pred]
    if len(dropped) != 1:
        return False
    m = re.fullmatch(rf"\s*{COLREF}\s*=\s*'((?:[^']|'')*)'\s*", dropped[0])
    st = querytext.read(gold)
    found = column_of(st, inv, *colref(m)) if m and st is not None else None
    if found is None:
        return False
    table, edited = found[0], found[1].name
    return _pinned_by_unique_partner(gold, pred, inv, lookup, table, edited)


def _pinned_by_unique_partner(gold: str, pred: str, inv: Invariants, lookup: Any, table: Any, edited: str) -> bool:
    """Whether `edited` is a value of an entity the gold names (one real row), and the prediction keeps
    another of that entity's values, in a column that never repeats: that one row is the entity itself."""
    for name, conds, n in _entities(gold, inv, lookup):
        if name != table.name or n != 1 or edited not in [c for c, _ in conds]:
            continue
        for other, value in conds:
            col = table.column(other)
            literal = "'" + value.replace("'", "''") + "'"
            if (other != edited and col is not None and col.unique
                    and re.search(rf"{re.escape(other)}\s*=\s*{re.escape(literal)}", pred, re.I)):
                return True
    return False


def named_row_in_any_case(gold: str, pred: str, st: querytext.Statement, inv: Invariants, lookup: Any) -> bool:
    """The edit compares a unique name in any letter case (`lower(name) = 'stealth'`, `name LIKE 'Stealth'`)
    where the real names stay apart in letter case too, and the gold's literal names a row every database
    of this kind holds (t2sql.equivalence.presupposed): no other name there folds to it (the check keeps unique
    names apart in case, t2sql.equivalence.targeted), so both pick that one row."""
    m, gold_literal = edited(rf"lower\s*\(\s*{COLREF}\s*\)\s*=\s*'((?:[^']|'')*)'", gold, pred)
    if m is None:
        m, gold_literal = edited(rf"{COLREF}\s+LIKE\s+'((?:[^']|'')*)'", gold, pred)
    found = column_of(st, inv, *colref(m)) if m else None
    if lookup is None or found is None or gold_literal is None or not found[1].unique or found[1].types != ("text",):
        return False
    literal = m.group(3).replace("''", "'")
    if "%" in literal or "_" in literal or literal.lower() != gold_literal.lower():
        return False
    table, column = found[0].name, found[1].name
    held = any(name == table and (column, gold_literal) in conds and n >= 1
               for name, conds, n in _entities(gold, inv, lookup))
    apart = lookup(f"SELECT count(DISTINCT lower({quote(column)})) = count(DISTINCT {quote(column)}) "
                   f"FROM {quote(table)}")
    return held and bool(apart) and apart[0][0] == 1
