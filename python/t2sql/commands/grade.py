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
from typing import Any, Iterator

from t2sql._grader import (
    COLUMN_ORDERS,
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
from t2sql.atomic import atomic_write
from t2sql.grading import (
    OUTCOMES,
    add_grade_memory_arguments,
    check_method,
    grade,
    grade_memory_from_args,
    grade_memory_setting,
    method_arg,
    seconds_arg,
    workers_arg,
)
from t2sql.progress import Progress
from t2sql.tasks import database_path, sample_dir


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
    p.add_argument("--out", help="JSONL output, one line per non-blank input line, in order (with --pairs)")
    p.add_argument("--semantics", default="multiset", type=_method_arg,
                   metavar="|".join((*METHODS, "task")),
                   help="how results are compared (default multiset; list = ordered); task: each --pairs "
                        'line\'s own "grading_method" (a line without one: multiset)')
    p.add_argument("--column-order", default="strict", choices=COLUMN_ORDERS,
                   help="ignore: compare each row as the multiset of its cells (default strict)")
    p.add_argument("--float-digits", type=_float_digits, default=12, metavar="N|exact",
                   help="significant digits for non-integral REALs (default 12), or 'exact'")
    p.add_argument("--timeout-s", type=seconds_arg, default=30.0, help="per-query timeout in seconds")
    p.add_argument("--concurrency", type=workers_arg, default=os.cpu_count() or 1, metavar="N",
                   help="with --pairs: grade on N workers (default: the machine's cores, here "
                        f"{os.cpu_count() or 1}); the output is the same whatever N is")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="with --pairs: keep gold digests here across runs (default: in memory for this run)")
    add_grade_memory_arguments(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


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
    if args.semantics == "task":
        return _fail("--semantics task takes each --pairs line's grading_method; a single grade names its method")
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
        v = grade(db_path, args.pred, args.gold, args.semantics, args.float_digits, args.timeout_s, args.column_order)
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
        "semantics": v.semantics,
        "pred_rows": v.pred_rows,
        "gold_rows": v.gold_rows,
        "elapsed_s": round(v.elapsed_s, 6),
    }


