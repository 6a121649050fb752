"""`t2sql grade`: one pair, or a --pairs file (one result line per input line), through the Rust core."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter, deque
from pathlib import Path

from t2sql._grader import (
    COLUMN_ORDERS,
    GRADE_DEFAULTS,
    MAX_FLOAT_DIGITS,
    METHODS,
    Database,
    DatabaseError,
    GradeSpec,
    SpillError,
    T2sqlError,
    Verdict,
    set_grade_memory,
)
from t2sql.arguments import (
    MAX_CONCURRENCY,
    add_grade_memory_arguments,
    add_temp_disk_argument,
    grade_memory_from_args,
    method_arg,
    seconds_arg,
    workers_arg,
)
from t2sql.atomic import OutputFile, first_line
from t2sql.commands.pairsfile import count_pairs, read_pairs
from t2sql.errors import GoldCacheError, OutputPathError
from t2sql.grading import OUTCOMES, grade, grade_memory_setting
from t2sql.interrupts import interrupt_word, quiet_teardown
from t2sql.jsonl import dumps, loads_or_none
from t2sql.lru import Lru
from t2sql.progress import Progress
from t2sql.serving.gold_memory import GOLD_MEMORY_ENTRIES
from t2sql.serving.results import GoldResult
from t2sql.tasks import database_path, find_database, sample_dir


def _float_digits(text: str) -> int | None:
    if text == "exact":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of digits or 'exact', got {text!r}") from None
    if not 1 <= value <= MAX_FLOAT_DIGITS:
        raise argparse.ArgumentTypeError(f"float digits must be between 1 and {MAX_FLOAT_DIGITS}, or 'exact'")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Grade predicted SQL against gold SQL. Exit status: one pair: 0 match, 1 any other verdict, "
        "2 trouble (bad arguments, a missing or unreadable database or file); --pairs: 0 every line "
        "graded, 1 some lines could not be graded (malformed, or their database is missing), 2 trouble."
    )
    p.add_argument("--db", help="SQLite database file (single grade)")
    p.add_argument("--db-id", help="the database <db-root>/<db_id>/<db_id>.sqlite instead of --db "
                                   "(default root: the bundled superhero sample)")
    p.add_argument("--pred", help="predicted SQL (single grade)")
    p.add_argument("--gold", help="gold SQL (single grade)")
    p.add_argument("--pairs", help='JSONL file, one {"id","db_id","pred","gold"} per line')
    p.add_argument("--db-root", help="databases at DIR/<db_id>/<db_id>.sqlite (with --pairs or --db-id)")
    p.add_argument("--out", help="JSONL output, one line per non-blank input line, in order (with --pairs); an "
                                 "existing file is replaced only when it is grade's own output, or with --force")
    p.add_argument("--force", action="store_true",
                   help="with --pairs: replace an existing --out file even when it is not t2sql grade's output")
    p.add_argument("--method", default="multiset", type=_method_arg,
                   metavar="|".join((*METHODS, "task")),
                   help="how results are compared (default multiset; list = ordered); task: each --pairs "
                        'line\'s own "grading_method" (a line without one: multiset)')
    p.add_argument("--column-order", default="strict", choices=COLUMN_ORDERS,
                   help="ignore: compare each row as the multiset of its cells (default strict)")
    p.add_argument("--float-digits", type=_float_digits, default=GRADE_DEFAULTS["float_digits"], metavar="N|exact",
                   help=f"significant digits for non-integral REALs (default {GRADE_DEFAULTS['float_digits']}), "
                        "or 'exact'")
    p.add_argument("--timeout-s", type=seconds_arg, default=GRADE_DEFAULTS["timeout_s"], metavar="S",
                   help=f"per-query timeout in seconds (default {GRADE_DEFAULTS['timeout_s']:g})")
    p.add_argument("--concurrency", type=_concurrency_arg, default=os.cpu_count() or 1, metavar="N",
                   help="with --pairs: grade on N workers (default: the machine's cores, here "
                        f"{os.cpu_count() or 1}; at most {MAX_CONCURRENCY}); the output is the same whatever N is")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="with --pairs: keep gold digests here across runs (default: in memory for this run)")
    add_grade_memory_arguments(p)
    add_temp_disk_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _concurrency_arg(text: str) -> int:
    workers = workers_arg(text)
    if workers > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(f"at most {MAX_CONCURRENCY} workers, not {workers} (a worker runs one "
                                         f"query at a time; this machine has {os.cpu_count() or 1} cores)")
    return workers


def _method_arg(text: str) -> str:
    if text.strip().lower() == "task":
        return "task"
    return method_arg(text)


EXIT_MATCH, EXIT_OTHER, EXIT_TROUBLE = 0, 1, 2
BAD_INPUT = "bad_input"  # a --pairs line that could not be read as a pair


def _fail(message: str) -> int:
    print(f"t2sql grade: {message}", file=sys.stderr)
    return EXIT_TROUBLE


def _utf8_problem(**texts: str | None) -> str | None:
    """Command-line text that is not valid UTF-8 (Python keeps such bytes as lone surrogates)."""
    for name, text in texts.items():
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            what = "the SQL" if name in ("pred", "gold") else "the path"
            return f"--{name.replace('_', '-')} is not valid UTF-8; pass {what} as UTF-8 text"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _utf8_problem(pred=args.pred, gold=args.gold, db=args.db, db_id=args.db_id, pairs=args.pairs,
                            out=args.out, db_root=args.db_root)
    if problem:
        return _fail(problem)
    try:
        memory_mb, tmp_dir = grade_memory_from_args(args)
    except ValueError as e:
        return _fail(str(e))
    if args.pairs:
        if not args.db_root or not args.out:
            return _fail("--pairs needs --db-root DIR and --out FILE.jsonl")
        return _grade_pairs(args)
    if args.method == "task":
        return _fail("--method task takes each --pairs line's grading_method; a single grade names its method")
    if args.db and args.db_id:
        return _fail("pass --db FILE or --db-id NAME, not both")
    missing = [f for f in ("pred", "gold") if getattr(args, f) is None]
    if not (args.db or args.db_id):
        missing.insert(0, "db")
    if missing:
        return _fail("needs --db (or --db-id), --pred and --gold (or --pairs FILE --db-root DIR --out FILE); "
                     f"missing: {', '.join('--' + m for m in missing)}")
    db_path = args.db
    if args.db_id:

        db_path = str(database_path(args.db_root or sample_dir(), args.db_id))
    if not os.path.exists(db_path):  # named by the flag that was given, not by one that was not
        if args.db:
            return _fail(f"no such database file: --db {db_path}")
        where = f"--db-root {args.db_root}" if args.db_root else "the bundled sample (pass --db-root DIR for others)"
        return _fail(f"--db-id {args.db_id}: no database {db_path} under {where}")
    memory = grade_memory_setting(memory_mb, tmp_dir)
    if memory is not None:
        set_grade_memory(*memory)
    try:
        v = grade(db_path, args.pred, args.gold, args.method, args.float_digits, args.timeout_s, args.column_order,
                  args.max_temp_mb)
    except (DatabaseError, SpillError) as e:
        return _fail(str(e))
    if args.json:
        print(json.dumps(_verdict_dict(v)))
    else:
        print(f"{v.outcome}: {v.detail}")
    return EXIT_MATCH if v.outcome == "match" else EXIT_OTHER


def _verdict_dict(v: Verdict) -> dict:
    return {
        "outcome": v.outcome,
        "detail": v.detail,
        "method": v.method,
        "pred_rows": v.pred_rows,
        "gold_rows": v.gold_rows,
        "elapsed_s": round(v.elapsed_s, 6),
    }


def is_verdicts(head: bytes) -> bool:
    """Whether a file that begins with `head` is grade's --out: its first line a verdict record, as written."""
    record = loads_or_none(first_line(head))
    return (isinstance(record, dict) and "id" in record and record.get("outcome") in (*OUTCOMES, BAD_INPUT)
            and type(record.get("line")) is int)


