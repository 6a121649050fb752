"""Set and subset grades past the grading memory budget: they spill to anonymous files and give
the verdicts they give in memory (the CI spill test; the 50M-row case is `t2sql bench grader
--rows 50000000`). Each case runs in a fresh interpreter: the budget is process-wide."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import t2sql

ROWS = 60_000


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spill") / "big.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE t (a INTEGER, b TEXT, c REAL)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", ((i, f"r{i % 5000}", i * 0.5) for i in range(ROWS)))
    con.commit()
    con.close()
    return path


# (pred, gold, method): both sides of each verdict, under set and subset.
CASES = [
    ("SELECT a, b FROM t UNION ALL SELECT a, b FROM t ORDER BY b", "SELECT a, b FROM t", "set"),
    ("SELECT a, b FROM t WHERE a <> 12345", "SELECT a, b FROM t", "set"),
    ("SELECT CASE WHEN a = 7 THEN 'x' ELSE b END, a FROM t", "SELECT b, a FROM t", "set"),
    ("SELECT b FROM t", "SELECT DISTINCT b FROM t", "set"),
    ("SELECT c, a FROM t ORDER BY c DESC", "SELECT c, a FROM t", "set"),
    ("SELECT a, b FROM t WHERE a % 3 = 0", "SELECT a, b FROM t", "subset,>=,20000"),
    ("SELECT a, b FROM t WHERE a % 3 = 0", "SELECT a, b FROM t", "subset,=,20000"),
    ("SELECT a, b FROM t WHERE a % 3 = 0", "SELECT a, b FROM t", "subset,>=,30000"),
    ("SELECT a + 1, b FROM t", "SELECT a, b FROM t", "subset,>=,5"),
    ("SELECT a, b FROM t LIMIT 5", "SELECT a, b FROM t", "subset,=,5"),
]

SCRIPT = """
import json, sys, t2sql
db, cases, budget, tmp = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if budget:
    t2sql.set_grade_memory(budget, tmp)
d = t2sql.Database(db)
out = []
for pred, gold, method in cases:
    v = d.grade(pred, gold, t2sql.GradeSpec(method, float_digits=12, timeout_s=60))
    out.append([v.outcome, v.pred_rows, v.gold_rows])
