"""The pairs `t2sql equivalence --measure` derives from a gold query: false positives (MUTATIONS: edits that
change the query's meaning but often not its result on today's data) and equivalent rewrites
(REWRITES: edits that keep its meaning on every database of its kind), with the SQL-text helpers both
use. Whether a derived edit is in fact equivalent under the schema and the mined invariants is
t2sql.equivalence.measure.labels'."""

from __future__ import annotations

import re
from typing import Any

from t2sql import sqltext
from t2sql.equivalence import querytext
from t2sql.equivalence.invariants import Invariants, quote

MUTATIONS: dict[str, str] = {
    "drop_distinct": "DISTINCT removed (the data has no duplicates there)",
    "add_distinct": "DISTINCT added to the outer SELECT (the result has no duplicates)",
    "add_limit": "LIMIT n appended, n = the gold's row count",
    "count_star": "COUNT(col) -> COUNT(*) (col has no NULLs there)",
    "comparison_flip": ">= <-> >, <= <-> < (no row equals the constant)",
    "constant_shift": "a compared integer constant moved by 1 (selects the same rows)",
    "drop_conjunct": "one WHERE condition dropped (it filtered nothing)",
    "left_join": "INNER JOIN -> LEFT JOIN (every row has a partner)",
    "like_for_eq": "= 'text' -> LIKE 'text' (case never differs there)",
    "like_substring": "= 'text' -> LIKE '%text%' (no longer value holds it there)",
    "literal_case": "col = 'Text' -> lower(col) = 'text' (case never differs there)",
    "text_date_boundary": "a date range on the text -> on date(col) (no timestamp on the boundary day there)",
    "hard_coded_lookup": "a looked-up name -> the key it has today (lookup.name = 'x' -> lookup.id = 7)",
}

REWRITES: dict[str, str] = {
    "self": "the gold against itself",
    "wrapped": "SELECT * FROM (gold)",
    "conjuncts_reordered": "the WHERE conditions in reverse order",
    "aliases_renamed": "every table alias renamed",
    "fk_join_added": "a join to the parent a never-NULL reference names, not used",
    "fk_join_dropped": "a join to a parent along a never-NULL reference, used nowhere else, dropped",
    "in_subquery_for_join": "JOIN parent ... WHERE parent.x = v -> child.fk IN (SELECT key FROM parent WHERE x = v)",
    "count_star_never_null": "COUNT(col) -> COUNT(*) where col never holds NULL",
    "distinct_over_key": "DISTINCT added over a single table's key or never-NULL unique column",
    "derived_equivalent": "a derived edit that is equivalent under the schema and the mined invariants",
}

def masked_sql(sql: str) -> tuple[str, list[int]]:
    """`sql` with string literals' insides, quoted identifiers' insides and comments blanked (same
    length), and the parenthesis depth at every position."""
    out = [" " if not ch.isspace() else ch for ch in sql]
    depth = [0] * len(sql)
    after = 0
    last = 0
    for t in sqltext.tokens(sql):
        depth[last:t.start] = [after] * (t.start - last)
        depth[t.start:t.end] = [t.depth] * (t.end - t.start)
        if t.kind == "quoted":
            out[t.start] = sql[t.start]
            if t.end - 1 > t.start:
                out[t.end - 1] = sql[t.end - 1]
        else:
            out[t.start:t.end] = sql[t.start:t.end]
        after = t.depth + 1 if t.kind == "open" else t.depth
        last = t.end
    depth[last:] = [after] * (len(sql) - last)
    return "".join(out), depth

def words_at(masked: str, depth: list[int], word: str, at_depth: int | None = 0):
    for m in re.finditer(rf"(?<![\w.]){word}(?!\w)", masked, re.I):
        if at_depth is None or depth[m.start()] == at_depth:
            yield m.start()

def _where_clause(sql: str) -> tuple[int, int] | None:
    masked, depth = masked_sql(sql)
    starts = list(words_at(masked, depth, "WHERE"))
    if len(starts) != 1:
        return None
    start = starts[0] + len("WHERE")
    end = len(sql)
    for kw in sqltext.CLAUSE_KEYWORDS:
        for pos in words_at(masked, depth, kw):
            if pos > start:
                end = min(end, pos)
    return start, end

