"""t2sql.download.archive on zips built in BIRD's exact layout (tests/bird_zips.py): nested zips read with
t2sql's own zip reading, data descriptors and ZIP64, CRC failures, truncation, unsafe names, a database that
fails quick_check, an extraction killed mid-way, reruns that skip or redo, and the peak RSS of a large one."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import signal
import sqlite3
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest

from bird_zips import (
    BIRD,
    DEV_INNER,
    SAMPLE_DEV_DBS,
    TRAIN_INNER,
    Raw,
    build_dev_zip,
    build_outer,
    build_raw_dev_zip,
    build_train_zip,
    build_wrapped_zip,
    database_members,
    local_data_offset,
    make_database,
    make_train_databases,
    raw_database_members,
    raw_zip,
    write_zip,
)
from conftest import child_env
from t2sql.download import archive as archive_mod
from t2sql.download import innerdirectory, zipentries, zipstream
from t2sql.download.archive import ExtractResult, UnpackCeiling, extract_databases, inner_size
from t2sql.download.marker import MARKER, foreign_files, verified
from t2sql.errors import ArchiveError, ForeignFilesError, NoSpaceError
from t2sql.serving.manifest import Manifest

pytestmark = pytest.mark.timeout(300)

ID = {"url": "http://127.0.0.1/dev.zip", "size": 1, "sha256": "ab" * 32}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name)


def assert_dev_layout(target: Path) -> None:
    assert sorted(p.name for p in target.iterdir()) == [MARKER, *SAMPLE_DEV_DBS]
    for db in SAMPLE_DEV_DBS:
        src = BIRD / db
        want = sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
        got = sorted(p.relative_to(target / db).as_posix() for p in (target / db).rglob("*"))
        assert got == want  # no ._*, .DS_Store, __MACOSX
        for rel in want:
            if (src / rel).is_file():
                assert (target / db / rel).read_bytes() == (src / rel).read_bytes(), rel


@pytest.mark.parametrize("descriptors,zip64,inner,outer", [
    (False, False, zipfile.ZIP_DEFLATED, zipfile.ZIP_DEFLATED),
    (True, False, zipfile.ZIP_DEFLATED, zipfile.ZIP_DEFLATED),
    (True, False, zipfile.ZIP_STORED, zipfile.ZIP_STORED),
    (False, True, zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED),
    (True, True, zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED),
], ids=["plain", "descriptors", "descriptors-stored", "zip64", "zip64-descriptors"])
def test_dev_zip_laid_out_and_verified(tmp_path, descriptors, zip64, inner, outer):
    zp = build_dev_zip(tmp_path / "dev.zip", descriptors=descriptors, zip64=zip64, inner_compression=inner,
                       outer_compression=outer)
    raw = zp.read_bytes()
    assert (b"PK\x06\x06" in raw) == zip64  # the ZIP64 end record is really there (and read)
    target = tmp_path / "data" / "bird" / "dev_databases"
    result = extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert result == ExtractResult(target, list(SAMPLE_DEV_DBS), result.bytes_written, False)
    assert result.bytes_written == sum(p.stat().st_size for p in target.rglob("*") if p.is_file() and p.name != MARKER)
    assert_dev_layout(target)
    assert verified(target, ID)
    assert not verified(target, {**ID, "sha256": "cd" * 32})
    assert leftovers(target.parent) == []
    # the marker is a database manifest rooted at the target: a Grader can check the files against it
    manifest = Manifest.load(target / MARKER, db_root=target)
    assert sorted(manifest.entries) == list(SAMPLE_DEV_DBS)
    for db in SAMPLE_DEV_DBS:
        manifest.verify(target / db / f"{db}.sqlite", hash_always=True)
    assert json.loads((target / MARKER).read_text())["extracted"]["identity"] == ID


def test_inner_size(tmp_path):
    for zip64 in (False, True):
        zp = build_dev_zip(tmp_path / f"dev{zip64}.zip", zip64=zip64)
        with zipfile.ZipFile(zp) as zf:
            assert inner_size(zp, DEV_INNER) == zf.getinfo(DEV_INNER).file_size


def test_train_zip_generated_databases(tmp_path):
    dbs = make_train_databases(tmp_path / "src", n=4)
    zp = build_train_zip(tmp_path / "train.zip", dbs, descriptors=True)
    target = tmp_path / "out" / "train_databases"
    result = extract_databases(zp, TRAIN_INNER, target, identity={"etag": '"x-400"'}, progress=False)
    assert result.databases == sorted(dbs)
    for db_id, folder in dbs.items():
        assert (target / db_id / f"{db_id}.sqlite").read_bytes() == (folder / f"{db_id}.sqlite").read_bytes()
        assert (target / db_id / "database_description" / "item.csv").is_file()


def test_no_unzip_and_no_zipfile_reading(tmp_path, monkeypatch):
    zp = build_dev_zip(tmp_path / "dev.zip", descriptors=True)

    def refuse(*a, **k):
        raise AssertionError("extraction must not use zipfile or a subprocess")

    monkeypatch.setattr(zipfile, "ZipFile", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
    extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)


def test_progress_counts_inner_bytes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("T2SQL_PROGRESS_INTERVAL", "0")
    zp = build_dev_zip(tmp_path / "dev.zip")
    extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID)
    err = capsys.readouterr().err
    assert "extracting dev_databases.zip" in err and "1.6 MB/1.6 MB" in err, err


@pytest.mark.parametrize("inner", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_flipped_byte_in_a_database(tmp_path, inner):
    zp = build_dev_zip(tmp_path / "dev.zip", inner_compression=inner, outer_compression=zipfile.ZIP_STORED)
    raw = bytearray(zp.read_bytes())
    start = local_data_offset(bytes(raw), DEV_INNER)  # the inner zip lies stored in the outer one
    with zipfile.ZipFile(zp) as zf:
        inner_bytes = zf.read(DEV_INNER)
    member = "dev_databases/superhero/superhero.sqlite"
    with zipfile.ZipFile(__import__("io").BytesIO(inner_bytes)) as zf:
        length = zf.getinfo(member).compress_size
    raw[start + local_data_offset(inner_bytes, member) + length // 2] ^= 0x01
    zp.write_bytes(bytes(raw))
    target = tmp_path / "dev_databases"
    with pytest.raises(ArchiveError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    message = str(info.value)
    assert member in message and str(zp) in message and "delete" in message, message
    if inner == zipfile.ZIP_STORED:
        assert "CRC32 mismatch" in message
    assert info.value.member == member
    assert not target.exists() and leftovers(tmp_path) == []


def test_flipped_byte_in_the_outer_deflate_stream(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip", inner_compression=zipfile.ZIP_STORED)
    raw = bytearray(zp.read_bytes())
    start = local_data_offset(bytes(raw), DEV_INNER)
    raw[start + 400_000] ^= 0x40
    zp.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError) as info:
        extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)
    assert "damaged" in str(info.value) or "truncated" in str(info.value)
    assert not (tmp_path / "dev_databases").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("keep", [0.5, 0.999, 0.05])
def test_truncated_outer_archive(tmp_path, keep):
    zp = build_dev_zip(tmp_path / "dev.zip")
    raw = zp.read_bytes()
    zp.write_bytes(raw[:int(len(raw) * keep)])
    with pytest.raises(ArchiveError) as info:
        extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)
    message = str(info.value)
    assert "truncated" in message and f"delete {zp}" in message and "download it again" in message, message
    assert not (tmp_path / "dev_databases").exists() and leftovers(tmp_path) == []
    with pytest.raises(ArchiveError, match="truncated"):
        inner_size(zp, DEV_INNER)


def test_missing_inner_member(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip")
    with pytest.raises(ArchiveError, match="has no member train/train_databases.zip"):
        extract_databases(zp, TRAIN_INNER, tmp_path / "train_databases", identity=ID, progress=False)


@pytest.mark.parametrize("name", ["dev_databases/../../evil.txt", "/tmp/evil-t2sql.txt", "dev_databases/a/../../x"])
def test_unsafe_member_name(tmp_path, name):
    zp = build_dev_zip(tmp_path / "dev.zip", extra_inner=[(name, b"escaped")])
    target = tmp_path / "deep" / "dev_databases"
    with pytest.raises(ArchiveError, match="unsafe member name") as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert info.value.member == name
    assert not target.exists() and leftovers(target.parent) == []
    assert not any(p.name in ("evil.txt", "x") for p in tmp_path.rglob("*"))


def test_database_failing_quick_check(tmp_path):
    bad = make_database(tmp_path / "src" / "broken" / "broken.sqlite", rows=3000)
    data = bytearray(bad.read_bytes())
    page = len(data) // 4096 - 2
    for k in range(100, 4000, 7):
        data[page * 4096 + k] ^= 0x5A
    bad.write_bytes(bytes(data))
    dbs = {**make_train_databases(tmp_path / "src", n=2), "broken": bad.parent}
    zp = build_train_zip(tmp_path / "train.zip", dbs)
    target = tmp_path / "train_databases"
    with pytest.raises(ArchiveError, match=r"broken .*quick_check") as info:
        extract_databases(zp, TRAIN_INNER, target, identity=ID, progress=False)
    assert len(str(info.value)) < 600
    assert not target.exists() and leftovers(tmp_path) == []


def test_empty_database(tmp_path):
    (tmp_path / "src" / "empty").mkdir(parents=True)
    (tmp_path / "src" / "empty" / "empty.sqlite").write_bytes(b"")
    zp = build_train_zip(tmp_path / "train.zip", {"empty": tmp_path / "src" / "empty"})
    with pytest.raises(ArchiveError, match="database empty .* is empty"):
        extract_databases(zp, TRAIN_INNER, tmp_path / "train_databases", identity=ID, progress=False)
    assert not (tmp_path / "train_databases").exists()


class _Failing:
    def __init__(self, f, after: int, error: BaseException):
        self.f, self.left, self.error = f, after, error

    def write(self, data):
        self.left -= len(data)
        if self.left < 0:
            raise self.error
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("error", [KeyboardInterrupt(), OSError(errno.EIO, "I/O error")])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, error):
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    written = [0]

    def failing_open(path):
        written[0] += 1
        return _Failing(open(path, "wb"), 0 if written[0] > 5 else 1 << 30, error)

    monkeypatch.setattr(archive_mod, "_open_output", failing_open)
    with pytest.raises((KeyboardInterrupt, ArchiveError)):
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert not target.exists() and not verified(target, ID) and leftovers(tmp_path) == []
    monkeypatch.undo()
    assert not extract_databases(zp, DEV_INNER, target, identity=ID, progress=False).skipped
    assert_dev_layout(target)


def test_disk_full_says_how_much_is_needed(tmp_path, monkeypatch):
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    total = [0]

    def full_open(path):
        total[0] += 1
        return _Failing(open(path, "wb"), 1 << 30 if total[0] < 8 else 1000,
                        OSError(errno.ENOSPC, "No space left on device"))

    monkeypatch.setattr(archive_mod, "_open_output", full_open)
    with pytest.raises(NoSpaceError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    message = str(info.value)
    assert "no space left" in message and "the databases need" in message, message
    assert info.value.needed > 0
    assert not target.exists() and leftovers(tmp_path) == []


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from t2sql.download import archive
    real = archive._open_output
    count = [0]
    class Killing:
        def __init__(self, f): self.f = f
        def write(self, data):
            count[0] += len(data)
            if count[0] > 3_000_000:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.f.write(data)
        def __getattr__(self, name): return getattr(self.f, name)
    archive._open_output = lambda path: Killing(real(path))
    archive.extract_databases(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), identity={"k": 1}, progress=False)
""")


