"""Measuring the equivalence check (`t2sql equivalence --measure`): false positives (MUTATIONS) and equivalent
rewrites (REWRITES) derived from every gold, kept when they match on the real database, each refuted or not;
both errors per kind. docs/recipe_extras.md, "Equivalence check" (Measured)."""

from __future__ import annotations

import concurrent.futures
import io
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import t2sql
from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
from t2sql.equivalence.measure.derive import MUTATIONS, REWRITES, derive_mutations, derive_rewrites
from t2sql.equivalence.measure.labels import label
from t2sql.equivalence.mine_ahead import mine_ahead
from t2sql.progress import Progress
from t2sql.tasks import database_path

# Issue 37's training step, for the check's CPU per step: 64 prompts x 16 samples (the recipe's rollout),
# each correct answer checked once, in a step of 8 minutes on one node.
STEP_PROMPTS = 64  # a step's prompts; each prompt's samples share its gold
STEP_CHECKS = STEP_PROMPTS * 16
STEP_S = 8 * 60

__all__ = ["MUTATIONS", "REWRITES", "derive_mutations", "derive_rewrites", "format_measurement", "label", "measure"]

@dataclass
class MeasureRow:
    kind: str  # "false_positive" | "equivalent"
    category: str
    candidates: int = 0  # derived
    kept: int = 0  # match on the real database (the pairs measured)
    refuted: int = 0
    skipped: int = 0  # check skipped (no informative database, ...)
    skip_reasons: dict[str, int] = field(default_factory=dict)  # skipped, by reason
    by_db: dict[str, list[int]] = field(default_factory=dict)  # db_id -> [pairs, refuted]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

def measure(rows: list[dict[str, Any]], db_root: str, config: EquivalenceConfig, *, concurrency: int = 2,
            examples: int = 3, progress: bool = True, checker: EquivalenceChecker | None = None) -> dict[str, Any]:
    """Derive the pairs from every gold in `rows` (BIRD questions), keep those that match on the real
    database, run the check on each; per kind: pairs, refuted, skipped."""
    local = threading.local()
    own = checker is None
    checker = checker if checker is not None else EquivalenceChecker()

    def original(path: str):
        dbs = getattr(local, "dbs", None)
        if dbs is None:
            dbs = local.dbs = {}
        if path not in dbs:
            dbs[path] = t2sql.Database(path)
        return dbs[path]

    table: dict[tuple[str, str], MeasureRow] = {}
    for cat in MUTATIONS:
        table[("false_positive", cat)] = MeasureRow("false_positive", cat)
    for cat in REWRITES:
        table[("equivalent", cat)] = MeasureRow("equivalent", cat)
    refuted_equivalent: list[dict[str, Any]] = []
    not_matching: list[dict[str, Any]] = []
    samples: dict[str, list[dict[str, Any]]] = {}
    missed: dict[str, list[dict[str, Any]]] = {}
    lock = threading.Lock()
    check_times: list[float] = []
    check_cpu: list[float] = []  # CPU seconds of each check's own thread (the check runs in the caller's)

    failed: list[dict[str, Any]] = []

    def one(row: dict[str, Any]) -> None:
        try:
            measure_row(row)
        except Exception as e:  # one question's trouble is reported, the measurement goes on
            with lock:
                failed.append({"question_id": row.get("question_id"), "db_id": row.get("db_id"),
                               "error": f"{type(e).__name__}: {e}"[:300]})

    def measure_row(row: dict[str, Any]) -> None:
        db_path = str(database_path(db_root, row["db_id"]))
        gold = row["SQL"]
        db = original(db_path)
        inv = checker.invariants.get(db_path)
        real = checker.real_rows(db_path, inv)
        try:
            n = db.count_rows(gold, config.spec.timeout_s)
        except t2sql.T2sqlError:
            n = None
        pairs = []
        for cat, sql in derive_mutations(gold, n, inv, real.rows):
            if label(cat, gold, sql, inv, real.rows) == "equivalent":
                pairs.append(("equivalent", "derived_equivalent", sql, cat))
            else:
                pairs.append(("false_positive", cat, sql, cat))
        pairs += [("equivalent", c, s, c) for c, s in derive_rewrites(gold, inv)]
        for kind, cat, pred, origin in pairs:
            v = db.grade(pred, gold, config.spec)
            entry = {"question_id": row.get("question_id"), "db_id": row["db_id"], "kind": origin,
                     "gold": gold, "pred": pred}
            with lock:
                table[(kind, cat)].candidates += 1
            if v.outcome != "match":
                if kind == "equivalent" and cat != "derived_equivalent":
                    with lock:
                        not_matching.append({**entry, "outcome": v.outcome, "detail": v.detail})
                continue
            cpu = time.thread_time()
            report = checker.check_sync(db_path, pred, gold, config)
            cpu = time.thread_time() - cpu
            with lock:
                check_times.append(report.elapsed_s)
                check_cpu.append(cpu)
                r = table[(kind, cat)]
                r.kept += 1
                per_db = r.by_db.setdefault(row["db_id"], [0, 0])
                per_db[0] += 1
                per_db[1] += int(report.refuted)
                if report.skipped_reason:
                    r.skipped += 1
                    r.skip_reasons[report.skipped_reason] = r.skip_reasons.get(report.skipped_reason, 0) + 1
                if report.refuted:
                    r.refuted += 1
                    found = {**entry, "witness": report.witness.to_text() if report.witness else ""}
                    if kind == "equivalent":
                        refuted_equivalent.append(found)
                    elif len(samples.setdefault(cat, [])) < examples:
                        samples[cat].append(found)
                elif kind == "false_positive" and len(missed.setdefault(cat, [])) < examples:
                    missed[cat].append({**entry, "skipped": report.skipped_reason or "",
                                        "detail": report.detail})

    started = time.perf_counter()
    mined = mine_ahead({str(database_path(db_root, r["db_id"])) for r in rows}, checker.invariants,
                       concurrency=concurrency, progress=progress)
    try:
        with Progress(len(rows), "equivalence", stream=None if progress else io.StringIO()) as bar:
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                for fut in concurrent.futures.as_completed([pool.submit(one, r) for r in rows]):
                    fut.result()
                    bar.advance()
    finally:
        stats = {"suite_builds": checker.suite_builds, "suite_build_s": round(checker.suite_build_s, 2)}
        if own:
            checker.close()
    return {
        "config": config.to_dict(),
        "questions": len(rows),
        "rows": [r.to_dict() for r in table.values()],
        "refuted_equivalent": refuted_equivalent,
        "rewrites_not_matching": not_matching,
        "questions_failed": failed,
        "examples_refuted": samples,
        "examples_missed": missed,
        "suites": stats,
        "mining": {"databases": mined.databases, "mined": mined.mined, "elapsed_s": round(mined.elapsed_s, 2),
                   "unsupported": mined.unsupported, "failed": mined.failed},
        "check_s": quantiles(check_times),
        "step": step_cost(check_cpu),
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def step_cost(cpu: list[float]) -> dict[str, float]:
    """The check's CPU in one training step (STEP_CHECKS checks at the mean measured here): seconds of one
    core, and their share of the step's STEP_S on one core (less on a node of many)."""
    mean = sum(cpu) / len(cpu) if cpu else 0.0
    return {"checks": STEP_CHECKS, "cpu_mean_s": round(mean, 5), "cpu_s": round(mean * STEP_CHECKS, 2),
            "share_of_one_core": round(mean * STEP_CHECKS / STEP_S, 4)}

def step_cost_as_run(first: list[float], cached: list[float]) -> dict[str, float]:
    """step_cost for a step as it runs: each prompt's first check builds its gold's small databases (CPU
    `first`), its other samples find them cached (CPU `cached`)."""
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    cpu = STEP_PROMPTS * mean(first) + (STEP_CHECKS - STEP_PROMPTS) * mean(cached)
    return {"checks": STEP_CHECKS, "cpu_s": round(cpu, 2), "share_of_one_core": round(cpu / STEP_S, 4)}

def quantiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"median": 0.0, "p95": 0.0, "max": 0.0}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median": round(pick(0.5), 4), "p95": round(pick(0.95), 4), "max": round(ordered[-1], 4)}

