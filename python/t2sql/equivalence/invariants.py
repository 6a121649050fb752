"""What every real database of a kind keeps: its declared constraints and the invariants mined from its data, which
every small database must keep too, and what was left out of the schema (`left_out`). The list, and why a database
with an invariant mining could not verify is skipped: docs/recipe_extras.md, "Equivalence check";
`t2sql equivalence --invariants --db FILE` lists a database's."""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from typing import Any

from t2sql.equivalence.checkbounds import approx_bytes
from t2sql.lru import Lru

# 5: the realism rules; 6: no `assumed` (an unverified invariant makes the database unsupported); 7: letter
# cases read as smalldb.letter_cases reads them (past a NUL byte too), mining's passes shared; 8: a partial
# unique index is no key
INVARIANTS_VERSION = 8

MEMO_BYTES = 16 * 1024 * 1024  # what one database's memo holds (Invariants.memo), about

TEXT_CACHED = 256  # texts up to this many characters have their shape and letter cases remembered

# Text shapes, tried in order; a value takes the first that fits. The SQL condition (on the column
# `{q}`) and Python's regex say the same thing (ASCII digits only), so mined formats and checked
# values always agree.
FORMATS: tuple[tuple[str, str, str], ...] = (
    ("empty", "{q} = ''", r"\A\Z"),
    ("datetime", "{q} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]*'",
     r"\A[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}"),
    ("datetime_t", "{q} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]*'",
     r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}"),
    ("date", "{q} GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]'", r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}\Z"),
    ("time", "{q} GLOB '[0-9][0-9]:[0-9][0-9]*'", r"\A[0-9]{2}:[0-9]{2}"),
    ("digits", "{q} NOT GLOB '*[^0-9]*'", r"\A[0-9]+\Z"),
)

# Every shape but "empty" starts with an ASCII digit: a text this condition does not hold for is OTHER_TEXT
# at once (mining tries the shapes only on the others).
# A first byte of 0-9 by comparison (under BINARY), not a call of GLOB per value: 12M values in 0.4 s less.
FORMAT_LEAD = "{q} = '' OR ({q} >= '0' COLLATE BINARY AND {q} < ':' COLLATE BINARY)"

_FORMAT_RE = [(name, re.compile(pattern, re.S)) for name, _, pattern in FORMATS]

OTHER_TEXT = "text"

def text_format(value: str) -> str:
    """The shape of a TEXT value: one of FORMATS' names, else "text" (remembered for short texts only:
    a real cell may hold megabytes)."""
    return _text_format_short(value) if len(value) <= TEXT_CACHED else _text_format(value)


def _text_format(value: str) -> str:
    for name, pattern in _FORMAT_RE:
        if pattern.search(value):
            return name
    return OTHER_TEXT


_text_format_short = functools.lru_cache(maxsize=65536)(_text_format)

def storage_class(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool) or isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "real"
    if isinstance(value, str):
        return "text"
    return "blob"

def sqlite_key(key: tuple) -> tuple:
    """A key as SQLite compares it: 1 and 1.0 are one value (an integral float becomes the int)."""
    for v in key:
        if type(v) is float:
            return tuple(int(x) if type(x) is float and x.is_integer() else x for x in key)
    return key


@dataclass(frozen=True)
class Column:
    name: str
    decl_type: str
    pk: bool  # part of the primary key
    not_null: bool  # declared NOT NULL
    nulls: bool  # the data holds a NULL here (False: never NULL)
    unique: bool  # no repeated non-NULL value (declared or observed)
    types: tuple[str, ...]  # storage classes seen ("integer", "real", "text", "blob")
    formats: tuple[str, ...]  # shapes of its TEXT values (FORMATS' names, "text")
    mined: bool = True  # False: its scan did not finish in time; its values are never changed
    # Letter cases its TEXT values use ("lower", "upper"): an identifier keeps them (a key of upper-case
    # codes stays upper-case); other text may come in any case.
    cases: tuple[str, ...] = ("lower", "upper")

    @property
    def may_be_null(self) -> bool:
        return self.nulls and not self.not_null and not self.pk

