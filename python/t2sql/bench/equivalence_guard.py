"""`t2sql bench equivalence-guard`: the equivalence check under the red team's predictions (issue 35), each case in
a fresh interpreter: seconds against the check's budget, RSS, temporary disk, the verdict, and how soon a cancelled
check frees its worker. The cases and targets:
docs/benchmarks.md, "The equivalence check under red-team predictions"."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

GOLD = "SELECT name FROM t WHERE id = 1"

CASES: dict[str, str] = {
    "zeroblob": "length(hex(zeroblob(400000000))) > 0",
    "temp": "(SELECT count(*) FROM (SELECT printf('%.*c', 100000, 'x') || id AS b FROM t GROUP BY b)) < 0",
    "instr": "instr(printf('%.*c', 20000 + id, 'a'), printf('%.*c', 10000, 'a') || 'b') > 0",
}

# What the cancel case's check runs: seconds a row in any SQLite, many VM steps each (the cancel lands
# between them).
SLOW_X = ("(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 100000 + id) "
          "SELECT count(*) FROM c) < 0")

TARGET_EXTRA_S = 5.0
TARGET_RSS_MIB = 1024
TARGET_FREED_S = 1.0


def prediction(x: str) -> str:
    return f"SELECT name FROM t WHERE id = 1 AND (id = 1 OR {x})"


def make_database(path: Path, rows: int) -> None:
    """A table of `rows` rows: an integer key, a short name, a number, and 4 kB of distinct text."""
    if path.exists():
        path.unlink()
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT NOT NULL, n INTEGER, body TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)",
                     ((i, f"name {i}", i % 97, f"{i:08d}" + os.urandom(2046).hex()) for i in range(1, rows + 1)))
    conn.commit()
    conn.close()


# The child: one case in a fresh interpreter, its numbers printed as one JSON line.
_CHILD = r"""
import asyncio, json, os, sys, threading, time
from pathlib import Path
import t2sql
from t2sql.episode.presets import get_preset
from t2sql.equivalence.diskcache import DiskCache
from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
from t2sql.equivalence.job import check_on
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.mine_ahead import mine_ahead
from t2sql.bench.equivalence_guard import GOLD, SLOW_X, prediction, CASES

case, db, cache = sys.argv[1], sys.argv[2], Path(sys.argv[3])
mining_mb, cancel_after = int(sys.argv[4]), float(sys.argv[5])
config = EquivalenceConfig.from_preset(get_preset())

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

peak = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.01)

out = {"case": case, "budget_s": config.budget_s, "max_temp_mb": config.spec.max_temp_mb}
if case == "cancel":
    mine_ahead([db], progress=False)  # training's checks never mine: `t2sql gold` mines ahead
    async def main():
        with t2sql.Grader(concurrency=1) as grader:
            await check_on(grader, db, GOLD, GOLD, config)  # warm: invariants, suite, the gold's databases
            slow = EquivalenceConfig(config.suite_size, config.seed, 60.0, config.spec)
            check = asyncio.ensure_future(check_on(grader, db, prediction(SLOW_X), GOLD, slow))
            await asyncio.sleep(cancel_after)
            running = not check.done()
            check.cancel()
            cancelled = time.monotonic()
            tool = await grader.run_tool(db, "SELECT count(*) FROM t", t2sql.get_preset().tool_limits)
            return running, time.monotonic() - cancelled, tool.row_count
    running, freed, rows = asyncio.run(main())
    out.update(running_at_cancel=running, freed_after_s=round(freed, 3), tool_rows=rows)
else:
    checker = EquivalenceChecker(disk=DiskCache(cache))
    if case == "mining":
        base = rss()
        store = InvariantStore(DiskCache(cache), max_temp_mb=mining_mb)
        t2sql.temp_usage(reset=True)
        threading.Thread(target=sample, daemon=True).start()
        started = time.monotonic()
        inv = store.get(db)
        elapsed = time.monotonic() - started
        stop.set()
        out.update(elapsed_s=round(elapsed, 3), max_temp_mb=mining_mb, unsupported=inv.unsupported)
    else:
        checker.check_sync(db, GOLD, GOLD, config)  # warm
        base = rss()
        t2sql.temp_usage(reset=True)
        threading.Thread(target=sample, daemon=True).start()
        started = time.monotonic()
        report = checker.check_sync(db, prediction(CASES[case]), GOLD, config)
        elapsed = time.monotonic() - started
        stop.set()
        out.update(elapsed_s=round(elapsed, 3), refuted=report.refuted, skipped=report.skipped_reason or "",
                   detail=report.detail[:200], databases=report.databases)
    time.sleep(0.02)
    out.update(rss_base_mb=round(base / 2**20, 1), rss_growth_mb=round(max(0, peak[0] - base) / 2**20, 1),
               temp_peak_mb=round(t2sql.temp_usage()[1] / 2**20, 1))