def format_measurement(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [f"equivalence check on {result['questions']} gold queries (suite of {c['suite_size']}, seed "
             f"{c['seed']}, {result['elapsed_s']}s)", ""]
    head = f"{'side':<15} {'kind':<22} {'derived':>7} {'pairs':>6} {'refuted':>8} {'share':>6} {'skipped':>8}"
    lines += [head, "-" * len(head)]
    totals: dict[str, list[int]] = {}
    for r in result["rows"]:
        share = f"{r['refuted'] / r['kept']:.1%}" if r["kept"] else "-"
        lines.append(f"{r['kind']:<15} {r['category']:<22} {r['candidates']:>7} {r['kept']:>6} {r['refuted']:>8} "
                     f"{share:>6} {r['skipped']:>8}")
        t = totals.setdefault(r["kind"], [0, 0, 0])
        t[0] += r["candidates"]
        t[1] += r["kept"]
        t[2] += r["refuted"]
    lines.append("-" * len(head))
    reasons: dict[str, int] = {}
    for r in result["rows"]:
        for why, n in r.get("skip_reasons", {}).items():
            reasons[why] = reasons.get(why, 0) + n
    for kind, (cand, kept, refuted) in totals.items():
        share = f"{refuted / kept:.1%}" if kept else "-"
        lines.append(f"{kind:<15} {'all':<22} {cand:>7} {kept:>6} {refuted:>8} {share:>6}")
    if reasons:
        lines.append("skipped: " + ", ".join(f"{why} {n}" for why, n in sorted(reasons.items())))
    t = result["check_s"]
    lines.append("")
    lines.append(f"time per check: median {t['median'] * 1000:.1f} ms, p95 {t['p95'] * 1000:.1f} ms, max "
                 f"{t['max']:.2f} s; suites built: {result['suites']['suite_builds']} in "
                 f"{result['suites']['suite_build_s']} s")
    st = result["step"]
    lines.append(f"CPU per check: mean {st['cpu_mean_s'] * 1000:.1f} ms; a training step's {st['checks']} checks: "
                 f"{st['cpu_s']:.1f} s of one core, {st['share_of_one_core']:.1%} of one core's {STEP_S // 60} minutes")
    lines.append(f"rewrites that did not match on the real database: {len(result['rewrites_not_matching'])}")
    m = result["mining"]
    lines.append(f"mining ahead: {m['mined']} of {m['databases']} databases mined in {m['elapsed_s']} s"
                 + "".join(f"; {p} unsupported: {why}" for p, why in m["unsupported"].items()))
    for item in result.get("questions_failed", [])[:10]:
        lines.append(f"QUESTION NOT MEASURED q{item['question_id']} ({item['db_id']}): {item['error']}")
    for item in result["refuted_equivalent"][:10]:
        lines.append(f"REFUTED EQUIVALENT q{item['question_id']} ({item['kind']}): {item['pred']}")
    return "\n".join(lines)
