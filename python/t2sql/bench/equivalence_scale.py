"""`t2sql bench equivalence-scale`: the equivalence check on copies of one database scaled k times, built so every
invariant mined at 1x still holds: mining and per-check cost per scale, peak RSS, and the verdicts that equal 1x's.
docs/benchmarks.md, "The equivalence check at the release's scale"."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from t2sql.episode.presets import DEFAULT_PRESET
from t2sql.equivalence.invariants import Invariants
from t2sql.equivalence.invariants_read import read_invariants


def offset_columns(inv: Invariants) -> dict[str, set[str]]:
    """Per table, the columns a scaled copy offsets: keys, unique columns, either side of a reference, and
    (closed under copies) the columns equal to one of them."""
    out: dict[str, set[str]] = {t.name: set() for t in inv.tables}
    for t in inv.tables:
        out[t.name] |= {c.name for c in t.columns if c.pk or c.unique}
        for key in t.keys:
            if len(key) < len(t.columns):  # a keyless table's whole row is not offset whole
                out[t.name] |= set(key)
    for r in inv.references:
        out[r.child] |= set(r.child_columns)
        out[r.parent] |= set(r.parent_columns)
    changed = True
    while changed:
        changed = False
        for cp in inv.copies:
            a, b = (cp.table, cp.column), (cp.source, cp.source_column)
            for x, y in ((a, b), (b, a)):
                if x[1] in out[x[0]] and y[1] not in out[y[0]]:
                    out[y[0]].add(y[1])
                    changed = True
    return out


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def scale_database(src: str, dst: Path, k: int, inv: Invariants) -> dict[str, Any]:
    """Write the copy of `src` at scale k to `dst` (see the module doc)."""
    started = time.perf_counter()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        dst.unlink()
    offsets = offset_columns(inv)
    conn = sqlite3.connect(dst)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("ATTACH DATABASE ? AS s", (src,))
    schema = conn.execute("SELECT type, name, sql FROM s.sqlite_master WHERE sql IS NOT NULL AND name NOT LIKE "
                          "'sqlite_%' ORDER BY rowid").fetchall()
    for kind, _name, sql in schema:
        if kind == "table":
            conn.execute(sql)
    # One power of ten past every number (or text of digits) an offset column holds.
    largest = 0
    for table, cols in offsets.items():
        for c in cols:
            got = conn.execute(
                f"SELECT max(abs(CAST({_q(c)} AS INTEGER))) FROM s.{_q(table)} WHERE typeof({_q(c)}) IN "
                f"('integer', 'real') OR ({_q(c)} <> '' AND {_q(c)} NOT GLOB '*[^0-9]*' AND length({_q(c)}) < 16)"
            ).fetchone()[0]
            largest = max(largest, int(got or 0))
    step = 10 ** (len(str(largest)) + 1)
    if step * k > 2**62:
        raise ValueError(f"a key of {largest} leaves no room for {k} copies in a 64-bit integer")
    for t in inv.tables:
        cols = [c.name for c in t.columns]
        names = ", ".join(_q(c) for c in cols)
        for i in range(k):
            exprs = []
            for c in cols:
                q = _q(c)
                if i == 0 or c not in offsets[t.name]:
                    exprs.append(q)
                    continue
                off = i * step
                exprs.append(f"CASE typeof({q}) WHEN 'integer' THEN {q} + {off} WHEN 'real' THEN {q} + {off} "
                             f"WHEN 'text' THEN CASE WHEN {q} <> '' AND {q} NOT GLOB '*[^0-9]*' AND length({q}) < 16 "
                             f"THEN CAST(CAST({q} AS INTEGER) + {off} AS TEXT) "
                             f"ELSE substr({q}, 1, 1) || '~{i}~' || substr({q}, 2) END ELSE {q} END")
            conn.execute(f"INSERT INTO main.{_q(t.name)} ({names}) SELECT {', '.join(exprs)} FROM s.{_q(t.name)}")
    conn.commit()
    for kind, _name, sql in schema:
        if kind != "table":
            conn.execute(sql)
    conn.commit()
    conn.execute("DETACH DATABASE s")
    conn.close()
    # On disk before it is mined, as a release's file is: not written back while mining is timed.
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": dst.stat().st_size, "build_s": round(time.perf_counter() - started, 2)}


def comparable(inv: Invariants, k: int) -> dict[str, Any]:
    """What must be equal between a copy at scale k and 1x: everything mined, row counts divided by k."""
    d = inv.to_dict()
    for key in ("path", "mine_s"):
        d.pop(key, None)
    for t in d["tables"]:
        t["rows"] = t["rows"] / k
    return d


# The child: one scale in a fresh interpreter (its peak RSS its own), one JSON line printed.
_CHILD = r"""
import json, resource, statistics, sys, time
from pathlib import Path
import t2sql
from t2sql.episode.presets import get_preset
from t2sql.equivalence.diskcache import DiskCache
from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.measure.run import quantiles, step_cost, step_cost_as_run

