"""`t2sql bench`: benchmarks of the grading core, side by side with its peers, in one run (`t2sql bench grader`;
the Grader at training scale is t2sql.bench.serving). Every path runs in a fresh process, so its wall time, peak
memory and peak temporary disk are its own; `baseline` is what a path's process holds before it grades anything.
docs/benchmarks.md has the commands and the numbers."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import t2sql
from t2sql._grader import GRADE_DEFAULTS
from t2sql.atomic import check_path

GOLD = "SELECT a, b, c, d FROM t"
PRED = "SELECT a, b, c, d FROM t WHERE a >= 0"  # the same rows through another plan

# name -> (what it measures, code run in the child; `db` is the path, prints nothing)
PATHS: dict[str, tuple[str, str]] = {
    "baseline": (
        "the interpreter, t2sql and an open Database, nothing graded: every path's starting memory",
        "d = t2sql.Database(db)\nassert d.count_rows('SELECT 1', 1e9) == 1",
    ),
    "sqlite_step": (
        "SQLite stepping through both results, no value read (the limit)",
        "d = t2sql.Database(db)\nassert d.count_rows(GOLD, 1e9) == d.count_rows(PRED, 1e9)",
    ),
    "t2sql_multiset": (
        f"t2sql grade, multiset, float_digits={GRADE_DEFAULTS['float_digits']}",
        "v = t2sql.Database(db).grade(PRED, GOLD, t2sql.GradeSpec('multiset', timeout_s=1e9))\n"
        "assert v.outcome == 'match', v",
    ),
    "t2sql_set": (
        "t2sql grade, the set method, exact floats (BIRD's rule)",
        "v = t2sql.Database(db).grade(PRED, GOLD, t2sql.GradeSpec('set', float_digits=None, timeout_s=1e9))\n"
        "assert v.outcome == 'match', v",
    ),
    "t2sql_list": (
        "t2sql grade, ordered (list): the rows in the same order, host loop",
        "v = t2sql.Database(db).grade(PRED, GOLD, t2sql.GradeSpec('list', timeout_s=1e9))\n"
        "assert v.outcome == 'match', v",
    ),
    "t2sql_subset_all": (
        "t2sql grade, subset,>=,1000: every row of the prediction checked against the gold's keys",
        "spec = t2sql.GradeSpec('subset,>=,1000', timeout_s=1e9)\n"
        "v = t2sql.Database(db).grade(PRED, GOLD, spec)\n"
        "assert v.outcome == 'match', v",
    ),
    "t2sql_subset_10": (
        "t2sql grade, subset,=,10 against a 10-row prediction (the usual 'name any ten')",
        "spec = t2sql.GradeSpec('subset,=,10', timeout_s=1e9)\n"
        "v = t2sql.Database(db).grade(PRED + ' LIMIT 10', GOLD, spec)\n"
        "assert v.outcome == 'match', v",
    ),
    "sqlite_vm_sum": (
        "SQLite VM touching every value: sum() of every column",
        "c = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "q = 'SELECT sum(a)+sum(b)+sum(c)+sum(length(d)) FROM ({})'\n"
        "assert c.execute(q.format(GOLD)).fetchone() == c.execute(q.format(PRED)).fetchone()",
    ),
    "sqlite_except": (
        "SQLite's EXCEPT (temporary index), the set method, one direction",
        "c = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "assert c.execute(f'SELECT count(*) FROM ({GOLD} EXCEPT {PRED})').fetchone()[0] == 0",
    ),
    "bird_python": (
        "BIRD's rule in Python: fetchall + set equality",
        "c = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "assert set(c.execute(PRED).fetchall()) == set(c.execute(GOLD).fetchall())",
    ),
    "python_counter": (
        "Python multiset: fetchall + Counter equality",
        "c = sqlite3.connect(f'file:{db}?mode=ro&immutable=1', uri=True)\n"
        "assert Counter(c.execute(PRED).fetchall()) == Counter(c.execute(GOLD).fetchall())",
    ),
}

# Paths cheap enough to repeat (best of --repeat); the Python peers take tens of seconds.
FAST_PATHS = ("baseline", "sqlite_step", "t2sql_multiset", "t2sql_set", "t2sql_list", "t2sql_subset_all",
              "t2sql_subset_10", "sqlite_vm_sum")

# Every t2sql path grades with the core's default float digits (GRADE_DEFAULTS, 12: t2sql grade's too).
PARALLEL = """
def one():
    v = t2sql.Database(db).grade(PRED, GOLD, t2sql.GradeSpec('multiset', timeout_s=1e9))
    assert v.outcome == 'match', v
