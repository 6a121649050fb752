"""Token budgets: how many tokens a turn, and the whole context, may hold, and which cut ended a turn. The one rule
every adapter applies: docs/episode.md, "Over a token server: the token trajectory"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from t2sql.episode.presets import Preset


def cut_reason(stopped_at_length: bool, allowed: int, turn_limit: int, used: int | None = None,
               context_limit: int | None = None) -> str | None:
    """Which cut ended a turn (None, "turn" or "context"): the one rule the miles adapter and every
    eval policy apply. A turn stopped at its token limit is a context cut when the context budget,
    not the per-turn limit, set that limit (allowed < turn_limit) or the context is now full, and a
    turn cut otherwise; a turn that ran past the context budget (an estimate was short) is a
    context cut too. `used`: tokens of the whole context after the turn, when known."""
    known = used is not None and context_limit is not None
    if stopped_at_length:
        return "context" if allowed < turn_limit or (known and used >= context_limit) else "turn"
    return "context" if known and used > context_limit else None


@dataclass(frozen=True)
class Budget:
    """How many tokens a turn, and the whole context, may hold."""

    turn_limit: int  # tokens one turn may generate
    context_limit: int  # tokens of the whole sequence, prompt included

    @classmethod
    def of(cls, preset: Preset, *, max_new_tokens: int | None = None, max_context_len: int | None = None) -> Budget:
        """The preset's budgets, tightened by the framework's own limits where it sets them (a sampling
        max_new_tokens, a rollout's maximum context length); a limit of 0 or None is no limit."""
        turn_limit = int(preset.budgets.max_turn_tokens)
        if max_new_tokens:
            turn_limit = min(turn_limit, int(max_new_tokens))
        context_limit = int(preset.budgets.max_context_tokens)
        if max_context_len:
            context_limit = min(context_limit, int(max_context_len))
        return cls(turn_limit, context_limit)

    def room(self, used: int) -> int:
        """Tokens the next turn may generate after `used` tokens: <= 0 means the context is full."""
        return min(self.turn_limit, self.context_limit - used)

    def cut(self, stopped_at_length: bool, allowed: int, used: int | None) -> str | None:
        """Which cut ended a turn that was allowed `allowed` tokens and left `used` in the context."""
        return cut_reason(stopped_at_length, allowed, self.turn_limit, used, self.context_limit)
