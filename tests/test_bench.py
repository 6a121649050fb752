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


def test_bench_grader_help_lists_its_paths_and_bad_flags_are_usage_errors():
    from t2sql.bench.grader import PATHS

    run = lambda *a: subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "grader", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    help_text = run("--help").stdout
    assert all(f"  {name} " in help_text for name in PATHS)
    for flags, said in ((["--skip", "t2sql_nope"], "unknown path(s) in --skip: t2sql_nope"),
                        (["--rows", "lots"], "--rows takes positive row counts"),
                        (["--rows", "0"], "--rows takes positive row counts")):
        proc = run(*flags)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
