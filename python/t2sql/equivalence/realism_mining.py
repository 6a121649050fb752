"""Finding the realism rules (t2sql.equivalence.realism says what each is) in a database's data: statements of
mining's (t2sql.equivalence.mining runs this with the rest), each candidate refuted on a table's leading rows
first (t2sql.equivalence.refuting) and verified on every row; a statement that fails makes the database
unsupported, never a rule silently dropped."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from t2sql.equivalence.invariants import (
    TEXT_CACHED,
    Column,
    PathCopy,
    Prefix,
    Reference,
    Symmetry,
    Table,
    UniqueSet,
    Vocabulary,
    quote,
)
from t2sql.equivalence.refuting import lead, unrefuted

MIN_MIRRORED = 3  # rows (left <> right) a table must hold to be called symmetric: fewer is luck

MAX_PATH_PAIRS = 64  # column pairs per pair of references (or per table, for prefixes) tried

MAX_SYMMETRY_PAIRS = 8  # column pairs per table tried for a symmetry

MIN_ROWS = 20  # rows a table must hold before its columns are tried for unique sets or vocabularies

MIN_EXPECTED_REPEATS = 10.0  # repeats two unrelated columns would show by chance before "never" counts (about
# 100 pairs tried in a database: at 10, P(none by luck) = e^-10 each, a false rule in about 1 of 200 databases)

MAX_UNIQUE_PAIRS = 24  # column pairs per table tried for a unique set

VOCABULARY_MAX = 64  # distinct values a closed vocabulary holds, at most

VOCABULARY_ROWS_PER_VALUE = 5  # rows per distinct value, at least (fewer: an open column, names)

MAX_STAT_COLUMNS = 64  # columns per table whose repeats are counted

Rows = Callable[[str], "list[tuple] | None"]  # a mining statement's rows (mining raises Unverified on failure)


Aside = Callable[[Callable[[Rows], Any]], Callable[[], Any]]  # runs a part beside the rest: its answer, later

Many = Callable[[list[str]], "list[list[tuple]]"]  # statements run side by side, their rows in order


def _inline(part: Callable[[Rows], Any], rows: Rows) -> Callable[[], Any]:
    return lambda: part(rows)


def mine(rows: Rows, tables: dict[str, Table], references: Iterable[Reference],
         counted: dict[str, dict[str, tuple[int, int, int]]], collated: frozenset[str],
         mirrored: dict[tuple[str, str, str], Any] | None = None, aside: Aside | None = None,
         many: Many | None = None) -> dict[str, tuple]:
    """The symmetries, unique sets, closed vocabularies, path copies and prefixes of a database's tables
    (see the module doc), by Invariants' field names; `counted` is mining's count of each column's values
    (table -> column -> distinct non-NULL values, non-NULL values, pairs of rows that share a value, under
    BINARY), `collated` the tables whose columns may compare under another collation, `mirrored` the
    answers of `mirrors` mining already has, by (table, a, b) (a table they prove stored both ways has
    its path copies counted on half its rows: _halving). `aside` (mining_reader.Reader.aside) runs the path
    copies on a connection of their own beside the rest, `many` (mining_reader.Reader.many) the halves of their
    child's rows side by side; a failure is raised in the order the parts would run one after the
    other."""
    mirrored = mirrored or {}
    references = list(references)
    paths = (aside or (lambda part: _inline(part, rows)))(
        lambda own: _path_copies(own, tables, references, collated, many, mirrored))
    symmetries: list[Symmetry] = []
    unique_sets: list[UniqueSet] = []
    vocabularies: list[Vocabulary] = []
    try:
        for t in tables.values():
            symmetries += _symmetries(rows, t, references, counted.get(t.name, {}), t.name in collated, mirrored)
            if t.rows < MIN_ROWS:
                continue
            stats = _column_stats(t, counted.get(t.name, {}))
            unique_sets += _unique_sets(rows, t, stats)
            vocabularies += _vocabularies(rows, t, stats, references)
    except BaseException:
        try:
            paths()  # ended before this one's failure is raised
        except BaseException:  # the earlier part's failure is the one reported
            pass
        raise
    prefixes: list[Prefix] | BaseException
    try:  # while the path copies run
        prefixes = _prefixes(rows, tables)
    except BaseException as e:  # raised after the path copies' own failure, if any: their turn comes first
        prefixes = e
    found = paths()
    if isinstance(prefixes, BaseException):
        raise prefixes
    return dict(symmetries=tuple(symmetries), unique_sets=tuple(unique_sets), vocabularies=tuple(vocabularies),
                path_copies=tuple(found), prefixes=tuple(prefixes))


def _summed(rows: Rows, many: Many | None, child: Table, sql: str, where: str = "") -> list[tuple] | None:
    """The answer of `sql` (counts and sums only, over `c`, the child's rows, those `where` holds on when
    given), or, when `many` runs statements side by side and the child has rowids, the sum of its answers
    on the two halves of them (each row in one half: the same numbers where any row joins)."""
    if many is None or not child.rowid or any(c.name.lower() in ("rowid", "oid", "_rowid_") for c in child.columns):
        return rows(f"{sql} WHERE {where}" if where else sql)  # one statement: no rowid of SQLite's own to split on
    top = rows(f"SELECT max(rowid) FROM {quote(child.name)}")
    if not top or not isinstance(top[0][0], int):
        return rows(f"{sql} WHERE {where}" if where else sql)
    half = top[0][0] // 2
    also = f"({where}) AND " if where else ""
    parts = many([f"{sql} WHERE {also}c.rowid <= {half}", f"{sql} WHERE {also}c.rowid > {half}"])
    if not all(parts):
        return None
    return [tuple((x or 0) + (y or 0) for x, y in zip(parts[0][0], parts[1][0]))]


def _path_copies(rows: Rows, tables: dict[str, Table], references: list[Reference],
                 collated: frozenset[str], many: Many | None = None,
                 mirrored: dict[tuple[str, str, str], Any] | None = None) -> list[PathCopy]:
    # Per pair of references (by their places in `references`), the column pairs no leading row breaks.
    todo: dict[str, list[tuple[int, int, list[tuple[str, str]]]]] = {}
    for i, r1 in enumerate(references):
        for j in range(i + 1, len(references)):
            r2 = references[j]
            if r2.child != r1.child or r1.parent == r1.child or r2.parent == r2.child:
                continue
            p1, p2 = tables[r1.parent], tables[r2.parent]
            # Columns other than the joins' own keys, of one storage class, and not a unique one (two
            # unique columns agree only when the two references name one row).
            pairs = [(x.name, y.name) for x in p1.columns if x.name not in r1.parent_columns and not x.unique
                     and x.types for y in p2.columns if y.name not in r2.parent_columns and not y.unique
                     and set(y.types) == set(x.types)][:MAX_PATH_PAIRS]
            if not pairs:
                continue
            joins = f"JOIN {quote(r1.parent)} AS p ON {_on(r1, 'p')} JOIN {quote(r2.parent)} AS q ON {_on(r2, 'q')}"
            kept = unrefuted(rows, [f"p.{quote(x)} IS NOT q.{quote(y)}" for x, y in pairs],
                             f"{lead(quote(r1.child))} AS c {joins}")
            if kept:
                todo.setdefault(r1.child, []).append((i, j, [pairs[k] for k in kept]))
    found: dict[tuple[int, int], list[PathCopy]] = {}
    for child, items in todo.items():
        places = sorted({k for i, j, _ in items for k in (i, j)})
        if len(items) > 1 and all(_one_parent_row(tables, references[k], collated) for k in places):
            # One pass for all of them: each reference joined once (at most one parent row each), a pair
            # counted on the rows both of its references reach, as its own inner join would.
            joins = " ".join(f"LEFT JOIN {quote(references[k].parent)} AS p{k} ON {_on(references[k], f'p{k}')}"
                             for k in places)
            half = _halving(tables[child], {k: references[k] for k in places}, collated, mirrored or {})

            def summand(i: int, j: int, x: str | None = None, y: str | None = None) -> str:
                e = f"p{i}.{quote(references[i].parent_columns[0])} IS NOT NULL AND " \
                    f"p{j}.{quote(references[j].parent_columns[0])} IS NOT NULL"
                return e if x is None else f"{e} AND p{i}.{quote(x)} IS NOT p{j}.{quote(y)}"

            placed: dict[str, int] = {}  # a summand -> the place of its sum in the statement
            selected: list[str] = []

            def term(i: int, j: int, x: str | None = None, y: str | None = None) -> int:
                e = summand(i, j, x, y)
                if half is None:
                    selected.append(f"sum({e})")
                    return placed.setdefault(e, len(selected) - 1)
                a, b, swap = half
                mirrored_e = summand(swap[i], swap[j], x, y)  # the term on the row's mirror
                if mirrored_e in placed:  # summed over every row, a term and its mirror's are one number
                    return placed[mirrored_e]
                lower = f"c.{quote(a)} < c.{quote(b)}"
                # A row with a < b stands for its mirror too: the mirror's term added (the term itself again
                # where the swap leaves it the same: IS NOT and AND do not mind the order).
                alike = mirrored_e == e or ((swap[i], swap[j]) == (j, i) and x == y)
                selected.append(f"sum(({e}) * (1 + ({lower})))" if alike else
                                f"sum(({e}) + ({lower} AND ({mirrored_e})))")
                return placed.setdefault(e, len(selected) - 1)
            at = [[term(i, j)] + [term(i, j, x, y) for x, y in pairs] for i, j, pairs in items]
            got = _summed(rows, many, tables[child], f"SELECT {', '.join(selected)} FROM {quote(child)} AS c {joins}",
                          "" if half is None else f"NOT (c.{quote(half[0])} > c.{quote(half[1])})")
            for (i, j, pairs), columns in zip(items, at):
                part = tuple(got[0][k] for k in columns) if got else ()
                found[(i, j)] = _held(references[i], references[j], pairs, part)
            continue
        for i, j, pairs in items:
            r1, r2 = references[i], references[j]
            sums = ", ".join(f"sum(p.{quote(x)} IS NOT q.{quote(y)})" for x, y in pairs)
            got = _summed(rows, many, tables[child], f"SELECT count(*), {sums} FROM {quote(child)} AS c JOIN "
                          f"{quote(r1.parent)} AS p ON {_on(r1, 'p')} JOIN {quote(r2.parent)} AS q ON {_on(r2, 'q')}")
            found[(i, j)] = _held(r1, r2, pairs, got[0] if got else ())
    return [pc for key in sorted(found) for pc in found[key]]


def _halving(child: Table, refs: dict[int, Reference], collated: frozenset[str],
             mirrored: dict[tuple[str, str, str], Any]) -> tuple[str, str, dict[int, int]] | None:
    """(a, b, swap) where the child is proved stored both ways, so that a sum over its rows of a term of
    the references `refs` (by place) is the sum over the rows with NOT a > b, plus, over those with a < b,
    the term through the swapped references (swap: a reference's place -> its twin's through the other
    column, or its own); None where that is not proved."""
    if child.name in collated:  # a and b compare under BINARY: exactly one of <, =, > holds
        return None
    for (name, a, b), got in mirrored.items():
        # Every row's mirror is a row and no two rows share (a, b): row(a, b, rest) -> row(b, a, rest) is a
        # bijection that swaps the rows with a < b and a > b (no NULL: a row with one has no mirror).
        if name != child.name or not (got and got[0][0] and got[0][2] == got[0][0]) \
                or not any({k.lower() for k in key} <= {a.lower(), b.lower()} for key in child.keys):
            continue
        # Values equal under = are the same value (one storage class, no real: 0.0 = -0.0) and a and b
        # compare alike (one declared type, so one affinity): the mirror joins, through a, the parent rows
        # the row joins through b, and a < b on a row exactly when a > b on its mirror.
        ca, cb = child.column(a), child.column(b)
        if not (_plain(ca) and _plain(cb) and ca.types == cb.types
                and (ca.decl_type or "").upper() == (cb.decl_type or "").upper()):
            continue
        swap = {}
        for k, r in refs.items():
            cols = [c.lower() for c in r.child_columns]
            if not {a.lower(), b.lower()} & set(cols) and all(_plain(child.column(c)) for c in cols):
                swap[k] = k  # its columns hold the same values in the row and its mirror
                continue
            other = [b.lower()] if cols == [a.lower()] else [a.lower()] if cols == [b.lower()] else None
            twins = [m for m, s in refs.items() if [c.lower() for c in s.child_columns] == other
                     and (s.parent, s.parent_columns) == (r.parent, r.parent_columns)]
            if len(twins) != 1:
                break
            swap[k] = twins[0]
        else:
            return a, b, swap
    return None


def _plain(c: Column | None) -> bool:
    """Whether two of the column's values equal under = are the same value: one storage class, not real
    (0.0 = -0.0), every value read."""
    return c is not None and c.mined and len(c.types) == 1 and c.types[0] in ("integer", "text", "blob")


def _on(r: Reference, alias: str) -> str:
    return " AND ".join(f"c.{quote(a)} = {alias}.{quote(b)}" for a, b in zip(r.child_columns, r.parent_columns))


def _one_parent_row(tables: dict[str, Table], r: Reference, collated: frozenset[str]) -> bool:
    """Whether a child row joins at most one parent row: the parent columns hold a key, compared as
    the key compares them (no other collation on either side)."""
    parent = tables[r.parent]
    cols = {c.lower() for c in r.parent_columns}
    if r.child in collated or r.parent in collated:
        return False
    if any({k.lower() for k in key} <= cols for key in parent.keys):
        return True
    return any(c.unique and not c.nulls and c.name.lower() in cols for c in parent.columns)


def _held(r1: Reference, r2: Reference, pairs: list[tuple[str, str]], got: tuple) -> list[PathCopy]:
    """The pairs that held on at least MIN_ROWS rows: `got` is the rows counted, then each pair's breaks."""
    if not got or (got[0] or 0) < MIN_ROWS:
        return []
    return [PathCopy(r1, x, r2, y) for (x, y), diff in zip(pairs, got[1:]) if diff == 0]


