"""t2sql's episode as a verl agent loop: `SQLAgentLoop`, registered under the agent name "t2sql" (verl 0.9.1), on
t2sql's token trajectory as the miles adapter uses it. Settings: the T2SQL_* variables, then verl's `+t2sql.*`
block, then the loop's `agent_loop_config_path` entry. docs/verl.md has a real run's command, the budgets and
what the loop returns to verl."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any
from uuid import uuid4

from t2sql.chat_template import ChatTemplate
from t2sql.episode import rollout
from t2sql.episode.budget import Budget
from t2sql.episode.machine import EpisodeResult
from t2sql.episode.metrics import record_metrics
from t2sql.episode.tokens import ABORTED, SampledTurn, TokenTrajectory, run_token_episode
from t2sql.errors import AdapterError
from t2sql.integrations import (
    SETTING_NAMES,
    SettingsError,
    config_items,
    entry_point,
    episode_record,
    module_help,
    open_episode,
    require,
    settings_from_env,
)
from t2sql.integrations.rows import AGENT_NAME

VERL_MINIMUM, VERL_BELOW = "0.9.1", "0.10"  # the release this was checked against, and the next minor
with entry_point(__name__):
    _agent_loop = require("verl.experimental.agent_loop.agent_loop", framework="verl", extra="verl",
                          minimum=VERL_MINIMUM, below=VERL_BELOW)
AgentLoopBase = _agent_loop.AgentLoopBase
AgentLoopMetrics = _agent_loop.AgentLoopMetrics
AgentLoopOutput = _agent_loop.AgentLoopOutput

CONFIG_KEY = "t2sql"  # the block of verl's config that holds t2sql's settings (+t2sql.db_root=...)
LENGTH_STOPS = frozenset({"length"})  # SGLang's and verl's own name for a turn stopped at its token limit
ABORT_STOPS = frozenset({"abort", "aborted"})  # SGLang's, vLLM's and TensorRT-LLM's
ABORTED_OUTCOME = "aborted"
COUNTS = ("turns", "tool_calls", "invalid_tool_calls")  # the record's counts reward_extra_info carries, as ints


def _plain(value: Any) -> Any:
    """An OmegaConf container (what verl's config holds) as plain Python; anything else as it is."""
    from omegaconf import DictConfig, ListConfig, OmegaConf  # verl's own dependency

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def loop_settings(trainer_config: Any, loop_kwargs: Mapping[str, Any]) -> rollout.RolloutSettings:
    """The rollout settings: T2SQL_* variables, then verl's config block `t2sql`, then this loop's own
    config entry's keys (an unknown key in either is a SettingsError naming the known ones)."""
    block = _plain(trainer_config.get(CONFIG_KEY) if trainer_config is not None else None) or {}
    overrides = config_items(block)
    if overrides is None:
        raise SettingsError(f"verl's config key {CONFIG_KEY!r} must hold t2sql's settings "
                            f"(+{CONFIG_KEY}.preset=... +{CONFIG_KEY}.db_root=...), not {block!r}")
    return settings_from_env(config=f"{CONFIG_KEY}.", **{**overrides, **{str(k): v for k, v in loop_kwargs.items()}})


@_agent_loop.register(AGENT_NAME)
class SQLAgentLoop(AgentLoopBase):
    """One t2sql episode per dataset row, over verl's token server (see the module doc)."""

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any):
        # verl hands every loop its configured tools; the episode has its own one (execute_sql_query).
        overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in SETTING_NAMES}
        super().__init__(*args, **kwargs)
        self.settings = loop_settings(self.config, {k: _plain(v) for k, v in overrides.items()})
        self.template_kwargs = dict(_plain(self.apply_chat_template_kwargs) or {})
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        episode = await open_episode(self.settings, kwargs, prompt=_messages(kwargs.get("raw_prompt")),
                                     tokenizer=self.tokenizer)
        task, preset = episode.task, episode.preset
        prompt_messages = len(episode.messages)
        render = ChatTemplate(self.tokenizer, episode.tools, self.template_kwargs)
        trajectory = TokenTrajectory.start(render, episode.messages, Budget.of(preset))
        if trajectory.prompt_length > self.prompt_length:
            raise AdapterError(
                f"task {task.question_id}: its prompt is {trajectory.prompt_length} tokens, over verl's "
                f"actor_rollout_ref.rollout.prompt_length={self.prompt_length}; raise data.max_prompt_length "
                f"(verl pads every prompt to it) or leave such tasks out of the data")
        max_new = sampling_params.get("max_tokens") or sampling_params.get("max_new_tokens")
        trajectory.budget = Budget.of(preset, max_new_tokens=max_new,
                                      max_context_len=trajectory.prompt_length + self.response_length)
        request_id = (f"det-{kwargs.get('priority', 0)}" if self.rollout_config.full_determinism
                      else uuid4().hex)  # one sticky session per episode, as verl's ToolAgentLoop
        server = _Server(self.server_manager, request_id, sampling_params, render)

        started = time.monotonic()
        await run_token_episode(episode, trajectory, server.sample_turn)
        elapsed = time.monotonic() - started

        result = episode.result
        response_ids = trajectory.tokens[trajectory.prompt_length:]
        graded = trajectory.status != ABORTED and result is not None
        return AgentLoopOutput(
            prompt_ids=trajectory.tokens[:trajectory.prompt_length],
            response_ids=response_ids,
            response_mask=list(trajectory.loss_mask) if graded else [0] * len(response_ids),
            response_logprobs=list(trajectory.log_probs) if server.log_probs else None,
            routed_experts=None if server.experts is None else server.experts[:len(trajectory.tokens)],
            reward_score=float(result.reward) if graded else 0.0,
            num_turns=_num_turns(episode.messages[prompt_messages:]),
            # verl's timing fields: waiting for the server, and the rest (tools, grading, templates)
            metrics=AgentLoopMetrics(generate_sequences=server.seconds, tool_calls=max(0.0, elapsed - server.seconds),
                                     num_preempted=server.preempted),
            extra_fields={"reward_extra_info": reward_extra_info(result if graded else None),
                          CONFIG_KEY: episode_record(result, preset.name) if graded else None},
        )


