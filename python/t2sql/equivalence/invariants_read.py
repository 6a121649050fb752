"""Reading a cached invariants entry (Invariants.to_dict) back, every field checked: a cache file is
data, never trusted."""

from __future__ import annotations

from typing import Any

from t2sql.equivalence.invariants import (
    INVARIANTS_VERSION,
    Column,
    Copy,
    Invariants,
    PathCopy,
    Prefix,
    Reference,
    Relation,
    Symmetry,
    Table,
    UniqueSet,
    Vocabulary,
)


def read_invariants(data: Any) -> Invariants:
    """Invariants written by Invariants.to_dict; ValueError for anything else (another version, a missing
    field, a value of another type): such an entry is never trusted."""
    if not isinstance(data, dict) or data.get("version") != INVARIANTS_VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        raise ValueError(f"invariants of version {version!r}, this t2sql reads {INVARIANTS_VERSION}")
    try:
        return _from_dict(data)
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"malformed invariants: {type(e).__name__}: {e}") from None



def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected text, got {type(v).__name__}")
    return v


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"expected true or false, got {type(v).__name__}")
    return v


def _count(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise TypeError(f"expected a count, got {v!r:.40}")
    return v


def _texts(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise TypeError(f"expected a list, got {type(v).__name__}")
    return tuple(_text(x) for x in v)


def _items(v: Any) -> list[dict[str, Any]]:
    if not isinstance(v, list) or not all(isinstance(x, dict) for x in v):
        raise TypeError("expected a list of objects")
    return v


def _reference(d: Any) -> Reference | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise TypeError("expected a reference")
    return Reference(_text(d["child"]), _texts(d["child_columns"]), _text(d["parent"]), _texts(d["parent_columns"]),
                     _flag(d["declared"]), _flag(d["total"]))


def _column(c: dict[str, Any]) -> Column:
    return Column(_text(c["name"]), _text(c["decl_type"]), _flag(c["pk"]), _flag(c["not_null"]), _flag(c["nulls"]),
                  _flag(c["unique"]), _texts(c["types"]), _texts(c["formats"]), _flag(c["mined"]),
                  _texts(c["cases"]))


def _table(t: dict[str, Any]) -> Table:
    columns = tuple(_column(c) for c in _items(t["columns"]))
    integer_key = t["integer_key"]
    if not isinstance(t["keys"], list):
        raise TypeError("expected a list of keys")
    table = Table(_text(t["name"]), columns, _count(t["rows"]), _flag(t["rowid"]),
                  None if integer_key is None else _text(integer_key), tuple(_texts(k) for k in t["keys"]))
    for key in table.keys:  # every key names columns of its table
        if not key or any(table.position(c) is None for c in key):
            raise TypeError(f"a key of {table.name} names a column it lacks")
    return table


def _from_dict(data: dict[str, Any]) -> Invariants:
    tables = tuple(_table(t) for t in _items(data["tables"]))
    by_name = {t.name.lower(): t for t in tables}
    references = tuple(_reference(r) for r in _items(data["references"]))
    for r in references:  # every reference joins columns its tables have
        child, parent = by_name.get(r.child.lower()), by_name.get(r.parent.lower())
        if (child is None or parent is None or len(r.child_columns) != len(r.parent_columns)
                or any(child.position(c) is None for c in r.child_columns)
                or any(parent.position(c) is None for c in r.parent_columns)):
            raise TypeError(f"reference {r.name} names a table or column the invariants lack")
    copies = tuple(Copy(_text(c["table"]), _text(c["column"]), _text(c["source"]), _text(c["source_column"]),
                        _reference(c["via"])) for c in _items(data["copies"]))
    relations = tuple(Relation(_text(r["table"]), _text(r["total"]), _text(r["left"]), _text(r["right"]))
                      for r in _items(data["relations"]))
    for table, cols in ([(c.table, (c.column,)) for c in copies] + [(c.source, (c.source_column,)) for c in copies]
                        + [(r.table, (r.total, r.left, r.right)) for r in relations]):
        t = by_name.get(table.lower())
        if t is None or any(t.position(c) is None for c in cols):
            raise TypeError(f"an invariant names {table}.{cols} the invariants lack")
    symmetries = tuple(Symmetry(_text(x["table"]), _text(x["left"]), _text(x["right"]), _flag(x["keyed"]))
                       for x in _items(data["symmetries"]))
    unique_sets = tuple(UniqueSet(_text(x["table"]), _texts(x["columns"])) for x in _items(data["unique_sets"]))
    vocabularies = tuple(Vocabulary(_text(x["table"]), _text(x["column"]), _texts(x["values"]))
                         for x in _items(data["vocabularies"]))
    path_copies = tuple(PathCopy(_reference(x["first"]), _text(x["first_column"]), _reference(x["second"]),
                                 _text(x["second_column"])) for x in _items(data["path_copies"]))
    prefixes = tuple(Prefix(_text(x["table"]), _text(x["column"]), _text(x["source_column"]))
                     for x in _items(data["prefixes"]))
    if any(pc.first is None or pc.second is None or pc.first not in references or pc.second not in references
           for pc in path_copies):
        raise TypeError("a path copy names a reference the invariants lack")
    for table, cols in ([(x.table, (x.left, x.right)) for x in symmetries]
                        + [(x.first.parent, (x.first_column,)) for x in path_copies]
                        + [(x.second.parent, (x.second_column,)) for x in path_copies]
                        + [(x.table, (x.column, x.source_column)) for x in prefixes]
                        + [(x.table, x.columns) for x in unique_sets]
                        + [(x.table, (x.column,)) for x in vocabularies]):
        t = by_name.get(table.lower())
        if t is None or not cols or any(t.position(c) is None for c in cols):
            raise TypeError(f"an invariant names {table}.{cols} the invariants lack")
    left_out = data.get("left_out", [])
    if not isinstance(left_out, list):
        raise TypeError("expected a list of left-out parts")
    mine_s = data.get("mine_s", 0.0)
    if isinstance(mine_s, bool) or not isinstance(mine_s, (int, float)):
        raise TypeError("expected seconds")
    return Invariants(
        path=_text(data["path"]), schema=_texts(data["schema"]), tables=tables, references=references,
        copies=copies, relations=relations, unsupported=_text(data["unsupported"]),
        mine_s=float(mine_s), left_out=tuple(_left_out(x) for x in left_out),
        symmetries=symmetries, unique_sets=unique_sets, vocabularies=vocabularies, path_copies=path_copies,
        prefixes=prefixes,
    )


def _left_out(v: Any) -> tuple[str, str, str]:
    got = _texts(v)
    if len(got) != 3 or got[0] not in ("table", "reference"):
        raise TypeError("expected a (kind, name, why) triple")
    return got[0], got[1], got[2]