def where_conjuncts(sql: str) -> tuple[int, int, list[str]] | None:
    span = _where_clause(sql)
    if span is None:
        return None
    start, end = span
    masked, depth = masked_sql(sql)
    body_masked, body_depth = masked[start:end], depth[start:end]
    if list(words_at(body_masked, body_depth, "OR")) or list(words_at(body_masked, body_depth, "BETWEEN")):
        return None
    cuts = list(words_at(body_masked, body_depth, "AND"))
    parts, last = [], 0
    for c in cuts:
        parts.append(sql[start + last:start + c].strip())
        last = c + len("AND")
    parts.append(sql[start + last:end].strip())
    if any(not p for p in parts):
        return None
    return start, end, parts

def tail_space(sql: str, end: int) -> str:
    return " " if end < len(sql) else ""

def returns_one_row(sql: str) -> bool:
    """The outer query always returns exactly one row: aggregates without GROUP BY (or no FROM). Only what
    the outer SELECT itself computes counts: a scalar subquery's aggregate, a window function (OVER) or a
    two-argument min/max (a scalar function) returns a value per row."""
    masked, depth = masked_sql(sql.strip())
    selects = list(words_at(masked, depth, "SELECT"))
    if not selects or list(words_at(masked, depth, "GROUP")) or any(
            list(words_at(masked, depth, kw)) for kw in ("UNION", "EXCEPT", "INTERSECT", "LIMIT", "HAVING")):
        return False
    froms = [p for p in words_at(masked, depth, "FROM") if p > selects[0]]
    if not froms:
        return True
    start, end = selects[0] + 6, froms[0]
    # The select list with each subquery blanked: what the outer SELECT itself computes.
    own = list(masked[start:end])
    for sub in re.finditer(r"\(\s*SELECT(?!\w)", masked[start:end], re.I):
        at = start + sub.start()
        close = next((i for i in range(at + 1, end) if depth[i] <= depth[at]), end)
        own[at - start:close - start + 1] = " " * (close - at + 1)
    own_text = "".join(own)
    if re.search(r"(?<!\w)OVER(?!\w)", own_text, re.I):
        return False
    for m in re.finditer(r"(?<![\w.])(COUNT|SUM|AVG|MIN|MAX|TOTAL|GROUP_CONCAT)\s*\(", own_text, re.I):
        inside = start + m.end()  # just past the call's "("
        close = next((i for i in range(inside, end) if depth[i] < depth[inside]), end)
        if m.group(1).upper() in ("MIN", "MAX") and any(
                own[i - start] == "," and depth[i] == depth[inside] for i in range(inside, close)):
            continue
        return True
    return False

def column_of(st: querytext.Statement, inv: Invariants, qualifier: str | None, column: str):
    """(table, Column) of a column reference in `st` (its qualifier, or the one table that has such a
    column), or None when it cannot be told."""
    found = querytext.resolve(st, inv, qualifier, column)
    if len(found) != 1:
        return None
    t = inv.table(found[0][0])
    return t, t.column(found[0][1])

COLREF = r"((?:[A-Za-z_]\w*|`[^`]+`|\"[^\"]+\")\s*\.\s*)?([A-Za-z_]\w*|`[^`]+`|\"[^\"]+\")"

def edited(pattern: str, gold: str, pred: str) -> tuple[re.Match | None, str | None]:
    """The match of `pattern` in `pred` where a derived edit of one comparison begins (where `pred` first
    differs from `gold`), and the literal the gold compares with `=` there: a query that compares the same
    column twice (a CASE per value) is read at the comparison the edit changed."""
    at = next((i for i, (a, b) in enumerate(zip(gold, pred)) if a != b), min(len(gold), len(pred)))
    m = next((m for m in re.finditer(pattern, pred, re.I) if m.start() <= at < m.end()), None)
    g = re.compile(r"=\s*'((?:[^']|'')*)'").search(gold, at)
    return m, g.group(1).replace("''", "'") if g else None


def colref(match: re.Match) -> tuple[str | None, str]:
    qual = match.group(1)
    qual = querytext.unquote(qual.strip().rstrip(".").strip()) if qual else None
    return qual, querytext.unquote(match.group(2))

