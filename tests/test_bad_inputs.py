"""Harm nothing it is pointed at, on the input side: one database path rule for every command, bounded
readers of users' JSON, and bad input that is one reported line, never a traceback or a lost run.

Every command case runs the real `t2sql` in a subprocess on the bundled superhero sample (copied under
tmp_path, so a test can put a FIFO or a broken description file beside it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SAMPLE_ROOT, child_env
from t2sql import jsonl
from t2sql.databases import database_path, db_id_problem, find_database, list_databases
from t2sql.episode import schema
from t2sql.errors import UnknownDatabase
from t2sql.eval.results import ResultsFile
from t2sql.tasks import Task, load_questions

ROWS = json.loads((SAMPLE_ROOT / "dev.json").read_text())


def t2sql(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = child_env(T2SQL_PROGRESS_INTERVAL="0")  # the t2sql under test, wherever this process found it
    if cwd is not None:
        env["T2SQL_HOME"] = str(cwd / "home")
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def sample_root(tmp_path: Path) -> Path:
    """A copy of the sample's database folder: <root>/superhero/superhero.sqlite with its descriptions."""
    root = tmp_path / "root"
    shutil.copytree(SAMPLE_ROOT / "superhero", root / "superhero")
    return root


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value))
    return path


def write_lines(path: Path, lines: list[str | bytes]) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


