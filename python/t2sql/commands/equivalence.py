"""`t2sql equivalence`: check given pairs (`--pairs`), list a database's invariants (`--invariants --db FILE`), or
measure the check (`--measure`, on derived pairs or on labelled answers with `--answers`).
docs/recipe_extras.md, "Equivalence check" and docs/benchmarks.md; exit statuses: docs/cli.md, "Exit status"."""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from t2sql.arguments import workers_arg
from t2sql.atomic import OutputFile, first_line
from t2sql.commands.pairsfile import count_pairs, read_pairs
from t2sql.episode.presets import get_preset
from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.measure.answers import format_answers, measure_answers
from t2sql.equivalence.measure.run import format_measurement, measure
from t2sql.equivalence.mine_ahead import mine_ahead
from t2sql.equivalence.presupposed import describe as describe_lookups
from t2sql.equivalence.presupposed import lookups
from t2sql.equivalence.refutation import with_method
from t2sql.errors import EquivalenceError, OutputPathError, PresetError, T2sqlError, UnknownDatabase
from t2sql.interrupts import interrupt_word
from t2sql.jsonl import JsonProblem, dumps, load_file, loads_or_none
from t2sql.progress import Progress
from t2sql.tasks import database_path, find_database

EXIT_OK, EXIT_SOME, EXIT_TROUBLE = 0, 1, 2
MAX_QUESTIONS_BYTES = 256 * 1024 * 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "The equivalence check: --pairs checks given pairs, --invariants lists a database's invariants, "
        "--measure measures the check's two errors on BIRD-layout data.")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--pairs", metavar="FILE", help='JSONL, one {"id","db_id","pred","gold"} per line')
    mode.add_argument("--invariants", action="store_true", help="list the invariants of --db FILE")
    mode.add_argument("--measure", action="store_true", help="measure the check on --data with --db-root")
    parser.add_argument("--db", help="a SQLite file (with --invariants)")
    parser.add_argument("--db-root", help="databases at DIR/<db_id>/<db_id>.sqlite (with --pairs, --measure)")
    parser.add_argument("--out", help="JSONL output, one line per non-blank --pairs line, in order")
    parser.add_argument("--force", action="store_true", help="replace an --out file this command did not write")
    parser.add_argument("--data", help="BIRD questions (dev.json: question_id, db_id, SQL), with --measure")
    parser.add_argument("--answers", metavar="FILE",
                        help="labelled real answers (JSONL: id, db_id, gold, pred, label[, evidence, systems, "
                             "reason, lucky_kind]), with --measure")
    parser.add_argument("--preset", default=None, help="t2sql preset: suite size, seed, timeouts, method")
    parser.add_argument("--suite-size", type=int, default=None, help="override the preset's equivalence.suite_size")
    parser.add_argument("--seed", type=int, default=None, help="override the preset's equivalence.seed")
    parser.add_argument("--method", default=None,
                        help="how results are compared (default: the preset's; each --pairs line's "
                             "grading_method wins)")
    parser.add_argument("--db-id", action="append", default=[], metavar="DB_ID",
                        help="--measure: only these databases")
    parser.add_argument("--limit", type=int, default=None, help="--measure: only the first N questions")
    parser.add_argument("--half", choices=("even", "odd"), default=None,
                        help="--measure: only questions whose question_id is even (or odd): tune on one half, "
                             "report the other")
    parser.add_argument("--concurrency", type=workers_arg, default=2, metavar="N", help="checks at once (default 2)")
    parser.add_argument("--json", action="store_true", help="print the result (or the summary) as JSON")


def _fail(message: str) -> int:
    print(f"t2sql equivalence: {message}", file=sys.stderr)
    return EXIT_TROUBLE


def _config(args: argparse.Namespace, method: str | None = None) -> EquivalenceConfig:
    preset = get_preset(args.preset)
    changes = {}
    if args.suite_size is not None:
        changes["suite_size"] = args.suite_size
    if args.seed is not None:
        changes["seed"] = args.seed
    preset = preset.replace(equivalence=changes) if changes else preset
    config = EquivalenceConfig.from_preset(preset)
    method = method or args.method
    if method:
        config = EquivalenceConfig(config.suite_size, config.seed, config.budget_s, with_method(config.spec, method))
    return config


def run(args: argparse.Namespace) -> int:
    try:
        config = _config(args)
    except (PresetError, EquivalenceError, ValueError) as e:
        return _fail(str(e))
    if args.invariants:
        return _invariants(args)
    if args.pairs:
        return _check_pairs(args, config)
    return _measure(args, config)


