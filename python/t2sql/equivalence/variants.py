"""Values a column could hold beside a query's literal: the literal itself, one above and below, the same
text in another case, inside a longer text, the next and the previous day, a later time of the same
day, the year's first and last days, NULL where the column holds NULLs, other real values. Each is
kept only when the column's own facts allow it (`fits`); the whole small database is checked after."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any

from t2sql.equivalence import realism
from t2sql.equivalence.invariants import Table, storage_class, text_format
from t2sql.equivalence.querytext import Comparison
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.smalldb import letter_cases


@dataclass(frozen=True)
class Variant:
    """A value to try in a column, and why."""

    value: Any
    why: str

def literal_variants(c: Comparison, table: Table, real: RealRows) -> list[Variant]:
    """Values at and beside a comparison's literals that the column could hold."""
    col = table.column(c.column)
    out: list[Variant] = []
    text_col = col is not None and "text" in col.types
    num_col = col is not None and bool(set(col.types) & {"integer", "real"})
    for lit in c.literals:
        if isinstance(lit, (int, float)) and not isinstance(lit, bool):
            if num_col:
                step = 1 if isinstance(lit, int) or float(lit).is_integer() else abs(lit) * 0.01 or 0.01
                for v, why in ((lit, "the literal"), (lit - step, "one below"), (lit + step, "one above")):
                    out.append(Variant(_like_column(v, col), why))
            if text_col:
                out.append(Variant(str(lit), "the literal as text"))
        elif isinstance(lit, str):
            plain = lit.replace("%", "").replace("_", "") if c.op.endswith(("LIKE", "GLOB")) else lit
            if not plain:
                continue
            out.append(Variant(plain, "the literal"))
            for v, why in ((plain.lower(), "lower case"), (plain.upper(), "upper case"),
                           (plain.swapcase(), "another case"), (plain.title(), "title case")):
                if v != plain:
                    out.append(Variant(v, why))
            out += _text_neighbours(plain, col, real, c)
            if num_col and _number(plain) is not None:
                n = _number(plain)
                out += [Variant(n, "the literal as a number"), Variant(n + 1, "one above"), Variant(n - 1, "one below")]
    if col is not None and col.may_be_null:
        out.append(Variant(None, "NULL"))
    for v in real.values(table.name, c.column)[:3]:
        out.append(Variant(v, "another real value"))
    closed = realism.vocabulary(real.inv, c.table, c.column)
    if closed is not None:
        # A closed column holds nothing but its values: those the query does not name are what it meets.
        named = {lit for lit in c.literals if isinstance(lit, str)}
        plain = [lit.replace("%", "").replace("_", "").lower() for lit in named]
        # Those holding a literal in any case first ('West Virginia' beside 'Virginia', 'cl' beside 'c'): what
        # a LIKE or a lower() would mistake for it. Right after the first literal: a long IN list's own
        # literals would crowd them out.
        others = sorted(closed - named, key=lambda v: (not any(p and p in v.lower() for p in plain), v))
        out[1:1] = [Variant(v, "another value of its vocabulary") for v in others[:4]]
    seen, unique = set(), []
    for v in out:
        k = (type(v.value).__name__, v.value)
        if k not in seen and fits(col, v.value, c.column in real.inv.identifiers(c.table), closed):
            seen.add(k)
            unique.append(v)
    return unique

def fits(col: Any, value: Any, identifier: bool = False, vocabulary: frozenset[str] | None = None) -> bool:
    """Whether the column could hold `value` as far as its own facts go (type, format, NULL, an
    identifier's letter case, a closed vocabulary's values); the rest (keys, references, copies) is
    checked on the whole database."""
    if col is None or not col.mined:
        return False
    if value is None:
        return col.may_be_null
    kind = storage_class(value)
    if kind not in col.types:
        return False
    if kind != "text":
        return True
    if vocabulary is not None and value not in vocabulary:
        return False
    return text_format(value) in col.formats and (not identifier or letter_cases(value) <= set(col.cases))

def _number(text: str) -> int | float | None:
    try:
        return int(text)
    except ValueError:
        try:
            f = float(text)
            return f if f == f and abs(f) != float("inf") else None
        except ValueError:
            return None

def _like_column(v: int | float, col: Any) -> int | float:
    if col is not None and "real" not in col.types and isinstance(v, float) and v.is_integer():
        return int(v)
    if col is not None and col.types == ("real",) and isinstance(v, int):
        return float(v)
    return v

def _text_neighbours(lit: str, col: Any, real: RealRows, c: Comparison) -> list[Variant]:
    out: list[Variant] = []
    fmt = text_format(lit)
    formats = set(col.formats) if col is not None else set()
    if fmt in ("date", "datetime", "datetime_t"):
        day = lit[:10]
        try:
            d = date.fromisoformat(day)
        except ValueError:
            d = None
        if d is not None:
            for other, why in ((d + timedelta(days=1), "the next day"), (d - timedelta(days=1), "the day before")):
                out.append(Variant(other.isoformat() + lit[10:], why))
            if "datetime" in formats:
                out += [Variant(f"{day} 00:00:00", "the start of the same day"),
                        Variant(f"{day} 13:30:00", "later on the same day"),
                        Variant(f"{day} 23:59:59", "the end of the same day")]
            if "datetime_t" in formats:
                out.append(Variant(f"{day}T13:30:00", "later on the same day"))
            if "date" in formats and fmt != "date":
                out.append(Variant(day, "the day alone"))
    elif fmt == "digits" and len(lit) == 4 and formats & {"date", "datetime", "datetime_t"}:
        # a year compared with a function of a date column: the year's first and last days
        year = int(lit)
        for y, why in ((year, "in the year"), (year + 1, "the year after"), (year - 1, "the year before")):
            if "date" in formats:
                out += [Variant(f"{y:04d}-01-01", why), Variant(f"{y:04d}-12-31", why)]
            if "datetime" in formats:
                out += [Variant(f"{y:04d}-12-31 13:30:00", why), Variant(f"{y:04d}-01-01 00:00:00", why)]
            if "datetime_t" in formats:
                out += [Variant(f"{y:04d}-12-31T13:30:00", why), Variant(f"{y:04d}-01-01T00:00:00", why)]
    else:
        others = [v for v in real.values(c.table, c.column) if isinstance(v, str) and v != lit]
        if c.column in real.inv.identifiers(c.table) and len({len(v) for v in others} | {len(lit)}) == 1:
            return out  # identifiers of one width (TR000 ... TR342) keep it: no longer one holds the literal
        word = next((w for v in others for w in v.split() if w.isalpha() and w.lower() != lit.lower()), "X")
        out += [Variant(f"{lit} {word}", "inside a longer text"), Variant(f"{word} {lit}", "inside a longer text")]
    return out