def strict_lines(path: Path) -> list:
    """Every line of a file we wrote, read as strict JSON (no NaN/Infinity)."""
    return [jsonl.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# ---- 5. one database path rule -----------------------------------------------------------------

BAD_DB_IDS = ["", ".", "..", "../x/secret", "/tmp/x/secret", "a\\b", "nul\0byte", "x" * 256]


@pytest.mark.parametrize("db_id", BAD_DB_IDS)
def test_a_db_id_that_is_not_one_folder_name_is_refused_before_the_disk_is_looked_at(db_id, tmp_path):
    assert db_id_problem(db_id) is not None
    with pytest.raises(UnknownDatabase, match="invalid db_id") as first:
        find_database(tmp_path, db_id)
    with pytest.raises(UnknownDatabase) as composed:
        database_path(tmp_path, db_id)
    assert str(composed.value) == str(first.value)
    assert db_id_problem("superhero") is None and db_id_problem("x" * 255) is None


def test_the_message_for_a_path_outside_the_root_is_the_same_whether_the_file_exists(tmp_path):
    root = sample_root(tmp_path)
    outside = tmp_path / "x"
    db_id = str(outside / "secret")  # the old layout made this <root>/.../x/secret.sqlite: an absolute path
    rows = [dict(ROWS[0], db_id=db_id)]
    data = write_json(tmp_path / "q.json", rows)
    before = t2sql("prompt", "--data", str(data), "--db-root", str(root))
    outside.mkdir()
    shutil.copy(root / "superhero" / "superhero.sqlite", outside / "secret.sqlite")
    after = t2sql("prompt", "--data", str(data), "--db-root", str(root))
    assert before.returncode == after.returncode == 2
    assert before.stderr == after.stderr and "invalid db_id" in after.stderr
    assert after.stdout == ""  # nothing of the outside database's schema


def _outside_database(tmp_path: Path) -> tuple[Path, list[dict]]:
    """A real database outside the root, and one row each naming it by an absolute and by a `..` db_id."""
    root = sample_root(tmp_path)
    (tmp_path / "x" / "secret").mkdir(parents=True)
    for place in (tmp_path / "x" / "secret.sqlite", tmp_path / "x" / "secret" / "secret.sqlite"):
        shutil.copy(root / "superhero" / "superhero.sqlite", place)
    rows = [dict(ROWS[0], db_id=str(tmp_path / "x" / "secret")), dict(ROWS[1], db_id="../x/secret")]
    return root, rows


def test_convert_refuses_a_db_id_outside_the_root_and_writes_nothing(tmp_path):
    root, rows = _outside_database(tmp_path)
    data = write_json(tmp_path / "q.json", rows + [ROWS[2]])
    proc = t2sql("convert", "--questions", str(data), "--db-root", str(root), "--out-dir", str(tmp_path / "out"),
                 "--no-check-gold")
    assert proc.returncode == 1 and proc.stderr.count("bad_db_id: invalid db_id") == 2, proc.stderr
    assert not (tmp_path / "out" / "q.jsonl").exists()
    kept = t2sql("convert", "--questions", str(data), "--db-root", str(root), "--out-dir", str(tmp_path / "out"),
                 "--no-check-gold", "--drop-invalid")
    assert kept.returncode == 0, kept.stderr
    written = strict_lines(tmp_path / "out" / "q.jsonl")
    assert [r["metadata"]["db_id"] for r in written] == ["superhero"]
    assert "secret" not in (tmp_path / "out" / "q.jsonl").read_text()


def test_eval_and_gold_never_open_a_database_outside_the_root(tmp_path):
    root, rows = _outside_database(tmp_path)
    data = write_json(tmp_path / "q.json", rows + [ROWS[2]])
    out = tmp_path / "r.jsonl"
    proc = t2sql("eval", "--policy", "oracle", "--data", str(data), "--db-root", str(root), "--out", str(out),
                 cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("invalid db_id") == 2
    records = strict_lines(out)[1:]
    assert [r["db_id"] for r in records] == ["superhero"]  # only the task inside the root ran
    gold = t2sql("gold", "--data", str(data), "--db-root", str(root), "--json")
    failures = json.loads(gold.stdout)["failures"]
    assert gold.returncode == 1 and len(failures) == 2 and all("invalid db_id" in f["error"] for f in failures)


def test_a_recorded_db_path_must_be_the_layout_of_its_own_db_id(tmp_path):
    root = sample_root(tmp_path)
    good = str(root / "superhero" / "superhero.sqlite")

    def converted(db_path: str, db_id: str = "superhero") -> dict:
        return {"label": {"gold_sql": "SELECT 1"},
                "metadata": {"question_id": "1", "db_id": db_id, "db_path": db_path, "question": "q"}}

    assert Task.from_row(converted(good)).db_path == good
    for db_path in ("/etc/passwd", "superhero/superhero.sqlite", str(root / "superhero" / "other.sqlite"),
                    str(root / "superhero" / ".." / "superhero" / "superhero.sqlite")):
        with pytest.raises(UnknownDatabase, match="recorded db_path"):
            Task.from_row(converted(db_path))
    with pytest.raises(UnknownDatabase, match="invalid db_id"):
        Task.from_row(converted("/x/../x/..sqlite", db_id=".."))
    # A command reading such a row names it and goes on.
    data = write_lines(tmp_path / "c.jsonl", [json.dumps(converted("/etc/passwd")), json.dumps(converted(good))])
    proc = t2sql("prompt", "--data", str(data))
    assert proc.returncode == 2 and "recorded db_path '/etc/passwd'" in proc.stderr


def test_convert_records_a_path_that_keeps_the_layout_through_a_symlinked_root(tmp_path):
    real = sample_root(tmp_path)
    link = tmp_path / "linked"
    link.symlink_to(real)
    data = write_json(tmp_path / "q.json", ROWS[:1])
    proc = t2sql("convert", "--questions", str(data), "--db-root", str(link), "--out-dir", str(tmp_path / "out"),
                 "--no-check-gold")
    assert proc.returncode == 0, proc.stderr
    row = strict_lines(tmp_path / "out" / "q.jsonl")[0]
    assert row["metadata"]["db_path"] == str(link / "superhero" / "superhero.sqlite")
    assert Task.from_row(row).db_path == row["metadata"]["db_path"]  # readable again without a root


@pytest.fixture()
def fifo_root(tmp_path: Path) -> Path:
    """BIRD's layout with a FIFO where the database file should be: opening it would block forever."""
    root = tmp_path / "fifo"
    (root / "superhero").mkdir(parents=True)
    os.mkfifo(root / "superhero" / "superhero.sqlite")
    write_json(root / "dev.json", ROWS[:2])
    return root


def test_find_database_refuses_a_fifo_by_its_stat(fifo_root):
    with pytest.raises(UnknownDatabase, match="is a FIFO"):
        find_database(fifo_root, "superhero")
    assert list_databases(fifo_root) == []


@pytest.mark.parametrize("command", ["prompt", "eval", "gold", "convert"])
def test_every_command_refuses_a_fifo_database_without_opening_it(fifo_root, command, tmp_path):
    data = str(fifo_root / "dev.json")
    args = {"prompt": ["--data", data],
            "eval": ["--policy", "oracle", "--data", data, "--out", str(tmp_path / "r.jsonl")],
            "gold": ["--data", data],
            "convert": ["--questions", data, "--db-root", str(fifo_root), "--out-dir", str(tmp_path / "out")]}
    proc = t2sql(command, *args[command], cwd=tmp_path, timeout=60)  # a reader opening the FIFO hangs here
    assert proc.returncode in (1, 2) and "is a FIFO" in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)


# ---- 7. bounded readers -------------------------------------------------------------------------

def test_a_question_file_that_is_a_fifo_is_refused_unopened(tmp_path):
    fifo = tmp_path / "q.json"
    os.mkfifo(fifo)
    proc = t2sql("prompt", "--data", str(fifo), "--db-root", str(SAMPLE_ROOT), timeout=60)
    assert proc.returncode == 2 and "is a FIFO, not a regular file" in proc.stderr


def test_a_line_over_the_limit_is_one_bad_line(tmp_path):
    big = json.dumps(dict(ROWS[1], evidence="x" * (jsonl.MAX_LINE_BYTES + 10)))
    data = write_lines(tmp_path / "q.jsonl", [json.dumps(ROWS[0]), big, json.dumps(ROWS[2])])
    rows, problems = load_questions(data)
    assert [n for n, _ in rows] == [1, 3]
    assert [(p.kind, p.row) for p in problems] == [("bad_line", 2)] and "longer than" in problems[0].message


@pytest.fixture()
def oversized_evidence(tmp_path: Path) -> Path:
    """Three tasks whose evidence is 10 MB each, and one ordinary task."""
    rows = [dict(r, evidence=r["evidence"] + " " + "x" * (10 << 20)) for r in ROWS[:3]] + [ROWS[3]]
    return write_json(tmp_path / "big.json", rows)


def test_an_oversized_evidence_is_refused_by_eval_in_bounded_memory(oversized_evidence, tmp_path):
    out = tmp_path / "r.jsonl"
    # The child's peak RSS, measured by a parent of its own (RUSAGE_CHILDREN of this process would hold
    # every earlier test's children too).
    measure = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")
    proc = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "t2sql.cli", "eval", "--policy",
                           "oracle", "--data", str(oversized_evidence), "--db-root", str(SAMPLE_ROOT), "--out",
                           str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "T2SQL_HOME": str(tmp_path / "home")})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("above the preset's prompt.evidence_max_chars (16,000)") == 3
    assert [r["question_id"] for r in strict_lines(out)[1:]] == [str(ROWS[3]["question_id"])]
    peak_kib = int(proc.stderr.strip().splitlines()[-1])
    assert peak_kib < 512 * 1024, f"peak RSS {peak_kib // 1024} MiB for a 30 MB data file"