# ---------------------------------------------------------------------------------- --invariants


def _invariants(args: argparse.Namespace) -> int:
    if not args.db:
        return _fail("--invariants needs --db FILE")
    if not Path(args.db).is_file():
        return _fail(f"--db {args.db} is not a file")
    try:
        inv = InvariantStore().get(str(Path(args.db)))
    except T2sqlError as e:
        return _fail(str(e))
    if args.json:
        print(json.dumps({**inv.to_dict(), "lookups": [dataclasses.asdict(lk) for lk in lookups(inv)]}, indent=1))
    else:
        print("\n".join(inv.describe() + describe_lookups(inv)))
    return EXIT_OK


# ---------------------------------------------------------------------------------- --pairs


def _check_pairs(args: argparse.Namespace, default: EquivalenceConfig) -> int:
    if not args.db_root or not args.out:
        return _fail("--pairs needs --db-root DIR and --out FILE.jsonl")
    pairs, out, root = Path(args.pairs), Path(args.out), Path(args.db_root)
    if not pairs.is_file():
        return _fail(f"no such pairs file: {pairs}" if not pairs.exists() else f"--pairs {pairs} is not a file")
    if not root.is_dir():
        return _fail(f"--db-root {root} is not a directory (expected DIR/<db_id>/<db_id>.sqlite)")
    # --out under t2sql.atomic's rule, checked before any work (OutputPathError: one line, exit 2)
    output = OutputFile(out, flag="--out", kind="a t2sql equivalence file", own=is_checked_pairs,
                        force=args.force, inputs=[("the --pairs file", pairs)])
    try:
        output.check()
    except OutputPathError as e:
        return _fail(str(e))
    started = time.perf_counter()
    counts = {"lines": 0, "refuted": 0, "not_refuted": 0, "skipped": 0, "bad_input": 0}
    checker = EquivalenceChecker()
    try:
        _mine_first(pairs, root, checker, args.concurrency)
    except KeyboardInterrupt as stop:
        checker.close()
        return _fail(f"{interrupt_word(stop)} while mining the databases' invariants; nothing written")

    def one(lineno: int, row: dict | None, problem: str) -> dict[str, Any]:
        if problem:
            return {"line": lineno, "id": (row or {}).get("id"), "refuted": None, "witness": "",
                    "skipped": "bad_input", "detail": problem, "elapsed_s": 0.0}
        try:
            db_path = find_database(root, row["db_id"])
        except UnknownDatabase as e:
            return {"line": lineno, "id": row.get("id"), "refuted": None, "witness": "", "skipped": "bad_input",
                    "detail": str(e), "elapsed_s": 0.0}
        try:
            config = _config(args, row.get("grading_method")) if row.get("grading_method") else default
        except (PresetError, EquivalenceError, ValueError) as e:
            return {"line": lineno, "id": row.get("id"), "refuted": None, "witness": "", "skipped": "bad_input",
                    "detail": str(e), "elapsed_s": 0.0}
        evidence = row.get("evidence") if isinstance(row.get("evidence"), str) else ""
        # a report whatever the pair
        report = checker.check_sync(db_path, row["pred"], row["gold"], config, evidence=evidence)
        return {"line": lineno, "id": row.get("id"), "refuted": report.refuted,
                "witness": report.witness.to_text() if report.witness else "",
                "skipped": report.skipped_reason or "", "detail": report.detail,
                "elapsed_s": round(report.elapsed_s, 4)}

    try:
        total = count_pairs(pairs)
        with (open(pairs, "rb") as f, output.open() as sink, Progress(total, "checking") as bar,
              concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool):
            pending: deque = deque()
            for lineno, row, problem in read_pairs(f):
                pending.append(pool.submit(one, lineno, row, problem))
                while len(pending) > 4 * args.concurrency or (pending and pending[0].done()):
                    _write(pending.popleft().result(), sink, counts, bar)
            while pending:
                _write(pending.popleft().result(), sink, counts, bar)
    except KeyboardInterrupt as stop:
        return _fail(f"{interrupt_word(stop)} after {counts['lines']} lines; nothing written")
    except (OSError, T2sqlError, JsonProblem) as e:
        return _fail(f"stopped after {counts['lines']} lines ({e}); nothing written")
    finally:
        checker.close()
    summary = {**counts, "out": str(out), "elapsed_s": round(time.perf_counter() - started, 2)}
    if args.json:
        print(dumps(summary))
    else:
        print(f"{counts['lines']} pairs: {counts['refuted']} refuted, {counts['not_refuted']} not refuted, "
              f"{counts['skipped']} skipped (no informative database, ...), {counts['bad_input']} bad lines -> {out}",
              file=sys.stderr)
    return EXIT_SOME if counts["bad_input"] else EXIT_OK