@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[Column, ...]
    rows: int
    rowid: bool  # an ordinary rowid table (False: WITHOUT ROWID)
    integer_key: str | None  # the INTEGER PRIMARY KEY column (the rowid's alias), if any
    # The primary key and every UNIQUE column set, declared; for a table without any, all its columns when
    # its rows never repeat (mined).
    keys: tuple[tuple[str, ...], ...]

    @functools.cached_property
    def _positions(self) -> dict[str, int]:
        return {c.name.lower(): i for i, c in enumerate(self.columns)}

    def position(self, name: str) -> int | None:
        """The column's index in a row, or None."""
        return self._positions.get(name.lower())

    def column(self, name: str) -> Column | None:
        i = self._positions.get(name.lower())
        return None if i is None else self.columns[i]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

@dataclass(frozen=True)
class Reference:
    """Child rows name a parent row: child.child_columns = parent.parent_columns (a key there)."""

    child: str
    child_columns: tuple[str, ...]
    parent: str
    parent_columns: tuple[str, ...]
    declared: bool
    total: bool  # every parent row has at least one child row

    @property
    def name(self) -> str:
        return (f"{self.child}({', '.join(self.child_columns)}) -> "
                f"{self.parent}({', '.join(self.parent_columns)})")

@dataclass(frozen=True)
class Copy:
    """table.column always equals source.source_column: in the same row (via None) or in the parent row
    the reference `via` names."""

    table: str
    column: str
    source: str
    source_column: str
    via: Reference | None

@dataclass(frozen=True)
class Relation:
    """table.total = table.left + table.right in every row where all three hold a number."""

    table: str
    total: str
    left: str
    right: str

@dataclass(frozen=True)
class Symmetry:
    """table holds every row both ways: for each row (left = a, right = b, the rest) a row (left = b,
    right = a, the same rest) exists (a relation stored in both directions). t2sql.equivalence.realism."""

    table: str
    left: str
    right: str
    # The rest names one pair: rows that agree on every other column hold the same two values (a bond's
    # id names its two atoms, one row each way).
    keyed: bool = False


@dataclass(frozen=True)
class UniqueSet:
    """table's `columns` never repeat together (in rows where none is NULL), though none of them is
    unique alone and the data would show repeats by chance. t2sql.equivalence.realism."""

    table: str
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Vocabulary:
    """table.column's TEXT values are a closed set, letter case included: `values`, nothing else.
    t2sql.equivalence.realism."""

    table: str
    column: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class PathCopy:
    """In every row of `first.child` (= `second.child`), the row `first` names holds in `first_column`
    what the row `second` names holds in `second_column` (an atom's molecule is its bond's molecule,
    through the row that joins them). t2sql.equivalence.realism."""

    first: Reference
    first_column: str
    second: Reference
    second_column: str


@dataclass(frozen=True)
class Prefix:
    """table.column's text always starts with table.source_column's (an atom id 'TR009_12' starts with
    its molecule's id 'TR009'). t2sql.equivalence.realism."""

    table: str
    column: str
    source_column: str


