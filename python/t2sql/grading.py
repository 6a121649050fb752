"""`t2sql.grade`: compare predicted SQL with gold SQL; and the names of the grading methods.

Value equality, the digests and the safety policy live in the Rust core (grader_rs); this
module only converts arguments.
"""

from __future__ import annotations

import argparse
import math
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
    *,
    semantics: str | None = None,
) -> Verdict:
    """Grade `pred_sql` against `gold_sql` on `db` (a path or an open Database).

    method, the grading method (`semantics=` is its older name): "multiset" (default), "set" (BIRD's
    metric), "ordered" (or "list"), "subset,=,N" / "subset,>=,N" (the prediction's distinct rows are
    exactly / at least N, each a gold row; N capped at the gold's distinct rows), or "auto" (ordered
    when the gold's outermost query has ORDER BY). column_order: "strict", or "ignore" (each row compared as the
    multiset of its cells). float_digits: significant digits non-integral REALs are rounded to
    before comparison, or None for exact. Each query gets `timeout_s`, and may hold `max_temp_mb` MiB of
    temporary files (sorts, DISTINCT, GROUP BY): past it, it stops (a prediction: pred_error; a gold: gold_error).
    """
    if semantics is not None:
        if method != "multiset" and method != semantics:
            raise TypeError("grade() got the method twice: `semantics` is the older name of `method`")
        method = semantics
    if not isinstance(db, Database):
        db = Database(os.fspath(db))
    spec = GradeSpec(method, gold_sql=gold_sql, float_digits=float_digits, column_order=column_order,
                     timeout_s=timeout_s, max_temp_mb=max_temp_mb)
    return db.grade(pred_sql, gold_sql, spec)


def check_method(method: str) -> str:
    """The canonical name of a grading method ("list" -> "ordered", " Subset, =,5" ->
    "subset,=,5", "auto" stays "auto": the core's reading); raises ValueError (InvalidArgument)
    saying what is wrong (a bare "subset" has no count)."""
    return _grader.method_name(method)


def method_counts(methods: Iterable[str]) -> dict[str, int]:
    """How many tasks each grading method grades: most used first, ties by name."""
    return dict(sorted(Counter(methods).items(), key=lambda kv: (-kv[1], kv[0])))


def describe_methods(counts: dict[str, int]) -> str:
    """method_counts as one line: "set 395, subset,=,10 2, ordered 1"."""
    return ", ".join(f"{method} {n}" for method, n in counts.items())


# ---- command line ------------------------------------------------------------------------


def method_arg(text: str) -> str:
    """argparse type of a flag naming a grading method (--grading-method-fallback): the canonical
    name, or a usage error saying what is wrong, before any data is read."""
    try:
        return check_method(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_arg(text: str) -> float:
    """argparse type of a time limit: a positive, finite number of seconds (nan and inf are not
    limits), or a usage error."""
    return _positive(text, "number of seconds")


def positive_arg(text: str) -> float:
    """argparse type of a positive, finite amount (megabytes)."""
    return _positive(text, "number")


def wait_arg(text: str) -> float:
    """argparse type of a wait that may be none (a retry's backoff): zero or a positive, finite
    number of seconds."""
    return _positive(text, "number of seconds", zero_allowed=True)


def _positive(text: str, what: str, *, zero_allowed: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
    if not (math.isfinite(value) and (value > 0 or (zero_allowed and value == 0))):
        kind = "zero or a positive, finite" if zero_allowed else "a positive, finite"
        raise argparse.ArgumentTypeError(f"give {kind} {what}, not {text!r}")
    return value


def add_grade_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """--grade-memory-mb and --tmp-dir: the grading memory of a command that grades (one place for
    both flags; `grade_memory_from_args` reads them back)."""
    default_mb = _grader.GRADE_DEFAULTS["memory_mb"]
    parser.add_argument("--grade-memory-mb", type=_memory_mb, default=None, metavar="MB",
                        help=f"MiB of row keys one set or subset grade holds in memory before it spills to "
                             f"disk (default {default_mb}; per running grade)")
    parser.add_argument("--tmp-dir", default=None, metavar="DIR",
                        help="where set and subset grades past their memory spill (anonymous files, never left "
                             "behind; default: the system's temporary directory)")


def add_temp_disk_argument(parser: argparse.ArgumentParser, *, from_preset: bool = False) -> None:
    """--max-temp-mb: the cap on each query's temporary disk, for every command that runs queries (one
    place for the flag). Its default is the core's (GRADE_DEFAULTS["max_temp_mb"]), or, `from_preset`,
    None: the command's preset decides (Preset.max_temp_mb, the same number unless a preset changes it)."""
    core = _grader.GRADE_DEFAULTS["max_temp_mb"]
    default, said = (None, f"the preset's, {core} in the built-in ones") if from_preset else (core, str(core))
    parser.add_argument("--max-temp-mb", type=_temp_mb, default=default, metavar="MB",
                        help=f"MiB of SQLite temporary files (sorts, DISTINCT, GROUP BY) one query may hold; past "
                             f"it the query fails (default {said}; per running query)")


def grade_memory_from_args(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """(MiB or None, tmp dir or None) from add_grade_memory_arguments' flags; ValueError that
    names the flag when --tmp-dir is not a directory."""
    tmp_dir = getattr(args, "tmp_dir", None)
    if tmp_dir is not None and not os.path.isdir(tmp_dir):
        raise ValueError(f"--tmp-dir {tmp_dir} is not a directory: create it, or pass another")
    return getattr(args, "grade_memory_mb", None), tmp_dir


def grade_memory_setting(memory_mb: int | None, tmp_dir) -> tuple[int, str | None] | None:
    """The (bytes, spill directory) to hand t2sql.set_grade_memory for a budget in MiB and a
    directory, each None to keep the process's own; None when both are. ValueError for a budget
    that is not a whole number of MiB or a directory that is not one."""
    if memory_mb is None and tmp_dir is None:
        return None
    if memory_mb is not None and (isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb < 1):
        raise ValueError(f"grade_memory_mb must be a whole number of MiB, at least 1, got {memory_mb!r}")
    current_bytes, current_dir = _grader.grade_memory()
    if tmp_dir is not None and not os.path.isdir(tmp_dir):
        raise ValueError(f"tmp_dir {tmp_dir} is not a directory: create it, or pass another")
    directory = str(tmp_dir) if tmp_dir is not None else (str(current_dir) if current_dir else None)
    return (memory_mb * 2**20 if memory_mb is not None else current_bytes), directory


def workers_arg(text: str) -> int:
    """argparse type of a number of workers: a whole number, 1 or more, or a usage error."""
    return _at_least_one(text, "workers", "the worker count")


def _memory_mb(text: str) -> int:
    return _at_least_one(text, "MiB", "the grading memory")


def _temp_mb(text: str) -> int:
    return _at_least_one(text, "MiB", "the temporary disk of a query")


def _at_least_one(text: str, unit: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of {unit}, 1 or more, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{what} must be at least 1 {unit.rstrip('s')}, not {value}")
    return value


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
