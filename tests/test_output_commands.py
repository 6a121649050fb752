"""Every command that writes follows t2sql.atomic's rule, as a user runs it (real subprocesses, real paths,
the bundled superhero sample): `grade --out`, `gold --report` and `--manifest`, `convert`, `t2sql-train
prepare`'s split files and manifests, `bench`'s work files. And SIGTERM mid-run unwinds as SIGINT does:
no temporary file stays behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import child_env
from t2sql.tasks import sample_dir, sample_questions
from test_output_rule import NOT_FILES, make_not_a_file, state, temporaries

SAMPLE = sample_dir()
TRAIN = ["-c", "import sys; from t2sql.miles.train import main; sys.exit(main())"]
ENDLESS = "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=cwd,
                          env=child_env(T2SQL_PROGRESS_INTERVAL="0"))


def t2sql(*args: str) -> subprocess.CompletedProcess:
    return run("-m", "t2sql.cli", *args)


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The one stderr line of a command refused with exit 2."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def foreign(path: Path) -> bytes:
    """A file a user wrote, at `path`; its bytes, to compare with afterwards."""
    content = b"someone's own file, not t2sql's\n" * 100
    path.write_bytes(content)
    return content


def sample_rows(n: int) -> list[dict]:
    return [q for q in json.loads(sample_questions().read_text()) if q["db_id"] == "superhero"][:n]


# ------------------------------------------------------------------------------------------ grade --out


def pairs_file(folder: Path) -> Path:
    pairs = folder / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": q["question_id"], "db_id": "superhero", "pred": q["SQL"],
                                         "gold": q["SQL"]}) + "\n" for q in sample_rows(3)))
    return pairs


def grade(pairs: Path, out: Path | str, *more: str) -> subprocess.CompletedProcess:
    return t2sql("grade", "--pairs", str(pairs), "--db-root", str(SAMPLE), "--out", str(out), *more)


@pytest.mark.parametrize("kind", [*NOT_FILES, "symlink_to_stdout"])
def test_grade_out_never_replaces_what_is_not_a_file(tmp_path, kind):
    pairs = pairs_file(tmp_path)
    if kind == "symlink_to_stdout":  # what /dev/stdout is; the child's stdout is a pipe
        path = tmp_path / "stdout"
        path.symlink_to("/proc/self/fd/1")
    else:
        path = make_not_a_file(tmp_path, kind)
    before = state(path)
    proc = grade(pairs, path)
    refused(proc, f"--out {path}")
    assert proc.stdout == "" and state(path) == before and temporaries(tmp_path) == []


def test_grade_out_is_never_the_commands_own_stdout(tmp_path):
    """`--out /dev/stdout > f` and `--out f > f`: renaming over f would leave the summary writing into a file
    that is gone (and the verdicts where stdout no longer goes)."""
    pairs = pairs_file(tmp_path)
    captured = tmp_path / "captured.txt"
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    for out in (link, captured):
        with captured.open("w") as stdout:
            proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "grade", "--pairs", str(pairs), "--db-root",
                                   str(SAMPLE), "--out", str(out)], stdout=stdout, stderr=subprocess.PIPE,
                                  text=True, timeout=300, env=child_env())
        assert proc.returncode == 2 and "is this command's standard output" in proc.stderr, proc.stderr
        assert captured.read_text() == "" and link.is_symlink() and temporaries(tmp_path) == []


def test_grade_out_replaces_its_own_verdicts_and_no_other_file(tmp_path):
    pairs = pairs_file(tmp_path)
    out = tmp_path / "verdicts.jsonl"
    assert grade(pairs, out).returncode == 0
    first = out.read_bytes()
    assert grade(pairs, out).returncode == 0 and out.read_bytes() == first  # a rerun: its own output
    notes = tmp_path / "notes.jsonl"
    before = foreign(notes)
    refused(grade(pairs, notes), "not a t2sql grade verdicts file", "--force")
    assert notes.read_bytes() == before
    assert grade(pairs, notes, "--force").returncode == 0 and notes.read_bytes() == first
    refused(grade(pairs, tmp_path / "no" / "such" / "v.jsonl"), "does not exist")
    assert not (tmp_path / "no").exists() and temporaries(tmp_path) == []


# ------------------------------------------------------------------------------- gold --report, --manifest


def test_gold_report_and_manifest_replace_their_own_files_only(tmp_path):
    data = tmp_path / "q.json"
    data.write_text(json.dumps(sample_rows(3)))
    report, cache = tmp_path / "report.json", tmp_path / "cache"

    def gold(*more: str) -> subprocess.CompletedProcess:
        return t2sql("gold", "--data", str(data), "--db-root", str(SAMPLE), "--concurrency", "1", *more)

    notes = tmp_path / "notes.json"
    before = foreign(notes)
    refused(gold("--report", str(notes), "--cache-dir", str(cache)), "not a t2sql gold report", "--force")
    assert notes.read_bytes() == before and not cache.exists()  # refused before any gold ran
    first = gold("--report", str(report), "--cache-dir", str(cache))
    assert first.returncode == 0, first.stderr
    assert json.loads(report.read_text())["format"] == "t2sql-gold-report"
    manifest = cache / "manifest.json"
    assert json.loads(manifest.read_text())["format"] == "t2sql-database-manifest"
    # Files an older t2sql wrote, without the format marker, are its own output all the same.
    for path in (report, manifest):
        older = {k: v for k, v in json.loads(path.read_text()).items() if k != "format"}
        if path == report:
            older.pop("version")
        path.write_text(json.dumps(older, indent=1) + "\n")
    again = gold("--report", str(report), "--cache-dir", str(cache))
    assert again.returncode == 0, again.stderr
    assert "format" in json.loads(report.read_text()) and "format" in json.loads(manifest.read_text())
    refused(gold("--manifest", str(notes)), "not a t2sql database manifest", "--force")
    assert notes.read_bytes() == before
    assert gold("--manifest", str(notes), "--force").returncode == 0
    assert json.loads(notes.read_text())["format"] == "t2sql-database-manifest"
    fifo = make_not_a_file(tmp_path, "fifo")
    refused(gold("--report", str(fifo), "--force"), "not a regular file")
    refused(gold("--manifest", str(tmp_path / "no" / "m.json")), "does not exist")
    refused(gold("--cache-dir", str(tmp_path / "no" / "cache")), "does not exist")
    refused(gold("--report", str(data), "--force"), "is the --data file this run reads")
    assert not (tmp_path / "no").exists() and json.loads(data.read_text()) == sample_rows(3)
    assert temporaries(tmp_path) == []


# ------------------------------------------------------------------------------------------------ convert


def test_convert_replaces_a_split_it_converted_and_no_other_file(tmp_path):
    questions = tmp_path / "hero.json"
    questions.write_text(json.dumps(sample_rows(3)))
    out = tmp_path / "out"

    def convert(out_dir: Path, *more: str) -> subprocess.CompletedProcess:
        return t2sql("convert", "--questions", str(questions), "--db-root", str(SAMPLE), "--out-dir", str(out_dir),
                     "--no-check-gold", *more)

    first = convert(out)  # --out-dir is made (its parent exists)
    assert first.returncode == 0, first.stderr
    converted = (out / "hero.jsonl").read_bytes()
    assert convert(out).returncode == 0 and (out / "hero.jsonl").read_bytes() == converted  # its own: replaced
    before = foreign(out / "hero.jsonl")
    refused(convert(out), "not a split t2sql converted", "--force")
    assert (out / "hero.jsonl").read_bytes() == before
    assert convert(out, "--force").returncode == 0 and (out / "hero.jsonl").read_bytes() == converted
    (out / "hero.jsonl").unlink()
    fifo = out / "hero.jsonl"
    os.mkfifo(fifo)
    refused(convert(out, "--force"), "not a regular file")
    refused(convert(tmp_path / "no" / "such" / "out"), "does not exist")
    assert not (tmp_path / "no").exists() and temporaries(tmp_path) == []
    assert sorted(p.name for p in out.iterdir()) == ["hero.jsonl"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ------------------------------------------------------------------------------------ t2sql-train prepare


def small_release(folder: Path) -> Path:
    """A release in the documented layout: <split>.json beside databases/<db_id>/<db_id>.sqlite."""
    release = folder / "release"
    (release / "databases" / "superhero").mkdir(parents=True)
    shutil.copyfile(SAMPLE / "superhero" / "superhero.sqlite", release / "databases" / "superhero" / "superhero.sqlite")
    rows = sample_rows(6)
    for split, part in (("train", rows[:2]), ("validation", rows[2:4]), ("arcwise", rows[4:])):
        (release / f"{split}.json").write_text(json.dumps(part))
    return release


def prepare(out: Path, release: Path, *more: str) -> subprocess.CompletedProcess:
    return run(*TRAIN, "prepare", "--output-dir", str(out), "--data-release", str(release), "--skip-model",
               "--skip-disk-check", *more)


def test_prepare_replaces_what_it_wrote_and_refuses_other_files_before_any_work(tmp_path):
    release, out = small_release(tmp_path), tmp_path / "out"
    (out / "data").mkdir(parents=True)
    before = foreign(out / "data" / "validation.jsonl")
    proc = prepare(out, release)
    assert "validation.jsonl exists and is not a split t2sql converted" in refused(proc, "--force")
    assert proc.stdout == "" and not (out / "data" / "train.jsonl").exists()  # refused before converting anything
    assert (out / "data" / "validation.jsonl").read_bytes() == before
    forced = prepare(out, release, "--force")
    assert forced.returncode == 0, forced.stderr
    assert len((out / "data" / "validation.jsonl").read_text().splitlines()) == 2
    again = prepare(out, release)  # a rerun: every file there is prepare's own
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "data" / "arcwise.manifest.json").read_text())["format"] == "t2sql-database-manifest"
    (out / "data" / "arcwise.manifest.json").unlink()
    os.mkfifo(out / "data" / "arcwise.manifest.json")
    refused(prepare(out, release, "--force"), "arcwise.manifest.json is not a regular file")
    assert temporaries(out) == []


# ------------------------------------------------------------------------------------------------- bench


def test_bench_work_files_are_its_own_or_refused(tmp_path):
    work = tmp_path / "work"

    def bench_pairs(*more: str) -> subprocess.CompletedProcess:
        return t2sql("bench", "pairs", "--limit", "1", "--per-question", "3", "--concurrency", "2", "--work-dir",
                     str(work), "--json", *more)

    first = bench_pairs()  # --work-dir is made (its parent exists)
    assert first.returncode == 0, first.stderr
    again = bench_pairs()  # its own files: replaced
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["pairs"] == 3
    before = foreign(work / "pairs.jsonl")
    refused(bench_pairs(), "not a workload of t2sql bench pairs", "--force")
    assert (work / "pairs.jsonl").read_bytes() == before
    (work / "pairs.jsonl").unlink()
    before = foreign(work / "t2sql_n2.jsonl")
    refused(bench_pairs(), "t2sql_n2.jsonl exists and is not a t2sql grade verdicts file")
    assert (work / "t2sql_n2.jsonl").read_bytes() == before
    (work / "bird.jsonl").unlink()
    os.mkfifo(work / "bird.jsonl")
    refused(bench_pairs("--force"), "bird.jsonl is not a regular file")
    assert not (work / "pairs.jsonl").exists()  # refused before the workload was written
    os.mkfifo(tmp_path / "bench_3000.sqlite")
    table = t2sql("bench", "grader", "--rows", "3000", "--work-dir", str(tmp_path))
    assert table.returncode == 2 and "Traceback" not in table.stderr  # after its progress line, one line says why
    assert "bench_3000.sqlite is not a regular file" in table.stderr.strip().splitlines()[-1]
    assert stat.S_ISFIFO(os.lstat(tmp_path / "bench_3000.sqlite").st_mode)
    for suite in (["grader"], ["pairs"], ["download", "--size-mb", "1", "--extract-mb", "0"]):
        refused(t2sql("bench", *suite, "--work-dir", str(tmp_path / "no" / "such")), "does not exist")
    assert not (tmp_path / "no").exists() and temporaries(tmp_path) == []


# ---------------------------------------------------------------------------- SIGTERM unwinds like SIGINT


def wait_for(condition, what: str, proc: subprocess.Popen) -> None:
    """Poll until `condition()`; fail (with the child's stderr) if the child ends first or it never comes."""
    deadline = time.monotonic() + 120
    while not condition():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{what} never happened: {proc.communicate()[1]}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig, word", [(signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")])