@dataclass(frozen=True)
class Invariants:
    path: str
    schema: tuple[str, ...]  # CREATE TABLE / INDEX / VIEW statements, in creation order
    tables: tuple[Table, ...]
    references: tuple[Reference, ...]
    copies: tuple[Copy, ...]
    relations: tuple[Relation, ...]
    unsupported: str  # why no small database can be built from this schema ("" when one can)
    mine_s: float = 0.0
    # (kind, name, why), kind "table" or "reference": parts of the schema kept out of every small database
    left_out: tuple[tuple[str, str, str], ...] = ()
    # Realism rules mined from the data (t2sql.equivalence.realism says why each holds and how it is kept).
    symmetries: tuple[Symmetry, ...] = ()
    unique_sets: tuple[UniqueSet, ...] = ()
    vocabularies: tuple[Vocabulary, ...] = ()
    path_copies: tuple[PathCopy, ...] = ()
    prefixes: tuple[Prefix, ...] = ()

    @functools.cached_property
    def memo(self) -> Lru[Any]:
        """What users of these invariants remember about rows of this database (t2sql.equivalence.smalldb
        keeps its tables' checks here), at most MEMO_BYTES of it; it lives and dies with the invariants."""
        return Lru(1 << 20, MEMO_BYTES, _memo_bytes)

    @functools.cached_property
    def left_out_tables(self) -> frozenset[str]:
        """Lower-case names of the tables no small database holds."""
        return frozenset(name.lower() for kind, name, _ in self.left_out if kind == "table")

    @functools.cached_property
    def _by_name(self) -> dict[str, Table]:
        return {t.name.lower(): t for t in self.tables}

    def table(self, name: str) -> Table | None:
        return self._by_name.get(name.lower())

    def frozen(self, table: str) -> frozenset[str]:
        t = self.table(table)
        return self._frozen.get(t.name, frozenset()) if t else frozenset()

    @functools.cached_property
    def _frozen(self) -> dict[str, frozenset[str]]:
        return {t.name: self._frozen_of(t.name) for t in self.tables}

    def _frozen_of(self, table: str) -> frozenset[str]:
        """Columns of `table` whose value may not change on its own: the primary key (a row's identity),
        either side of a reference (a reference must name a row), either side of a copy, and columns
        whose values were not mined. (A unique column may change when it stays unique, a column of a sum
        when the sum is mended: `SmallDb.problems` checks both.)"""
        t = self.table(table)
        if t is None:
            return frozenset()
        out = {c.name for c in t.columns if c.pk or not c.mined} | self._referencing(t.name)
        for cp in self.copies:
            if cp.table == t.name:
                out.add(cp.column)
            if cp.source == t.name:
                out.add(cp.source_column)
        return frozenset(out)

    def reference_columns(self, table: str) -> frozenset[str]:
        """Columns of `table` on the child side of a reference."""
        return frozenset(c for r in self.references if r.child.lower() == table.lower() for c in r.child_columns)

    def identifiers(self, table: str) -> frozenset[str]:
        t = self.table(table)
        return self._identifiers.get(t.name, frozenset()) if t else frozenset()

    @functools.cached_property
    def _identifiers(self) -> dict[str, frozenset[str]]:
        return {t.name: self._identifiers_of(t.name) for t in self.tables}

    def _identifiers_of(self, table: str) -> frozenset[str]:
        """Columns of `table` that name things (keys, unique columns, either side of a reference): their
        text keeps its letter case."""
        t = self.table(table)
        if t is None:
            return frozenset()
        out = {c.name for c in t.columns if c.pk or c.unique} | self._referencing(t.name)
        for key in t.keys:
            out.update(key)
        return frozenset(out)

    def _referencing(self, table: str) -> set[str]:
        """Columns of `table` on either side of a reference."""
        out: set[str] = set()
        for r in self.references:
            if r.child == table:
                out.update(r.child_columns)
            if r.parent == table:
                out.update(r.parent_columns)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"version": INVARIANTS_VERSION, **asdict(self)}

    def describe(self) -> list[str]:
        """One line per invariant, for `t2sql equivalence --invariants`."""
        lines = [f"database {self.path}: {len(self.tables)} tables (mined in {self.mine_s:.2f}s)"]
        if self.unsupported:
            lines.append(f"  unsupported: {self.unsupported}")
        for t in self.tables:
            keys = "; ".join("(" + ", ".join(k) + ")" for k in t.keys) or "none declared"
            lines.append(f"table {t.name}: {t.rows} rows, keys {keys}")
            for c in t.columns:
                facts = []
                if c.not_null or c.pk:
                    facts.append("NOT NULL (declared)")
                elif not c.nulls:
                    facts.append("never NULL")
                if c.unique:
                    facts.append("no repeats")
                facts.append("types " + "/".join(c.types or ("none",)))
                if c.formats:
                    facts.append("formats " + "/".join(c.formats))
                if c.name in self.identifiers(t.name) and "text" in c.types:
                    facts.append("letters " + ("/".join(c.cases) or "none") + " (an identifier keeps its case)")
                lines.append(f"  {c.name}: " + ", ".join(facts))
        for r in self.references:
            kind = "declared" if r.declared else "mined"
            total = "; every parent row has a child" if r.total else ""
            lines.append(f"reference ({kind}): {r.name}{total}")
        for cp in self.copies:
            where = f"via {cp.via.name}" if cp.via else "same row"
            lines.append(f"copy: {cp.table}.{cp.column} = {cp.source}.{cp.source_column} ({where})")
        for rel in self.relations:
            lines.append(f"relation: {rel.table}.{rel.total} = {rel.left} + {rel.right}")
        for sym in self.symmetries:
            keyed = "; the other columns name one pair" if sym.keyed else ""
            lines.append(f"symmetric: {sym.table}({sym.left}, {sym.right}) holds every row both ways{keyed}")
        for us in self.unique_sets:
            lines.append(f"unique together (mined): {us.table}({', '.join(us.columns)})")
        for v in self.vocabularies:
            shown = ", ".join(repr(x) for x in v.values[:8]) + (", ..." if len(v.values) > 8 else "")
            lines.append(f"closed vocabulary: {v.table}.{v.column} in {{{shown}}} ({len(v.values)} values, "
                         "letter case kept)")
        for pc in self.path_copies:
            lines.append(f"path copy: {pc.first.parent}.{pc.first_column} via {pc.first.name} = "
                         f"{pc.second.parent}.{pc.second_column} via {pc.second.name}")
        for px in self.prefixes:
            lines.append(f"prefix: {px.table}.{px.column} starts with {px.source_column}")
        for kind, name, why in self.left_out:
            lines.append(f"left out of the small databases: {kind} {name} ({why})")
        return lines

