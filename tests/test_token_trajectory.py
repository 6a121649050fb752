"""The token trajectory (t2sql.episode.tokens) every adapter over a token server stands on: it extends the
ids exactly as the chat template renders the whole conversation, holds the budgets, never ends on tool
tokens and reports its status. Real BIRD databases, the real Grader, a byte tokenizer with a Qwen-style
template (tests/loopback_model.py); the miles adapter and `t2sql eval --api sglang` are tested on it in
tests/test_sql_episode.py and tests/test_eval.py."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import bird_root
from loopback_model import ByteTokenizer
from t2sql.chat_template import ChatTemplate
from t2sql.episode import prompt as prompts
from t2sql.episode import rollout
from t2sql.episode.budget import Budget
from t2sql.episode.rollout import RolloutSettings
from t2sql.episode.tokens import ABORTED, COMPLETED, TRUNCATED, SampledTurn, TokenTrajectory, run_token_episode

BIRD = bird_root()


@pytest.fixture(scope="module")
def ctx():
    context = rollout.context(RolloutSettings(db_root=str(BIRD), concurrency=2))
    yield context
    rollout.close_contexts()


@pytest.fixture(scope="module")
def tasks(ctx) -> list:
    rows = json.loads((BIRD / "dev.json").read_text())
    return [ctx.task(row) for row in rows[:2]]


def xml_call(sql: str) -> str:
    return ("<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n"
            f"{sql}\n</parameter>\n</function>\n</tool_call>")


def model_ids(tok: ByteTokenizer, text: str, *, closed: bool = True) -> list[int]:
    return tok.encode(text + ("<|im_end|>" if closed else ""))


def scripted_server(tok: ByteTokenizer, turns: list[str], *, closed: bool = True, seen: list | None = None):
    replies = iter(turns)

    async def sample_turn(ids: list[int], max_new: int) -> SampledTurn:
        if seen is not None:
            seen.append((len(ids), max_new))
        text = next(replies)
        out = model_ids(tok, text, closed=closed)
        return SampledTurn(ids=out, text=text, log_probs=[-0.5] * len(out), stopped_at_length=len(out) > max_new)

    return sample_turn


def test_the_trajectory_reads_like_the_template_rendering_the_whole_conversation(ctx, tasks):
    tok = ByteTokenizer()
    task = tasks[0]

    async def run():
        episode = await ctx.episode_async(task)
        render = ChatTemplate(tok, episode.tools, None)
        trajectory = TokenTrajectory.start(render, episode.messages, Budget.of(ctx.preset))
        turns = [xml_call(task.gold_sql), xml_call("SELECT 1"), f"<solution>{task.gold_sql}</solution>"]
        await run_token_episode(episode, trajectory, scripted_server(tok, turns))
        return episode, render, trajectory

    episode, render, trajectory = asyncio.run(run())
    assert episode.result.outcome == "correct" and trajectory.status == COMPLETED
    whole = render.encode(render.text(episode.messages, generation_prompt=False))
    # The model stopped at its end-of-turn token; the template writes "\n" after it, never sampled.
    assert trajectory.tokens == whole[: len(trajectory.tokens)] and tok.decode(whole[len(trajectory.tokens):]) == "\n"
    model = sum(len(model_ids(tok, m["content"])) for m in episode.messages if m["role"] == "assistant")
    assert sum(trajectory.loss_mask) == model and len(trajectory.loss_mask) == trajectory.response_length
    assert len(trajectory.log_probs) == trajectory.response_length
    assert {p for p, m in zip(trajectory.log_probs, trajectory.loss_mask) if m == 0} == {0.0}


def test_a_turn_without_the_end_token_is_closed_by_the_next_tool_segment(ctx, tasks):
    tok = ByteTokenizer()
    task = tasks[0]

    async def run():
        episode = await ctx.episode_async(task)
        render = ChatTemplate(tok, episode.tools, None)
        trajectory = TokenTrajectory.start(render, episode.messages, Budget.of(ctx.preset))
        turns = [xml_call("SELECT 1"), f"<solution>{task.gold_sql}</solution>"]
        await run_token_episode(episode, trajectory, scripted_server(tok, turns, closed=False))
        return episode, render, trajectory

    episode, render, trajectory = asyncio.run(run())
    whole = render.encode(render.text(episode.messages, generation_prompt=False))
    assert trajectory.tokens == whole[: len(trajectory.tokens)]
    assert tok.decode(whole[len(trajectory.tokens):]) == "<|im_end|>\n"


def test_budgets_cut_and_the_tail_is_never_tool_tokens(ctx, tasks):
    tok = ByteTokenizer()
    task = tasks[0]

    async def run(budget: Budget, turns: list[str]):
        episode = await ctx.episode_async(task)
        render = ChatTemplate(tok, episode.tools, None)
        trajectory = TokenTrajectory.start(render, episode.messages, budget)
        seen: list = []
        await run_token_episode(episode, trajectory, scripted_server(tok, turns, seen=seen))
        return episode, trajectory, seen

    prompt_len = len(TokenTrajectory.start(ChatTemplate(tok, prompts.tool_specs(), None),
                                           ctx.episode(task).messages, Budget(1, 1)).tokens)
    call = xml_call("SELECT 1")
    # Room for exactly one model turn: the tool segment after it has no room left -> trimmed.
    room = len(model_ids(tok, call)) + 5
    episode, trajectory, seen = asyncio.run(run(Budget(10_000, prompt_len + room), [call, "never asked"]))
    assert episode.result.outcome == "context_cut" and trajectory.status == TRUNCATED
    assert trajectory.loss_mask and trajectory.loss_mask[-1] == 1  # ends on the model's tokens
    assert seen == [(prompt_len, room)]
    # A per-turn limit below the turn: a turn cut, graded never.
    episode, trajectory, _ = asyncio.run(run(Budget(10, 10**6), [call]))
    assert episode.result.outcome == "turn_cut" and trajectory.status == TRUNCATED
    # The framework's own limits tighten the preset's, never loosen them.
    assert Budget.of(ctx.preset, max_new_tokens=100, max_context_len=2000) == Budget(100, 2000)
    assert Budget.of(ctx.preset, max_new_tokens=10**9, max_context_len=0) == Budget(
        ctx.preset.max_turn_tokens, ctx.preset.max_context_tokens)


def test_an_aborted_request_stops_the_episode_ungraded(ctx, tasks):
    tok = ByteTokenizer()

    async def aborting(ids, max_new):
        return SampledTurn(ids=tok.encode("par"), text="par", aborted=True)

    async def run():
        episode = await ctx.episode_async(tasks[0])
        trajectory = TokenTrajectory.start(ChatTemplate(tok, episode.tools, None), episode.messages,
                                           Budget.of(ctx.preset))
        await run_token_episode(episode, trajectory, aborting)
        return episode, trajectory

    episode, trajectory = asyncio.run(run())
    assert trajectory.status == ABORTED and not episode.done and trajectory.response == "par"
