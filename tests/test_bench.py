"""`t2sql bench grader` as a user runs it, on a small table (the numbers are the benchmark's
business; this checks every path runs, agrees, and is reported)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_grader_smoke(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "bench", "grader", "--rows", "3000", "--repeat", "1",
         "--work-dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    [size] = json.loads(proc.stdout)["sizes"]
    assert size["rows"] == 3000
    for name in ("sqlite_step", "t2sql_multiset", "t2sql_set", "t2sql_list", "t2sql_subset_all", "t2sql_subset_10",
                 "bird_python"):
        path = size["paths"][name]
        assert path["seconds"] > 0 and path["peak_mb"] > 0, name
    assert size["parallel"]["speedup"] > 0
    assert all(p["spill_mb"] == 0 for p in size["paths"].values()), "3,000 rows fit any budget"


def test_bench_grader_reports_the_spill_of_set_and_subset_past_the_budget(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "bench", "grader", "--rows", "40000", "--repeat", "1",
         "--work-dir", str(tmp_path), "--grade-memory-mb", "1", "--tmp-dir", str(spill),
         "--skip", "python_counter,bird_python,sqlite_except,sqlite_vm_sum,t2sql_list"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in proc.stdout.splitlines() if line.startswith("| ") and "path" not in line}
    # 40,000 distinct keys (640 KB) past a 1 MiB budget's 32,768: the set and subset digests
    # spill, the multiset digest and the stepping never do.
    assert float(rows["t2sql_set"][4]) > 0 and float(rows["t2sql_subset_all"][4]) > 0, proc.stdout
    assert float(rows["t2sql_multiset"][4]) == 0 and float(rows["sqlite_step"][4]) == 0
    assert "set/subset targets:" in proc.stdout and "grading memory 1 MiB" in proc.stdout
    assert list(spill.iterdir()) == []


def test_bench_grader_help_lists_its_paths_and_bad_flags_are_usage_errors():
    from t2sql.bench.grader import PATHS

    run = lambda *a: subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "grader", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    help_text = run("--help").stdout
    assert all(f"  {name} " in help_text for name in PATHS)
    for flags, said in ((["--skip", "t2sql_nope"], "unknown path(s) in --skip: t2sql_nope"),
                        (["--rows", "lots"], "--rows takes positive row counts"),
                        (["--rows", "0"], "--rows takes positive row counts"),
                        (["--grade-memory-mb", "0"], "the grading memory must be at least 1 MiB"),
                        (["--tmp-dir", "/nonexistent/t2sql"], "is not a directory")):
        proc = run(*flags)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