def derive_mutations(gold: str, row_count: int | None, inv: Invariants | None = None,
                     lookup: Any = None) -> list[tuple[str, str]]:
    """(kind, predicted SQL) candidates from one gold query (not yet checked on the data). `lookup`
    (sql -> rows) reads the real database for the kinds that hard-code what it holds today."""
    gold = gold.strip().rstrip(";").strip()
    masked, depth = masked_sql(gold)
    out: list[tuple[str, str]] = []
    for m in re.finditer(r"(?<!\w)DISTINCT\s+", masked, re.I):
        out.append(("drop_distinct", gold[:m.start()] + gold[m.end():]))
    selects = list(words_at(masked, depth, "SELECT"))
    one_row = returns_one_row(gold) or (row_count == 1 and re.search(r"(?<!\w)LIMIT\s+1(?!\d)", masked, re.I))
    if selects and not one_row and not re.match(r"\s*DISTINCT\b", masked[selects[0] + 6:], re.I):
        p = selects[0] + 6
        out.append(("add_distinct", gold[:p] + " DISTINCT" + gold[p:]))
    if row_count and row_count <= MAX_DERIVED_LIMIT and not one_row and not list(words_at(masked, depth, "LIMIT")):
        out.append(("add_limit", f"{gold} LIMIT {row_count}"))
    for m in re.finditer(r"(?<!\w)COUNT\s*\(\s*(?!\*|DISTINCT\b)([^()]+?)\s*\)", masked, re.I):
        out.append(("count_star", gold[:m.start()] + "COUNT(*)" + gold[m.end():]))
    flips = {">=": ">", "<=": "<", ">": ">=", "<": "<="}
    for m in re.finditer(r"(?<![<>!=])(>=|<=|>|<)(?![>=])", masked):
        out.append(("comparison_flip", gold[:m.start()] + flips[m.group(1)] + gold[m.end():]))
    for m in re.finditer(r"(?<![<>!])(>=|<=|>|<|=)\s*(-?\d+)(?![\w.])", masked):
        value = int(gold[m.start(2):m.end(2)])
        for shifted in (value - 1, value + 1):
            out.append(("constant_shift", gold[:m.start(2)] + str(shifted) + gold[m.end(2):]))
    parts = where_conjuncts(gold)
    if parts is not None:
        start, end, conj = parts
        if len(conj) == 1:
            w = max(i for i in words_at(masked, depth, "WHERE"))
            out.append(("drop_conjunct", (gold[:w].rstrip() + tail_space(gold, end) + gold[end:].lstrip()).strip()))
        else:
            for i in range(len(conj)):
                rest = " AND ".join(c for j, c in enumerate(conj) if j != i)
                out.append(("drop_conjunct", gold[:start] + " " + rest + tail_space(gold, end) + gold[end:].lstrip()))
    first_where = min(words_at(masked, depth, "WHERE", None), default=len(masked))
    for m in re.finditer(r"(?<!\w)(INNER\s+JOIN|(?<!LEFT )(?<!OUTER )(?<!CROSS )JOIN)(?!\w)", masked, re.I):
        alias = re.match(r"\s+([\w`\"]+)(?:\s+(?:AS\s+)?([A-Za-z_]\w*))?", masked[m.end():], re.I)
        names = {g.strip('`"').lower() for g in (alias.groups() if alias else ()) if g}
        after_where = masked[first_where:].lower()
        if any(re.search(rf"(?<![\w.]){re.escape(n)}\s*\.", after_where) for n in names - {"on", "where"}):
            continue
        out.append(("left_join", gold[:m.start()] + "LEFT JOIN" + gold[m.end():]))
    for m in re.finditer(rf"{COLREF}\s*(?<![<>!])=\s*'", masked):
        lit_end = string_end(gold, m.end() - 1)
        if lit_end is None:
            continue
        literal = gold[m.end() - 1:lit_end]
        inner = literal[1:-1]
        col = gold[m.start():m.start() + len(m.group(0)) - 1].rstrip().rstrip("=").rstrip()
        out.append(("like_for_eq", gold[:m.start()] + f"{col} LIKE {literal}" + gold[lit_end:]))
        if inner and "%" not in inner and "_" not in inner:
            out.append(("like_substring", gold[:m.start()] + f"{col} LIKE '%{inner}%'" + gold[lit_end:]))
        if inner.lower() != inner or inner.upper() != inner:
            out.append(("literal_case", gold[:m.start()] + f"lower({col}) = {literal.lower()}" + gold[lit_end:]))
    out += _date_boundaries(gold, masked)
    if inv is not None and lookup is not None:
        out += _hard_coded_lookups(gold, inv, lookup)
    seen, unique = {gold}, []
    for kind, sql in out:
        if sql not in seen:
            seen.add(sql)
            unique.append((kind, sql))
    return unique

