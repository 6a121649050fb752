"""`t2sql grade --pairs` on several workers: the same records as the sequential grade, in order, each
gold run once, gold digests kept across runs with --cache-dir; on the bundled superhero sample."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import t2sql.commands.grade as grade_command
from t2sql.cli import main
from t2sql.grading import grade
from t2sql.serving.grader import Grader
from t2sql.tasks import database_path, sample_dir, sample_questions

ROOT = sample_dir()
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"
# About a quarter of a second on the sample: a slow line ahead of fast ones.
SLOW = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r WHERE x < 1500000) SELECT COUNT(*) FROM r"


def t2sql(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t2sql.cli", *args], capture_output=True, text=True, timeout=300)


def workload(n_questions: int = 24) -> list[dict | str]:
    """Many lines per gold: the gold, near misses, other questions' golds, errors, a slow line, bad
    lines, a missing database, per-line grading methods."""
    questions = json.loads(sample_questions().read_text())[:n_questions]
    lines: list[dict | str] = [{"id": "slow", "db_id": "superhero", "pred": SLOW, "gold": "SELECT 1"}]
    for i, q in enumerate(questions):
        gold, other = q["SQL"], questions[(i + 1) % len(questions)]["SQL"]
        for kind, pred in (("gold", gold), ("limit", gold + " LIMIT 1"), ("other", other),
                           ("distinct", gold.replace("SELECT", "SELECT DISTINCT", 1)), ("syntax", "SELEC 1"),
                           ("unsafe", "DELETE FROM superhero")):
            lines.append({"id": f"{q['question_id']}/{kind}", "db_id": "superhero", "pred": pred, "gold": gold})
        if i % 6 == 0:
            lines.append({"id": f"{i}/ordered", "db_id": "superhero", "pred": gold, "gold": gold,
                          "grading_method": "ordered"})
            lines.append("{not json")
            lines.append({"id": f"{i}/gone", "db_id": "no_such_db", "pred": "SELECT 1", "gold": "SELECT 1"})
            lines.append({"id": f"{i}/broken_gold", "db_id": "superhero", "pred": "SELECT 1",
                          "gold": "SELECT nope FROM superhero"})
    return lines


def write(tmp_path, lines: list[dict | str], name: str = "pairs.jsonl"):
    path = tmp_path / name
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def sequential_records(lines: list[dict | str], semantics: str = "multiset") -> bytes:
    """What `t2sql grade --pairs` wrote before it graded on workers: t2sql.grade, line by line."""
    out = []
    for lineno, x in enumerate(lines, 1):
        if isinstance(x, str):
            record = {"id": None, "line": lineno, "outcome": "bad_input", "detail": "not JSON (Expecting property "
                      "name enclosed in double quotes)"}
        else:
            path = database_path(ROOT, x["db_id"])
            if not path.exists():
                record = None  # the detail is the core's; checked apart
            else:
                method = x.get("grading_method") or "multiset" if semantics == "task" else semantics
                v = grade(str(path), x["pred"], x["gold"], method, 12, 30.0, "strict")
                record = {"id": x["id"], "outcome": v.outcome, "detail": v.detail, "semantics": v.semantics,
                          "line": lineno}
        out.append(record)
    return out


def test_records_are_the_sequential_ones_in_order_at_1_and_2_workers(tmp_path):
    lines = workload()
    pairs = write(tmp_path, lines)
    expected = sequential_records(lines, "task")
    outputs = {}
    for n in (1, 2):
        out = tmp_path / f"v{n}.jsonl"
        proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--semantics", "task",
                     "--concurrency", str(n), "--json")
        assert proc.returncode == 1, proc.stderr  # the missing database's lines are not graded
        outputs[n] = out.read_bytes()
        summary = json.loads(proc.stdout)
        assert summary["concurrency"] == n and summary["lines"] == len(lines)
    assert outputs[1] == outputs[2]
    records = [json.loads(line) for line in outputs[2].decode().splitlines()]
    assert [r["line"] for r in records] == list(range(1, len(lines) + 1))
    for got, want in zip(records, expected):
        if want is None:
            assert got["outcome"] == "gold_error" and got["detail"].startswith("database: ")
            assert "not found" in got["detail"] or "no_such_db" in got["detail"]
        else:
            assert got == want
    # Byte for byte, the records a sequential grade writes (the same fields, in the same order).
    for line, want in zip(outputs[1].decode().splitlines(), expected):
        if want is not None:
            assert line == json.dumps(want, ensure_ascii=False)


def test_each_gold_runs_once_and_a_failed_gold_once_per_run(tmp_path):
    lines = workload()
    pairs = write(tmp_path, lines)
    rows = [x for x in lines if isinstance(x, dict) and x["db_id"] == "superhero"]
    # A gold under each method it is graded by: its own line's, or multiset.
    golds = {(x["gold"], x.get("grading_method") or "multiset") for x in rows}
    failing = {g for g in golds if g[0] == "SELECT nope FROM superhero"}
    assert len(rows) > 3 * len(golds)  # many lines share each gold: reuse is what is measured
    for n in (1, 2):
        proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(tmp_path / "v.jsonl"),
                     "--semantics", "task", "--concurrency", str(n), "--json")
        golds_run = json.loads(proc.stdout)["golds"]
        assert golds_run["computed"] == len(golds) - len(failing), (n, golds_run)
        assert golds_run["failed"] == len(failing) == 1, (n, golds_run)
        assert golds_run["from_disk"] == 0


def test_cache_dir_keeps_the_golds_for_the_next_run(tmp_path):
    lines = workload(8)
    pairs = write(tmp_path, lines)
    cache = tmp_path / "cache"
    runs = []
    for i in range(2):
        out = tmp_path / f"v{i}.jsonl"
        proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--cache-dir",
                     str(cache), "--concurrency", "2", "--json")
        runs.append((json.loads(proc.stdout)["golds"], out.read_bytes()))
    (first, out1), (second, out2) = runs
    assert first["computed"] > 0 and first["from_disk"] == 0
    assert second["computed"] == 0 and second["from_disk"] == first["computed"], second
    assert out1 == out2
    text = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(tmp_path / "v.jsonl"),
                 "--cache-dir", str(cache))
    assert "0 computed, " in text.stdout and f"{first['computed']} from --cache-dir" in text.stdout
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(tmp_path / "w.jsonl"),
                 "--cache-dir", str(not_a_dir))
    assert proc.returncode == 2 and "--cache-dir" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "w.jsonl").exists()


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", ""])
def test_a_bad_concurrency_is_a_usage_error(tmp_path, value):
    pairs = write(tmp_path, workload(1))
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(tmp_path / "v.jsonl"),
                 "--concurrency", value)
    assert proc.returncode == 2 and "--concurrency" in proc.stderr and "Traceback" not in proc.stderr
    assert "worker" in proc.stderr and not (tmp_path / "v.jsonl").exists()


def test_default_concurrency_is_the_cores(tmp_path):
    pairs = write(tmp_path, workload(1))
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(tmp_path / "v.jsonl"), "--json")
    assert json.loads(proc.stdout)["concurrency"] == os.cpu_count()


def test_timeouts_read_as_the_sequential_grade_says_and_are_not_retried(tmp_path):
    lines = [{"id": "p", "db_id": "superhero", "pred": ENDLESS, "gold": "SELECT 1"}]
    lines += [{"id": f"g{i}", "db_id": "superhero", "pred": "SELECT 1", "gold": ENDLESS} for i in range(3)]
    pairs = write(tmp_path, lines)
    out = tmp_path / "v.jsonl"
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--timeout-s", "0.3",
                 "--concurrency", "1", "--json")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    db = str(database_path(ROOT, "superhero"))
    for x, r in zip(lines, records):
        v = grade(db, x["pred"], x["gold"], "multiset", 12, 0.3)
        assert (r["outcome"], r["detail"], r["semantics"]) == (v.outcome, v.detail, v.semantics)
    assert [r["outcome"] for r in records] == ["pred_timeout"] + ["gold_timeout"] * 3
    # The gold that timed out ran once (not once per line, nor twice for a retry); 3 x 0.3 s would be more.
    assert json.loads(proc.stdout)["golds"]["failed"] == 1


@pytest.mark.parametrize("in_flight,buffered", [(1, 1), (2, 3), (5, 2)])
def test_small_windows_keep_the_order(tmp_path, monkeypatch, capsys, in_flight, buffered):
    """The bounded read-ahead: however few lines are in flight or buffered, the output is in order."""
    lines = workload(6)
    pairs = write(tmp_path, lines)
    real_init = grade_command._PairsBatch.__init__

    def small(self, *a, **kw):
        real_init(self, *a, **kw)
        self.in_flight, self.buffered = in_flight, buffered

    monkeypatch.setattr(grade_command._PairsBatch, "__init__", small)
    out = tmp_path / "v.jsonl"
    rc = main(["grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--semantics", "task",
               "--concurrency", "2", "--json"])
    assert rc == 1
    expected = sequential_records(lines, "task")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in records] == list(range(1, len(lines) + 1))
    assert all(got == want for got, want in zip(records, expected) if want is not None)


def test_an_error_mid_run_writes_nothing_and_says_so(tmp_path, monkeypatch, capsys):
    pairs = write(tmp_path, workload(6))
    calls = 0
    real_grade = Grader.grade

    async def failing(self, *a, **kw):
        nonlocal calls
        calls += 1
        if calls == 20:
            raise RuntimeError("disk on fire")
        return await real_grade(self, *a, **kw)

    monkeypatch.setattr(Grader, "grade", failing)
    out = tmp_path / "v.jsonl"
    rc = main(["grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--concurrency", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "disk on fire" in err and "was not written" in err and "Traceback" not in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["pairs.jsonl"]


def test_ctrl_c_mid_run_writes_nothing_and_exits_2(tmp_path):
    lines = [{"id": i, "db_id": "superhero", "pred": ENDLESS, "gold": "SELECT 1"} for i in range(6)]
    pairs = write(tmp_path, lines)
    out = tmp_path / "v.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "t2sql.cli", "grade", "--pairs", str(pairs), "--db-root", str(ROOT),
                             "--out", str(out), "--timeout-s", "60", "--concurrency", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # started, its workers deep in the endless queries
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 10  # the workers' queries were interrupted, not waited for
    assert proc.returncode == 2, err
    assert "interrupted" in err and "was not written" in err and "Traceback" not in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["pairs.jsonl"]
