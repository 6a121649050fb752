"""`t2sql gold`: run every gold query of a split before training: it validates the data, fills the gold cache,
records the database manifest, mines the equivalence check's invariants and finds the slow golds.
docs/grader.md, "Precompute every gold before training: `t2sql gold`"."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from t2sql import jsonl
from t2sql._grader import METHODS, GradeSpec
from t2sql.arguments import (
    add_grade_memory_arguments,
    add_temp_disk_argument,
    grade_memory_from_args,
    method_arg,
    seconds_arg,
)
from t2sql.atomic import OutputFile, output_folder
from t2sql.databases import find_database, recorded_database_path
from t2sql.episode.presets import DEFAULT_PRESET, Preset, get_preset
from t2sql.equivalence.mine_ahead import mine_ahead
from t2sql.errors import MAX_LISTED, DataError, TaskError, UnknownDatabase, cap_lines
from t2sql.grading import fallback_note, method_counts
from t2sql.progress import Progress
from t2sql.serving.golds import GoldRecord, GoldTask, run_golds
from t2sql.serving.grader import Grader
from t2sql.serving.manifest import Manifest, manifest_output
from t2sql.tasks import Task, load_questions, read_method, row_db_root, row_fields


def extract_task(row: int, obj: dict[str, Any], db_root: str | os.PathLike | None,
                 method_fallback: str | None = None) -> GoldTask:
    """A BIRD question or a converted miles row -> the gold to run. Only what a gold needs is
    required of the row (question_id, when absent, is "row-N")."""
    fields = row_fields(obj)
    gold_sql = fields["gold_sql"] or ""
    db_id = str(fields.get("db_id") or "")
    qid = fields.get("question_id")
    question_id = str(qid) if qid is not None else f"row-{row}"
    try:
        method, given = read_method(fields.get("grading_method"), question_id, method_fallback)
    except TaskError as e:
        return GoldTask(row, question_id, db_id, None, str(e), method_unreadable=True)
    note = fallback_note(given, question_id, method) if given is not None else None
    db_path, problem = _locate(db_id, gold_sql, fields.get("db_path"), db_root)
    if db_path is None:
        return GoldTask(row, question_id, db_id, None, problem, method, method_note=note)
    task = Task.from_fields(fields, question_id=question_id, db_path=db_path, method=method, given=given)
    return GoldTask(row, question_id, db_id, task, method=method, method_note=note)


def _locate(db_id: str, gold_sql: str, recorded: Any, db_root: str | os.PathLike | None) -> tuple[str | None, str]:
    """(the database file, or None and why the row cannot run): t2sql.databases' one path rule, under db_root or
    at the row's recorded db_path."""
    if not gold_sql.strip():
        return None, "the row has no gold SQL (label.gold_sql or SQL)"
    if not db_id:
        return None, "the row has no db_id"
    try:
        if db_root is None:
            recorded = Path(recorded_database_path(recorded, db_id))
            db_root = recorded.parent.parent
        return find_database(db_root, db_id), ""
    except (UnknownDatabase, TaskError) as e:
        return None, str(e)


def load_tasks(data: str | os.PathLike, db_root: str | None,
               method_fallback: str | None = None) -> tuple[list[GoldTask], list[GoldRecord]]:
    """Every readable row's gold, plus a failure record for each unreadable line. Without db_root,
    BIRD rows find their databases beside the question file (BIRD's layout, as `t2sql eval` does)
    and converted rows use the db_path recorded at conversion."""
    raw, problems = load_questions(data)
    bad = [GoldRecord("", "", p.row, None, None, None, "skipped", f"line {p.row}: {p.message}")
           for p in problems]
    return [extract_task(row, obj, row_db_root(obj, db_root, data), method_fallback) for row, obj in raw], bad


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", required=True, help="split: BIRD question json/jsonl or converted miles jsonl")
    parser.add_argument("--db-root", help="databases as <root>/<db_id>/<db_id>.sqlite (default: BIRD rows "
                        "beside --data, converted rows their metadata.db_path)")
    parser.add_argument("--concurrency", type=int, default=None, metavar="N",
                        help="SQL workers (default: all cores)")
    parser.add_argument("--cache-dir", help="gold cache directory to fill (and the manifest's home)")
    parser.add_argument("--manifest", help="database manifest to write (default: CACHE_DIR/manifest.json)")
    parser.add_argument("--report", help="write the per-query report (JSON) here")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing --report or --manifest file even when it is not t2sql's own")
    parser.add_argument("--allow-failures", action="store_true", help="exit 0 even if some golds fail")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    parser.add_argument("--preset", default=None,
                        help="preset whose method/float_digits/grade timeout to use (default: the "
                             "recipe's default preset)")
    parser.add_argument("--method", type=method_arg, default=None,
                        metavar="|".join(METHODS),
                        help="one method for every task (default: each task's grading_method when "
                             "the preset honors task methods, else the preset's)")
    parser.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                        help="the method for tasks whose grading_method cannot be read (e.g. 'subset,<,3'); "
                             "without it such a task is reported as a failure")
    parser.add_argument("--float-digits", type=int, default=None)
    parser.add_argument("--timeout-s", type=seconds_arg, default=None, metavar="S",
                        help="seconds per gold query (default: the preset's grade timeout)")
    parser.add_argument("--backend", choices=["thread", "process"], default="thread")
    add_grade_memory_arguments(parser)
    add_temp_disk_argument(parser, from_preset=True)


