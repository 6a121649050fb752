"""Where a query's result is cut: its outermost ORDER BY ... LIMIT, read from its text. A LIMIT that keeps
one of several rows tied on the ORDER BY keys makes the result a choice, not a fact: the equivalence
check reads the keys of the rows at the cut (`Cut.keys_sql`) to see whether they tie."""

from __future__ import annotations

import re
from dataclasses import dataclass

from t2sql.equivalence.querytext import Statement, split_top, unquote


@dataclass(frozen=True)
class Cut:
    """The outermost ORDER BY ... LIMIT of a statement: `keys_sql` selects the ORDER BY keys of the
    rows the LIMIT keeps and of the next one (so a tie at the cut shows as two equal key rows)."""

    keys_sql: str
    count: int  # the LIMIT
    offset: int
    ordered_sql: str  # every row's keys, in the statement's order (ties anywhere show as repeats)

# LIMIT n, LIMIT n OFFSET m, LIMIT m, n: numbers of up to 18 digits (a longer one is read as no LIMIT
# this understands, never given to int()).
LIMIT_RE = r"(\d{1,18})(?:\s*(?:OFFSET\s+(\d{1,18})|,\s*(\d{1,18})))?"


def cut(st: Statement | None) -> Cut | None | bool:
    """The statement's outermost ORDER BY ... LIMIT as a Cut; None when it has no LIMIT at its outer
    level; False when it has one this cannot read (then ties cannot be ruled out)."""
    if st is None or not st.parts:
        return None
    part = st.parts[-1]
    sql = st.sql
    if part.limit is None:
        return None
    limit_text = sql[part.limit[0]:part.limit[1]].strip()
    m = re.fullmatch(LIMIT_RE, limit_text, re.I)
    if not m or part.order is None or len(st.parts) > 1 or part.distinct:
        return False
    if m.group(3) is not None:  # LIMIT offset, count
        offset, count = int(m.group(1)), int(m.group(3))
    else:
        count, offset = int(m.group(1)), int(m.group(2) or 0)
    select_items = [sql[x:y].strip() for x, y in split_top(sql, part.select_list)]
    exprs, aliases = [], {}
    for item in select_items:
        am = re.fullmatch(r"(.*?)\s+(?:AS\s+)?([A-Za-z_][A-Za-z0-9_]*|\"[^\"]+\"|`[^`]+`)", item, re.S | re.I)
        if am and am.group(1).strip() and not re.search(r"[\s.(]$", am.group(1)):
            aliases[unquote(am.group(2)).lower()] = am.group(1).strip()
            exprs.append(am.group(1).strip())
        else:
            exprs.append(item)
    keys = []
    for x, y in split_top(sql, part.order):
        term = re.sub(r"\s+(ASC|DESC)\s*$|\s+NULLS\s+(FIRST|LAST)\s*$", "", sql[x:y].strip(), flags=re.I)
        term = re.sub(r"\s+(ASC|DESC)\s*$", "", term, flags=re.I).strip()
        if re.fullmatch(r"\d+", term):
            pos = int(term) if len(term) <= 18 else 0
            if not 1 <= pos <= len(exprs):
                return False
            term = exprs[pos - 1]
        elif unquote(term).lower() in aliases:
            term = aliases[unquote(term).lower()]
        if term == "*" or not term:
            return False
        keys.append(term)
    if not keys:
        return False
    named = ", ".join(f"({k}) AS t2sql_key{i}" for i, k in enumerate(keys))
    order_text = ", ".join(
        _with_direction(sql[x:y], keys[i]) for i, (x, y) in enumerate(split_top(sql, part.order)))
    body = sql[part.select_list[1]:part.order[0]]  # FROM ... up to ORDER BY (GROUP BY, HAVING kept)
    body = re.sub(r"ORDER\s+BY\s*$", "", body.rstrip(), flags=re.I)
    base = f"{st.with_prefix}SELECT {named} {body} ORDER BY {order_text}"
    return Cut(f"{base} LIMIT 2 OFFSET {offset + count - 1}" if count > 0 else f"{base} LIMIT 0",
               count, offset, base)

def outer_limit(st: Statement | None) -> int | None:
    """The number of rows the statement's outermost LIMIT keeps (LIMIT n, LIMIT n OFFSET m, LIMIT m, n),
    or None (also for a statement this cannot read)."""
    if st is None or not st.parts or st.parts[-1].limit is None:
        return None
    text = st.sql[st.parts[-1].limit[0]:st.parts[-1].limit[1]].strip()
    m = re.fullmatch(LIMIT_RE, text, re.I)
    if not m:
        return None
    return int(m.group(3)) if m.group(3) is not None else int(m.group(1))

def _with_direction(term: str, key: str) -> str:
    m = re.search(r"\s+(ASC|DESC)(\s+NULLS\s+(FIRST|LAST))?\s*$", term, re.I)
    return f"({key})" + (m.group(0) if m else "")
