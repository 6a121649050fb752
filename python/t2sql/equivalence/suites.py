"""A database's suite: small databases of random real rows and their variants, distilled greedily against neighbour
queries derived from the schema, each judged as every check holds it; built once per database content within a
check's deadline and kept on disk. docs/recipe_extras.md, "Equivalence check"."""

from __future__ import annotations

from typing import Any

import t2sql
from t2sql._grader import GradeSpec
from t2sql.equivalence.diskcache import database_key
from t2sql.equivalence.invariants import Invariants, quote
from t2sql.equivalence.presupposed import Presupposition, presupposition
from t2sql.equivalence.real_rows import RealRows
from t2sql.equivalence.refutation import digest
from t2sql.equivalence.sampling import add_rows, close, duplicate, rekey, stable_rng
from t2sql.equivalence.smalldb import SmallDb, column_index, sql_literal
from t2sql.equivalence.targeted import realistic

# A suite on disk is named by this and the invariants' version (equivalence.EquivalenceChecker): one kept from
# another builder or other invariants passes the realism check when read back, and gives other verdicts.
SUITE_VERSION = 3  # 3: a lookup table renumbered; 2: closed samples, variants, realism (issue 37)

SUITE_POOL = 24  # random closed samples drawn per suite (each with its variants)

NEIGHBOUR_SPEC = GradeSpec("multiset", timeout_s=2.0)  # how a neighbour query runs on a candidate

def neighbour_pairs(inv: Invariants, real: RealRows, whole: Presupposition) -> list[tuple[str, str]]:
    """Pairs of queries that differ only on databases with duplicates, NULLs, childless parents,
    values in another case or at a boundary, lookup keys renumbered: what a suite must be able to tell
    apart (`whole`: what every question presupposes, its lookup tables' real rows)."""
    pairs: list[tuple[str, str]] = []
    for t in inv.tables:
        if t.rows == 0:
            continue
        name = quote(t.name)
        for c in t.columns[:12]:
            q = quote(c.name)
            if not c.unique:
                pairs.append((f"SELECT {q} FROM {name}", f"SELECT DISTINCT {q} FROM {name}"))
            if c.may_be_null:
                pairs.append((f"SELECT count({q}) FROM {name}", f"SELECT count(*) FROM {name}"))
            values = real.values(t.name, c.name)[:2]
            for v in values:
                if isinstance(v, str) and v.lower() != v.upper():
                    lit = "'" + v.replace("'", "''") + "'"
                    pairs.append((f"SELECT count(*) FROM {name} WHERE {q} = {lit}",
                                  f"SELECT count(*) FROM {name} WHERE {q} LIKE {lit}"))
                elif isinstance(v, (int, float)) and not isinstance(v, bool):
                    pairs.append((f"SELECT count(*) FROM {name} WHERE {q} > {v!r}",
                                  f"SELECT count(*) FROM {name} WHERE {q} >= {v!r}"))
    for r in inv.references:
        c, p = quote(r.child), quote(r.parent)
        on = " AND ".join(f"c.{quote(a)} = p.{quote(b)}" for a, b in zip(r.child_columns, r.parent_columns))
        pairs.append((f"SELECT count(*) FROM {p} AS p LEFT JOIN {c} AS c ON {on}",
                      f"SELECT count(*) FROM {p} AS p JOIN {c} AS c ON {on}"))
        pairs.append((f"SELECT count(*) FROM {c} AS c JOIN {p} AS p ON {on}", f"SELECT count(*) FROM {c}"))
    # A query that hard-codes a key it looked up today (`gender_id = 1` for 'Male') is told apart only
    # where a lookup table's rows hold other keys than the real ones: the suite keeps such a database.
    for lk, real_rows in whole.fixed:
        t = inv.table(lk.table)
        ki, ni = column_index(t, lk.key), column_index(t, lk.name)
        name, k, n = quote(lk.table), quote(lk.key), quote(lk.name)
        listed = ", ".join(f"({sql_literal(r[ki])}, {sql_literal(r[ni])})" for r in real_rows)
        pairs.append((f"SELECT count(*) FROM {name}",
                      f"SELECT count(*) FROM {name} WHERE ({k}, {n}) IN (VALUES {listed})"))
    return pairs

