"""`t2sql convert`: a BIRD-layout question file + databases -> miles jsonl.

Input (BIRD's own layout, so any BIRD tool reads it):
    QUESTIONS   a JSON array (or JSON lines) of objects with question_id, db_id, question,
                evidence, SQL, difficulty (names remappable with --field-map)
    DB_ROOT     <DB_ROOT>/<db_id>/<db_id>.sqlite

Output: one jsonl row per task, the fixed row format every part of t2sql reads
(`t2sql.episode.machine.Task.from_row`, the eval, the miles adapter):

    {
      "prompt":   [{"role": "system", ...}, {"role": "user", ...}],   # t2sql.episode.prompt.build_prompt
      "label":    {"gold_sql": str, "db_id": str, "question_id": str},
      "metadata": {"question_id": str, "db_id": str, "db_path": str,   # absolute, at conversion
                   "question": str, "evidence": str, "difficulty": str, "split": str,
                   "recipe": str},                                     # the preset the prompt was built for
      "tools":    [OpenAI function spec of execute_sql_query]         # t2sql.episode.prompt.tool_specs()
    }

miles reads it with `--input-key prompt --label-key label --metadata-key metadata --tool-key tools`
and *without* `--apply-chat-template`: the adapter needs the messages and renders them itself on
every turn. `question_id` is always a string (BIRD's are ints; BIRD's train.json has none, then the
id is `<split>-<row number>`). `db_path` is where the database was when the row was written; a
reader given a database root (`--text-to-sql-db-root`) resolves `<root>/<db_id>/<db_id>.sqlite`
instead, so a converted split survives moving the databases.

The recipe's data release (2,033 train / 398 validation / 498 arcwise tasks) is a directory:
    <release>/<split>.json (or .jsonl)          questions in BIRD's fields
    <release>/<split>_databases/<db_id>/...     that split's databases, if the split has its own
                                                (BIRD itself ships train_databases/, dev_databases/)
    <release>/databases/<db_id>/...             otherwise, the databases every split shares
`release_splits(release_dir)` finds these; `t2sql-train prepare` converts every split found.

Validation runs before anything is written: a missing or unreadable database, a duplicate
question_id, an empty question or gold query, and a gold query that fails to run (executed on the
grading core, the same read-only path grading uses) are each reported naming the row. Any problem
fails the conversion and writes nothing (unless --drop-invalid, which writes the valid rows and lists
the dropped ones). So does a line of a jsonl question file that is not a JSON object (reported by
its line number) and a file that is not UTF-8. Files are written to a temporary name and renamed,
so a reader never sees half a file.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable
from t2sql.atomic import atomic_write
from t2sql.progress import Progress

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

# The recipe's data release: split name -> task count (for the summary's sanity check).
RELEASE_SPLITS: dict[str, int] = {"train": 2033, "validation": 398, "arcwise": 498}
# The names the public task files go by (ReViSQL / BIRD-Platinum), and the BIRD database folder
# each split runs on (train and validation on BIRD's train databases, arcwise on its dev ones).
RELEASE_FILE_NAMES: dict[str, tuple[str, ...]] = {
    "train": ("bird-verified-train",),
    "validation": ("bird-verified-val",),
    "arcwise": ("arcwise_plat_sql",),
}
RELEASE_DB_DIRS: dict[str, str] = {"train": "train_databases", "validation": "train_databases",
                                   "arcwise": "dev_databases"}

DEFAULT_RECIPE = "qwen3.6-35b-a3b"
DEFAULT_GOLD_TIMEOUT_S = 60.0


class DataError(ValueError):
    """The question file or databases cannot be converted; `problems` lists every reason."""

    def __init__(self, message: str, problems: list[Problem] | None = None):
        self.problems = list(problems or [])
        kinds = Counter(p.kind for p in self.problems)
        lines = [message]
        if len(kinds) > 1:
            lines.append("  by kind: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
        # The rarer kinds first, so 2 odd rows are not buried under 2,000 missing databases.
        shown = sorted(self.problems, key=lambda p: (kinds[p.kind], p.row))
        lines += [f"  {p}" for p in shown[:50]]
        if len(self.problems) > 50:
            lines.append(f"  ... and {len(self.problems) - 50} more")
        super().__init__("\n".join(lines))


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


@dataclass
class SplitReport:
    split: str
    questions: Path
    out_path: Path | None
    rows_in: int = 0
    rows_written: int = 0
    databases: int = 0
    gold_checked: int = 0
    gold_seconds: float = 0.0
    slowest_gold: tuple[float, str] | None = None  # (seconds, question_id)
    problems: list[Problem] = field(default_factory=list)
    dropped: int = 0
    methods: dict[str, int] = field(default_factory=dict)  # grading_method -> rows ("" = none: the preset's)

    def to_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "questions": str(self.questions),
            "out_path": str(self.out_path) if self.out_path else None,
            "rows_in": self.rows_in,
            "rows_written": self.rows_written,
            "databases": self.databases,
            "gold_checked": self.gold_checked,
            "gold_seconds": round(self.gold_seconds, 3),
            "slowest_gold": (
                {"seconds": round(self.slowest_gold[0], 3), "question_id": self.slowest_gold[1]}
                if self.slowest_gold
                else None
            ),
            "dropped": self.dropped,
            "methods": dict(self.methods),
            "problems": [p.__dict__ for p in self.problems],
        }


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
    from t2sql.episode.machine import TaskError, task_method

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
            try:
                task["grading_method"] = task_method(task["grading_method"], task["question_id"], method_fallback)
            except TaskError as e:
                problems.append(Problem("bad_grading_method", row, task["question_id"], str(e)))
                continue
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


def check_gold(
    rows: list[tuple[int, dict[str, str]]],
    db_root: Path,
    *,
    timeout_s: float = DEFAULT_GOLD_TIMEOUT_S,
    concurrency: int | None = None,
    progress_label: str = "gold",
) -> tuple[list[Problem], list[float]]:
    """Execute every gold query on the read-only grading path; problems for those that fail.

    One Database per (thread, file): a Database must not be shared by threads at once.
    Returns (problems, seconds per row in input order).
    """
    from t2sql import Database, T2sqlError

    local = threading.local()

    def run_one(task: dict[str, str]) -> tuple[str | None, float]:
        cache = getattr(local, "dbs", None)
        if cache is None:
            cache = local.dbs = {}
        path = str(database_path(db_root, task["db_id"]))
        start = time.perf_counter()
        try:
            db = cache.get(path)
            if db is None:
                db = cache[path] = Database(path)
            db.digest(task["gold_sql"], "multiset", 12, timeout_s)
            return None, time.perf_counter() - start
        except T2sqlError as e:
            return f"{type(e).__name__}: {e}", time.perf_counter() - start

    workers = concurrency or min(4, os.cpu_count() or 1)
    problems: list[Problem] = []
    seconds: list[float] = []
    with ThreadPoolExecutor(max_workers=workers) as pool, Progress(len(rows), progress_label) as bar:
        for (row, task), (error, elapsed) in zip(rows, pool.map(run_one, (t for _, t in rows))):
            seconds.append(elapsed)
            bar.advance()
            if error is not None:
                problems.append(
                    Problem("gold_error", row, task["question_id"], f"gold SQL fails on {task['db_id']}: {error}")
                )
    return problems, seconds


def build_rows(
    tasks: list[tuple[int, dict[str, str]]], db_root: Path, *, split: str, recipe: str
) -> list[dict[str, Any]]:
    """Canonical tasks -> miles rows, with the prompt the episode itself would build."""
    from t2sql import Database
    from t2sql.episode.machine import Task
    from t2sql.episode.prompt import build_prompt, tool_specs
    from t2sql.episode.reward import get_preset

    preset = get_preset(recipe)
    tools = tool_specs()
    dbs: dict[str, Any] = {}
    out = []
    for _, t in tasks:
        path = database_path(db_root, t["db_id"]).resolve()
        task = Task(
            question_id=t["question_id"],
            db_id=t["db_id"],
            db_path=str(path),
            question=t["question"],
            evidence=t["evidence"],
            gold_sql=t["gold_sql"],
            difficulty=t["difficulty"],
            grading_method=t.get("grading_method") or None,
        )
        db = dbs.get(t["db_id"])
        if db is None:
            db = dbs[t["db_id"]] = Database(str(path))
        out.append(
            {
                "prompt": build_prompt(task, preset, db),
                "label": {"gold_sql": task.gold_sql, "db_id": task.db_id, "question_id": task.question_id,
                          **({"grading_method": task.grading_method} if task.grading_method else {})},
                "metadata": {
                    "question_id": task.question_id,
                    "db_id": task.db_id,
                    "db_path": task.db_path,
                    "question": task.question,
                    "evidence": task.evidence,
                    "difficulty": task.difficulty,
                    **({"grading_method": task.grading_method} if task.grading_method else {}),
                    "split": split,
                    "recipe": recipe,
                    **t.get("originals", {}),
                },
                "tools": tools,
            }
        )
    return out


def write_jsonl_atomic(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write rows to a temporary file beside `path`, then rename: all or nothing."""
    count = 0
    with atomic_write(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False))
            f.write("\n")
            count += 1
    return count