def _check_pair_files(args: argparse.Namespace) -> str | None:
    """What is wrong with --pairs / --db-root before any grading starts, if anything (--out: t2sql.atomic)."""
    pairs, root = Path(args.pairs), Path(args.db_root)
    if not pairs.is_file():
        return f"no such pairs file: {pairs}" if not pairs.exists() else f"--pairs {pairs} is not a file"
    if not os.access(pairs, os.R_OK):
        return f"cannot read --pairs {pairs}: permission denied"
    if not root.is_dir():
        return f"--db-root {root} is not a directory (expected DIR/<db_id>/<db_id>.sqlite)"
    return None


def _grade_pairs(args: argparse.Namespace) -> int:
    problem = _check_pair_files(args) or _check_cache_dir(args.cache_dir)
    if problem:
        return _fail(problem)
    # --out under t2sql.atomic's rule, checked now (OutputPathError: one line, exit 2); never the --pairs file
    output = OutputFile(args.out, flag="--out", kind="a t2sql grade verdicts file", own=is_verdicts,
                        force=args.force, inputs=[("the --pairs file", args.pairs)])
    output.check()
    total = count_pairs(args.pairs)
    from t2sql.serving.grader import Grader  # lazily: a single grade stays light

    memory_mb, tmp_dir = grade_memory_from_args(args)  # checked by run()
    try:
        grader = Grader(concurrency=args.concurrency, cache_dir=args.cache_dir, grade_timeout_s=args.timeout_s,
                        grade_memory_mb=memory_mb, tmp_dir=tmp_dir, gold_memory_entries=GOLDS_KEPT,
                        max_temp_mb=args.max_temp_mb)
    except GoldCacheError as e:
        return _fail(f"cannot use --cache-dir {args.cache_dir}: {e}")
    except T2sqlError as e:
        return _fail(str(e))
    except OSError as e:  # the system would not start that many threads (its thread or memory limits)
        return _fail(f"cannot start {args.concurrency} workers ({e}): the system refused a thread; "
                     "pass a smaller --concurrency")
    batch = _PairsBatch(args, grader)
    out_path = Path(args.out)
    started = time.perf_counter()
    # Written to a temporary file and renamed at the end: a crash or an interrupt never leaves a partial output.
    try:
        with grader, output.open() as out, Progress(total, "grading") as bar:
            asyncio.run(batch.grade_all(out, bar))
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (t2sql.interrupts)
        quiet_teardown()
        return _fail(f"{interrupt_word(e)} after {batch.lines} of {total} lines; --out {out_path} was not written")
    except OutputPathError as e:  # the path changed during the run (t2sql.atomic checks it again before the rename)
        return _fail(str(e))
    except OSError as e:
        return _fail(f"cannot write --out {out_path}: {e.strerror or e}")
    except Exception as e:  # a failure no line can be blamed for: say so in one line, write nothing
        return _fail(f"grading stopped after {batch.lines} of {total} lines ({type(e).__name__}: {e}); "
                     f"--out {out_path} was not written")
    elapsed = time.perf_counter() - started
    counts, ungraded = batch.counts, batch.ungraded
    lines = sum(counts.values())
    outcomes = OUTCOMES + (BAD_INPUT,)
    # A line is graded or it is not: a missing database is an ungraded line (outcome gold_error), not both.
    graded = lines - ungraded
    stats = grader.stats()
    golds = {"computed": stats["gold_computed"], "from_memory": stats["gold_memory_hits"],
             "from_disk": stats["gold_disk_hits"], "failed": stats["gold_failures"]}
    summary = {"lines": lines, "graded": graded, "ungraded": ungraded,
               "counts": {k: counts.get(k, 0) for k in outcomes}, "elapsed_s": round(elapsed, 3),
               "out": str(out_path), "concurrency": grader.concurrency, "golds": golds}
    if args.json:
        print(dumps(summary))
    else:
        print(f"{'outcome':<14}{'count':>8}{'share':>9}")
        for k in outcomes:
            n = counts.get(k, 0)
            print(f"{k:<14}{n:>8}{(n / lines if lines else 0):>9.1%}")
        print(f"{'total':<14}{lines:>8}   ({graded} graded, {ungraded} not graded, {elapsed:.2f}s) -> {out_path}")
        print(f"gold digests: {golds['computed']} computed, {golds['from_memory']} reused in memory, "
              f"{golds['from_disk']} from --cache-dir, {golds['failed']} failed "
              f"({grader.concurrency} worker{'s' if grader.concurrency != 1 else ''})")
    return EXIT_OTHER if ungraded else EXIT_MATCH


