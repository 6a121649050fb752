"""A small progress bar on stderr, drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int | None, label: str, stream=None) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._start = time.monotonic()
        self._last_draw = 0.0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self.enabled:
            self._draw()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if self.total:
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            line = f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {rate:6.1f}/s"
        else:
            line = f"\r{self.label} {self.done} {rate:6.1f}/s"
        self.stream.write(line)
        self.stream.flush()
