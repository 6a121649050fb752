"""What makes a download end: a floor rate averaged after a grace and a deadline scaled by the file's size
(`min_rate`, `grace_s`, $T2SQL_DOWNLOAD_MIN_RATE, $T2SQL_DOWNLOAD_GRACE_S), a size ceiling for a body of no announced
size, and its budget of tries (`TryBudget`: failed tries in a row that took the kept file no further than it had
been in this call). The numbers and why: docs/training.md, "The recipe's data"."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from t2sql.errors import DownloadError
from t2sql.progress import format_bytes, format_duration

MIN_RATE_ENV = "T2SQL_DOWNLOAD_MIN_RATE"
GRACE_ENV = "T2SQL_DOWNLOAD_GRACE_S"
DEFAULT_MIN_RATE = 50_000.0  # bytes a second, on average over a call
DEFAULT_GRACE_S = 600.0  # a slow start (a busy server, a link warming up) never counts against the floor
DEFAULT_MAX_SIZE = 100 * 10**9  # without an announced or expected size: ten times BIRD's train.zip


@dataclass(frozen=True)
class TimeLimits:
    min_rate: float  # bytes a second
    grace_s: float

    @classmethod
    def resolve(cls, url: str, min_rate: float | None = None, grace_s: float | None = None) -> TimeLimits:
        """The arguments where given, else the environment's settings, else the defaults; a setting that is
        not a finite number (above 0 for the rate, 0 or more for the grace) is a DownloadError naming it."""
        rate = _setting(url, MIN_RATE_ENV, min_rate, DEFAULT_MIN_RATE, "bytes a second, above 0", lambda v: v > 0)
        grace = _setting(url, GRACE_ENV, grace_s, DEFAULT_GRACE_S, "seconds, 0 or more", lambda v: v >= 0)
        return cls(rate, grace)

    def deadline_s(self, size: int) -> float:
        """Seconds from the start of the call by which a file of `size` bytes must be whole."""
        return self.grace_s + size / self.min_rate

    def under_floor(self, received: int, elapsed_s: float) -> bool:
        """Whether `received` bytes in `elapsed_s` seconds fall short of the floor (never within the grace)."""
        return elapsed_s > self.grace_s and received < self.min_rate * (elapsed_s - self.grace_s)

    def describe(self) -> str:
        return (f"a floor of {format_bytes(self.min_rate)}/s on average after a grace of {seconds(self.grace_s)} "
                f"(${MIN_RATE_ENV}, ${GRACE_ENV})")


def _setting(url: str, env: str, given: float | None, default: float, unit: str, valid) -> float:
    source, raw = ("argument", given) if given is not None else (env, os.environ.get(env))
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or not valid(value):
        where = f"${env}" if source == env else f"the download's {env.removeprefix('T2SQL_DOWNLOAD_').lower()}"
        raise DownloadError(f"{where} is {str(raw)!r}: it must be a number of {unit} (default {default:g}); set it "
                            f"so or unset it", url=url)
    return value


def size_ceiling(expected_size: int | None, max_size: int | None) -> int:
    """The most bytes a download takes from a server that does not say how many it will send."""
    if expected_size is not None:
        return expected_size
    return max_size if max_size is not None else DEFAULT_MAX_SIZE


class TryBudget:
    """Failed tries in a row (see the module's docstring); `spent` once there were more than `retries`."""

    def __init__(self, retries: int, offset: int) -> None:
        self.retries = max(0, retries)
        self.failures = 0
        self.furthest = offset  # the most bytes the kept file held in this call

    def failed(self, offset: int, restarted: bool) -> None:
        """A try ended without the file: `offset` is what is kept now, `restarted` whether the try threw
        the kept bytes away."""
        if not restarted and offset > self.furthest:
            self.failures = 0
        self.furthest = max(self.furthest, offset)
        self.failures += 1

    @property
    def spent(self) -> bool:
        return self.failures > self.retries


def seconds(s: float) -> str:
    """2.5 s, 45.0 s, 1h05m: tenths under a minute (small test settings read as set)."""
    return f"{s:.1f} s" if s < 60 else format_duration(s)