def _prefixes(rows: Rows, tables: dict[str, Table]) -> list[Prefix]:
    out: list[Prefix] = []
    for t in tables.values():
        texts = [c.name for c in t.columns if c.mined and c.types == ("text",) and not c.nulls]
        pairs = [(x, y) for x in texts for y in texts if x != y][:MAX_PATH_PAIRS]
        if not pairs or t.rows < MIN_ROWS:
            continue
        # Always a proper prefix, and the source not one value throughout (a constant starts nothing).
        broken = [f"substr({quote(x)}, 1, length({quote(y)})) IS NOT {quote(y)} "
                  f"OR length({quote(x)}) <= length({quote(y)})" for x, y in pairs]
        kept = unrefuted(rows, broken, lead(quote(t.name)))
        if not kept:
            continue
        got = rows(f"SELECT {', '.join(f'sum({broken[i]})' for i in kept)} FROM {quote(t.name)}")
        for i, diff in zip(kept, got[0] if got else ()):
            x, y = pairs[i]
            # count(DISTINCT) reaching MIN_MIRRORED: the first values found are enough.
            varied = diff == 0 and rows(f"SELECT count(*) FROM (SELECT DISTINCT {quote(y)} FROM {quote(t.name)} "
                                        f"WHERE {quote(y)} IS NOT NULL LIMIT {MIN_MIRRORED})")
            if varied and varied[0][0] >= MIN_MIRRORED:
                out.append(Prefix(t.name, x, y))
    return out


