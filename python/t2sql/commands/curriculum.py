"""`t2sql curriculum STATE`: inspect a saved curriculum state (hint levels, weights, hints)."""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Any

from t2sql.errors import CurriculumError
from t2sql.miles.curriculum import STATE_FORMAT, Curriculum, CurriculumConfig
from t2sql.miles.hints import build_hint
from t2sql.tasks import row_fields


def read_task_rows(path: str | os.PathLike) -> dict[str, dict[str, str]]:
    """question_id -> {"evidence", "gold_sql"} from a t2sql jsonl; bad lines are reported and skipped."""
    import sys

    rows: dict[str, dict[str, str]] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                fields = row_fields(json.loads(line))
                rows[str(fields.get("question_id"))] = {"evidence": fields.get("evidence") or "",
                                                        "gold_sql": fields["gold_sql"] or ""}
            except (json.JSONDecodeError, AttributeError) as e:
                print(f"{path}:{n}: skipped, not a t2sql row ({e})", file=sys.stderr)
    return rows


def add_arguments(parser: Any) -> None:
    parser.add_argument("state", help="a saved state: <save>/rollout/t2sql_curriculum_<rollout_id>.json")
    parser.add_argument("--data", help="the training jsonl, to print the hint each hinted task now gets")
    parser.add_argument("--top", type=int, default=10, help="hinted tasks to list (most 0/N groups first)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def run(args: Any) -> int:
    import sys

    try:
        try:
            state = json.loads(Path(args.state).read_text())
        except json.JSONDecodeError as e:
            raise CurriculumError(f"{args.state}: not valid JSON ({e})") from e
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise CurriculumError(f"{args.state}: not a curriculum state (expected format {STATE_FORMAT!r})")
        policy = Curriculum(list(state.get("tasks") or {}), config=CurriculumConfig(**state.get("config", {})))
        policy.load_state_dict(state)
        rows = read_task_rows(args.data) if args.data else {}
    except (OSError, CurriculumError, TypeError) as e:
        print(f"t2sql curriculum: {e}", file=sys.stderr)
        return 2
    hinted = sorted(
        (t for t, s in policy.tasks.items() if s.level > 0),
        key=lambda t: (-policy.tasks[t].zero_groups, -policy.tasks[t].level, t),
    )[: max(args.top, 0)]
    report = {
        "summary": policy.summary(),
        "hinted": [
            {
                "task": t,
                **asdict(policy.tasks[t]),
                "weight": policy.weight(t),
                **({"hint": build_hint(rows[t]["evidence"], rows[t]["gold_sql"], policy.tasks[t].level)}
                   if t in rows else {}),
            }
            for t in hinted
        ],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    summary = report["summary"]
    width = max(len(k) for k in summary)
    for k, v in summary.items():
        print(f"{k:<{width}}  {v:.4f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    if report["hinted"]:
        print(f"\n{'task':<12} {'level':>5} {'groups':>6} {'0/N':>4} {'last_p':>6} {'weight':>6}")
        for r in report["hinted"]:
            p = "-" if r["last_p"] is None else f"{r['last_p']:.2f}"
            print(f"{r['task']:<12} {r['level']:>5} {r['groups']:>6} {r['zero_groups']:>4} {p:>6} {r['weight']:>6.3f}")
            if "hint" in r:
                print(textwrap.indent(r["hint"], "    "))
    return 0