class _Server:
    """One episode's turns through verl's server manager, as the token trajectory asks for them."""

    def __init__(self, manager: Any, request_id: str, sampling_params: Mapping[str, Any], render: ChatTemplate):
        self.manager = manager
        self.request_id = request_id
        self.params = {k: v for k, v in sampling_params.items() if k not in ("max_tokens", "max_new_tokens")}
        self.render = render
        self.seconds = 0.0  # spent waiting for the server
        self.preempted = -1  # verl's "not available"
        self.log_probs = True  # every turn came with its log-probs
        self.experts: Any = None  # the last turn's routed experts: they cover the whole sequence

    async def sample_turn(self, ids: list[int], allowed: int) -> SampledTurn:
        started = time.monotonic()
        output = await self.manager.generate(self.request_id, prompt_ids=ids,
                                             sampling_params={**self.params, "max_tokens": allowed})
        self.seconds += time.monotonic() - started
        if output.num_preempted is not None:
            self.preempted = max(self.preempted, 0) + output.num_preempted
        if output.routed_experts is not None:
            self.experts = output.routed_experts
        new_ids = [int(t) for t in output.token_ids]
        log_probs = None if output.log_probs is None else [float(p) for p in output.log_probs]
        if log_probs is None or len(log_probs) != len(new_ids):
            self.log_probs, log_probs = False, None
        return SampledTurn(
            ids=new_ids, text=self.render.tokenizer.decode(new_ids, skip_special_tokens=True), log_probs=log_probs,
            stopped_at_length=(output.stop_reason in LENGTH_STOPS
                               or (len(new_ids) >= allowed and not self.render.ends_turn(new_ids))),
            aborted=output.stop_reason in ABORT_STOPS)


def _messages(raw_prompt: Any) -> list[dict[str, Any]] | None:
    """The row's prompt messages as verl's dataset hands them over (None: the episode builds them)."""
    if raw_prompt is None or isinstance(raw_prompt, (str, bytes)):
        return None
    messages = [_plain(m) for m in list(raw_prompt)]
    if not messages or not all(isinstance(m, Mapping) and "role" in m for m in messages):
        return None
    return [dict(m) for m in messages]


def _num_turns(appended: list[dict[str, Any]]) -> int:
    """verl's count (its ToolAgentLoop's): the prompt, each assistant turn, each round of tool messages."""
    turns, previous = 1, None
    for message in appended:
        role = message.get("role")
        if role == "assistant" or (role == "tool" and previous != "tool"):
            turns += 1
        previous = role
    return turns


def reward_extra_info(result: EpisodeResult | None) -> dict[str, Any]:
    """The values verl logs beside the reward (numbers become metrics; strings go to the rollout dumps).
    Never "reward": verl adds that key itself. The same keys for every episode, aborted ones too (verl
    reads the keys of a batch's first sample)."""
    if result is None:
        return {"acc": 0.0, "outcome": ABORTED_OUTCOME, **dict.fromkeys(COUNTS, 0)}
    record = result.to_dict()
    return {"acc": record_metrics(record)["correct"], "outcome": record["outcome"], **{k: record[k] for k in COUNTS}}


if __name__ == "__main__":
    sys.exit(module_help(sys.argv[1:], __doc__, "verl"))
