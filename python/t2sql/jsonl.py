"""Reading JSON and JSON lines from files a user hands us, in bounded memory, one bad line at a time: every reader
of a user's JSON goes through here, so the same input is the same problem everywhere. Each problem is a
`JsonProblem` naming what is wrong with that line; the rules: docs/cli.md, "What every command reads"."""

from __future__ import annotations

import json
import math
import os
from typing import IO, Any, Iterator, NamedTuple

from t2sql.errors import T2sqlError

# A task row, a pairs line, an eval record: kilobytes. 16 MiB is far above any of them (an eval
# record with a long transcript is well under 1 MiB) and small enough that a reader stays bounded.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Deeper than any row we read (a converted row is 3 levels; an eval record's messages 5).
MAX_DEPTH = 64
_CHUNK = 1 << 16


class JsonProblem(T2sqlError, ValueError):
    """One line (or one file) that is not the JSON we read; the message says why."""


class JsonLine(NamedTuple):
    number: int  # 1-based line number in the file
    value: Any  # the parsed value; None when `problem` says why there is none
    problem: str  # "" when the line was read


def _no_constant(name: str) -> Any:
    raise JsonProblem(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonProblem(f"number {text[:40]} is too large for a float")
    return value


def _too_long_int(text: str) -> str:
    return f"an integer of {len(text):,} digits is too long to read"


def _bounded_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # past Python's limit on digits (sys.get_int_max_str_digits(), 4,300 by default)
        raise JsonProblem(_too_long_int(text)) from None


class _Refused:
    """What load_array puts where a number breaks the rules (NaN, Infinity, 1e999, an integer too long):
    the item holding it is refused, the others are read."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _marked_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not a JSON number")


def _marked_float(text: str) -> float | _Refused:
    value = float(text)
    return value if math.isfinite(value) else _Refused(f"number {text[:40]} is too large for a float")


def _marked_int(text: str) -> int | _Refused:
    try:
        return int(text)
    except ValueError:  # past Python's limit on digits, as _bounded_int
        return _Refused(_too_long_int(text))


def _check_value(value: Any, max_depth: int) -> None:
    """Walk `value` without recursion: its depth and every string (keys included) as UTF-8."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, (dict, list)):
            if depth > max_depth:
                raise JsonProblem(f"nested deeper than {max_depth} levels")
            if isinstance(item, dict):
                for key, inner in item.items():
                    _check_text(key)
                    stack.append((inner, depth + 1))
            else:
                stack.extend((inner, depth + 1) for inner in item)
        elif isinstance(item, _Refused):
            raise JsonProblem(item.problem)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise JsonProblem("a string holds a lone surrogate (\\ud800-\\udfff), which is not text") from None


def _decoded(text: str | bytes) -> str:
    if isinstance(text, (bytes, bytearray)):
        try:
            return bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonProblem(f"not UTF-8 (byte {e.start})") from None
    return text


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one JSON value under the rules above; raises JsonProblem."""
    text = _decoded(text)
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except JsonProblem:
        raise
    except json.JSONDecodeError as e:
        raise JsonProblem(f"not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise JsonProblem(f"nested deeper than {max_depth} levels") from None
    _check_value(value, max_depth)
    return value


def loads_or_none(text: str | bytes | None) -> Any:
    """`loads(text)`, or None when there is no text or it is not JSON under the rules above (how a command
    reads the first line of a file it may have written)."""
    try:
        return loads(text) if text is not None else None
    except JsonProblem:
        return None


def load_array(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> list[JsonLine]:
    """A JSON array read whole (BIRD's question files), each item judged on its own under the rules above:
    JsonLine(item number from 1, value, "") or (number, None, problem), so one NaN or one over-deep item
    is one problem, not a lost file. A text that is not JSON at all, or not an array, raises JsonProblem
    (a file nested past Python's parser is one too)."""
    text = _decoded(text)
    try:
        value = json.loads(text, parse_constant=_marked_constant, parse_float=_marked_float, parse_int=_marked_int)
    except JsonProblem:
        raise
    except json.JSONDecodeError as e:
        raise JsonProblem(f"not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise JsonProblem(f"nested deeper than {max_depth} levels") from None
    if not isinstance(value, list):
        raise JsonProblem("not a JSON array")
    items = []
    for number, item in enumerate(value, start=1):
        try:
            _check_value(item, max_depth)
        except JsonProblem as e:
            items.append(JsonLine(number, None, str(e)))
        else:
            items.append(JsonLine(number, item, ""))
    return items


def load_file(path: str | os.PathLike, *, max_bytes: int, what: str = "JSON file") -> Any:
    """A whole JSON file (BIRD's question list) under the rules above, refused unread when it is over
    `max_bytes`; raises JsonProblem naming the file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:
            raise JsonProblem(f"{path}: the {what} is {size:,} bytes, above the {max_bytes:,} this reads")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # it grew since the stat
        raise JsonProblem(f"{path}: the {what} is over {max_bytes:,} bytes")
    try:
        return loads(data)
    except JsonProblem as e:
        raise JsonProblem(f"{path}: {e}") from None


def raw_lines(f: IO[bytes], *, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
    """(line number, the line's bytes without its newline) for every line of a binary file; None in place
    of a line longer than `max_line_bytes`, which is read past without being kept. A last line without a
    newline counts."""
    number = 0
    while True:
        line = f.readline(max_line_bytes + 1)
        if not line:
            return
        number += 1
        if line.endswith(b"\n"):
            yield number, line[:-1]
            continue
        if len(line) <= max_line_bytes:  # the last line, without a newline
            yield number, line
            return
        # Over the limit: drop what was read and skip to the end of the line, a chunk at a time.
        while True:
            rest = f.readline(_CHUNK)
            if not rest or rest.endswith(b"\n"):
                break
        yield number, None


def json_lines(f: IO[bytes], *, max_line_bytes: int = MAX_LINE_BYTES,
               max_depth: int = MAX_DEPTH) -> Iterator[JsonLine]:
    """Every non-blank line of a JSONL file, parsed: JsonLine(number, value, "") or (number, None,
    problem). Blank lines hold nothing and are passed over."""
    for number, raw in raw_lines(f, max_line_bytes=max_line_bytes):
        if raw is None:
            yield JsonLine(number, None, f"line longer than {max_line_bytes:,} bytes")
            continue
        if not raw.strip():
            continue
        try:
            yield JsonLine(number, loads(raw, max_depth=max_depth), "")
        except JsonProblem as e:
            yield JsonLine(number, None, str(e))


def object_problem(row: Any, required: tuple[str, ...], strings: tuple[str, ...],
                   nullable: tuple[str, ...] = ()) -> str:
    """What keeps a JSON line from being a record ("" when nothing): not an object, a `required` key
    missing, a key of `strings` present and not a string (null allowed for those in `nullable`)."""
    if not isinstance(row, dict):
        return "not a JSON object"
    missing = [k for k in required if k not in row]
    if missing:
        return f"missing {missing}"
    bad = [k for k in strings if k in row and not isinstance(row[k], str) and not (k in nullable and row[k] is None)]
    return f"not strings: {bad}" if bad else ""


def dumps(value: Any, **kwargs: Any) -> str:
    """json.dumps that never writes NaN or Infinity (a non-finite float becomes null): what we write is
    JSON any reader takes."""
    try:
        return json.dumps(value, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False, **kwargs)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
