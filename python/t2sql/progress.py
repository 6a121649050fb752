"""Progress on stderr: a bar redrawn in place on a terminal; with no terminal (a log file, a job
scheduler), one plain line every `interval_s` seconds (default 30, $T2SQL_PROGRESS_INTERVAL), so
a long run is never silent for minutes. Short runs off a terminal print nothing."""

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
                 interval_s: float | None = None) -> None:
        """enabled: None (default) = report; False = silent (a caller that reports itself)."""
        self.total = total
        self.label = label
        self.done = 0
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
        if status is not None:
            self.status = status
        if not self.enabled:
            return
        if self.tty:
            self._draw()
        elif time.monotonic() - self._last_line >= self.interval_s:
            self._line()

    def _counts(self) -> str:
        elapsed = time.monotonic() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        return f"{count} {rate:6.1f}/s" + (f" {self.status}" if self.status else "")

    def _line(self) -> None:
        self._last_line = time.monotonic()
        self._lines += 1
        elapsed = self._last_line - self._start
        eta = ""
        if self.total and self.done:
            eta = f", about {(self.total - self.done) * elapsed / self.done:.0f}s left"
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
        self.stream.write(line)
        self.stream.flush()
