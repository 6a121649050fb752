"""The miles adapter: `generate` (one `t2sql.Episode` over sglang's `/generate`, on the token trajectory) and
`reward_func` (the episode's record, or with none the last `<solution>` under the outcome table), handed to miles
as t2sql.sql_episode's. What it does per sample and its flags:
docs/training.md, "What the adapter does per sample". miles is imported lazily: without it HTTP goes through
httpx and the output is a stand-in."""

from __future__ import annotations

import argparse
import base64
import copy
import functools
import logging
import sys
from array import array
from dataclasses import dataclass
from typing import Any

from t2sql.chat_template import ChatTemplate, count_tokens
from t2sql.episode import rollout
from t2sql.episode.budget import Budget
from t2sql.episode.machine import EpisodeResult
from t2sql.episode.presets import DEFAULT_PRESET
from t2sql.episode.rollout import RolloutContext, RolloutSettings
from t2sql.episode.tokens import SampledTurn, TokenTrajectory, run_token_episode
from t2sql.errors import AdapterError

log = logging.getLogger("t2sql.miles.adapter")

DEFAULT_REWARD_KEY = "reward"
METADATA_KEY = "t2sql"  # sample.metadata[METADATA_KEY] holds the episode result


# ---------------------------------------------------------------------------------------- flags


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("t2sql text-to-SQL")
    g.add_argument("--text-to-sql-preset", default=DEFAULT_PRESET,
                   help="t2sql preset: budgets, tool caps, timeouts, reward table")
    g.add_argument("--text-to-sql-db-root", default=None,
                   help="databases as <root>/<db_id>/<db_id>.sqlite (default: each row's metadata.db_path)")
    g.add_argument("--text-to-sql-cache-dir", default=None, help="on-disk gold digest cache (shared across runs)")
    g.add_argument("--text-to-sql-manifest", default=None, help="refuse databases that differ from this manifest")
    g.add_argument("--text-to-sql-hash-databases", action="store_true",
                   help="with a manifest: check each database's sha256 at first use even when its size, "
                        "times and inode match (default: hash only what changed)")
    g.add_argument("--text-to-sql-grader-concurrency", type=int, default=None,
                   help="SQL queries at once in the rollout process (default: CPU count)")
    g.add_argument("--text-to-sql-tool-timeout", type=float, default=None, help="seconds (default: the preset's)")
    g.add_argument("--text-to-sql-grade-timeout", type=float, default=None, help="seconds (default: the preset's)")


# ------------------------------------------------------------------------------ shared context


def settings(args: Any) -> RolloutSettings:
    """The rollout settings miles' flags name (args may be None: offline replay, the defaults)."""
    get = lambda name, default=None: getattr(args, name, default) if args is not None else default  # noqa: E731
    return RolloutSettings(
        preset=get("text_to_sql_preset") or DEFAULT_PRESET,
        db_root=get("text_to_sql_db_root"),
        cache_dir=get("text_to_sql_cache_dir"),
        manifest=get("text_to_sql_manifest"),
        hash_databases=bool(get("text_to_sql_hash_databases", False)),
        concurrency=get("text_to_sql_grader_concurrency"),
        tool_timeout_s=get("text_to_sql_tool_timeout"),
        grade_timeout_s=get("text_to_sql_grade_timeout"),
    )


def _context(args: Any) -> RolloutContext:
    return rollout.context(settings(args))


close_contexts = rollout.close_contexts  # tests close the Graders this process made


# ------------------------------------------------------------------------------------- miles glue


def _status(sample: Any, name: str) -> Any:
    return getattr(type(sample).Status, name)


@dataclass(frozen=True)
class GenerateOutput:
    """Stand-in for miles' GenerateFnOutput when miles is not installed."""

    samples: Any


def _output(sample: Any) -> Any:
    try:
        from miles.rollout.base_types import GenerateFnOutput
    except ImportError:
        return GenerateOutput(samples=sample)
    return GenerateFnOutput(samples=sample)