def convert_split(
    questions: str | os.PathLike,
    db_root: str | os.PathLike,
    out_path: str | os.PathLike | None,
    *,
    split: str,
    fields: dict[str, str] | None = None,
    recipe: str = DEFAULT_RECIPE,
    check_gold_sql: bool = True,
    gold_timeout_s: float = DEFAULT_GOLD_TIMEOUT_S,
    concurrency: int | None = None,
    drop_invalid: bool = False,
    method_fallback: str | None = None,
) -> tuple[SplitReport, list[dict[str, Any]]]:
    """Validate one split and build its rows; write them to `out_path` unless it is None.

    Raises DataError (nothing written) when any row has a problem and drop_invalid is off.
    """
    from t2sql.grading import method_counts

    db_root = Path(db_root)
    if not db_root.is_dir():
        raise DataError(f"database root not found: {db_root} (expected <db-root>/<db_id>/<db_id>.sqlite)")
    report = SplitReport(split=split, questions=Path(questions), out_path=Path(out_path) if out_path else None)
    raw, problems = load_questions(questions)
    report.rows_in = len(raw) + len(problems)
    if not raw:
        raise DataError(f"{questions}: no questions found", problems)
    rows, structural = normalize_rows(raw, fields or BIRD_FIELDS, split, method_fallback)
    problems += structural
    rows, invalid = validate_rows(rows, db_root)
    problems += invalid
    report.databases = len({t["db_id"] for _, t in rows})
    if check_gold_sql and rows:
        started = time.perf_counter()
        gold_problems, seconds = check_gold(
            rows, db_root, timeout_s=gold_timeout_s, concurrency=concurrency, progress_label=f"{split}: gold"
        )
        report.gold_seconds = time.perf_counter() - started
        report.gold_checked = len(rows)
        slow = max(zip(seconds, (t["question_id"] for _, t in rows)), default=None)
        report.slowest_gold = slow
        failed = {p.row for p in gold_problems}
        rows = [(r, t) for r, t in rows if r not in failed]
        problems += gold_problems
    # Every problem, a malformed line included, fails the conversion: nothing is written.
    problems.sort(key=lambda p: p.row)
    report.problems = problems
    blocking = list(problems)
    if blocking and not drop_invalid:
        raise DataError(
            f"{questions}: {len(blocking)} problem(s); nothing written "
            "(fix them, or pass --drop-invalid to write only the valid rows)",
            blocking,
        )
    report.dropped = len({p.row for p in problems})
    report.methods = method_counts(t.get("grading_method") or "(preset's)" for _, t in rows)
    built = build_rows(rows, db_root, split=split, recipe=recipe)
    if out_path is not None:
        report.rows_written = write_jsonl_atomic(out_path, built)
    else:
        report.rows_written = len(built)
    return report, built


