"""`t2sql grade` as a user runs it: a real subprocess on real SQLite files."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from conftest import bird_root


def t2sql(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture
def db_root(tmp_path):
    """Two databases in BIRD's layout: <root>/<db_id>/<db_id>.sqlite."""
    for db_id, n in (("alpha", 5), ("beta", 3)):
        (tmp_path / db_id).mkdir()
        con = sqlite3.connect(tmp_path / db_id / f"{db_id}.sqlite")
        con.execute("CREATE TABLE t (id INTEGER, v REAL)")
        con.executemany("INSERT INTO t VALUES (?, ?)", [(i, i / 3) for i in range(n)])
        con.commit()
        con.close()
    return tmp_path


def test_single_grade_text_and_json(db_root):
    db = str(db_root / "alpha" / "alpha.sqlite")
    out = t2sql("grade", "--db", db, "--pred", "SELECT id FROM t", "--gold", "SELECT id FROM t WHERE id < 9")
    assert out.stdout.strip() == "match: 5 rows match (multiset)"
    out = t2sql("grade", "--db", db, "--pred", "SELECT id, v FROM t", "--gold", "SELECT id FROM t", "--json",
                check=False)
    verdict = json.loads(out.stdout)
    assert verdict["outcome"] == "mismatch" and verdict["detail"] == "column count 2 vs 1 (multiset)"


@pytest.mark.parametrize("pred,code", [
    ("SELECT id FROM t", 0),  # match
    ("SELECT id FROM t LIMIT 2", 1),  # mismatch
    ("SELECT nope FROM t", 1),  # pred_error
    ("DELETE FROM t", 1),  # unsafe
])
def test_single_grade_exit_status_is_0_match_1_other_verdict(db_root, pred, code):
    proc = t2sql("grade", "--db", str(db_root / "alpha" / "alpha.sqlite"), "--pred", pred, "--gold",
                 "SELECT id FROM t", check=False)
    assert proc.returncode == code, proc.stdout + proc.stderr


def test_db_id_defaults_to_the_bundled_sample():
    proc = t2sql("grade", "--db-id", "superhero", "--pred", "SELECT count(*) FROM superhero",
                 "--gold", "SELECT count(id) FROM superhero")
    assert proc.stdout.startswith("match")


def test_trouble_is_exit_2_with_one_line_and_no_traceback(db_root, tmp_path):
    db = str(db_root / "alpha" / "alpha.sqlite")
    not_utf8 = subprocess.run(
        [sys.executable.encode(), b"-m", b"t2sql.cli", b"grade", b"--db", db.encode(), b"--pred", b"SELECT 1",
         b"--gold", b"SELECT '\xff'"], capture_output=True, timeout=120)
    assert not_utf8.returncode == 2 and b"Traceback" not in not_utf8.stderr
    assert b"--gold is not valid UTF-8" in not_utf8.stderr
    for timeout in ("0", "-3", "nan", "inf", "soon"):
        bad_timeout = t2sql("grade", "--db", db, "--pred", "SELECT 1", "--gold", "SELECT 1", "--timeout-s", timeout,
                            check=False)
        assert bad_timeout.returncode == 2 and "Traceback" not in bad_timeout.stderr, timeout
        assert "--timeout-s" in bad_timeout.stderr and "seconds" in bad_timeout.stderr
    not_utf8_db = subprocess.run(
        [sys.executable.encode(), b"-m", b"t2sql.cli", b"grade", b"--db", b"/tmp/\xff.sqlite", b"--pred", b"SELECT 1",
         b"--gold", b"SELECT 1"], capture_output=True, timeout=120)
    assert not_utf8_db.returncode == 2 and b"--db is not valid UTF-8; pass the path" in not_utf8_db.stderr