def _memo_bytes(key: tuple, value: Any) -> int:
    """A memo entry's bytes: its own tuples, each row a tuple of slots, and every long text or blob a row
    holds (a variant's text beside a long literal may be new; short cells are the real rows' own values,
    which RealRows keeps and bounds, or small). A TableRows part is counted once, when first asked."""
    total = 256
    for part in (*key, *(value.values() if type(value) is dict else ())):
        kind = type(part)
        if kind is TableRows:
            total += part.memo_bytes
        elif kind is tuple:
            total += _rows_bytes(part)
    return total + (approx_bytes(value) if type(value) is list else 0)


def _rows_bytes(rows: tuple) -> int:
    total = 56 + 8 * len(rows)
    for r in rows:
        if type(r) is tuple:
            total += 56 + 8 * len(r)
            for v in r:
                if type(v) in _LONG_CELLS and len(v) > 64:
                    total += len(v)
    return total


class TableRows(tuple):
    """A table's rows as a part of memo keys (SmallDb.problems): one check puts the same table in many
    keys (its own checks, every reference, copy and realism rule it takes part in) and looks each key up
    before keeping it, so the rows are hashed and counted once, not once per key. Equal to, and hashed
    as, the plain tuple of the same rows."""

    _OWN_BYTES = 256  # the instance's dict holding the two remembered numbers

    def __hash__(self) -> int:
        try:
            return self._hash
        except AttributeError:
            self._hash: int = tuple.__hash__(self)
            return self._hash

    @property
    def memo_bytes(self) -> int:
        try:
            return self._bytes
        except AttributeError:
            self._bytes: int = _rows_bytes(self) + self._OWN_BYTES
            return self._bytes


_LONG_CELLS = (str, bytes)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