def release_splits(
    release_dir: str | os.PathLike, names: Iterable[str] = tuple(RELEASE_SPLITS)
) -> list[tuple[str, Path, Path]]:
    """(split, question file, database root) for each named split of a release directory.

    Only the named splits are read (a BIRD folder also holds dev_tables.json and the like);
    a named split that is not there is an error listing what the directory has.
    """
    root = Path(release_dir)
    if not root.is_dir():
        raise DataError(f"data release not found: {root}")
    found, missing = [], []
    for split in names:
        stems = (split, *RELEASE_FILE_NAMES.get(split, ()))
        questions = next(
            (root / f"{stem}{ext}" for stem in stems for ext in (".json", ".jsonl")
             if (root / f"{stem}{ext}").is_file()), None
        )
        if questions is None:
            missing.append(split)
            continue
        candidates = [root / f"{split}_databases"]
        if split in RELEASE_DB_DIRS:
            candidates.append(root / RELEASE_DB_DIRS[split])
        db_root = next((c for c in candidates if c.is_dir()), root / "databases")
        found.append((split, questions, db_root))
    if missing:
        present = sorted(p.name for p in root.iterdir() if p.suffix in (".json", ".jsonl"))
        raise DataError(
            f"{root}: no question file for split(s) {', '.join(missing)} (expected <split>.json or "
            f"<split>.jsonl, or the recipe's bird-verified-train/-val.json and arcwise_plat_sql.json, beside "
            f"databases/, <split>_databases/ or BIRD's train_databases/ and dev_databases/); the directory has: "
            f"{', '.join(present) or 'no .json/.jsonl files'}"
        )
    return found


