"""The dotted path miles is handed (see t2sql-train's flags); the code lives in t2sql.miles.cispo."""

from typing import Any

from t2sql.miles import cispo as _impl
from t2sql.miles.cispo import cispo_loss  # noqa: F401


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
