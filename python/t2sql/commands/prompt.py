"""`t2sql prompt`: print the rendered prompt of one task (system and user messages), as the model sees it.
docs/cli.md, "`t2sql prompt`"."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from t2sql import T2sqlError, jsonl
from t2sql.episode.presets import get_preset
from t2sql.episode.prompt import build_prompt, tool_specs
from t2sql.errors import DataError, PresetError, PromptCommandError, SchemaError, TaskError, UnknownDatabase
from t2sql.tasks import Task, existing_database, load_questions, row_db_root, row_fields, sample_questions


def read_rows(path: str) -> list[Any]:
    """The rows of a BIRD JSON list or a jsonl file; a bad line is reported and skipped."""
    try:
        rows, problems = load_questions(path)
    except DataError as e:
        raise PromptCommandError(str(e)) from None
    for p in problems:
        print(f"{path}:{p.row}: skipped: {p.message}", file=sys.stderr)
    return [row for _, row in rows]


def pick(rows: list[Any], index: int | None, question_id: str | None) -> Any:
    if question_id is not None:
        for row in rows:
            if isinstance(row, dict) and str(row_fields(row).get("question_id")) == question_id:
                return row
        raise PromptCommandError(f"no row with question_id {question_id!r}")
    index = 0 if index is None else index
    if not -len(rows) <= index < len(rows):
        raise PromptCommandError(f"--index {index} is out of range: the file has {len(rows)} rows (0-based)")
    return rows[index]


def add_arguments(parser: Any) -> None:
    parser.add_argument("--data", default=None,
                        help="BIRD questions (JSON list) or a t2sql jsonl (default: the embedded superhero sample)")
    parser.add_argument("--db-root", default=None,
                        help="databases at <db-root>/<db_id>/<db_id>.sqlite (default: beside --data for BIRD "
                             "rows, as eval and gold look; a converted row's db_path)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--index", type=int, default=None, help="0-based row number (default 0)")
    which.add_argument("--question-id", default=None, help="the row with this question_id")
    parser.add_argument("--preset", default=None, help="t2sql preset (default: the recipe's)")
    parser.add_argument("--json", action="store_true", help="print the messages and tools as JSON")


def run(args: Any) -> int:
    try:
        preset = get_preset(args.preset)
        if args.data is None and args.db_root is not None:
            raise PromptCommandError("--db-root needs --data (the embedded sample brings its own database)")
        data = args.data if args.data is not None else str(sample_questions())
        if args.db_root is not None and not Path(args.db_root).is_dir():
            raise PromptCommandError(f"--db-root {args.db_root} is not a directory "
                                     "(it must hold <db_id>/<db_id>.sqlite)")
        row = pick(read_rows(data), args.index, args.question_id)
        root = row_db_root(row, args.db_root, data)  # eval's and gold's rule: beside --data for BIRD rows
        task = Task.from_row(row, root)
        existing_database(task)  # the path rule, and a regular file (t2sql.databases)
        messages = build_prompt(task, preset)  # a question or evidence over the preset's limits: TaskError
    except (OSError, PromptCommandError, TaskError, PresetError, SchemaError, UnknownDatabase) as e:
        print(f"t2sql prompt: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the core's DatabaseError and friends: say which database

        if isinstance(e, T2sqlError):
            print(f"t2sql prompt: {task.db_path}: {e}", file=sys.stderr)
            return 2
        raise
    if args.json:
        print(jsonl.dumps({"question_id": task.question_id, "messages": messages, "tools": tool_specs()},
                          indent=1, ensure_ascii=False))
        return 0
    for m in messages:
        print(f"===== {m['role']} =====")
        print(m["content"])
    print(f"===== tools: {', '.join(t['function']['name'] for t in tool_specs())} =====")
    return 0
