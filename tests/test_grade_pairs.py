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
from t2sql import jsonl
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


def sequential_records(lines: list[dict | str], method_flag: str = "multiset") -> bytes:
    """What `t2sql grade --pairs` wrote before it graded on workers: t2sql.grade, line by line."""
    out = []
    for lineno, x in enumerate(lines, 1):
        if isinstance(x, str):
            with pytest.raises(jsonl.JsonProblem) as problem:  # t2sql.jsonl, the one reader, says why
                jsonl.loads(x)
            record = {"id": None, "line": lineno, "outcome": "bad_input", "detail": str(problem.value)}
        else:
            path = database_path(ROOT, x["db_id"])
            if not path.exists():
                record = None  # the detail is the core's; checked apart
            else:
                method = x.get("grading_method") or "multiset" if method_flag == "task" else method_flag
                v = grade(str(path), x["pred"], x["gold"], method, 12, 30.0, "strict")
                record = {"id": x["id"], "outcome": v.outcome, "detail": v.detail, "method": v.method,
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
        proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--method", "task",
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
                     "--method", "task", "--concurrency", str(n), "--json")
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
        assert (r["outcome"], r["detail"], r["method"]) == (v.outcome, v.detail, v.method)
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
    rc = main(["grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--method", "task",
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


# ---- bad lines, bounded memory, paths, workers (issue 25) -----------------------------------------

COUNT_HEROES = "SELECT count(*) FROM superhero"


def strict_records(text: str) -> list[dict]:
    """The output read as any JSON reader outside Python would: NaN or Infinity fails the test."""

    def refuse(constant):
        raise AssertionError(f"{constant} is not JSON, yet it was written")

    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def test_each_unreadable_line_is_one_bad_input_and_the_run_goes_on(tmp_path):
    good = json.dumps({"id": "ok", "db_id": "superhero", "pred": COUNT_HEROES, "gold": COUNT_HEROES}).encode()
    bad = {  # the line, and what its record's detail says
        b"[" * 1500 + b"]" * 1500: "nested deeper",
        b'{"id": 2, "db_id": "\\ud800", "pred": "SELECT 1", "gold": "SELECT 1"}': "lone surrogate",
        b'{"id": 1e999, "db_id": "superhero", "pred": "SELECT 1", "gold": "SELECT 1"}': "too large for a float",
        b'{"id": NaN, "db_id": "superhero", "pred": "SELECT 1", "gold": "SELECT 1"}': "NaN is not a JSON number",
        b'{"id": -Infinity, "db_id": "superhero", "pred": "SELECT 1", "gold": "SELECT 1"}': "Infinity is not a JSON",
        b'{"id": ' + b"7" * 5000 + b', "db_id": "superhero", "pred": "SELECT 1", "gold": "SELECT 1"}': "digits",
    }
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(b"".join(good + b"\n" + line + b"\n" for line in bad) + good + b"\n")
    out = tmp_path / "v.jsonl"
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--concurrency", "2",
                 "--json")
    assert proc.returncode == 1, proc.stderr  # some lines could not be graded: not trouble
    assert "Traceback" not in proc.stderr and "stopped" not in proc.stderr
    records = strict_records(out.read_text())
    assert [r["line"] for r in records] == list(range(1, 2 * len(bad) + 2))
    assert [r["outcome"] for r in records[::2]] == ["match"] * (len(bad) + 1)
    for record, says in zip(records[1::2], bad.values()):
        assert record["outcome"] == "bad_input" and record["id"] is None and says in record["detail"], record
        assert f"pairs.jsonl:{record['line']}: not graded: {record['detail']}" in proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["graded"], summary["ungraded"]) == (len(bad) + 1, len(bad))


def peak_rss_mib(*args: str) -> tuple[float, subprocess.CompletedProcess]:
    """`t2sql ARGS` in a fresh child of a fresh interpreter, and that child's peak resident memory."""
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); print(p.returncode); "
             "sys.stderr.write(p.stderr)")
    proc = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "t2sql.cli", *args],
                          capture_output=True, text=True, timeout=300)
    kib, rc = proc.stdout.split()
    return int(kib) / 1024, subprocess.CompletedProcess(args, int(rc), "", proc.stderr)