async def _post(url: str, payload: dict) -> dict:
    """miles' own post (retries, Ray-distributed) when miles is there, else one httpx POST."""
    try:
        from miles.utils.http_utils import post
    except ImportError:
        post = None
    if post is not None:
        return await post(url, payload)
    import httpx

    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0)) as client:
        response = await client.post(url, json=payload)
        response.raise_for_status()
        return response.json()


def _decode_routed_experts(info: str, num_tokens: int, num_layers: int | None, topk: int | None) -> Any:
    """sglang's base64 int32 buffer -> (num_tokens, layers, topk), numpy when available."""
    raw = base64.b64decode(info)
    if len(raw) % 4:
        raise AdapterError(f"routed_experts buffer has {len(raw)} bytes, not a whole number of int32")
    values = len(raw) // 4
    if num_tokens <= 0:
        return _Int32Array3D(b"", (0, num_layers or 0, topk or 0)).to_numpy()
    per_token, rest = divmod(values, num_tokens)
    if rest:
        raise AdapterError(f"routed_experts has {values} values, not a multiple of len(tokens)-1={num_tokens}")
    if num_layers:
        topk_found, rest = divmod(per_token, num_layers)
        layers = num_layers
    elif topk:
        layers, rest = divmod(per_token, topk)
        topk_found = topk
    else:
        raise AdapterError("cannot shape routed_experts: args has neither num_layers nor moe_router_topk")
    if rest:
        raise AdapterError(f"routed_experts: {per_token} values per token do not split into {num_layers or topk}")
    return _Int32Array3D(raw, (num_tokens, layers, topk_found)).to_numpy()


class _Int32Array3D:
    """A (tokens, layers, topk) int32 array: numpy's when numpy is installed (always under miles)."""

    def __init__(self, raw: bytes, shape: tuple[int, int, int]):
        self.values = array("i")
        self.values.frombytes(raw)
        if sys.byteorder != "little":
            self.values.byteswap()
        self.shape = shape

    def to_numpy(self) -> Any:
        try:
            import numpy as np
        except ImportError:
            return self
        return np.asarray(self.values, dtype=np.int32).reshape(self.shape)

    def __len__(self) -> int:
        return self.shape[0]


# ------------------------------------------------------------------------------------- generate


def _prompt_messages(sample: Any) -> list[dict] | None:
    prompt = sample.prompt
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        return [dict(m) for m in prompt]
    return None


def _task_row(sample: Any) -> dict:
    label = sample.label
    metadata = dict(sample.metadata or {})
    metadata.pop("tools", None)
    return {"label": label, "metadata": metadata}


