"""Measuring the equivalence check on labelled real answers (`t2sql equivalence --measure --answers FILE`): both
errors per label, `lucky_kind` and `reason`, distinct and weighted by `systems`.
docs/benchmarks.md, "The equivalence check on labelled real answers"."""

from __future__ import annotations

import concurrent.futures
import io
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator

from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
from t2sql.equivalence.measure.run import quantiles
from t2sql.grading import method_field_problem
from t2sql.jsonl import json_lines, object_problem
from t2sql.progress import Progress
from t2sql.tasks import database_path

RIGHT = ("equivalent", "equivalent_in_practice")
WRONG = ("lucky",)
LABELS = (*RIGHT, *WRONG, "ambiguous", "gold_wrong")
MAX_SYSTEMS = 1_000_000  # a weight past this is not a count of systems

@dataclass
class Share:
    """Refuted among pairs, distinct and weighted by systems."""

    refuted: int = 0
    pairs: int = 0
    refuted_weight: int = 0
    weight: int = 0

    def add(self, refuted: bool, systems: int) -> None:
        self.pairs += 1
        self.weight += systems
        if refuted:
            self.refuted += 1
            self.refuted_weight += systems

    def to_dict(self) -> dict[str, Any]:
        return {"refuted": self.refuted, "pairs": self.pairs, "refuted_weight": self.refuted_weight,
                "weight": self.weight}

    def text(self) -> str:
        def pct(a: int, b: int) -> str:
            return f"{100 * a / b:5.1f}%" if b else "    -"
        return (f"{self.refuted:4d}/{self.pairs:<4d} {pct(self.refuted, self.pairs)}   "
                f"{self.refuted_weight:4d}/{self.weight:<4d} {pct(self.refuted_weight, self.weight)}")