def test_a_signal_mid_grade_removes_the_temporary_output(tmp_path, sig, word):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "db_id": "superhero", "pred": ENDLESS, "gold": "SELECT 1"}) + "\n"
                             for i in range(6)))
    out = tmp_path / "v.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "t2sql.cli", "grade", "--pairs", str(pairs), "--db-root",
                             str(SAMPLE), "--out", str(out), "--timeout-s", "60", "--concurrency", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env())
    wait_for(lambda: temporaries(tmp_path), "the temporary output", proc)  # mid-run: .v.jsonl.xxxx.tmp is there
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, (proc.returncode, err)  # as grade --pairs answers Ctrl-C
    assert f"{word} after" in err and "was not written" in err and "Traceback" not in err
    assert temporaries(tmp_path) == [] and not out.exists()


def stderr_until(proc: subprocess.Popen, text: str) -> None:
    """Read the child's stderr until a line holds `text` (a progress line: the run is under way)."""
    seen = []
    while not any(text in line for line in seen):
        line = proc.stderr.readline()
        assert line, f"the command ended before {text!r}: {''.join(seen)}"
        seen.append(line)


def test_sigterm_mid_gold_exits_143_and_writes_no_report(tmp_path):
    data = tmp_path / "q.json"
    rows = sample_rows(1)
    data.write_text(json.dumps(rows + [{**rows[0], "question_id": 900 + i, "SQL": ENDLESS} for i in range(2)]))
    report = tmp_path / "report.json"
    proc = subprocess.Popen([sys.executable, "-m", "t2sql.cli", "gold", "--data", str(data), "--db-root", str(SAMPLE),
                             "--report", str(report), "--concurrency", "2", "--timeout-s", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(T2SQL_PROGRESS_INTERVAL="0"))
    stderr_until(proc, "gold: 1/3")  # the first gold is done, the endless ones run
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "terminated" and "Traceback" not in err
    assert not report.exists() and temporaries(tmp_path) == []


def test_sigterm_mid_prepare_ends_it_as_ctrl_c_does(tmp_path):
    """t2sql-train prepare, killed while it validates the golds: exit 143, one line, nothing half-written."""
    release = small_release(tmp_path)
    rows = json.loads((release / "validation.json").read_text())
    rows += [{**rows[0], "question_id": 900 + i, "SQL": ENDLESS} for i in range(3)]
    (release / "validation.json").write_text(json.dumps(rows))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, *TRAIN, "prepare", "--output-dir", str(out), "--data-release",
                             str(release), "--skip-model", "--skip-disk-check", "--splits", "validation",
                             "--timeout-s", "120"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(T2SQL_PROGRESS_INTERVAL="0"))
    stderr_until(proc, "gold: 1/")  # the first gold is done, the endless ones run
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, err)
    assert err.strip().splitlines()[-1] == "t2sql-train prepare: terminated; rerun to continue (completed steps " \
                                           "are kept)"
    assert "Traceback" not in err and temporaries(out) == [] and not (out / "data" / "validation.jsonl").exists()
