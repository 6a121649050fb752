"""The recipe's own task files (shipped in the package, python/t2sql/release): every row parsed and validated as far as
can be without its database, and the arcwise tasks whose databases are here run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from conftest import bird_root
from t2sql.data import convert as data
from t2sql.episode.evidence import evidence_pieces
from t2sql.tasks import release_dir

RELEASE = release_dir()  # the installed package's copy: what a user's t2sql reads

FILES = {"train": "bird-verified-train.json", "validation": "bird-verified-val.json",
         "arcwise": "arcwise_plat_sql.json"}
# The release README's table of grading_method values (train / validation), by canonical name.
METHODS = {
    "train": {"set": 2027, "ordered": 4, "subset,=,5": 11, "subset,=,3": 8, "subset,=,10": 6, "subset,=,1": 1,
              "subset,=,2": 1, "subset,=,4": 1, "subset,>=,1": 3, "subset,>=,5": 1, "multiset": 1},
    "validation": {"set": 395, "ordered": 1, "subset,=,10": 2},
    "arcwise": {},
}


def _rows(split: str):
    raw, problems = data.load_questions(RELEASE / FILES[split])
    assert problems == []
    return raw


@pytest.mark.parametrize("split", list(FILES))
def test_every_row_is_read_and_its_method_understood(split):
    raw = _rows(split)
    assert len(raw) == {"train": 2064, "validation": 398, "arcwise": 498}[split]
    rows, problems = data.normalize_rows(raw, data.BIRD_FIELDS, split, "databases")
    assert problems == []
    methods = Counter(t.grading_method for _, t in rows if t.grading_method)
    assert methods == METHODS[split]
    if split == "train":  # the two bare "subset" (one-row golds) and the " multiset" with its stray space
        by_id = {t.question_id: (t.grading_method, t.grading_method_given) for _, t in rows}
        assert by_id["1104"] == by_id["1105"] == ("subset,>=,1", None) and by_id["5248"] == ("multiset", None)
    # Every row is otherwise complete, and question ids are unique.
    assert all(t.question and t.gold_sql and t.db_id for _, t in rows)
    assert all(t.db_path == str(Path("databases", t.db_id, f"{t.db_id}.sqlite")) for _, t in rows)
    assert len({t.question_id for _, t in rows}) == len(rows)
    # The original_* fields of BIRD-Verified travel with the row.
    if split != "arcwise":
        assert all(set(t.originals) == {"original_question", "original_evidence", "original_SQL"} for _, t in rows)
    # Evidence pieces: a trailing ';' leaves no empty piece.
    for _, t in rows:
        assert all(piece for piece in evidence_pieces(t.evidence))


# A user's own task file: the train file with two tasks' methods made unreadable (an operator the core does not
# know), which --grading-method-fallback is for.
UNREADABLE = {"1104": "subset,<,3", "1105": "subset,<,3"}


def _own_file(tmp_path) -> str:
    rows = json.loads((RELEASE / FILES["train"]).read_text())
    for row in rows:
        row["grading_method"] = UNREADABLE.get(row["question_id"], row["grading_method"])
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "own-train.json"
    path.write_text(json.dumps(rows))
    return str(path)


def test_every_shipped_file_passes_the_checks_that_need_no_database():
    """What prepare checks before it downloads BIRD's databases: every shipped file, with no fallback."""
    for split, name in FILES.items():
        assert data.check_questions(RELEASE / name, split=split) == [], split


def test_a_fallback_method_is_chosen_by_flag_never_silently(tmp_path):
    raw, _ = data.load_questions(_own_file(tmp_path))
    rows, problems = data.normalize_rows(raw, data.BIRD_FIELDS, "train", "databases")
    assert {p.question_id for p in problems} == set(UNREADABLE)
    assert all(p.kind == "bad_grading_method" and "--grading-method-fallback" in p.message for p in problems)
    rows, problems = data.normalize_rows(raw, data.BIRD_FIELDS, "train", "databases", method_fallback="set")
    assert problems == []
    methods = {t.question_id: t.grading_method for _, t in rows}
    assert methods["1104"] == methods["1105"] == "set"
    given = {t.question_id: t.grading_method_given for _, t in rows if t.grading_method_given}
    assert given == UNREADABLE


def _stand_in_databases(root, split: str) -> None:
    """An empty SQLite file for every db_id of the split (the release's databases are not here)."""
    import sqlite3

    for db_id in {obj["db_id"] for _, obj in _rows(split)}:
        (root / db_id).mkdir(parents=True, exist_ok=True)
        sqlite3.connect(root / db_id / f"{db_id}.sqlite").execute("CREATE TABLE t(x)").connection.close()


