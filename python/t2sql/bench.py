"""`t2sql bench`: benchmarks of the grading core, side by side with its peers, in one run.

    t2sql bench grader [--rows 1000000,5000000] [--work-dir DIR] [--json]
    t2sql bench serving ...   (the Grader at training scale: t2sql.bench_serving)

Every path of `grader` runs in a fresh process, so its wall time and its peak memory
(ru_maxrss of that process) are its own. Ratios are what carry between machines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOLD = "SELECT a, b, c, d FROM t"
PRED = "SELECT a, b, c, d FROM t WHERE a >= 0"  # the same rows through another plan

# name -> (what it measures, code run in the child; `db` is the path, prints nothing)
PATHS: dict[str, tuple[str, str]] = {
    "sqlite_step": (
        "SQLite stepping through both results, no value read (the limit)",
        "import t2sql\nd = t2sql.Database(db)\nassert d.count_rows(GOLD, 1e9) == d.count_rows(PRED, 1e9)",
    ),
    "t2sql_multiset": (
        "t2sql grade, multiset, float_digits=12",
        "import t2sql\nv = t2sql.Database(db).grade(PRED, GOLD, 'multiset', 12, 1e9)\nassert v.outcome == 'match', v",
    ),
    "t2sql_set": (
        "t2sql grade, set semantics, exact floats (BIRD's rule)",
        "import t2sql\nv = t2sql.Database(db).grade(PRED, GOLD, 'set', None, 1e9)\nassert v.outcome == 'match', v",
    ),
    "sqlite_vm_sum": (
        "SQLite VM touching every value: sum() of every column",
        "import sqlite3\nc = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "q = 'SELECT sum(a)+sum(b)+sum(c)+sum(length(d)) FROM ({})'\n"
        "assert c.execute(q.format(GOLD)).fetchone() == c.execute(q.format(PRED)).fetchone()",
    ),
    "sqlite_except": (
        "SQLite's EXCEPT (temporary index), set semantics, one direction",
        "import sqlite3\nc = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "assert c.execute(f'SELECT count(*) FROM ({GOLD} EXCEPT {PRED})').fetchone()[0] == 0",
    ),
    "bird_python": (
        "BIRD's rule in Python: fetchall + set equality",
        "import sqlite3\nc = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "assert set(c.execute(PRED).fetchall()) == set(c.execute(GOLD).fetchall())",
    ),
    "python_counter": (
        "Python multiset: fetchall + Counter equality",
        "import sqlite3\nfrom collections import Counter\n"
        "c = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "assert Counter(c.execute(PRED).fetchall()) == Counter(c.execute(GOLD).fetchall())",
    ),
}

PARALLEL = """
import threading, time, t2sql
def one():
    v = t2sql.Database(db).grade(PRED, GOLD, 'multiset', 12, 1e9)
    assert v.outcome == 'match', v
t = time.perf_counter(); one(); single = time.perf_counter() - t
threads = [threading.Thread(target=one) for _ in range(2)]
t = time.perf_counter()
for th in threads: th.start()
for th in threads: th.join()
pair = time.perf_counter() - t
print(json.dumps({"single_s": single, "pair_s": pair}))
"""


def build_table(path: Path, rows: int) -> None:
    """A table of `rows` rows × (INTEGER, INTEGER, REAL, TEXT), built once and reused."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".building")
    tmp.unlink(missing_ok=True)
    con = sqlite3.connect(tmp)
    con.execute("PRAGMA journal_mode=OFF")
    con.execute("PRAGMA synchronous=OFF")
    con.execute("CREATE TABLE t (a INTEGER, b INTEGER, c REAL, d TEXT)")
    con.execute(
        "WITH RECURSIVE n(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM n WHERE x + 1 < ?) "
        "INSERT INTO t SELECT x, x % 1000, x * 0.37 + 0.1, printf('row-%08d', x) FROM n",
        (rows,),
    )
    con.commit()
    con.close()
    os.replace(tmp, path)


def _child(code: str, db: Path) -> tuple[float, float, str]:
    """Run `code` in a fresh interpreter; return (seconds, peak MiB, stdout)."""
    prelude = f"import json\ndb = {str(db)!r}\nGOLD = {GOLD!r}\nPRED = {PRED!r}\n"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", prelude + code], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{code}")
    return elapsed, usage.ru_maxrss / 1024.0, out


def _startup() -> tuple[float, float]:
    """An interpreter that imports t2sql and sqlite3 and does nothing: subtracted from times."""
    best = min(_child("import t2sql, sqlite3", Path("/dev/null"))[0] for _ in range(3))
    return best, 0.0