def test_every_time_limit_flag_refuses_nan_and_inf():
    """A limit of nan or inf is no limit: every command refuses it as a usage error (exit 2)."""
    commands = [
        ("grade", "--db-id", "superhero", "--pred", "SELECT 1", "--gold", "SELECT 1", "--timeout-s"),
        ("gold", "--timeout-s"),
        ("convert", "--out", "/nonexistent/never-written.jsonl", "--timeout-s"),
        ("eval", "--policy", "model", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--timeout-s"),
        ("eval", "--policy", "model", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--max-response-mb"),
    ]
    for command in commands:
        for value in ("nan", "inf", "-1"):
            proc = t2sql(*command, value, check=False)
            assert proc.returncode == 2, (command, value, proc.stderr[-300:])
            assert "Traceback" not in proc.stderr and "positive, finite" in proc.stderr, (command, value)


def test_retry_backoff_may_be_zero_but_not_negative_nan_or_inf():
    """No backoff between retries is a choice (RetryPolicy takes 0); a negative or endless one is not."""
    import argparse

    from t2sql.commands.eval import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args(["--retry-backoff", "0"]).retry_backoff == 0.0
    assert parser.parse_args(["--retry-backoff", "0.25"]).retry_backoff == 0.25
    for value in ("nan", "inf", "-1", "soon"):
        proc = t2sql("eval", "--policy", "model", "--endpoint", "http://127.0.0.1:9", "--model", "m",
                     "--retry-backoff", value, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (value, proc.stderr[-300:])
        assert "--retry-backoff" in proc.stderr, value


def test_float_digits_flag(db_root):
    db = str(db_root / "alpha" / "alpha.sqlite")
    pred, gold = "SELECT 0.1 + 0.2", "SELECT 0.3"
    assert json.loads(t2sql("grade", "--db", db, "--pred", pred, "--gold", gold, "--json").stdout)["outcome"] == "match"
    exact = t2sql("grade", "--db", db, "--pred", pred, "--gold", gold, "--float-digits", "exact", "--json",
                  check=False)
    assert json.loads(exact.stdout)["outcome"] == "mismatch"
    bad = t2sql("grade", "--db", db, "--pred", pred, "--gold", gold, "--float-digits", "lots", check=False)
    assert bad.returncode == 2 and "exact" in bad.stderr


def test_method_flag(db_root):
    db = str(db_root / "alpha" / "alpha.sqlite")
    args = ["grade", "--db", db, "--pred", "SELECT id FROM t ORDER BY id DESC",
            "--gold", "SELECT id FROM t ORDER BY id", "--json"]
    assert json.loads(t2sql(*args).stdout)["outcome"] == "match"
    for method, outcome in (("ordered", "mismatch"), ("list", "mismatch"), ("Multiset", "match")):
        record = json.loads(t2sql(*args, "--method", method, check=False).stdout)
        assert record["outcome"] == outcome, (method, record)
    # The output field is named as the flag is.
    assert json.loads(t2sql(*args, "--method", "auto", check=False).stdout)["method"] == "ordered"


def test_missing_database_and_missing_flags_are_clear(db_root):
    missing = str(db_root / "nope.sqlite")
    out = t2sql("grade", "--db", missing, "--pred", "SELECT 1", "--gold", "SELECT 1", check=False)
    # The message names the file and the flag that named it; no --db-root was given, so none is mentioned.
    assert out.returncode == 2 and out.stderr == f"t2sql grade: no such database file: --db {missing}\n"
    out = t2sql("grade", "--db-id", "nope", "--db-root", str(db_root), "--pred", "SELECT 1", "--gold", "SELECT 1",
                check=False)
    assert out.returncode == 2 and f"--db-id nope: no database {db_root / 'nope' / 'nope.sqlite'}" in out.stderr
    assert f"under --db-root {db_root}" in out.stderr
    out = t2sql("grade", "--db-id", "nope", "--pred", "SELECT 1", "--gold", "SELECT 1", check=False)
    assert out.returncode == 2 and "under the bundled sample (pass --db-root DIR" in out.stderr
    out = t2sql("grade", "--db", str(db_root / "alpha" / "alpha.sqlite"), check=False)
    assert out.returncode == 2 and "--pred" in out.stderr


def test_pairs_file_one_output_line_per_input_line_in_order(db_root, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    lines = [
        json.dumps({"id": "a1", "db_id": "alpha", "pred": "SELECT id FROM t", "gold": "SELECT id FROM t"}),
        "{not json",
        json.dumps({"id": "b1", "db_id": "beta", "pred": "SELECT id FROM t LIMIT 1", "gold": "SELECT id FROM t"}),
        json.dumps({"id": "x1", "db_id": "gamma", "pred": "SELECT 1", "gold": "SELECT 1"}),
        json.dumps({"id": "a2", "db_id": "alpha", "pred": "DELETE FROM t", "gold": "SELECT id FROM t"}),
        json.dumps({"id": "a3", "db_id": "alpha"}),
        "",
        json.dumps(["a", "list"]),
        json.dumps({"id": "a4", "db_id": "alpha", "pred": "SELECT nope FROM t", "gold": "SELECT id FROM t"}),
        json.dumps({"id": "a5", "db_id": "alpha", "pred": "SELECT 1", "gold": "SELECT broken FROM t"}),
    ]
    pairs.write_bytes(("\n".join(lines) + "\n").encode() + b'{"id": "u1", "db_id": "alpha", "pred": "\xff"}\n')
    out_file = tmp_path / "out" / "verdicts.jsonl"
    out_file.parent.mkdir()  # --out's folder must exist: t2sql never makes one
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(out_file), "--json",
                 check=False)
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    # Every non-blank input line has its output line, in order, with its line number.
    assert [r["line"] for r in rows] == [1, 2, 3, 4, 5, 6, 8, 9, 10, 11]
    assert [r["id"] for r in rows] == ["a1", None, "b1", "x1", "a2", "a3", None, "a4", "a5", None]
    assert [r["outcome"] for r in rows] == ["match", "bad_input", "mismatch", "gold_error", "unsafe", "bad_input",
                                            "bad_input", "pred_error", "gold_error", "bad_input"]
    assert "'gamma'" in rows[3]["detail"] and rows[9]["detail"].startswith("not UTF-8")
    for lineno in (2, 6, 8, 11):
        assert f"pairs.jsonl:{lineno}: not graded" in proc.stderr
    summary = json.loads(proc.stdout)
    # x1's database is missing: it is one of the 5 ungraded lines, not also one of the graded ones.
    assert summary["lines"] == 10 and summary["graded"] == 5 and summary["ungraded"] == 5
    assert summary["counts"]["gold_error"] == 2 and summary["counts"]["match"] == 1
    assert proc.returncode == 1  # some lines could not be graded
    # No temporary file is left beside the output.
    assert [p.name for p in out_file.parent.iterdir()] == ["verdicts.jsonl"]


@pytest.mark.parametrize("as_json", [True, False])
def test_pairs_on_a_missing_database_count_once_as_ungraded(db_root, tmp_path, as_json):
    """9 lines, 4 on a database that is not there: 5 graded, 4 ungraded, in the JSON and the text summary."""
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"id": i, "db_id": "alpha" if i < 5 else "gone", "pred": "SELECT 1", "gold": "SELECT 1"} for i in range(9)]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(tmp_path / "v.jsonl"),
                 *(["--json"] if as_json else []), check=False)
    assert proc.returncode == 1, proc.stderr
    if as_json:
        summary = json.loads(proc.stdout)
        assert (summary["lines"], summary["graded"], summary["ungraded"]) == (9, 5, 4)
        assert summary["counts"]["match"] == 5 and summary["counts"]["gold_error"] == 4
    else:
        assert "(5 graded, 4 not graded," in proc.stdout, proc.stdout