def test_sigkill_mid_extraction_then_rerun(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip", descriptors=True)
    target = tmp_path / "dev_databases"
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(zp), DEV_INNER, str(target)], env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = leftovers(tmp_path)
    assert len(left) == 1 and left[0].startswith(".dev_databases.partial-")  # the dead run's, never trusted
    assert not target.exists() and not verified(target, {"k": 1})
    result = extract_databases(zp, DEV_INNER, target, identity={"k": 1}, progress=False)
    assert not result.skipped and leftovers(tmp_path) == []
    assert_dev_layout(target)


def test_rerun_skips_when_verified(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    stamp = {p: p.stat().st_mtime_ns for p in target.rglob("*")}
    zp.unlink()  # a verified layout needs no archive
    again = extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert again == ExtractResult(target, list(SAMPLE_DEV_DBS), 0, True)
    assert {p: p.stat().st_mtime_ns for p in target.rglob("*")} == stamp


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every path under `folder` with what a change would move: type, size, mtime, inode, link target."""
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[p.relative_to(folder).as_posix()] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino,
                                                  os.readlink(p) if p.is_symlink() else None)
    return out


def test_rerun_redoes_when_a_database_changed_size(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    with open(target / "superhero" / "superhero.sqlite", "ab") as f:
        f.write(b"\0" * 4096)
    assert not verified(target, ID)
    again = extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert not again.skipped and verified(target, ID)
    assert_dev_layout(target)  # everything in it was t2sql's: replaced whole
    assert leftovers(tmp_path) == []


def test_a_file_t2sql_did_not_write_is_never_deleted(tmp_path):
    """A rerun that would replace a laid-out folder finds a file of the user's in it: refused, the folder
    left as it was, byte for byte (the changed database too)."""
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    with open(target / "superhero" / "superhero.sqlite", "ab") as f:
        f.write(b"\0" * 4096)
    (target / "superhero" / "stray.txt").write_text("not from the archive")
    (target / "mine").mkdir()
    (target / "mine" / "mine.sqlite").write_bytes(b"the user's")
    before = snapshot(target)
    with pytest.raises(ForeignFilesError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert info.value.files == ["mine/", "superhero/stray.txt"]
    message = str(info.value)
    assert "mine/" in message and "superhero/stray.txt" in message and "move them" in message, message
    assert snapshot(target) == before and leftovers(tmp_path) == []
    assert foreign_files(target) == ["mine/", "superhero/stray.txt"]


def test_rerun_redoes_for_another_identity_or_a_deleted_database(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    other = {**ID, "etag": "new"}
    assert not verified(target, other)
    assert not extract_databases(zp, DEV_INNER, target, identity=other, progress=False).skipped
    (target / "toxicology" / "toxicology.sqlite").unlink()
    assert not verified(target, other)
    assert not extract_databases(zp, DEV_INNER, target, identity=other, progress=False).skipped
    assert verified(target, other)


def test_a_folder_without_a_marker_is_refused_and_kept(tmp_path):
    """A folder a naive `unzip` left (no marker, an empty database) is never trusted, and never deleted:
    t2sql did not write it."""
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    (target / "superhero").mkdir(parents=True)
    (target / "superhero" / "superhero.sqlite").write_bytes(b"")
    (target / "NOTES.txt").write_text("mine")
    assert not verified(target, ID)
    before = snapshot(target)
    with pytest.raises(ForeignFilesError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert info.value.files == ["NOTES.txt", "superhero/"]
    assert snapshot(target) == before


def test_an_empty_folder_is_laid_out(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    target.mkdir()
    assert foreign_files(target) == []
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert_dev_layout(target)


def test_a_link_at_the_target_is_refused_and_kept(tmp_path):
    """The docs once said to symlink a copy there: the link and what it points to stay as they are."""
    zp = build_dev_zip(tmp_path / "dev.zip")
    mine = tmp_path / "my-copy"
    (mine / "superhero").mkdir(parents=True)
    (mine / "superhero" / "superhero.sqlite").write_bytes(b"mine")
    target = tmp_path / "dev_databases"
    target.symlink_to(mine)
    before = snapshot(mine)
    with pytest.raises(ForeignFilesError, match="it is a link to") as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert info.value.files == ["."]
    assert target.is_symlink() and os.readlink(target) == str(mine) and snapshot(mine) == before


def test_a_dead_runs_folder_moved_aside_keeps_what_t2sql_did_not_write(tmp_path):
    """A run killed between moving an old layout aside and removing it leaves `.<name>.partial-<pid>.old`;
    the next run removes what t2sql laid out in it, and nothing else."""
    zp = build_dev_zip(tmp_path / "dev.zip")
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    aside = tmp_path / ".dev_databases.partial-999999.old"
    target.rename(aside)
    (aside / "superhero" / "notes.txt").write_text("written there by hand after the kill")
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert_dev_layout(target)
    assert sorted(p.relative_to(aside).as_posix() for p in aside.rglob("*")) == ["superhero", "superhero/notes.txt"]


RSS_SCRIPT = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from t2sql.download.archive import extract_databases
    result = extract_databases(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), identity={}, progress=False)
    # VmHWM is this program's own peak; ru_maxrss also counts what the parent had when it forked
    status = Path("/proc/self/status")
    hwm = [int(line.split()[1]) for line in status.read_text().splitlines() if line.startswith("VmHWM:")] \
        if status.exists() else []
    print(result.bytes_written, hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""")


