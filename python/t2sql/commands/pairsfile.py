"""A pairs file, as `t2sql grade --pairs` and `t2sql equivalence --pairs` read it: JSONL, one
{"id", "db_id", "pred", "gold"[, "grading_method", "evidence"]} per line, read by t2sql.jsonl (each line's length,
depth, numbers and text bounded), each line that is not a pair one problem of its own."""

from __future__ import annotations

import os
from typing import IO, Iterator

from t2sql.grading import check_method
from t2sql.jsonl import json_lines, raw_lines


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
        missing = [k for k in ("id", "db_id", "pred", "gold") if k not in row]
        # Only grading_method (the --method task default) and evidence (none) may be null; null SQL is no SQL.
        nullable = ("grading_method", "evidence")
        bad = [k for k in ("db_id", "pred", "gold", *nullable)
               if k in row and not isinstance(row[k], str) and not (k in nullable and row[k] is None)]
        if missing or bad:
            yield lineno, row, (f"missing {missing}" if missing else f"not strings: {bad}")
            continue
        if row.get("grading_method") is not None:
            try:
                row["grading_method"] = check_method(row["grading_method"])
            except ValueError as e:
                yield lineno, row, f"grading_method: {e}"
                continue
        yield lineno, row, ""