print(json.dumps({"verdicts": out, "usage": t2sql.spill_usage()}))
"""


def _run(db: Path, budget: int, tmp: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(db), json.dumps(CASES), str(budget), str(tmp)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_set_and_subset_past_a_tiny_budget_spill_and_agree_with_memory(db, tmp_path):
    tmp = tmp_path / "spill"
    tmp.mkdir()
    in_memory = _run(db, 0, tmp)
    spilled = _run(db, 64 * 1024, tmp)
    outcomes = [v[0] for v in in_memory["verdicts"]]
    assert outcomes == ["match", "mismatch", "mismatch", "match", "match",
                        "match", "match", "mismatch", "mismatch", "match"], outcomes
    assert spilled["verdicts"] == in_memory["verdicts"]
    now, peak = spilled["usage"]
    assert in_memory["usage"] == [0, 0], "60,000 keys fit the default budget"
    assert now == 0 and peak >= 16 * ROWS, spilled["usage"]
    assert list(tmp.iterdir()) == [], "spill files are anonymous: nothing is left behind"


def test_a_spill_that_cannot_be_written_is_a_spill_error_that_says_what_to_do(db, tmp_path):
    tmp = tmp_path / "gone"
    tmp.mkdir()
    script = textwrap.dedent(f"""
        import os, t2sql
        t2sql.set_grade_memory(64 * 1024, {str(tmp)!r})
        os.rmdir({str(tmp)!r})
        d = t2sql.Database({str(db)!r})
        try:
            d.grade("SELECT a FROM t", "SELECT a FROM t", t2sql.GradeSpec("set"))
        except t2sql.SpillError as e:
            print("SpillError:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("SpillError:") and str(tmp) in proc.stdout and "--tmp-dir" in proc.stdout


def test_the_budget_is_checked_and_reported():
    before = t2sql.grade_memory()
    assert before[0] == t2sql._grader.GRADE_DEFAULTS["memory_mb"] * 2**20
    with pytest.raises(t2sql.InvalidArgument, match="at least 64 KiB"):
        t2sql.set_grade_memory(1000)
    with pytest.raises(t2sql.InvalidArgument, match="not a directory"):
        t2sql.set_grade_memory(2**20, "/nonexistent/t2sql")
    assert t2sql.grade_memory() == before


def test_a_grader_hands_its_budget_to_its_worker_processes(db, tmp_path):
    tmp = tmp_path / "spill"
    tmp.mkdir()
    spec = t2sql.GradeSpec("set", timeout_s=60)
    before = t2sql.grade_memory()
    with pytest.raises(ValueError, match="not a directory"):
        t2sql.Grader(backend="process", concurrency=1, grade_memory_mb=1, tmp_dir=tmp / "missing")
    with t2sql.Grader(backend="process", concurrency=1, grade_memory_mb=1, tmp_dir=tmp) as grader:
        r = grader.grade_sync(str(db), CASES[0][0], CASES[0][1], spec)
        assert r.outcome == "match", r
        r = grader.grade_sync(str(db), CASES[1][0], CASES[1][1], spec)
        assert r.outcome == "mismatch", r
        # The worker spills where it was told: with the directory gone, its next spill fails.
        tmp.rmdir()
        with pytest.raises(t2sql.SpillError, match="could not spill"):
            grader.grade_sync(str(db), CASES[4][0], CASES[4][1], spec)
    assert t2sql.grade_memory() == before, "a process backend leaves this process's setting alone"


def test_a_thread_grader_holds_its_budget_while_open_and_a_cache_dir_does_not_move_it(db, tmp_path):
    tmp = tmp_path / "spill"
    tmp.mkdir()
    before = t2sql.grade_memory()
    with t2sql.Grader(concurrency=1, grade_memory_mb=2, tmp_dir=tmp):
        assert t2sql.grade_memory() == (2 * 2**20, tmp)
    assert t2sql.grade_memory() == before
    with t2sql.Grader(concurrency=1, cache_dir=tmp_path / "cache") as grader:
        assert t2sql.grade_memory() == before
        r = grader.grade_sync(str(db), CASES[0][0], CASES[0][1], t2sql.GradeSpec("set", timeout_s=60))
        assert r.outcome == "match", r
    assert t2sql.grade_memory() == before


def test_t2sql_grade_takes_the_budget_for_one_pair_and_for_pairs(db, tmp_path):
    tmp = tmp_path / "spill"
    tmp.mkdir()
    grade = lambda *a: subprocess.run([sys.executable, "-m", "t2sql.cli", "grade", *a],  # noqa: E731
                                      capture_output=True, text=True, timeout=300)
    memory = ("--grade-memory-mb", "1", "--tmp-dir", str(tmp))
    one = grade("--db", str(db), "--pred", CASES[0][0], "--gold", CASES[0][1], "--method", "set", *memory)
    assert one.returncode == 0 and one.stdout.startswith("match"), one.stdout + one.stderr
    root = tmp_path / "dbs"
    (root / "big").mkdir(parents=True)
    (root / "big" / "big.sqlite").symlink_to(db)
    pairs, out = tmp_path / "pairs.jsonl", tmp_path / "out.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "db_id": "big", "pred": p, "gold": g, "grading_method": m}) + "\n"
                             for i, (p, g, m) in enumerate(CASES)))
    many = grade("--pairs", str(pairs), "--db-root", str(root), "--out", str(out), "--method", "task",
                 "--concurrency", "2", *memory)
    assert many.returncode == 0, many.stderr
    outcomes = [json.loads(line)["outcome"] for line in out.read_text().splitlines()]
    assert outcomes == ["match", "mismatch", "mismatch", "match", "match",
                        "match", "match", "mismatch", "mismatch", "match"]
    assert list(tmp.iterdir()) == []
    bad = grade("--db", str(db), "--pred", "SELECT 1", "--gold", "SELECT 1", "--tmp-dir", str(tmp / "no"))
    assert bad.returncode == 2 and "--tmp-dir" in bad.stderr and "Traceback" not in bad.stderr
