"""Shared test helpers: where the real BIRD data is."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


SAMPLE_ROOT = REPO / "python" / "t2sql" / "sample"  # the embedded superhero sample, BIRD's layout


def bird_root() -> Path | None:
    """BIRD dev beside this checkout (../shared/data/bird, as CI lays it out), or $T2SQL_BIRD."""
    for candidate in (os.environ.get("T2SQL_BIRD"), REPO.parent / "shared" / "data" / "bird", "/work/shared/data/bird"):
        if candidate and (Path(candidate) / "dev.json").exists():
            return Path(candidate)
    return None


def bird_or_sample() -> Path:
    """BIRD dev (432 questions, 3 databases) when present; else the embedded superhero sample
    (129 questions), so the tests still run on real data."""
    return bird_root() or SAMPLE_ROOT
