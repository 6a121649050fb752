"""Shared test helpers: where the real BIRD data is.

Everything the suite needs ships in the repository: tests/data/bird holds three real BIRD dev databases and
their 432 questions (CC BY-SA 4.0, NOTICE.md beside them), the package carries the superhero sample and
the recipe's task files. Nothing outside the checkout is read unless $T2SQL_BIRD points at another copy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


SAMPLE_ROOT = REPO / "python" / "t2sql" / "sample"  # the embedded superhero sample, BIRD's layout
BIRD_ROOT = REPO / "tests" / "data" / "bird"  # three BIRD dev databases and their 432 questions


def bird_root() -> Path:
    """BIRD dev in BIRD's layout (432 questions, 3 databases): $T2SQL_BIRD when set, else the copy in
    tests/data/bird. A missing copy fails the tests that need it; it never skips them."""
    return Path(os.environ.get("T2SQL_BIRD") or BIRD_ROOT)


def bird_db(db_id: str) -> str:
    """The file of one of bird_root's databases ("superhero", "toxicology", "student_club")."""
    return str(bird_root() / db_id / f"{db_id}.sqlite")


@pytest.fixture(scope="module")
def equivalence_checker(tmp_path_factory):
    """An equivalence checker with a disk cache of its own, shared by one test module's tests (mining and
    suites are built once a module, never taken from another run's cache)."""
    from t2sql.equivalence.check import EquivalenceChecker
    from t2sql.equivalence.diskcache import DiskCache

    checker = EquivalenceChecker(disk=DiskCache(tmp_path_factory.mktemp("equivalence-cache")))
    yield checker
    checker.close()


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


def child_env(**extra: str) -> dict[str, str]:
    """The environment for a `python -c` child that imports t2sql and the tests' helpers: the t2sql this
    process imported (an installed wheel in CI, a source tree with its built core elsewhere), never a guess
    at the checkout's python/ (which holds no compiled core after a plain `pip install .`)."""
    import t2sql

    paths = [str(Path(t2sql.__file__).resolve().parent.parent), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), **extra}


def integration_help(name: str) -> subprocess.CompletedProcess[str]:
    """`python -m t2sql.integrations.NAME --help`, as a user runs it, in this interpreter's environment (a
    framework's own, for tests/frameworks/)."""
    return subprocess.run([sys.executable, "-m", f"t2sql.integrations.{name}", "--help"], capture_output=True,
                          text=True, timeout=300, env=child_env())


@pytest.fixture(scope="module")
def bird_rollout():
    """The rollout context of BIRD dev's databases (t2sql.episode.rollout), its Grader closed after the module."""
    from t2sql.episode import rollout

    context = rollout.context(rollout.RolloutSettings(db_root=str(bird_root()), concurrency=2))
    yield context
    rollout.close_contexts()


def tool_limits(**changes):
    """The recipe preset's tool limits, some of them changed: the core has no default preview (the
    preset owns its numbers), so a test's tool call names the recipe's."""
    import t2sql

    limits = t2sql.get_preset().tool_limits
    given = {k: getattr(limits, k) for k in ("timeout_s", "max_rows", "max_cell_chars", "max_chars", "count_cap",
                                              "max_temp_mb")}
    return t2sql.ToolLimits(**{**given, **changes})
