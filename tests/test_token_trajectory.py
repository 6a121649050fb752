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
from loopback_model import ByteTokenizer, xml_tool_call
from t2sql.chat_template import ChatTemplate
from t2sql.episode import prompt as prompts
from t2sql.episode.budget import Budget
from t2sql.episode.tokens import ABORTED, COMPLETED, TRUNCATED, SampledTurn, TokenTrajectory, run_token_episode

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def tasks(bird_rollout) -> list:
    rows = json.loads((bird_root() / "dev.json").read_text())
    return [bird_rollout.task(row) for row in rows[:2]]


def model_ids(text: str, *, closed: bool = True) -> list[int]:
    return TOK.encode(text + ("<|im_end|>" if closed else ""))


def scripted_server(turns: list[str], *, closed: bool = True, seen: list | None = None):
    replies = iter(turns)

    async def sample_turn(ids: list[int], max_new: int) -> SampledTurn:
        if seen is not None:
            seen.append((len(ids), max_new))
        text = next(replies)
        out = model_ids(text, closed=closed)
        return SampledTurn(ids=out, text=text, log_probs=[-0.5] * len(out), stopped_at_length=len(out) > max_new)

    return sample_turn


def run_scripted(ctx, task, sample_turn, budget: Budget | None = None):
    """One episode of `task` over `sample_turn`, on the byte tokenizer: (episode, render, trajectory)."""
    async def run():
        episode = await ctx.episode_async(task)
        render = ChatTemplate(TOK, episode.tools, None)
        trajectory = TokenTrajectory.start(render, episode.messages, budget or Budget.of(ctx.preset))
        await run_token_episode(episode, trajectory, sample_turn)
        return episode, render, trajectory

    return asyncio.run(run())


def test_the_trajectory_reads_like_the_template_rendering_the_whole_conversation(bird_rollout, tasks):
    task = tasks[0]
    turns = [xml_tool_call(task.gold_sql), xml_tool_call("SELECT 1"), f"<solution>{task.gold_sql}</solution>"]
    episode, render, trajectory = run_scripted(bird_rollout, task, scripted_server(turns))
    assert episode.result.outcome == "correct" and trajectory.status == COMPLETED
    whole = render.encode(render.text(episode.messages, generation_prompt=False))
    # The model stopped at its end-of-turn token; the template writes "\n" after it, never sampled.
    assert trajectory.tokens == whole[: len(trajectory.tokens)] and TOK.decode(whole[len(trajectory.tokens):]) == "\n"
    model = sum(len(model_ids(m["content"])) for m in episode.messages if m["role"] == "assistant")
    assert sum(trajectory.loss_mask) == model and len(trajectory.loss_mask) == trajectory.response_length
    assert len(trajectory.log_probs) == trajectory.response_length
    assert {p for p, m in zip(trajectory.log_probs, trajectory.loss_mask) if m == 0} == {0.0}


def test_a_turn_without_the_end_token_is_closed_by_the_next_tool_segment(bird_rollout, tasks):
    task = tasks[0]
    turns = [xml_tool_call("SELECT 1"), f"<solution>{task.gold_sql}</solution>"]
    episode, render, trajectory = run_scripted(bird_rollout, task, scripted_server(turns, closed=False))
    whole = render.encode(render.text(episode.messages, generation_prompt=False))
    assert trajectory.tokens == whole[: len(trajectory.tokens)]
    assert TOK.decode(whole[len(trajectory.tokens):]) == "<|im_end|>\n"


def test_budgets_cut_and_the_tail_is_never_tool_tokens(bird_rollout, tasks):
    ctx, task = bird_rollout, tasks[0]
    prompt_len = len(TokenTrajectory.start(ChatTemplate(TOK, prompts.tool_specs(), None),
                                           ctx.episode(task).messages, Budget(1, 1)).tokens)
    call = xml_tool_call("SELECT 1")
    # Room for exactly one model turn: the tool segment after it has no room left -> trimmed.
    room = len(model_ids(call)) + 5
    seen: list = []
    episode, _, trajectory = run_scripted(ctx, task, scripted_server([call, "never asked"], seen=seen),
                                          Budget(10_000, prompt_len + room))
    assert episode.result.outcome == "context_cut" and trajectory.status == TRUNCATED
    assert trajectory.loss_mask and trajectory.loss_mask[-1] == 1  # ends on the model's tokens
    assert seen == [(prompt_len, room)]
    # A per-turn limit below the turn: a turn cut, graded never.
    episode, _, trajectory = run_scripted(ctx, task, scripted_server([call]), Budget(10, 10**6))
    assert episode.result.outcome == "turn_cut" and trajectory.status == TRUNCATED
    # The framework's own limits tighten the preset's, never loosen them.
    assert Budget.of(ctx.preset, max_new_tokens=100, max_context_len=2000) == Budget(100, 2000)
    assert Budget.of(ctx.preset, max_new_tokens=10**9, max_context_len=0) == Budget(
        ctx.preset.budgets.max_turn_tokens, ctx.preset.budgets.max_context_tokens)


def test_an_aborted_request_stops_the_episode_ungraded(bird_rollout, tasks):
    async def aborting(ids, max_new):
        return SampledTurn(ids=TOK.encode("par"), text="par", aborted=True)

    episode, _, trajectory = run_scripted(bird_rollout, tasks[0], aborting)
    assert trajectory.status == ABORTED and not episode.done and trajectory.response == "par"