def test_an_oversized_question_or_evidence_is_one_problem_in_convert_and_prompt(oversized_evidence, tmp_path):
    proc = t2sql("convert", "--questions", str(oversized_evidence), "--db-root", str(SAMPLE_ROOT), "--out-dir",
                 str(tmp_path / "out"), "--no-check-gold")
    assert proc.returncode == 1 and proc.stderr.count("too_long: its evidence is") == 3, proc.stderr
    prompt = t2sql("prompt", "--data", str(oversized_evidence), "--db-root", str(SAMPLE_ROOT), "--index", "0")
    assert prompt.returncode == 2 and prompt.stdout == ""
    assert prompt.stderr.count("\n") == 1 and "evidence_max_chars" in prompt.stderr
    long_question = write_json(tmp_path / "q.json", [dict(ROWS[0], question="why " * 2000)])
    prompt = t2sql("prompt", "--data", str(long_question), "--db-root", str(SAMPLE_ROOT))
    assert prompt.returncode == 2 and "its question is 8,000 characters" in prompt.stderr


# ---- 8. bad input is one line -------------------------------------------------------------------

NESTED = "[" * 1500 + "]" * 1500


@pytest.fixture()
def nested_jsonl(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "q.jsonl", [json.dumps(ROWS[0]), NESTED, json.dumps(ROWS[1])])


