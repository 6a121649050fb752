"""Whether a derived false positive is in fact equivalent under the declared schema and the mined
invariants (DISTINCT over a key, COUNT(col) of a never-NULL column, `=` vs `LIKE` of a literal whose case
cannot vary, a LEFT JOIN whose partner always exists, ...): such a pair is counted as equivalent, so the
measurement's two tables count what they say."""

from __future__ import annotations

import re
from typing import Any

from t2sql import sqltext
from t2sql.equivalence import querytext, realism
from t2sql.equivalence.invariants import Invariants, quote, text_format
from t2sql.equivalence.measure import row_bounds
from t2sql.equivalence.measure.derive import (
    COLREF,
    colref,
    column_of,
    edited,
    masked_sql,
    never_null,
    where_conjuncts,
)
from t2sql.equivalence.measure.presupposed_labels import (
    entity_kept_by_another,
    entity_pinned_by_another,
    named_row_in_any_case,
    one_entity_row,
    parents_of,
    pinned_columns,
    same_rows_of_a_vocabulary,
)
from t2sql.equivalence.smalldb import letter_cases


def label(kind: str, gold: str, pred: str, inv: Invariants, lookup: Any = None) -> str:
    """"equivalent" when a derived edit means the same on every database of this kind (the schema and the
    mined invariants), else "different"."""
    st = querytext.read(gold)
    if st is None:
        return "different"
    masked, _ = masked_sql(gold)
    if kind in ("like_for_eq", "literal_case", "like_substring") and (
            same_rows_of_a_vocabulary(gold, pred, st, inv, lookup) or entity_pinned_by_another(gold, pred, st, inv,
                                                                                                  lookup)):
        return "equivalent"
    if kind in ("add_limit", "add_distinct") and one_entity_row(gold, st, inv, lookup):
        return "equivalent"
    if kind == "add_limit":
        # LIMIT n cuts nothing where the gold's constants leave at most n rows on every database of its kind.
        n = re.search(r"LIMIT\s+(\d+)\s*$", pred, re.I)
        bound = row_bounds.rows_at_most(gold, inv, lookup)
        return "equivalent" if n and bound is not None and bound <= int(n.group(1)) else "different"
    if kind == "drop_conjunct" and entity_kept_by_another(gold, pred, inv, lookup):
        return "equivalent"
    if kind == "add_distinct":
        return ("equivalent" if _distinct_is_redundant(gold, inv) or row_bounds.distinct_rows(gold, inv, lookup)
                or row_bounds.rows_at_most(gold, inv, lookup) == 1 else "different")
    if kind == "drop_distinct":
        # The SELECT that lost its DISTINCT (a subquery's included) returns each row once anyway.
        at = next((i for i, (a, b) in enumerate(zip(gold, pred)) if a != b), len(pred))
        inner = _enclosing_select(pred, at)
        if _in_unused_select_item(pred, inner, at):
            return "equivalent"  # a derived table's column the outer SELECT never reads
        if re.search(r"COUNT\s*\(\s*$", gold[max(0, at - 16):at], re.I):
            # COUNT(DISTINCT x) -> COUNT(x): the same only when x is a never-NULL unique column of the one
            # table its SELECT reads.
            m = re.match(rf"\s*{COLREF}\s*\)", pred[at:])
            again = querytext.read(inner)
            if m and again is not None and len(again.parts) == 1:
                items = querytext.from_items(again, again.parts[0], inv)
                found = column_of(again, inv, *colref(m))
                joined = re.search(r"(?<!\w)JOIN(?!\w)|,", inner[again.parts[0].from_clause[0]:
                                                                 again.parts[0].from_clause[1]]
                                   if again.parts[0].from_clause else "", re.I)
                if (found and len(items) == 1 and not joined and found[1].unique
                        and never_null(found[0], found[1].name)):
                    return "equivalent"
            return "different"
        # Inside IN (...): a value is in a list or not, however often it appears there.
        if re.search(r"(?<!\w)IN\s*\(\s*$", pred[:pred.rfind("SELECT", 0, at)], re.I):
            return "equivalent"
        # A derived table whose outer SELECT only counts distinct values (or takes a MIN or MAX) of it.
        outer = _outer_of(pred, inner)
        if outer is not None and _only_distinct_aggregates(outer):
            return "equivalent"
        return ("equivalent" if _distinct_is_redundant(inner, inv) or row_bounds.distinct_rows(inner, inv, lookup)
                else "different")
    if kind == "count_star":
        has_outer = re.search(r"(?<!\w)(LEFT|RIGHT|FULL)\s+(OUTER\s+)?JOIN(?!\w)", masked, re.I) is not None
        for m in re.finditer(rf"(?<!\w)COUNT\s*\(\s*{COLREF}\s*\)", masked, re.I):
            if gold[:m.start()] + "COUNT(*)" + gold[m.end():] != pred or has_outer:
                continue
            found = column_of(st, inv, *colref(m)) or _derived_column(gold, inv, *colref(m))
            if found and (never_null(found[0], found[1].name)
                          or _not_null_in_where(_enclosing_select(gold, m.start()), inv, found[0].name, found[1].name)):
                return "equivalent"
        return "different"
    if kind in ("like_for_eq", "like_substring"):
        # A column whose every value is a date (YYYY-MM-DD, nothing around it: a mined format every small
        # database keeps) holds no longer value around a date literal, and dates have no letter case.
        m, _ = edited(rf"{COLREF}\s+LIKE\s+'((?:[^']|'')*)'", gold, pred)
        found = column_of(st, inv, *colref(m)) if m else None
        if (found and found[1].mined and found[1].types == ("text",) and found[1].formats == ("date",)
                and text_format(m.group(3).strip("%")) == "date"):
            return "equivalent"
    if kind in ("like_for_eq", "like_substring") and _one_width_identifier(gold, pred, st, inv, lookup):
        return "equivalent"
    if kind in ("like_for_eq", "literal_case") and named_row_in_any_case(gold, pred, st, inv, lookup):
        return "equivalent"
    if kind in ("like_for_eq", "literal_case", "like_substring"):
        closed = _closed_vocabulary_label(kind, gold, pred, st, inv)
        if closed is not None:
            return closed
    if kind in ("like_for_eq", "literal_case"):
        # The same whenever no value can differ from the literal in case alone: a literal without letters,
        # or an identifier that only ever uses the literal's case.
        pattern = (rf"{COLREF}\s+LIKE\s+'((?:[^']|'')*)'" if kind == "like_for_eq"
                   else rf"lower\s*\(\s*{COLREF}\s*\)\s*=\s*'((?:[^']|'')*)'")
        m, gold_literal = edited(pattern, gold, pred)
        if m is None:
            return "different"
        literal = m.group(3).replace("''", "'")
        if kind == "like_for_eq" and "%" in literal:
            return "different"
        if kind == "literal_case":
            literal = gold_literal if gold_literal is not None else literal
        if not re.search(r"[A-Za-z]", literal) and "_" not in literal:
            return "equivalent"
        found = column_of(st, inv, *colref(m))
        if not found or found[1].name not in inv.identifiers(found[0].name) or not found[1].mined:
            return "different" if re.search(r"[A-Za-z]", literal) or "_" in literal else "equivalent"
        used = set(found[1].cases)
        if not (len(used) <= 1 and letter_cases(literal) <= used):
            return "different"
        if kind == "like_for_eq" and "_" in literal:
            # `_` matches any one character; identifiers come from the real domain only, so the LIKE
            # says the same as = when no other identifier there fits it.
            if lookup is None:
                return "different"
            t, c = found[0].name, found[1].name
            others = lookup(f"SELECT count(*) FROM {quote(t)} WHERE {quote(c)} LIKE ? AND {quote(c)} <> ?",
                            (literal, literal))
            return "equivalent" if others and others[0][0] == 0 else "different"
        return "equivalent"
    if kind == "text_date_boundary":
        # On a column that never holds a time of day, date(col) is col and a year's BETWEEN its days is
        # its LIKE 'YYYY%': the same query.
        m = re.search(rf"date\s*\(\s*{COLREF}\s*\)", pred, re.I) or re.search(rf"{COLREF}\s+BETWEEN", pred, re.I)
        if m:
            found = column_of(st, inv, *colref(m))
            if found and found[1].mined and set(found[1].formats) <= {"date"} and found[1].types == ("text",):
                return "equivalent"
        return "different"
    if kind == "drop_conjunct":
        parts = where_conjuncts(gold)
        if parts is not None:
            dropped = [c for c in parts[2] if c not in pred]
            for c in dropped:
                m = re.fullmatch(rf"{COLREF}\s+IS\s+NOT\s+NULL", c.strip(), re.I)
                if m:
                    found = column_of(st, inv, *colref(m))
                    if found and never_null(found[0], found[1].name):
                        return "equivalent"
                m = re.fullmatch(rf"{COLREF}\s*(?:<>|!=)\s*''", c.strip(), re.I)
                if m:
                    found = column_of(st, inv, *colref(m))
                    if (found and found[1].mined and "empty" not in found[1].formats
                            and never_null(found[0], found[1].name)):
                        return "equivalent"
        return "different"
    if kind == "left_join":
        return _left_join_label(gold, pred, st, inv)
    return "different"

