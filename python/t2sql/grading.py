"""`t2sql.grade` and the `t2sql grade` command: compare predicted SQL with gold SQL.

Value equality, the digests and the safety policy live in the Rust core (grader_rs); this
module only converts arguments and reads/writes files.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

from t2sql._grader import Database, DatabaseError, T2sqlError, Verdict
from t2sql.atomic import atomic_write

OUTCOMES = ("match", "mismatch", "pred_error", "pred_timeout", "unsafe", "gold_error", "gold_timeout")


def grade(
    db: Database | str | os.PathLike,
    pred_sql: str,
    gold_sql: str,
    semantics: str = "multiset",
    float_digits: int | None = 12,
    timeout_s: float = 30.0,
) -> Verdict:
    """Grade `pred_sql` against `gold_sql` on `db` (a path or an open Database).

    semantics: "multiset" (default), "ordered", "set" (BIRD's metric) or "auto" (ordered when
    the gold's outermost query has ORDER BY). float_digits: significant digits non-integral
    REALs are rounded to before comparison, or None for exact. Each query gets `timeout_s`.
    """
    if not isinstance(db, Database):
        db = Database(os.fspath(db))
    return db.grade(pred_sql, gold_sql, semantics, float_digits, timeout_s)


# ---- command line ------------------------------------------------------------------------


def _float_digits(text: str) -> int | None:
    if text == "exact":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of digits or 'exact', got {text!r}") from None
    if not 1 <= value <= 17:
        raise argparse.ArgumentTypeError("float digits must be between 1 and 17, or 'exact'")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help="SQLite database file (single grade)")
    p.add_argument("--pred", help="predicted SQL (single grade)")
    p.add_argument("--gold", help="gold SQL (single grade)")
    p.add_argument("--pairs", help='JSONL file, one {"id","db_id","pred","gold"} per line')
    p.add_argument("--db-root", help="databases at DIR/<db_id>/<db_id>.sqlite (with --pairs)")
    p.add_argument("--out", help="JSONL output, one {id, outcome, detail} per input line (with --pairs)")
    p.add_argument("--semantics", default="multiset", choices=["multiset", "ordered", "set", "auto"])
    p.add_argument("--float-digits", type=_float_digits, default=12, metavar="N|exact",
                   help="significant digits for non-integral REALs (default 12), or 'exact'")
    p.add_argument("--timeout-s", type=float, default=30.0, help="per-query timeout in seconds")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def run(args: argparse.Namespace) -> int:
    if args.pairs:
        if not args.db_root or not args.out:
            print("t2sql grade --pairs needs --db-root DIR and --out FILE.jsonl", file=sys.stderr)
            return 2
        return _grade_pairs(args)
    missing = [f for f in ("db", "pred", "gold") if getattr(args, f) is None]
    if missing:
        print("t2sql grade needs --db, --pred and --gold (or --pairs FILE --db-root DIR --out FILE); "
              f"missing: {', '.join('--' + m for m in missing)}", file=sys.stderr)
        return 2
    try:
        v = grade(args.db, args.pred, args.gold, args.semantics, args.float_digits, args.timeout_s)
    except DatabaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(_verdict_dict(v)))
    else:
        print(f"{v.outcome}: {v.detail}")
    return 0


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
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
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
            bad = [k for k in ("db_id", "pred", "gold") if k in row and not isinstance(row[k], str)]
            if missing or bad:
                yield lineno, None, (f"missing {missing}" if missing else f"not strings: {bad}")
                continue
            yield lineno, row, ""


def _grade_pairs(args: argparse.Namespace) -> int:
    from t2sql.data import database_path
    from t2sql.progress import Progress

    if not os.path.exists(args.pairs):
        print(f"error: no such pairs file: {args.pairs}", file=sys.stderr)
        return 2
    total = sum(1 for line in open(args.pairs, encoding="utf-8", errors="replace") if line.strip())
    counts: Counter[str] = Counter()
    databases: dict[str, Database | DatabaseError] = {}
    skipped = 0
    out_path = Path(args.out)
    started = time.perf_counter()
    # Written to a temporary file and renamed at the end: a crash never leaves a partial output.
    with atomic_write(out_path) as out, Progress(total, "grading") as bar:
        for lineno, row, problem in _read_pairs(args.pairs):
            bar.advance()
            if row is None:
                print(f"{args.pairs}:{lineno}: skipped: {problem}", file=sys.stderr)
                skipped += 1
                continue
            db = databases.get(row["db_id"])
            if db is None:
                try:
                    db = Database(str(database_path(args.db_root, row["db_id"])))
                except DatabaseError as e:
                    db = e
                databases[row["db_id"]] = db
            if isinstance(db, DatabaseError):
                record = {"id": row["id"], "outcome": "gold_error", "detail": f"database: {db}"}
            else:
                try:
                    v = db.grade(row["pred"], row["gold"], args.semantics, args.float_digits, args.timeout_s)
                    record = {"id": row["id"], "outcome": v.outcome, "detail": v.detail}
                except T2sqlError as e:  # a broken database file mid-run: report, go on
                    record = {"id": row["id"], "outcome": "gold_error", "detail": str(e)}
            counts[record["outcome"]] += 1
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    elapsed = time.perf_counter() - started
    graded = sum(counts.values())
    summary = {"graded": graded, "skipped": skipped, "counts": {k: counts.get(k, 0) for k in OUTCOMES},
               "elapsed_s": round(elapsed, 3), "out": str(out_path)}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{'outcome':<14}{'count':>8}{'share':>9}")
        for k in OUTCOMES:
            n = counts.get(k, 0)
            print(f"{k:<14}{n:>8}{(n / graded if graded else 0):>9.1%}")
        print(f"{'total':<14}{graded:>8}   ({skipped} malformed lines skipped, {elapsed:.2f}s) -> {out_path}")
    return 0
