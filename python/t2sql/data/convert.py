"""`t2sql convert`: a BIRD-layout question file and its databases -> t2sql's rows (one JSON line per task), every
row validated before anything is written; `release_splits` finds the splits of a data release. The row format,
the checks and the output rule: docs/cli.md, "`t2sql convert`"; a release's layout:
docs/training.md, "Your own data: BIRD's layout"."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from t2sql import Database, jsonl
from t2sql._grader import GradeSpec
from t2sql.atomic import OutputFile, first_line
from t2sql.episode.presets import DEFAULT_PRESET, get_preset
from t2sql.episode.prompt import build_prompt, task_text_problem, tool_specs
from t2sql.errors import DataError, Problem
from t2sql.grading import fallback_note, method_counts
from t2sql.jsonl import loads_or_none
from t2sql.progress import Progress
from t2sql.serving.golds import GoldTask, run_golds
from t2sql.serving.grader import Grader
from t2sql.tasks import BIRD_FIELDS, Task, load_questions, normalize_rows, validate_rows

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

DEFAULT_GOLD_TIMEOUT_S = 60.0


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
    fallbacks: list[str] = field(default_factory=list)  # one note per task graded by --grading-method-fallback

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
            "fallbacks": list(self.fallbacks),
            "problems": [p._asdict() for p in self.problems],
        }


def check_gold(
    rows: list[tuple[int, Task]],
    *,
    timeout_s: float = DEFAULT_GOLD_TIMEOUT_S,
    concurrency: int | None = None,
    progress_label: str = "gold",
) -> tuple[list[Problem], list[float]]:
    """Run every gold query through a Grader (t2sql.serving.golds, as `t2sql gold` does); problems
    for those that fail. Returns (problems, SQLite seconds per row in input order)."""
    tasks = [GoldTask.of(row, task) for row, task in rows]
    spec = GradeSpec(timeout_s=timeout_s)  # does it run: any method will do, the default one

    async def run_all():
        async with Grader(concurrency=concurrency or min(4, os.cpu_count() or 1)) as grader:
            with Progress(len(tasks), progress_label) as bar:
                return await run_golds(tasks, grader, lambda task: spec, on_done=bar.advance)

    records = asyncio.run(run_all())
    problems = [Problem("gold_error", r.row, r.question_id, f"gold SQL fails on {r.db_id}: {r.error}")
                for r in records if r.failed]
    return problems, [r.seconds or 0.0 for r in records]


def build_rows(tasks: list[tuple[int, Task]], *, split: str, preset: str) -> list[dict[str, Any]]:
    """Tasks -> miles rows, with the prompt the episode itself would build. Each fact is stored once:
    the label holds what grading reads, the metadata the rest."""

    chosen = get_preset(preset)
    tools = tool_specs()
    dbs: dict[str, Any] = {}
    out = []
    for _, task in tasks:
        # Absolute, symlinks kept: the recorded path stays <dir>/<db_id>/<db_id>.sqlite (t2sql.databases' rule).
        task = dataclasses.replace(task, db_path=os.path.abspath(task.db_path))
        db = dbs.get(task.db_id)
        if db is None:
            db = dbs[task.db_id] = Database(task.db_path)
        out.append(
            {
                "prompt": build_prompt(task, chosen, db),
                "label": {"gold_sql": task.gold_sql,
                          **({"grading_method": task.grading_method} if task.grading_method else {})},
                "metadata": {
                    "question_id": task.question_id,
                    "db_id": task.db_id,
                    "db_path": task.db_path,
                    "question": task.question,
                    "evidence": task.evidence,
                    "difficulty": task.difficulty,
                    **({"grading_method_given": task.grading_method_given} if task.grading_method_given else {}),
                    "split": split,
                    "preset": preset,
                    **task.originals,
                },
                "tools": tools,
            }
        )
    return out


def is_converted(head: bytes) -> bool:
    """Whether a file that begins with `head` is a split t2sql converted: its first line a row of the
    format above (prompt, label, tools, and metadata naming the task, its split and its preset)."""
    row = loads_or_none(first_line(head))
    if not (isinstance(row, dict) and isinstance(row.get("prompt"), list) and isinstance(row.get("tools"), list)
            and isinstance(row.get("label"), dict) and isinstance(row.get("metadata"), dict)):
        return False
    return {"question_id", "db_id", "split", "preset"} <= row["metadata"].keys() and "gold_sql" in row["label"]


def converted_output(path: str | os.PathLike, *, flag: str = "output", force: bool = False,
                     inputs: Iterable[tuple[str, str | os.PathLike]] = (), instead: str | None = None) -> OutputFile:
    """A converted split's file under t2sql.atomic's rule: a converted split is replaced, any other file only
    with `force`, and never one of the run's `inputs`."""
    return OutputFile(path, flag=flag, kind="a split t2sql converted", own=is_converted, force=force, inputs=inputs,
                      instead=instead)