def _one_width_identifier(gold: str, pred: str, st: querytext.Statement, inv: Invariants, lookup: Any) -> bool:
    """The edited LIKE is on an identifier whose real values all have the literal's width and one letter case
    (ids TR000 ... TR342): its values come from that domain and keep its shape (a fresh key is a real one,
    no longer text is made around it: t2sql.equivalence.variants), so a value holding the literal in any case
    is the literal, and the LIKE picks what the gold's `=` picks."""
    m, _ = edited(rf"{COLREF}\s+LIKE\s+'((?:[^']|'')*)'", gold, pred)
    found = column_of(st, inv, *colref(m)) if m else None
    if lookup is None or found is None or not found[1].mined or found[1].types != ("text",):
        return False
    table, column = found[0].name, found[1].name
    literal = m.group(3).replace("''", "'")
    if "_" in literal or "%" in literal.strip("%") or column not in inv.identifiers(table):
        return False
    literal = literal.strip("%")
    if not literal or not (len(found[1].cases) <= 1 and letter_cases(literal) <= set(found[1].cases)):
        return False
    domains = [(table, column)] + [(r.parent, r.parent_columns[0]) for r in inv.references
                                   if r.child == table and r.child_columns == (column,)]
    for t, c in domains:
        got = lookup(f"SELECT count(*), min(length({quote(c)})), max(length({quote(c)})), "
                     f"sum(typeof({quote(c)}) <> 'text') FROM {quote(t)} WHERE {quote(c)} IS NOT NULL")
        if not got or got[0][0] == 0 or got[0][1] != len(literal) or got[0][2] != len(literal) or got[0][3]:
            return False
    return True


