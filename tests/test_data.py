"""t2sql convert: BIRD's dev sample (432 tasks) in, miles jsonl out; every validation error provoked."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import bird_root
from t2sql import tasks as data_tasks
from t2sql.data import convert as data

BIRD = bird_root()


@pytest.fixture(scope="module")
def dev_rows() -> list[dict]:
    return json.loads((BIRD / "dev.json").read_text())


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[data.SplitReport, list[dict], Path]:
    out = tmp_path_factory.mktemp("convert") / "validation.jsonl"
    report, _ = data.convert_split(BIRD / "dev.json", BIRD, out, split="validation")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return report, rows, out


def _small_db_root(tmp_path: Path, db_ids=("superhero",)) -> Path:
    root = tmp_path / "dbs"
    for db_id in db_ids:
        (root / db_id).mkdir(parents=True)
        os.symlink(BIRD / db_id / f"{db_id}.sqlite", root / db_id / f"{db_id}.sqlite")
    return root


def _questions(tmp_path: Path, rows: list[dict], name="q.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(rows))
    return path


def test_converts_all_432_tasks_with_the_row_format(converted, dev_rows):
    report, rows, _ = converted
    assert report.rows_in == report.rows_written == len(rows) == 432
    assert report.gold_checked == 432 and not report.problems
    assert Counter(r["metadata"]["db_id"] for r in rows) == {"superhero": 129, "student_club": 158, "toxicology": 145}
    by_id = {str(r["question_id"]): r for r in dev_rows}
    for row in rows:
        assert set(row) == {"prompt", "label", "metadata", "tools"}
        label, meta = row["label"], row["metadata"]
        src = by_id[meta["question_id"]]
        # Each fact once (issue 18): the label holds what grading reads, the metadata the rest.
        assert set(label) <= {"gold_sql", "grading_method"} and not set(label) & set(meta)
        assert isinstance(meta["question_id"], str)
        assert label["gold_sql"] == src["SQL"].strip() and src["db_id"] == meta["db_id"]
        assert meta["question"] == src["question"].strip() and meta["evidence"] == src["evidence"].strip()
        assert meta["difficulty"] == src["difficulty"] and meta["split"] == "validation"
        assert Path(meta["db_path"]).is_absolute() and Path(meta["db_path"]).is_file()
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert src["question"].strip() in row["prompt"][1]["content"]
        assert [t["function"]["name"] for t in row["tools"]] == ["execute_sql_query"]


def test_every_reader_reads_a_row_into_the_same_task(converted, dev_rows):
    """One reader (t2sql.tasks): a converted row, the same row as older versions wrote it (question_id,
    db_id and grading_method repeated in the label), and its BIRD question become one Task, whether
    the eval, `t2sql gold` or `t2sql-train prepare` reads it."""
    from t2sql.commands.gold import extract_task
    from t2sql.tasks import Task

    _, rows, _ = converted
    row = rows[3]
    meta = row["metadata"]
    older = {**row, "label": {**row["label"], "question_id": meta["question_id"], "db_id": meta["db_id"]}}
    bird = next(q for q in dev_rows if str(q["question_id"]) == meta["question_id"])
    task = Task.from_row(row)
    assert Task.from_row(older) == task
    in_bird = str(BIRD / task.db_id / f"{task.db_id}.sqlite")
    assert Task.from_row(bird, BIRD) == dataclasses.replace(task, db_path=in_bird)
    assert extract_task(4, row, None).task == task and extract_task(4, older, None).task == task
    assert (task.question_id, task.db_id) == (meta["question_id"], meta["db_id"])
    assert task.gold_sql == row["label"]["gold_sql"]


def test_prompt_is_the_episode_prompt(converted):
    """Training rows carry exactly what t2sql.episode.prompt builds for the task (eval sees the same)."""
    from t2sql import Database
    from t2sql.episode.presets import get_preset
    from t2sql.episode.prompt import build_prompt
    from t2sql.tasks import Task

    _, rows, _ = converted
    row = rows[7]
    task = Task.from_row(row, BIRD)
    assert task.gold_sql == row["label"]["gold_sql"] and task.question_id == row["metadata"]["question_id"]
    assert build_prompt(task, get_preset("qwen3.6-35b-a3b"), Database(task.db_path)) == row["prompt"]


def test_release_split_counts_are_documented():
    assert data.RELEASE_SPLITS == {"train": 2033, "validation": 398, "arcwise": 498}


def test_missing_database_names_the_row_and_writes_nothing(tmp_path, dev_rows):
    rows = [r for r in dev_rows if r["db_id"] == "superhero"][:3] + [dict(dev_rows[0], question_id=99999,
                                                                         db_id="no_such_db")]
    out = tmp_path / "out" / "x.jsonl"
    with pytest.raises(data.DataError) as e:
        data.convert_split(_questions(tmp_path, rows), _small_db_root(tmp_path), out, split="x")
    assert [p.kind for p in e.value.problems] == ["missing_database"]
    assert e.value.problems[0].row == 4 and e.value.problems[0].question_id == "99999"
    assert "no_such_db" in str(e.value) and "nothing written" in str(e.value)
    assert not out.exists() and not (tmp_path / "out").exists()


def test_duplicate_ids_empty_gold_and_missing_fields(tmp_path, dev_rows):
    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:4]
    rows = [hero[0], dict(hero[1], question_id=hero[0]["question_id"]), dict(hero[2], SQL="   "),
            {k: v for k, v in hero[3].items() if k != "question"}]
    with pytest.raises(data.DataError) as e:
        data.convert_split(_questions(tmp_path, rows), _small_db_root(tmp_path), tmp_path / "o.jsonl", split="x")
    kinds = {(p.kind, p.row) for p in e.value.problems}
    assert kinds == {("duplicate_id", 2), ("empty_gold", 3), ("missing_field", 4)}
    assert "already used by row 1" in str(e.value)
    assert not (tmp_path / "o.jsonl").exists()


def test_gold_that_fails_to_run_is_reported(tmp_path, dev_rows):
    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:3]
    rows = [hero[0], dict(hero[1], SQL="SELECT no_such_column FROM superhero"), dict(hero[2], SQL="DELETE FROM colour")]
    with pytest.raises(data.DataError) as e:
        data.convert_split(_questions(tmp_path, rows), _small_db_root(tmp_path), tmp_path / "o.jsonl", split="x")
    problems = {p.row: p for p in e.value.problems}
    assert set(problems) == {2, 3} and {p.kind for p in problems.values()} == {"gold_error"}
    assert "no_such_column" in problems[2].message and "unsafe" in problems[3].message


def test_failure_leaves_an_existing_output_untouched(tmp_path, dev_rows):
    out = tmp_path / "v.jsonl"
    out.write_text("previous content\n")
    rows = [dict(r, SQL="") for r in dev_rows if r["db_id"] == "superhero"][:2]
    with pytest.raises(data.DataError):
        data.convert_split(_questions(tmp_path, rows), _small_db_root(tmp_path), out, split="v")
    assert out.read_text() == "previous content\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".v.jsonl")] == []  # no temp file left


def test_drop_invalid_writes_the_valid_rows(tmp_path, dev_rows):
    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:5]
    rows = hero[:4] + [dict(hero[4], SQL="SELECT nope FROM superhero")]
    report, built = data.convert_split(_questions(tmp_path, rows), _small_db_root(tmp_path), tmp_path / "o.jsonl",
                                       split="x", drop_invalid=True)
    assert report.rows_written == 4 and report.dropped == 1
    assert [r["metadata"]["question_id"] for r in built] == [str(r["question_id"]) for r in hero[:4]]
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 4


def test_jsonl_bad_lines_fail_the_conversion_by_line_number(tmp_path, dev_rows):
    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:3]
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(hero[0]) + "\n{not json\n" + json.dumps(hero[1]) + "\n[1, 2]\n"
                    + json.dumps(hero[2]) + "\n")
    out = tmp_path / "o.jsonl"
    root = _small_db_root(tmp_path)
    with pytest.raises(data.DataError, match="nothing written") as info:
        data.convert_split(path, root, out, split="x")
    assert [(p.kind, p.row) for p in info.value.problems] == [("bad_line", 2), ("bad_line", 4)]
    assert not out.exists()
    # --drop-invalid writes the valid rows and lists the dropped lines.
    report, built = data.convert_split(path, root, out, split="x", drop_invalid=True)
    assert report.rows_written == 3 and len(built) == 3 and report.dropped == 2


def test_convert_command_with_a_bad_line_writes_nothing_and_fails(tmp_path, dev_rows):
    import subprocess
    import sys

    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:2]
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(hero[0]) + "\n{oops\n" + json.dumps(hero[1]) + "\n")
    root = _small_db_root(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(path), "--db-root",
                           str(root), "--out-dir", str(tmp_path / "out"), "--no-check-gold"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "row 2: bad_line: not JSON" in proc.stderr, proc.stderr
    assert not (tmp_path / "out" / "q.jsonl").exists()
    # Not UTF-8: one clear line naming where (a JSON lines file: that line).
    path.write_bytes(json.dumps(hero[0]).encode() + b"\n{\"question\": \"caf\xe9\"}\n")
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(path), "--db-root",
                           str(root), "--out-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "row 2: bad_line: not UTF-8" in proc.stderr


def test_field_map_and_ids_synthesized_when_absent(tmp_path, dev_rows):
    # BIRD's train.json style: no question_id, and here the gold under another name.
    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:3]
    rows = [{"db_id": r["db_id"], "question": r["question"], "hint": r["evidence"], "query": r["SQL"]} for r in hero]
    fields = data_tasks.parse_field_map(["gold_sql=query", "evidence=hint"])
    _, built = data.convert_split(_questions(tmp_path, rows), _small_db_root(tmp_path), None, split="train",
                                  fields=fields)
    assert [r["metadata"]["question_id"] for r in built] == ["train-1", "train-2", "train-3"]
    assert [r["label"]["gold_sql"] for r in built] == [r["SQL"].strip() for r in hero]
    assert built[0]["metadata"]["evidence"] == hero[0]["evidence"].strip()
    with pytest.raises(data.DataError, match="unknown field"):
        data_tasks.parse_field_map(["sql=query"])
    with pytest.raises(data.DataError, match="CANONICAL=SOURCE"):
        data_tasks.parse_field_map(["gold_sql"])


def test_release_layout(tmp_path):
    (tmp_path / "databases").mkdir()
    (tmp_path / "train_databases").mkdir()
    for name in ("train.json", "validation.jsonl", "arcwise.json", "dev_tables.json"):
        (tmp_path / name).write_text("[]")
    found = {s: (q.name, r.name) for s, q, r in data.release_splits(tmp_path)}
    # Validation runs on BIRD's train databases (the recipe's split), arcwise on the shared ones here.
    assert found == {"train": ("train.json", "train_databases"),
                     "validation": ("validation.jsonl", "train_databases"),
                     "arcwise": ("arcwise.json", "databases")}  # dev_tables.json is not a split
    assert [s for s, _, _ in data.release_splits(tmp_path, ["dev_tables"])] == ["dev_tables"]
    (tmp_path / "arcwise.json").unlink()
    with pytest.raises(data.DataError, match="no question file for split.s. arcwise") as e:
        data.release_splits(tmp_path)
    assert "dev_tables.json" in str(e.value)


def test_release_layout_with_the_recipes_own_file_names(tmp_path):
    for d in ("train_databases", "dev_databases"):
        (tmp_path / d).mkdir()
    for name in ("bird-verified-train.json", "bird-verified-val.json", "arcwise_plat_sql.json"):
        (tmp_path / name).write_text("[]")
    found = {s: (q.name, r.name) for s, q, r in data.release_splits(tmp_path)}
    assert found == {"train": ("bird-verified-train.json", "train_databases"),
                     "validation": ("bird-verified-val.json", "train_databases"),
                     "arcwise": ("arcwise_plat_sql.json", "dev_databases")}


def test_cli_convert_json_report(tmp_path, dev_rows):
    hero = [r for r in dev_rows if r["db_id"] == "superhero"][:6]
    q = _questions(tmp_path, hero, "dev_hero.json")
    proc = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(q), "--db-root", str(BIRD),
         "--out-dir", str(tmp_path / "out"), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["split"] == "dev_hero" and report["rows_written"] == 6 and report["gold_checked"] == 6
    assert len((tmp_path / "out" / "dev_hero.jsonl").read_text().splitlines()) == 6
    umask = os.umask(0)
    os.umask(umask)
    mode = (tmp_path / "out" / "dev_hero.jsonl").stat().st_mode & 0o777
    assert mode == 0o666 & ~umask  # an ordinary file for other processes, not mkstemp's 0600
    bad = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(q), "--db-root", str(tmp_path / "nowhere"),
         "--out-dir", str(tmp_path / "out2")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert bad.returncode == 1 and "database root not found" in bad.stderr
    assert not (tmp_path / "out2").exists()
