"""Finding a database's invariants (t2sql.equivalence.invariants) in its file: SQL of our own through the core's guard
(`Database.catalog`, `Database.rows`), run to its end, bounded by what it reads and never by the clock; an
invariant it cannot verify makes the database `unsupported`. Done ahead (t2sql.equivalence.mine_ahead), never in a
check; docs/episode.md, "The equivalence check" (Mining ahead)."""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

import t2sql
from t2sql.equivalence import realism_mining
from t2sql.equivalence.declared import Shape, declared_references, listing, statements, table_shape
from t2sql.equivalence.invariants import (
    Column,
    Copy,
    Invariants,
    Reference,
    Relation,
    Table,
    quote,
)
from t2sql.equivalence.mining_columns import column_sql, column_stats, tallied_stats, tally_sql
from t2sql.equivalence.mining_reader import MINE_TEMP_MB, MINE_WORKERS, TALLY, Reader, Unverified
from t2sql.equivalence.refuting import lead, unrefuted

log = logging.getLogger("t2sql.equivalence.mining")

MAX_RELATION_COLUMNS = 10  # numeric columns per table tried for a + b = c (10 columns: 360 triples)

MAX_COPY_PAIRS = 400  # column pairs per reference tried for a copy

@dataclass
class _Miner:
    reader: Reader
    left_out: list[tuple[str, str, str]] = field(default_factory=list)
    # table -> column -> (distinct non-NULL values, non-NULL values, pairs of rows sharing a value), BINARY
    stats: dict[str, dict[str, tuple[int, int, int]]] = field(default_factory=dict)
    # (child, column) -> declared parent keys; (child, column, parent, key) -> the child's distinct values
    # the parent holds
    hints: dict[tuple[str, str], list[tuple[str, str]]] = field(default_factory=dict)
    found: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    # (table, a, b) -> realism_mining.mirrors' answer, where mining ran it
    mirrored: dict[tuple[str, str, str], Any] = field(default_factory=dict)
    collated: frozenset[str] = frozenset()  # tables whose CREATE statement names a collation

    def try_rows(self, what: str, sql: str, params: tuple = ()) -> list[tuple]:
        """The rows; Unverified naming `what` when the statement failed (never None: an invariant is
        verified or the database is unsupported)."""
        try:
            return self.reader.rows(sql, params)
        except Unverified as e:
            raise Unverified(f"{what}: {e}") from None