def _closed_vocabulary_label(kind: str, gold: str, pred: str, st: Any, inv: Invariants) -> str | None:
    """On a column with a closed vocabulary (t2sql.equivalence.realism) the edit is the same on every database of
    this kind exactly when it picks the same values of the vocabulary as the gold's `=`; None when the
    column is open (or not found)."""
    pattern = (rf"lower\s*\(\s*{COLREF}\s*\)\s*=\s*'((?:[^']|'')*)'" if kind == "literal_case"
               else rf"{COLREF}\s+LIKE\s+'((?:[^']|'')*)'")
    m, gold_literal = edited(pattern, gold, pred)
    # A derived table's column passed through is its table's column (`FROM (SELECT T1.element ...) AS T`).
    found = (column_of(st, inv, *colref(m)) or _derived_column(gold, inv, *colref(m))) if m else None
    closed = realism.vocabulary(inv, found[0].name, found[1].name) if found else None
    if closed is None:
        return None
    text = m.group(3).replace("''", "'")
    if kind == "literal_case":
        if gold_literal is None:
            return None
        literal = gold_literal
        picked = {v for v in closed if v.lower() == text}
    else:
        literal = text.strip("%") if kind == "like_substring" else text
        like = re.compile("".join(".*" if ch == "%" else "." if ch == "_" else re.escape(ch) for ch in text),
                          re.I | re.A | re.S)
        picked = {v for v in closed if like.fullmatch(v)}
    return "equivalent" if picked == {v for v in closed if v == literal} else "different"