def string_end(sql: str, start: int) -> int | None:
    """The end of the '...' literal that starts at `start`."""
    i = start + 1
    while i < len(sql):
        if sql[i] == "'":
            if i + 1 < len(sql) and sql[i + 1] == "'":
                i += 2
                continue
            return i + 1
        i += 1
    return None

_DATE = r"'(\d{4}-\d{2}-\d{2})'"

def _date_boundaries(gold: str, masked: str) -> list[tuple[str, str]]:
    out = []
    for m in re.finditer(rf"{COLREF}\s+BETWEEN\s+'", masked, re.I):
        rest = gold[m.end() - 1:]
        dm = re.match(rf"{_DATE}\s+AND\s+{_DATE}", rest, re.I)
        if not dm:
            continue
        col = gold[m.start():m.start() + len(m.group(1) or "") + len(m.group(2))]
        new = f"date({col}) BETWEEN '{dm.group(1)}' AND '{dm.group(2)}'"
        out.append(("text_date_boundary", gold[:m.start()] + new + gold[m.end() - 1 + dm.end():]))
    for m in re.finditer(rf"{COLREF}\s*(<=|<|>=|>)\s*'", masked):
        rest = gold[m.end() - 1:]
        dm = re.match(_DATE, rest)
        if not dm:
            continue
        col = gold[m.start():m.start() + len(m.group(1) or "") + len(m.group(2))]
        out.append(("text_date_boundary",
                    gold[:m.start()] + f"date({col}) {m.group(3)} '{dm.group(1)}'" + gold[m.end() - 1 + dm.end():]))
    for m in re.finditer(rf"SUBSTR\s*\(\s*{COLREF}\s*,\s*1\s*,\s*4\s*\)\s*=\s*'(....)'", masked, re.I):
        year = gold[m.start(3):m.end(3)]
        if not re.fullmatch(r"\d{4}", year):
            continue
        col = gold[m.start(1) if m.group(1) else m.start(2):m.end(2)]
        out.append(("text_date_boundary",
                    gold[:m.start()] + f"{col} BETWEEN '{year}-01-01' AND '{year}-12-31'" + gold[m.end():]))
    for m in re.finditer(rf"(?:strftime\s*\(\s*'..'\s*,\s*)?{COLREF}\s*\)?\s*(?:LIKE|=)\s*'(....%?)'", masked, re.I):
        text = gold[m.start():m.end()]
        if not (re.match(r"strftime\s*\(\s*'%Y'", text, re.I) or re.search(r"LIKE\s*'\d{4}%'$", text, re.I)):
            continue
        year = gold[m.start(3):m.end(3)].strip("%")
        if not re.fullmatch(r"\d{4}", year):
            continue
        inner = re.search(COLREF + r"\s*\)?\s*(?:LIKE|=)", gold[m.start():m.end()], re.I)
        col = inner.group(0)
        col = re.sub(r"\s*\)?\s*(LIKE|=)$", "", col, flags=re.I)
        out.append(("text_date_boundary", gold[:m.start()] + f"{col} BETWEEN '{year}-01-01' AND '{year}-12-31'"
                    + gold[m.end():]))
    return out

def _hard_coded_lookups(gold: str, inv: Invariants, lookup: Any) -> list[tuple[str, str]]:
    """`alias.name = 'x'` on a joined table with an integer key -> `alias.key = <x's key today>`."""
    st = querytext.read(gold)
    if st is None:
        return []
    items = {i.alias.lower(): i for part in st.parts for i in querytext.from_items(st, part, inv)}
    if len(items) < 2:
        return []
    masked, _ = masked_sql(gold)
    out = []
    for m in re.finditer(rf"{COLREF}\s*=\s*'", masked):
        qual, column = colref(m)
        if qual is None or qual.lower() not in items:
            continue
        table = inv.table(items[qual.lower()].table)
        if table is None or table.integer_key is None or not table.column(column):
            continue
        lit_end = string_end(gold, m.end() - 1)
        if lit_end is None:
            continue
        value = gold[m.end():lit_end - 1].replace("''", "'")
        rows = lookup(f"SELECT {quote(table.integer_key)} FROM {quote(table.name)} WHERE {quote(column)} = ?", (value,))
        if len(rows) != 1:
            continue
        out.append(("hard_coded_lookup",
                    gold[:m.start()] + f"{m.group(1) or ''}{quote(table.integer_key)} = {rows[0][0]}" + gold[lit_end:]))
    return out