def test_convert_gold_and_eval_say_which_tasks_the_fallback_graded(tmp_path):
    from t2sql.eval.runner import load_tasks

    _stand_in_databases(tmp_path / "db", "train")
    train, fallback = _own_file(tmp_path), ["--grading-method-fallback", "set"]
    said = "grading_method 'subset,<,3' cannot be read; graded as 'set' (--grading-method-fallback)"
    convert = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", train, "--db-root",
                              str(tmp_path / "db"), "--out-dir", str(tmp_path / "out"), "--no-check-gold", *fallback],
                             capture_output=True, text=True, timeout=300)
    assert convert.returncode == 0, convert.stderr
    assert f"note: task 1104: {said}" in convert.stderr and f"note: task 1105: {said}" in convert.stderr
    written = [json.loads(line) for line in (tmp_path / "out" / "own-train.jsonl").read_text().splitlines()]
    kept = {r["metadata"]["question_id"]: r["metadata"].get("grading_method_given") for r in written}
    assert kept["1104"] == kept["1105"] == "subset,<,3" and sum(v is not None for v in kept.values()) == 2
    gold = subprocess.run([sys.executable, "-m", "t2sql.cli", "gold", "--data", train, "--db-root",
                           str(tmp_path / "db"), "--json", *fallback], capture_output=True, text=True, timeout=300)
    assert f"note: task 1104: {said}" in gold.stderr and f"note: task 1105: {said}" in gold.stderr
    loaded = load_tasks(train, tmp_path / "db", method_fallback="set")
    assert loaded.notes == [f"task 1104: {said}", f"task 1105: {said}"]



@pytest.mark.parametrize("command", ["convert", "gold", "eval", "prepare"])
def test_an_unreadable_fallback_method_is_a_usage_error_before_any_data_is_read(command, tmp_path, capsys):
    from t2sql import cli
    from t2sql.miles import train

    questions = _own_file(tmp_path / "in")  # its unreadable methods would need the fallback
    argv = {"convert": ["convert", "--questions", questions, "--db-root", str(tmp_path), "--out-dir", str(tmp_path)],
            "gold": ["gold", "--data", questions, "--db-root", str(tmp_path)],
            "eval": ["eval", "--policy", "oracle", "--data", questions, "--db-root", str(tmp_path)],
            "prepare": ["prepare", "--skip-model"]}[command]
    main = train.main if command == "prepare" else cli.main
    with pytest.raises(SystemExit) as exit_:
        main(argv + ["--grading-method-fallback", "subset,<,3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --grading-method-fallback" in err and "the comparison must be =" in err
    assert list(tmp_path.iterdir()) == [tmp_path / "in"]


def test_convert_and_gold_report_the_unreadable_method_by_question_id(tmp_path):
    own = _own_file(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", own,
                           "--db-root", str(tmp_path), "--out-dir", str(tmp_path / "out"), "--no-check-gold"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "(question_id 1104): bad_grading_method" in proc.stderr
    assert not (tmp_path / "out").exists()
    gold = subprocess.run([sys.executable, "-m", "t2sql.cli", "gold", "--data", own,
                           "--db-root", str(tmp_path), "--json"], capture_output=True, text=True, timeout=300)
    summary = json.loads(gold.stdout)
    failures = {f["question_id"]: f["error"] for f in summary["failures"]}
    assert "grading_method 'subset,<,3' cannot be read" in failures["1104"]
    assert summary["methods"]["unreadable"] == 2 and summary["methods"]["subset,=,5"] == 11


def test_arcwise_tasks_on_the_three_databases_run_end_to_end(tmp_path):
    bird = bird_root()
    # Convert: the 140 tasks whose databases are here; the others are reported and dropped.
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(RELEASE / FILES["arcwise"]),
                           "--db-root", str(bird), "--out-dir", str(tmp_path), "--drop-invalid", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["rows_written"] == 140 and report["dropped"] == 358
    rows = [json.loads(x) for x in (tmp_path / "arcwise_plat_sql.jsonl").read_text().splitlines()]
    assert Counter(r["metadata"]["db_id"] for r in rows) == {"superhero": 52, "student_club": 48, "toxicology": 40}
    # The prompt carries the enumerated evidence lines.
    with_evidence = next(r for r in rows if r["metadata"]["evidence"])
    assert "Requirement of external knowledge 1 (" in with_evidence["prompt"][1]["content"]
    # Eval straight from the release file: the same 140 run, each of the others skipped with a line.
    out = tmp_path / "r.jsonl"
    ev = subprocess.run([sys.executable, "-m", "t2sql.cli", "eval", "--policy", "oracle", "--data",
                         str(RELEASE / FILES["arcwise"]), "--db-root", str(bird), "--out", str(out), "--json"],
                        capture_output=True, text=True, timeout=600)
    assert ev.returncode == 0, ev.stderr
    summary = json.loads(ev.stdout)
    assert summary["episodes"] == 140 and summary["accuracy"] == 1.0 and summary["mean_reward"] == 1.0
    # 50 of them on the terminal, then a count; the --json summary lists every one.
    assert ev.stderr.count("does not exist") == 50 and summary["rows_skipped"] == len(summary["skipped_rows"]) == 358
    assert "\nskipped: ... and 308 more\n" in ev.stderr
    assert all("does not exist" in s for s in summary["skipped_rows"])
    assert "140 tasks from" in ev.stderr and "(358 rows skipped, listed above)" in ev.stderr


def test_the_shipped_files_are_the_release_and_carry_their_notice():
    # What the package installs is byte for byte the public release (its MANIFEST), with its licence notice.
    import hashlib

    listed = {}
    for line in (RELEASE / "MANIFEST.sha256").read_text().splitlines():
        digest, name = line.split()
        listed[name.removeprefix("./")] = digest
    assert set(listed) == set(FILES.values())
    for name, digest in listed.items():
        assert hashlib.sha256((RELEASE / name).read_bytes()).hexdigest() == digest, name
    notice = (RELEASE / "NOTICE.md").read_text()
    assert "CC BY-SA 4.0" in notice and "The BIRD Team" in notice
