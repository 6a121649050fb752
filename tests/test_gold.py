"""`t2sql gold` as a user runs it: a real subprocess over the real BIRD dev split."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from conftest import bird_root

DATA_ROOT = bird_root()
DEV = DATA_ROOT / "dev.json"


def t2sql_gold(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "gold", *args],
        capture_output=True, text=True, timeout=300,
    )


def sqlite_row_count(db_id: str, sql: str) -> int:
    con = sqlite3.connect(f"file:{DATA_ROOT / db_id / (db_id + '.sqlite')}?mode=ro", uri=True)
    try:
        return len(con.execute(sql).fetchall())
    finally:
        con.close()


def test_gold_runs_the_split_fills_the_cache_and_reports(tmp_path):
    questions = json.loads(DEV.read_text())
    cache, report = tmp_path / "cache", tmp_path / "report.json"
    cold = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--cache-dir", str(cache),
                      "--report", str(report), "--json", "--concurrency", "2")
    assert cold.returncode == 0, cold.stderr
    summary = json.loads(cold.stdout)
    assert summary["queries"] == len(questions) and summary["failed"] == 0
    assert summary["computed"] == len(questions)
    assert len(summary["slowest"]) == min(10, len(questions))
    seconds = [s["seconds"] for s in summary["slowest"]]
    assert seconds == sorted(seconds, reverse=True) and seconds[-1] > 0

    records = json.loads(report.read_text())["queries"]
    assert [str(q["question_id"]) for q in questions] == [r["question_id"] for r in records]
    for q, r in list(zip(questions, records))[::25]:  # every 25th, checked against sqlite3
        assert r["rows"] == sqlite_row_count(q["db_id"], q["SQL"]), q["question_id"]
        assert r["error"] is None and r["columns"] >= 1 and r["seconds"] > 0

    manifest = json.loads((cache / "manifest.json").read_text())
    for db_id, entry in manifest["databases"].items():
        path = Path(manifest["db_root"]) / entry["path"]
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert entry["size"] == path.stat().st_size

    warm = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--cache-dir", str(cache), "--json")
    assert warm.returncode == 0, warm.stderr
    warm_summary = json.loads(warm.stdout)
    assert warm_summary["computed"] == 0 and warm_summary["from_cache"] == len(questions)
    # The slowest golds are still named from the cache: the time is kept with the digest.
    assert warm_summary["slowest"] == summary["slowest"]


def test_gold_reports_every_failure_and_exits_non_zero(tmp_path):
    good = {"label": {"gold_sql": "SELECT COUNT(*) FROM superhero", "db_id": "superhero", "question_id": "ok-1"},
            "metadata": {"db_id": "superhero"}}
    bird_style = {"question_id": 7, "db_id": "superhero", "SQL": "SELECT superhero_name FROM superhero LIMIT 3"}
    broken_sql = {"label": {"gold_sql": "SELECT nope FROM superhero", "db_id": "superhero", "question_id": "bad-sql"}}
    unknown_db = {"label": {"sql": "SELECT 1", "db_id": "atlantis", "question_id": "bad-db"}}
    no_sql = {"label": {"db_id": "superhero", "question_id": "no-sql"}}
    data = tmp_path / "split.jsonl"
    lines = [json.dumps(good), json.dumps(bird_style), "{this is not json", json.dumps(broken_sql),
             json.dumps(unknown_db), json.dumps(no_sql)]
    data.write_text("\n".join(lines) + "\n")
    report = tmp_path / "report.json"

    strict = t2sql_gold("--data", str(data), "--db-root", str(DATA_ROOT), "--report", str(report))
    assert strict.returncode == 1
    for needle in ("bad-sql", "no such column", "bad-db", "atlantis", "no-sql", "line 3"):
        assert needle in strict.stdout, needle
    records = {r["question_id"] or f"line{r['row']}": r for r in json.loads(report.read_text())["queries"]}
    assert records["ok-1"]["rows"] == 1 and records["ok-1"]["error"] is None
    assert records["7"]["rows"] == 3
    assert set(k for k, r in records.items() if r["error"]) == {"bad-sql", "bad-db", "no-sql", "line3"}

    lenient = t2sql_gold("--data", str(data), "--db-root", str(DATA_ROOT), "--allow-failures", "--json")
    assert lenient.returncode == 0
    assert json.loads(lenient.stdout)["failed"] == 4


def test_gold_notices_a_damaged_cache_entry(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"question_id": 1, "db_id": "superhero",
                                "SQL": "SELECT COUNT(*) FROM superhero WHERE height_cm > 200"}) + "\n")
    cache = tmp_path / "cache"
    args = ("--data", str(data), "--db-root", str(DATA_ROOT), "--cache-dir", str(cache), "--json")
    assert t2sql_gold(*args).returncode == 0
    (entry,) = (cache / "gold").rglob("*.digest")
    entry.write_bytes(entry.read_bytes()[:-7])
    again = t2sql_gold(*args)
    assert again.returncode == 0, again.stderr
    summary = json.loads(again.stdout)
    assert summary["cache_corrupt"] == 1 and summary["computed"] == 1
    assert "unusable" in again.stderr


def test_gold_refuses_bad_arguments(tmp_path):
    missing = t2sql_gold("--data", str(tmp_path / "nope.json"), "--db-root", str(DATA_ROOT))
    assert missing.returncode == 2 and "not found" in missing.stderr
    bad_root = t2sql_gold("--data", str(DEV), "--db-root", str(tmp_path / "nowhere"))
    assert bad_root.returncode == 2 and "not a directory" in bad_root.stderr
    bad_tmp = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--tmp-dir", str(tmp_path / "nowhere"))
    assert bad_tmp.returncode == 2 and "--tmp-dir" in bad_tmp.stderr and "Traceback" not in bad_tmp.stderr
    bad_mb = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--grade-memory-mb", "0")
    assert bad_mb.returncode == 2 and "at least 1 MiB" in bad_mb.stderr
    assert not list(tmp_path.iterdir()), "a refused run writes nothing"


def test_gold_takes_a_grading_memory_and_spills_under_its_tmp_dir(tmp_path):
    tmp = tmp_path / "spill"
    tmp.mkdir()
    run = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--method", "set", "--json",
                     "--grade-memory-mb", "1", "--tmp-dir", str(tmp))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["failed"] == 0
    assert list(tmp.iterdir()) == []


def test_processes_fill_one_cache_at_once(tmp_path):
    cache = tmp_path / "cache"
    args = [sys.executable, "-m", "t2sql.cli", "gold", "--data", str(DEV), "--db-root", str(DATA_ROOT),
            "--cache-dir", str(cache), "--json", "--concurrency", "1"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outputs]
    total = len(json.loads(DEV.read_text()))
    assert all(json.loads(out)["failed"] == 0 for out, _ in outputs)
    # Every entry any of them wrote is whole and made with the one shared secret.
    after = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--cache-dir", str(cache), "--json")
    summary = json.loads(after.stdout)
    assert summary["computed"] == 0 and summary["from_cache"] == total and summary["cache_corrupt"] == 0
    assert not list((cache / "gold").rglob("*.tmp"))


def test_bench_serving_smoke():
    run = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "bench", "serving", "--data", str(DEV), "--pairs", "12",
         "--tool-calls", "30", "--tasks", "4", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["pairs"] == 12
    assert all(row["not_matched"] == 0 for row in result["grades"].values())
    core = [row for name, row in result["grades"].items() if "core, no Grader" in name]
    assert len(core) == 2 and all(row["loop_max_stall_ms"] is None for row in core)
    for name, row in result["grades"].items():
        if row["loop_max_stall_ms"] is not None:
            assert 0 <= row["gc_max_pause_ms"], (name, row)
    assert "speedup" in core[1]
    assert result["rollout"]["not_matched"] == 0 and result["rollout"]["sql_calls"] == 4 * 6
    assert result["gold_precompute"]["warm"]["from_disk"] == result["gold_precompute"]["cold"]["computed"] > 0
    for path in ("python_sqlite3", "core_run_tool", "sqlite3_run_in_executor", "grader_async"):
        assert result["tool_latency"][path]["p50_us"] > 0
    floor = result["stall_floor"]
    assert floor["raw_sql_threads"]["threads"] == 2 or floor["raw_sql_threads"]["threads"] == os.cpu_count()
    assert floor["asyncio_tasks_only"]["tasks"] == 4
    for row in (floor["idle"], floor["raw_sql_threads"], floor["asyncio_tasks_only"]):
        assert 0 <= row["loop_p99_stall_ms"] <= row["loop_max_stall_ms"]


def test_a_cache_secret_of_the_wrong_size_is_one_clear_line(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "secret").write_bytes(b"short")
    (cache / "secret").chmod(0o600)
    proc = t2sql_gold("--data", str(DEV), "--db-root", str(DATA_ROOT), "--cache-dir", str(cache))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "holds 5 bytes, not a 32-byte hash secret" in proc.stderr


def test_bird_questions_find_their_databases_beside_the_file_and_any_method_is_taken(tmp_path):
    """As `t2sql eval` does: without --db-root a BIRD question file's databases are beside it; and
    --method takes every grading method `t2sql grade` takes."""
    from t2sql.tasks import sample_questions

    for method in ("auto", "list", "subset,>=,1"):
        proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "gold", "--data", str(sample_questions()),
                               "--method", method, "--json"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-500:]
        summary = json.loads(proc.stdout)
        assert summary["ok"] == 129 and summary["failures"] == [], method


def test_failures_are_listed_fifty_at_most_and_whole_in_json(tmp_path):
    # The recipe's train file without its databases: all 2,064 golds fail; a person reads 50 and a count.
    from t2sql.tasks import release_dir

    empty = tmp_path / "no-databases"
    empty.mkdir()
    cmd = [sys.executable, "-m", "t2sql.cli", "gold", "--data", str(release_dir() / "bird-verified-train.json"),
           "--db-root", str(empty), "--grading-method-fallback", "set", "--cache-dir", str(tmp_path / "cache")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    listed = [line for line in proc.stdout.splitlines() if "unknown db_id" in line]
    assert len(listed) == 50 and "... and 2014 more" in proc.stdout
    proc = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300)
    assert len(json.loads(proc.stdout)["failures"]) == 2064