def test_a_huge_line_without_a_newline_is_one_bad_input_in_bounded_memory(tmp_path):
    good = json.dumps({"id": "ok", "db_id": "superhero", "pred": COUNT_HEROES, "gold": COUNT_HEROES}) + "\n"
    small, huge = tmp_path / "small.jsonl", tmp_path / "huge.jsonl"
    small.write_text(good + good)
    with huge.open("w") as f:  # 96 MiB of SQL on a last line that never ends
        f.write(good + good + '{"id": "huge", "db_id": "superhero", "gold": "SELECT 1", "pred": "SELECT ')
        for _ in range(96):
            f.write("1 +" * (1 << 18) + "   ")
    base, _ = peak_rss_mib("grade", "--pairs", str(small), "--db-root", str(ROOT), "--out", str(tmp_path / "s.jsonl"),
                           "--concurrency", "1")
    peak, proc = peak_rss_mib("grade", "--pairs", str(huge), "--db-root", str(ROOT), "--out",
                              str(tmp_path / "h.jsonl"), "--concurrency", "1")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    records = strict_records((tmp_path / "h.jsonl").read_text())
    assert [r["outcome"] for r in records] == ["match", "match", "bad_input"]
    assert "line longer than" in records[2]["detail"]
    assert peak - base < 48, (base, peak)  # the line cap (16 MiB) and a chunk, never the 96 MiB line


def test_db_ids_outside_the_root_are_never_opened(tmp_path):
    """An absolute db_id, or one with `..`, names a file outside --db-root: that line is a gold_error
    that says why, and no query runs on the file (here a real copy of the database, which would match)."""
    root = tmp_path / "root"
    (root / "superhero").mkdir(parents=True)
    database = database_path(ROOT, "superhero").read_bytes()
    database_path(root, "superhero").write_bytes(database)
    (tmp_path / "secret").mkdir()  # so that root/../secret/../secret.sqlite resolves
    (tmp_path / "secret.sqlite").write_bytes(database)
    outside = [str(tmp_path / "secret"), "../secret", "..", ".", ""]
    rows = [{"id": "in", "db_id": "superhero", "pred": COUNT_HEROES, "gold": "SELECT 750"}]
    rows += [{"id": db_id, "db_id": db_id, "pred": COUNT_HEROES, "gold": "SELECT 750"} for db_id in outside]
    pairs = write(tmp_path, rows)
    out = tmp_path / "v.jsonl"
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(root), "--out", str(out), "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    records = strict_records(out.read_text())
    assert records[0]["outcome"] == "match"
    for db_id, record in zip(outside, records[1:]):
        assert record["outcome"] == "gold_error" and "method" not in record, record
        assert record["detail"].startswith("database: ") and repr(db_id) in record["detail"], record
    assert json.loads(proc.stdout)["ungraded"] == len(outside)


def test_more_workers_than_the_limit_is_one_line_that_says_so(tmp_path):
    pairs = write(tmp_path, workload(1))
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(tmp_path / "v.jsonl"),
                 "--concurrency", "100000")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]  # after argparse's usage
    assert "--concurrency" in error and "at most 1024 workers, not 100000" in error and "cache-dir" not in error
    assert not (tmp_path / "v.jsonl").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS bounds thread stacks on Linux")
def test_workers_the_system_cannot_start_are_named_as_such(tmp_path):
    """Under 1 GiB of address space 1,000 worker threads cannot all start: the line says that, not
    that a --cache-dir (never given) cannot be used."""
    import resource

    def limit_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    pairs = write(tmp_path, workload(1))
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "grade", "--pairs", str(pairs), "--db-root", str(ROOT),
                           "--out", str(tmp_path / "v.jsonl"), "--concurrency", "1000"],
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_address_space)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "1000 workers" in proc.stderr and "--concurrency" in proc.stderr and "cache-dir" not in proc.stderr
    assert not (tmp_path / "v.jsonl").exists()


def numbered_golds(ids, pred_of=lambda gold: gold) -> list[dict]:
    """One line per id, each with a gold of its own: `SELECT id FROM superhero WHERE id = i`."""
    rows = []
    for i in ids:
        gold = f"SELECT id FROM superhero WHERE id = {i}"
        rows.append({"id": len(rows), "db_id": "superhero", "pred": pred_of(gold), "gold": gold})
    return rows