def test_a_deeply_nested_line_is_one_bad_line_for_convert(nested_jsonl, tmp_path):
    proc = t2sql("convert", "--questions", str(nested_jsonl), "--db-root", str(SAMPLE_ROOT), "--out-dir",
                 str(tmp_path / "out"), "--no-check-gold")
    assert proc.returncode == 1 and "row 2: bad_line: nested deeper than 64 levels" in proc.stderr, proc.stderr


def test_a_deeply_nested_line_is_one_skipped_row_for_eval(nested_jsonl, tmp_path):
    out = tmp_path / "r.jsonl"
    proc = t2sql("eval", "--policy", "oracle", "--data", str(nested_jsonl), "--db-root", str(SAMPLE_ROOT),
                 "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "row 2: bad_line: nested deeper" in proc.stderr and len(strict_lines(out)) == 3  # header + 2


def test_a_deeply_nested_line_is_one_failure_for_gold(nested_jsonl):
    proc = t2sql("gold", "--data", str(nested_jsonl), "--db-root", str(SAMPLE_ROOT), "--json")
    summary = json.loads(proc.stdout)
    assert proc.returncode == 1 and summary["ok"] == 2
    assert [(f["row"], f["error"]) for f in summary["failures"]] == [(2, "line 2: nested deeper than 64 levels")]


def test_a_deeply_nested_line_is_skipped_by_prompt(nested_jsonl):
    proc = t2sql("prompt", "--data", str(nested_jsonl), "--db-root", str(SAMPLE_ROOT), "--index", "1")
    assert proc.returncode == 0 and ROWS[1]["question"] in proc.stdout
    assert f"{nested_jsonl}:2: skipped: nested deeper than 64 levels" in proc.stderr


def test_a_resumed_results_file_ignores_a_nested_or_overlong_line(tmp_path):
    out = tmp_path / "r.jsonl"
    data = write_json(tmp_path / "q.json", ROWS[:2])
    args = ("eval", "--policy", "oracle", "--data", str(data), "--db-root", str(SAMPLE_ROOT), "--out", str(out))
    assert t2sql(*args, cwd=tmp_path).returncode == 0
    with open(out, "a") as f:
        f.write(NESTED + "\n")
        f.write('{"question_id": "' + "x" * (jsonl.MAX_LINE_BYTES + 1) + '", "outcome": "correct"}\n')
    again = t2sql(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "line 4 is not a result line (nested deeper than 64 levels); ignored" in again.stderr
    assert "line 5 is longer than 16,777,216 bytes" in again.stderr
    assert "0 episodes run: all 2 were in" in again.stderr


@pytest.mark.parametrize("raw_id", ["1e999", "NaN", "-Infinity", "1" * 5000])
def test_an_id_that_is_no_json_number_is_one_skipped_row_and_never_written(raw_id, tmp_path):
    good = json.dumps(ROWS[:2])
    text = good.replace(f'"question_id": {ROWS[0]["question_id"]}', f'"question_id": {raw_id}', 1)
    data = tmp_path / "q.json"
    data.write_text(text)
    out = tmp_path / "r.jsonl"
    proc = t2sql("eval", "--policy", "oracle", "--data", str(data), "--db-root", str(SAMPLE_ROOT), "--out", str(out),
                 "--json", cwd=tmp_path)
    assert proc.returncode == 0 and "row 1: bad_line:" in proc.stderr, proc.stderr
    assert [r["question_id"] for r in strict_lines(out)[1:]] == [str(ROWS[1]["question_id"])]
    jsonl.loads(proc.stdout)  # the summary too is strict JSON


def test_a_results_line_never_holds_nan_or_infinity(tmp_path):
    out = tmp_path / "r.jsonl"
    with ResultsFile.open(out, {"policy": "oracle"}) as results:
        results.append({"question_id": "1", "outcome": "correct", "reward": float("nan"),
                        "elapsed_s": float("inf")})
    record = strict_lines(out)[1]
    assert record["reward"] is None and record["elapsed_s"] is None


@pytest.fixture()
def broken_descriptions(tmp_path: Path) -> Path:
    """The sample's layout with colour.csv holding an unterminated quote over a field larger than the csv
    module takes, and a FIFO named like a description file."""
    root = sample_root(tmp_path)
    folder = root / "superhero" / "database_description"
    (folder / "colour.csv").write_text("original_column_name,column_description\nid,\"" + "x" * 200_000 + "\n")
    os.mkfifo(folder / "zz_fifo.csv")
    write_json(root / "dev.json", ROWS[:3])
    return root


def test_an_unreadable_description_csv_is_skipped_with_one_warning(broken_descriptions, caplog):
    schema._warned_files.clear()
    with caplog.at_level("WARNING", logger="t2sql.schema"):
        first = schema.read_descriptions(broken_descriptions / "superhero")
        second = schema.read_descriptions(broken_descriptions / "superhero")
    assert first == second and "colour" not in first and "superhero" in first  # the other tables keep theirs
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2  # one per file, not one per read
    assert any("colour.csv" in w and "field larger than field limit" in w for w in warned)
    assert any("zz_fifo.csv" in w and "not a regular file" in w for w in warned)


@pytest.mark.parametrize("command", ["prompt", "eval", "convert"])
def test_an_unreadable_description_csv_never_stops_a_command(broken_descriptions, command, tmp_path):
    data = str(broken_descriptions / "dev.json")
    args = {"prompt": ["--data", data],
            "eval": ["--policy", "oracle", "--data", data, "--out", str(tmp_path / "r.jsonl")],
            "convert": ["--questions", data, "--db-root", str(broken_descriptions), "--out-dir",
                        str(tmp_path / "out"), "--no-check-gold"]}
    proc = t2sql(command, *args[command], cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("skipped the column descriptions in") == 2  # two files, once each per process
    if command == "eval":
        assert [r["outcome"] for r in strict_lines(tmp_path / "r.jsonl")[1:]] == ["correct"] * 3


def test_curriculum_reads_its_state_and_rows_through_the_same_rules(tmp_path):
    from t2sql.miles.curriculum import Curriculum

    policy = Curriculum(["1", "2"], seed=1)
    policy.next_tasks(2)
    policy.observe("1", [False] * 4)
    state = tmp_path / "state.json"
    policy.save(state)
    row = {"label": {"gold_sql": "SELECT 1"}, "metadata": {"question_id": "1", "evidence": "e"}}
    data = write_lines(tmp_path / "train.jsonl", [json.dumps(row), NESTED])
    proc = t2sql("curriculum", str(state), "--data", str(data), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["hinted"][0]["task"] == "1"
    assert f"{data}:2: skipped, not a t2sql row (nested deeper than 64 levels)" in proc.stderr
    nested = tmp_path / "nested.json"
    nested.write_text(NESTED)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for bad, says in ((nested, "nested deeper than 64 levels"), (fifo, "is a FIFO")):
        refused = t2sql("curriculum", str(bad), timeout=60)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr


@pytest.mark.parametrize("kwargs, says", [(NESTED, "nested deeper than 64 levels"),
                                          ('{"temperature": NaN}', "NaN is not a JSON number")])
def test_chat_template_kwargs_are_read_by_the_same_rules(kwargs, says, tmp_path):
    proc = t2sql("eval", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--chat-template-kwargs", kwargs,
                 "--out", str(tmp_path / "r.jsonl"), cwd=tmp_path)
    assert proc.returncode == 2 and f"--chat-template-kwargs: {says}" in proc.stderr, proc.stderr
