"""The reward terms in one registry, and `score`: the outcome table, then every enabled term, then the floor.

The built-in terms (t2sql.episode.reward), the repetition guards (t2sql.episode.guards) and the
equivalence check (t2sql.episode.equivalence_term) are registered here, in the one module that imports
all three; other code adds terms with `register_term` without touching this file."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from t2sql.episode import equivalence_term, guards
from t2sql.episode.evidence import EvidenceCheck
from t2sql.episode.presets import RESERVED_SWITCHES, Preset, Rewards
from t2sql.episode.reward import BASE_TERMS, RewardTerm, TermResult, Trajectory
from t2sql.errors import PresetError

log = logging.getLogger(__name__)

_TERMS: list[RewardTerm] = [*BASE_TERMS, *guards.reward_terms(), *equivalence_term.reward_terms()]


_warned_unimplemented: set[str] = set()


def register_term(term: RewardTerm) -> None:
    """Add a term (or replace the one of the same name). Recipe extras use their reserved switch."""
    if term.switch is not None and term.switch not in {f.name for f in dataclasses.fields(Rewards)}:
        raise PresetError(f"term {term.name!r}: switch {term.switch!r} is not a field of a preset's reward part")
    _TERMS[:] = [t for t in _TERMS if t.name != term.name] + [term]


def unregister_term(name: str) -> None:
    _TERMS[:] = [t for t in _TERMS if t.name != name]


def registered_terms() -> tuple[RewardTerm, ...]:
    return tuple(_TERMS)


@dataclass(frozen=True)
class RewardBreakdown:
    outcome: str
    outcome_reward: float
    terms: Mapping[str, float]  # name -> signed amount, for every enabled term
    total: float
    evidence: EvidenceCheck
    unapplied: tuple[str, ...]  # switches on in the preset with no registered term
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # from TermResult terms

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "outcome_reward": self.outcome_reward,
            "terms": dict(self.terms),
            "total": self.total,
            "evidence": dataclasses.asdict(self.evidence),
            "unapplied": list(self.unapplied),
            "metrics": dict(self.metrics),
        }


async def score(traj: Trajectory, preset: Preset, terms: Iterable[RewardTerm] | None = None) -> RewardBreakdown:
    """The reward of one finished episode: outcome table, then the enabled terms, then the floor."""
    base = preset.outcome_reward(traj.outcome)
    evidence = traj.check_evidence(preset)
    terms = list(_TERMS if terms is None else terms)
    covered = {t.switch for t in terms if t.switch}
    unapplied = tuple(s for s in RESERVED_SWITCHES if getattr(preset.reward, s) and s not in covered)
    for s in unapplied:
        if s not in _warned_unimplemented:
            _warned_unimplemented.add(s)
            log.warning("preset %s sets %s but no reward term implements it yet: not applied", preset.name, s)
    if traj.outcome == "gold_error":  # the data's fault: nothing the policy did is scored
        return RewardBreakdown(traj.outcome, base, {}, base, evidence, unapplied)
    amounts: dict[str, float] = {}
    metrics: dict[str, Any] = {}
    for term in terms:
        if not term.enabled(preset):
            continue
        value = term.fn(traj, preset)
        if inspect.isawaitable(value):
            value = await value
        if isinstance(value, TermResult):
            metrics.update(value.metrics)
            value = value.amount
        amounts[term.name] = round(float(value), 10)
    total = base + sum(amounts.values())
    if not preset.reward.penalties_below_floor:
        total = max(total, preset.reward_floor)
    return RewardBreakdown(traj.outcome, base, amounts, round(total, 10), evidence, unapplied, metrics)
