"""The dotted paths miles is handed (see t2sql-train's flags); the code lives in t2sql.miles.curriculum."""

from typing import Any

from t2sql.miles import curriculum as _curriculum
from t2sql.miles.curriculum import record_rollout

__all__ = ["record_rollout"]  # and CurriculumDataSource, built on first access (below)


def __getattr__(name: str) -> Any:
    # CurriculumDataSource subclasses a miles class: it is built on first access, so that importing
    # this module never imports miles.
    if name == "CurriculumDataSource":
        return _curriculum.CurriculumDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
