"""What the equivalence check reads from a query's text, without parsing SQL: its SELECTs' clauses, their FROM
tables and aliases, the literals it compares columns with, its outermost ORDER BY ... LIMIT. A best effort over
t2sql.sqltext's tokens: a query it cannot read is still checked, with fewer targeted rows; nothing here decides
a verdict."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from t2sql.equivalence.invariants import Invariants
from t2sql.lru import Lru
from t2sql.sqltext import Token, tokens

COMPOUND = frozenset({"UNION", "INTERSECT", "EXCEPT"})


JOIN_WORDS = frozenset({"JOIN", "INNER", "LEFT", "RIGHT", "FULL", "OUTER", "CROSS", "NATURAL"})

COMPARISON_OPS = ("<=", ">=", "<>", "!=", "==", "=", "<", ">")

@dataclass
class SelectPart:
    """One SELECT of a statement (a compound has several), as spans of the statement's text."""

    start: int  # of the SELECT keyword
    end: int  # end of the part (before a UNION/... or the statement's end)
    select_list: tuple[int, int]
    from_clause: tuple[int, int] | None
    where: tuple[int, int] | None
    group: tuple[int, int] | None
    order: tuple[int, int] | None  # after "ORDER BY"
    limit: tuple[int, int] | None  # after "LIMIT"
    distinct: bool

@dataclass
class Statement:
    sql: str
    toks: list[Token]
    with_prefix: str  # "WITH ... " before the main SELECT, or ""
    parts: list[SelectPart] = field(default_factory=list)

def read(sql: str) -> Statement | None:
    """The statement's SELECT parts at its outer level, or None when it is not a SELECT this reads.
    Remembered per text, at most READ_BYTES of them (a check reads each query several times, and a
    prediction may be long); a Statement is never changed."""
    if not isinstance(sql, str):
        return None
    found = _read.get(sql)
    if found is None:
        found = _read_uncached(sql) or False
        _read.put(sql, found)
    return found or None


# What a remembered statement costs: its text and, per character, its tokens (measured on CPython 3.11:
# about 60 bytes per character of a long query).
READ_BYTES = 64 * 1024 * 1024
_BYTES_PER_CHAR = 64
_read: Lru[Statement | bool] = Lru(4096, READ_BYTES, lambda k, v: 1024 + _BYTES_PER_CHAR * len(k))


def _read_uncached(sql: str) -> Statement | None:
    sql = sql.strip().rstrip(";").strip()
    try:
        toks = tokens(sql)
    except Exception:  # the scanner never fails on text; a non-str is not a query
        return None
    base = 0
    with_prefix = ""
    i = 0
    if toks and toks[0].upper == "WITH":
        # The main SELECT is the first SELECT at depth 0 after the CTEs.
        for j, t in enumerate(toks):
            if j > 0 and t.depth == 0 and t.upper == "SELECT" and toks[j - 1].kind == "close":
                i = j
                break
        else:
            return None
        with_prefix = sql[:toks[i].start]
        base = 0
    if i >= len(toks) or toks[i].upper not in ("SELECT", "VALUES"):
        return None
    st = Statement(sql, toks, with_prefix)
    if toks[i].upper == "VALUES":
        return st
    # Split into parts at depth-0 compound operators.
    starts = [i]
    for j in range(i, len(toks)):
        t = toks[j]
        if t.depth == base and t.upper in COMPOUND:
            k = j + 1
            while k < len(toks) and toks[k].upper in ("ALL", "DISTINCT"):
                k += 1
            if k < len(toks) and toks[k].upper == "SELECT":
                starts.append(k)
    bounds = starts + [len(toks)]
    for a, b in zip(bounds, bounds[1:]):
        end_tok = b
        if b < len(toks):  # back over the compound keyword(s)
            end_tok = b
            while end_tok > a and toks[end_tok - 1].upper in COMPOUND | {"ALL", "DISTINCT"}:
                end_tok -= 1
        st.parts.append(_part(sql, toks, a, end_tok, base))
    return st

