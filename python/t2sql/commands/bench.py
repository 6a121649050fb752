"""`t2sql bench grader|serving|download|pairs|equivalence-guard|equivalence-scale`: the grading core against its
peers, the Grader at training scale, the data downloader against curl, batch grading (`t2sql grade --pairs`)
against BIRD's rule, the equivalence check under red-team predictions and on scaled copies of a database."""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import t2sql
from t2sql.arguments import add_grade_memory_arguments, grade_memory_from_args
from t2sql.atomic import OutputFile, output_folder
from t2sql.bench.grader import PATHS, bench_grader, format_grader
from t2sql.bench.serving import (
    TOOL_PATHS,
    bench_gold_precompute,
    bench_grades,
    bench_rollout,
    bench_stall_floor,
    bench_tool_latency,
    effective_cores,
    say,
)
from t2sql.commands.grade import is_verdicts
from t2sql.episode.presets import DEFAULT_PRESET
from t2sql.errors import T2sqlError
from t2sql.grading import grade_memory_setting
from t2sql.home import describe_default_dir, made_default_dir
from t2sql.tasks import database_path, sample_questions


def add_arguments(p: argparse.ArgumentParser) -> None:
    suites = p.add_subparsers(dest="suite", metavar="SUITE", required=True)
    paths = "\n".join(f"  {name:<17} {label}" for name, (label, _) in PATHS.items())
    g = suites.add_parser("grader", help="the grading core vs its peers on a large table",
                          description="The grading core vs its peers on a large table: each path in its own "
                                      "process, timed after its imports, with its peak memory.\n\npaths:\n" + paths,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    g.add_argument("--rows", default="1000000,5000000", help="table sizes, comma-separated")
    g.add_argument("--work-dir", default=None,
                   help="where the benchmark tables are built (and reused); made if missing, when its parent exists "
                        f"(default: {describe_default_dir('bench-grader')})")
    g.add_argument("--repeat", type=int, default=5, help="runs of the fast paths, round-robin (best is kept)")
    g.add_argument("--skip", default="", help="comma-separated paths to skip (e.g. python_counter; paths above)")
    add_grade_memory_arguments(g)
    g.add_argument("--json", action="store_true", help="print the report as JSON")
    s = suites.add_parser("serving", help="the Grader at training scale (tool latency, grades/s, loop stalls)")
    add_serving_arguments(s)
    d = suites.add_parser("download", help="t2sql's downloader against curl, one file served on loopback",
                          description="The download rate of t2sql's downloader (sha256 computed, as prepare runs "
                                      "it) against curl, for one generated file served on 127.0.0.1 by the same "
                                      "server; best of --repeat rounds, side by side, with the ratio (target 0.8x). "
                                      "Then the peak RSS of extract_databases (target 64 MiB) on a generated "
                                      "archive in BIRD's dev layout, in a fresh interpreter.")
    d.add_argument("--size-mb", type=int, default=300, help="size of the served file in MB (default 300)")
    d.add_argument("--repeat", type=int, default=3, help="rounds, round-robin (the best is kept)")
    d.add_argument("--extract-mb", type=int, default=200,
                   help="MB of databases in the archive whose extraction is measured (default 200; 0 skips it)")
    d.add_argument("--work-dir", default=None,
                   help="where the file and the fetched copies are written, in a folder of their own (needs twice "
                        "--size-mb free, and three times --extract-mb); everything is removed at the end "
                        f"(default: {describe_default_dir('bench-download')})")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    add_pairs_arguments(suites)
    e = suites.add_parser(
        "equivalence-guard", help="the equivalence check under red-team predictions: time, RSS, temp disk, cancel",
        description="The equivalence check under the red team's predictions (a 400 MB value, a sort wanting "
                    "2 GB of temporary disk, a row-dependent instr(), mining past a temp cap, a cancel): each case "
                    "in a fresh interpreter, its seconds against the check's budget (target budget + 5 s), its "
                    "RSS above the warmed-up baseline (target 1 GiB), the peak of its temporary files (target the "
                    "per-query cap), and how soon a cancelled check frees the Grader's worker (target 1 s).")
    e.add_argument("--rows", type=int, default=20_000, help="rows of the generated table (default 20000)")
    e.add_argument("--mining-temp-mb", type=int, default=32,
                   help="the temp cap the mining case runs under (default 32; its DISTINCT wants more)")
    e.add_argument("--cancel-after-s", type=float, default=3.0, help="when the cancel case cancels (default 3)")
    e.add_argument("--case", action="append", default=[], choices=["zeroblob", "temp", "instr", "mining", "cancel"],
                   help="run only this case (repeatable)")
    e.add_argument("--work-dir", default=None,
                   help="where the table is built (about 85 MB per 20,000 rows; removed at the end) "
                        f"(default: {describe_default_dir('bench-equivalence-guard')})")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    sc = suites.add_parser(
        "equivalence-scale", help="the equivalence check on scaled copies of a database: mining, latency, RSS",
        description="Copies of one database at each scale (every table's rows repeated k times, names offset so "
                    "that every mined invariant holds; checked), each mined ahead and checked on the pairs derived "
                    "from its golds in a fresh interpreter: mining seconds and temporary disk, first-check seconds, "
                    "p50/p95 per check, peak RSS, invariants and verdicts against 1x.")
    sc.add_argument("--db-root", required=True, help="databases at DIR/<db_id>/<db_id>.sqlite")
    sc.add_argument("--data", required=True, help="BIRD questions (dev.json) whose golds give the pairs")
    sc.add_argument("--db-id", default="toxicology", help="the database to scale (default toxicology)")
    sc.add_argument("--scales", default="10,100",
                    help="comma-separated factors besides 1x (default 10,100; 1000 makes GBs of a toxicology)")
    sc.add_argument("--pairs-limit", type=int, default=None, help="an evenly spaced subset of this many pairs")
    sc.add_argument("--preset", default=DEFAULT_PRESET, help="the preset whose check runs (default the recipe's)")
    sc.add_argument("--work-dir", default=None,
                    help="where the copies are built (each removed after its scale; the caches stay) "
                         f"(default: {describe_default_dir('bench-equivalence-scale')})")
    sc.add_argument("--json", action="store_true", help="print the report as JSON")


def run_equivalence_scale(args: argparse.Namespace) -> int:
    from t2sql.bench.equivalence_scale import bench_equivalence_scale, format_equivalence_scale

    try:
        scales = [int(x) for x in args.scales.split(",") if x.strip()]
    except ValueError:
        scales = []
    if not scales or min(scales) < 1 or (args.pairs_limit is not None and args.pairs_limit < 1):
        print("t2sql bench equivalence-scale: --scales takes positive factors, comma-separated, and --pairs-limit "
              "a positive count", file=sys.stderr)
        return 2
    work = output_folder(args.work_dir or made_default_dir("bench-equivalence-scale"), flag="--work-dir")
    try:
        report = bench_equivalence_scale(args.db_root, args.data, args.db_id, work, scales,
                                         preset=args.preset, pairs_limit=args.pairs_limit)
    except (OSError, ValueError, T2sqlError, sqlite3.Error, subprocess.SubprocessError) as e:
        print(f"t2sql bench equivalence-scale: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_equivalence_scale(report))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.suite == "equivalence-guard":
        return run_equivalence_guard(args)
    if args.suite == "equivalence-scale":
        return run_equivalence_scale(args)
    if args.suite == "serving":
        return run_serving(args)
    if args.suite == "download":
        return run_download(args)
    if args.suite == "pairs":
        return run_pairs(args)
    try:
        rows = [int(x) for x in str(args.rows).split(",") if x.strip()]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1:
        print(f"t2sql bench grader: --rows takes positive row counts, comma-separated, not {args.rows!r}",
              file=sys.stderr)
        return 2
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = sorted(skip - set(PATHS))
    if unknown:
        print(f"t2sql bench grader: unknown path(s) in --skip: {', '.join(unknown)}; the paths are "
              f"{', '.join(PATHS)}", file=sys.stderr)
        return 2
    try:
        memory_mb, tmp_dir = grade_memory_from_args(args)
    except ValueError as e:
        print(f"t2sql bench grader: {e}", file=sys.stderr)
        return 2
    memory = grade_memory_setting(memory_mb, tmp_dir)
    work = output_folder(args.work_dir or made_default_dir("bench-grader"), flag="--work-dir")
    report = bench_grader(rows, work, max(1, args.repeat), skip, memory)
    print(json.dumps(report, indent=2) if args.json else format_grader(report))
    return 0


def run_download(args: argparse.Namespace) -> int:
    import subprocess

    from t2sql.bench.download import bench_download, format_download  # lazily: see bench/serving.py's note

    if args.size_mb < 1 or args.repeat < 1:
        print("t2sql bench download: --size-mb and --repeat must be at least 1", file=sys.stderr)
        return 2
    if args.extract_mb < 0:
        print("t2sql bench download: --extract-mb must be 0 (skip the extraction) or more", file=sys.stderr)
        return 2
    work = output_folder(args.work_dir or made_default_dir("bench-download"), flag="--work-dir")
    try:
        report = bench_download(args.size_mb, work, args.repeat, args.extract_mb)
    except (T2sqlError, OSError, RuntimeError, subprocess.SubprocessError) as e:
        print(f"t2sql bench download: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_download(report))
    return 0


def run_equivalence_guard(args: argparse.Namespace) -> int:
    from t2sql.bench.equivalence_guard import bench_equivalence_guard, format_equivalence_guard

    if args.rows < 100 or args.mining_temp_mb < 1 or not args.cancel_after_s > 0:
        print("t2sql bench equivalence-guard: --rows must be at least 100, --mining-temp-mb at least 1 and "
              "--cancel-after-s positive", file=sys.stderr)
        return 2
    work = output_folder(args.work_dir or made_default_dir("bench-equivalence-guard"), flag="--work-dir")
    try:
        report = bench_equivalence_guard(work, rows=args.rows, mining_temp_mb=args.mining_temp_mb,
                                         cancel_after_s=args.cancel_after_s, cases=args.case or None)
    except (OSError, sqlite3.Error, subprocess.SubprocessError) as e:
        print(f"t2sql bench equivalence-guard: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_equivalence_guard(report))
    return 0 if report["ok"] else 1


def add_pairs_arguments(suites) -> None:
    p = suites.add_parser(
        "pairs", help="t2sql grade --pairs on 1 and N workers vs BIRD's rule in Python, many predictions per gold",
        description="Batch grading against BIRD's rule in plain Python (sqlite3 fetchall of prediction and gold "
                    "for every line, set equality, sequential), on a workload of about --per-question "
                    "predictions for each question (the gold, its near misses, other questions' golds). Each run in "
                    "a fresh process, timed whole; ratios and the verdicts' agreement with BIRD's rule are reported.")
    p.add_argument("--questions", help="BIRD question JSON (a list of {question_id, db_id, SQL}); default: the "
                                       "bundled superhero sample's dev questions")
    p.add_argument("--db-root", help="databases as <root>/<db_id>/<db_id>.sqlite (default: beside --questions)")
    p.add_argument("--per-question", type=int, default=30, help="predictions per question (default 30)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N questions (smoke runs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the drawn predictions (default 0)")
    p.add_argument("--concurrency", type=int, default=2, metavar="N",
                   help="workers of the parallel t2sql run (default 2)")
    p.add_argument("--repeat", type=int, default=1, help="rounds, round-robin (the best of each run is kept)")
    p.add_argument("--work-dir", default=None,
                   help="where the pairs file and the verdicts are written (made if missing, when its parent "
                        "exists); what an earlier bench pairs wrote there is replaced, any other file only with "
                        f"--force (default: {describe_default_dir('bench-pairs')})")
    p.add_argument("--force", action="store_true",
                   help="replace files in --work-dir of those names even when this bench did not write them")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_pairs(args: argparse.Namespace) -> int:
    from t2sql.bench.pairs import bench_pairs, format_pairs  # lazily: only this suite needs it

    questions = Path(args.questions) if args.questions else sample_questions()
    root = Path(args.db_root) if args.db_root else questions.parent
    if min(args.per_question, args.concurrency, args.repeat, args.limit or 1) < 1:
        print("t2sql bench pairs: --per-question, --concurrency, --repeat and --limit must be at least 1",
              file=sys.stderr)
        return 2
    if not questions.is_file():
        print(f"t2sql bench pairs: no such question file: {questions}", file=sys.stderr)
        return 2
    if not root.is_dir():
        print(f"t2sql bench pairs: --db-root {root} is not a directory", file=sys.stderr)
        return 2
    work = _pairs_work_dir(args)
    try:
        report = bench_pairs(questions, root, work, per_question=args.per_question, seed=args.seed,
                             workers=args.concurrency, repeat=args.repeat, limit=args.limit, force=args.force)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        print(f"t2sql bench pairs: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else format_pairs(report))
    return 0


def _pairs_work_dir(args: argparse.Namespace) -> Path:
    """--work-dir, with every file bench pairs writes there checked against t2sql.atomic's rule before the
    runs (OutputPathError: exit 2); t2sql grade checks its --out again when it runs."""
    from t2sql.bench.pairs import own_outputs, verdicts_file

    work = output_folder(args.work_dir or made_default_dir("bench-pairs"), flag="--work-dir", create=False)
    if work.is_dir():  # else it is made, empty, below
        for output in own_outputs(work, args.force).values():
            output.check()
        for n in sorted({1, args.concurrency}):
            OutputFile(work / verdicts_file(n), flag="--work-dir's", kind="a t2sql grade verdicts file",
                       own=is_verdicts, force=args.force, instead="choose another --work-dir").check()
    return output_folder(work, flag="--work-dir")


def add_serving_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="BIRD question json (default: $T2SQL_BIRD/dev.json when set, "
                        "else the bundled superhero sample)")
    parser.add_argument("--db-root", help="databases as <root>/<db_id>/<db_id>.sqlite (default: beside --data)")
    parser.add_argument("--tool-calls", type=int, default=2000, help="small queries timed per path")
    parser.add_argument("--concurrency", type=int, default=os.cpu_count() or 1,
                        metavar="N", help="workers for 'all cores'")
    parser.add_argument("--tasks", type=int, default=256, help="concurrent asyncio tasks")
    parser.add_argument("--backend", choices=["thread", "process"], default="thread")
    parser.add_argument("--pairs", type=int, default=None, help="use only the first N pairs (smoke runs)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each grade configuration N times and report the median run")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")


def _load_pairs(args) -> list[tuple[str, str]]:
    bird = Path(os.environ["T2SQL_BIRD"]) if os.environ.get("T2SQL_BIRD") else None
    data = Path(args.data) if args.data else (bird / "dev.json" if bird and (bird / "dev.json").is_file()
                                             else sample_questions())
    root = Path(args.db_root) if args.db_root else data.parent
    questions = json.loads(data.read_text())[: args.pairs]
    return [(str(database_path(root, q["db_id"])), q["SQL"]) for q in questions]


def run_serving(args) -> int:
    try:
        pairs = _load_pairs(args)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: cannot read the question file: {e}", file=sys.stderr)
        return 2
    if min(args.concurrency, args.tasks, args.tool_calls, args.repeat) < 1:
        print("error: --concurrency, --tasks, --tool-calls and --repeat must be at least 1", file=sys.stderr)
        return 2
    say("tool-call latency")
    result = {
        "sqlite": t2sql.sqlite_version(),
        "cores": os.cpu_count(),
        "pairs": len(pairs),
        "backend": args.backend,
        "load_average": round(os.getloadavg()[0], 2),  # other work on the machine skews everything
        "effective_cores": effective_cores(args.concurrency),
        "tool_latency": bench_tool_latency(pairs[0][0], args.tool_calls),
        "grades": bench_grades(pairs, args.concurrency, args.tasks, args.backend, args.repeat),
        "rollout": bench_rollout(pairs, args.concurrency, args.tasks, args.backend),
        "stall_floor": bench_stall_floor(pairs, args.concurrency, args.tasks),
        "gold_precompute": bench_gold_precompute(pairs, args.concurrency, args.backend),
    }
    result["effective_cores_after"] = effective_cores(args.concurrency)
    say("")
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_table(result)
    return 0


def print_table(r: dict[str, Any]) -> None:
    print(f"t2sql bench serving — SQLite {r['sqlite']}, {r['cores']} cores, {r['pairs']} BIRD dev pairs, "
          f"backend {r['backend']}")
    print(f"machine: load average {r['load_average']} at start; effective cores {r['effective_cores']} before, "
          f"{r.get('effective_cores_after', '?')} after (a pure-CPU job alone vs in {r['cores']} processes; "
          "this caps every speedup below)\n")
    t = r["tool_latency"]
    print(f"tool call, small query on a warm connection ({t['queries']} calls: {t['query']})")
    print(f"  {'path':<34}{'p50 µs':>10}{'p99 µs':>10}{'p50 overhead µs':>18}")
    for key, name in TOOL_PATHS.items():
        row = t[key]
        print(f"  {name:<34}{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}{row['p50_overhead_us']:>18.1f}")
    print("\ngrades, pred = gold")
    print(f"  {'run':<40}{'golds':>6}{'seconds':>9}{'grades/s':>10}{'speedup':>9}"
          f"{'stall max/p99 ms':>18}{'gc max ms':>11}")
    for name, row in r["grades"].items():
        speed = f"{row['speedup']:.2f}x" if "speedup" in row else ""
        stall = ("" if row["loop_max_stall_ms"] is None
                 else f"{row['loop_max_stall_ms']:.1f}/{row['loop_p99_stall_ms']:.1f}")
        gc_max = "" if row["gc_max_pause_ms"] is None else f"{row['gc_max_pause_ms']:.1f}"
        print(f"  {name:<40}{row['gold_cache']:>6}{row['seconds']:>9.3f}{row['grades_per_s']:>10.1f}"
              f"{speed:>9}{stall:>18}{gc_max:>11}")
        if row["not_matched"]:
            print(f"    !! {row['not_matched']} pairs did not match")
    ro = r["rollout"]
    print(f"\nrollout shape: {ro['trajectories']} episodes at once, 5 tool calls + 1 grade each, 5-50 ms model "
          f"turns between calls")
    print(f"  {ro['sql_calls']} SQL calls in {ro['seconds']:.3f} s ({ro['sql_calls_per_s']:.1f}/s); loop stall "
          f"max {ro['loop_max_stall_ms']:.1f} ms, p99 {ro['loop_p99_stall_ms']:.1f} ms; longest GC pause "
          f"{ro['gc_max_pause_ms']:.1f} ms")
    if ro["not_matched"]:
        print(f"    !! {ro['not_matched']} episodes did not match")
    f = r["stall_floor"]
    print("\nloop stall without the Grader (the floor this machine sets), max / p99 ms")
    print(f"  {'the loop alone, nothing else running':<58}{f['idle']['loop_max_stall_ms']:>7.1f} / "
          f"{f['idle']['loop_p99_stall_ms']:.1f}")
    raw = f["raw_sql_threads"]
    print(f"  {'beside ' + str(raw['threads']) + ' threads grading the same pairs on the core':<58}"
          f"{raw['loop_max_stall_ms']:>7.1f} / {raw['loop_p99_stall_ms']:.1f}")
    only = f["asyncio_tasks_only"]
    print(f"  {'asyncio alone: ' + str(only['tasks']) + ' tasks that only await, started at once':<58}"
          f"{only['loop_max_stall_ms']:>7.1f} / {only['loop_p99_stall_ms']:.1f}")
    g = r["gold_precompute"]
    print("\ngold precompute (disk cache)")
    for label in ("cold", "warm"):
        row = g[label]
        print(f"  {label:<34}{row['seconds']:>10.3f} s  computed {row['computed']}, from disk "
              f"{row['from_disk']}, failed {row['failed']}")