# A LIMIT a model writes ("the top 5"); a LIMIT of thousands that equals today's row count is no answer a
# model gives, and no small database can cut it.
MAX_DERIVED_LIMIT = 50

_NOT_ALIASES = {"WHERE", "ON", "INNER", "LEFT", "RIGHT", "JOIN", "GROUP", "ORDER", "LIMIT", "USING",
                "CROSS", "NATURAL", "OUTER", "UNION", "EXCEPT", "INTERSECT", "HAVING", "AS", "WINDOW"}

def derive_rewrites(gold: str, inv: Invariants | None = None) -> list[tuple[str, str]]:
    """(kind, SQL) rewrites of one gold query that mean the same on every database of this kind."""
    gold = gold.strip().rstrip(";").strip()
    out = [("self", gold), ("wrapped", f"SELECT * FROM ({gold})")]
    parts = where_conjuncts(gold)
    if parts is not None and len(parts[2]) > 1:
        start, end, conj = parts
        out.append(("conjuncts_reordered",
                    gold[:start] + " " + " AND ".join(reversed(conj)) + tail_space(gold, end) + gold[end:].lstrip()))
    masked, _ = masked_sql(gold)
    aliases = []
    for m in re.finditer(r"(?<!\w)(?:FROM|JOIN)\s+[\w`\"]+\s+(?:AS\s+)?([A-Za-z_]\w*)", masked, re.I):
        if m.group(1).upper() not in _NOT_ALIASES and m.group(1) not in aliases:
            aliases.append(m.group(1))
    if aliases:
        renamed, masked_now = gold, masked
        for a in aliases:
            new = f"alias_{a}"
            pattern = rf"(?<![\w.]){re.escape(a)}(?=\s*\.)|(?<=\s){re.escape(a)}(?=\s*(?:$|[\s,)]))"
            pieces, last = [], 0
            for m in re.finditer(pattern, masked_now, re.I):
                pieces.append(renamed[last:m.start()] + new)
                last = m.end()
            renamed = "".join(pieces) + renamed[last:]
            masked_now, _ = masked_sql(renamed)
        if renamed != gold:
            out.append(("aliases_renamed", renamed))
    if inv is not None:
        out += _schema_rewrites(gold, inv)
    return out

def never_null(table: Any, column: str) -> bool:
    c = table.column(column)
    return c is not None and (c.pk or c.not_null or (c.mined and not c.nulls))

def _qualifier(text: str | None) -> str | None:
    """`T1` of a matched `T1.` (None when there is none)."""
    return querytext.unquote((text or "").strip().rstrip(".").strip()) or None