def _one_pair(tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"id": 1, "db_id": "alpha", "pred": "SELECT 1", "gold": "SELECT 1"}) + "\n")
    return pairs


def test_pairs_refuses_to_overwrite_its_input(db_root, tmp_path):
    pairs = _one_pair(tmp_path)
    before = pairs.read_bytes()
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(pairs), check=False)
    assert proc.returncode == 2 and "is the --pairs file this run reads" in proc.stderr
    assert pairs.read_bytes() == before


def test_pairs_with_a_directory_as_out_fails_before_grading(db_root, tmp_path):
    pairs = _one_pair(tmp_path)
    (tmp_path / "outdir").mkdir()
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(tmp_path / "outdir"),
                 check=False)
    assert proc.returncode == 2 and "is a directory" in proc.stderr and "Traceback" not in proc.stderr
    assert list((tmp_path / "outdir").iterdir()) == []


def test_pairs_with_a_missing_db_root_is_trouble(db_root, tmp_path):
    pairs = _one_pair(tmp_path)
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(tmp_path / "nowhere"), "--out",
                 str(tmp_path / "o.jsonl"), check=False)
    assert proc.returncode == 2 and "--db-root" in proc.stderr and not (tmp_path / "o.jsonl").exists()


@pytest.mark.parametrize("where", ["/sys/t2sql-out.jsonl", "read-only"])
def test_pairs_with_an_unwritable_out_is_one_clear_line(db_root, tmp_path, where):
    import os

    pairs = _one_pair(tmp_path)
    if where == "read-only":
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(0o500)
        where = str(locked / "o.jsonl")
        if os.access(locked, os.W_OK):  # root ignores permission bits
            pytest.skip("running as a user that may write anywhere")
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", where, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "cannot write --out" in proc.stderr