def _part(sql: str, toks: list[Token], a: int, b: int, depth: int) -> SelectPart:
    marks: dict[str, int] = {}
    for j in range(a + 1, b):
        t = toks[j]
        if t.depth != depth:
            continue
        u = t.upper
        if u == "FROM" and "FROM" not in marks:
            marks["FROM"] = j
        elif u in ("WHERE", "HAVING", "WINDOW", "LIMIT") and u not in marks:
            marks[u] = j
        elif u in ("GROUP", "ORDER") and j + 1 < b and toks[j + 1].upper == "BY" and u not in marks:
            marks[u] = j
    order = sorted(marks.items(), key=lambda kv: kv[1])
    end_char = toks[b - 1].end if b > a else toks[a].end

    def span(name: str, skip: int = 1) -> tuple[int, int] | None:
        if name not in marks:
            return None
        j = marks[name]
        nxt = next((pos for _, pos in order if pos > j), None)
        start_tok = j + skip
        if start_tok >= b or (nxt is not None and start_tok >= nxt):
            return (toks[j].end, toks[j].end)
        end = toks[nxt].start if nxt is not None else end_char
        return (toks[start_tok].start, end)

    first_clause = min((pos for _, pos in order), default=b)
    k = a + 1
    distinct = False
    while k < first_clause and toks[k].upper in ("DISTINCT", "ALL"):
        distinct = distinct or toks[k].upper == "DISTINCT"
        k += 1
    select_end = toks[first_clause].start if first_clause < b else end_char
    select_list = (toks[k].start if k < first_clause else select_end, select_end)
    return SelectPart(toks[a].start, end_char, select_list, span("FROM"), span("WHERE"), span("GROUP", 2),
                      span("ORDER", 2), span("LIMIT"), distinct)

@dataclass(frozen=True)
class FromItem:
    table: str  # the real table's name as the schema spells it
    alias: str  # how the query names it (the table's own name when it has no alias)

def from_items(st: Statement, part: SelectPart, inv: Invariants) -> list[FromItem]:
    """The schema tables of a FROM list, with their aliases; subqueries, CTEs and views are left out."""
    if part.from_clause is None:
        return []
    a, b = part.from_clause
    toks = [t for t in st.toks if a <= t.start < b]
    if not toks:
        return []
    depth = toks[0].depth
    out = []
    expect_table = True
    j = 0
    while j < len(toks):
        t = toks[j]
        if t.depth != depth:
            j += 1
            continue
        u = t.upper
        if t.text == "," or u == "JOIN":
            expect_table = True
            j += 1
            continue
        if u in JOIN_WORDS or u in ("ON", "USING"):
            expect_table = False if u in ("ON", "USING") else expect_table
            j += 1
            continue
        if expect_table and t.kind in ("word", "quoted"):
            name = unquote(t.text)
            # schema.table is read as its table
            if j + 2 < len(toks) and toks[j + 1].text == "." and toks[j + 2].kind in ("word", "quoted"):
                name = unquote(toks[j + 2].text)
                j += 2
            table = inv.table(name)
            alias = name
            k = j + 1
            if k < len(toks) and toks[k].upper == "AS":
                k += 1
            if (k < len(toks) and toks[k].depth == depth and toks[k].kind in ("word", "quoted")
                    and toks[k].upper not in JOIN_WORDS | {"ON", "USING", "WHERE", "JOIN", "INDEXED", "NOT"}):
                alias = unquote(toks[k].text)
                j = k
            if table is not None:
                out.append(FromItem(table.name, alias))
            expect_table = False
        j += 1
    return out

def unquote(text: str) -> str:
    if len(text) >= 2 and text[0] in "\"`[" and text[-1] in "\"`]":
        return text[1:-1].replace('""', '"')
    return text

@dataclass(frozen=True)
class Comparison:
    """A column compared with literals: `col op lit`, `lit op col`, `col LIKE lit`, `col BETWEEN a AND b`,
    `col IN (a, b)`, or `f(col, ...) op lit` (op "call": the literal is compared with a function of it)."""

    table: str
    column: str
    op: str
    literals: tuple  # Python values: int, float, str

def _literal_at(toks: list[Token], j: int) -> tuple[object, int] | None:
    """(value, tokens used) of a literal starting at token j: 'text', 12, -3, 4.5."""
    if j >= len(toks):
        return None
    t = toks[j]
    sign = 1
    used = 0
    if t.text in ("-", "+") and j + 1 < len(toks):
        sign = -1 if t.text == "-" else 1
        used = 1
        t = toks[j + 1]
    if t.kind == "quoted" and t.text.startswith("'") and not used:
        return t.text[1:-1].replace("''", "'"), 1
    if t.kind == "word" and re.fullmatch(r"[0-9]+", t.text):
        k = j + used + 1
        if k + 1 < len(toks) and toks[k].text == "." and re.fullmatch(r"[0-9]+(e[+-]?[0-9]+)?", toks[k + 1].text, re.I):
            return sign * float(f"{t.text}.{toks[k + 1].text}"), used + 3
        return number(t.text, sign), used + 1
    return None


