"""The command line's argument types and the flags several commands share: each turns a flag's text
into its value or an argparse usage error saying what is wrong, before any data is read.

A grading method's name is read by t2sql.grading.check_method (the core's parser); the grading memory
flags are read back into the process's setting by t2sql.grading.grade_memory_setting.
"""

from __future__ import annotations

import argparse
import math

from t2sql import _grader
from t2sql.grading import check_method, check_spill_directory


class WholeNamesParser(argparse.ArgumentParser):
    """A parser that takes each flag by its whole name only: argparse's prefix matching would keep a
    removed spelling working as a hidden alias (`--timeout` for `--timeout-s`). `t2sql`'s and
    `t2sql-train`'s parsers, and so their subcommands' (argparse makes those of the parent's class)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs, allow_abbrev=False)


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
    check_spill_directory(tmp_dir, "--tmp-dir")
    return getattr(args, "grade_memory_mb", None), tmp_dir


# SQL worker threads one process runs: each runs one query at a time, so past a few times the machine's cores
# more of them only queue, and past this many a process spends its memory on thread stacks, not queries.
MAX_CONCURRENCY = 1024


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
