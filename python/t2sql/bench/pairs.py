"""`t2sql bench pairs`: batch grading (`t2sql grade --pairs`) against BIRD's rule in plain Python, on a workload of
about 30 predictions per gold like those text-to-SQL systems write, each run in a fresh process and timed whole;
verdicts compared line by line. docs/benchmarks.md, "Batch grading: `t2sql grade --pairs`"."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from t2sql._grader import GRADE_DEFAULTS
from t2sql.atomic import OutputFile, first_line
from t2sql.jsonl import loads_or_none

# BIRD's rule as its evaluator applies it, in a child of its own (only the standard library).
BIRD_RULE = r"""
import json, sqlite3, sys, time
pairs, root, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
connections = {}

def fetch(con, sql):
    deadline = time.monotonic() + timeout_s
    con.set_progress_handler(lambda: time.monotonic() > deadline, 10000)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.set_progress_handler(None, 0)

def verdict(con, pred, gold):
    results = []
    for sql, failed in ((pred, "pred_error"), (gold, "gold_error")):
        try:
            results.append(fetch(con, sql))
        except sqlite3.OperationalError as e:
            return "timeout" if "interrupted" in str(e) else failed
        except Exception:
            return failed
    return "match" if set(results[0]) == set(results[1]) else "mismatch"

with open(pairs, encoding="utf-8") as f:
    for line in f:
        p = json.loads(line)
        con = connections.get(p["db_id"])
        if con is None:
            path = f"{root}/{p['db_id']}/{p['db_id']}.sqlite"
            con = connections[p["db_id"]] = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        sys.stdout.write(json.dumps(verdict(con, p["pred"], p["gold"])) + "\n")
"""
BIRD_VERDICTS = ("match", "mismatch", "pred_error", "gold_error", "timeout")  # what BIRD_RULE prints

RUNS = ("bird_python", "t2sql_n1", "t2sql_nN")
TIMEOUT_S = GRADE_DEFAULTS["timeout_s"]  # per query, both sides (t2sql grade's default)


# ------------------------------------------------------------------ the workload


def _mask(sql: str) -> str:
    """`sql` with quoted text blanked to 'x' and everything inside parentheses to '_', same length:
    a regex on the mask finds only the outermost query's keywords."""
    out, depth, quote = [], 0, None
    for ch in sql:
        if quote:
            out.append("x")
            if ch == quote:
                quote = None
            continue
        if ch in "'\"`[":
            quote = "]" if ch == "[" else ch
            out.append("x")
        elif ch == "(":
            depth += 1
            out.append("_")
        elif ch == ")":
            depth = max(0, depth - 1)
            out.append("_")
        else:
            out.append("_" if depth else ch)
    return "".join(out)


def _select_list(sql: str) -> tuple[int, int] | None:
    """Where the outermost SELECT's column list is ((start, end) in `sql`), if it has a FROM."""
    mask = _mask(sql)
    head = re.match(r"\s*SELECT\s+(DISTINCT\s+)?", mask, re.I)
    if not head:
        return None
    found = re.search(r"\bFROM\b", mask[head.end():], re.I)
    return (head.end(), head.end() + found.start()) if found else None


def _columns(sql: str, span: tuple[int, int]) -> list[str]:
    text, mask = sql[span[0]:span[1]], _mask(sql)[span[0]:span[1]]
    cuts = [i for i, ch in enumerate(mask) if ch == ","]
    bounds = [0, *(c + 1 for c in cuts)], [*cuts, len(text)]
    return [text[a:b].strip() for a, b in zip(*bounds)]


def _replace_columns(sql: str, span: tuple[int, int], columns: list[str]) -> str:
    return sql[:span[0]] + ", ".join(columns) + " " + sql[span[1]:]