INT64_DIGITS = 19  # an integer literal of more digits is past SQLite's 64-bit integers


def number(digits: str, sign: int = 1) -> int | float:
    """An integer literal's value as SQLite reads it: an int within 64 bits, else a REAL (a float; inf
    for thousands of digits, where Python's int() would refuse)."""
    if len(digits) <= INT64_DIGITS:
        value = sign * int(digits)
        if -(1 << 63) <= value < (1 << 63):
            return value
    return sign * float(digits)

def _column_before(toks: list[Token], j: int) -> tuple[str | None, str, bool] | None:
    """The column reference that ends at token j-1: (qualifier or None, column, wrapped in a call)."""
    k = j - 1
    if k < 0:
        return None
    t = toks[k]
    if t.kind == "close":  # f(..., col, ...) op lit: the first column inside the call
        depth = t.depth
        m = k - 1
        while m >= 0 and not (toks[m].kind == "open" and toks[m].depth == depth):
            m -= 1
        if m <= 0 or toks[m - 1].kind != "word":
            return None
        for n in range(m + 1, k):
            got = _column_at(toks, n)
            if got is not None:
                return got[0], got[1], True
        return None
    if t.kind not in ("word", "quoted") or (t.kind == "quoted" and t.text.startswith("'")):
        return None
    if re.fullmatch(r"[0-9]+", t.text):
        return None
    if k >= 2 and toks[k - 1].text == "." and toks[k - 2].kind in ("word", "quoted"):
        return unquote(toks[k - 2].text), unquote(t.text), False
    return None, unquote(t.text), False

def _column_at(toks: list[Token], n: int) -> tuple[str | None, str] | None:
    t = toks[n]
    if t.kind not in ("word", "quoted") or t.text.startswith("'") or re.fullmatch(r"[0-9]+", t.text):
        return None
    if n + 2 < len(toks) and toks[n + 1].text == "." and toks[n + 2].kind in ("word", "quoted"):
        return unquote(t.text), unquote(toks[n + 2].text)
    if n >= 1 and toks[n - 1].text == ".":
        return None
    if toks[n + 1].kind == "open" if n + 1 < len(toks) else False:
        return None  # a function's name
    return None, unquote(t.text)

def _op_at(toks: list[Token], j: int) -> tuple[str, int] | None:
    """(operator, tokens used) at token j."""
    t = toks[j]
    u = t.upper
    if u == "NOT" and j + 1 < len(toks) and toks[j + 1].upper in ("LIKE", "GLOB", "BETWEEN", "IN"):
        return "NOT " + toks[j + 1].upper, 2
    if u in ("LIKE", "GLOB", "BETWEEN", "IN", "IS"):
        return u, 1
    if t.kind == "other" and len(t.text) == 1 and t.text in "<>=!":
        if j > 0 and toks[j - 1].kind == "other" and toks[j - 1].end == t.start and toks[j - 1].text in "<>=!":
            return None  # the second character of a two-character operator
        nxt = toks[j + 1] if j + 1 < len(toks) else None
        if nxt is not None and nxt.kind == "other" and nxt.start == t.end and t.text + nxt.text in COMPARISON_OPS:
            return t.text + nxt.text, 2
        if t.text in COMPARISON_OPS:
            return t.text, 1
    return None

def aliases(st: Statement, inv: Invariants) -> tuple[dict[str, str], list[str]]:
    """Every alias (and table name) the statement gives a schema table, subqueries and CTEs included
    (alias -> table), and the tables in the order they appear."""
    toks = st.toks
    out: dict[str, str] = {}
    tables: list[str] = []
    for part in st.parts:
        for item in from_items(st, part, inv):
            out[item.alias.lower()] = item.table
            tables.append(item.table)
    for j, t in enumerate(toks):
        if t.upper in ("FROM", "JOIN") and j + 1 < len(toks):
            name = unquote(toks[j + 1].text)
            table = inv.table(name)
            if table is None:
                continue
            tables.append(table.name)
            out.setdefault(name.lower(), table.name)
            k = j + 2
            if k < len(toks) and toks[k].upper == "AS":
                k += 1
            if k < len(toks) and toks[k].kind in ("word", "quoted") and toks[k].upper not in JOIN_WORDS | {
                    "ON", "WHERE", "GROUP", "ORDER", "LIMIT", "UNION", "EXCEPT", "INTERSECT", "HAVING", "USING"}:
                out.setdefault(unquote(toks[k].text).lower(), table.name)
    return out, list(dict.fromkeys(tables))

