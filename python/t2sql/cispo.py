"""The dotted path miles is handed (see t2sql-train's flags); the code lives in t2sql.miles.cispo."""

from t2sql.miles.cispo import cispo_loss

__all__ = ["cispo_loss"]
