"""`t2sql-train prepare` from a fresh node: the shipped task files on BIRD's databases, which prepare
downloads from a mirror (a real HTTP server on loopback serving zips in BIRD's exact layout), verifies
and lays out; then conversion, manifests and the gold cache, as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections import Counter

import pytest

from bird_stand_ins import write_stand_ins
from bird_zips import BIRD, SAMPLE_DEV_DBS, build_dev_zip, build_train_zip, make_database, make_train_databases
from conftest import REPO
from loopback_http import Fault, LoopbackFileServer
from t2sql.download import bird
from t2sql.tasks import release_dir

TRAIN = ["-c", "import sys; from t2sql.miles.train import main; sys.exit(main())"]


def _prepare(out, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *TRAIN, "prepare", "--output-dir", str(out), "--skip-model", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=out.parent,
                          env={**os.environ, "T2SQL_PROGRESS_INTERVAL": "0"})


def _arcwise_counts() -> Counter:
    rows = json.loads((release_dir() / "arcwise_plat_sql.json").read_text())
    return Counter(r["db_id"] for r in rows)


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    """BIRD's dev.zip (the three sample dev databases) and a small train.zip, on a loopback mirror."""
    folder = tmp_path_factory.mktemp("mirror")
    build_dev_zip(folder / "dev.zip")
    build_train_zip(folder / "train.zip", make_train_databases(folder / "train-dbs", n=2))
    with LoopbackFileServer() as server:
        server.add("dev.zip", folder / "dev.zip")
        server.add("train.zip", folder / "train.zip")
        yield server


@pytest.fixture(scope="module")
def bird_mirror(tmp_path_factory):
    """BIRD's train.zip and dev.zip with every database the three shipped task files name, on a loopback mirror:
    the three real dev databases of tests/data/bird, a stand-in (tests/bird_stand_ins) for each of the others
    (8 dev, 69 train), on which each of its golds runs. Built once, in seconds."""
    folder = tmp_path_factory.mktemp("bird-mirror")
    golds: dict[str, dict[str, list[str]]] = {"train": {}, "dev": {}}
    for name, archive in (("bird-verified-train.json", "train"), ("bird-verified-val.json", "train"),
                          ("arcwise_plat_sql.json", "dev")):
        for row in json.loads((release_dir() / name).read_text()):
            golds[archive].setdefault(row["db_id"], []).append(row["SQL"])
    real = {db_id: BIRD / db_id for db_id in SAMPLE_DEV_DBS}
    dev = {**write_stand_ins(folder / "dev", {d: g for d, g in golds["dev"].items() if d not in real}), **real}
    train = write_stand_ins(folder / "train", golds["train"])
    assert (len(dev), len(train)) == (11, 69)
    build_dev_zip(folder / "dev.zip", dev)
    build_train_zip(folder / "train.zip", train)
    with LoopbackFileServer() as server:
        server.add("dev.zip", folder / "dev.zip")
        server.add("train.zip", folder / "train.zip")
        yield server