def mirror_sql(table: str, columns: list[str], a: str, b: str, *, halved: bool = False) -> tuple[str, str]:
    """The statement that counts a table's rows, those where a and b differ and those whose mirror (a and b
    swapped, the rest the same) is a row, and the leading rows' refutation of it (the rows that lack one).
    The mirror is looked up row by row (through the table's key where it has one), not in a temporary
    index of the whole table: the left side is the mirror's value, as in (mirror) IN (rows).

    `halved` (a and b of one declared type in a table without a collation, no two rows sharing (a, b)):
    only the rows with a < b are looked up, each found counting for itself and its mirror, and a row with
    a = b for itself. Distinct rows with a < b have distinct mirrors, all with a > b, so the count equals
    the rows' exactly when every row with a < b has its mirror and as many rows have a > b: when every
    row has its mirror (a row with a NULL has none), as the whole statement says; only that equality is
    an answer then, not how many rows lack one."""
    qt = quote(table)
    same = [(b, a), (a, b)] + [(c, c) for c in columns if c not in (a, b)]
    found = f"EXISTS (SELECT 1 FROM {qt} AS m WHERE " + " AND ".join(
        f"o.{quote(x)} = m.{quote(y)}" for x, y in same) + ")"
    qa, qb = quote(a), quote(b)
    counted = (f"CASE WHEN o.{qa} < o.{qb} THEN 2 * {found} WHEN o.{qa} = o.{qb} THEN 1 ELSE 0 END" if halved
               else found)
    return (f"SELECT count(*), sum(o.{qa} IS NOT o.{qb}), sum({counted}) FROM {qt} AS o",
            f"SELECT sum(NOT {found}) FROM {lead(qt)} AS o")


