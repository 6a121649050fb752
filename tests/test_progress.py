"""t2sql.progress: a bar on a terminal (a real pseudo-terminal here), plain lines without one."""

from __future__ import annotations

import io
import os

from t2sql.progress import Progress


def test_a_terminal_gets_a_bar_redrawn_in_place():
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        assert tty.isatty()
        with Progress(4, "work", stream=tty, interval_s=0) as bar:
            for _ in range(4):
                bar.advance(status="ok")
    # One read returns what the pty holds at that moment (CI once got only the first draw):
    # read until the closed slave side reports the end (EIO on Linux).
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    written = b"".join(chunks).decode()
    assert written.startswith("\rwork [") and "4/4" in written and written.endswith("\n")
    assert written.count("\n") <= 2  # one line, redrawn (the pty may echo \r\n for the last \n)


def test_no_terminal_gets_periodic_lines_and_a_last_line():
    stream = io.StringIO()
    with Progress(3, "work", stream=stream, interval_s=0) as bar:
        for _ in range(3):
            bar.advance(status="acc 0.5")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("work: 1/3") and "acc 0.5" in lines[0] and "left)" in lines[0]
    assert lines[-1].startswith("work: 3/3") and "\r" not in stream.getvalue()


def test_a_short_run_without_a_terminal_prints_nothing():
    stream = io.StringIO()
    with Progress(3, "work", stream=stream, interval_s=3600) as bar:
        bar.advance(3)
    assert stream.getvalue() == ""
    quiet = io.StringIO()
    with Progress(3, "work", stream=quiet, interval_s=0, enabled=False) as bar:
        bar.advance(3)
    assert quiet.getvalue() == ""


def _read_pty(master: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks).decode()


def test_bytes_on_a_terminal_show_size_rate_and_time_left():
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        with Progress(8_000_000, "dev.zip", stream=tty, unit="bytes", done=2_000_000) as bar:
            for _ in range(3):
                bar.advance(1_000_000)
    written = _read_pty(master)
    assert written.startswith("\rdev.zip [") and "5.0 MB/8.0 MB" in written and "B/s ETA " in written


def test_bytes_without_a_terminal_are_plain_lines_and_a_resumed_start_is_not_in_the_rate(monkeypatch):
    import t2sql.progress as progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    stream = io.StringIO()
    with Progress(10_000_000, "train.zip", stream=stream, interval_s=0, unit="bytes", done=6_000_000) as bar:
        clock[0] += 2.0
        bar.advance(2_000_000)  # 2 MB in 2 s: 1 MB/s (not 8 MB in 2 s), 2 MB left: 2 s
    lines = stream.getvalue().splitlines()
    assert lines[0] == "train.zip: 8.0 MB/10.0 MB 1.0 MB/s (2s, about 2s left)"
    assert "\r" not in stream.getvalue()
    assert progress.format_bytes(8_919_543_554) == "8.92 GB" and progress.format_duration(3725) == "1h02m"