def test_peak_rss_of_a_large_extraction(tmp_path):
    """A ~200 MB inner archive (incompressible databases, and 300 MB of zeros that deflate 1000 to 1, with
    data descriptors) extracts in a
    process whose peak RSS (VmHWM on Linux, else ru_maxrss) stays under 64 MB."""
    dbs = {}
    for db_id, blobs, zeros in (("big_0", 100 << 20, 0), ("big_1", 100 << 20, 0), ("zeros", 0, 300 << 20)):
        make_database(tmp_path / "src" / db_id / f"{db_id}.sqlite", rows=1000, blob_bytes=blobs, zero_bytes=zeros)
        dbs[db_id] = tmp_path / "src" / db_id
    zp = build_train_zip(tmp_path / "train.zip", dbs, descriptors=True)
    for folder in dbs.values():
        (folder / f"{folder.name}.sqlite").unlink()
    size = inner_size(zp, TRAIN_INNER)
    assert size > 200_000_000
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(zp), TRAIN_INNER, str(tmp_path / "out")],
                          env=child_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    written, rss_kb = map(int, proc.stdout.split())
    print(f"peak RSS extracting a {size / 1e6:.0f} MB inner archive ({written / 1e6:.0f} MB written): "
          f"{rss_kb / 1024:.1f} MiB")
    assert written > 500_000_000
    assert rss_kb < 64 * 1024, f"peak RSS {rss_kb / 1024:.1f} MiB"


@pytest.mark.parametrize("deflate", [True, False])
def test_archive_over_4gib_with_wrapped_32bit_offsets(tmp_path, deflate):
    """macOS's Archive Utility writes archives over 4 GiB with 32-bit offsets that wrap (Info-ZIP:
    "overlapped components"); the member is found 4 GiB further on and read whole."""
    inner = tmp_path / "inner.zip"
    write_zip(inner, database_members("train_databases", make_train_databases(tmp_path / "src", n=2)),
              descriptors=True)
    zp = build_wrapped_zip(tmp_path / "train.zip", "train", "train_databases.zip", inner.read_bytes(),
                           deflate=deflate)
    if zp.stat().st_blocks * 512 > 1 << 30:
        pytest.skip("this file system does not keep sparse files sparse")
    assert zp.stat().st_size > 1 << 32
    assert inner_size(zp, TRAIN_INNER) == inner.stat().st_size
    result = extract_databases(zp, TRAIN_INNER, tmp_path / "train_databases", identity=ID, progress=False)
    assert result.databases == ["train_db_0", "train_db_1"]


def test_two_runs_at_once_on_one_target(tmp_path):
    zp = build_dev_zip(tmp_path / "dev.zip", descriptors=True)
    target = tmp_path / "dev_databases"
    script = textwrap.dedent("""
        import sys
        from pathlib import Path
        from t2sql.download.archive import extract_databases
        r = extract_databases(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), identity={"k": 1}, progress=False)
        print(r.skipped)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(zp), DEV_INNER, str(target)], env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert sorted(o.strip() for o, _ in outs) == ["False", "True"]  # one laid it out, the other found it done
    assert verified(target, {"k": 1}) and leftovers(tmp_path) == []


# ------------------------------------------------------------------ hostile archives: time, output, memory


class CountingZlib:
    """zlib as t2sql.download.zipstream and zipentries call it, counting the bytes its CRC32 is computed over."""

    def __init__(self):
        self.hashed = 0

    def crc32(self, data, value=0):
        self.hashed += len(data)
        return zlib.crc32(data, value)

    def __getattr__(self, name):
        return getattr(zlib, name)


@pytest.mark.parametrize("unit", [b"PK\x07\x08", b"PK\x07\x08" + b"\xff" * 12 + b"PK\x03\x04"],
                         ids=["signatures", "signatures-before-a-header"])
def test_a_stored_entry_full_of_descriptor_signatures_is_scanned_in_one_pass(tmp_path, monkeypatch, unit):
    """A stored entry whose size comes after it (flag bit 3, sizes 0), its data a run of data-descriptor
    signatures: each byte is hashed once (the work was quadratic in the chunk: 1 MiB took 27 s), and the
    entry comes out whole."""
    body = unit * (65536 // len(unit))
    csv = "dev_databases/superhero/database_description/signatures.csv"
    zp = build_dev_zip(tmp_path / "dev.zip", descriptors=True, inner_compression=zipfile.ZIP_STORED,
                       outer_compression=zipfile.ZIP_STORED, extra_inner=[(csv, body)])
    with zipfile.ZipFile(zp) as zf:
        inner = zf.getinfo(DEV_INNER).file_size
    counting = CountingZlib()
    monkeypatch.setattr(zipstream, "zlib", counting)  # the outer member's bytes
    monkeypatch.setattr(zipentries, "zlib", counting)  # each inner entry's
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert (target / "superhero" / "database_description" / "signatures.csv").read_bytes() == body
    # The outer member's bytes (the inner zip) once, each inner entry's (stored: the same bytes) once more.
    assert counting.hashed <= 2 * inner, f"{counting.hashed} bytes hashed for an inner zip of {inner}"


def test_tiny_entries_cost_their_own_bytes(tmp_path, monkeypatch):
    """A few thousand tiny deflated entries before the databases: each reads a few hundred bytes from the
    stream, not the megabytes buffered after it (20,000 of them took 38 s)."""
    tiny = [Raw(f"__MACOSX/dev_databases/._{i:05d}", b"\0\x05\x16\x07 apple double") for i in range(3000)]
    pad = Raw("dev_databases/pad.bin", os.urandom(4 << 20), deflate=False)  # buffered behind the tiny ones
    zp = build_raw_dev_zip(tmp_path / "dev.zip", tiny + raw_database_members() + [pad])
    with zipfile.ZipFile(zp) as zf:
        inner = zf.getinfo(DEV_INNER).file_size
    handed = [0]
    real = zipstream.MemberStream.read_some

    def counting(self, limit):
        out = real(self, limit)
        handed[0] += len(out)
        return out

    monkeypatch.setattr(zipstream.MemberStream, "read_some", counting)
    extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)
    assert handed[0] <= 2 * inner + 1024 * len(tiny), f"{handed[0]} bytes read for an inner zip of {inner}"


def directory_record(zip_bytes: bytes | bytearray, name: str) -> int:
    """Where the central directory record of `name` starts in a zip without a comment or ZIP64 records."""
    (start,) = struct.unpack_from("<L", zip_bytes, len(zip_bytes) - 22 + 16)
    return zip_bytes.index(name.encode(), start) - 46


def _counting_writes(monkeypatch) -> dict[str, int]:
    written: dict[str, int] = {}
    real = archive_mod._open_output

    class Counting:
        def __init__(self, f, name):
            self.f, self.name = f, name

        def write(self, data):
            written[self.name] = written.get(self.name, 0) + len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(archive_mod, "_open_output", lambda path: Counting(real(path), Path(path).name))
    return written


def test_an_entry_inflating_past_its_declared_size_is_refused(tmp_path, monkeypatch):
    """An inner entry whose header says 1,000 bytes and whose deflate stream holds 64 MiB of zeros: refused
    once it passes 1,000 bytes, having written no more (it used to inflate until the disk was full)."""
    liar = "dev_databases/superhero/database_description/liar.csv"
    zp = build_raw_dev_zip(tmp_path / "dev.zip", raw_database_members() + [Raw(liar, bytes(64 << 20), declared=1000)])
    written = _counting_writes(monkeypatch)
    target = tmp_path / "dev_databases"
    with pytest.raises(ArchiveError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert info.value.member == liar and "inflates past the 1000 bytes its header records" in str(info.value)
    assert written.get("liar.csv", 0) <= 1000
    assert not target.exists() and leftovers(tmp_path) == []


def test_an_outer_member_inflating_past_its_recorded_size_is_refused(tmp_path, monkeypatch):
    """The inner zip's own size, as the outer directory records it, bounds what is read from it: a
    directory that says half keeps the second half's databases off the disk."""
    zp = build_dev_zip(tmp_path / "dev.zip")
    raw = bytearray(zp.read_bytes())
    with zipfile.ZipFile(zp) as zf:
        info = zf.getinfo(DEV_INNER)
    half = info.file_size // 2
    struct.pack_into("<L", raw, info.header_offset + 22, half)  # the local header's uncompressed size
    struct.pack_into("<L", raw, directory_record(raw, DEV_INNER) + 24, half)  # its directory record's
    zp.write_bytes(bytes(raw))
    written = _counting_writes(monkeypatch)
    with pytest.raises(ArchiveError, match=f"inflates past the {half} bytes its directory records"):
        extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)
    assert sum(written.values()) <= half


def macos_members() -> list[Raw]:
    """The sample dev databases as macOS's zip writes them: each entry's sizes in a data descriptor after it."""
    return [dataclasses.replace(m, descriptor=True) for m in raw_database_members()]


@pytest.mark.parametrize("outer", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored-outer", "deflated-outer"])
@pytest.mark.parametrize("deflate", [True, False], ids=["deflated-entry", "stored-entry"])
def test_a_descriptor_entry_past_its_directory_size_is_refused_before_more_is_written(tmp_path, monkeypatch, outer,
                                                                                    deflate):
    """An inner entry whose size comes after its data (flag bit 3) and whose directory record and descriptor say
    1,000 bytes, its data 64 MiB of zeros: refused once it passes 1,000 bytes, having written no more, whether the
    inner zip lies stored in the outer one (its directory read where it lies) or deflated (inflated once ahead).
    It used to inflate in full (64 MiB written) before its descriptor refuted it; a stored one was copied to the
    end of the inner zip looking for a descriptor that matched it."""
    liar = "dev_databases/superhero/database_description/liar.csv"
    members = macos_members() + [Raw(liar, bytes(64 << 20), deflate=deflate, declared=1000, descriptor=True)]
    zp = build_raw_dev_zip(tmp_path / "dev.zip", members, outer_compression=outer)
    written = _counting_writes(monkeypatch)
    target = tmp_path / "dev_databases"
    with pytest.raises(ArchiveError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    message = str(info.value)
    assert info.value.member == liar and "past the 1000 bytes the inner zip's directory records" in message, message
    assert written.get("liar.csv", 0) <= 1000, written
    assert not target.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("outer", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored-outer", "deflated-outer"])
def test_descriptor_entries_are_laid_out_from_a_directory_in_any_order(tmp_path, outer):
    """macOS-style entries (sizes after the data) and a directory that lists them in the reverse order: the
    directory bounds nothing then, but the archive is good and laid out whole."""
    zp = build_raw_dev_zip(tmp_path / "dev.zip", macos_members(), outer_compression=outer, directory_reversed=True)
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert_dev_layout(target)


@pytest.mark.parametrize("outer", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored-outer", "deflated-outer"])
def test_what_the_directory_cannot_bound_the_ceiling_does(tmp_path, monkeypatch, outer):
    """The same 64 MiB liar, its directory in the reverse order (so it bounds nothing): the whole inner zip may
    unpack to no more than the ceiling, and the liar is refused once the entries pass it, with no more written."""
    liar = "dev_databases/superhero/database_description/liar.csv"
    members = macos_members() + [Raw(liar, bytes(64 << 20), declared=1000, descriptor=True)]
    zp = build_raw_dev_zip(tmp_path / "dev.zip", members, outer_compression=outer, directory_reversed=True)
    databases = sum(len(m.data) for m in members[:-1])
    ceiling = UnpackCeiling(databases + (1 << 20), "what the test allows")
    written = _counting_writes(monkeypatch)
    target = tmp_path / "dev_databases"
    with pytest.raises(ArchiveError) as info:
        extract_databases(zp, DEV_INNER, target, identity=ID, progress=False, ceiling=ceiling)
    message = str(info.value)
    assert info.value.member == liar and "may take in all (what the test allows)" in message, message
    assert sum(written.values()) <= ceiling.size and written.get("liar.csv", 0) <= 1 << 20, written
    assert not target.exists() and leftovers(tmp_path) == []


def test_an_entry_that_declares_more_than_the_ceiling_leaves_is_refused_unwritten(tmp_path, monkeypatch):
    """An entry whose header declares more than what is left of the ceiling is refused before its first byte."""
    big = "dev_databases/superhero/database_description/big.csv"
    members = raw_database_members() + [Raw(big, os.urandom(2 << 20), deflate=False)]
    zp = build_raw_dev_zip(tmp_path / "dev.zip", members)
    ceiling = UnpackCeiling(sum(len(m.data) for m in members) - 1, "one byte short")
    written = _counting_writes(monkeypatch)
    with pytest.raises(ArchiveError, match=r"one byte short") as info:
        extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False, ceiling=ceiling)
    assert info.value.member == big and "big.csv" not in written


@pytest.mark.parametrize("recorded,compressed,method,bound", [
    (1000, 50, zipfile.ZIP_DEFLATED, 1000),  # 50 bytes inflate to 51,600 at most: the size cannot have wrapped
    (1000, 5 << 20, zipfile.ZIP_DEFLATED, 1000 + (1 << 32)),  # 5 MiB may inflate to 5.4 GB: one wrap possible
    (1000, 1000, zipfile.ZIP_STORED, 1000),  # stored: as many bytes out as in
    (1000, 1 << 30, zipfile.ZIP_DEFLATED, 1000 + 257 * (1 << 32)),  # a 1 GiB stream: under 1032 GiB out
])
def test_a_32_bit_size_bounds_by_what_its_compressed_size_can_hold(recorded, compressed, method, bound):
    """In an inner zip over 4 GiB a 32-bit size may have wrapped (macOS writes them so): the entry's true size is
    the recorded one plus a multiple of 4 GiB, and no more than its compressed bytes can inflate to."""
    assert innerdirectory.wrapped_size_bound(recorded, compressed, method) == bound


def test_only_databases_and_their_descriptions_are_laid_out(tmp_path):
    """A -wal, -shm or -journal beside a database is part of it to SQLite: none is laid out, nor anything
    else that is not <db_id>/<db_id>.sqlite or <db_id>/database_description/*.csv."""
    extra = [(f"dev_databases/superhero/superhero.sqlite{suffix}", b"x" * 100)
             for suffix in ("-wal", "-shm", "-journal")]
    extra += [("dev_databases/superhero/notes.txt", b"n"), ("dev_databases/README.md", b"r"),
              ("dev_databases/superhero/database_description/notes.txt", b"n"),
              ("dev_databases/superhero/other.sqlite", b"o"), ("dev_databases/superhero/sub/superhero.sqlite", b"s")]
    zp = build_dev_zip(tmp_path / "dev.zip", extra_inner=extra)
    target = tmp_path / "dev_databases"
    extract_databases(zp, DEV_INNER, target, identity=ID, progress=False)
    assert_dev_layout(target)
    files = json.loads((target / MARKER).read_text())["extracted"]["files"]
    assert files == sorted(p.relative_to(target).as_posix() for p in target.rglob("*")
                           if p.is_file() and p.name != MARKER)


def test_the_integrity_check_leaves_no_sidecar(tmp_path):
    """A database in WAL mode: PRAGMA quick_check on a read-only connection used to leave a -wal and a -shm
    beside it (the Grader, opening it immutable, then saw a folder that had changed)."""
    walled = make_database(tmp_path / "src" / "walled" / "walled.sqlite")
    con = sqlite3.connect(walled)
    assert con.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
    con.close()
    zp = build_train_zip(tmp_path / "train.zip", {"walled": walled.parent})
    target = tmp_path / "train_databases"
    extract_databases(zp, TRAIN_INNER, target, identity=ID, progress=False)
    assert sorted(p.name for p in (target / "walled").iterdir()) == ["walled.sqlite"]
    assert verified(target, ID)


def test_a_member_the_directory_leaves_out_is_refused(tmp_path):
    """The inner zip's directory must list exactly the entries its data holds (a member it leaves out is one
    that unzip would not extract)."""
    hidden = Raw("dev_databases/superhero/database_description/hidden.csv", b"a,b\n", listed=False)
    zp = build_raw_dev_zip(tmp_path / "dev.zip", raw_database_members() + [hidden])
    with pytest.raises(ArchiveError, match=r"its directory lists \d+ member\(s\) and its data holds \d+"):
        extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)
    assert not (tmp_path / "dev_databases").exists() and leftovers(tmp_path) == []


def test_a_directory_that_disagrees_on_a_crc_is_refused(tmp_path):
    inner = bytearray(raw_zip(raw_database_members()))
    inner[directory_record(inner, "dev_databases/superhero/superhero.sqlite") + 16] ^= 0xFF  # the CRC32 it records
    (tmp_path / "inner.zip").write_bytes(bytes(inner))
    zp = build_outer(tmp_path / "dev.zip", "dev_20240627", "dev_databases.zip", tmp_path / "inner.zip", {})
    with pytest.raises(ArchiveError, match="its directory and its data disagree"):
        extract_databases(zp, DEV_INNER, tmp_path / "dev_databases", identity=ID, progress=False)


MEMORY_SCRIPT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from t2sql.download.archive import extract_databases
    extract_databases(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), identity={}, progress=False)
    status = Path("/proc/self/status").read_text().splitlines()
    print([int(line.split()[1]) for line in status if line.startswith("VmHWM:")][0])
""")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM from /proc")
@pytest.mark.parametrize("where", ["inner", "inner-descriptors", "outer"])
def test_memory_does_not_grow_with_the_number_of_entries(tmp_path, where):
    """Peak RSS extracting a dev.zip with 5,000 skipped entries, then 100,000, in the inner zip (macOS
    junk; or macOS junk whose sizes come after it, each bounded by the inner directory read ahead) or in the
    outer one: no more than a few MiB apart (it grew by about 200 bytes an entry: 2M entries took 313 MB)."""
    peaks = []
    for n in (5_000, 100_000):
        skipped = [Raw(f"__MACOSX/{i:06d}", deflate=False, descriptor=where == "inner-descriptors")
                   for i in range(n)]
        zp = tmp_path / f"dev-{n}.zip"
        if where == "inner":
            build_raw_dev_zip(zp, skipped + raw_database_members(), outer_compression=zipfile.ZIP_STORED)
        elif where == "inner-descriptors":
            build_raw_dev_zip(zp, skipped + macos_members(), outer_compression=zipfile.ZIP_STORED)
        else:
            inner = raw_zip(raw_database_members())
            zp.write_bytes(raw_zip([Raw(f"dev_20240627/{s.name}", deflate=False) for s in skipped]
                                   + [Raw(DEV_INNER, inner, deflate=False)]))
        proc = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(zp), DEV_INNER, str(tmp_path / f"out-{n}")],
                              env=child_env(), capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr
        peaks.append(int(proc.stdout))
    print(f"peak RSS with 5,000 and 100,000 {where} entries: {peaks[0] / 1024:.1f} and {peaks[1] / 1024:.1f} MiB")
    assert peaks[1] - peaks[0] < 8 * 1024, peaks