def test_the_shipped_task_files_convert_with_no_flag(tmp_path, bird_mirror):
    """The README's prepare, as a user pastes it (against a mirror, without the model): all three splits of the
    shipped task files convert, every task written, with no --grading-method-fallback and no --drop-invalid."""
    out = tmp_path / "t2sql"
    # The disk check counts BIRD's real archives (about 45 GB); the mirror's are a few MB.
    args = ("--bird-url", bird_mirror.base_url, "--skip-disk-check")
    proc = _prepare(out, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "--grading-method-fallback" not in proc.stderr and "dropped" not in proc.stderr
    written = {split: [json.loads(line) for line in (out / "data" / f"{split}.jsonl").read_text().splitlines()]
               for split in ("train", "validation", "arcwise")}
    assert {split: len(rows) for split, rows in written.items()} == {"train": 2064, "validation": 398,
                                                                    "arcwise": 498}
    assert re.search(r"^convert data +train 2064, validation 398, arcwise 498$", proc.stdout, re.M), proc.stdout
    assert f"{2064 + 398 + 498}/{2064 + 398 + 498} gold digests" in proc.stdout, proc.stdout
    # The bare "subset" of tasks 1104 and 1105 is read as subset,>=,1; " multiset" as multiset.
    methods = {r["metadata"]["question_id"]: r["label"].get("grading_method") for r in written["train"]}
    assert methods["1104"] == methods["1105"] == "subset,>=,1" and methods["5248"] == "multiset"
    assert not any("grading_method_given" in r["metadata"] for rows in written.values() for r in rows)
    assert "train grading methods: " in proc.stdout and "subset,>=,1 3" in proc.stdout, proc.stdout


def test_the_task_files_are_checked_before_anything_is_downloaded(tmp_path, mirror):
    """A task file that cannot convert (here every row lacks the field --field-map names) stops prepare before
    BIRD's archives come down: one message naming the tasks, nothing requested from the mirror."""
    requests = len(mirror.requests)
    proc = _prepare(tmp_path / "t2sql", "--splits", "arcwise", "--bird-url", mirror.base_url,
                    "--field-map", "question=no_such_field")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "498 problem(s), found before downloading BIRD's databases" in proc.stderr, proc.stderr
    assert "missing field(s) no_such_field" in proc.stderr
    assert len(mirror.requests) == requests
    assert not (tmp_path / "t2sql" / "data" / "bird").exists()


def test_arcwise_from_a_mirror_end_to_end(tmp_path, mirror):
    out = tmp_path / "t2sql"
    proc = _prepare(out, "--splits", "arcwise", "--bird-url", mirror.base_url)
    # Without --drop-invalid: the eight dev databases the mirror lacks are named with their task counts.
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "dev_databases: 3 databases" in proc.stdout and "sha256 pin not applied (from a mirror" in proc.stdout
    counts = _arcwise_counts()
    missing = sorted(set(counts) - {"superhero", "student_club", "toxicology"})
    assert len(missing) == 8
    for db_id in missing:
        assert f"{db_id} ({counts[db_id]} task" in proc.stderr, proc.stderr
    assert "--drop-invalid" in proc.stderr
    laid = out / "data" / "bird" / "dev_databases"
    assert sorted(p.name for p in laid.iterdir() if p.is_dir()) == ["student_club", "superhero", "toxicology"]
    assert not (out / "data" / "arcwise.jsonl").exists()  # nothing converted

    fetched = mirror.sent("dev.zip")
    proc = _prepare(out, "--splits", "arcwise", "--bird-url", mirror.base_url, "--drop-invalid")
    assert proc.returncode == 0, proc.stderr
    assert mirror.sent("dev.zip") == fetched  # the laid-out folder was verified and kept: no second download
    rows = [json.loads(line) for line in (out / "data" / "arcwise.jsonl").read_text().splitlines()]
    assert len(rows) == 140 == counts["superhero"] + counts["student_club"] + counts["toxicology"]
    manifest = json.loads((out / "data" / "arcwise.manifest.json").read_text())
    assert "superhero" in json.dumps(manifest)
    assert "140/140 gold digests" in proc.stdout, proc.stdout
    assert "dev_databases: already laid out and verified" in proc.stdout
    assert not (out / "data" / "bird" / ".downloads" / "dev.zip").exists()  # the archive is gone once laid out


def test_train_databases_laid_out_beside_dev_ones(tmp_path, mirror):
    out = tmp_path / "t2sql"
    proc = _prepare(out, "--splits", "validation", "--bird-url", mirror.base_url, "--drop-invalid")
    # The small train.zip holds two generated databases, none of the validation tasks' databases: every task
    # is dropped, which convert refuses (nothing to write), one line, no traceback.
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "validation: " in proc.stderr and "database(s) its tasks name are not in" in proc.stderr
    laid = out / "data" / "bird" / "train_databases"
    assert len([p for p in laid.iterdir() if p.is_dir()]) == 2
    assert not (out / "data" / "bird" / "dev_databases").exists()  # validation needs only train.zip


def test_a_mirror_that_answers_404_is_one_line_naming_the_url(tmp_path):
    with LoopbackFileServer() as empty:
        proc = _prepare(tmp_path / "t2sql", "--splits", "arcwise", "--bird-url", empty.base_url)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert f"{empty.base_url}/dev.zip" in line and "404" in line and "--bird-url" in line
    assert not (tmp_path / "t2sql" / "data" / "bird" / "dev_databases").exists()


def test_a_cut_download_resumes_and_lays_out_the_same_databases(tmp_path, mirror):
    mirror.fault(Fault(drop_after=200_000, path="dev.zip"))
    out = tmp_path / "t2sql"
    before = mirror.sent("dev.zip")
    proc = _prepare(out, "--splits", "arcwise", "--bird-url", mirror.base_url, "--drop-invalid")
    assert proc.returncode == 0, proc.stderr
    assert mirror.requests[-1].range  # the last request for it resumed with a Range
    assert mirror.sent("dev.zip") - before < 1.2 * mirror.files["dev.zip"].size
    for db_id in ("superhero", "student_club", "toxicology"):
        got = out / "data" / "bird" / "dev_databases" / db_id / f"{db_id}.sqlite"
        assert got.read_bytes() == (REPO / "tests" / "data" / "bird" / db_id / f"{db_id}.sqlite").read_bytes()


def test_the_disk_check_counts_what_the_chosen_splits_need(tmp_path):
    needs = bird.disk_needs(tmp_path, bird.archives_for(["arcwise"]))
    assert needs == {"BIRD dev.zip (download)": 346_207_293, "BIRD dev_databases (unpacked, estimated)": 2 * 10**9}
    both = bird.disk_needs(tmp_path, bird.archives_for(["train", "validation", "arcwise"]))
    assert sum(both.values()) == 346_207_293 + 2 * 10**9 + 8_919_543_554 + 34 * 10**9
    assert [a.file for a in bird.archives_for(["validation"])] == ["train.zip"]


# ------------------------------------------------------------------------ a user's own copy at the layout path


def _lay_out_users_copy(folder, *, complete: bool):
    """BIRD's dev_databases as a user lays a copy of theirs out where docs/training.md says: the three real
    dev databases with their description CSVs, a NOTES.txt and an extra database of their own; `complete`
    adds a database for each other db_id arcwise names (generated, one of them in WAL mode)."""
    for db_id in ("superhero", "student_club", "toxicology"):
        shutil.copytree(REPO / "tests" / "data" / "bird" / db_id, folder / db_id)
    (folder / "NOTES.txt").write_text("where these came from\n")
    make_database(folder / "my_own_db" / "my_own_db.sqlite")
    if complete:
        others = sorted(set(_arcwise_counts()) - {"superhero", "student_club", "toxicology"})
        for db_id in others:
            make_database(folder / db_id / f"{db_id}.sqlite")
        con = sqlite3.connect(folder / others[0] / f"{others[0]}.sqlite")
        assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
        con.close()


def _snapshot(folder) -> dict:
    return {p.relative_to(folder).as_posix(): (p.lstat().st_size, p.lstat().st_mtime_ns, p.lstat().st_ino)
            for p in sorted(folder.rglob("*"))}


def test_a_users_complete_copy_is_used_as_it_is(tmp_path, mirror):
    """The documented command, no --data-release, over a complete copy of the user's: nothing downloaded,
    nothing in it deleted, written or touched (no -wal/-shm beside a WAL-mode database either)."""
    out = tmp_path / "t2sql"
    copy = out / "data" / "bird" / "dev_databases"
    _lay_out_users_copy(copy, complete=True)
    before, requests = _snapshot(copy), len(mirror.requests)
    proc = _prepare(out, "--splits", "arcwise", "--bird-url", mirror.base_url, "--drop-invalid")
    assert proc.returncode == 0, proc.stderr
    assert "dev_databases: your own copy, used as it is (11 databases" in proc.stdout, proc.stdout
    assert len(mirror.requests) == requests  # nothing downloaded
    assert _snapshot(copy) == before
    rows = (out / "data" / "arcwise.jsonl").read_text().splitlines()
    assert len(rows) == 140  # the three real databases' tasks; the generated ones' gold fails and is dropped


@pytest.mark.parametrize("case", ["incomplete", "corrupt"])
def test_a_users_copy_that_is_not_complete_is_refused_and_kept(tmp_path, mirror, case):
    """A copy of the user's that lacks databases the splits need (or holds one that fails its integrity
    check): exit 2, the message names the files prepare did not write and what to do; nothing deleted."""
    out = tmp_path / "t2sql"
    copy = out / "data" / "bird" / "dev_databases"
    _lay_out_users_copy(copy, complete=case == "corrupt")
    if case == "corrupt":
        broken = copy / "toxicology" / "toxicology.sqlite"
        data = bytearray(broken.read_bytes())
        for k in range(4096 * 3 + 100, len(data) - 4096, 1024):
            data[k] ^= 0x5A
        broken.write_bytes(bytes(data))
    before, requests = _snapshot(copy), len(mirror.requests)
    proc = _prepare(out, "--splits", "arcwise", "--bird-url", mirror.base_url, "--drop-invalid")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    message = proc.stderr.strip().splitlines()[-1]
    assert str(copy) in message and "NOTES.txt" in message and "my_own_db/" in message, message
    assert "deletes nothing it did not write" in message and "--data-release" in message, message
    assert "--output-dir" in message and "move those files out" in message, message
    if case == "incomplete":
        assert "it lacks 8 of the 11 databases the chosen splits need (california_schools" in message, message
    else:
        assert "toxicology: it fails its integrity check (PRAGMA quick_check" in message, message
    assert len(mirror.requests) == requests  # nothing downloaded
    assert _snapshot(copy) == before
    assert not (out / "data" / "arcwise.jsonl").exists()


def test_the_disk_check_counts_nothing_for_a_users_copy(tmp_path):
    (tmp_path / "dev_databases").mkdir()
    (tmp_path / "dev_databases" / "NOTES.txt").write_text("mine")
    needs = bird.disk_needs(tmp_path, bird.archives_for(["arcwise", "validation"]))
    assert sorted(needs) == ["BIRD train.zip (download)", "BIRD train_databases (unpacked, estimated)"]


def test_bird_s_archives_unpack_under_twice_their_estimate(tmp_path, mirror, monkeypatch):
    """prepare holds each BIRD archive's inner zip to a ceiling of twice its databases' estimate (above BIRD's own
    33.4 GB for train and dev together): what a hostile mirror's archive may unpack to before it is refused."""
    ceilings = []
    real = bird.extract_databases

    def recording(*args, **kwargs):
        ceilings.append(kwargs["ceiling"])
        return real(*args, **kwargs)

    monkeypatch.setattr(bird, "extract_databases", recording)
    bird.fetch(tmp_path, bird.archives_for(["arcwise"]), {}, base_url=mirror.base_url, progress=False)
    assert [c.size for c in ceilings] == [2 * 2 * 10**9]
    assert "twice the 2.00 GB that BIRD's dev_databases are estimated at" == ceilings[0].why
    assert bird.ARCHIVES["train"].ceiling().size > 33.4e9