def mirrors(rows: Rows, table: str, columns: list[str], a: str, b: str) -> list[tuple] | None:
    """mirror_sql's answer, or None when a leading row lacks its mirror."""
    full, leading = mirror_sql(table, columns, a, b)
    refuted = rows(leading)
    if refuted and refuted[0][0]:
        return None
    return rows(full)


def _symmetries(rows: Rows, t: Table, references: list[Reference], counted: dict[str, tuple[int, int, int]],
                collated: bool, mirrored: dict[tuple[str, str, str], Any]) -> list[Symmetry]:
    # Candidates: two columns of one table that reference the same parent key.
    targets: dict[tuple, list[str]] = {}
    for r in references:
        if r.child == t.name and len(r.child_columns) == 1:
            targets.setdefault((r.parent, r.parent_columns), []).append(r.child_columns[0])
    for cols in targets.values():
        cols.sort(key=lambda c: t.position(c) or 0)
    pairs = [(a, b) for cols in targets.values() for i, a in enumerate(cols) for b in cols[i + 1:]]
    out = []
    qt = quote(t.name)
    for a, b in pairs[:MAX_SYMMETRY_PAIRS]:
        rest = [c.name for c in t.columns if c.name not in (a, b)]
        if (t.name, a, b) in mirrored:  # mining ran it with the table's columns
            got = mirrored[(t.name, a, b)]
        else:
            got = mirrors(rows, t.name, [c.name for c in t.columns], a, b)
        if not (got and got[0][0] and got[0][2] == got[0][0] and (got[0][1] or 0) >= MIN_MIRRORED):
            continue
        keyed = False
        rows_apart = any({k.lower() for k in key} <= {a.lower(), b.lower()} for key in t.keys)
        if len(rest) == 1 and rows_apart and not collated and rest[0] in counted:
            # No two rows share (a, b) and each row's mirror is a row with the same rest: the pairs {a, b}
            # number the rows with a = b plus half the others, and each holds one rest value. The rest
            # names one pair exactly when it takes as many distinct values (no NULL here: a row with one
            # has no mirror).
            keyed = counted[rest[0]][0] == got[0][0] - got[0][1] // 2
        elif rest:
            # The rest names one pair: in each group of equal rest, one smaller and one larger end (no
            # NULL here: a row with one has no mirror).
            names = ", ".join(quote(c) for c in rest)
            low, high = f"min({quote(a)}, {quote(b)})", f"max({quote(a)}, {quote(b)})"
            named = rows(f"SELECT NOT EXISTS (SELECT 1 FROM {qt} GROUP BY {names} HAVING min({low}) <> max({low}) "
                         f"OR min({high}) <> max({high}))")
            keyed = bool(named and named[0][0])
        out.append(Symmetry(t.name, a, b, keyed))
    return out