def test_pairs_summary_table(db_root, tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"id": 1, "db_id": "alpha", "pred": "SELECT 1", "gold": "SELECT 1"}) + "\n")
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(tmp_path / "o.jsonl"))
    assert "match" in proc.stdout and "total" in proc.stdout and "100.0%" in proc.stdout


def test_pairs_on_bird_dev(tmp_path):
    bird = bird_root()
    questions = json.loads((bird / "dev.json").read_text())
    pairs = tmp_path / "bird_pairs.jsonl"
    with pairs.open("w") as f:
        for q in questions:
            f.write(json.dumps({"id": q["question_id"], "db_id": q["db_id"], "pred": q["SQL"], "gold": q["SQL"]})
                    + "\n")
    out = tmp_path / "v.jsonl"
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(bird), "--out", str(out), "--json")
    summary = json.loads(proc.stdout)
    assert summary["counts"]["match"] == 432 and summary["graded"] == 432 and proc.returncode == 0


def test_grade_on_the_bundled_sample_never_loads_the_eval_client():
    """cli.py's promise: `t2sql grade` (here --db-id on the bundled sample) imports no eval module."""
    code = ("import sys\n"
            "from t2sql.cli import main\n"
            "rc = main(['grade', '--db-id', 'superhero', '--pred', 'SELECT 1', '--gold', 'SELECT 1'])\n"
            "print(rc, sorted(m for m in sys.modules if m.startswith('t2sql.eval')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 []", proc.stdout


def test_the_argument_types_live_in_arguments_only():
    import argparse

    import t2sql.arguments as arguments
    import t2sql.grading as grading

    assert arguments.method_arg(" List ") == "ordered" and arguments.method_arg("subset") == "subset,>=,1"
    with pytest.raises(argparse.ArgumentTypeError, match="the comparison must be ="):
        arguments.method_arg("subset,<,3")
    # grading sits below arguments: it forwards nothing back up (that was a circle no import checker saw)
    for name in ("method_arg", "seconds_arg", "positive_arg", "wait_arg", "workers_arg",
                 "add_grade_memory_arguments", "add_temp_disk_argument", "grade_memory_from_args"):
        assert not hasattr(grading, name), name