print(json.dumps(out))
"""


def bench_equivalence_guard(work: Path, *, rows: int = 20_000, mining_temp_mb: int = 32,
                            cancel_after_s: float = 3.0, cases: list[str] | None = None) -> dict[str, Any]:
    """Every case in its own interpreter (see the module doc); the database is built in `work` and removed."""
    db = work / "redteam.sqlite"
    make_database(db, rows)
    results = []
    try:
        with tempfile.TemporaryDirectory(dir=work) as cache:
            for case in cases or [*CASES, "mining", "cancel"]:
                # The same warm cache for every case but mining, which mines afresh.
                where = str(Path(cache) / ("mining" if case == "mining" else "shared"))
                proc = subprocess.run([sys.executable, "-c", _CHILD, case, str(db), where, str(mining_temp_mb),
                                       str(cancel_after_s)], capture_output=True, text=True, timeout=900,
                                      env={**os.environ, "T2SQL_EQUIVALENCE_CACHE": where})
                if proc.returncode != 0:
                    results.append({"case": case, "error": proc.stderr.strip().splitlines()[-1:]})
                    continue
                results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        db.unlink(missing_ok=True)
    for r in results:
        if "error" in r:
            r["ok"] = False
        elif r["case"] == "cancel":
            r["ok"] = r["running_at_cancel"] and r["freed_after_s"] < TARGET_FREED_S
        else:
            within = r["case"] == "mining" or (r["elapsed_s"] <= r["budget_s"] + TARGET_EXTRA_S
                                               and r["skipped"] != "check_error")
            r["ok"] = within and r["rss_growth_mb"] <= TARGET_RSS_MIB and r["temp_peak_mb"] <= r["max_temp_mb"]
    return {"rows": rows, "cases": results, "ok": all(r["ok"] for r in results)}


def format_equivalence_guard(report: dict[str, Any]) -> str:
    lines = [f"equivalence check under red-team predictions ({report['rows']} rows); targets: budget + "
             f"{TARGET_EXTRA_S:g} s, RSS +{TARGET_RSS_MIB} MiB, temp <= the per-query cap, cancel frees the worker "
             f"in < {TARGET_FREED_S:g} s", ""]
    head = f"{'case':<10}{'seconds':>9}{'budget':>8}{'RSS +MiB':>10}{'temp MiB':>10}{'cap MiB':>9}  verdict"
    lines += [head, "-" * (len(head) + 20)]
    for r in report["cases"]:
        if "error" in r:
            lines.append(f"{r['case']:<10} failed: {r['error']}")
        elif r["case"] == "cancel":
            lines.append(f"{'cancel':<10} worker answered {r['freed_after_s']:.3f} s after the cancel "
                         f"(running at cancel: {r['running_at_cancel']})  {'ok' if r['ok'] else 'MISSED'}")
        else:
            verdict = ((r["unsupported"] or "every invariant verified")[:60] if r["case"] == "mining"
                       else "refuted" if r["refuted"] else f"not refuted ({r['skipped'] or 'checked'})")
            budget = "-" if r["case"] == "mining" else f"{r['budget_s']:g}"
            lines.append(f"{r['case']:<10}{r['elapsed_s']:>9.2f}{budget:>8}{r['rss_growth_mb']:>10.1f}"
                         f"{r['temp_peak_mb']:>10.1f}{r['max_temp_mb']:>9}  {verdict}  {'ok' if r['ok'] else 'MISSED'}")
    lines.append("")
    lines.append("all within their targets" if report["ok"] else "SOME CASES MISSED THEIR TARGETS")
    return "\n".join(lines)