def _column_stats(t: Table, counted: dict[str, tuple[int, int, int]]) -> dict[str, tuple[int, int, int]]:
    """column -> (distinct non-NULL values, non-NULL values, pairs of rows that share a value) for the
    mined, non-unique columns holding a value, letter case counting (BINARY collation)."""
    return {c.name: counted[c.name] for c in t.columns[:MAX_STAT_COLUMNS]
            if c.mined and c.types and not c.unique and counted.get(c.name, (0,))[0]}


def _unique_sets(rows: Rows, t: Table, stats: dict[str, tuple[int, int, int]]) -> list[UniqueSet]:
    cols = [c.name for c in t.columns if c.name in stats and stats[c.name][0] >= 2]
    all_pairs = t.rows * (t.rows - 1) / 2
    scored = []
    for i, a in enumerate(cols):
        for b in cols[i + 1:]:
            if any({k.lower() for k in key} <= {a.lower(), b.lower()} for key in t.keys):
                continue  # a declared key (or the whole row) says it already
            # Pairs of rows equal in both columns were the two unrelated: those equal in one, times the
            # chance that two rows are equal in the other.
            expected = stats[a][2] * stats[b][2] / all_pairs
            if expected >= MIN_EXPECTED_REPEATS:
                scored.append((-expected, a, b))
    out = []
    for _, a, b in sorted(scored)[:MAX_UNIQUE_PAIRS]:
        qa, qb = quote(a), quote(b)
        both = f"{qa} IS NOT NULL AND {qb} IS NOT NULL"

        def repeats(source: str) -> int | None:
            got = rows(f"SELECT (SELECT count(*) FROM {source} WHERE {both}) - "
                       f"(SELECT count(*) FROM (SELECT DISTINCT {qa}, {qb} FROM {source} WHERE {both}))")
            return got[0][0] if got else None
        # A repeat among the leading rows is a repeat in the table (most pairs show one there).
        if repeats(lead(quote(t.name))) == 0 and repeats(quote(t.name)) == 0:
            out.append(UniqueSet(t.name, (a, b)))
    return out