def summary_table(reports: list[SplitReport]) -> str:
    header = ("split", "rows in", "written", "dbs", "problems", "gold s", "slowest gold")
    lines = [header]
    for r in reports:
        slow = f"{r.slowest_gold[0]:.2f}s ({r.slowest_gold[1]})" if r.slowest_gold else "-"
        lines.append(
            (r.split, str(r.rows_in), str(r.rows_written), str(r.databases), str(len(r.problems)),
             f"{r.gold_seconds:.1f}" if r.gold_checked else "-", slow)
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from t2sql.grading import method_arg

    parser.add_argument("--questions", required=True, help="BIRD-layout question file (.json array or .jsonl)")
    parser.add_argument("--db-root", required=True, help="directory holding <db_id>/<db_id>.sqlite")
    parser.add_argument("--out-dir", required=True, help="where <split-name>.jsonl is written")
    parser.add_argument("--split-name", default=None, help="output name and split label (default: the file's stem)")
    parser.add_argument(
        "--field-map", nargs="*", default=[], metavar="FIELD=KEY",
        help=f"source keys for the canonical fields {', '.join(BIRD_FIELDS)} (default BIRD's: gold_sql=SQL)",
    )
    parser.add_argument("--recipe", default=DEFAULT_RECIPE, help="preset the prompt is built for")
    parser.add_argument("--no-check-gold", action="store_true", help="skip executing every gold query")
    parser.add_argument("--gold-timeout", type=float, default=DEFAULT_GOLD_TIMEOUT_S, help="seconds per gold query")
    parser.add_argument("--concurrency", type=int, default=None, help="threads running gold queries")
    parser.add_argument("--drop-invalid", action="store_true", help="write the valid rows, report the dropped ones")
    parser.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                        help="the method for rows whose grading_method cannot be read (a bare 'subset'); "
                             "without it such a row fails the conversion")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    from t2sql.grading import describe_methods

    split = args.split_name or Path(args.questions).stem
    try:
        fields = parse_field_map(args.field_map)
        report, _ = convert_split(
            args.questions, args.db_root, Path(args.out_dir) / f"{split}.jsonl",
            split=split, fields=fields, recipe=args.recipe, check_gold_sql=not args.no_check_gold,
            gold_timeout_s=args.gold_timeout, concurrency=args.concurrency, drop_invalid=args.drop_invalid,
            method_fallback=args.grading_method_fallback,
        )
    except DataError as e:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(e).splitlines()[0], "problems": [p.__dict__ for p in e.problems]}))
        else:
            print(f"t2sql convert: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for p in report.problems:
            print(f"skipped: {p}", file=sys.stderr)
        print(summary_table([report]))
        print("grading methods: " + describe_methods(report.methods))
        print(f"wrote {report.out_path}")
    return 0
