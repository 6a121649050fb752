"""An episode record's numbers, the one reading every training adapter logs (TRL, SkyRL, verl, miles),
each under its own prefix, names and aggregation."""

from __future__ import annotations

from typing import Any, Mapping

from t2sql.episode.presets import OUTCOMES

# The record's numeric fields, as they are (correct as 1.0 or 0.0).
NUMBERS = ("reward", "correct", "turns", "tool_calls", "invalid_tool_calls")
# The names the miles rollout log (t2sql.miles.metrics) gives them under "t2sql/", which TRL's log keeps:
# means and rates over a step's episodes.
ROLLOUT_LOG_NAMES = {
    "correct": "accuracy",
    "tool_calls": "tool_calls_mean",
    "invalid_tool_calls": "invalid_tool_calls_mean",
    "turns": "turns_mean",
    "evidence_restated": "evidence_restated_rate",
    "evidence_checked": "evidence_checked_rate",
}


def record_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """One episode record's numbers (EpisodeResult.to_dict(), or an adapter's copy of it): NUMBERS, 1.0 for
    its outcome and 0.0 for every other (`outcome/<name>`), each reward term (`reward_terms/<name>`), and
    `evidence_restated`/`evidence_checked` only when its task has evidence. A field the record lacks is
    left out."""
    out = {name: float(record[name]) for name in NUMBERS if name in record}
    if "outcome" in record:
        out.update({f"outcome/{o}": float(record["outcome"] == o) for o in OUTCOMES})
    out.update({f"reward_terms/{k}": float(v) for k, v in (record.get("reward_terms") or {}).items()})
    if record.get("has_evidence"):
        out["evidence_restated"] = float(bool(record.get("evidence_restated")))
        out["evidence_checked"] = float(bool(record.get("evidence_checked")))
    return out