def pair():
    threads = [threading.Thread(target=one) for _ in range(2)]
    for th in threads: th.start()
    for th in threads: th.join()
def timed(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t
# Interleaved, best of REPEAT each: both sides see the same machine.
single = pair_s = float('inf')
for _ in range(REPEAT):
    single = min(single, timed(one))
    pair_s = min(pair_s, timed(pair))
print(json.dumps({"single_s": single, "pair_s": pair_s}))
"""


def build_table(path: Path, rows: int) -> None:
    """A table of `rows` rows × (INTEGER, INTEGER, REAL, TEXT), built once and reused: a regular file at
    `path` is read, never written; anything else there is refused (t2sql.atomic's rule). It is built in a
    temporary file of its own beside `path` (removed on any error or interrupt) and moved into place."""
    where = f"--work-dir's {path}"
    if check_path(path, where, "choose another --work-dir")[1] is not None:
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
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
        if check_path(path, where, "choose another --work-dir")[1] is None:  # nothing came there meanwhile
            os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


# The peers that fetch whole results into Python: past this size they would need tens of GB.
PYTHON_PEERS = ("bird_python", "python_counter")
PYTHON_PEERS_MAX_ROWS = 10_000_000


def _child(code: str, db: Path, repeat: int = 1, memory: tuple[int, str | None] | None = None
           ) -> tuple[float, float, float, str]:
    """Run `code` in a fresh interpreter; return (seconds of `code` alone, peak MiB of the
    process, peak MiB of its spill files, what `code` printed). Imports, and the grading memory
    setting, happen before the clock starts."""
    setting = f"t2sql.set_grade_memory({memory[0]}, {memory[1]!r})\n" if memory else ""
    prelude = (
        "import json, sqlite3, threading, time\nfrom collections import Counter\nimport t2sql\n"
        f"{setting}db = {str(db)!r}\nGOLD = {GOLD!r}\nPRED = {PRED!r}\nREPEAT = {repeat}\n"
        "_t0 = time.perf_counter()\n"
    )
    epilogue = ("\n_t1 = time.perf_counter()\nprint('T2SQL_BENCH_SPILL', t2sql.spill_usage()[1])\n"
                "print('T2SQL_BENCH_SECONDS', _t1 - _t0)\n")
    proc = subprocess.Popen([sys.executable, "-c", prelude + code + epilogue], stdout=subprocess.PIPE, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"benchmark child failed ({os.waitstatus_to_exitcode(status)}):\n{code}")
    lines = out.splitlines()
    seconds = float(lines[-1].split()[1])
    spill = float(lines[-2].split()[1]) / 2**20
    return seconds, usage.ru_maxrss / 1024.0, spill, "\n".join(lines[:-2])


def bench_grader(rows_list: list[int], work_dir: Path, repeat: int, skip: set[str],
                 memory: tuple[int, str | None] | None = None) -> dict:
    """`memory`: the grading memory (bytes, spill directory) every path runs under; None: the core's default."""
    report: dict = {"sqlite": _sqlite_version(), "sizes": [],
                    "grade_memory_mb": (memory[0] if memory else t2sql.grade_memory()[0]) / 2**20}
    for rows in rows_list:
        db = work_dir / f"bench_{rows}.sqlite"
        print(f"[bench] table of {rows:,} rows at {db}", file=sys.stderr)
        build_table(db, rows)
        entry: dict = {"rows": rows, "file_mb": db.stat().st_size / 2**20, "paths": {}, "skipped": []}
        # The fast paths run `repeat` times, round-robin, so a noisy moment on a shared machine
        # hits all of them alike; the best run of each is kept. The slow peers run once.
        chosen = [name for name in PATHS if name not in skip]
        if rows > PYTHON_PEERS_MAX_ROWS:
            entry["skipped"] = [n for n in chosen if n in PYTHON_PEERS]
            chosen = [n for n in chosen if n not in PYTHON_PEERS]
        rounds = [[n for n in chosen if n in FAST_PATHS]] * repeat + [[n for n in chosen if n not in FAST_PATHS]]
        times: dict[str, list[float]] = {n: [] for n in chosen}
        peaks: dict[str, list[float]] = {n: [] for n in chosen}
        disks: dict[str, list[float]] = {n: [] for n in chosen}
        for names in rounds:
            for name in names:
                t, peak, disk, _ = _child(PATHS[name][1], db, memory=memory)
                times[name].append(t)
                peaks[name].append(peak)
                disks[name].append(disk)
        for name in chosen:
            best, peak, disk = min(times[name]), max(peaks[name]), max(disks[name])
            entry["paths"][name] = {"label": PATHS[name][0], "seconds": best, "peak_mb": peak, "spill_mb": disk}
            print(f"[bench]   {name:<16} {best:8.3f}s  {peak:7.1f} MiB  {disk:7.1f} MiB spilled", file=sys.stderr)
        _, _, _, out = _child(PARALLEL, db, repeat, memory=memory)
        par = json.loads(out)
        par["speedup"] = 2 * par["single_s"] / par["pair_s"]
        entry["parallel"] = par
        report["sizes"].append(entry)
    return report


def _sqlite_version() -> str:
    return t2sql.sqlite_version()


def format_grader(report: dict) -> str:
    lines = [f"t2sql grader benchmark (SQLite {report['sqlite']}; each path in its own process, "
             "timed inside it after its imports; peak = that process's max RSS, above = peak minus the "
             f"baseline's; spilled = the most its spill files held; grading memory "
             f"{report.get('grade_memory_mb', 0):g} MiB)"]
    for e in report["sizes"]:
        paths = e["paths"]
        limit = paths.get("sqlite_step", {}).get("seconds")
        base = paths.get("baseline", {}).get("peak_mb")
        lines.append("")
        lines.append(f"{e['rows']:,} rows × (INTEGER, INTEGER, REAL, TEXT), {e['file_mb']:.0f} MiB; gold + prediction")
        lines.append(f"| {'path':<16} | {'seconds':>8} | {'× limit':>8} | {'peak MiB':>8} | {'above':>6} "
                     f"| {'spilled MiB':>11} |")
        lines.append(f"|{'-' * 18}|{'-' * 10}:|{'-' * 10}:|{'-' * 10}:|{'-' * 8}:|{'-' * 13}:|")
        for name, p in paths.items():
            ratio = f"{p['seconds'] / limit:.2f}" if limit and name != "baseline" else "-"
            above = f"{p['peak_mb'] - base:.1f}" if base is not None else "-"
            lines.append(f"| {name:<16} | {p['seconds']:>8.3f} | {ratio:>8} | {p['peak_mb']:>8.1f} | {above:>6} "
                         f"| {p.get('spill_mb', 0.0):>11.1f} |")
        if e.get("skipped"):
            lines.append(f"not run at this size (they hold the whole result in Python): {', '.join(e['skipped'])}")
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
        targets = [(name, cap) for name, cap in (("t2sql_set", 2.0), ("t2sql_subset_all", 2.5)) if name in paths]
        if limit and targets:
            parts = [f"{name[6:]}/limit {paths[name]['seconds'] / limit:.2f} (≤ {cap})" for name, cap in targets]
            if base is not None:
                worst = max(paths[name]["peak_mb"] - base for name, _ in targets)
                parts.append(f"peak above baseline {worst:.1f} MiB (≤ 64)")
            lines.append("set/subset targets: " + "; ".join(parts))
    return "\n".join(lines)