def _schema_rewrites(gold: str, inv: Invariants) -> list[tuple[str, str]]:
    st = querytext.read(gold)
    if st is None or len(st.parts) != 1:
        return []
    part = st.parts[0]
    items = querytext.from_items(st, part, inv)
    masked, depth = masked_sql(gold)
    has_outer_join = re.search(r"(?<!\w)(LEFT|RIGHT|FULL)\s+(OUTER\s+)?JOIN(?!\w)", masked, re.I) is not None
    out: list[tuple[str, str]] = []
    # COUNT(col) -> COUNT(*) where col never holds NULL (no outer join adds NULL rows).
    if not has_outer_join:
        for m in re.finditer(rf"(?<!\w)COUNT\s*\(\s*{COLREF}\s*\)", masked, re.I):
            qual, column = colref(m)
            if column.upper() == "DISTINCT":
                continue
            found = column_of(st, inv, qual, column)
            if found and never_null(found[0], found[1].name) and depth[m.start()] == 0:
                out.append(("count_star_never_null", gold[:m.start()] + "COUNT(*)" + gold[m.end():]))
    # DISTINCT over a single table's never-NULL unique column (or its key).
    if len(items) == 1 and not part.distinct and part.group is None and "JOIN" not in masked.upper():
        t = inv.table(items[0].table)
        select = gold[part.select_list[0]:part.select_list[1]].strip()
        m = re.fullmatch(COLREF, select)
        if m and t is not None:
            c = t.column(colref(m)[1])
            if c is not None and c.unique and never_null(t, c.name):
                out.append(("distinct_over_key", gold[:part.select_list[0]] + "DISTINCT " + gold[part.select_list[0]:]))
    if part.from_clause is None or has_outer_join:
        return out
    from_text = gold[part.from_clause[0]:part.from_clause[1]]
    # A join to a parent along a never-NULL reference, not used anywhere.
    for item in items:
        for ref in inv.references:
            if ref.child != item.table or len(ref.child_columns) != 1:
                continue
            child = inv.table(ref.child)
            if not never_null(child, ref.child_columns[0]):
                continue
            extra = (f" INNER JOIN {quote(ref.parent)} AS t2sql_parent ON {quote(item.alias)}."
                     f"{quote(ref.child_columns[0])} = t2sql_parent.{quote(ref.parent_columns[0])}")
            new_from = from_text.rstrip() + extra + (" " if part.from_clause[1] < len(gold) else "")
            out.append(("fk_join_added", gold[:part.from_clause[0]] + new_from + gold[part.from_clause[1]:]))
            break
        else:
            continue
        break
    # Joins to a parent, used only in their ON (dropped), or in their ON and WHERE conditions of their own
    # (an IN subquery instead).
    for m in re.finditer(rf"\s+(?:INNER\s+)?JOIN\s+{COLREF}\s+(?:AS\s+)?([A-Za-z_]\w*)\s+ON\s+{COLREF}\s*=\s*{COLREF}",
                         from_text, re.I):
        table = inv.table(querytext.unquote(m.group(2)))
        alias = m.group(3)
        if table is None:
            continue
        left = (_qualifier(m.group(4)), querytext.unquote(m.group(5)))
        right = (_qualifier(m.group(6)), querytext.unquote(m.group(7)))
        if left[0] and left[0].lower() == alias.lower():
            left, right = right, left
        if not right[0] or right[0].lower() != alias.lower() or not left[0]:
            continue
        child_item = next((i for i in items if i.alias.lower() == left[0].lower()), None)
        if child_item is None:
            continue
        ref = next((r for r in inv.references if r.child == child_item.table and r.parent == table.name
                    and [c.lower() for c in r.child_columns] == [left[1].lower()]
                    and [c.lower() for c in r.parent_columns] == [right[1].lower()]), None)
        if ref is None or not never_null(inv.table(ref.child), ref.child_columns[0]):
            continue
        rest = gold[:part.from_clause[0]] + from_text[:m.start()] + from_text[m.end():] + gold[part.from_clause[1]:]
        uses = re.findall(rf"(?<![\w.]){re.escape(alias)}\s*\.", masked_sql(rest)[0], re.I)
        if not uses:
            out.append(("fk_join_dropped", rest))
            continue
        # Every use in WHERE conditions that name only this alias: child.fk IN (SELECT key FROM parent WHERE ...)
        conj = where_conjuncts(rest)
        if conj is None:
            continue
        start, end, conditions = conj
        own = [c for c in conditions if re.search(rf"(?<![\w.]){re.escape(alias)}\s*\.", c, re.I)]
        others = [c for c in conditions if c not in own]
        mine_dot = rf"(?<![\w.]){re.escape(alias)}\s*\."
        if not own or any(re.search(r"(?<![\w.])([A-Za-z_]\w*)\s*\.", re.sub(mine_dot, "", c)) for c in own):
            continue
        if len(re.findall(rf"(?<![\w.]){re.escape(alias)}\s*\.", masked_sql(rest[:start] + rest[end:])[0], re.I)):
            continue
        inner = " AND ".join(re.sub(rf"(?<![\w.]){re.escape(alias)}\s*\.\s*", "", c, flags=re.I) for c in own)
        cond = (f"{left[0]}.{quote(left[1])} IN (SELECT {quote(right[1])} FROM {quote(table.name)} WHERE {inner})")
        new_where = " AND ".join(others + [cond])
        out.append(("in_subquery_for_join",
                    rest[:start] + " " + new_where + tail_space(rest, end) + rest[end:].lstrip()))
    return out