def test_what_a_run_keeps_per_gold_and_per_database_stays_bounded(tmp_path, monkeypatch, capsys):
    """180 distinct golds and 12 db_ids through bounds of 10 digests, 10 golds' states and 3 databases:
    no structure ever holds more than its bound, and each gold still runs once (its lines come together)."""
    from t2sql import lru

    monkeypatch.setattr(grade_command, "GOLDS_KEPT", 10)  # the Grader's digests, and which golds were made or failed
    monkeypatch.setattr(grade_command, "DATABASES_KEPT", 3)
    held: dict[int, tuple[int, int]] = {}  # each bounded structure: (its bound, the most it held)
    real_put = lru.Lru.put

    def put(self, key, value):
        real_put(self, key, value)
        held[id(self)] = (self.max_entries, max(len(self), held.get(id(self), (0, 0))[1]))

    monkeypatch.setattr(lru.Lru, "put", put)
    rows = []
    for i in range(150):  # each gold on three lines in a row: a match, a mismatch, a match
        gold = f"SELECT id FROM superhero WHERE id = {i}"
        rows += [{"id": f"{i}/{kind}", "db_id": "superhero", "pred": pred, "gold": gold}
                 for kind, pred in (("a", gold), ("b", gold.replace("=", "<>")), ("c", gold))]
    for i in range(30):  # golds that fail, each on two lines
        rows += [{"id": f"fail{i}/{k}", "db_id": "superhero", "pred": "SELECT 1", "gold": f"SELECT nope{i} FROM x"}
                 for k in "ab"]
    rows += [{"id": f"gone{i}", "db_id": f"gone{i}", "pred": "SELECT 1", "gold": "SELECT 1"} for i in range(12)]
    pairs, out = write(tmp_path, rows), tmp_path / "v.jsonl"
    rc = main(["grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--concurrency", "2",
               "--json"])
    assert rc == 1  # the missing databases' lines
    summary = json.loads(capsys.readouterr().out)
    assert summary["golds"]["computed"] == 150 and summary["golds"]["failed"] == 30, summary["golds"]
    records = strict_records(out.read_text())
    assert [r["outcome"] for r in records[:6]] == ["match", "mismatch", "match"] * 2
    assert [r["outcome"] for r in records[450:]] == ["gold_error"] * (60 + 12)
    assert sorted(bound for bound, _ in held.values()) == [3, 10, 10]  # databases, golds' states, digests
    assert all(most <= bound for bound, most in held.values()), held


def test_a_forgotten_gold_runs_again_or_comes_from_the_cache_dir(tmp_path, monkeypatch, capsys):
    """Past its bounds a run forgets the oldest golds: one asked for again is run again (a failed one
    too), or read from --cache-dir when there is one, as docs/cli.md says. The records do not change."""
    monkeypatch.setattr(grade_command, "GOLDS_KEPT", 10)
    failing = [{"id": f"f{i}", "db_id": "superhero", "pred": "SELECT 1", "gold": f"SELECT nope{i} FROM x"}
               for i in (0, *range(1, 21), 0)]  # f0, 20 other failures, f0 again
    rows = numbered_golds([*range(30), *range(5)]) + failing
    pairs = write(tmp_path, rows)
    runs = []
    for extra in ([], ["--cache-dir", str(tmp_path / "cache")]):
        out = tmp_path / "v.jsonl"
        main(["grade", "--pairs", str(pairs), "--db-root", str(ROOT), "--out", str(out), "--concurrency", "1",
              "--json", *extra])
        runs.append((json.loads(capsys.readouterr().out)["golds"], out.read_bytes()))
    (memory_only, out1), (cached, out2) = runs
    assert (memory_only["computed"], memory_only["from_disk"], memory_only["failed"]) == (35, 0, 22), memory_only
    assert (cached["computed"], cached["from_disk"], cached["failed"]) == (30, 5, 22), cached
    assert out1 == out2
    assert [r["outcome"] for r in strict_records(out1.decode())] == ["match"] * 35 + ["gold_error"] * 22


def test_the_read_ahead_holds_a_bounded_number_of_bytes(tmp_path, monkeypatch, capsys):
    """A slow first line, then lines of ~2 KB: however many lines the window would allow, the lines
    read ahead of the first one not yet written hold about `read_ahead_bytes`, and stay in order."""
    pad = " " * 2000
    rows = [{"id": "slow", "db_id": "superhero", "pred": SLOW, "gold": "SELECT 1"}]
    rows += numbered_golds(range(60), pred_of=lambda gold: gold + pad)
    real_init, real_write = grade_command._PairsBatch.__init__, grade_command._PairsBatch._write_done
    most = []

    def small(self, *a, **kw):
        real_init(self, *a, **kw)
        self.read_ahead_bytes = 10_000

    def write_done(self, *a, **kw):
        most.append(self.held_bytes)  # after each line is read, before any is written
        real_write(self, *a, **kw)

    monkeypatch.setattr(grade_command._PairsBatch, "__init__", small)
    monkeypatch.setattr(grade_command._PairsBatch, "_write_done", write_done)
    out = tmp_path / "v.jsonl"
    assert main(["grade", "--pairs", str(write(tmp_path, rows)), "--db-root", str(ROOT), "--out", str(out),
                 "--concurrency", "2"]) == 0
    records = strict_records(out.read_text())
    assert [r["id"] for r in records] == [r["id"] for r in rows]
    assert [r["outcome"] for r in records] == ["mismatch"] + ["match"] * 60
    line = max(len(json.dumps(r)) + 1 for r in rows)
    assert 10_000 <= max(most) <= 10_000 + line, (max(most), line)  # it filled the window, and no more


def test_method_field_problem_makes_a_method_canonical_or_says_why():
    from t2sql.grading import method_field_problem
    row = {"grading_method": " List"}
    assert method_field_problem(row) == "" and row["grading_method"] == "ordered"
    assert method_field_problem({"grading_method": None}) == ""
    assert method_field_problem({"grading_method": "subset,<,3"}).startswith("grading_method: ")