@dataclass(frozen=True)
class _Grading:
    """How this run grades: the preset's grading spec of each task, with the flags' overrides."""

    preset: Preset
    every_task_method: str | None  # --method: one method for every task
    float_digits: int | None
    timeout_s: float
    max_temp_mb: int

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Grading:
        preset = get_preset(args.preset or DEFAULT_PRESET)
        grading = preset.grading
        return cls(preset, args.method, args.float_digits if args.float_digits is not None else grading.float_digits,
                   args.timeout_s if args.timeout_s is not None else grading.timeout_s,
                   args.max_temp_mb if args.max_temp_mb is not None else grading.max_temp_mb)

    def method(self, task_method: str | None) -> str:
        return self.every_task_method or self.preset.method_for(task_method)

    def spec(self, task: Task) -> GradeSpec:
        return GradeSpec(self.method(task.grading_method), gold_sql=task.gold_sql, float_digits=self.float_digits,
                         column_order=self.preset.grading.column_order, timeout_s=self.timeout_s,
                         max_temp_mb=self.max_temp_mb)


def run(args) -> int:
    if args.concurrency is not None and args.concurrency < 1:
        print("error: --concurrency must be at least 1", file=sys.stderr)
        return 2
    if args.db_root is not None and not os.path.isdir(args.db_root):
        print(f"error: --db-root {args.db_root} is not a directory", file=sys.stderr)
        return 2
    try:
        memory_mb, tmp_dir = grade_memory_from_args(args)
        grading = _Grading.of(args)
        tasks, bad_lines = load_tasks(args.data, args.db_root, args.grading_method_fallback)
    except (DataError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report_out, manifest_out = _outputs(args)  # refused now, before any gold runs
    for task in tasks:
        if task.method_note:
            print(f"note: {task.method_note}", file=sys.stderr)

    paths_by_id = {t.db_id: t.db_path for t in tasks if t.db_path is not None}
    manifest = _record_manifest(paths_by_id, manifest_out, args.cache_dir)

    started = time.perf_counter()
    with Progress(len(tasks), "gold") as bar:
        with Grader(concurrency=args.concurrency, cache_dir=args.cache_dir, grade_timeout_s=grading.timeout_s,
                    backend=args.backend, manifest=manifest, grade_memory_mb=memory_mb, tmp_dir=tmp_dir,
                    max_temp_mb=grading.max_temp_mb) as grader:
            records = asyncio.run(run_golds(tasks, grader, grading.spec, on_done=bar.advance))
            stats = grader.stats()
    # The equivalence check's invariants of every database, so that no check of training's waits for them.
    mined = mine_ahead(paths_by_id.values(), concurrency=args.concurrency or os.cpu_count() or 1)
    wall = time.perf_counter() - started
    records = bad_lines + records

    summary = _summary(records, wall, stats, grading.every_task_method or "task", grading.float_digits)
    summary["invariants"] = {"databases": mined.databases, "mined": mined.mined, "already_mined": mined.found,
                             "seconds": round(mined.elapsed_s, 2), "unsupported": mined.unsupported,
                             "unreadable": mined.failed}
    summary["methods"] = method_counts("unreadable" if t.method_unreadable else grading.method(t.method) for t in tasks)
    if report_out is not None:
        report = {"format": REPORT_FORMAT, "version": REPORT_VERSION, "summary": summary,
                  "queries": [asdict(r) for r in records]}
        report_out.write_bytes((json.dumps(report, indent=1) + "\n").encode())
    if args.json:
        print(jsonl.dumps(summary, indent=1))
    else:
        _print_human(summary, records)
    if summary["failed"] and not args.allow_failures:
        return 1
    return 0


REPORT_FORMAT = "t2sql-gold-report"  # the report's first key: what tells it from another file at --report
REPORT_VERSION = 1
# How a report begins as run() writes it (json.dumps, indent 1); before "format" it began with the summary.
_REPORT_HEAD = re.compile(rb'\{\s*("format":\s*"' + REPORT_FORMAT.encode() + rb'"|"summary":\s*\{\s*"queries":)')


def is_gold_report(head: bytes) -> bool:
    """Whether a file that begins with `head` is a report t2sql gold wrote."""
    return _REPORT_HEAD.match(head) is not None


def _outputs(args: argparse.Namespace) -> tuple[OutputFile | None, OutputFile | None]:
    """--report and the manifest (--manifest, or CACHE_DIR/manifest.json) under t2sql.atomic's rule, checked
    now (OutputPathError: exit 2). A --cache-dir that is not there yet is made when the manifest is written."""
    inputs = [("the --data file", args.data)]
    report = None
    if args.report:
        report = OutputFile(args.report, flag="--report", kind="a t2sql gold report", own=is_gold_report,
                            force=args.force, inputs=inputs)
        report.check()
    if args.cache_dir:
        output_folder(args.cache_dir, flag="--cache-dir", create=False)
    if not (args.manifest or args.cache_dir):
        return report, None
    path = args.manifest or os.path.join(args.cache_dir, "manifest.json")
    manifest = manifest_output(path, flag="--manifest", force=args.force, inputs=inputs,
                               instead="pass another --manifest" if args.manifest else
                               "pass --manifest FILE, or another --cache-dir")
    if args.manifest or os.path.isdir(args.cache_dir):
        manifest.check()
    return report, manifest


def _record_manifest(paths_by_id: dict[str, str], output: OutputFile | None,
                     cache_dir: str | None) -> Manifest | None:
    """Hash the databases this split uses and write the manifest (atomically).

    The manifest is written before any gold runs, so the gold cache's keys (which include
    each file's sha256) and the manifest always describe the same files."""
    if not paths_by_id:
        return None
    manifest = Manifest.record(paths_by_id)
    if output is not None:
        if cache_dir:
            output_folder(cache_dir, flag="--cache-dir")  # the manifest's default home; the gold cache's too
        manifest.save(output)
    return manifest


def _summary(records: list[GoldRecord], wall: float, stats: dict, method: str,
             float_digits: int | None) -> dict[str, Any]:
    ran = [r for r in records if r.seconds is not None and not r.failed]
    slowest = sorted(ran, key=lambda r: r.seconds, reverse=True)[:10]
    failures = [r for r in records if r.failed]
    return {
        "queries": len(records),
        "ok": len(records) - len(failures),
        "failed": len(failures),
        "computed": sum(r.source == "computed" for r in records),
        "from_cache": sum(r.source in ("disk", "memory") for r in records),
        "sqlite_seconds": round(sum(r.seconds for r in ran if r.source == "computed"), 4),
        "wall_seconds": round(wall, 4),
        "method": method,
        "float_digits": float_digits,
        "cache_corrupt": stats.get("cache_corrupt", 0),
        "cache_write_errors": stats.get("cache_write_errors", 0),
        "slowest": [{"question_id": r.question_id, "db_id": r.db_id, "seconds": round(r.seconds, 4),
                     "rows": r.rows} for r in slowest],
        "failures": [{"question_id": r.question_id, "db_id": r.db_id, "row": r.row, "error": r.error}
                     for r in failures],
    }


def _print_human(summary: dict[str, Any], records: list[GoldRecord]) -> None:
    print(f"{'golds':<22}{summary['queries']:>10}")
    for key in ("ok", "failed", "computed", "from_cache"):
        print(f"{key:<22}{summary[key]:>10}")
    for method, n in summary.get("methods", {}).items():
        print(f"{'  ' + method:<22}{n:>10}")
    print(f"{'sqlite seconds':<22}{summary['sqlite_seconds']:>10.3f}")
    print(f"{'wall seconds':<22}{summary['wall_seconds']:>10.3f}")
    inv = summary["invariants"]
    print(f"{'invariants mined':<22}{inv['mined']:>10} of {inv['databases']} databases ({inv['already_mined']} "
          f"already, {inv['seconds']:.1f}s)")
    for path, why in {**inv["unsupported"], **inv["unreadable"]}.items():
        print(f"  equivalence check skips {path}: {why}")
    if summary["cache_corrupt"] or summary["cache_write_errors"]:
        print(f"{'cache entries dropped':<22}{summary['cache_corrupt']:>10}")
        print(f"{'cache write errors':<22}{summary['cache_write_errors']:>10}")
    if summary["slowest"]:
        print("\nslowest golds (seconds of SQLite time, when they ran)")
        print(f"  {'question_id':<14}{'db_id':<24}{'seconds':>10}{'rows':>10}")
        for s in summary["slowest"]:
            print(f"  {s['question_id']:<14}{s['db_id']:<24}{s['seconds']:>10.4f}{s['rows']:>10}")
    if summary["failures"]:
        print(f"\nfailures ({summary['failed']}" + (", all of them in --json and --report)" if summary["failed"] >
                                                    MAX_LISTED else ")"))
        lines = [f"  {f['question_id'] or 'row ' + str(f['row'])} ({f['db_id'] or '?'}): {f['error']}"
                 for f in summary["failures"]]
        for line in cap_lines(lines, indent="  "):
            print(line)