def _derived_column(sql: str, inv: Invariants, qualifier: str | None, column: str):
    """(table, Column) that `qualifier.column` names when `qualifier` is a derived table `(SELECT ...) AS
    qualifier` of `sql` whose select list passes a table's column through under that name (inner joins
    only), else None."""
    if qualifier is None:
        return None
    for m in re.finditer(rf"\)\s*(?:AS\s+)?{re.escape(qualifier)}(?!\w)", sql, re.I):
        inner = _enclosing_select(sql, m.start())
        st = querytext.read(inner)
        if st is None or len(st.parts) != 1 or re.search(r"(?<!\w)(LEFT|RIGHT|FULL)(?!\w)", inner, re.I):
            continue
        for x, y in querytext.split_top(inner, st.parts[0].select_list):
            item = re.fullmatch(rf"{COLREF}(?:\s+(?:AS\s+)?(\w+))?", inner[x:y].strip(), re.I)
            if item and (item.group(3) or querytext.unquote(item.group(2))).lower() == column.lower():
                return column_of(st, inv, *colref(item))
    return None


def _in_unused_select_item(sql: str, inner: str, at: int) -> bool:
    """Whether position `at` of `sql` is inside a select-list item of the derived table `inner` that the
    outer SELECT cannot read: the item has no name the outer text uses, and the outer uses no `*`."""
    outer = _outer_of(sql, inner)
    start = sql.find(inner)
    st = querytext.read(inner)
    if outer is None or start < 0 or st is None or len(st.parts) != 1 or re.search(r"\*", outer):
        return False
    for x, y in querytext.split_top(inner, st.parts[0].select_list):
        if not start + x <= at < start + y:
            continue
        item = inner[x:y].strip()
        alias = re.search(r"\s(?:AS\s+)?(\w+)\s*$", item, re.I)
        name = alias.group(1) if alias and not re.search(r"\)\s*$", item) else None
        if name is None:
            plain = re.fullmatch(COLREF, item)
            name = querytext.unquote(plain.group(2)) if plain else None
        return name is None or not re.search(rf"(?<![\w]){re.escape(name)}(?![\w])", outer, re.I)
    return False


def _outer_of(sql: str, inner: str) -> str | None:
    """The SELECT a derived table `(inner) AS x` of `sql` is read by: `sql` without the derived table's
    text, when `inner` is one (else None)."""
    if inner == sql:
        return None
    at = sql.find(inner)
    if at < 0 or not re.match(r"\s*\)\s*(AS\s+)?\w+", sql[at + len(inner):], re.I):
        return None
    if not re.search(r"(?<!\w)FROM\s*\(\s*$", sql[:at], re.I):
        return None
    return sql[:at] + sql[at + len(inner):]


def _only_distinct_aggregates(sql: str) -> bool:
    """Whether the outer SELECT's list holds only COUNT(DISTINCT ...), MIN(...) or MAX(...) (duplicate rows
    of what it reads change none of them)."""
    st = querytext.read(sql)
    if st is None or len(st.parts) != 1:
        return False
    items = [sql[x:y].strip() for x, y in querytext.split_top(sql, st.parts[0].select_list)]
    return bool(items) and all(re.fullmatch(r"(COUNT\s*\(\s*DISTINCT\b|MIN\s*\(|MAX\s*\().*\)", i, re.I | re.S)
                               for i in items)


