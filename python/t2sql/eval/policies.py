"""Policies for `t2sql eval`: who writes the assistant turns (the oracle, an OpenAI-compatible server, sglang)."""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from t2sql import jsonl
from t2sql.chat_template import ChatTemplate, count_tokens
from t2sql.episode.budget import Budget
from t2sql.episode.evidence import evidence_label_lines, evidence_pieces
from t2sql.episode.tokens import TokenTrajectory  # training's own: one way to extend the ids
from t2sql.errors import EvalError
from t2sql.eval.endpoint import CallStats, OpenAIChatClient, RetryPolicy, SglangGenerateClient

if TYPE_CHECKING:
    from t2sql.episode.machine import Episode
    from t2sql.episode.presets import Preset


OPENAI_CHARS_PER_TOKEN = 4  # only for the first turn, before the server reported usage


@dataclass(frozen=True)
class PolicyTurn:
    text: str
    cut: str | None = None  # None | "turn" | "context"
    tool_calls: list[dict[str, Any]] | None = None


class Session(Protocol):
    stats: CallStats

    async def next_turn(self) -> PolicyTurn: ...

    def observe(self, tool_messages: list[dict[str, Any]]) -> None: ...


class Policy(Protocol):
    name: str

    def session(self, episode: Episode) -> Session: ...

    async def aclose(self) -> None: ...


class OraclePolicy:
    """Explores once with the gold query (a real tool call), then answers with it.

    The text restates the evidence in turn 1 and checks it in the answer turn, in both rules'
    forms (the enumerated Requirement / Verification lines, and the evidence quoted), so a clean
    task scores the preset's full reward. The tool call is written in the qwen3_coder XML form.
    """

    name = "oracle"

    def session(self, episode: Episode) -> Session:
        return _OracleSession(episode)

    async def aclose(self) -> None:
        return None


class _OracleSession:
    def __init__(self, episode: Episode):
        self.episode = episode
        self.turn = 0
        self.stats = CallStats()

    async def next_turn(self) -> PolicyTurn:
        task = self.episode.task
        self.turn += 1
        evidence = task.evidence.strip()
        pieces = evidence_pieces(evidence)
        if self.turn == 1:
            restate = f"The evidence says: {evidence}\n" if evidence else ""
            restate += evidence_label_lines(pieces, "Requirement", "as stated.")
            return PolicyTurn(
                "<think>Run the query once and look at its result.</think>\n"
                f"{restate}Let me run the query.\n"
                "<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n"
                f"{task.gold_sql}\n"
                "</parameter>\n</function>\n</tool_call>"
            )
        check = f"Checked against the evidence: {evidence}\n" if evidence else ""
        check += evidence_label_lines(pieces, "Verification", "the query applies it.")
        return PolicyTurn(
            "<think>The result answers the question.</think>\n"
            f"{check}<solution>\n{task.gold_sql}\n</solution>"
        )

    def observe(self, tool_messages: list[dict[str, Any]]) -> None:
        return None


class OpenAIPolicy:
    """An OpenAI-compatible chat-completions endpoint writes the turns."""

    name = "openai"

    def __init__(self, client: OpenAIChatClient, preset: Preset):
        self.client = client
        self.preset = preset

    def session(self, episode: Episode) -> Session:
        return _OpenAISession(self, episode)

    async def aclose(self) -> None:
        await self.client.aclose()


class _OpenAISession:
    def __init__(self, policy: OpenAIPolicy, episode: Episode):
        self.policy = policy
        self.episode = episode
        self.stats = CallStats()
        self.known_tokens: int | None = None  # prompt + completion of the last reply, from usage
        self.unseen_chars = sum(_message_chars(m) for m in episode.messages)  # not yet counted by the server

    def context_estimate(self) -> int:
        return (self.known_tokens or 0) + math.ceil(self.unseen_chars / OPENAI_CHARS_PER_TOKEN)

    async def next_turn(self) -> PolicyTurn:
        budget = Budget.of(self.policy.preset)
        max_tokens = budget.room(self.context_estimate())
        if max_tokens <= 0:
            return PolicyTurn("", cut="context")
        reply = await self.policy.client.complete(
            self.episode.messages, self.episode.tools, max_tokens=max_tokens, stats=self.stats
        )
        if reply.prompt_tokens is not None and reply.completion_tokens is not None:
            self.known_tokens = reply.prompt_tokens + reply.completion_tokens
            self.unseen_chars = 0
        else:
            self.unseen_chars += len(reply.text)
        cut = budget.cut(reply.finish_reason == "length", max_tokens, self.known_tokens)
        return PolicyTurn(reply.text, cut=cut, tool_calls=reply.tool_calls)

    def observe(self, tool_messages: list[dict[str, Any]]) -> None:
        self.unseen_chars += sum(_message_chars(m) for m in tool_messages)


def _message_chars(message: dict[str, Any]) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, str) else len(json.dumps(content or ""))


