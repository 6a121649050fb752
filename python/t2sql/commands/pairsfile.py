"""A pairs file, as `t2sql grade --pairs` and `t2sql equivalence --pairs` read it: JSONL, one
{"id", "db_id", "pred", "gold"[, "grading_method", "evidence"]} per line, read by t2sql.jsonl (each line's length,
depth, numbers and text bounded), each line that is not a pair one problem of its own."""

from __future__ import annotations

import os
from typing import IO, Iterator

from t2sql.grading import method_field_problem
from t2sql.jsonl import json_lines, object_problem, raw_lines


def count_pairs(path: str | os.PathLike) -> int:
    """The non-blank lines of --pairs, as read_pairs will see them (a line over the cap is one line,
    read past a chunk at a time, never held whole)."""
    with open(path, "rb") as f:
        return sum(1 for _, raw in raw_lines(f) if raw is None or raw.strip())


def read_pairs(f: IO[bytes]) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, the row or None, what is wrong with it or "") for each non-blank line: t2sql.jsonl
    reads the line (its length, depth, numbers and text bounded), this checks that it is a pair."""
    for lineno, row, problem in json_lines(f):
        if problem:
            yield lineno, None, problem
            continue
        if not isinstance(row, dict):
            yield lineno, None, "not a JSON object"
            continue
        # Only grading_method (the --method task default) and evidence (none) may be null; null SQL is no SQL.
        nullable = ("grading_method", "evidence")
        why = (object_problem(row, ("id", "db_id", "pred", "gold"), ("db_id", "pred", "gold", *nullable), nullable)
               or method_field_problem(row))
        if why:
            yield lineno, row, why
            continue
        yield lineno, row, ""