def _read_pairs(path: str) -> Iterator[tuple[int, dict | None, str]]:
    """Yield (line number, row or None, problem) for each non-blank line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield lineno, None, "not UTF-8"
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                yield lineno, None, f"not JSON ({e.msg})"
                continue
            if not isinstance(row, dict):
                yield lineno, None, "not a JSON object"
                continue
            missing = [k for k in ("id", "db_id", "pred", "gold") if k not in row]
            # Only grading_method may be null (the --semantics task default); null SQL is no SQL.
            bad = [k for k in ("db_id", "pred", "gold", "grading_method")
                   if k in row and not isinstance(row[k], str) and not (k == "grading_method" and row[k] is None)]
            if missing or bad:
                yield lineno, row, (f"missing {missing}" if missing else f"not strings: {bad}")
                continue
            if row.get("grading_method") is not None:
                try:
                    row["grading_method"] = check_method(row["grading_method"])
                except ValueError as e:
                    yield lineno, row, f"grading_method: {e}"
                    continue
            yield lineno, row, ""


def _check_pair_files(args: argparse.Namespace) -> str | None:
    """What is wrong with --pairs / --db-root / --out before any grading starts, if anything."""
    pairs, out, root = Path(args.pairs), Path(args.out), Path(args.db_root)
    if not pairs.is_file():
        return f"no such pairs file: {pairs}" if not pairs.exists() else f"--pairs {pairs} is not a file"
    if not os.access(pairs, os.R_OK):
        return f"cannot read --pairs {pairs}: permission denied"
    if not root.is_dir():
        return f"--db-root {root} is not a directory (expected DIR/<db_id>/<db_id>.sqlite)"
    if out.is_dir():
        return f"--out {out} is a directory; pass a file name such as {out / 'verdicts.jsonl'}"
    if out.exists() and os.path.samefile(out, pairs):
        return f"--out {out} is the --pairs file itself; write the verdicts to another file"
    parent = out.parent if str(out.parent) else Path(".")
    if parent.exists() and not os.access(parent, os.W_OK):
        return f"cannot write --out {out}: {parent} is not writable"
    return None


def _grade_pairs(args: argparse.Namespace) -> int:
    problem = _check_pair_files(args) or _check_cache_dir(args.cache_dir)
    if problem:
        return _fail(problem)
    with open(args.pairs, "rb") as f:
        total = sum(1 for line in f if line.strip())
    from t2sql.serving.grader import Grader  # lazily: a single grade stays light

    memory_mb, tmp_dir = grade_memory_from_args(args)  # checked by run()
    try:
        grader = Grader(concurrency=args.concurrency, cache_dir=args.cache_dir, grade_timeout_s=args.timeout_s,
                        grade_memory_mb=memory_mb, tmp_dir=tmp_dir)
    except (T2sqlError, OSError) as e:
        return _fail(f"cannot use --cache-dir {args.cache_dir}: {e}")
    batch = _PairsBatch(args, grader)
    out_path = Path(args.out)
    started = time.perf_counter()
    # Written to a temporary file and renamed at the end: a crash or an interrupt never leaves a partial output.
    try:
        with grader, atomic_write(out_path) as out, Progress(total, "grading") as bar:
            asyncio.run(batch.grade_all(out, bar))
    except KeyboardInterrupt:
        return _fail(f"interrupted after {batch.lines} of {total} lines; --out {out_path} was not written")
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
        print(json.dumps(summary))
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


_GOLD_READY = object()  # a gold whose digest the Grader holds


class _PairsBatch:
    """The lines of a --pairs file graded on the Grader's workers, written in input order.

    The file is read as the output is written: at most `in_flight` lines are being graded at once
    (enough to keep every worker busy while some lines wait for their gold), and at most `buffered`
    lines are read ahead of the first one not yet written (so one slow line does not idle the other
    workers, and a file of millions of lines costs the memory of a few thousand). Every line is
    graded as t2sql.grade grades it (one attempt, no retry of a timeout); each distinct (database,
    gold, spec) gold is run once, by the Grader, and a gold that failed is not run again for the
    lines that share it."""

    def __init__(self, args: argparse.Namespace, grader) -> None:
        self.args = args
        self.grader = grader
        self.in_flight = max(256, 32 * grader.concurrency)
        self.buffered = max(10_000, 4 * self.in_flight)
        self.counts: Counter[str] = Counter()
        self.ungraded = 0  # lines with no verdict: malformed, or their database could not be opened
        self.lines = 0  # written so far
        self._running = 0
        self._slot: asyncio.Event | None = None
        self._databases: dict[str, str | DatabaseError] = {}
        self._specs: dict[tuple[str, str], GradeSpec] = {}
        # (db_id, gold SQL, spec) -> the Grader's answer in flight, _GOLD_READY, or the gold's failure
        self._golds: dict[tuple[str, str, GradeSpec], Any] = {}

    async def grade_all(self, out, bar: Progress) -> None:
        # (line number, the row if it is a bad line, its problem, the grading task or None), in input order
        pending: deque = deque()
        self._slot = asyncio.Event()
        try:
            for lineno, row, problem in _read_pairs(self.args.pairs):
                while self._running >= self.in_flight:
                    self._slot.clear()
                    await self._slot.wait()
                    self._write_done(pending, out, bar)
                while len(pending) >= self.buffered:  # the first line is slow: wait for it
                    await pending[0][3]
                    self._write_done(pending, out, bar)
                if problem:
                    pending.append((lineno, row, problem, None))
                else:
                    task = asyncio.ensure_future(self._grade_row(row))
                    self._running += 1
                    task.add_done_callback(self._finished)
                    pending.append((lineno, None, "", task))
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
            lineno, row, problem, task = pending.popleft()
            if task is None:
                print(f"{self.args.pairs}:{lineno}: not graded: {problem}", file=sys.stderr)
                line_id = row.get("id") if isinstance(row, dict) else None
                record, graded = {"id": line_id, "line": lineno, "outcome": BAD_INPUT, "detail": problem}, False
            else:
                record, graded = task.result()  # a bug in grading raises here, and stops the run
                record["line"] = lineno
            self.ungraded += not graded
            self.counts[record["outcome"]] += 1
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.lines += 1
            bar.advance()

    def _database(self, db_id: str) -> str | DatabaseError:
        """The file of `db_id`, opened once to see that it is a database (the first line on it), or why not."""
        found = self._databases.get(db_id)
        if found is None:
            path = str(database_path(self.args.db_root, db_id))
            try:
                Database(path).close()
                found = path
            except DatabaseError as e:
                found = e
            self._databases[db_id] = found
        return found

    def _spec(self, method: str, gold: str) -> GradeSpec:
        spec = self._specs.get((method, gold))
        if spec is None:
            a = self.args
            spec = GradeSpec(method, gold_sql=gold, float_digits=a.float_digits, column_order=a.column_order,
                             timeout_s=a.timeout_s)
            if len(self._specs) < 100_000:  # the distinct golds of a big file need not all stay
                self._specs[(method, gold)] = spec
        return spec

    async def _gold(self, db: str, db_id: str, gold_sql: str, spec: GradeSpec):
        """None once this gold's digest is in the Grader's cache, or its failure (a GoldResult).

        The first line of each gold asks the Grader for it; the lines that come while it runs wait
        for that one answer, and a failure is remembered for the rest of the run (the Grader forgets
        a failed gold the moment it is done, so lines arriving just then would run it again)."""
        key = (db_id, gold_sql, spec)
        state = self._golds.get(key)
        if state is None:
            state = self._golds[key] = asyncio.ensure_future(self.grader.gold(db, gold_sql, spec))
        if isinstance(state, asyncio.Future):
            gold = await asyncio.shield(state)  # one line's cancellation must not fail the others'
            state = self._golds[key] = _GOLD_READY if gold.ok else gold  # the digest itself stays in the Grader
        return None if state is _GOLD_READY else state

    async def _grade_row(self, row: dict) -> tuple[dict, bool]:
        """A pair's record, and whether it got a verdict (False: its database could not be read)."""
        db = self._database(row["db_id"])
        if isinstance(db, DatabaseError):
            return {"id": row["id"], "outcome": "gold_error", "detail": f"database: {db}"}, False
        method = self.args.semantics
        if method == "task":
            method = row.get("grading_method") or "multiset"
        try:
            spec = self._spec(method, row["gold"])
            gold = await self._gold(db, row["db_id"], row["gold"], spec)
            if gold is not None:  # the gold failed: every line that shares it says so, as t2sql.grade would
                verdict = (gold.outcome, gold.detail, spec.method)
            else:
                r = await self.grader.grade(db, row["pred"], row["gold"], spec, retry=False)
                verdict = (r.outcome, r.detail, r.semantics)
        except T2sqlError as e:  # a broken or changed database file mid-run: report, go on
            return {"id": row["id"], "outcome": "gold_error", "detail": str(e)}, False
        outcome, detail, semantics = verdict
        return {"id": row["id"], "outcome": outcome, "detail": detail, "semantics": semantics}, True
