"""The dotted paths miles is handed (see t2sql-train's flags); the code lives in t2sql.miles.adapter
and t2sql.miles.metrics."""

from t2sql.miles.adapter import close_contexts, generate, reward_func
from t2sql.miles.metrics import log_rollout

__all__ = ["generate", "reward_func", "log_rollout", "close_contexts"]