async def generate(input: Any) -> Any:  # noqa: A002 - miles calls the new form with `input`
    """miles' custom generate: one text-to-SQL episode -> one Sample (see the module doc)."""
    args = input.args
    state = input.state
    sample = copy.deepcopy(input.sample)
    ctx = _context(args)
    task = ctx.task(_task_row(sample))
    tokenizer = state.tokenizer
    # A string prompt (--apply-chat-template) has no messages: the episode builds them (off the loop).
    episode = await ctx.episode_async(task, prompt=_prompt_messages(sample),
                                      count_tokens=functools.partial(count_tokens, tokenizer))
    render = ChatTemplate(tokenizer, episode.tools, getattr(args, "apply_chat_template_kwargs", None))
    budget = Budget.of(ctx.preset, max_new_tokens=input.sampling_params.get("max_new_tokens"),
                       max_context_len=getattr(args, "rollout_max_context_len", None))
    trajectory = TokenTrajectory.start(render, episode.messages, budget)

    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    routing_replay = bool(getattr(args, "use_rollout_routing_replay", False))

    async def sample_turn(ids: list[int], max_new: int) -> SampledTurn:
        payload = {
            "input_ids": ids,
            "sampling_params": {**input.sampling_params, "max_new_tokens": max_new},
            "return_logprob": True,
            "return_routed_experts": routing_replay,
        }
        output = await _post(url, payload)
        meta = output.get("meta_info") or {}
        finish = ((meta.get("finish_reason") or {}).get("type")) or "stop"
        pairs = meta.get("output_token_logprobs") or []
        new_ids = [int(item[1]) for item in pairs]
        aborted = finish == "abort"  # miles drops or retries the sample
        if not aborted:
            _record_meta(sample, meta)
        if routing_replay:
            info = meta.get("routed_experts")
            if info is None and not aborted:
                raise AdapterError("--use-rollout-routing-replay is on but sglang returned no routed_experts")
            # sglang returns the experts of the whole sequence: ASSIGNED from the last response. As
            # miles' own generate, an aborted response's are assigned too (None when sglang sent none),
            # so they always cover len(tokens) - 1 and validate() holds; nothing is trimmed from an
            # aborted sample (it is retried, never trained).
            sample.rollout_routed_experts = None if info is None else _decode_routed_experts(
                info, len(ids) + len(new_ids) - 1, getattr(args, "num_layers", None),
                getattr(args, "moe_router_topk", None))
        return SampledTurn(ids=new_ids, text=output.get("text") or "",
                           log_probs=[float(item[0]) for item in pairs],
                           stopped_at_length=finish == "length", aborted=aborted)

    sample.rollout_routed_experts = None
    await run_token_episode(episode, trajectory, sample_turn)
    sample.tokens = trajectory.tokens
    sample.response = trajectory.response
    sample.response_length = trajectory.response_length
    sample.loss_mask = trajectory.loss_mask
    sample.rollout_log_probs = trajectory.log_probs
    sample.status = _status(sample, trajectory.status)
    if episode.result is not None:
        sample.metadata = dict(sample.metadata or {})
        sample.metadata[METADATA_KEY] = _result_record(episode.result, ctx.preset.name)
    return _output(sample)


def _record_meta(sample: Any, meta: dict) -> None:
    # What miles' own update_from_meta_info keeps, on the fields this Sample has.
    if "weight_version" in meta and isinstance(getattr(sample, "weight_versions", None), list):
        sample.weight_versions.append(meta["weight_version"])
    info = getattr(sample, "prefix_cache_info", None)
    if info is not None and hasattr(info, "add"):
        info.add(meta)


def _result_record(result: EpisodeResult, preset_name: str) -> dict:
    """The episode record miles keeps: every field but the grade's details, and the preset's name."""
    record = result.to_dict()
    del record["grade"]
    return {**record, "preset": preset_name}


generate.add_arguments = add_arguments  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------- reward_func


def _reward_key(args: Any) -> str:
    return (getattr(args, "reward_key", None) if args is not None else None) or DEFAULT_REWARD_KEY


def _reward_dict(key: str, outcome: str, reward: float, correct: bool, extra: dict) -> dict:
    out = {key: float(reward), "category": outcome, "correct": 1.0 if correct else 0.0}
    out.update(extra)
    return out


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> dict:
    """The episode's reward as a dict: {reward_key: float, "category": outcome, "correct": 1.0|0.0,
    "turns", "tool_calls", "invalid_tool_calls"}. args may be None (offline replay)."""
    key = _reward_key(args)
    record = (sample.metadata or {}).get(METADATA_KEY) if isinstance(sample.metadata, dict) else None
    if record:
        return _reward_dict(key, record["outcome"], record["reward"], record["correct"], {
            "turns": record.get("turns", 0),
            "tool_calls": record.get("tool_calls", 0),
            "invalid_tool_calls": record.get("invalid_tool_calls", 0),
        })
    return await _regrade(args, sample, key)


async def _regrade(args: Any, sample: Any, key: str) -> dict:
    """No episode record (a sample from elsewhere, or replayed raw): grade the last <solution> of
    the response against the label; the outcome table only (the trajectory is not known)."""
    ctx = _context(args)
    outcome = await ctx.regrade(ctx.task(_task_row(sample)), sample.response or "")
    return _reward_dict(key, outcome, ctx.preset.outcome_reward(outcome), outcome == "correct",
                        {"regraded": 1.0})


# --------------------------------------------------------------------------- training metrics


