"""`t2sql eval --out`: a results file is t2sql's own or it is refused; one writer at a time; a closed
stdout is not success. Every case runs the real command in a subprocess on the bundled sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO
from t2sql.eval.results import RESULTS_FORMAT, ResultsFile
from t2sql.tasks import release_dir, sample_questions

EVAL = [sys.executable, "-m", "t2sql.cli", "eval", "--policy", "oracle"]


def _eval(tmp_path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "T2SQL_HOME": str(tmp_path / "home"), "T2SQL_PROGRESS_INTERVAL": "0"}
    return subprocess.run([*EVAL, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=timeout)


def _refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr
    return proc.stderr


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_a_file_that_is_not_a_results_file_is_left_byte_for_byte(tmp_path):
    other = tmp_path / "notes.jsonl"
    chunk = b"".join(f"line {i} of someone's own notes, not t2sql's\n".encode() for i in range(20_000))
    other.write_bytes(chunk * 4)  # about 4 MB, the last line whole: nothing here looks like a torn write
    before = other.read_bytes()
    _refused(_eval(tmp_path, "--limit", "3", "--out", str(other)), "not a t2sql results file", "--out")
    assert other.read_bytes() == before
    torn = tmp_path / "torn.txt"
    torn.write_bytes(before + b"no newline at the end")  # once taken for a cut last line and dropped
    _refused(_eval(tmp_path, "--limit", "3", "--out", str(torn)), "not a t2sql results file")
    assert torn.read_bytes() == before + b"no newline at the end"
    _refused(_eval(tmp_path, "--limit", "3", "--out", str(torn), "--fresh"), "not a t2sql results file")
    assert torn.read_bytes() == before + b"no newline at the end"


def test_the_data_file_is_never_the_results_file(tmp_path):
    data = tmp_path / "dev.json"
    data.write_bytes(sample_questions().read_bytes())
    before = data.read_bytes()
    root = str(sample_questions().parent)
    _refused(_eval(tmp_path, "--data", str(data), "--db-root", root, "--limit", "3", "--out", str(data)),
             "is the data file")
    link = tmp_path / "results.jsonl"
    link.symlink_to(data)
    _refused(_eval(tmp_path, "--data", str(data), "--db-root", root, "--limit", "3", "--out", str(link), "--fresh"),
             "is the data file")
    assert data.read_bytes() == before


@pytest.mark.parametrize("device", ["/dev/full", "/dev/zero", "fifo"])
def test_a_device_or_fifo_is_refused_unread(tmp_path, device):
    if device == "fifo":
        device = str(tmp_path / "pipe")
        os.mkfifo(device)
    proc = _eval(tmp_path, "--limit", "3", "--out", device, timeout=60)  # reading /dev/zero would never end
    _refused(proc, "not a regular file")


def test_another_run_is_not_resumed_and_fresh_starts_over(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    rows = json.loads(sample_questions().read_text())[:3]
    (a / "dev.json").write_text(json.dumps(rows))
    rows[0] = {**rows[0], "SQL": "SELECT 1"}  # other gold SQL under the same file name
    (b / "dev.json").write_text(json.dumps(rows))
    sample_db = sample_questions().parent
    out = tmp_path / "results.jsonl"
    first = _eval(tmp_path, "--data", str(a / "dev.json"), "--db-root", str(sample_db), "--out", str(out))
    assert first.returncode == 0, first.stderr
    kept = out.read_bytes()
    stderr = _refused(_eval(tmp_path, "--data", str(b / "dev.json"), "--db-root", str(sample_db), "--out", str(out)),
                      "holds results of another run", "data_sha256", "--fresh")
    assert "already finished" not in stderr and out.read_bytes() == kept
    fresh = _eval(tmp_path, "--data", str(b / "dev.json"), "--db-root", str(sample_db), "--out", str(out), "--fresh")
    assert fresh.returncode in (0, 1), fresh.stderr  # the changed gold may not match itself the oracle's way
    header, *records = _lines(out)
    assert header["format"] == RESULTS_FORMAT and len(records) == 3
    # Without --out, the two data files of one name get two default files (their content hashes differ).
    for folder in (a, b):
        proc = _eval(tmp_path, "--data", str(folder / "dev.json"), "--db-root", str(sample_db))
        assert proc.returncode in (0, 1), proc.stderr
    assert len(list((tmp_path / "home" / "eval").glob("eval-oracle-*.jsonl"))) == 2


def test_results_of_an_older_t2sql_are_refused_with_what_to_do(tmp_path):
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"question_id": "1", "outcome": "correct", "reward": 1.0}) + "\n")
    _refused(_eval(tmp_path, "--limit", "3", "--out", str(old)), "older t2sql", "--fresh")
    proc = _eval(tmp_path, "--limit", "3", "--out", str(old), "--fresh")
    assert proc.returncode == 0, proc.stderr
    assert _lines(old)[0]["format"] == RESULTS_FORMAT and len(_lines(old)) == 4


def test_a_second_writer_is_refused_at_once_naming_the_first(tmp_path):
    out = tmp_path / "results.jsonl"
    first = _eval(tmp_path, "--limit", "2", "--out", str(out))
    assert first.returncode == 0, first.stderr
    header = _lines(out)[0]
    with ResultsFile.open(out, header["run"]):  # this process is now the file's writer
        proc = _eval(tmp_path, "--limit", "3", "--out", str(out), timeout=60)
        _refused(proc, f"pid {os.getpid()}", "another t2sql eval")
    again = _eval(tmp_path, "--limit", "3", "--out", str(out))  # released: resumed, 1 more episode
    assert again.returncode == 0, again.stderr
    assert "resuming" in again.stderr and len(_lines(out)) == 1 + 3
    assert not (tmp_path / "results.jsonl.lock").exists()  # the lock goes with its run


def test_an_out_in_a_folder_that_does_not_exist_is_refused(tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "results.jsonl"
    _refused(_eval(tmp_path, "--limit", "3", "--out", str(out)), "does not exist")
    assert not (tmp_path / "no").exists()


def test_a_closed_stdout_is_not_success_and_the_results_are_written(tmp_path):
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "T2SQL_HOME": str(tmp_path / "home")}
    command = (f"set -o pipefail; {sys.executable} -m t2sql.cli eval --policy oracle --limit 5 --out {out} "
               f"2> {tmp_path / 'err'} | true")  # the reader is gone before the summary is written: a broken pipe
    proc = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode in (141, 1), proc.returncode
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "Exception ignored" not in err, err
    header, *records = _lines(out)
    assert header["format"] == RESULTS_FORMAT and len(records) == 5


def test_skipped_tasks_are_listed_fifty_at_most(tmp_path):
    # The recipe's arcwise file on the three bundled dev databases: 358 of its 498 tasks have no database here.
    proc = _eval(tmp_path, "--data", str(release_dir() / "arcwise_plat_sql.json"),
                 "--db-root", str(REPO / "tests" / "data" / "bird"), "--concurrency", "4")
    assert proc.returncode == 0, proc.stderr
    skipped = [line for line in proc.stderr.splitlines() if line.startswith("skipped: ")]
    assert len(skipped) == 51 and skipped[-1] == "skipped: ... and 308 more"

    summary = proc.stdout
    assert "rows skipped: 358" in summary


def test_a_closed_stderr_never_stops_the_run(tmp_path):
    # `t2sql eval ... 2>&1 | head -1`: the reader is gone before the first progress line; the run goes on to the end.
    out = tmp_path / "results.jsonl"
    env = {**os.environ, "T2SQL_HOME": str(tmp_path / "home")}
    command = f"set -o pipefail; {sys.executable} -m t2sql.cli eval --policy oracle --limit 20 --out {out} 2>&1 | true"
    proc = subprocess.run(["bash", "-c", command], env=env, cwd=tmp_path, timeout=180)
    assert proc.returncode == 141
    header, *records = _lines(out)
    assert header["format"] == RESULTS_FORMAT and len(records) == 20  # every result written