def bench_grader(rows_list: list[int], work_dir: Path, repeat: int, skip: set[str]) -> dict:
    startup, _ = _startup()
    report: dict = {"startup_s": startup, "sqlite": _sqlite_version(), "sizes": []}
    for rows in rows_list:
        db = work_dir / f"bench_{rows}.sqlite"
        print(f"[bench] table of {rows:,} rows at {db}", file=sys.stderr)
        build_table(db, rows)
        entry: dict = {"rows": rows, "file_mb": db.stat().st_size / 2**20, "paths": {}}
        for name, (label, code) in PATHS.items():
            if name in skip:
                continue
            runs = repeat if name in ("sqlite_step", "t2sql_multiset", "t2sql_set") else 1
            times, peaks = [], []
            for _ in range(runs):
                t, peak, _ = _child(code, db)
                times.append(max(t - startup, 1e-9))
                peaks.append(peak)
            entry["paths"][name] = {"label": label, "seconds": min(times), "peak_mb": max(peaks)}
            print(f"[bench]   {name:<16} {min(times):8.3f}s  {max(peaks):7.1f} MiB", file=sys.stderr)
        _, _, out = _child(PARALLEL, db)
        par = json.loads(out)
        par["speedup"] = 2 * par["single_s"] / par["pair_s"]
        entry["parallel"] = par
        report["sizes"].append(entry)
    return report


def _sqlite_version() -> str:
    import t2sql

    return t2sql.sqlite_version()


def format_grader(report: dict) -> str:
    lines = [f"t2sql grader benchmark (SQLite {report['sqlite']}; interpreter start-up "
             f"{report['startup_s']:.3f}s subtracted; each path in its own process)"]
    for e in report["sizes"]:
        paths = e["paths"]
        limit = paths.get("sqlite_step", {}).get("seconds")
        lines.append("")
        lines.append(f"{e['rows']:,} rows × (INTEGER, INTEGER, REAL, TEXT), {e['file_mb']:.0f} MiB; gold + prediction")
        lines.append(f"| {'path':<16} | {'seconds':>8} | {'× limit':>8} | {'peak MiB':>8} |")
        lines.append(f"|{'-' * 18}|{'-' * 10}:|{'-' * 10}:|{'-' * 10}:|")
        for name, p in paths.items():
            ratio = f"{p['seconds'] / limit:.2f}" if limit else "-"
            lines.append(f"| {name:<16} | {p['seconds']:>8.3f} | {ratio:>8} | {p['peak_mb']:>8.1f} |")
        par = e["parallel"]
        t2 = paths.get("t2sql_multiset", {}).get("seconds")
        bird = paths.get("bird_python", {}).get("seconds")
        lines.append(f"2 grades on 2 threads: {par['speedup']:.2f}x the throughput of 1 "
                     f"({par['single_s']:.3f}s alone, {par['pair_s']:.3f}s for two)")
        if t2 and limit:
            lines.append(f"targets: t2sql/limit {t2 / limit:.2f} (≤ 1.5)"
                         + (f"; BIRD rule/t2sql {bird / t2:.1f}x (≥ 10)" if bird else "")
                         + f"; t2sql peak {paths['t2sql_multiset']['peak_mb']:.1f} MiB (< 64)"
                         + f"; parallel {par['speedup']:.2f}x (≥ 1.8)")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    g = suites.add_parser("grader", help="the grading core vs its peers on a large table")
    g.add_argument("--rows", default="1000000,5000000", help="table sizes, comma-separated")
    g.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "t2sql-bench"),
                   help="where the benchmark tables are built (and reused)")
    g.add_argument("--repeat", type=int, default=3, help="runs of the fast paths (best is kept)")
    g.add_argument("--skip", default="", help="comma-separated paths to skip (e.g. python_counter)")
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    s = suites.add_parser("serving", help="the Grader at training scale (tool latency, grades/s, loop stalls)")
    importlib.import_module("t2sql.bench_serving").add_arguments(s)


def run(args: argparse.Namespace) -> int:
    if args.suite == "serving":
        return importlib.import_module("t2sql.bench_serving").run(args)
    rows = [int(x) for x in str(args.rows).split(",") if x.strip()]
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    report = bench_grader(rows, Path(args.work_dir), max(1, args.repeat), skip)
    print(json.dumps(report, indent=2) if args.json else format_grader(report))
    return 0
