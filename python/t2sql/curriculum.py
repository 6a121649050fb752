"""The dotted path miles is handed (see t2sql-train's flags); the code lives in t2sql.miles.curriculum."""

from typing import Any

from t2sql.miles import curriculum as _impl
from t2sql.miles.curriculum import record_rollout  # noqa: F401


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