db, cache, pairs_file, preset = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
config = EquivalenceConfig.from_preset(get_preset(preset))
store = InvariantStore(DiskCache(cache))
t2sql.temp_usage(reset=True)
started = time.perf_counter()
inv = store.get(db)
mine_s = time.perf_counter() - started
temp_peak = t2sql.temp_usage()[1]
out = {"mine_s": round(mine_s, 2), "mine_temp_peak_mb": round(temp_peak / 2**20, 1), "invariants": inv.to_dict()}
checker = EquivalenceChecker(invariants=store, disk=DiskCache(cache))
times, verdicts, cpu = [], [], []
pairs = json.loads(Path(pairs_file).read_text())
for pair in pairs:
    cpu_at = time.thread_time()  # the check runs in this thread (as in t2sql equivalence --measure)
    report = checker.check_sync(db, pair["pred"], pair["gold"], config)
    cpu.append(time.thread_time() - cpu_at)
    times.append(report.elapsed_s)
    verdicts.append("refuted" if report.refuted else (report.skipped_reason or "checked"))
checker.close()
# With suites cached, as for a step's samples after its first: a checker holding nothing of the pass above,
# each gold's small databases built by a check of the gold against itself, then its pairs timed.
cached, first_cpu, cached_cpu, last = [], [], [], None
with EquivalenceChecker(invariants=store, disk=DiskCache(cache)) as checker:
    for pair in pairs:
        if pair["gold"] != last:
            cpu_at = time.thread_time()
            checker.check_sync(db, pair["gold"], pair["gold"], config)
            first_cpu.append(time.thread_time() - cpu_at)
            last = pair["gold"]
        cpu_at = time.thread_time()
        cached.append(checker.check_sync(db, pair["pred"], pair["gold"], config).elapsed_s)
        cached_cpu.append(time.thread_time() - cpu_at)