def read_answers(f: IO[bytes]) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, the answer or None, what is wrong with it or "") for each non-blank line."""
    for lineno, row, problem in json_lines(f):
        if problem:
            yield lineno, None, problem
            continue
        if not isinstance(row, dict):
            yield lineno, None, "not a JSON object"
            continue
        optional = ("evidence", "reason", "lucky_kind", "grading_method")
        required = ("id", "db_id", "gold", "pred", "label")
        why = object_problem(row, required, (*required[1:], *optional), optional)
        if why:
            yield lineno, row, why
            continue
        if row["label"] not in LABELS:
            yield lineno, row, f"label {row['label']!r} is not one of {', '.join(LABELS)}"
            continue
        systems = row.get("systems", 1)
        if isinstance(systems, bool) or not isinstance(systems, int) or not 1 <= systems <= MAX_SYSTEMS:
            yield lineno, row, f"systems must be a count from 1 to {MAX_SYSTEMS}, got {systems!r:.40}"
            continue
        why = method_field_problem(row)
        if why:
            yield lineno, row, why
            continue
        yield lineno, row, ""


def measure_answers(f: IO[bytes], db_root: str, config_for: Callable[[str | None], EquivalenceConfig], *,
                    concurrency: int = 2, progress: bool = True,
                    checker: EquivalenceChecker | None = None) -> dict[str, Any]:
    """The check on every labelled answer of `f` (its evidence passed on), under `config_for(the line's
    grading_method)`; both errors per label, lucky_kind and reason."""
    own = checker is None
    checker = checker if checker is not None else EquivalenceChecker()
    lock = threading.Lock()
    labels = {name: Share() for name in LABELS}
    by_db: dict[tuple[str, str], Share] = {}
    kinds: dict[str, Share] = {}
    reasons: dict[tuple[str, str], Share] = {}
    bad: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    refuted_right: list[dict[str, Any]] = []
    missed_lucky: list[dict[str, Any]] = []
    times: list[float] = []

    def one(lineno: int, row: dict[str, Any]) -> None:
        path = database_path(db_root, row["db_id"])
        if not path.is_file():
            with lock:
                bad.append({"line": lineno, "id": row.get("id"), "problem": f"no database {path}"})
            return
        try:
            config = config_for(row.get("grading_method"))
        except ValueError as e:
            with lock:
                bad.append({"line": lineno, "id": row.get("id"), "problem": str(e)})
            return
        report = checker.check_sync(str(path), row["pred"], row["gold"], config, evidence=row.get("evidence") or "")
        systems = row.get("systems", 1)
        label = row["label"]
        with lock:
            times.append(report.elapsed_s)
            labels[label].add(report.refuted, systems)
            by_db.setdefault((row["db_id"], label), Share()).add(report.refuted, systems)
            if report.skipped_reason:
                skipped[report.skipped_reason] = skipped.get(report.skipped_reason, 0) + 1
            if label == "lucky":
                kinds.setdefault(row.get("lucky_kind") or "", Share()).add(report.refuted, systems)
            if label in RIGHT + WRONG:
                reasons.setdefault((label, row.get("reason") or ""), Share()).add(report.refuted, systems)
            entry = {"line": lineno, "id": row["id"], "db_id": row["db_id"], "label": label, "systems": systems,
                     "reason": row.get("reason") or "", "lucky_kind": row.get("lucky_kind") or "",
                     "gold": row["gold"], "pred": row["pred"]}
            if label in RIGHT and report.refuted:
                refuted_right.append({**entry, "witness": report.witness.to_text() if report.witness else ""})
            elif label in WRONG and not report.refuted:
                missed_lucky.append({**entry, "skipped": report.skipped_reason or "", "detail": report.detail})

    started = time.perf_counter()
    try:
        lines = list(read_answers(f))
        with Progress(len(lines), "answers", stream=None if progress else io.StringIO()) as bar:
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                futures = []
                for lineno, row, problem in lines:
                    if problem:
                        bad.append({"line": lineno, "id": (row or {}).get("id"), "problem": problem})
                        bar.advance()
                    else:
                        futures.append(pool.submit(one, lineno, row))
                for fut in concurrent.futures.as_completed(futures):
                    fut.result()
                    bar.advance()
    finally:
        if own:
            checker.close()
    right = Share()
    for name in RIGHT:
        s = labels[name]
        right.refuted += s.refuted
        right.pairs += s.pairs
        right.refuted_weight += s.refuted_weight
        right.weight += s.weight
    lucky = labels["lucky"]
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1].refuted_weight if kv[0][0] in RIGHT
                                                     else -(kv[1].weight - kv[1].refuted_weight), kv[0]))
    return {
        "config": config_for(None).to_dict(),
        "answers": sum(s.pairs for s in labels.values()),
        "right_refuted": right.to_dict(),
        "lucky_missed": {"missed": lucky.pairs - lucky.refuted, "pairs": lucky.pairs,
                         "missed_weight": lucky.weight - lucky.refuted_weight, "weight": lucky.weight},
        "labels": {name: s.to_dict() for name, s in labels.items()},
        "by_db": [{"db_id": db, "label": name, **s.to_dict()} for (db, name), s in sorted(by_db.items())],
        "lucky_kinds": {k: s.to_dict() for k, s in sorted(kinds.items())},
        "reasons": [{"label": name, "reason": why, **s.to_dict()} for (name, why), s in ranked],
        "refuted_right": sorted(refuted_right, key=lambda e: (-e["systems"], e["line"])),
        "missed_lucky": sorted(missed_lucky, key=lambda e: (-e["systems"], e["line"])),
        "skipped": dict(sorted(skipped.items())),
        "bad_lines": sorted(bad, key=lambda e: e["line"]),
        "check_s": quantiles(times),
        "elapsed_s": round(time.perf_counter() - started, 2),
    }


def format_answers(result: dict[str, Any], reasons_shown: int = 25) -> str:
    """The measurement as a table: per label, per database and label, per lucky_kind, then the reasons of
    refuted right answers and of missed lucky ones, heaviest first."""
    out = io.StringIO()
    w = out.write
    head = f"{'':44s} {'refuted/pairs':>16s}   {'weighted by systems':>20s}\n"
    w(f"{result['answers']} labelled answers\n" + head)
    for name, s in result["labels"].items():
        w(f"{name:44s} {_share(s).text()}\n")
    w("-" * 86 + "\n")
    for e in result["by_db"]:
        w(f"{e['db_id'] + ' / ' + e['label']:44s} {_share(e).text()}\n")
    if result["lucky_kinds"]:
        w("-" * 86 + "\nlucky, by lucky_kind\n")
        for kind, s in result["lucky_kinds"].items():
            w(f"  {kind or '(none)':42s} {_share(s).text()}\n")
    right = [e for e in result["reasons"] if e["label"] in RIGHT and e["refuted"]]
    if right:
        w("-" * 86 + f"\nright answers refuted, by reason (heaviest first; {len(right)} reasons)\n")
        for e in right[:reasons_shown]:
            w(f"  {e['refuted_weight']:4d} w {e['refuted']:3d}/{e['pairs']:<3d} {e['reason'][:96]}\n")
    lucky = [e for e in result["reasons"] if e["label"] in WRONG and e["refuted"] < e["pairs"]]
    if lucky:
        w("-" * 86 + f"\nlucky answers not refuted, by reason ({len(lucky)} reasons)\n")
        for e in lucky[:reasons_shown]:
            w(f"  {e['weight'] - e['refuted_weight']:4d} w {e['pairs'] - e['refuted']:3d}/{e['pairs']:<3d} "
              f"{e['reason'][:96]}\n")
    r, m = result["right_refuted"], result["lucky_missed"]
    w("-" * 86 + "\n")
    w(f"right answers refuted: {r['refuted']}/{r['pairs']} distinct, {r['refuted_weight']}/{r['weight']} weighted"
      f" ({_pct(r['refuted_weight'], r['weight'])})\n")
    w(f"lucky answers missed: {m['missed']}/{m['pairs']} distinct, {m['missed_weight']}/{m['weight']} weighted"
      f" ({_pct(m['missed_weight'], m['weight'])})\n")
    if result["skipped"]:
        w("checks skipped: " + ", ".join(f"{k} {v}" for k, v in result["skipped"].items()) + "\n")
    for e in result["bad_lines"]:
        w(f"bad line {e['line']}: {e['problem']}\n")
    q = result["check_s"]
    if q:
        w(f"time per check: median {q['median'] * 1000:.1f} ms, p95 {q['p95'] * 1000:.1f} ms, max {q['max']:.2f} s; "
          f"{result['elapsed_s']:.1f} s in all\n")
    return out.getvalue().rstrip("\n")


def _share(d: dict[str, Any]) -> Share:
    return Share(d["refuted"], d["pairs"], d["refuted_weight"], d["weight"])


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f}%" if b else "-"
