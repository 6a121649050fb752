"""Shared test helpers: where the real BIRD data is."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bird_root() -> Path | None:
    """BIRD dev beside this checkout (../shared/data/bird, as CI lays it out), or $T2SQL_BIRD."""
    for candidate in (os.environ.get("T2SQL_BIRD"), REPO.parent / "shared" / "data" / "bird", "/work/shared/data/bird"):
        if candidate and (Path(candidate) / "dev.json").exists():
            return Path(candidate)
    return None