every, warm = quantiles(times), quantiles(cached)
out.update(first_check_s=round(times[0], 3) if times else None, p50_s=every["median"], p95_s=every["p95"],
           cached_checks=len(cached), p50_cached_s=warm["median"], p95_cached_s=warm["p95"],
           max_s=round(max(times), 3) if times else None, verdicts=verdicts, step=step_cost(cpu),
           step_as_run=step_cost_as_run(first_cpu, cached_cpu),
           peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
print(json.dumps(out))
"""


def derive_pairs(db: str, inv: Invariants, real_rows: Any, golds: list[str], config: Any,
                 limit: int | None) -> list[dict[str, str]]:
    """The pairs `t2sql equivalence --measure` derives from `golds`, those matching on `db` (1x)."""
    import t2sql
    from t2sql.equivalence.measure.derive import derive_mutations, derive_rewrites
    from t2sql.equivalence.measure.labels import label

    pairs: list[dict[str, str]] = []
    with t2sql.Database(db) as conn:
        for gold in golds:
            try:
                n = conn.count_rows(gold, config.spec.timeout_s)
            except t2sql.T2sqlError:
                n = None
            found = [(sql, "equivalent" if label(cat, gold, sql, inv, real_rows) == "equivalent"
                      else "false_positive", cat) for cat, sql in derive_mutations(gold, n, inv, real_rows)]
            found += [(sql, "equivalent", cat) for cat, sql in derive_rewrites(gold, inv)]
            for pred, kind, cat in found:
                if conn.grade(pred, gold, config.spec).outcome == "match":
                    pairs.append({"gold": gold, "pred": pred, "kind": kind, "category": cat})
    if limit is not None and len(pairs) > limit:
        stride = len(pairs) / limit
        pairs = [pairs[int(i * stride)] for i in range(limit)]
    return pairs


def bench_equivalence_scale(db_root: str, data: str, db_id: str, work: Path, scales: list[int], *,
                            preset: str = DEFAULT_PRESET, pairs_limit: int | None = None,
                            progress: Any = None) -> dict[str, Any]:
    """The bench (see the module doc): copies under `work`, each removed after its scale; each scale's
    cache (invariants, suite) is emptied before it, kept after."""
    from t2sql.episode.presets import get_preset
    from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
    from t2sql.equivalence.diskcache import DiskCache
    from t2sql.equivalence.invariant_store import InvariantStore
    from t2sql.tasks import database_path

    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    src = str(database_path(db_root, db_id))
    config = EquivalenceConfig.from_preset(get_preset(preset))
    rows = json.loads(Path(data).read_text())
    golds = [r["SQL"] for r in rows
             if isinstance(r, dict) and r.get("db_id") == db_id and isinstance(r.get("SQL"), str)]
    store = InvariantStore(DiskCache(work / "cache-derive"))
    inv = store.get(src)
    with EquivalenceChecker(invariants=store) as checker:
        real = checker.real_rows(src, inv)
        pairs = derive_pairs(src, inv, real.rows, golds, config, pairs_limit)
    pairs_file = work / "pairs.json"
    pairs_file.write_text(json.dumps(pairs))
    say(f"{len(pairs)} pairs from {len(golds)} golds of {db_id}")
    base = comparable(inv, 1)
    results = []
    for k in [1, *[s for s in scales if s != 1]]:
        db = work / f"x{k}" / db_id / f"{db_id}.sqlite"
        built = {"bytes": os.path.getsize(src), "build_s": 0.0} if k == 1 else scale_database(src, db, k, inv)
        path = src if k == 1 else str(db)
        say(f"{k}x: {built['bytes'] / 2**20:.0f} MiB built in {built['build_s']}s; mining and checking")
        cache = work / f"cache-x{k}"
        shutil.rmtree(cache, ignore_errors=True)  # mined afresh: its seconds are the measurement
        proc = subprocess.run([sys.executable, "-c", _CHILD, path, str(cache), str(pairs_file), preset],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            results.append({"scale": k, **built, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]})
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        mined = read_invariants(got.pop("invariants"))
        same = comparable(mined, k) == base
        verdicts = got.pop("verdicts")
        results.append({"scale": k, **built, **got, "invariants_equal_1x": same, "unsupported": mined.unsupported,
                        "verdicts": verdicts})
        say(f"{k}x: mined in {got['mine_s']}s, p50 {got['p50_s']}s, p95 {got['p95_s']}s")
        if k != 1 and db.exists():
            db.unlink()
    one = next((r["verdicts"] for r in results if r["scale"] == 1 and "verdicts" in r), None)
    for r in results:
        if one is not None and "verdicts" in r:
            r["verdicts_equal_1x"] = sum(a == b for a, b in zip(r["verdicts"], one))
            r["verdict_counts"] = {v: r["verdicts"].count(v) for v in sorted(set(r["verdicts"]))}
            r["differ"] = [{**pairs[i], "at_1x": one[i], "here": v}
                           for i, v in enumerate(r["verdicts"]) if v != one[i]][:10]
    for r in results:
        r.pop("verdicts", None)
    return {"db_id": db_id, "pairs": len(pairs), "preset": preset, "load": os.getloadavg(), "scales": results}


def format_equivalence_scale(report: dict[str, Any]) -> str:
    lines = [f"equivalence check on scaled copies of {report['db_id']} ({report['pairs']} derived pairs, preset "
             f"{report['preset']}; load at the end {', '.join(f'{x:.1f}' for x in report['load'])})", ""]
    head = (f"{'scale':>6}{'MiB':>9}{'build s':>9}{'mine s':>9}{'temp MiB':>10}{'1st s':>8}{'p50 s':>8}"
            f"{'p95 s':>8}{'cached p50':>11}{'p95':>7}{'CPU ms':>8}{'step':>7}{'as run':>7}{'RSS MiB':>9}"
            "  invariants  verdicts = 1x")
    lines += [head, "-" * len(head)]
    for r in report["scales"]:
        if "error" in r:
            lines.append(f"{r['scale']:>5}x  failed: {r['error']}")
            continue
        first = "-" if r["first_check_s"] is None else f"{r['first_check_s']:.3f}"
        inv = "equal" if r["invariants_equal_1x"] else "DIFFER"
        lines.append(f"{r['scale']:>5}x{r['bytes'] / 2**20:>9.1f}{r['build_s']:>9.1f}{r['mine_s']:>9.2f}"
                     f"{r['mine_temp_peak_mb']:>10.1f}{first:>8}{r['p50_s']:>8.3f}{r['p95_s']:>8.3f}"
                     f"{r['p50_cached_s']:>11.3f}{r['p95_cached_s']:>7.3f}"
                     f"{r['step']['cpu_mean_s'] * 1000:>8.1f}{r['step']['share_of_one_core']:>7.1%}"
                     f"{r['step_as_run']['share_of_one_core']:>7.1%}"
                     f"{r['peak_rss_mb']:>9.0f}  {inv:<10}  {r.get('verdicts_equal_1x', '-')}/{report['pairs']}")
    for r in report["scales"]:
        if r.get("verdict_counts"):
            lines.append(f"{r['scale']}x verdicts: " + ", ".join(f"{k} {n}" for k, n in r["verdict_counts"].items())
                         + (f"; unsupported: {r['unsupported']}" if r.get("unsupported") else ""))
        for d in r.get("differ", [])[:3]:
            lines.append(f"  {r['scale']}x differs ({d['at_1x']} at 1x, {d['here']} here): {d['pred'][:100]}")
    return "\n".join(lines)