def _enclosing_select(sql: str, pos: int) -> str:
    """The text of the innermost SELECT around position `pos`: a parenthesised subquery, or `sql`."""
    best = None
    for t in sqltext.tokens(sql):
        if t.kind == "open" and t.start < pos:
            best_open = t
            depth = 0
            end = None
            for u in sqltext.tokens(sql[best_open.start:]):
                if u.kind == "open":
                    depth += 1
                elif u.kind == "close":
                    depth -= 1
                    if depth == 0:
                        end = best_open.start + u.end
                        break
            if end is not None and end > pos and re.match(r"\s*(SELECT|WITH)\b", sql[best_open.end:], re.I):
                best = (best_open.end, end - 1)
    return sql[best[0]:best[1]] if best else sql

def _not_null_in_where(sub: str, inv: Invariants, table: str, column: str) -> bool:
    """A top-level WHERE condition of this SELECT rejects NULL in the column (a comparison with a literal,
    LIKE, IN, BETWEEN, IS NOT NULL)."""
    st = querytext.read(sub)
    if st is None or len(st.parts) != 1 or st.parts[0].where is None:
        return False
    for x, y in querytext.top_conjuncts(sub, st.parts[0].where):
        m = re.match(rf"\s*{COLREF}\s*(=|<>|!=|<=|>=|<|>|LIKE\b|IN\b|BETWEEN\b|IS\s+NOT\s+NULL)", sub[x:y], re.I)
        if m:
            found = querytext.resolve(st, inv, *colref(m))
            if found == [(table, column)]:
                return True
    return False

def _rejects_null_of(sql: str, st: querytext.Statement, inv: Invariants, alias: str, table: str) -> bool:
    """A top-level WHERE condition of the outer SELECT compares a column of `alias` (of `table`) in a way NULL
    never meets (a comparison with a literal, LIKE, IN, BETWEEN, IS NOT NULL)."""
    if len(st.parts) != 1 or st.parts[0].where is None:
        return False
    for x, y in querytext.top_conjuncts(sql, st.parts[0].where):
        m = re.match(rf"\s*{COLREF}\s*(=|<>|!=|<=|>=|<|>|LIKE\b|IN\b|NOT\s+IN\b|BETWEEN\b|IS\s+NOT\s+NULL)",
                     sql[x:y], re.I)
        if not m:
            continue
        qual, column = colref(m)
        if qual is not None:
            if qual.lower() == alias.lower():
                return True
        elif querytext.resolve(st, inv, None, column) == [(inv.table(table).name, inv.table(table).column(column).name)
                                                           if inv.table(table) and inv.table(table).column(column)
                                                           else ("", "")]:
            return True
    return False


