"""`t2sql bench equivalence-scale`'s copies: every invariant mined at 1x holds at k times the rows."""

from __future__ import annotations

import sqlite3

from conftest import bird_root
from t2sql.bench.equivalence_scale import comparable, scale_database
from t2sql.equivalence.diskcache import DiskCache
from t2sql.equivalence.invariant_store import InvariantStore

TOXICOLOGY = str(bird_root() / "toxicology" / "toxicology.sqlite")


def test_a_scaled_copy_keeps_every_invariant_mined_at_1x(tmp_path):
    one = InvariantStore(DiskCache(tmp_path / "a")).get(TOXICOLOGY)
    copy = tmp_path / "x3" / "toxicology.sqlite"
    scale_database(TOXICOLOGY, copy, 3, one)
    three = InvariantStore(DiskCache(tmp_path / "b")).get(str(copy))
    assert three.table("atom").rows == 3 * one.table("atom").rows
    assert comparable(three, 3) == comparable(one, 1)
    # the copies' names are new ones, and a copied text does not hold the original (LIKE finds only it)
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("SELECT count(*) FROM molecule WHERE molecule_id LIKE '%TR000%'").fetchone()[0] == 1
    finally:
        conn.close()


def test_the_bench_reports_each_scale_beside_1x(tmp_path):
    # End to end through the CLI, as docs/benchmarks.md runs it, on a small scale: the copy's invariants and
    # verdicts equal 1x's, and each scale reports its cost (the CPU per check and its share of a step too).
    import json
    import subprocess
    import sys

    from conftest import child_env

    root = bird_root()
    out = subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "equivalence-scale", "--db-root", str(root),
                          "--data", str(root / "dev.json"), "--db-id", "toxicology", "--scales", "2",
                          "--pairs-limit", "6", "--work-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=600, env=child_env())
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert [r["scale"] for r in report["scales"]] == [1, 2] and report["pairs"] == 6
    for r in report["scales"]:
        assert r["invariants_equal_1x"] and r["verdicts_equal_1x"] == 6
        assert r["p95_s"] >= r["p50_s"] > 0 and r["step"]["cpu_mean_s"] > 0
        assert r["cached_checks"] == 6 and r["p95_cached_s"] >= r["p50_cached_s"] > 0
        assert 0 < r["step_as_run"]["share_of_one_core"] and r["step_as_run"]["checks"] == r["step"]["checks"]
    assert not (tmp_path / "x2" / "toxicology" / "toxicology.sqlite").exists()  # each copy removed after its scale


def test_a_step_as_run_builds_one_gold_per_prompt():
    """64 prompts' first checks build (1 s each here), their 960 other samples find the suite cached."""
    from t2sql.equivalence.measure.run import STEP_S, step_cost_as_run

    got = step_cost_as_run([1.0, 1.0], [0.01, 0.03])
    assert got["checks"] == 1024 and got["cpu_s"] == round(64 * 1.0 + 960 * 0.02, 2)
    assert got["share_of_one_core"] == round(got["cpu_s"] / STEP_S, 4)
