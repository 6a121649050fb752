"""`t2sql curriculum STATE`: inspect a saved curriculum state (hint levels, weights, hints)."""

from __future__ import annotations

import os
import textwrap
from dataclasses import asdict
from typing import Any

from t2sql import jsonl
from t2sql.episode.presets import get_preset
from t2sql.errors import CurriculumError, DataError
from t2sql.miles.curriculum import STATE_FORMAT, Curriculum, CurriculumConfig
from t2sql.miles.hints import build_hint
from t2sql.tasks import open_input, row_fields

# A state holds a few numbers per task: megabytes for a million tasks.
MAX_STATE_BYTES = 256 * 1024 * 1024


def read_state(path: str | os.PathLike) -> Any:
    """The saved state's JSON (t2sql.jsonl's rules), from a regular file of at most MAX_STATE_BYTES."""
    try:
        with open_input(path, "curriculum state") as f:
            data = f.read(MAX_STATE_BYTES + 1)
    except DataError as e:
        raise CurriculumError(str(e)) from None
    if len(data) > MAX_STATE_BYTES:
        raise CurriculumError(f"{path}: over {MAX_STATE_BYTES:,} bytes, not a curriculum state")
    try:
        return jsonl.loads(data)
    except jsonl.JsonProblem as e:
        raise CurriculumError(f"{path}: {e}") from None


def read_task_rows(path: str | os.PathLike) -> dict[str, dict[str, str]]:
    """question_id -> {"evidence", "gold_sql"} from a t2sql jsonl (read by t2sql.jsonl, a line at a time);
    bad lines are reported and skipped."""
    import sys

    rows: dict[str, dict[str, str]] = {}
    try:
        f = open_input(path, "--data file")
    except DataError as e:
        raise CurriculumError(str(e)) from None
    with f:
        for line in jsonl.json_lines(f):
            if line.problem or not isinstance(line.value, dict):
                why = line.problem or "not a JSON object"
                print(f"{path}:{line.number}: skipped, not a t2sql row ({why})", file=sys.stderr)
                continue
            fields = row_fields(line.value)
            rows[str(fields.get("question_id"))] = {"evidence": str(fields.get("evidence") or ""),
                                                    "gold_sql": fields["gold_sql"] or ""}
    return rows


def add_arguments(parser: Any) -> None:
    parser.add_argument("state", help="a saved state: <save>/rollout/t2sql_curriculum_<rollout_id>.json")
    parser.add_argument("--data", help="the training jsonl, to print the hint each hinted task now gets")
    parser.add_argument("--top", type=int, default=10, help="hinted tasks to list (most 0/N groups first)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")


def run(args: Any) -> int:
    import sys

    try:
        state = read_state(args.state)
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise CurriculumError(f"{args.state}: not a curriculum state (expected format {STATE_FORMAT!r})")
        saved = state.get("config")
        config = CurriculumConfig(**saved) if saved is not None else CurriculumConfig.from_preset(get_preset())
        policy = Curriculum(list(state.get("tasks") or {}), config=config)
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
        print(jsonl.dumps(report, indent=2))
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
