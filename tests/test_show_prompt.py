"""`t2sql prompt` prints what an Episode shows the model; `t2sql curriculum` is reachable from `t2sql`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import t2sql
from t2sql.episode.presets import get_preset
from t2sql.episode.prompt import build_prompt
from t2sql.miles.curriculum import Curriculum
from t2sql.tasks import Task

SAMPLE = Path(t2sql.__file__).parent / "sample"  # the embedded BIRD superhero sample


def t2sql_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t2sql.cli", *args], capture_output=True, text=True, timeout=120)


def test_prompt_prints_the_messages_an_episode_starts_from():
    rows = json.loads((SAMPLE / "dev.json").read_text())
    proc = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--db-root", str(SAMPLE), "--index", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    expected = build_prompt(Task.from_row(rows[4], SAMPLE), get_preset())
    assert shown["question_id"] == str(rows[4]["question_id"]) and shown["messages"] == expected
    assert shown["tools"][0]["function"]["name"] == "execute_sql_query"
    text = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--db-root", str(SAMPLE),
                     "--question-id", str(rows[4]["question_id"]), "--preset", "bare")
    assert text.returncode == 0 and "===== user =====" in text.stdout and rows[4]["question"] in text.stdout


def test_prompt_without_data_shows_the_embedded_sample_as_eval_runs_it():
    rows = json.loads((SAMPLE / "dev.json").read_text())
    proc = t2sql_cli("prompt", "--index", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["messages"] == build_prompt(Task.from_row(rows[3], SAMPLE), get_preset())
    first = t2sql_cli("prompt")
    assert first.returncode == 0 and rows[0]["question"] in first.stdout, first.stderr
    alone = t2sql_cli("prompt", "--db-root", str(SAMPLE))
    assert alone.returncode == 2 and "--db-root needs --data" in alone.stderr and not alone.stdout


def test_prompt_reads_a_converted_jsonl_and_skips_bad_lines(tmp_path):
    rows = json.loads((SAMPLE / "dev.json").read_text())
    # A converted row keeps the db_path recorded at conversion (in its metadata); a flat row is BIRD's,
    # found beside the data file.
    row = {"label": {"gold_sql": rows[0]["SQL"], "db_id": rows[0]["db_id"], "question_id": rows[0]["question_id"]},
           "metadata": {"question": rows[0]["question"], "evidence": rows[0]["evidence"],
                        "db_path": str(SAMPLE / "superhero" / "superhero.sqlite")}}
    data = tmp_path / "train.jsonl"
    data.write_text("{not json\n" + json.dumps(row) + "\n")
    proc = t2sql_cli("prompt", "--data", str(data), "--index", "0")
    assert proc.returncode == 0, proc.stderr
    assert "train.jsonl:1: skipped" in proc.stderr and rows[0]["question"] in proc.stdout


def test_prompt_errors_say_what_to_pass(tmp_path):
    out_of_range = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--db-root", str(SAMPLE),
                             "--index", "100000")
    assert out_of_range.returncode == 2 and "out of range" in out_of_range.stderr
    unknown = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--db-root", str(SAMPLE), "--question-id", "nope")
    assert unknown.returncode == 2 and "no row with question_id 'nope'" in unknown.stderr
    no_db = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--db-root", str(tmp_path), "--index", "0")
    assert no_db.returncode == 2 and "superhero" in no_db.stderr
    preset = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--db-root", str(SAMPLE), "--preset", "x")
    assert preset.returncode == 2 and "choose one of" in preset.stderr


def test_prompt_finds_bird_databases_beside_the_data_file_as_eval_and_gold_do():
    rows = json.loads((SAMPLE / "dev.json").read_text())
    proc = t2sql_cli("prompt", "--data", str(SAMPLE / "dev.json"), "--index", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["messages"] == build_prompt(Task.from_row(rows[2], SAMPLE), get_preset())


def test_prompt_says_where_it_looked_and_names_db_root_when_a_database_is_missing(tmp_path):
    data = tmp_path / "dev.json"  # BIRD questions without their databases beside them
    data.write_text((SAMPLE / "dev.json").read_text())
    beside = t2sql_cli("prompt", "--data", str(data), "--index", "0")
    expected = tmp_path / "superhero" / "superhero.sqlite"
    assert beside.returncode == 2 and "Traceback" not in beside.stderr
    # t2sql.tasks' one message: the db_id, the path looked at, the databases that root has, the flag.
    assert beside.stderr == (f"t2sql prompt: unknown db_id 'superhero': {expected} does not exist (databases "
                             f"under {tmp_path}: none); check --db-root and the data file's db_id\n")
    (tmp_path / "empty").mkdir()
    under = t2sql_cli("prompt", "--data", str(data), "--db-root", str(tmp_path / "empty"), "--index", "0")
    assert under.returncode == 2 and f"{tmp_path / 'empty' / 'superhero' / 'superhero.sqlite'} does not exist" \
        in under.stderr
    nowhere = t2sql_cli("prompt", "--data", str(data), "--db-root", str(tmp_path / "nowhere"), "--index", "0")
    assert nowhere.returncode == 2 and f"--db-root {tmp_path / 'nowhere'} is not a directory" in nowhere.stderr
    # A converted row (it has metadata) with no db_path.
    row = json.loads((SAMPLE / "dev.json").read_text())[0]
    converted = tmp_path / "train.jsonl"
    converted.write_text(json.dumps({"label": {"gold_sql": row["SQL"], "db_id": row["db_id"],
                                               "question_id": row["question_id"]},
                                     "metadata": {"question": row["question"], "evidence": row["evidence"]}}) + "\n")
    no_path = t2sql_cli("prompt", "--data", str(converted))
    assert no_path.returncode == 2 and "has no db_path" in no_path.stderr and "--db-root DIR" in no_path.stderr


def test_curriculum_is_a_t2sql_subcommand(tmp_path):
    policy = Curriculum(["a", "b"], seed=1)
    policy.next_tasks(2)
    policy.observe("a", [False] * 4)
    state = tmp_path / "t2sql_curriculum_3.json"
    policy.save(state)
    proc = t2sql_cli("curriculum", str(state), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["hinted"] == 1
    assert "curriculum" in t2sql_cli("--help").stdout