def _distinct_is_redundant(sql: str, inv: Invariants) -> bool:
    """The outer SELECT (no DISTINCT, no GROUP BY) returns each row once on every database of this kind:
    it selects a key of one FROM table (never NULL), and every other FROM table is the parent of a
    reference from a table already counted, joined on that reference (each row has one partner)."""
    again = querytext.read(sql)
    if again is None or len(again.parts) != 1 or again.parts[0].distinct:
        return False
    part = again.parts[0]
    if part.group is not None:
        # GROUP BY the very columns it selects: one row per group already.
        norm = lambda text: re.sub(r"\s+", "", text).lower()  # noqa: E731
        selected = sorted(norm(sql[x:y]) for x, y in querytext.split_top(sql, part.select_list))
        grouped = sorted(norm(sql[x:y]) for x, y in querytext.split_top(sql, part.group))
        return bool(grouped) and set(grouped) <= set(selected)
    items = querytext.from_items(again, part, inv)
    if not items:
        return False
    masked = masked_sql(sql)[0]
    from_text = masked[part.from_clause[0]:part.from_clause[1]] if part.from_clause else ""
    if re.search(r"(?<!\w)(LEFT|RIGHT|FULL|CROSS)\s+(OUTER\s+)?JOIN(?!\w)|,", from_text, re.I):
        return False
    selected = []
    for x, y in querytext.split_top(sql, part.select_list):
        m = re.fullmatch(COLREF, sql[x:y].strip())
        if not m:
            continue
        found = column_of(again, inv, *colref(m))
        qual = colref(m)[0]
        if found:
            if qual is None:
                qual = next((i.alias for i in items if i.table == found[0].name), found[0].name)
            selected.append((qual.lower(), found[1].name.lower()))
    text = re.sub(r"\s+", "", sql.lower())
    for root in items:
        t = inv.table(root.table)
        keys = [k for k in t.keys] + [(c.name,) for c in t.columns if c.unique and never_null(t, c.name)]
        # A key it selects, or a key its WHERE pins to a literal (then the root gives one row at most).
        pinned = pinned_columns(sql, part, again, inv, root)
        if not any(all(never_null(t, c) for c in key) and
                   (all((root.alias.lower(), c.lower()) in selected for c in key)
                    or all(c.lower() in pinned for c in key)) for key in keys):
            continue
        if parents_of(root, items, text, inv):
            return True
    return False


def _left_join_label(gold: str, pred: str, st: querytext.Statement, inv: Invariants) -> str:
    """INNER -> LEFT JOIN means the same when no row can lack its partner: the joined table is the parent
    of a never-NULL reference from the other side, or the child of a total one."""
    m = re.search(rf"LEFT\s+JOIN\s+{COLREF}\s+(?:AS\s+)?([A-Za-z_]\w*)\s+ON\s+{COLREF}\s*=\s*{COLREF}\s*"
                  r"(?=$|\)|\s(?:WHERE|GROUP|ORDER|LIMIT|INNER|JOIN|LEFT)\b)", pred, re.I)
    if not m:
        return "different"
    # A HAVING that needs a count of the joined side above 0 drops the rows without a partner.
    alias = re.escape(m.group(3))
    if re.search(rf"HAVING\s+COUNT\s*\(\s*(?:DISTINCT\s+)?{alias}\s*\.\s*\w+\s*\)\s*(>\s*\d+|>=\s*[1-9])",
                 pred, re.I):
        return "equivalent"
    # A later INNER JOIN whose ON names the joined alias drops the rows the LEFT JOIN would keep.
    if _aggregates_ignore_missing_partner(pred, m.group(3)):
        return "equivalent"
    # A WHERE condition on the joined side that NULL never meets drops the rows without a partner.
    pst = querytext.read(pred)
    if pst is not None and _rejects_null_of(pred, pst, inv, m.group(3), querytext.unquote(m.group(2))):
        return "equivalent"
    later = re.match(r"\s*(?:INNER\s+)?JOIN\s+\S+\s+(?:AS\s+)?\S+\s+ON\s+([^()]*?)(?=$|\)|\s(?:WHERE|GROUP|ORDER|LIMIT|"
                     r"INNER|JOIN|LEFT)\b)", pred[m.end():], re.I)
    if later and re.search(rf"(?<![\w.]){re.escape(m.group(3))}\s*\.", later.group(1), re.I):
        return "equivalent"
    names, _ = querytext.aliases(st, inv)
    items = {a: querytext.FromItem(t, a) for a, t in names.items()}
    joined = inv.table(querytext.unquote(m.group(2)))
    alias = m.group(3).lower()
    ends = [(querytext.unquote((m.group(4) or "").strip().rstrip(".").strip()), querytext.unquote(m.group(5))),
            (querytext.unquote((m.group(6) or "").strip().rstrip(".").strip()), querytext.unquote(m.group(7)))]
    if joined is None or not all(q for q, _ in ends):
        return "different"
    mine_end = next((e for e in ends if e[0].lower() == alias), None)
    other_end = next((e for e in ends if e[0].lower() != alias), None)
    if mine_end is None or other_end is None or other_end[0].lower() not in items:
        return "different"
    other = inv.table(items[other_end[0].lower()].table)
    # Both sides name the same parent's key: a row of the other side names an existing parent (a never-NULL
    # reference), and that parent always has a child on the joined side (a total reference).
    for mine_ref in inv.references:
        if (mine_ref.child == joined.name and mine_ref.total and len(mine_ref.child_columns) == 1
                and mine_ref.child_columns[0].lower() == mine_end[1].lower()):
            for other_ref in inv.references:
                if (other_ref.child == other.name and other_ref.parent == mine_ref.parent
                        and other_ref.parent_columns == mine_ref.parent_columns
                        and len(other_ref.child_columns) == 1
                        and other_ref.child_columns[0].lower() == other_end[1].lower()
                        and never_null(other, other_ref.child_columns[0])):
                    return "equivalent"
    for ref in inv.references:
        if len(ref.child_columns) != 1:
            continue
        if (ref.child == other.name and ref.parent == joined.name
                and ref.child_columns[0].lower() == other_end[1].lower()
                and ref.parent_columns[0].lower() == mine_end[1].lower()
                and (never_null(other, ref.child_columns[0])
                     # or NULL there is filtered out (`WHERE T1.race_id = 21`): the reference names a parent
                     or _not_null_in_where(pred, inv, other.name, ref.child_columns[0]))):
            return "equivalent"
        if (ref.parent == other.name and ref.child == joined.name and ref.total
                and ref.parent_columns[0].lower() == other_end[1].lower()
                and ref.child_columns[0].lower() == mine_end[1].lower()):
            return "equivalent"
    return "different"


