"""The grading API: `t2sql.grade` (compare predicted SQL with gold SQL), a method's canonical name (`check_method`,
`task_method`) and how methods are counted and described, and the process's grading memory. Value equality, the
digests, the safety policy and the parser of a method name are the Rust core's; this module converts arguments."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any, Iterable

from t2sql import _grader
from t2sql._grader import Database, GradeSpec, Verdict
from t2sql.errors import TaskError

OUTCOMES = _grader.OUTCOMES  # the core's verdict outcomes, in report order


def grade(
    db: Database | str | os.PathLike,
    pred_sql: str,
    gold_sql: str,
    method: str = "multiset",
    float_digits: int | None = _grader.GRADE_DEFAULTS["float_digits"],
    timeout_s: float = _grader.GRADE_DEFAULTS["timeout_s"],
    column_order: str = "strict",
    max_temp_mb: int = _grader.GRADE_DEFAULTS["max_temp_mb"],
) -> Verdict:
    """Grade `pred_sql` against `gold_sql` on `db` (a path or an open Database).

    method, the grading method: "multiset" (default), "set" (BIRD's
    metric), "ordered" (or "list"), "subset,=,N" and the other subset forms of t2sql._grader.METHODS (the
    prediction's distinct rows are each a gold row, and exactly N of them, or as the comparison says;
    N capped at the gold's distinct rows), or "auto" (ordered
    when the gold's outermost query has ORDER BY). column_order: "strict", or "ignore" (each row compared as the
    multiset of its cells). float_digits: significant digits non-integral REALs are rounded to
    before comparison, or None for exact. Each query gets `timeout_s`, and may hold `max_temp_mb` MiB of
    temporary files (sorts, DISTINCT, GROUP BY): past it, it stops (a prediction: pred_error; a gold: gold_error).
    """
    if not isinstance(db, Database):
        db = Database(os.fspath(db))
    spec = GradeSpec(method, gold_sql=gold_sql, float_digits=float_digits, column_order=column_order,
                     timeout_s=timeout_s, max_temp_mb=max_temp_mb)
    return db.grade(pred_sql, gold_sql, spec)


def check_method(method: str) -> str:
    """The canonical name of a grading method ("list" -> "ordered", " Subset, =,5" ->
    "subset,=,5", a bare "subset" -> "subset,>=,1", "auto" stays "auto": the core's reading);
    raises ValueError (InvalidArgument) saying what is wrong ("subset,<,3")."""
    return _grader.method_name(method)


def method_field_problem(row: dict) -> str:
    """A line's optional `grading_method` made canonical in place (check_method); what is wrong with it,
    or "" (absent or null: the command's default method)."""
    if row.get("grading_method") is None:
        return ""
    try:
        row["grading_method"] = check_method(row["grading_method"])
    except ValueError as e:
        return f"grading_method: {e}"
    return ""


def method_counts(methods: Iterable[str]) -> dict[str, int]:
    """How many tasks each grading method grades: most used first, ties by name."""
    return dict(sorted(Counter(methods).items(), key=lambda kv: (-kv[1], kv[0])))


def describe_methods(counts: dict[str, int]) -> str:
    """method_counts as one line: "set 395, subset,=,10 2, ordered 1"."""
    return ", ".join(f"{method} {n}" for method, n in counts.items())


def check_spill_directory(tmp_dir, name: str) -> None:
    """The one check of a spill directory before it is handed on (the core checks it again when it
    is set, but a process backend sets it in its workers, later): ValueError naming `name` (the
    argument, or the flag that gave it) when it is not a directory."""
    if tmp_dir is not None and not os.path.isdir(tmp_dir):
        raise ValueError(f"{name} {tmp_dir} is not a directory: create it, or pass another")


def grade_memory_setting(memory_mb: int | None, tmp_dir) -> tuple[int, str | None] | None:
    """The (bytes, spill directory) to hand t2sql.set_grade_memory for a budget in MiB and a
    directory, each None to keep the process's own; None when both are. ValueError for a budget
    that is not a whole number of MiB or a directory that is not one."""
    if memory_mb is None and tmp_dir is None:
        return None
    if memory_mb is not None and (isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1):
        raise ValueError(f"grade_memory_mb must be a whole number of MiB, at least 1, got {memory_mb!r}")
    current_bytes, current_dir = _grader.grade_memory()
    check_spill_directory(tmp_dir, "tmp_dir")
    directory = str(tmp_dir) if tmp_dir is not None else (str(current_dir) if current_dir else None)
    return (memory_mb * 2**20 if memory_mb is not None else current_bytes), directory


def fallback_note(given: str, question_id: Any, used: str) -> str:
    """The line that says a task was graded by the fallback method because its own grading_method
    cannot be read (task_method said so): a fallback is a user's choice, never a silent one."""
    return (f"task {question_id}: grading_method {given!r} cannot be read; graded as {used!r} "
            "(--grading-method-fallback)")


def task_method(method: str, question_id: Any, fallback: str | None = None) -> tuple[str, bool]:
    """A task's grading_method by its canonical name ("list" -> "ordered", " multiset" ->
    "multiset"), and whether `fallback` replaced it: one that cannot be read is a TaskError naming
    the task, or `fallback` if given."""
    try:
        return check_method(method), False
    except ValueError as e:
        if fallback:
            return check_method(fallback), True
        raise TaskError(
            f"task {question_id!r}: grading_method {method!r} cannot be read ({e}); fix it in the data, "
            "or choose a method for such tasks with --grading-method-fallback METHOD"
        ) from None