def _check_cache_dir(cache_dir: str | None) -> str | None:
    if cache_dir is None:
        return None
    path = Path(cache_dir)
    if path.exists() and not path.is_dir():
        return f"--cache-dir {path} is not a directory"
    if path.is_dir() and not os.access(path, os.W_OK | os.X_OK):
        return f"cannot write --cache-dir {path}: permission denied"
    return None


_GOLD_READY = object()  # a gold whose digest the Grader made (it may since have forgotten it)

# What one --pairs run keeps, each the most recently used up to a count and a size: the golds'
# digests (the Grader's, t2sql.serving.gold_memory) and which golds were made or failed (a failed
# gold is not run again while it is remembered), up to GOLDS_KEPT each, and which db_ids were checked.
GOLDS_KEPT = GOLD_MEMORY_ENTRIES
DATABASES_KEPT = 1024
KEPT_BYTES = 64 * 1024 * 1024  # for each of the two
# The bytes of input lines read ahead of the first line not yet written: with lines up to
# t2sql.jsonl's cap (16 MiB), what the read-ahead holds stays near this, not 10,000 lines of them.
READ_AHEAD_BYTES = 64 * 1024 * 1024
_ENTRY_BYTES = 256  # a kept entry's own objects, besides its strings


def _gold_entry_size(key: tuple, state) -> int:
    detail = state.detail if isinstance(state, GoldResult) else ""
    return _ENTRY_BYTES + len(key[0]) + len(key[1]) + len(detail)