class SglangPolicy:
    """sglang's token-level /generate writes the turns; this side owns the token ids, as in training.

    The token bookkeeping is the training adapters' own trajectory (`t2sql.episode.tokens`), so eval
    extends the sequence exactly as training does: the chat template with the tool spec and the template
    kwargs on every render, the model's own output ids appended, tool messages appended as the
    template's suffix for them (with the newline the model never writes after its end-of-turn token).

    `tokenizer` is a Hugging Face tokenizer (or anything with `apply_chat_template(messages,
    tools=..., tokenize=False, add_generation_prompt=...)`, `encode(text, add_special_tokens=False)`,
    `decode(ids)`). The end-of-turn token is read from the chat template, never from eos_token.
    """

    name = "sglang"

    def __init__(
        self,
        client: SglangGenerateClient,
        tokenizer: Any,
        preset: Preset,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
    ):
        self.client = client
        self.tokenizer = tokenizer
        self.preset = preset
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def session(self, episode: Episode) -> Session:
        return _SglangSession(self, episode)

    def count_tokens(self, text: str) -> int:
        """Think/visible token metrics in the model's own tokens, as in training."""
        return count_tokens(self.tokenizer, text)

    async def aclose(self) -> None:
        await self.client.aclose()


class _SglangSession:
    """The episode's token trajectory, extended one turn at a time exactly as in training."""

    def __init__(self, policy: SglangPolicy, episode: Episode):
        self.policy = policy
        self.episode = episode
        self.stats = CallStats()
        render = ChatTemplate(policy.tokenizer, episode.tools, policy.chat_template_kwargs)
        self.trajectory = TokenTrajectory.start(render, episode.messages, Budget.of(policy.preset))

    async def next_turn(self) -> PolicyTurn:
        allowed = self.trajectory.room()  # like miles: len(input_ids) + max_new_tokens fits the context
        if allowed <= 0:
            return PolicyTurn("", cut="context")
        ids = list(self.trajectory.tokens)
        reply = await self.policy.client.generate(ids, max_new_tokens=allowed, stats=self.stats)
        output_ids = reply.output_ids if reply.output_ids is not None else self.trajectory.render.encode(reply.text)
        self.trajectory.add_model(output_ids, reply.text)
        return PolicyTurn(reply.text, cut=self.trajectory.cut(reply.finish_reason == "length", allowed))

    def observe(self, tool_messages: list[dict[str, Any]]) -> None:
        before = self.episode.messages[: len(self.episode.messages) - len(tool_messages)]
        self.trajectory.add_tools(before, tool_messages)


def load_tokenizer(path: str) -> Any:
    """A Hugging Face tokenizer, loaded only for --api sglang."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise EvalError("--api sglang needs transformers to load --tokenizer: pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any loader failure becomes one clear message
        raise EvalError(f"--tokenizer {path}: cannot load a tokenizer: {e}") from None


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.top_p is not None:
        sampling["top_p"] = args.top_p
    return sampling


def _chat_template_kwargs(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = jsonl.loads(raw)  # a user's JSON: no NaN, no nesting past jsonl.MAX_DEPTH
    except jsonl.JsonProblem as e:
        raise EvalError(f"--chat-template-kwargs: {e}; e.g. '{{\"enable_thinking\": true}}'") from None
    if not isinstance(value, dict):
        raise EvalError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": true}'")
    return value


def build_policy(args: argparse.Namespace, preset: Preset, *, tokenizer: Any = None) -> Policy:
    if args.policy == "oracle":
        return OraclePolicy()
    if not args.endpoint:
        raise EvalError("--endpoint URL is required with --policy model (or use --policy oracle)")
    try:
        retry = RetryPolicy(timeout_s=args.timeout_s, retries=args.retries, backoff_s=args.retry_backoff,
                            max_body_bytes=int(args.max_response_mb * 1024 * 1024))
    except ValueError as e:
        raise EvalError(str(e)) from None
    kwargs = _chat_template_kwargs(args.chat_template_kwargs)
    try:
        if args.api == "openai":
            if not args.model:
                raise EvalError("--model NAME is required with --api openai (the name the server serves)")
            extra = {"chat_template_kwargs": kwargs} if kwargs else {}
            client = OpenAIChatClient(
                args.endpoint, args.model, retry=retry, sampling=_sampling(args),
                api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                extra_body=extra, max_connections=args.concurrency,
            )
            return OpenAIPolicy(client, preset)
        if tokenizer is None:
            if not args.tokenizer:
                raise EvalError("--tokenizer PATH is required with --api sglang (the served model's tokenizer)")
            tokenizer = load_tokenizer(args.tokenizer)
        client = SglangGenerateClient(
            args.endpoint, retry=retry, sampling=_sampling(args), max_connections=args.concurrency
        )
        return SglangPolicy(client, tokenizer, preset, chat_template_kwargs=kwargs)
    except ValueError as e:
        raise EvalError(str(e)) from None
