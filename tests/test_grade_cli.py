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
    out = t2sql("grade", "--db", db, "--pred", "SELECT id, v FROM t", "--gold", "SELECT id FROM t", "--json")
    verdict = json.loads(out.stdout)
    assert verdict["outcome"] == "mismatch" and verdict["detail"] == "column count 2 vs 1"


def test_float_digits_flag(db_root):
    db = str(db_root / "alpha" / "alpha.sqlite")
    pred, gold = "SELECT 0.1 + 0.2", "SELECT 0.3"
    assert json.loads(t2sql("grade", "--db", db, "--pred", pred, "--gold", gold, "--json").stdout)["outcome"] == "match"
    exact = t2sql("grade", "--db", db, "--pred", pred, "--gold", gold, "--float-digits", "exact", "--json")
    assert json.loads(exact.stdout)["outcome"] == "mismatch"
    bad = t2sql("grade", "--db", db, "--pred", pred, "--gold", gold, "--float-digits", "lots", check=False)
    assert bad.returncode == 2 and "exact" in bad.stderr


def test_semantics_flag(db_root):
    db = str(db_root / "alpha" / "alpha.sqlite")
    args = ["grade", "--db", db, "--pred", "SELECT id FROM t ORDER BY id DESC", "--gold", "SELECT id FROM t ORDER BY id", "--json"]
    assert json.loads(t2sql(*args).stdout)["outcome"] == "match"
    assert json.loads(t2sql(*args, "--semantics", "ordered").stdout)["outcome"] == "mismatch"
    assert json.loads(t2sql(*args, "--semantics", "auto").stdout)["semantics"] == "ordered"


def test_missing_database_and_missing_flags_are_clear(db_root):
    out = t2sql("grade", "--db", str(db_root / "nope.sqlite"), "--pred", "SELECT 1", "--gold", "SELECT 1", check=False)
    assert out.returncode == 2 and "not found" in out.stderr
    out = t2sql("grade", "--db", str(db_root / "alpha" / "alpha.sqlite"), check=False)
    assert out.returncode == 2 and "--pred" in out.stderr


def test_pairs_file_in_order_with_bad_lines_reported(db_root, tmp_path):
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
    pairs.write_text("\n".join(lines) + "\n")
    out_file = tmp_path / "out" / "verdicts.jsonl"
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(out_file), "--json")
    rows = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a1", "b1", "x1", "a2", "a4", "a5"]
    assert [r["outcome"] for r in rows] == ["match", "mismatch", "gold_error", "unsafe", "pred_error", "gold_error"]
    assert "not found" in rows[2]["detail"]
    for lineno in (2, 6, 8):
        assert f"pairs.jsonl:{lineno}: skipped" in proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["graded"] == 6 and summary["skipped"] == 3
    assert summary["counts"]["gold_error"] == 2 and summary["counts"]["match"] == 1
    # No temporary file is left beside the output.
    assert [p.name for p in out_file.parent.iterdir()] == ["verdicts.jsonl"]


def test_pairs_summary_table(db_root, tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"id": 1, "db_id": "alpha", "pred": "SELECT 1", "gold": "SELECT 1"}) + "\n")
    proc = t2sql("grade", "--pairs", str(pairs), "--db-root", str(db_root), "--out", str(tmp_path / "o.jsonl"))
    assert "match" in proc.stdout and "total" in proc.stdout and "100.0%" in proc.stdout


@pytest.mark.skipif(bird_root() is None, reason="BIRD dev data not found beside the checkout")
def test_pairs_on_bird_dev(tmp_path):
    bird = bird_root()
    questions = json.loads((bird / "dev.json").read_text())
    pairs = tmp_path / "bird_pairs.jsonl"
    with pairs.open("w") as f:
        for q in questions:
            f.write(json.dumps({"id": q["question_id"], "db_id": q["db_id"], "pred": q["SQL"], "gold": q["SQL"]}) + "\n")
    out = tmp_path / "v.jsonl"
    summary = json.loads(t2sql("grade", "--pairs", str(pairs), "--db-root", str(bird), "--out", str(out), "--json").stdout)
    assert summary["counts"]["match"] == 432 and summary["graded"] == 432
