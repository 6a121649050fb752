"""Shared test helpers: where the real BIRD data is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


SAMPLE_ROOT = REPO / "python" / "t2sql" / "sample"  # the embedded superhero sample, BIRD's layout


def bird_root() -> Path | None:
    """BIRD dev beside this checkout (../shared/data/bird, as CI lays it out), or $T2SQL_BIRD."""
    for candidate in (os.environ.get("T2SQL_BIRD"), REPO.parent / "shared" / "data" / "bird"):
        if candidate and (Path(candidate) / "dev.json").exists():
            return Path(candidate)
    return None


def bird_or_sample() -> Path:
    """BIRD dev (432 questions, 3 databases) when present; else the embedded superhero sample
    (129 questions), so the tests still run on real data."""
    return bird_root() or SAMPLE_ROOT


@pytest.fixture(scope="session")
def qwen36_dir(tmp_path_factory) -> Path:
    """Qwen3.6's tokenizer with miles' chat template, saved as a tokenizer directory (tests/qwen36.py)."""
    import qwen36

    path = tmp_path_factory.mktemp("qwen3.6-tokenizer")
    qwen36.build_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def qwen36_tokenizer(qwen36_dir):
    """Loaded the way miles (load_tokenizer) and `t2sql eval --tokenizer DIR` load one: AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen36_dir)