def _declared_parents(m: _Miner, shapes: dict[str, Shape]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(table, column) -> the (table, column) keys its single-column declared references name, as the
    catalog says before any data is read (t2sql.equivalence.declared decides later which references hold)."""
    names = {n.lower(): n for n in shapes}
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for name in shapes:
        groups: dict[Any, list[tuple]] = {}
        for row in m.reader.catalog("foreign_key_list", name) or []:
            groups.setdefault(row[0], []).append(row)
        for rows in groups.values():
            parent = names.get(str(rows[0][2]).lower())
            if len(rows) != 1 or parent is None:
                continue
            child_col = _named_column(shapes[name], rows[0][3])
            to = rows[0][4]
            pk = [r[0] for r in shapes[parent].info if r[3]]
            parent_col = _named_column(shapes[parent], to) if to is not None else (pk[0] if len(pk) == 1 else None)
            if child_col and parent_col:
                out.setdefault((name, child_col), []).append((parent, parent_col))
    m.hints = out
    return out


def _named_column(shape: Shape, name: Any) -> str | None:
    low = str(name).lower()
    return next((r[0] for r in shape.info if r[0].lower() == low), None)


def _twin_candidates(shapes: dict[str, Shape], hints: dict[tuple[str, str], list[tuple[str, str]]],
                     collated: frozenset[str]) -> list[tuple[str, str, str]]:
    """(table, a, b): two columns declared to reference the same parent keys, in a table no two rows of
    which share (a, b) (a key among them), and no collation."""
    out = []
    for name, shape in shapes.items():
        if name in collated:
            continue
        cols = [r[0] for r in shape.info]
        for i, a in enumerate(cols):
            for b in cols[i + 1:]:
                if (hints.get((name, a)) and hints.get((name, a)) == hints.get((name, b))
                        and any({k.lower() for k in key} <= {a.lower(), b.lower()} for key in shape.keys)):
                    out.append((name, a, b))
    return out


def _mine_tables(m: _Miner, shapes: dict[str, Shape], collated: frozenset[str]) -> dict[str, Table]:
    """Every table's row count, columns and (for one without a key) whether its rows repeat: one statement
    each, run side by side (Reader.many)."""
    hints = _declared_parents(m, shapes)
    # A table stored both ways (realism's symmetries) holds in its second column the values of its first:
    # the mirror check runs first, beside the other columns, and the second column's statement only when
    # the check fails.
    decl = {(name, r[0]): (r[1] or "").upper() for name, shape in shapes.items() for r in shape.info}
    twins: dict[tuple[str, str], str] = {}
    whole: dict[tuple[str, str], str] = {}  # (table, b) -> the mirror check over every row
    for name, a, b in _twin_candidates(shapes, hints, collated):
        if (name, b) not in twins and (name, a) not in twins:  # a's own statement runs: b may copy it
            m.mirrored[(name, a, b)] = None  # a leading row lacks its mirror, until the check says otherwise
            whole[(name, b)], leading = realism_mining.mirror_sql(
                name, [r[0] for r in shapes[name].info], a, b, halved=decl[(name, a)] == decl[(name, b)])
            refuted = m.try_rows(f"mirrors of {name}", leading)
            if not refuted[0][0]:
                twins[(name, b)] = a
    twin_keys = list(twins.items())
    # A table stored both ways sorts half its rows for its other columns (column_sql's `mirrored`), side by
    # side with the mirror check that proves it: the answers are used once it has, else asked again whole.
    halves = {name: (a, b) for (name, b), a in reversed(twin_keys)}
    # The mirror checks first: each a lookup per row of a large table, they end last if they start last.
    asked = [(f"mirrors of {name}", whole[(name, b)]) for (name, b), a in twin_keys]
    owners = [name for (name, _), _ in twin_keys]  # each statement's table
    tallied: set[tuple[str, str]] = set()
    for name, shape in shapes.items():
        t = quote(name)
        asked.append((f"row count of {name}", f"SELECT count(*) FROM {t}"))
        for c, *_ in shape.info:
            if (name, c) in twins:
                continue
            unique, mirrored = (c,) in shape.keys, None if c in halves.get(name, (c,)) else halves[name]
            if unique or mirrored or hints.get((name, c)):
                asked.append((f"values of {name}.{c}", column_sql(name, c, hints.get((name, c), []), unique=unique,
                                                                  mirrored=mirrored)))
            else:  # its groups counted in a hash, not sorted (grouped in SQL where they overflow it)
                asked.append((f"values of {name}.{c}", tally_sql(name, c), TALLY))
                tallied.add((name, c))
        if not shape.keys and shape.info:
            asked.append((f"repeated rows in {name}",
                          f"SELECT count(*) = (SELECT count(*) FROM (SELECT DISTINCT * FROM {t})) FROM {t}"))
        owners += [name] * (len(asked) - len(owners))
    answers = iter(_largest_first(m, shapes, asked, owners))
    mirror_answers = [next(answers) for _ in twin_keys]
    gathered, overflowed = {}, []
    for name, shape in shapes.items():
        counted = next(answers)
        stats = {}
        for r in shape.info:
            if (name, r[0]) in twins:
                continue
            got = next(answers)
            if got is None:  # a tally past TALLY_BYTES
                overflowed.append((name, r[0]))
            else:
                stats[r[0]] = tallied_stats(got) if (name, r[0]) in tallied else column_stats(got)
        apart = bool(next(answers)[0][0]) if not shape.keys and shape.info else False
        gathered[name] = counted, stats, apart
    for (name, c), got in zip(overflowed, m.reader.many([(f"values of {name}.{c}", column_sql(name, c))
                                                          for name, c in overflowed])):
        gathered[name][1][c] = column_stats(got)
    for ((name, b), a), got in zip(twin_keys, mirror_answers):
        m.mirrored[(name, a, b)] = got
        stats = gathered[name][1]
        # Every row's mirror is a row, and no two rows share (a, b): b holds a's values, row for row of the
        # mirror, the same bytes where they are texts or blobs (a number may equal one of another class).
        # Texts and blobs of one declared type compare without conversion, so a > b on a row exactly when
        # a < b on its mirror: the halved columns' answers hold.
        if got[0][0] and got[0][2] == got[0][0] and set(stats[a]["types"]) <= {"text", "blob"}:
            stats[b] = dict(stats[a])
            if halves.get(name) == (a, b) and decl[(name, a)] == decl[(name, b)]:
                continue
        else:
            stats[b] = column_stats(m.try_rows(f"values of {name}.{b}", column_sql(name, b, hints[(name, b)])))
        if halves.get(name) == (a, b):  # not proven: the halved columns asked again, whole
            again = [c for c, *_ in shapes[name].info if c not in (a, b) and (c,) not in shapes[name].keys]
            for c, got_c in zip(again, m.reader.many([(f"values of {name}.{c}", column_sql(
                    name, c, hints.get((name, c), []))) for c in again])):
                stats[c] = column_stats(got_c)
    tables = {}
    for name, shape in shapes.items():
        counted, stats, apart = gathered[name]
        stats = {r[0]: stats[r[0]] for r in shape.info}
        n_rows = counted[0][0] if counted and isinstance(counted[0][0], int) else 0
        tables[name] = _mine_table(m, name, shape, name in collated, n_rows, stats, apart)
    return tables


def _largest_first(m: _Miner, shapes: dict[str, Shape], asked: list[tuple[str, ...]],
                   owners: list[str]) -> list[Any]:
    """Reader.many's answers to `asked` (each on the table `owners` names), in its order, the statements
    started largest table first (its largest rowid, the end of its b-tree: a table without rowids counts as
    largest), so that the longest do not start last and leave a connection idle at the end."""
    size = {}
    for name, shape in shapes.items():
        top = m.try_rows(f"rows of {name}", f"SELECT max(rowid) FROM {quote(name)}") if shape.rowid else None
        size[name] = top[0][0] if top and isinstance(top[0][0], int) else (1 << 63 if not shape.rowid else 0)
    order = sorted(range(len(asked)), key=lambda i: -size[owners[i]])
    got = m.reader.many([asked[i] for i in order])
    answers: list[Any] = [None] * len(asked)
    for i, a in zip(order, got):
        answers[i] = a
    return answers


def _mine_table(m: _Miner, name: str, shape: Shape, collates: bool, n_rows: int, stats: dict[str, dict[str, Any]],
                apart: bool) -> Table:
    """`collates`: the table's CREATE statement names a collation (a column's own collation decides what
    count(DISTINCT) calls equal; grouping is BINARY); `apart`: a table without a key whose rows never
    repeat."""
    info, rowid, keys = shape.info, shape.rowid, list(shape.keys)
    cols = [r[0] for r in info]
    t = quote(name)
    declared_unique = {k[0] for k in keys if len(k) == 1}
    for c in cols:
        s = stats[c]
        s["nulls"] = s["non_null"] < n_rows
        # Repeats under BINARY are repeats under any collation (BINARY-equal texts are NOCASE- and
        # RTRIM-equal), so only a column with none under BINARY may need its own collation's count.
        s["unique"] = c in declared_unique or s["distinct"] == s["non_null"]
        if collates and s["unique"] and c not in declared_unique:
            got = m.try_rows(f"repeats in {name}.{c}",
                             f"SELECT count({quote(c)}) = count(DISTINCT {quote(c)}) FROM {t}")
            s["unique"] = bool(got[0][0])
    pk_cols = [r for r in info if r[3]]
    integer_key = (pk_cols[0][0] if rowid and len(pk_cols) == 1 and (pk_cols[0][1] or "").upper() == "INTEGER"
                   else None)
    columns = []
    for c, decl_type, not_null, pk in info:
        s = stats[c]
        columns.append(Column(c, (decl_type or "").upper(), bool(pk), bool(not_null) or c == integer_key,
                              bool(s["nulls"]), bool(s["unique"]), s["types"], s["formats"], s["mined"],
                              s["cases"]))
    if apart:
        # A table without a key (a link table, say) whose rows never repeat keeps them apart: the whole row
        # is its key (a hero does not hold one power twice).
        keys.append(tuple(cols))
    m.stats[name] = {c: (s["distinct"], s["non_null"], s["pairs"]) for c, s in stats.items()}
    for c, s in stats.items():
        for (parent, pc), n in zip(m.hints.get((name, c), []), s["found"]):
            m.found[(name, c, parent, pc)] = n or 0
    return Table(name, tuple(columns), n_rows, rowid, integer_key, tuple(keys))


def _is_key(table: Table, cols: tuple[str, ...]) -> bool:
    low = {c.lower() for c in cols}
    if any({k.lower() for k in key} == low for key in table.keys):
        return True
    return len(cols) == 1 and bool(table.column(cols[0]) and table.column(cols[0]).unique
                                   and not table.column(cols[0]).nulls)

def _candidate_references(tables: dict[str, Table], declared: set[tuple]) -> list[tuple[str, tuple, str, tuple]]:
    """Undeclared references worth checking: a column named like another table's single-column key
    (the key's own name, `<table>_<key>`, `<table>_id`, `<table>id`), of a compatible type."""
    out = []
    for parent in tables.values():
        for key in parent.keys:
            if len(key) != 1:
                continue
            key_col = parent.column(key[0])
            if key_col is None:
                continue
            p, k = parent.name.lower(), key_col.name.lower()
            names = {k, f"{p}_{k}", f"{p}_id", f"{p}id"} if k != "id" else {f"{p}_id", f"{p}id"}
            for child in tables.values():
                if child.name == parent.name:
                    continue
                for c in child.columns:
                    if c.name.lower() not in names:
                        continue
                    if c.types and key_col.types and not set(c.types) & set(key_col.types):
                        continue
                    cand = (child.name, (c.name,), parent.name, (key_col.name,))
                    if cand not in declared:
                        out.append(cand)
    return out

def _references(m: _Miner, tables: dict[str, Table]) -> list[Reference]:
    declared = declared_references(m.reader, tables, m.left_out)
    declared_set = set(declared)
    found = [r for r in declared + _candidate_references(tables, declared_set)
             if r in declared_set or _is_key(tables[r[2]], r[3])]
    # Row values with IN (an ephemeral index, n log n, or the child's own index on the columns), not a
    # correlated NOT EXISTS (n x m without an index).
    dangling = m.reader.many([
        (f"reference {child}({', '.join(ccols)}) -> {parent}",
         f"SELECT EXISTS (SELECT 1 FROM {quote(child)} WHERE {_not_null(ccols)} AND {_row(ccols)} NOT IN "
         f"(SELECT {', '.join(quote(b) for b in pcols)} FROM {quote(parent)})), "
         f"EXISTS (SELECT 1 FROM {quote(child)} WHERE {_not_null(ccols)})")
        for child, ccols, parent, pcols in found if (child, ccols, parent, pcols) not in declared_set])
    closed = iter(dangling)
    kept = []
    for r in found:
        if r not in declared_set:
            d = next(closed)
            if d[0][0] or not d[0][1]:
                continue  # an undeclared reference counts only when the data proves it closed
        kept.append(r)
    counted = {r: _total_by_count(m, tables, *r) for r in kept}
    orphans = iter(m.reader.many([
        (f"every {parent} row has a {child} row",
         f"SELECT EXISTS (SELECT 1 FROM {quote(parent)} WHERE {_row(pcols)} NOT IN "
         f"(SELECT {', '.join(quote(a) for a in ccols)} FROM {quote(child)} WHERE {_not_null(ccols)})), "
         f"EXISTS (SELECT 1 FROM {quote(parent)})")
        for child, ccols, parent, pcols in kept if counted[(child, ccols, parent, pcols)] is None]))
    out = []
    for r in kept:
        total = counted[r]
        if total is None:
            got = next(orphans)
            total = not got[0][0] and bool(got[0][1])
        out.append(Reference(*r, r in declared_set, total))
    return out


def _total_by_count(m: _Miner, tables: dict[str, Table], child: str, ccols: tuple, parent: str,
                    pcols: tuple) -> bool | None:
    """Whether every parent row has a child row, from the child's column statement (the distinct child
    values the parent key holds), or None when the count cannot say it as NOT IN would: a parent key
    (unique: a matched child value names one parent row), one storage class on both sides (equal only
    byte for byte, as grouping is) and no other collation. With a child value somewhere, a parent row
    whose key is NULL is no orphan (NULL NOT IN a set that is not empty is NULL)."""
    found = m.found.get((child, ccols[0], parent, pcols[0])) if len(ccols) == 1 else None
    if found is None or m.collated & {child, parent} or not _is_key(tables[parent], pcols):
        return None
    c, p = tables[child].column(ccols[0]), tables[parent].column(pcols[0])
    if len(c.types) != 1 or c.types != p.types:
        return None
    child_values, parent_keys = m.stats[child][c.name][1], m.stats[parent][p.name][1]
    if not child_values:
        return None
    return tables[parent].rows > 0 and found == parent_keys


def _row(cols: tuple[str, ...]) -> str:
    return "(" + ", ".join(quote(c) for c in cols) + ")"


def _not_null(cols: tuple[str, ...]) -> str:
    return " AND ".join(f"{quote(c)} IS NOT NULL" for c in cols)

def _comparable(a: Column, b: Column) -> bool:
    return bool(a.types and b.types and set(a.types) == set(b.types))

def _copies(m: _Miner, tables: dict[str, Table], references: list[Reference]) -> list[Copy]:
    out: list[Copy] = []
    for t in tables.values():  # the same row: a = b
        cols = [c for c in t.columns if c.types]
        pairs = [(a, b) for i, a in enumerate(cols) for b in cols[i + 1:] if _comparable(a, b)][:MAX_COPY_PAIRS]
        if not pairs or t.rows == 0:
            continue
        broken = [f"{quote(a.name)} IS NOT {quote(b.name)}" for a, b in pairs]
        kept = unrefuted(m.reader.rows, broken, lead(quote(t.name)))
        if not kept:
            continue
        sums = ", ".join(f"sum({broken[i]})" for i in kept)
        got = m.try_rows(f"equal columns of {t.name}", f"SELECT {sums} FROM {quote(t.name)}")
        out += [Copy(t.name, pairs[i][1].name, t.name, pairs[i][0].name, None)
                for i, diff in zip(kept, got[0]) if diff == 0]
    for r in references:  # through a reference: child.x = parent.y
        child, parent = tables[r.child], tables[r.parent]
        skip_c, skip_p = set(r.child_columns), set(r.parent_columns)
        pairs = [(x, y) for x in child.columns if x.name not in skip_c
                 for y in parent.columns if y.name not in skip_p and _comparable(x, y)][:MAX_COPY_PAIRS]
        if not pairs:
            continue
        join = " AND ".join(f"c.{quote(a)} = p.{quote(b)}" for a, b in zip(r.child_columns, r.parent_columns))
        broken = [f"c.{quote(x.name)} IS NOT p.{quote(y.name)}" for x, y in pairs]
        kept = unrefuted(m.reader.rows, broken, f"{lead(quote(r.child))} AS c JOIN {quote(r.parent)} AS p ON {join}")
        if not kept:
            continue
        sums = ", ".join(f"sum({broken[i]})" for i in kept)
        got = m.try_rows(f"copies along {r.name}",
                         f"SELECT count(*), {sums} FROM {quote(r.child)} AS c JOIN {quote(r.parent)} AS p ON {join}")
        if not got[0][0]:
            continue
        out += [Copy(r.child, pairs[i][0].name, r.parent, pairs[i][1].name, r)
                for i, diff in zip(kept, got[0][1:]) if diff == 0]
    return out

def _relations(m: _Miner, tables: dict[str, Table]) -> list[Relation]:
    out: list[Relation] = []
    for t in tables.values():
        nums = [c for c in t.columns if c.types and set(c.types) <= {"integer", "real"} and not c.pk]
        nums = nums[:MAX_RELATION_COLUMNS]
        triples = [(total, a, b) for total in nums for i, a in enumerate(nums) for b in nums[i + 1:]
                   if total is not a and total is not b]
        if not triples or t.rows == 0:
            continue
        broken = []
        for total, a, b in triples:
            s, x, y = quote(total.name), quote(a.name), quote(b.name)
            broken.append(f"CASE WHEN {s} IS NULL OR {x} IS NULL OR {y} IS NULL THEN 0 "
                          f"WHEN abs({x} + {y} - {s}) <= 1e-9 * max(1.0, abs({s})) THEN 0 ELSE 1 END")
        kept = unrefuted(m.reader.rows, broken, lead(quote(t.name)))
        if not kept:
            continue
        terms = []
        for i in kept:
            s, x, y = (quote(c.name) for c in triples[i])
            terms.append(f"sum({broken[i]}), "
                         f"sum({s} IS NOT NULL AND {x} IS NOT NULL AND {y} IS NOT NULL AND {x} <> 0 AND {y} <> 0)")
        got = m.try_rows(f"sums in {t.name}", f"SELECT {', '.join(terms)} FROM {quote(t.name)}")
        row = got[0]
        for k, i in enumerate(kept):
            total, a, b = triples[i]
            # Held in every row, and in at least three rows where neither term is 0 (else a + 0 = a is luck).
            if row[2 * k] == 0 and (row[2 * k + 1] or 0) >= 3:
                out.append(Relation(t.name, total.name, a.name, b.name))
    return out

def mine(path: str, *, cancel: Any = None, max_temp_mb: int = MINE_TEMP_MB, workers: int = MINE_WORKERS) -> Invariants:
    """The invariants of the database file at `path` (no cache), mined to the end; `cancel` (a
    t2sql.Cancel) stops it (QueryCancelled); `workers` connections run independent statements side by
    side. A statement that fails makes them `unsupported`, naming the invariant it was to verify; a file
    that is not a readable database raises DatabaseError."""
    started = time.monotonic()
    with t2sql.Database(path) as db:  # a file that is not a readable database: DatabaseError
        m = _Miner(Reader(db, cancel, max_temp_mb, path, workers))
        try:
            return _mine(path, m, started)
        except Unverified as e:
            return unsupported(path, f"mining could not verify {e}", time.monotonic() - started)
        finally:
            m.reader.close()


def unsupported(path: str, why: str, mine_s: float = 0.0) -> Invariants:
    """Invariants that say no small database of this file is built, and why (kept like any others, so
    that the file is not mined again)."""
    return Invariants(path, (), (), (), (), (), why, round(mine_s, 3))


def _mine(path: str, m: _Miner, started: float) -> Invariants:
    listed, kinds = listing(m.reader, path)
    left: set[str] = set()
    shapes: dict[str, Shape] = {}
    created: dict[str, str] = {}
    for item in listed:
        if item.kind != "table":
            continue
        kind, without_rowid = kinds.get(item.name, ("table", False))
        if kind == "virtual" or re.match(r"\s*CREATE\s+VIRTUAL\b", item.sql, re.I):
            why = "a virtual table"
        elif kind == "shadow":
            why = "a virtual table's own storage"
        else:
            shape = table_shape(m.reader, item.name, without_rowid)
            if shape is not None:
                shapes[item.name] = shape
                created[item.name] = item.sql
                continue
            why = "the catalog cannot describe it"
        m.left_out.append(("table", item.name, why))
        left.add(item.name.lower())
    schema = statements(listed, left, m.left_out)
    collated = frozenset(n for n in shapes if re.search(r"\bCOLLATE\b", created[n], re.I))
    m.collated = collated
    tables = _mine_tables(m, shapes, collated)
    references = _references(m, tables)
    copies = _copies(m, tables, references)
    relations = _relations(m, tables)
    realistic = realism_mining.mine(m.reader.rows, tables, references, m.stats, collated, m.mirrored, m.reader.aside,
                             (lambda sqls: m.reader.many([("path copies", sql) for sql in sqls]))
                             if m.reader.workers > 1 else None)
    why = "" if tables else "no table a small database can hold"
    return Invariants(path, schema, tuple(tables.values()), tuple(references), tuple(copies), tuple(relations),
                      why, round(time.monotonic() - started, 3), tuple(dict.fromkeys(m.left_out)), **realistic)
