"""What the reward sees of an episode (`Trajectory`), and what a reward term is (`RewardTerm`). The numbers are the
preset's (t2sql.episode.presets), the registry and `score` t2sql.episode.terms'; the three steps (outcome table,
terms, floor): docs/episode.md, "Reward"."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, Union

from t2sql._grader import GradeSpec
from t2sql.episode.evidence import EvidenceCheck, content_tokens, coverage, evidence_labels, evidence_pieces
from t2sql.episode.presets import Preset
from t2sql.tasks import Task

if TYPE_CHECKING:
    from t2sql.serving.grader import Grader

# ---------------------------------------------------------------------------------------------
# What the reward sees of an episode


@dataclass(frozen=True)
class Trajectory:
    """The reward's view of one finished episode (built by t2sql.episode.machine)."""

    outcome: str
    evidence: str
    visible: tuple[str, ...]  # per assistant turn: text outside <think>
    prose: tuple[str, ...]  # per assistant turn: visible text without <tool_call>/<solution> blocks
    answer_turn: int | None  # 0-based index of the turn holding the solution, None if none
    invalid_tool_calls: int
    tool_queries: tuple[str, ...] = ()  # every query the model sent to the tool, in order
    solution: str | None = None
    texts: tuple[str, ...] = ()  # per assistant turn: the raw text, <think> included
    task: Task | None = dataclasses.field(default=None, compare=False)  # for terms that run SQL on its database
    grader: Grader | None = dataclasses.field(default=None, compare=False)  # where those terms run their SQL
    grade_spec: GradeSpec | None = dataclasses.field(default=None, compare=False)  # how the answer was graded

    def check_evidence(self, preset: Preset) -> EvidenceCheck:
        if preset.reward.evidence_rule == "enumerated":
            return self._check_enumerated()
        has = bool(content_tokens(self.evidence))
        turns = self.visible if preset.reward.evidence_counts_sql else self.prose
        first_two = "\n".join(turns[:2])
        restated_cov = coverage(self.evidence, first_two) if has else 0.0
        if self.answer_turn is not None and has:
            answer = turns[self.answer_turn]
            checked_cov = coverage(self.evidence, answer)
            checked = checked_cov >= preset.reward.evidence_share
        else:
            checked_cov, checked = 0.0, False
        return EvidenceCheck(
            has_evidence=has,
            restated=has and restated_cov >= preset.reward.evidence_share,
            checked=checked,
            restated_coverage=restated_cov,
            checked_coverage=checked_cov,
        )

    def _check_enumerated(self) -> EvidenceCheck:
        """The recipe's rule (module doc of t2sql.episode.reward; docs/episode.md): labelled lines in the
        visible text (outside <think>) of the first two replies and of the answer reply."""
        n = len(evidence_pieces(self.evidence))
        if n == 0:
            return EvidenceCheck(False, False, False, 0.0, 0.0, "enumerated", 0, False)
        restated = max((evidence_labels(t, "requirement", n) for t in self.visible[:2]), default=0)
        checked = 0
        if self.answer_turn is not None:
            checked = evidence_labels(self.visible[self.answer_turn], "verification", n)
        return EvidenceCheck(
            has_evidence=True,
            restated=restated >= n,
            checked=checked >= n,
            restated_coverage=restated / n,
            checked_coverage=checked / n,
            rule="enumerated",
            pieces=n,
            first_reply_answer=self.answer_turn == 0,
        )


# ---------------------------------------------------------------------------------------------
# Terms

@dataclass(frozen=True)
class TermResult:
    """What a term may return instead of a bare float: the amount plus named metrics for the
    episode (they land in `RewardBreakdown.metrics`, then in the episode's metrics)."""

    amount: float
    metrics: Mapping[str, Any] = dataclasses.field(default_factory=dict)


TermValue = Union[float, TermResult, Awaitable[Union[float, TermResult]]]


@dataclass(frozen=True)
class RewardTerm:
    """One shaping term: `fn(trajectory, preset)` returns the signed amount it adds (penalties < 0),
    as a float, a `TermResult` (amount + metrics) or an awaitable of either (a term may run SQL).

    `switch` names the preset field that turns the term on (a nonzero number or True).
    """

    name: str
    fn: Callable[[Trajectory, Preset], TermValue]
    switch: str | None = None

    def enabled(self, preset: Preset) -> bool:
        return self.switch is None or bool(getattr(preset.reward, self.switch))


def _evidence_term(traj: Trajectory, preset: Preset) -> float:
    return -preset.reward.evidence_penalty * traj.check_evidence(preset).skipped


def _invalid_tool_term(traj: Trajectory, preset: Preset) -> float:
    return -min(preset.reward.invalid_tool_penalty * traj.invalid_tool_calls, preset.reward.invalid_tool_penalty_cap)


# The built-in terms; t2sql.episode.terms registers them with the recipe extras.
BASE_TERMS: tuple[RewardTerm, ...] = (
    RewardTerm("evidence", _evidence_term, switch="evidence_penalty"),
    RewardTerm("invalid_tool_calls", _invalid_tool_term, switch="invalid_tool_penalty"),
)