def write_jsonl_atomic(path: str | os.PathLike | OutputFile, rows: Iterable[dict]) -> int:
    """Write rows to a temporary file beside `path` (a converted split: `converted_output`), then rename:
    all or nothing."""
    output = path if isinstance(path, OutputFile) else converted_output(path)
    count = 0
    with output.open() as f:
        for row in rows:
            f.write(jsonl.dumps(row, ensure_ascii=False))
            f.write("\n")
            count += 1
    return count


def _read_tasks(questions: str | os.PathLike, db_root: Path, split: str, fields: dict[str, str] | None,
                preset: str, method_fallback: str | None, *, databases: bool
                ) -> tuple[int, list[tuple[int, Task]], list[Problem]]:
    """A question file's tasks on `db_root` that pass every check but their gold's (the databases' too unless
    `databases` is off): (rows in the file, tasks, problems)."""
    chosen = get_preset(preset)  # an unknown preset stops here, before any gold runs
    raw, problems = load_questions(questions)
    if not raw:
        raise DataError(f"{questions}: no questions found", problems)
    rows_in = len(raw) + len(problems)
    rows, structural = normalize_rows(raw, fields or BIRD_FIELDS, split, db_root, method_fallback)
    problems += structural
    too_long = {row: task_text_problem(task, chosen) for row, task in rows}
    problems += [Problem("too_long", row, task.question_id, too_long[row]) for row, task in rows if too_long[row]]
    rows = [(row, task) for row, task in rows if not too_long[row]]
    rows, invalid = validate_rows(rows, databases=databases)
    return rows_in, rows, problems + invalid


def check_questions(questions: str | os.PathLike, *, split: str, fields: dict[str, str] | None = None,
                    preset: str = DEFAULT_PRESET, method_fallback: str | None = None) -> list[Problem]:
    """Every check of `convert_split` that needs no database (the file's lines, fields, ids, grading
    methods, lengths): what `t2sql-train prepare` runs before it downloads the databases."""
    _, _, problems = _read_tasks(questions, Path("databases"), split, fields, preset, method_fallback,
                                 databases=False)
    return sorted(problems, key=lambda p: p.row)


def convert_split(
    questions: str | os.PathLike,
    db_root: str | os.PathLike,
    out_path: str | os.PathLike | None,
    *,
    split: str,
    fields: dict[str, str] | None = None,
    preset: str = DEFAULT_PRESET,
    check_gold_sql: bool = True,
    gold_timeout_s: float = DEFAULT_GOLD_TIMEOUT_S,
    concurrency: int | None = None,
    drop_invalid: bool = False,
    method_fallback: str | None = None,
) -> tuple[SplitReport, list[dict[str, Any]]]:
    """Validate one split and build its rows; write them to `out_path` unless it is None.

    Raises DataError (nothing written) when any row has a problem and drop_invalid is off.
    """

    db_root = Path(db_root)
    if not db_root.is_dir():
        raise DataError(f"database root not found: {db_root} (expected <db-root>/<db_id>/<db_id>.sqlite)")
    report = SplitReport(split=split, questions=Path(questions), out_path=Path(out_path) if out_path else None)
    report.rows_in, rows, problems = _read_tasks(questions, db_root, split, fields, preset, method_fallback,
                                                 databases=True)
    report.databases = len({t.db_id for _, t in rows})
    if check_gold_sql and rows:
        started = time.perf_counter()
        gold_problems, seconds = check_gold(
            rows, timeout_s=gold_timeout_s, concurrency=concurrency, progress_label=f"{split}: gold"
        )
        report.gold_seconds = time.perf_counter() - started
        report.gold_checked = len(rows)
        slow = max(zip(seconds, (t.question_id for _, t in rows)), default=None)
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
    report.methods = method_counts(t.grading_method or "(preset's)" for _, t in rows)
    report.fallbacks = [fallback_note(t.grading_method_given, t.question_id, t.grading_method)
                        for _, t in rows if t.grading_method_given]
    built = build_rows(rows, split=split, preset=preset)
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