def variants(sql: str) -> dict[str, str]:
    """The gold's own near misses (and near hits), by kind."""
    out: dict[str, str] = {"gold": sql}
    body = sql.strip().rstrip(";").strip()
    mask = _mask(body)
    if re.match(r"\s*SELECT\s+(?!DISTINCT\b)", mask, re.I):
        out["distinct"] = re.sub(r"^\s*SELECT\s+", "SELECT DISTINCT ", body, count=1, flags=re.I)
    if not re.search(r"\bLIMIT\b", mask, re.I):
        out["limit_1"] = body + " LIMIT 1"
        out["limit_5"] = body + " LIMIT 5"
    order = list(re.finditer(r"\bORDER\s+BY\b", mask, re.I))
    if order:
        start = order[-1].start()
        limit = re.search(r"\bLIMIT\b", mask[start:], re.I)
        out["no_order_by"] = body[:start].rstrip() + (" " + body[start + limit.start():] if limit else "")
    span = _select_list(body)
    if span:
        cols = _columns(body, span)
        if len(cols) > 1:
            out["columns_reversed"] = _replace_columns(body, span, cols[::-1])
            out["first_column_only"] = _replace_columns(body, span, cols[:1])
        out["column_twice"] = _replace_columns(body, span, [*cols, cols[0]])
    out["subquery"] = f"SELECT * FROM ({body})"
    out["count"] = f"SELECT COUNT(*) FROM ({body})"
    out["empty"] = f"SELECT * FROM ({body}) WHERE 0"
    out["semicolon"] = body + ";"
    number = re.search(r"(?<![\w.])(\d+)(?![\w.])", mask)
    if number:
        out["constant_changed"] = body[:number.start()] + str(int(number.group(1)) + 1) + body[number.end():]
    where = re.search(r"\bWHERE\b", mask, re.I)  # a filter's comparison, not a join's
    comparison = re.search(r"(?<![<>!=])=(?!=)", mask[where.end():]) if where else None
    if where and comparison:
        start, end = where.end() + comparison.start(), where.end() + comparison.end()
        out["equals_negated"] = body[:start] + "<>" + body[end:]
    out["syntax_error"] = re.sub(r"^\s*SELECT\b", "SELEC", body, count=1, flags=re.I)
    out["truncated"] = body[: max(1, len(body) // 2)]
    out["missing_table"] = "SELECT * FROM no_such_table_t2sql_bench"
    out["two_statements"] = f"{body}; SELECT 1"
    return out


def build_pairs(questions: list[dict], per_question: int, seed: int) -> list[dict]:
    """About `per_question` predictions for each question: its variants, then other questions'
    golds on the same database (drawn with `seed`) up to the count."""
    by_db: dict[str, list[dict]] = {}
    for q in questions:
        by_db.setdefault(q["db_id"], []).append(q)
    pairs = []
    for i, q in enumerate(questions):
        rng = random.Random(f"{seed}:{i}")
        preds = list(variants(q["SQL"]).items())[:per_question]
        others = [o for o in by_db[q["db_id"]] if o is not q and o["SQL"] != q["SQL"]]
        for o in rng.sample(others, min(len(others), max(0, per_question - len(preds)))):
            preds.append((f"other_gold:{o['question_id']}", o["SQL"]))
        for kind, pred in preds:
            pairs.append({"id": f"{q['question_id']}/{kind}", "db_id": q["db_id"], "pred": pred, "gold": q["SQL"]})
    return pairs


def write_pairs(pairs: list[dict], output: OutputFile) -> None:
    with output.open() as f:
        for p in pairs:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")


# ------------------------------------------------------------------ the files it writes

PAIRS_FILE = "pairs.jsonl"
BIRD_FILE = "bird.jsonl"


def verdicts_file(workers: int) -> str:
    """t2sql grade's --out of the run on `workers` workers."""
    return f"t2sql_n{workers}.jsonl"


def is_bench_pairs(head: bytes) -> bool:
    """Whether a file that begins with `head` is a workload this bench wrote: its first line a pair whose id
    is "<question_id>/gold" and whose prediction is the gold itself (build_pairs' first pair)."""
    pair = loads_or_none(first_line(head))
    return (isinstance(pair, dict) and set(pair) == {"id", "db_id", "pred", "gold"} and isinstance(pair["id"], str)
            and pair["id"].endswith("/gold") and pair["pred"] == pair["gold"])


def is_bird_verdicts(head: bytes) -> bool:
    """Whether a file that begins with `head` is BIRD_RULE's output: its first line one of its verdicts."""
    return loads_or_none(first_line(head)) in BIRD_VERDICTS


def own_outputs(work: Path, force: bool) -> dict[str, OutputFile]:
    """The workload and BIRD's verdicts under t2sql.atomic's rule (t2sql grade applies it to its --out)."""
    instead = "choose another --work-dir"
    return {PAIRS_FILE: OutputFile(work / PAIRS_FILE, flag="--work-dir's", kind="a workload of t2sql bench pairs",
                                   own=is_bench_pairs, force=force, instead=instead),
            BIRD_FILE: OutputFile(work / BIRD_FILE, flag="--work-dir's", kind="BIRD verdicts of t2sql bench pairs",
                                  own=is_bird_verdicts, force=force, instead=instead)}


# ------------------------------------------------------------------ the runs


def _timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return time.perf_counter() - started, proc


def _run(name: str, pairs: Path, root: Path, work: Path, workers: int, outputs: dict[str, OutputFile],
         force: bool) -> tuple[float, dict | None]:
    if name == "bird_python":
        seconds, proc = _timed([sys.executable, "-c", BIRD_RULE, str(pairs), str(root), str(TIMEOUT_S)])
        if proc.returncode != 0:
            raise RuntimeError(f"BIRD's rule failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
        outputs[BIRD_FILE].write_bytes(proc.stdout.encode())
        return seconds, None
    n = 1 if name == "t2sql_n1" else workers
    seconds, proc = _timed([sys.executable, "-m", "t2sql.cli", "grade", "--pairs", str(pairs), "--db-root", str(root),
                            "--out", str(work / verdicts_file(n)), "--method", "set", "--float-digits", "exact",
                            "--timeout-s", str(TIMEOUT_S), "--concurrency", str(n), "--json",
                            *(["--force"] if force else [])])
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"t2sql grade --pairs failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    return seconds, json.loads(proc.stdout)


def agreement(bird: list[str], records: list[dict], ids: list[str]) -> dict[str, Any]:
    """Line by line: does t2sql's match/non-match say what BIRD's rule says?"""
    counts = {"agree": 0, "disagree": 0, "agree_match": 0, "agree_non_match": 0,
              "t2sql_match_bird_not": 0, "bird_match_t2sql_not": 0, "bird_errors_or_timeouts": 0}
    examples = []
    for line_id, b, r in zip(ids, bird, records):
        counts["bird_errors_or_timeouts"] += b not in ("match", "mismatch")
        t_match, b_match = r["outcome"] == "match", b == "match"
        if t_match == b_match:
            counts["agree"] += 1
            counts["agree_match" if t_match else "agree_non_match"] += 1
        else:
            counts["disagree"] += 1
            counts["t2sql_match_bird_not" if t_match else "bird_match_t2sql_not"] += 1
            if len(examples) < 10:
                examples.append({"id": line_id, "bird": b, "t2sql": r["outcome"], "detail": r["detail"]})
    counts["examples"] = examples
    return counts


def bench_pairs(questions_file: Path, db_root: Path, work: Path, *, per_question: int = 30, seed: int = 0,
                workers: int = 2, repeat: int = 1, limit: int | None = None, force: bool = False) -> dict[str, Any]:
    """`work`: an existing folder; force: replace files there that are not this bench's (t2sql.atomic)."""
    questions = json.loads(questions_file.read_text(encoding="utf-8"))[:limit]
    pairs = build_pairs(questions, per_question, seed)
    outputs = own_outputs(work, force)
    pairs_file = outputs[PAIRS_FILE].path
    write_pairs(pairs, outputs[PAIRS_FILE])
    ids = [p["id"] for p in pairs]
    golds = {(p["db_id"], p["gold"]) for p in pairs}
    from t2sql.bench.serving import effective_cores  # lazily: only this suite's own process needs it

    cores_before = effective_cores(workers)
    times: dict[str, list[float]] = {name: [] for name in RUNS}
    summaries: dict[str, dict] = {}
    for _ in range(repeat):  # round-robin: a noisy moment on a shared machine hits every run alike
        for name in RUNS:
            print(f"[bench] {name} on {len(pairs)} pairs", file=sys.stderr)
            seconds, summary = _run(name, pairs_file, db_root, work, workers, outputs, force)
            times[name].append(seconds)
            if summary is not None:
                summaries[name] = summary
    bird = [json.loads(line) for line in (work / BIRD_FILE).read_text().splitlines()]
    verdicts = {n: (work / verdicts_file(n)).read_bytes() for n in (1, workers)}
    records = [json.loads(line) for line in verdicts[workers].decode().splitlines()]
    best = {name: min(ts) for name, ts in times.items()}
    runs = {}
    for name in RUNS:
        entry: dict[str, Any] = {"seconds": round(best[name], 3), "pairs_per_s": round(len(pairs) / best[name], 1)}
        if name in summaries:
            entry["concurrency"] = summaries[name]["concurrency"]
            entry["golds_computed"] = summaries[name]["golds"]["computed"]
        runs[name] = entry
    return {
        "questions": len(questions),
        "databases": len({q["db_id"] for q in questions}),
        "pairs": len(pairs),
        "distinct_golds": len(golds),
        "workers": workers,
        "cores": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2),
        # A pure-CPU job alone vs in `workers` processes at once, before and after: what this machine
        # gave right then (on a shared VM it caps the 1-to-N ratio).
        "effective_cores": [cores_before, effective_cores(workers)],
        "repeat": repeat,
        "pairs_file": str(pairs_file),
        "runs": runs,
        "ratios": {"bird_over_t2sql_nN": round(best["bird_python"] / best["t2sql_nN"], 2),
                   "t2sql_n1_over_nN": round(best["t2sql_n1"] / best["t2sql_nN"], 2)},
        "same_records_at_1_and_N": verdicts[1] == verdicts[workers],
        "agreement": agreement(bird, records, ids),
    }


def format_pairs(r: dict[str, Any]) -> str:
    n = r["workers"]
    labels = {"bird_python": "BIRD's rule, Python sqlite3 + set, sequential",
              "t2sql_n1": "t2sql grade --pairs --concurrency 1",
              "t2sql_nN": f"t2sql grade --pairs --concurrency {n}"}
    lines = [f"t2sql bench pairs: {r['pairs']} pairs ({r['questions']} questions on {r['databases']} database(s), "
             f"{r['distinct_golds']} distinct golds), the set method, exact floats; {r['cores']} cores; "
             f"each run in a fresh process, best of {r['repeat']}",
             f"machine: effective cores {r['effective_cores'][0]} before, {r['effective_cores'][1]} after "
             f"({n} pure-CPU processes at once vs one alone; this caps the 1-to-{n} ratio)",
             "",
             f"| {'run':<46} | {'seconds':>8} | {'pairs/s':>8} | {'golds run':>9} |",
             f"|{'-' * 48}|{'-' * 9}:|{'-' * 9}:|{'-' * 10}:|"]
    for name, label in labels.items():
        row = r["runs"][name]
        golds = row.get("golds_computed", r["pairs"])  # BIRD's rule runs the gold on every line
        lines.append(f"| {label:<46} | {row['seconds']:>8.2f} | {row['pairs_per_s']:>8.1f} | {golds:>9} |")
    ratios = r["ratios"]
    lines.append("")
    lines.append(f"BIRD's rule / t2sql at {n} workers: {ratios['bird_over_t2sql_nN']:.2f}x (target >= 3); "
                 f"1 worker / {n} workers: {ratios['t2sql_n1_over_nN']:.2f}x (target >= 1.8)")
    lines.append(f"records identical at 1 and {n} workers: {'yes' if r['same_records_at_1_and_N'] else 'NO'}")
    a = r["agreement"]
    lines.append(f"verdicts vs BIRD's rule: {a['agree']} agree ({a['agree_match']} match, {a['agree_non_match']} "
                 f"non-match), {a['disagree']} disagree ({a['t2sql_match_bird_not']} t2sql match only, "
                 f"{a['bird_match_t2sql_not']} BIRD match only); BIRD's rule erred or timed out on "
                 f"{a['bird_errors_or_timeouts']}")
    for e in a["examples"]:
        lines.append(f"  {e['id']}: BIRD {e['bird']}, t2sql {e['t2sql']} ({e['detail']})")
    return "\n".join(lines)