def _database_entry_size(db_id: str, found) -> int:
    return _ENTRY_BYTES + len(db_id) + len(str(found))


class _PairsBatch:
    """The lines of a --pairs file graded on the Grader's workers, written in input order.

    The file is read as the output is written: at most `in_flight` lines are being graded at once
    (enough to keep every worker busy while some lines wait for their gold), and at most `buffered`
    lines, or `read_ahead_bytes` of them, are read ahead of the first one not yet written (so one slow
    line does not idle the other workers, and a file of millions of lines costs the memory of a few
    thousand). Every line is graded as t2sql.grade grades it (one attempt, no retry of a timeout);
    each distinct (database, gold, spec) gold is run once by the Grader while it is among the
    GOLDS_KEPT most recent (after that it is read from --cache-dir, or run again), and a gold that
    failed is not run again for the lines that share it."""

    def __init__(self, args: argparse.Namespace, grader) -> None:
        self.args = args
        self.grader = grader
        # At most half as many lines in flight as golds kept: a gold made for a line is still in
        # the Grader's memory when that line's prediction is graded against it.
        self.in_flight = max(1, min(max(256, 32 * grader.concurrency), GOLDS_KEPT // 2))
        self.buffered = max(10_000, 4 * self.in_flight)
        self.read_ahead_bytes = READ_AHEAD_BYTES
        self.counts: Counter[str] = Counter()
        self.ungraded = 0  # lines with no verdict: malformed, or their database could not be opened
        self.lines = 0  # written so far
        self.held_bytes = 0  # of the lines read and not yet written
        self._running = 0
        self._slot: asyncio.Event | None = None
        self._databases: Lru[str | DatabaseError] = Lru(DATABASES_KEPT, KEPT_BYTES, _database_entry_size)
        # (db_id, gold SQL, spec) -> _GOLD_READY, or the gold's failure (a GoldResult)
        self._golds: Lru = Lru(GOLDS_KEPT, KEPT_BYTES, _gold_entry_size)
        self._asking: dict[tuple, asyncio.Future] = {}  # golds asked of the Grader, not yet answered

    async def grade_all(self, out, bar: Progress) -> None:
        # (line number, the line's id if it is a bad line, its problem, the grading task or None,
        # the bytes it holds), in input order
        pending: deque = deque()
        self._slot = asyncio.Event()
        try:
            with open(self.args.pairs, "rb") as f:
                read = 0
                for lineno, row, problem in read_pairs(f):
                    size, read = f.tell() - read, f.tell()  # this line (and the blank ones before it)
                    while self._running >= self.in_flight:
                        self._slot.clear()
                        await self._slot.wait()
                        self._write_done(pending, out, bar)
                    # The first line is slow: wait for it.
                    while pending and (len(pending) >= self.buffered or self.held_bytes >= self.read_ahead_bytes):
                        await pending[0][3]
                        self._write_done(pending, out, bar)
                    held = size if row is not None else 0  # a line that could not be read holds its problem
                    self.held_bytes += held
                    if problem:
                        line_id = row.get("id") if isinstance(row, dict) else None
                        pending.append((lineno, line_id, problem, None, held))
                    else:
                        task = asyncio.ensure_future(self._grade_row(row))
                        self._running += 1
                        task.add_done_callback(self._finished)
                        pending.append((lineno, None, "", task, held))
                    self._write_done(pending, out, bar)
            while pending:
                if pending[0][3] is not None:
                    await pending[0][3]
                self._write_done(pending, out, bar)
        finally:  # stopped part way (an error, an interrupt): the lines in flight are dropped, quietly
            tasks = [item[3] for item in pending if item[3] is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _finished(self, task: asyncio.Future) -> None:
        self._running -= 1
        self._slot.set()

    def _write_done(self, pending: deque, out, bar: Progress) -> None:
        """Write the lines at the head of `pending` that are done, in order."""
        while pending and (pending[0][3] is None or pending[0][3].done()):
            lineno, line_id, problem, task, held = pending.popleft()
            if task is None:
                print(f"{self.args.pairs}:{lineno}: not graded: {problem}", file=sys.stderr)
                record, graded = {"id": line_id, "line": lineno, "outcome": BAD_INPUT, "detail": problem}, False
            else:
                record, graded = task.result()  # a bug in grading raises here, and stops the run
                record["line"] = lineno
            self.held_bytes -= held
            self.ungraded += not graded
            self.counts[record["outcome"]] += 1
            out.write(dumps(record, ensure_ascii=False) + "\n")
            self.lines += 1
            bar.advance()

    def _database(self, db_id: str) -> str | DatabaseError:
        """The file of `db_id` under --db-root (one path component, t2sql.tasks' rule), opened once
        to see that it is a database (the first line on it, while it is remembered), or why not."""
        found = self._databases.get(db_id)
        if found is None:
            try:
                path = find_database(self.args.db_root, db_id)
                Database(path).close()
                found = path
            except DatabaseError as e:  # UnknownDatabase is one: an invalid db_id is never opened
                found = e
            self._databases.put(db_id, found)
        return found

    async def _gold(self, db: str, db_id: str, gold_sql: str, spec: GradeSpec):
        """None once this gold's digest has been made, or its failure (a GoldResult).

        The first line of each gold asks the Grader for it; the lines that come while it runs wait
        for that one answer, and a failure is remembered while it is among the GOLDS_KEPT most
        recent (the Grader forgets a failed gold the moment it is done, so lines arriving just then
        would run it again)."""
        key = (db_id, gold_sql, spec)
        state = self._golds.get(key)
        if state is None:
            asked = self._asking.get(key)
            if asked is None:
                asked = self._asking[key] = asyncio.ensure_future(self._ask(key, db, gold_sql, spec))
            state = await asyncio.shield(asked)  # one line's cancellation must not fail the others'
        return None if state is _GOLD_READY else state

    async def _ask(self, key: tuple, db: str, gold_sql: str, spec: GradeSpec):
        try:
            gold = await self.grader.gold(db, gold_sql, spec)
            state = _GOLD_READY if gold.ok else gold  # the digest itself stays in the Grader
            self._golds.put(key, state)
            return state
        finally:  # in the same step as the put: a line that comes after finds one or the other
            del self._asking[key]

    async def _grade_row(self, row: dict) -> tuple[dict, bool]:
        """A pair's record, and whether it got a verdict (False: its database could not be read)."""
        db = self._database(row["db_id"])
        if isinstance(db, DatabaseError):
            return {"id": row["id"], "outcome": "gold_error", "detail": f"database: {db}"}, False
        method = self.args.method
        if method == "task":
            method = row.get("grading_method") or "multiset"
        try:
            a = self.args
            spec = GradeSpec(method, gold_sql=row["gold"], float_digits=a.float_digits, column_order=a.column_order,
                             timeout_s=a.timeout_s, max_temp_mb=a.max_temp_mb)
            gold = await self._gold(db, row["db_id"], row["gold"], spec)
            if gold is not None:  # the gold failed: every line that shares it says so, as t2sql.grade would
                verdict = (gold.outcome, gold.detail, spec.method)
            else:
                r = await self.grader.grade(db, row["pred"], row["gold"], spec, retry=False)
                verdict = (r.outcome, r.detail, r.method)
        except T2sqlError as e:  # a broken or changed database file mid-run: report, go on
            return {"id": row["id"], "outcome": "gold_error", "detail": str(e)}, False
        outcome, detail, resolved = verdict
        return {"id": row["id"], "outcome": outcome, "detail": detail, "method": resolved}, True