def _mine_first(pairs: Path, root: Path, checker: EquivalenceChecker, concurrency: int) -> None:
    """Mine the invariants of every database the pairs name, with progress, before any check (a check
    then never waits for mining)."""
    paths = set()
    with open(pairs, "rb") as f:
        for _lineno, row, problem in read_pairs(f):
            if not problem:
                try:
                    paths.add(find_database(root, row["db_id"]))
                except UnknownDatabase:
                    pass  # that line reports it
    mined = mine_ahead(paths, checker.invariants, concurrency=concurrency)
    for line in mined.problems():
        print(f"note: {line}", file=sys.stderr)


def is_checked_pairs(head: bytes) -> bool:
    """Whether a file that begins with `head` is this command's --out: its first line a record it writes."""
    record = loads_or_none(first_line(head))
    return isinstance(record, dict) and {"line", "refuted", "witness", "skipped"} <= set(record)


def _write(record: dict[str, Any], sink: Any, counts: dict[str, int], bar: Progress) -> None:
    counts["lines"] += 1
    if record["skipped"] == "bad_input":
        counts["bad_input"] += 1
    elif record["refuted"]:
        counts["refuted"] += 1
    elif record["skipped"]:
        counts["skipped"] += 1
    else:
        counts["not_refuted"] += 1
    sink.write(dumps(record, ensure_ascii=False) + "\n")
    bar.advance()


# ---------------------------------------------------------------------------------- --measure


def _measure(args: argparse.Namespace, config: EquivalenceConfig) -> int:
    if args.answers:
        return _measure_answers(args, config)
    if not args.data or not args.db_root:
        return _fail("--measure needs --data FILE (or --answers FILE) and --db-root DIR")
    try:
        data = load_file(args.data, max_bytes=MAX_QUESTIONS_BYTES, what="question file")
    except (OSError, JsonProblem) as e:
        return _fail(str(e))
    if not isinstance(data, list):
        return _fail(f"{args.data}: expected a JSON list of BIRD questions")
    rows = []
    for i, row in enumerate(data):
        if not isinstance(row, dict) or not isinstance(row.get("SQL"), str) or not isinstance(row.get("db_id"), str):
            print(f"{args.data}: entry {i} skipped: needs string fields db_id and SQL", file=sys.stderr)
            continue
        if args.db_id and row["db_id"] not in args.db_id:
            continue
        if args.half is not None:
            qid = row.get("question_id")
            if not isinstance(qid, int) or qid % 2 != (0 if args.half == "even" else 1):
                continue
        rows.append(row)
    if args.limit is not None:
        rows = rows[: args.limit]
    missing = sorted({r["db_id"] for r in rows if not database_path(args.db_root, r["db_id"]).is_file()})
    if missing:
        return _fail(f"no database for {', '.join(missing)} under {args.db_root} "
                     "(expected <db-root>/<db_id>/<db_id>.sqlite)")
    result = measure(rows, args.db_root, config, concurrency=args.concurrency)
    print(json.dumps(result, indent=1) if args.json else format_measurement(result))
    return EXIT_OK


def _measure_answers(args: argparse.Namespace, default: EquivalenceConfig) -> int:
    if args.data:
        return _fail("--measure takes --data or --answers, not both")
    if not args.db_root:
        return _fail("--measure --answers needs --db-root DIR")
    answers, root = Path(args.answers), Path(args.db_root)
    if not answers.is_file():
        return _fail(f"no such answers file: {answers}" if not answers.exists()
                     else f"--answers {answers} is not a file")
    if not root.is_dir():
        return _fail(f"--db-root {root} is not a directory (expected DIR/<db_id>/<db_id>.sqlite)")

    def config_for(method: str | None) -> EquivalenceConfig:
        try:
            return _config(args, method) if method else default
        except (PresetError, EquivalenceError) as e:
            raise ValueError(str(e)) from None

    try:
        with open(answers, "rb") as f:
            result = measure_answers(f, str(root), config_for, concurrency=args.concurrency)
    except KeyboardInterrupt as stop:
        return _fail(f"{interrupt_word(stop)}; nothing measured")
    except (OSError, T2sqlError) as e:
        return _fail(f"stopped ({e}); nothing measured")
    print(json.dumps(result, indent=1) if args.json else format_answers(result))
    return EXIT_SOME if result["bad_lines"] else EXIT_OK