def _vocabularies(rows: Rows, t: Table, stats: dict[str, tuple[int, int, int]],
                  references: list[Reference]) -> list[Vocabulary]:
    linked = {c for r in references if r.child == t.name for c in r.child_columns}
    linked |= {c for r in references if r.parent == t.name for c in r.parent_columns}
    out = []
    for c in t.columns:
        if (c.name not in stats or c.pk or c.unique or c.name in linked or "text" not in c.types
                or any(c.name in key for key in t.keys)):
            continue  # identifiers take their values from the rows they name, not from a vocabulary
        n_distinct, n, _ = stats[c.name]
        if not 0 < n_distinct <= VOCABULARY_MAX or n < VOCABULARY_ROWS_PER_VALUE * n_distinct:
            continue
        q = quote(c.name)
        # DISTINCT first, then the sort: SQLite keeps the few distinct values in a small index as it scans,
        # where DISTINCT with ORDER BY in one SELECT sorts every row (12M rows at 1000x: 1.1 s, not 3.8 s).
        got = rows(f"SELECT v FROM (SELECT DISTINCT {q} COLLATE BINARY AS v FROM {quote(t.name)} "
                   f"WHERE typeof({q}) = 'text') ORDER BY v COLLATE BINARY LIMIT {VOCABULARY_MAX + 1}")
        if got is None or len(got) > VOCABULARY_MAX or any(len(v) > TEXT_CACHED for v, in got):
            continue
        out.append(Vocabulary(t.name, c.name, tuple(v for v, in got)))
    return out