def resolve(st: Statement, inv: Invariants, qualifier: str | None, column: str) -> list[tuple[str, str]]:
    """(table, column) pairs a column reference can name: its qualifier's table, or every table of the
    statement with such a column."""
    names, tables = aliases(st, inv)
    if qualifier is not None:
        table = names.get(qualifier.lower())
        t = inv.table(table) if table else inv.table(qualifier)
        c = t.column(column) if t else None
        return [(t.name, c.name)] if c else []
    found = []
    for name in tables:
        t = inv.table(name)
        c = t.column(column) if t else None
        if c:
            found.append((t.name, c.name))
    return found

def comparisons(st: Statement, inv: Invariants) -> list[Comparison]:
    """Every column-with-literal comparison this can read in the statement (subqueries included)."""
    toks = st.toks
    names, tables = aliases(st, inv)

    def resolve_here(qualifier: str | None, column: str) -> list[tuple[str, str]]:
        return resolve(st, inv, qualifier, column)

    out: list[Comparison] = []
    for j in range(len(toks)):
        got = _op_at(toks, j)
        if got is None:
            continue
        op, used = got
        if op == "IS":
            continue
        left = _column_before(toks, j)
        lits: list[object] = []
        k = j + used
        if op.endswith("BETWEEN"):
            first = _literal_at(toks, k)
            if first and k + first[1] < len(toks) and toks[k + first[1]].upper == "AND":
                second = _literal_at(toks, k + first[1] + 1)
                if second:
                    lits = [first[0], second[0]]
        elif op.endswith("IN"):
            if k < len(toks) and toks[k].kind == "open":
                m = k + 1
                while m < len(toks) and toks[m].kind != "close":
                    lit = _literal_at(toks, m)
                    if lit is None:
                        if toks[m].text != ",":
                            lits = []
                            break
                        m += 1
                        continue
                    lits.append(lit[0])
                    m += lit[1]
        else:
            lit = _literal_at(toks, k)
            if lit is not None:
                lits = [lit[0]]
            else:
                # lit op col
                before = _literal_before(toks, j)
                after = _column_at(toks, k) if k < len(toks) else None
                if before is not None and after is not None:
                    for table, column in resolve_here(*after):
                        out.append(Comparison(table, column, _flip(op), (before,)))
                continue
        if not lits or left is None:
            continue
        qualifier, column, wrapped = left
        for table, col in resolve_here(qualifier, column):
            out.append(Comparison(table, col, "call" if wrapped else op, tuple(lits)))
    return list(dict.fromkeys(out))

def _literal_before(toks: list[Token], j: int) -> object | None:
    k = j - 1
    if k < 0:
        return None
    t = toks[k]
    if t.kind == "quoted" and t.text.startswith("'"):
        return t.text[1:-1].replace("''", "'")
    if t.kind == "word" and re.fullmatch(r"[0-9]+", t.text):
        if k >= 2 and toks[k - 1].text == "." and re.fullmatch(r"[0-9]+", toks[k - 2].text):
            return float(f"{toks[k - 2].text}.{t.text}")
        return number(t.text)
    return None

def _flip(op: str) -> str:
    return {"<": ">", ">": "<", "<=": ">=", ">=": "<="}.get(op, op)

def split_top(sql: str, span: tuple[int, int]) -> list[tuple[int, int]]:
    """Spans of the comma-separated items of a clause at its own depth."""
    a, b = span
    toks = [t for t in tokens(sql) if a <= t.start < b]
    if not toks:
        return []
    depth = toks[0].depth
    spans, start = [], a
    for t in toks:
        if t.depth == depth and t.text == ",":
            spans.append((start, t.start))
            start = t.end
    spans.append((start, b))
    return spans

def top_conjuncts(sql: str, span: tuple[int, int]) -> list[tuple[int, int]]:
    """The spans of a WHERE's top-level AND conjuncts (a BETWEEN's AND is not a cut)."""
    a, b = span
    toks = [t for t in tokens(sql) if a <= t.start < b]
    if not toks:
        return []
    depth = toks[0].depth
    cuts, between = [], 0
    for t in toks:
        if t.depth != depth:
            continue
        if t.upper == "BETWEEN":
            between += 1
        elif t.upper == "AND":
            if between:
                between -= 1
            else:
                cuts.append(t)
        elif t.upper == "OR":
            return [(a, b)]  # an OR at the top: one conjunct
    spans, start = [], a
    for c in cuts:
        spans.append((start, c.start))
        start = c.end
    spans.append((start, b))
    return [(x, y) for x, y in spans if sql[x:y].strip()]

