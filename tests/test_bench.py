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


def test_bench_pairs_smoke(tmp_path):
    """A tiny workload: every run reports, the records agree at 1 and 2 workers, and the verdicts are
    compared with BIRD's rule line by line."""
    proc = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "bench", "pairs", "--limit", "4", "--per-question", "12",
         "--work-dir", str(tmp_path), "--json"],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["questions"] == 4 and r["pairs"] == 4 * 12
    assert set(r["runs"]) == {"bird_python", "t2sql_n1", "t2sql_nN"}
    assert all(run["seconds"] > 0 for run in r["runs"].values())
    assert r["runs"]["t2sql_n1"]["golds_computed"] == r["runs"]["t2sql_nN"]["golds_computed"] == r["distinct_golds"]
    assert r["same_records_at_1_and_N"] is True
    a = r["agreement"]
    assert a["agree"] + a["disagree"] == r["pairs"] and a["agree_match"] + a["agree_non_match"] == a["agree"]
    assert a["agree_match"] >= 4  # each question's gold against itself, at least
    assert r["ratios"]["bird_over_t2sql_nN"] > 0 and len(r["effective_cores"]) == 2
    lines = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert len(lines) == r["pairs"] and len({line["id"] for line in lines}) == r["pairs"]


def test_bench_pairs_agreement_counts_both_ways():
    from t2sql.bench.pairs import agreement

    bird = ["match", "mismatch", "pred_error", "match", "timeout"]
    t2sql = [{"outcome": o, "detail": ""} for o in ("match", "match", "pred_error", "mismatch", "pred_timeout")]
    a = agreement(bird, t2sql, ["a", "b", "c", "d", "e"])
    assert (a["agree"], a["disagree"], a["agree_match"], a["agree_non_match"]) == (3, 2, 1, 2)
    assert (a["t2sql_match_bird_not"], a["bird_match_t2sql_not"], a["bird_errors_or_timeouts"]) == (1, 1, 2)
    assert [e["id"] for e in a["examples"]] == ["b", "d"]


def test_bench_pairs_bad_flags_are_usage_errors(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "pairs", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    for flags, said in ((["--concurrency", "0"], "at least 1"), (["--questions", str(tmp_path / "nope.json")],
                                                              "no such question file")):
        proc = run(*flags)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr
