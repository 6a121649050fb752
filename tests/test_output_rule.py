"""t2sql.atomic's one output rule, on real paths: what is not a regular file is refused untouched (a device
node, a FIFO, a symlink to one, a directory, a symlink to nothing), a file that is not the command's own is
refused byte for byte unless forced, its own output is replaced, a missing folder is an error and never
made, and no temporary file outlives an error, an interrupt or a path that changed during the write."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import child_env
from t2sql.atomic import HEAD_BYTES, OutputFile, atomic_write, first_line, output_folder, write_bytes_atomic
from t2sql.errors import OutputPathError, T2sqlError

NOT_FILES = ["device", "fifo", "symlink_to_fifo", "directory", "symlink_to_nothing"]


def make_not_a_file(folder: Path, kind: str) -> Path:
    """A path in `folder` where no file may be written; a device node needs root (skipped without)."""
    path = folder / f"out-{kind}.jsonl"
    if kind == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink_to_fifo":
        os.mkfifo(folder / "a-fifo")
        path.symlink_to(folder / "a-fifo")
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink_to_nothing":
        path.symlink_to(folder / "nothing-here")
    return path


def state(path: Path) -> tuple:
    """What a path is, without following a link: its type, inode, device numbers and link text."""
    st = os.lstat(path)
    return stat.S_IFMT(st.st_mode), st.st_ino, st.st_rdev, os.readlink(path) if path.is_symlink() else None


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*.tmp"))


def output(path: Path, **kw) -> OutputFile:
    return OutputFile(path, flag="--out", kind="a test output", **kw)


@pytest.mark.parametrize("kind", NOT_FILES)
def test_what_is_not_a_regular_file_is_refused_untouched_even_with_force(tmp_path, kind):
    path = make_not_a_file(tmp_path, kind)
    before = state(path)
    with pytest.raises(OutputPathError) as refused:
        with output(path, force=True).open() as f:
            f.write("never written")
    assert isinstance(refused.value, T2sqlError) and refused.value.path == str(path)
    assert str(path) in str(refused.value) and "--out" in str(refused.value)
    assert state(path) == before
    assert temporaries(tmp_path) == [] and not (tmp_path / "nothing-here").exists()
    with pytest.raises(OutputPathError):
        write_bytes_atomic(path, b"never written")  # t2sql's own files keep the same rule
    assert state(path) == before and temporaries(tmp_path) == []


def test_dev_null_is_refused_and_stays_a_device():
    """The real /dev/null, only checked (never opened for writing): once it became a regular file."""
    with pytest.raises(OutputPathError, match="not a regular file"):
        output(Path("/dev/null"), force=True).check()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_a_file_that_is_not_the_commands_own_is_left_byte_for_byte_unless_forced(tmp_path):
    notes = tmp_path / "notes.jsonl"
    notes.write_bytes(b"someone's own notes\n" * 1000)
    before = notes.read_bytes()
    with pytest.raises(OutputPathError, match="--force") as refused:
        with output(notes, own=lambda head: head.startswith(b'{"ours"')).open() as f:
            f.write('{"ours": 1}\n')
    assert "exists and is not a test output" in str(refused.value)
    assert notes.read_bytes() == before and temporaries(tmp_path) == []
    with output(notes, own=lambda head: False, force=True).open() as f:
        f.write('{"ours": 1}\n')
    assert notes.read_text() == '{"ours": 1}\n'


def test_the_commands_own_output_and_an_empty_file_are_replaced(tmp_path):
    seen = []

    def own(head: bytes) -> bool:
        seen.append(head)
        return first_line(head) == b'{"ours": 1}'

    ours = tmp_path / "ours.jsonl"
    ours.write_text('{"ours": 1}\n{"ours": 2}\n')
    output(ours, own=own).write_bytes(b'{"ours": 3}\n')
    assert ours.read_bytes() == b'{"ours": 3}\n' and seen == [b'{"ours": 1}\n{"ours": 2}\n'] * 2  # checked twice
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    output(empty, own=lambda head: False).write_bytes(b"new\n")  # nothing in it to lose
    assert empty.read_bytes() == b"new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "ours.jsonl"]


def test_own_reads_a_bounded_head_and_a_first_line_past_it_is_not_ours(tmp_path):
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"x" * (3 * HEAD_BYTES))
    heads = []
    with pytest.raises(OutputPathError):
        output(big, own=lambda head: heads.append(head) or first_line(head) is not None).check()
    assert [len(h) for h in heads] == [HEAD_BYTES]
    assert first_line(b"short, no newline") == b"short, no newline"


def test_a_symlink_to_a_file_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.jsonl"
    real.write_text("old\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(real)
    output(link, own=lambda head: head == b"old\n").write_bytes(b"new\n")
    assert link.is_symlink() and os.readlink(link) == str(real) and real.read_bytes() == b"new\n"


def test_a_missing_folder_is_an_error_and_never_made(tmp_path):
    deep = tmp_path / "no" / "such" / "folder" / "out.jsonl"
    with pytest.raises(OutputPathError, match="does not exist") as refused:
        output(deep).write_bytes(b"x")
    assert "create it first" in str(refused.value)
    with pytest.raises(OutputPathError, match="does not exist"):
        write_bytes_atomic(deep, b"x")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(OutputPathError, match="is not a folder"):
        output(a_file / "out.jsonl").check()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_an_input_of_the_run_is_never_its_output(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"ours": 1}\n')
    link = tmp_path / "link.jsonl"
    link.symlink_to(data)
    for path in (data, link):
        with pytest.raises(OutputPathError, match="is the --data file this run reads"):
            output(path, own=lambda head: True, force=True, inputs=[("the --data file", data)]).check()
    assert data.read_text() == '{"ours": 1}\n'


@pytest.mark.parametrize("interrupt", [RuntimeError("disk on fire"), KeyboardInterrupt()])
def test_an_error_or_interrupt_midway_removes_the_temporary_file(tmp_path, interrupt):
    path = tmp_path / "out.jsonl"
    path.write_text("the old output\n")
    with pytest.raises(type(interrupt)):
        with output(path, own=lambda head: True).open() as f:
            f.write("half of the new one")
            assert len(temporaries(tmp_path)) == 1  # the temporary file is there while the output is written
            raise interrupt
    assert path.read_text() == "the old output\n" and temporaries(tmp_path) == []


def test_the_path_is_checked_again_before_the_rename(tmp_path):
    """A long run gives the path time to change: a FIFO put there meanwhile is not renamed over."""
    path = tmp_path / "out.jsonl"
    with pytest.raises(OutputPathError, match="nothing was written"):
        with output(path).open() as f:
            f.write("the output\n")
            os.mkfifo(path)
    assert stat.S_ISFIFO(os.lstat(path).st_mode) and temporaries(tmp_path) == []
    other = tmp_path / "other.jsonl"
    with pytest.raises(OutputPathError, match="not a test output"):
        with output(other).open() as f:
            f.write("the output\n")
            other.write_text("a file someone wrote meanwhile\n")
    assert other.read_text() == "a file someone wrote meanwhile\n" and temporaries(tmp_path) == []


def test_atomic_write_gives_an_ordinary_mode_and_replaces_a_file_of_its_own(tmp_path):
    path = tmp_path / "state.json"
    for text in ("one", "two"):
        with atomic_write(path) as f:
            f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    assert path.read_text() == "two" and path.stat().st_mode & 0o777 == 0o666 & ~umask
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_an_output_folder_is_made_one_level_only(tmp_path):
    made = output_folder(tmp_path / "out", flag="--out-dir")
    assert made.is_dir()
    assert output_folder(made, flag="--out-dir") == made  # there already: used as is
    checked = output_folder(tmp_path / "later", flag="--out-dir", create=False)
    assert not checked.exists()
    with pytest.raises(OutputPathError, match="does not exist"):
        output_folder(tmp_path / "no" / "such", flag="--out-dir")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OutputPathError, match="is not a directory"):
        output_folder(tmp_path / "a-file", flag="--out-dir")
    fifo = make_not_a_file(tmp_path, "fifo")
    with pytest.raises(OutputPathError, match="is not a directory"):
        output_folder(fifo, flag="--out-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "out", fifo.name]


# ------------------------------------------------------------------------- SIGTERM unwinds like SIGINT

SIGTERM_INSIDE_ASYNCIO = """
import asyncio, gc, os, signal
from t2sql.interrupts import interrupt_word, sigterm_unwinds

async def one(n):
    try:
        if n == 0:
            await asyncio.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, inside this task's step
        while True:
            await asyncio.sleep(0.01)
    finally:
        print(f"{n} unwound", flush=True)

async def main():
    await asyncio.gather(*(one(n) for n in range(3)))

with sigterm_unwinds():
    try:
        asyncio.run(main())
    except KeyboardInterrupt as e:
        print(interrupt_word(e), flush=True)
gc.collect()  # as a command goes on after the interrupt: a task that kept it would print it here
"""


def test_sigterm_inside_asyncio_unwinds_every_task_and_leaves_no_stored_exception():
    """Raised inside a running task, the interrupt would stay stored in it and asyncio would print it
    ("Task exception was never retrieved", with a traceback); it stops the loop from a callback instead."""
    proc = subprocess.run([sys.executable, "-c", SIGTERM_INSIDE_ASYNCIO], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert (proc.returncode, proc.stderr) == (0, "")
    lines = proc.stdout.splitlines()
    assert sorted(lines[:3]) == ["0 unwound", "1 unwound", "2 unwound"] and lines[3:] == ["terminated"]


@pytest.mark.parametrize("quiet", [False, True])
def test_what_an_interrupt_left_half_made_complains_at_exit_only_before_quiet_teardown(quiet):
    # An event loop an interrupt stopped while it started, collected at exit, prints a traceback; once the
    # interrupt is reported (quiet_teardown), such complaints, and a coroutine that never ran, are dropped.
    script = (
        "import asyncio, gc\n"
        "from t2sql.interrupts import quiet_teardown\n"
        "class HalfMade:\n"
        "    def __del__(self):\n"
        "        raise RuntimeError('Cannot close a running event loop')\n"
        "async def never(): pass\n"
        f"{'quiet_teardown()' if quiet else 'pass'}\n"
        "left = [HalfMade(), never()]\n"
        "del left\n"
        "gc.collect()\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=child_env())
    assert out.returncode == 0
    assert ("Traceback" in out.stderr and "never awaited" in out.stderr) is not quiet, out.stderr
    if quiet:
        assert out.stderr == ""