# What may surround the aggregates of a select list besides numbers and operators: casts and rounding.
_AROUND_AGGREGATES = {"CAST", "AS", "REAL", "INTEGER", "INT", "FLOAT", "NUMERIC", "ROUND", "IFNULL", "COALESCE"}


def _aggregates_ignore_missing_partner(sql: str, alias: str) -> bool:
    """The query is one aggregate row (no GROUP BY, no HAVING) whose select list reads only NULL-ignoring
    aggregates (COUNT, SUM, AVG, MIN, MAX) of plain columns of the LEFT JOIN's `alias`: a row the outer join
    keeps without a partner holds NULL there and adds nothing to any of them (over no row at all they are
    0 or NULL alike), so inner and outer join give the same row."""
    st = querytext.read(sql)
    if st is None or len(st.parts) != 1 or st.with_prefix:
        return False
    part = st.parts[0]
    if part.group is not None or re.search(r"(?<!\w)(HAVING|OVER|SELECT\s.*\sSELECT)(?!\w)",
                                           masked_sql(sql)[0], re.I | re.S):
        return False
    aggregate = re.compile(rf"(?<![\w.])(?:COUNT|SUM|AVG|MIN|MAX)\s*\(\s*(?:DISTINCT\s+)?{re.escape(alias)}\s*\.\s*"
                           r"(?:[A-Za-z_]\w*|`[^`]+`|\"[^\"]+\")\s*\)", re.I)
    found = False
    for x, y in querytext.split_top(sql, part.select_list):
        item = re.sub(r"\s+AS\s+(?:[A-Za-z_]\w*|`[^`]+`|\"[^\"]+\")\s*$", "", sql[x:y].strip(), flags=re.I)
        rest, n = aggregate.subn(" 0 ", item)
        found = found or n > 0
        if re.search(r"['\"`]", rest) or any(w.upper() not in _AROUND_AGGREGATES
                                            for w in re.findall(r"[A-Za-z_]\w*", rest)):
            return False
    return found
