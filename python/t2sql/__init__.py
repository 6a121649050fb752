"""t2sql: multi-turn text-to-SQL RL on miles, with a Rust grading core.

`import t2sql` is light: it loads the compiled core and nothing from miles, sglang or torch. The
episode, the Grader and the presets load on first use (`t2sql.Grader`, `t2sql.Episode`, ...).
"""

from typing import Any

from t2sql._grader import (
    Cancel,
    ConstraintError,
    Database,
    DatabaseClosed,
    DatabaseError,
    Digest,
    GradeSpec,
    HashSecretMismatch,
    InvalidArgument,
    QueryCancelled,
    QueryTimeout,
    SpillError,
    SqlError,
    T2sqlError,
    TempDiskExceeded,
    ToolLimits,
    ToolResult,
    UnsafeQuery,
    Verdict,
    grade_memory,
    hash_secret_id,
    resolve_method,
    set_grade_memory,
    set_hash_secret,
    set_heap_limit,
    spill_usage,
    sqlite_version,
    temp_usage,
)
from t2sql.errors import (
    AdapterError,
    CurriculumError,
    DataError,
    EndpointError,
    EvalError,
    LaunchError,
    PresetError,
    SchemaError,
    TaskError,
)
from t2sql.grading import grade

# Public names whose modules load on first use: (module, attribute).
_LAZY = {
    "Grader": ("t2sql.serving.grader", "Grader"),
    "Episode": ("t2sql.episode.machine", "Episode"),
    "Task": ("t2sql.tasks", "Task"),
    "Preset": ("t2sql.episode.presets", "Preset"),
    "get_preset": ("t2sql.episode.presets", "get_preset"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 't2sql' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "AdapterError",
    "CurriculumError",
    "DataError",
    "EndpointError",
    "Episode",
    "EvalError",
    "Grader",
    "LaunchError",
    "Preset",
    "PresetError",
    "SchemaError",
    "Task",
    "TaskError",
    "get_preset",
    "Cancel",
    "ConstraintError",
    "Database",
    "DatabaseClosed",
    "DatabaseError",
    "Digest",
    "GradeSpec",
    "HashSecretMismatch",
    "InvalidArgument",
    "QueryCancelled",
    "QueryTimeout",
    "SpillError",
    "SqlError",
    "T2sqlError",
    "TempDiskExceeded",
    "ToolLimits",
    "ToolResult",
    "UnsafeQuery",
    "Verdict",
    "grade",
    "grade_memory",
    "hash_secret_id",
    "resolve_method",
    "set_grade_memory",
    "set_hash_secret",
    "set_heap_limit",
    "spill_usage",
    "sqlite_version",
    "temp_usage",
]
