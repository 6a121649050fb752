"""The token trajectory: an episode as the token ids a trainer sees (ids, loss mask, log-probs, budgets, status),
built one turn at a time, and `run_token_episode`, the loop over a token-level server.
docs/episode.md, "Over a token server"; the ids exactly: docs/training.md, "What the adapter does per sample"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from t2sql.chat_template import ChatTemplate
from t2sql.episode.budget import Budget

if TYPE_CHECKING:
    from t2sql.episode.machine import Episode


COMPLETED = "COMPLETED"
TRUNCATED = "TRUNCATED"
ABORTED = "ABORTED"


@dataclass
class TokenTrajectory:
    """The prompt's ids and the response's ids, loss mask and log-probs, one turn at a time."""

    render: ChatTemplate
    budget: Budget
    tokens: list[int]  # the prompt's ids, then the response's
    prompt_length: int
    loss_mask: list[int] = field(default_factory=list)  # one per response token: 1 model, 0 tool
    log_probs: list[float] = field(default_factory=list)  # one per response token: 0.0 for tool tokens
    response: str = ""  # the response's text, model and tool segments alike
    status: str = COMPLETED
    closed: bool = False  # the last model turn ended with the end-of-turn token
    _tool_tail: int = 0  # tool tokens at the end (taken off if the episode ends there)
    _tool_tail_text: str = ""

    @classmethod
    def start(cls, render: ChatTemplate, messages: list[dict[str, Any]], budget: Budget) -> TokenTrajectory:
        """The trajectory of a conversation's prompt: its messages rendered with the generation prompt."""
        ids = render.encode(render.text(messages, generation_prompt=True))
        return cls(render=render, budget=budget, tokens=ids, prompt_length=len(ids))

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    def room(self) -> int:
        """Tokens the next turn may generate: <= 0 means the context is full."""
        return self.budget.room(len(self.tokens))

    def add_model(self, ids: list[int], text: str, log_probs: list[float] | None = None) -> None:
        """The ids the model sampled for one turn (loss mask 1)."""
        self._append(ids, list(log_probs) if log_probs is not None else [0.0] * len(ids), text, trained=True)
        self._tool_tail, self._tool_tail_text = 0, ""
        self.closed = self.render.ends_turn(ids)

    def cut(self, stopped_at_length: bool, allowed: int) -> str | None:
        """The cut that ended the turn just added (None, "turn" or "context")."""
        return self.budget.cut(stopped_at_length, allowed, len(self.tokens))

    def add_tools(self, before: list[dict[str, Any]], tool_messages: list[dict[str, Any]]) -> list[int]:
        """The template's text for `tool_messages` after the conversation `before` (loss mask 0);
        returns the ids appended."""
        if not tool_messages:
            return []
        segment = self.render.tool_segment(before, tool_messages, closed=self.closed)
        ids = self.render.encode(segment)
        self._append(ids, [0.0] * len(ids), segment, trained=False)
        self._tool_tail, self._tool_tail_text = len(ids), segment
        return ids

    def trim_tools(self) -> None:
        """Take off a tool segment the trajectory ends on: a sample never ends on tool tokens."""
        n, text = self._tool_tail, self._tool_tail_text
        self._tool_tail, self._tool_tail_text = 0, ""
        if n <= 0:
            return
        del self.tokens[-n:]
        del self.loss_mask[-n:]
        del self.log_probs[-n:]
        if text and self.response.endswith(text):
            self.response = self.response[: -len(text)]

    def _append(self, ids: list[int], log_probs: list[float], text: str, *, trained: bool) -> None:
        self.tokens.extend(ids)
        self.loss_mask.extend([1 if trained else 0] * len(ids))
        self.log_probs.extend(log_probs)
        self.response += text


@dataclass(frozen=True)
class SampledTurn:
    """One model turn from a token server."""

    ids: list[int]
    text: str
    log_probs: list[float] | None = None
    stopped_at_length: bool = False  # the server stopped it at max_new_tokens
    aborted: bool = False  # the server aborted the request: the episode stops ungraded


SampleTurn = Callable[[list[int], int], Awaitable[SampledTurn]]


async def run_token_episode(episode: Episode, trajectory: TokenTrajectory, sample_turn: SampleTurn) -> TokenTrajectory:
    """Run `episode` to its end over a token server: `sample_turn(ids, max_new_tokens)` generates one
    model turn from the whole sequence so far. Returns the trajectory with its status set."""
    while not episode.done:
        allowed = trajectory.room()
        if allowed <= 0:
            trajectory.trim_tools()
            await episode.on_turn("", cut="context")
            trajectory.status = TRUNCATED
            break
        turn = await sample_turn(list(trajectory.tokens), allowed)
        trajectory.add_model(turn.ids, turn.text, turn.log_probs)
        if turn.aborted:  # the framework drops or retries the sample: keep what came, skip the episode
            trajectory.status = ABORTED
            break
        cut = trajectory.cut(turn.stopped_at_length, allowed)
        outcome = await episode.on_turn(turn.text, cut=cut)
        if outcome.done:
            if cut is not None:
                trajectory.status = TRUNCATED
            break
        before = episode.messages[: len(episode.messages) - len(outcome.tool_messages)]
        trajectory.add_tools(before, outcome.tool_messages)
    trajectory.trim_tools()  # defensive: the loop never leaves one, but a sample must not end on tools
    return trajectory
