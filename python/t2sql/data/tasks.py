"""The one reader of BIRD-layout task files: where a task's database lives, the question file's
rows, their fields normalized and validated (bad rows reported by number)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from t2sql.errors import DataError

# Canonical field -> the key in BIRD's question files.
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


def sample_dir() -> Path:
    """The embedded BIRD sample (superhero + its 129 dev questions), also inside an installed wheel."""
    try:
        from importlib.resources import files

        return Path(str(files("t2sql") / "sample"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd loaders
        return Path(__file__).resolve().parent.parent / "sample"


def sample_questions() -> Path:
    return sample_dir() / "dev.json"


def release_dir() -> Path:
    """The recipe's task files, shipped in the package (BIRD-Verified train and validation, Arcwise-Plat-SQL;
    CC BY-SA 4.0, NOTICE.md beside them). Their databases are not shipped."""
    return sample_dir().parent / "release"


@dataclass(frozen=True)
class Problem:
    """One reason a row cannot be converted. `row` counts from 1 (JSON array index + 1, or line)."""

    kind: str  # missing_database | duplicate_id | empty_gold | empty_question | missing_field | gold_error | bad_line
    row: int
    question_id: str
    message: str

    def __str__(self) -> str:
        qid = f" (question_id {self.question_id})" if self.question_id else ""
        return f"row {self.row}{qid}: {self.kind}: {self.message}"


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


def database_path(db_root: str | os.PathLike, db_id: str) -> Path:
    """BIRD's layout: <root>/<db_id>/<db_id>.sqlite."""
    return Path(db_root) / db_id / f"{db_id}.sqlite"


def row_db_root(row: dict, db_root: str | os.PathLike | None, data: str | os.PathLike) -> str | os.PathLike | None:
    """Where a row's database is looked up: `db_root` when given; else a BIRD row's sits beside
    its question file (BIRD's layout) and a converted row (it has metadata) keeps its db_path."""
    if db_root is None and not isinstance(row.get("metadata"), dict):
        return Path(data).parent
    return db_root


def load_questions(path: str | os.PathLike) -> tuple[list[tuple[int, dict]], list[Problem]]:
    """Read a JSON array or JSON lines file -> [(row number, object)], problems for skipped lines."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"question file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise DataError(f"{path}:{line}: not UTF-8 (byte {e.start}); save the file as UTF-8") from None
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} is not valid JSON (line {e.lineno}, column {e.colno}): {e.msg}") from None
        rows, problems = [], []
        for i, item in enumerate(items, start=1):
            if isinstance(item, dict):
                rows.append((i, item))
            else:
                problems.append(Problem("bad_line", i, "", f"expected an object, got {type(item).__name__}"))
        return rows, problems
    rows, problems = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(Problem("bad_line", lineno, "", f"not valid JSON ({e.msg})"))
            continue
        if not isinstance(item, dict):
            problems.append(Problem("bad_line", lineno, "", "expected a JSON object"))
            continue
        rows.append((lineno, item))
    return rows, problems


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def normalize_rows(
    raw: list[tuple[int, dict]], fields: dict[str, str], split: str, method_fallback: str | None = None
) -> tuple[list[tuple[int, dict[str, Any]]], list[Problem]]:
    """Source objects -> canonical dicts (str fields, plus "originals": the source's original_*
    fields, kept as they are); structural problems (missing fields, ids, an unreadable
    grading_method unless `method_fallback` names the method to use instead)."""
    from t2sql.errors import TaskError
    from t2sql.grading import task_method

    problems: list[Problem] = []
    qid_key = fields["question_id"]
    has_ids = [qid_key in obj for _, obj in raw]
    synthesize_ids = not any(has_ids)  # BIRD's train.json carries no question_id at all
    out = []
    for row, obj in raw:
        task = {name: _text(obj.get(src)).strip() for name, src in fields.items()}
        # Keep the gold text exactly as given (only trimmed); question ids as strings.
        if synthesize_ids:
            task["question_id"] = f"{split}-{row}"
        missing = [fields[f] for f in REQUIRED_FIELDS if fields[f] not in obj]
        if not synthesize_ids and qid_key not in obj:
            missing.insert(0, qid_key)
        if missing:
            problems.append(
                Problem("missing_field", row, task["question_id"], f"missing field(s) {', '.join(missing)}")
            )
            continue
        if task["grading_method"]:
            given = task["grading_method"]
            try:
                task["grading_method"], replaced = task_method(given, task["question_id"], method_fallback)
            except TaskError as e:
                problems.append(Problem("bad_grading_method", row, task["question_id"], str(e)))
                continue
            if replaced:
                task["grading_method_given"] = given  # kept in the row's metadata, reported by convert
        task["originals"] = {k: v for k, v in obj.items() if k.startswith("original_")}
        out.append((row, task))
    return out, problems


def validate_rows(
    rows: list[tuple[int, dict[str, str]]], db_root: Path
) -> tuple[list[tuple[int, dict[str, str]]], list[Problem]]:
    """Checks that need no SQL: duplicates, empty text, database files present."""
    from t2sql import Database, DatabaseError

    problems: list[Problem] = []
    seen: dict[str, int] = {}
    db_ok: dict[str, str | None] = {}  # db_id -> None if usable, else the reason
    valid = []
    for row, task in rows:
        qid = task["question_id"]
        bad = []
        if qid in seen:
            bad.append(Problem("duplicate_id", row, qid, f"question_id already used by row {seen[qid]}"))
        else:
            seen[qid] = row
        if not task["gold_sql"]:
            bad.append(Problem("empty_gold", row, qid, "the gold SQL is empty"))
        if not task["question"]:
            bad.append(Problem("empty_question", row, qid, "the question is empty"))
        db_id = task["db_id"]
        if db_id not in db_ok:
            path = database_path(db_root, db_id)
            if not db_id:
                db_ok[db_id] = "db_id is empty"
            elif not path.is_file():
                db_ok[db_id] = f"database not found: {path} (expected <db-root>/<db_id>/<db_id>.sqlite)"
            else:
                try:
                    Database(str(path))
                    db_ok[db_id] = None
                except DatabaseError as e:
                    db_ok[db_id] = f"database unreadable: {path}: {e}"
        if db_ok[db_id] is not None:
            bad.append(Problem("missing_database", row, qid, db_ok[db_id]))
        if bad:
            problems.extend(bad)
        else:
            valid.append((row, task))
    return valid, problems
