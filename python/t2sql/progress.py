"""Progress on stderr: a bar redrawn in place on a terminal; with no terminal, one plain line every `interval_s`
seconds (default 30, $T2SQL_PROGRESS_INTERVAL), so a long run is never silent for minutes. Counts of items, or
bytes for downloads (a resumed one's rate counts only what moved in this run)."""

from __future__ import annotations

import os
import sys
import time

DEFAULT_INTERVAL_S = 30.0


def _interval_from_env() -> float:
    try:
        return max(0.0, float(os.environ.get("T2SQL_PROGRESS_INTERVAL", DEFAULT_INTERVAL_S)))
    except ValueError:
        return DEFAULT_INTERVAL_S


class Progress:
    def __init__(self, total: int | None, label: str, stream=None, *, enabled: bool | None = None,
                 interval_s: float | None = None, unit: str = "count", done: int = 0) -> None:
        """enabled: None (default) = report; False = silent (a caller that reports itself).
        unit: "count" or "bytes"; done: where the count starts. A caller may set `total` and `done`
        later (a download that learns its size, or restarts from zero)."""
        if unit not in ("count", "bytes"):
            raise ValueError(f"unit is 'count' or 'bytes', not {unit!r}")
        self.total = total
        self.label = label
        self.unit = unit
        self.done = done
        self._moved = 0  # advanced in this run: what the rate is of
        self.status = ""  # a caller's short note after the count (e.g. "acc 0.712")
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.enabled = enabled is not False
        self.interval_s = _interval_from_env() if interval_s is None else interval_s
        self._start = time.monotonic()
        self._last_draw = 0.0
        self._last_line = self._start
        self._lines = 0
        self._closed = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if not self.enabled or self._closed:
            return
        self._closed = True
        if self.tty:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
        elif self._lines:  # a run that reported along the way reports its end too
            self._line()

    def advance(self, n: int = 1, status: str | None = None) -> None:
        self.done += n
        self._moved += n
        if status is not None:
            self.status = status
        if not self.enabled:
            return
        if self.tty:
            self._draw()
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._line()

    def _rate(self) -> float:
        elapsed = time.monotonic() - self._start
        return self._moved / elapsed if elapsed > 0 else 0.0

    def _left_s(self) -> float | None:
        """Seconds left at the rate so far; None when unknown."""
        if not self.total or not self._moved:
            return None
        return max(0, self.total - self.done) * (time.monotonic() - self._start) / self._moved

    def _counts(self) -> str:
        rate = self._rate()
        if self.unit == "bytes":
            count = f"{format_bytes(self.done)}/{format_bytes(self.total)}" if self.total else format_bytes(self.done)
            text = f"{count} {format_bytes(rate)}/s"
        else:
            count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
            text = f"{count} {rate:6.1f}/s"
        return text + (f" {self.status}" if self.status else "")

    def _line(self) -> None:
        self._last_line = time.monotonic()
        self._lines += 1
        elapsed = self._last_line - self._start
        left = self._left_s()
        eta = ""
        if left is not None:
            eta = f", about {format_duration(left) if self.unit == 'bytes' else f'{left:.0f}s'} left"
        self.stream.write(f"{self.label}: {self._counts()} ({elapsed:.0f}s{eta})\n")
        self.stream.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        if self.total:
            frac = min(self.done / self.total, 1.0)
            line = f"\r{self.label} [{'#' * int(frac * 30):<30}] {self._counts()} "
        else:
            line = f"\r{self.label} {self._counts()} "
        if self.unit == "bytes":
            left = self._left_s()
            line += f"ETA {format_duration(left)} " if left is not None else ""
        self.stream.write(line)
        self.stream.flush()


def format_bytes(n: float) -> str:
    """A size for people, in decimal units as download sizes are quoted: 512 B, 12.3 kB, 312.4 MB, 8.92 GB."""
    n = float(n)
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB", "TB"):
        n /= 1000
        if n < 1000 or unit == "TB":
            return f"{n:.2f} {unit}" if unit in ("GB", "TB") else f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_duration(seconds: float) -> str:
    """45s, 2m50s, 1h05m."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def closed_stdout_exit() -> int:
    """The exit code of a command whose stdout reader went away (`... | head -1`): 141, a shell's code for
    a command SIGPIPE ended, so a script never takes half-read output for success. stdout is pointed at
    /dev/null first, so the interpreter's flush at exit cannot raise (or print) a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no stdout file descriptor at all
        pass
    finally:
        os.close(devnull)
    return 141


class StderrGuard:
    """sys.stderr while a command runs. A write to a closed stderr (`t2sql eval ... 2>&1 | head -1`) must not
    stop the command half way (an eval still writes every result): the stream goes silent instead, its
    descriptor pointed at /dev/null, and `broken` remembers it for the exit code."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._silence()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._silence()

    def _silence(self) -> None:
        self.broken = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no descriptor to point anywhere
            pass

    def __getattr__(self, name: str):  # isatty, fileno, encoding, ...: the real stream's
        return getattr(self.stream, name)