def build_suite(real: RealRows, inv: Invariants, *, size: int, seed: int) -> list[SmallDb]:
    """A database's suite: up to `size` small databases picked greedily from a pool of random closed
    samples and their variants, each one telling apart the most neighbour pairs the ones before left."""
    if size <= 0:
        return []
    rng = stable_rng(seed, "suite", database_key(real.path))
    pool: list[SmallDb] = []
    tables = [t for t in inv.tables if t.rows > 0]
    whole = presupposition(real, inv, [])
    for i in range(SUITE_POOL):
        seeds = SmallDb(inv, note=f"random real rows (draw {i})")
        picked = tables if len(tables) <= 6 else rng.sample(tables, 6)
        for t in picked:
            add_rows(seeds, t.name, real.random_rows(t.name, rng.randint(1, 3), rng))
        base = close(seeds, real)
        if base is None:
            continue
        pool.append(base)
        dup = base.copy(f"random real rows (draw {i}), some duplicated under fresh keys")
        for t in rng.sample(tables, min(3, len(tables))):
            rows = dup.rows.get(t.name, [])
            if rows:
                duplicate(dup, t.name, rows[rng.randrange(len(rows))], real, rng)
        pool.append(close(dup, real) or base)
        nulls = base.copy(f"random real rows (draw {i}), some values NULL")
        for t in tables:
            rows = nulls.rows.get(t.name, [])
            free = [c for c in t.columns if c.may_be_null and c.name not in inv.frozen(t.name)]
            if rows and free:
                c = free[rng.randrange(len(free))]
                ci = column_index(t, c.name)
                r = rows[0]
                rows[0] = tuple(None if j == ci else v for j, v in enumerate(r))
        pool.append(nulls)
        cased = base.copy(f"random real rows (draw {i}), some text in another case")
        for t in tables:
            if t.name in whole.fixed_tables:
                continue  # a lookup table's names are its real ones (t2sql.equivalence.presupposed)
            rows = cased.rows.get(t.name, [])
            free = [c for c in t.columns if "text" in c.types and c.name not in inv.frozen(t.name)]
            if rows and free:
                ci = column_index(t, free[rng.randrange(len(free))].name)
                r = rows[-1]
                if isinstance(r[ci], str):
                    rows[-1] = tuple(v.swapcase() if j == ci else v for j, v in enumerate(r))
        pool.append(cased)
        renumbered = base.copy(f"random real rows (draw {i}), integer keys renumbered")
        if any([rekey(renumbered, t.name) for t in tables]):
            pool.append(renumbered)
    # Each as every check will hold it: with what every question presupposes (its lookup tables whole, each
    # row once, under its real name), so no pick is one that each check then throws away.
    pool = realistic([f for f in (whole.fit(db, real) for db in pool) if f is not None])
    pairs = neighbour_pairs(inv, real, whole)
    kills: list[set[int]] = []
    queries = sorted({q for p in pairs for q in p})
    for db in pool:
        results = {}
        try:
            core = db.database("suite candidate")
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError:  # its rows are refused (a constraint), or it cannot be built in time
            kills.append(set())
            continue
        with core:
            for q in queries:
                try:
                    results[q] = digest(core, q, NEIGHBOUR_SPEC)
                except t2sql.QueryCancelled:
                    raise
                except t2sql.T2sqlError:
                    results[q] = None
        killed = set()
        for n, (a, b) in enumerate(pairs):
            ra, rb = results.get(a), results.get(b)
            if ra is not None and rb is not None and not ra.same_result(rb):
                killed.add(n)
        kills.append(killed)
    chosen: list[int] = []
    covered: set[int] = set()
    while len(chosen) < size:
        best = max((i for i in range(len(pool)) if i not in chosen),
                   key=lambda i: (len(kills[i] - covered), -pool[i].size), default=None)
        if best is None or (chosen and not kills[best] - covered):
            break
        chosen.append(best)
        covered |= kills[best]
    return [pool[i] for i in chosen]

def suite_to_json(dbs: list[SmallDb]) -> list[dict[str, Any]]:
    return [{"note": db.note, "rows": {t: [list(map(_cell_json, r)) for r in rows] for t, rows in db.rows.items()}}
            for db in dbs]

def _cell_json(v: Any) -> Any:
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, float) and v.is_integer():
        return {"real": v}  # 1.0 stays a REAL, not the INTEGER 1
    return v

def _cell_from_json(v: Any) -> Any:
    if isinstance(v, dict) and len(v) == 1:
        if isinstance(v.get("hex"), str):
            return bytes.fromhex(v["hex"])
        if isinstance(v.get("real"), (int, float)) and not isinstance(v["real"], bool):
            return float(v["real"])
    if v is None or isinstance(v, (str, float)):
        return v
    if isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63):
        return v
    raise ValueError(f"not a cell: {v!r:.60}")


def suite_from_json(inv: Invariants, data: Any, real: RealRows) -> list[SmallDb]:
    """The suite suite_to_json wrote, held as build_suite held it (with what every question presupposes);
    ValueError for anything else (a cache file is data, never trusted: each database names tables of `inv`
    and holds rows of their width)."""
    if not isinstance(data, list):
        raise ValueError("a suite is a list of small databases")
    out = []
    for d in data:
        if not isinstance(d, dict) or not isinstance(d.get("note"), str) or not isinstance(d.get("rows"), dict):
            raise ValueError("a small database is {note, rows}")
        rows: dict[str, list[tuple]] = {}
        for name, table_rows in d["rows"].items():
            t = inv.table(name)
            if t is None or t.name != name or not isinstance(table_rows, list):
                raise ValueError(f"no table {name!r:.60} in this database")
            if not all(isinstance(r, list) and len(r) == len(t.columns) for r in table_rows):
                raise ValueError(f"a row of {name} without {len(t.columns)} values")
            rows[name] = [tuple(_cell_from_json(v) for v in r) for r in table_rows]
        out.append(SmallDb(inv, rows, d["note"]))
    whole = presupposition(real, inv, [])
    for db in out:
        db.presupposition = whole  # its problems() are then those of a database build_suite picked
    return out
