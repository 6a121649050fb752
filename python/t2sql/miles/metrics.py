"""Training metrics of a rollout step: accuracy, pass@k over correct, the evidence rates and
tool-call means (miles' --custom-rollout-log-function-path)."""

from __future__ import annotations

import copy
from typing import Any

from t2sql.episode.metrics import ROLLOUT_LOG_NAMES, record_metrics
from t2sql.miles.adapter import METADATA_KEY


def _record_of(sample: Any) -> dict | None:
    meta = getattr(sample, "metadata", None)
    record = meta.get(METADATA_KEY) if isinstance(meta, dict) else None
    return record if isinstance(record, dict) else None


def _sample_correct(sample: Any) -> bool | None:
    """The episode's `correct` (the reward dict's, else the episode record's); None when unknown."""
    reward = getattr(sample, "reward", None)
    if isinstance(reward, dict) and "correct" in reward:
        return bool(reward["correct"])
    record = _record_of(sample)
    return bool(record["correct"]) if record and "correct" in record else None


def _pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a group of n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def rollout_metrics(samples: list[Any], group_size: int | None = None) -> dict[str, float]:
    """The episode's own numbers for one rollout, keyed `t2sql/...`: accuracy (share correct: a
    shaped reward of 0.9 is still a correct answer, which miles' reward == 1 pass@k misses), pass@k
    over `correct` for k = 1, 2, 4, .. up to the group size, and the evidence and tool-call rates."""
    graded = [(s, c) for s in samples if (c := _sample_correct(s)) is not None]
    if not graded:
        return {}
    out: dict[str, float] = {
        "t2sql/accuracy": sum(c for _, c in graded) / len(graded),
        "t2sql/samples": float(len(graded)),
    }
    numbers = [record_metrics(r) for s, _ in graded if (r := _record_of(s)) is not None]
    if numbers:
        for name in ("tool_calls", "invalid_tool_calls"):  # a record without the count counts 0
            out[f"t2sql/{ROLLOUT_LOG_NAMES[name]}"] = sum(n.get(name, 0.0) for n in numbers) / len(numbers)
        for name in ("evidence_restated", "evidence_checked"):  # over the episodes whose task has evidence
            rates = [n[name] for n in numbers if name in n]
            if rates:
                out[f"t2sql/{ROLLOUT_LOG_NAMES[name]}"] = sum(rates) / len(rates)
    if group_size and group_size > 1:
        groups: dict[Any, list[bool]] = {}
        for s, c in graded:
            groups.setdefault(getattr(s, "group_index", None), []).append(c)
        complete = [g for key, g in groups.items() if key is not None and len(g) == group_size]
        k = 1
        while complete and k <= group_size:
            out[f"t2sql/pass@{k}"] = sum(_pass_at_k(len(g), sum(g), k) for g in complete) / len(complete)
            k *= 2
    return out


def log_rollout(rollout_id: Any, args: Any, samples: list[Any], rollout_extra_metrics: Any,
                rollout_time: float) -> bool:
    """miles --custom-rollout-log-function-path hook: the episode's metrics (`rollout_metrics`) go in
    beside miles' own. miles' default logging then runs on them unchanged; returning True tells miles
    its default has already run."""
    from miles.ray.rollout import metrics as miles_metrics

    extra = dict(rollout_extra_metrics or {})
    extra.update(rollout_metrics(samples, getattr(args, "n_samples_per_prompt", None)))
    plain = copy.copy(args)
    plain.custom_rollout_log_function_path = None  # miles' default, not this hook again
    miles_metrics.log_rollout_data(rollout_id, plain, samples, extra, rollout_time)
    return True
