"""Where t2sql writes when no flag says where: the one rule for every default folder ($T2SQL_HOME, else the
platform's places). docs/cli.md, "Output files: one rule"."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

HOME_ENV = "T2SQL_HOME"


def _xdg(variable: str, fallback: str) -> Path:
    return Path(os.environ.get(variable) or os.path.join(os.path.expanduser("~"), fallback)) / "t2sql"


# Each kind: (its folder under $T2SQL_HOME, where it goes without one).
_PLACES: dict[str, tuple[str, Callable[[], Path]]] = {
    "eval": ("eval", lambda: _xdg("XDG_DATA_HOME", ".local/share") / "eval"),
    "equivalence": ("cache/equivalence", lambda: _xdg("XDG_CACHE_HOME", ".cache") / "equivalence"),
    "bench-grader": ("bench/grader", lambda: Path(tempfile.gettempdir()) / "t2sql-bench"),
    "bench-pairs": ("bench/pairs", lambda: Path(tempfile.gettempdir()) / "t2sql-bench-pairs"),
    "bench-download": ("bench/download", lambda: Path(tempfile.gettempdir())),
    "bench-equivalence-guard": ("bench/equivalence-guard",
                                lambda: Path(tempfile.gettempdir()) / "t2sql-bench-equivalence-guard"),
    "bench-equivalence-scale": ("bench/equivalence-scale",
                                lambda: Path(tempfile.gettempdir()) / "t2sql-bench-equivalence-scale"),
    "train": ("train", lambda: Path.home() / "t2sql"),
}
KINDS = tuple(_PLACES)


def home() -> Path | None:
    """$T2SQL_HOME, or None when it is unset or empty."""
    value = os.environ.get(HOME_ENV)
    return Path(value) if value else None


def default_dir(kind: str) -> Path:
    """The folder `kind` (one of KINDS) goes to when no flag names one (the module's rule)."""
    under, elsewhere = _PLACES[kind]
    root = home()
    return root / under if root is not None else elsewhere()


def describe_default_dir(kind: str) -> str:
    """The rule for `kind` in words, for a flag's help: "$T2SQL_HOME/eval, else ~/.local/share/t2sql/eval"."""
    under, elsewhere = _PLACES[kind]
    without = str(elsewhere()).replace(os.path.expanduser("~"), "~", 1)  # elsewhere() never reads $T2SQL_HOME
    return f"${HOME_ENV}/{under}, else {without}"


def made_default_dir(kind: str) -> Path:
    """default_dir, made with every folder above it when it is under $T2SQL_HOME or the platform's data or cache
    folder: t2sql's own (a folder a flag names is the user's and is never made from the root up)."""
    path = default_dir(kind)
    if home() is not None or kind in ("eval", "equivalence"):
        path.mkdir(parents=True, exist_ok=True)
    return path
