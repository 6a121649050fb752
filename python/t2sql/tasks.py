"""A task, the one reader of task rows, and where a task's database lives.

Every part of t2sql that reads a task row goes through here: `t2sql convert` (normalize_rows,
validate_rows), `t2sql eval` and `t2sql prompt` (Task.from_row), `t2sql gold` and
`t2sql-train prepare` (row_fields, Task.from_row), and the miles adapter (Task.from_row). A row is
one of:

- a BIRD question: question_id, db_id, question, evidence, SQL, difficulty, optionally
  grading_method (BIRD-Verified's own comparison) and original_* fields;
- a converted miles row (t2sql.data.convert): {"label": {gold_sql, grading_method}, "metadata":
  {question_id, db_id, db_path, question, evidence, difficulty, split, preset, ...}}. Rows written
  by older versions also repeat question_id and db_id (and grading_method) in the label: they
  read the same.

Databases are laid out as BIRD's, `<root>/<db_id>/<db_id>.sqlite`, and found by the one path rule of
t2sql.databases (`database_path`, `find_database`, named here too); `Task.from_row` applies it to
a task's path without touching the disk, `existing_database` checks the file before a command runs
anything on it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable, Mapping

from t2sql import jsonl
from t2sql._grader import Database, DatabaseError
from t2sql.databases import database_path, file_kind, find_at, recorded_database_path
from t2sql.databases import find_database as find_database
from t2sql.databases import list_databases as list_databases
from t2sql.errors import DataError, Problem, TaskError, UnknownDatabase
from t2sql.grading import task_method

# Canonical field -> the key in BIRD's question files (`--field-map` renames them).
BIRD_FIELDS: dict[str, str] = {
    "question_id": "question_id",
    "db_id": "db_id",
    "question": "question",
    "evidence": "evidence",
    "gold_sql": "SQL",
    "difficulty": "difficulty",
    "grading_method": "grading_method",  # optional: the task's own comparison (BIRD-Verified)
}

REQUIRED_FIELDS = ("db_id", "question", "gold_sql")

# Where a row without a field map keeps its gold query: a converted row's label, BIRD's "SQL", or
# the names other text-to-SQL sets use.
GOLD_KEYS = ("gold_sql", "SQL", "sql", "query")


# ---- files that ship in the package -----------------------------------------------------------


def sample_dir() -> Path:
    """The embedded BIRD sample (superhero + its 129 dev questions), also inside an installed wheel."""
    try:
        from importlib.resources import files

        return Path(str(files("t2sql") / "sample"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd loaders
        return Path(__file__).resolve().parent / "sample"


def sample_questions() -> Path:
    return sample_dir() / "dev.json"


def release_dir() -> Path:
    """The recipe's task files, shipped in the package (BIRD-Verified train and validation, Arcwise-Plat-SQL;
    CC BY-SA 4.0, NOTICE.md beside them). Their databases are not shipped."""
    return sample_dir().parent / "release"


# ---- where a task's database lives (t2sql.databases) -------------------------------------------


def existing_database(task: Task) -> str:
    """The task's database file, checked on disk by the path rule (t2sql.databases.find_at: its db_path
    is the rule's layout, from a root or recorded at conversion, and the file there a regular one).
    Raises UnknownDatabase."""
    return find_at(task.db_path, task.db_id, task.question_id)


def row_db_root(row: Mapping[str, Any], db_root: str | os.PathLike | None,
                data: str | os.PathLike) -> str | os.PathLike | None:
    """Where a row's database is looked up: `db_root` when given; else a BIRD row's sits beside
    its question file (BIRD's layout) and a converted row (it has metadata) keeps its db_path."""
    if db_root is None and not isinstance(row.get("metadata"), Mapping):
        return Path(data).parent
    return db_root


# ---- a task ------------------------------------------------------------------------------------


def row_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row's fields by their canonical names: a converted row's metadata and label over its top
    level, the gold query under "gold_sql" whichever of GOLD_KEYS held it."""
    fields: dict[str, Any] = {k: v for k, v in row.items() if k not in ("metadata", "label", "prompt")}
    if isinstance(row.get("metadata"), Mapping):
        fields.update(row["metadata"])
    label = row.get("label")
    if isinstance(label, Mapping):
        fields.update(label)
    elif isinstance(label, str):
        fields["gold_sql"] = label
    fields["gold_sql"] = next((fields[k] for k in GOLD_KEYS if isinstance(fields.get(k), str)), None)
    return fields


def read_method(given: Any, question_id: Any, fallback: str | None) -> tuple[str | None, str | None]:
    """A row's grading_method: (its canonical name or None when the row has none, the unreadable
    text when `fallback` replaced it). An unreadable one without a fallback is a TaskError."""
    if given is None or not str(given).strip():
        return None, None
    method, replaced = task_method(str(given), question_id, fallback)
    return method, str(given) if replaced else None


@dataclass(frozen=True)
class Task:
    question_id: str
    db_id: str
    db_path: str
    question: str
    evidence: str
    gold_sql: str
    difficulty: str = ""
    grading_method: str | None = None  # the task's own comparison (BIRD-Verified), canonical name
    grading_method_given: str | None = None  # the data's unreadable method, when the fallback replaced it
    # The source's original_* fields (BIRD-Verified keeps the question as first published), carried
    # into a converted row's metadata as they are.
    originals: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_row(cls, row: Mapping[str, Any], db_root: str | os.PathLike | None = None, *,
                 method_fallback: str | None = None) -> Task:
        """A task from a BIRD question or a converted miles row (see the module's doc).

        With `db_root`, the database is `<db_root>/<db_id>/<db_id>.sqlite` (BIRD's layout);
        without it, the row's `db_path` (converted rows carry one). A grading_method that cannot be
        read (an unknown word, "subset,<,3") is a TaskError unless `method_fallback` names the
        method to use instead.
        """
        if not isinstance(row, Mapping):
            raise TaskError(f"a task row must be a JSON object, got {type(row).__name__}")
        fields = row_fields(row)
        gold = fields["gold_sql"]
        qid = fields.get("question_id")
        missing = [name for name, value in (("question_id", qid), ("db_id", fields.get("db_id")),
                                             ("question", fields.get("question")), ("gold SQL", gold))
                   if value is None or (isinstance(value, str) and not value.strip())]
        if missing:
            raise TaskError(
                f"task row {qid!r} lacks {', '.join(missing)}; expected BIRD fields (question_id, db_id, "
                "question, evidence, SQL) or a row written by `t2sql convert`"
            )
        db_id = str(fields["db_id"])
        if db_root is not None:
            db_path = str(database_path(db_root, db_id))
        else:
            db_path = recorded_database_path(fields.get("db_path"), db_id, qid)
        method, given = read_method(fields.get("grading_method"), qid, method_fallback)
        return cls.from_fields(fields, question_id=str(qid), db_path=db_path, method=method, given=given)

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any], *, question_id: str, db_path: str, method: str | None,
                    given: str | None) -> Task:
        """A task from a row's row_fields once its id, database and method are settled (from_row's
        checks, or `t2sql gold`'s, which asks less of a row)."""
        def text(name: str) -> str:
            return "" if fields.get(name) is None else str(fields[name])

        return cls(
            question_id=question_id,
            db_id=text("db_id"),
            db_path=db_path,
            question=text("question"),
            evidence=str(fields.get("evidence") or ""),
            gold_sql=fields["gold_sql"] or "",
            difficulty=str(fields.get("difficulty") or ""),
            grading_method=method,
            grading_method_given=given,
        )


# ---- question files ----------------------------------------------------------------------------


def parse_field_map(items: Iterable[str] | None) -> dict[str, str]:
    """`["gold_sql=query", ...]` -> the full canonical-to-source map (BIRD's names by default)."""
    mapping = dict(BIRD_FIELDS)
    for item in items or ():
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise DataError(f"--field-map {item!r}: expected CANONICAL=SOURCE, e.g. gold_sql=query")
        if key not in BIRD_FIELDS:
            raise DataError(
                f"--field-map {item!r}: unknown field {key!r}; the fields are {', '.join(BIRD_FIELDS)}"
            )
        mapping[key] = value
    return mapping


# A JSON list is parsed whole (Python holds several times its size while it does); JSON lines are read
# a line at a time and have no such cap. BIRD's train.json is under 10 MB.
MAX_QUESTION_LIST_BYTES = 256 * 1024 * 1024


def open_input(path: str | os.PathLike, what: str = "question file") -> IO[bytes]:
    """A file the user named, opened for reading in binary: DataError (naming the real cause) when it is
    missing, a directory, or not a regular file (a FIFO or a device, which would block or never end: it
    is opened non-blocking, only to be refused by its fstat)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise DataError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise DataError(f"{what} {path} is a directory; pass the file") from None
    except OSError as e:
        raise DataError(f"cannot read the {what} {path}: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise DataError(f"{what} {path} is {file_kind(mode)}, not a regular file; pass a file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _not_an_object(value: Any) -> str:
    kind = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}.get(type(value), "a number")
    return f"expected a JSON object, got {kind}"


def _first_byte(f: IO[bytes]) -> bytes:
    """The first byte that is not JSON whitespace (b"" for none), read a chunk at a time."""
    while True:
        chunk = f.read(1 << 16)
        if not chunk:
            return b""
        stripped = chunk.lstrip(b" \t\r\n")
        if stripped:
            return stripped[:1]


def load_questions(path: str | os.PathLike) -> tuple[list[tuple[int, dict]], list[Problem]]:
    """Read a JSON array or JSON lines file -> [(row number, object)], problems for skipped lines.

    Through t2sql.jsonl: a line (or an item of the array) that is not a JSON object, nests too deep,
    holds NaN/Infinity/1e999 or is longer than jsonl.MAX_LINE_BYTES is one `bad_line` problem; the
    others are read. A JSON array over MAX_QUESTION_LIST_BYTES, or one that is not JSON as a whole, is a
    DataError (it cannot be read in parts)."""
    path = Path(path)
    with open_input(path) as f:
        is_array = _first_byte(f) == b"["
        f.seek(0)
        if is_array:
            return _load_array(path, f)
        rows, problems = [], []
        for line in jsonl.json_lines(f):
            if line.problem:
                problems.append(Problem("bad_line", line.number, "", line.problem))
            elif not isinstance(line.value, dict):
                problems.append(Problem("bad_line", line.number, "", _not_an_object(line.value)))
            else:
                rows.append((line.number, line.value))
    return rows, problems


def _load_array(path: Path, f: IO[bytes]) -> tuple[list[tuple[int, dict]], list[Problem]]:
    size = os.fstat(f.fileno()).st_size
    if size > MAX_QUESTION_LIST_BYTES:
        raise DataError(f"{path} is a JSON list of {size:,} bytes, above the {MAX_QUESTION_LIST_BYTES:,} read "
                        "whole; write it as JSON lines (one object per line), which are read a line at a time")
    raw = f.read(MAX_QUESTION_LIST_BYTES + 1)
    if len(raw) > MAX_QUESTION_LIST_BYTES:  # it grew since the stat
        raise DataError(f"{path} is a JSON list over {MAX_QUESTION_LIST_BYTES:,} bytes; write it as JSON lines")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 (byte {e.start}); save the file as UTF-8") from None
    del raw
    try:
        items = jsonl.load_array(text)
    except jsonl.JsonProblem as e:
        raise DataError(f"{path}: {e}") from None
    rows, problems = [], []
    for item in items:
        if item.problem:
            problems.append(Problem("bad_line", item.number, "", item.problem))
        elif not isinstance(item.value, dict):
            problems.append(Problem("bad_line", item.number, "", _not_an_object(item.value)))
        else:
            rows.append((item.number, item.value))
    return rows, problems


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def normalize_rows(
    raw: list[tuple[int, dict]], fields: dict[str, str], split: str, db_root: str | os.PathLike,
    method_fallback: str | None = None,
) -> tuple[list[tuple[int, Task]], list[Problem]]:
    """Source objects of a question file (`fields`: canonical name -> the source's key) -> tasks on
    `db_root`, their text trimmed and their original_* fields kept; structural problems (missing
    fields, ids, an unreadable grading_method unless `method_fallback` names the method to use
    instead). Emptiness and the databases are validate_rows' to check."""
    problems: list[Problem] = []
    qid_key = fields["question_id"]
    synthesize_ids = not any(qid_key in obj for _, obj in raw)  # BIRD's train.json carries no question_id
    out = []
    for row, obj in raw:
        text = {name: _text(obj.get(src)).strip() for name, src in fields.items()}
        if synthesize_ids:
            text["question_id"] = f"{split}-{row}"
        missing = [fields[f] for f in REQUIRED_FIELDS if fields[f] not in obj]
        if not synthesize_ids and qid_key not in obj:
            missing.insert(0, qid_key)
        if missing:
            problems.append(
                Problem("missing_field", row, text["question_id"], f"missing field(s) {', '.join(missing)}")
            )
            continue
        try:
            method, given = read_method(text["grading_method"], text["question_id"], method_fallback)
        except TaskError as e:
            problems.append(Problem("bad_grading_method", row, text["question_id"], str(e)))
            continue
        try:
            db_path = str(database_path(db_root, text["db_id"]))
        except UnknownDatabase as e:
            problems.append(Problem("bad_db_id", row, text["question_id"], str(e)))
            continue
        out.append((row, Task(
            question_id=text["question_id"],
            db_id=text["db_id"],
            db_path=db_path,
            question=text["question"],
            evidence=text["evidence"],
            gold_sql=text["gold_sql"],
            difficulty=text["difficulty"],
            grading_method=method,
            grading_method_given=given,
            originals={k: v for k, v in obj.items() if k.startswith("original_")},
        )))
    return out, problems


def validate_rows(rows: list[tuple[int, Task]], *, databases: bool = True
                  ) -> tuple[list[tuple[int, Task]], list[Problem]]:
    """Checks that need no SQL: duplicates, empty text, and (unless `databases` is off: the checks of
    question files before their databases are there) database files present (find_database's rule)
    and opening as SQLite."""
    problems: list[Problem] = []
    seen: dict[str, int] = {}
    db_ok: dict[str, str | None] = {}  # db_id -> None if usable, else the reason
    valid = []
    for row, task in rows:
        qid = task.question_id
        bad = []
        if qid in seen:
            bad.append(Problem("duplicate_id", row, qid, f"question_id already used by row {seen[qid]}"))
        else:
            seen[qid] = row
        if not task.gold_sql:
            bad.append(Problem("empty_gold", row, qid, "the gold SQL is empty"))
        if not task.question:
            bad.append(Problem("empty_question", row, qid, "the question is empty"))
        db_id = task.db_id
        if databases and db_id not in db_ok:
            try:
                path = existing_database(task)
                Database(path)
                db_ok[db_id] = None
            except UnknownDatabase as e:
                db_ok[db_id] = str(e)
            except DatabaseError as e:
                db_ok[db_id] = f"database unreadable: {task.db_path}: {e}"
        if databases and db_ok[db_id] is not None:
            bad.append(Problem("missing_database", row, qid, db_ok[db_id]))
        if bad:
            problems.extend(bad)
        else:
            valid.append((row, task))
    return valid, problems
