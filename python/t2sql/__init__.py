"""t2sql: multi-turn text-to-SQL RL on miles, with a Rust grading core.

`import t2sql` is light: it loads the compiled core and nothing from miles, sglang or torch.
"""

from t2sql._grader import (
    Cancel,
    Database,
    DatabaseError,
    Digest,
    QueryCancelled,
    QueryTimeout,
    SqlError,
    T2sqlError,
    ToolResult,
    UnsafeQuery,
    Verdict,
    hash_secret_id,
    resolve_semantics,
    set_hash_secret,
    set_heap_limit,
    sqlite_version,
)
from t2sql.grading import grade

__version__ = "0.1.0"

__all__ = [
    "Cancel",
    "Database",
    "DatabaseError",
    "Digest",
    "QueryCancelled",
    "QueryTimeout",
    "SqlError",
    "T2sqlError",
    "ToolResult",
    "UnsafeQuery",
    "Verdict",
    "grade",
    "hash_secret_id",
    "resolve_semantics",
    "set_hash_secret",
    "set_heap_limit",
    "sqlite_version",
]
