"""The dotted path miles is handed (see t2sql-train's flags); the code lives in
t2sql.miles.adapter and t2sql.miles.metrics."""

from typing import Any

from t2sql.miles import adapter as _impl
from t2sql.miles.adapter import generate, reward_func  # noqa: F401
from t2sql.miles.metrics import log_rollout  # noqa: F401


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
