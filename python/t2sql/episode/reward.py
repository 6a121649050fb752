"""Reward terms and the recipe presets.

Every number of an episode lives here, in one named, frozen `Preset`: budgets, tool preview caps,
timeouts, the outcome table, the shaping penalties. Nothing else in t2sql hard-codes one of them.

The reward of an episode is computed in three steps (docs/episode.md states them for users):

1. The outcome table: one outcome category per episode, one reward per category
   (correct 1, incorrect 0, no solution -1, unsafe -1; pred_error and pred_timeout are rewarded as
   incorrect, turn_cut and context_cut as no solution; gold_error gets `reward_gold_error`, never the
   reward of a correct answer, and no other term: a broken gold is the data's fault).
2. The terms: each registered `RewardTerm` whose switch is on in the preset adds a signed amount
   (penalties are negative). Built in: the evidence rules and the invalid-tool-call penalty.
   Other modules add the recipe extras with `register_term` without touching this file.
3. The floor: unless `penalties_below_floor`, the total never goes below the lowest outcome reward
   (-1): an unsafe or unanswered episode scores exactly -1, and no shaping term can push a
   wrong-but-answered episode below it. Why: -1 must stay "the worst thing you can do", so the
   policy never trades an answer for tidier formatting.

The evidence rules. `preset.evidence_rule` chooses one of two.

"enumerated" (the recipe's; `evidence_pieces`, `evidence_labels`):
- the evidence splits on ';' into n pieces (blank pieces dropped); no piece: no evidence rules;
- the prompt asks for one line per piece, `Requirement of external knowledge i (<piece>): ...` in the
  first or second reply and `Verification of external knowledge i (<piece>): ...` in the answer reply;
- "restated": one of the first two assistant turns holds the Requirement labels of every i = 1..n;
  "checked": the answer turn holds the Verification labels of every i = 1..n. A label is the words
  and the number up to its opening parenthesis, in any case and spacing; the text in the parentheses
  is not compared (a model may shorten a long piece). Only visible text counts, never <think>: the
  rule is about what the reply states, and a server's reasoning parser may drop thinking anyway;
- a solution in the very first reply needs only one of the two (one penalty only when both are
  missing).

"coverage" (made checkable with content tokens; see `content_tokens`):
- content tokens of a text: lower-cased runs of letters, digits and underscores (an identifier such
  as `bond_type` stays one token; `T1.name` is `t1` and `name`), a decimal number such as `2.5` is one
  token; punctuation is dropped and so are the stop words in `STOP_WORDS` (English function words and
  BIRD's "refers to" boilerplate). Tokens are compared as a set.
- "restated": the prose of assistant turns 1-2 covers at least `evidence_share` of the evidence's
  content tokens.
- "checked": the prose of the answer turn (the turn holding `<solution>`) covers the same share.
  Quoting the evidence verbatim always meets it (a quote covers every token), so episode.md's "or
  quotes the evidence" needs no rule of its own. No answer turn: not checked.
- prose is the visible text (outside `<think>`) without the `<tool_call>` and `<solution>` blocks,
  unless `evidence_counts_sql`: then the SQL inside them counts too. Why the default: a query that
  merely uses `gender = 'Female'` is not a restatement, and counting it would make the rule free.
- a task whose evidence has no content tokens (empty, or stop words only) has no evidence rules.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence, Union

log = logging.getLogger(__name__)

OUTCOMES: tuple[str, ...] = (
    "correct",
    "incorrect",
    "pred_error",
    "pred_timeout",
    "no_solution",
    "turn_cut",
    "context_cut",
    "unsafe",
    "gold_error",
)

SEMANTICS = ("multiset", "ordered", "set", "auto")
COLUMN_ORDERS = ("strict", "ignore")
EVIDENCE_RULES = ("enumerated", "coverage")
LOSSES = ("grpo", "cispo")  # t2sql.miles.train's loss blocks

# Switches reserved for the recipe extras (equivalence check, re-draft and repetition guards).
# They live in every preset so runs print them, but no built-in term reads them: the module that
# implements one registers a RewardTerm with `switch=<name>`.
RESERVED_SWITCHES: tuple[str, ...] = (
    "equivalence_penalty",
    "redraft_penalty",
    "repeated_tool_query_penalty",
    "ngram_repetition_penalty",
    "repeated_turn_penalty",
)


class PresetError(ValueError):
    """An unknown preset name, an unknown field, or a value out of range."""


@dataclass(frozen=True)
class Preset:
    """Every number of an episode. Build one with `get_preset(name)` or `preset.replace(...)`.

    No field has a default on purpose: a preset states every number, so the numbers live only in
    the PRESETS table below.
    """

    name: str
    # -- episode budgets
    max_tool_calls: int  # calls 1..max_tool_calls run; later ones are invalid calls
    max_turns: int  # safety stop: after this many assistant turns without a solution -> no_solution
    max_turn_tokens: int  # per-turn generation limit (thinking included)
    max_context_tokens: int  # whole trajectory: prompt + every turn + every tool message
    # -- prompt
    schema_max_chars: int  # budget of the rendered schema block; longer ones are shortened
    example_values: int  # distinct example values shown per column (0 = none)
    example_value_chars: int  # each example value cut to this many characters
    column_descriptions: bool  # add BIRD's database_description/*.csv when present
    description_max_chars: int  # each column description cut to this many characters
    # -- tool preview (what the model sees for one execute_sql_query)
    tool_max_rows: int
    tool_max_cell_chars: int
    tool_max_chars: int
    tool_count_cap: int
    tool_timeout_s: float
    # -- grading
    grade_timeout_s: float
    semantics: str  # multiset | ordered | set | auto: tasks without their own method
    honor_task_methods: bool  # a task's own grading_method (BIRD-Verified's) replaces `semantics`
    column_order: str  # strict | ignore (each row compared as the multiset of its cells)
    float_digits: int | None
    # -- the outcome table
    reward_correct: float
    reward_incorrect: float  # also pred_error and pred_timeout
    reward_no_solution: float  # also turn_cut and context_cut
    reward_unsafe: float
    reward_gold_error: float  # the data's fault: never the reward of a correct answer
    # -- shaping terms
    evidence_penalty: float  # off per evidence rule skipped (only when the task has evidence)
    evidence_rule: str  # enumerated (the recipe's labelled lines) | coverage (content-token share)
    evidence_share: float  # coverage: share of evidence content tokens a turn must cover
    evidence_counts_sql: bool  # count SQL in tool calls/solutions as restating the evidence
    invalid_tool_penalty: float  # off per invalid tool call ...
    invalid_tool_penalty_cap: float  # ... up to this much in total
    penalties_below_floor: bool  # False: the total never goes below the lowest outcome reward
    # -- reserved for the recipe extras (see RESERVED_SWITCHES); 0 = off
    equivalence_penalty: float
    redraft_penalty: float
    repeated_tool_query_penalty: float
    ngram_repetition_penalty: float
    repeated_turn_penalty: float
    # -- the equivalence check (t2sql.episode.equivalence reads them; on when equivalence_penalty > 0)
    equivalence_copies: int  # perturbed copies per correct episode: sample, duplicate, shuffle, nullify, sample, ...
    equivalence_seed: int  # the copies' seeds derive from it (not from the task: copies are shared)
    equivalence_max_bytes: int  # larger databases are not copied into memory: the check is skipped
    equivalence_timeout_s: float  # per query on a copy
    # -- thresholds of the repetition guards (t2sql.episode.guards reads them)
    repetition_ngram_n: int  # word n-grams compared inside one turn
    repetition_ngram_share: float  # a turn is repetitive at this share of repeated n-grams
    repetition_min_ngrams: int  # shorter turns are never judged
    repeated_turn_similarity: float  # trigram Jaccard at which a turn repeats an earlier one
    # -- the curriculum (t2sql.miles.curriculum reads them; a miles data source, not a reward term)
    curriculum: bool  # hints after a 0/N group, learnability-weighted draws
    curriculum_max_hint_level: int  # 0..3: evidence, + FROM/JOIN skeleton, + SELECT list
    curriculum_release_share: float  # a hinted group at least this correct gives a level back (0 = never)
    curriculum_weight_floor: float  # draw weight max(p(1-p), floor): no task vanishes
    curriculum_weighted_from_epoch: int  # 1-based; earlier epochs are plain seeded shuffles
    # -- training (t2sql.miles.train reads it; `t2sql-train train --loss` overrides it)
    loss: str  # grpo | cispo (t2sql.miles.cispo, a miles custom loss)

    def __post_init__(self) -> None:
        problems = []
        for f in ("max_tool_calls", "max_turns", "max_turn_tokens", "max_context_tokens"):
            if getattr(self, f) < 1:
                problems.append(f"{f} must be >= 1")
        for f in ("schema_max_chars", "tool_max_rows", "tool_max_cell_chars", "tool_max_chars",
                  "tool_count_cap", "example_value_chars", "description_max_chars"):
            if getattr(self, f) < 1:
                problems.append(f"{f} must be >= 1")
        if self.repetition_ngram_n < 1 or self.repetition_min_ngrams < 1:
            problems.append("repetition_ngram_n and repetition_min_ngrams must be >= 1")
        for f in ("repetition_ngram_share", "repeated_turn_similarity"):
            if not 0.0 < getattr(self, f) <= 1.0:
                problems.append(f"{f} must be in (0, 1]")
        if self.example_values < 0:
            problems.append("example_values must be >= 0")
        if self.equivalence_copies < 1 or self.equivalence_max_bytes < 1:
            problems.append("equivalence_copies and equivalence_max_bytes must be >= 1")
        if not 0 <= self.equivalence_seed < 1 << 64:
            problems.append("equivalence_seed must be in [0, 2**64)")
        for f in ("tool_timeout_s", "grade_timeout_s", "equivalence_timeout_s"):
            if not getattr(self, f) > 0:
                problems.append(f"{f} must be > 0")
        if self.loss not in LOSSES:
            problems.append(f"loss must be one of {', '.join(LOSSES)}")
        if self.semantics not in SEMANTICS:
            problems.append(f"semantics must be one of {', '.join(SEMANTICS)}")
        if self.column_order not in COLUMN_ORDERS:
            problems.append(f"column_order must be one of {', '.join(COLUMN_ORDERS)}")
        if self.evidence_rule not in EVIDENCE_RULES:
            problems.append(f"evidence_rule must be one of {', '.join(EVIDENCE_RULES)}")
        if self.float_digits is not None and not 1 <= self.float_digits <= 17:
            problems.append("float_digits must be None or 1..17")
        if not 0.0 < self.evidence_share <= 1.0:
            problems.append("evidence_share must be in (0, 1]")
        for f in ("evidence_penalty", "invalid_tool_penalty", "invalid_tool_penalty_cap",
                  *RESERVED_SWITCHES):
            if getattr(self, f) < 0:
                problems.append(f"{f} is an amount taken off: give it as a number >= 0")
        if self.reward_gold_error >= self.reward_correct:
            problems.append("reward_gold_error must be below reward_correct (a broken gold is never correct)")
        if problems:
            raise PresetError(f"preset {self.name!r}: " + "; ".join(problems))

    # The outcome table, row by row. pred_error/pred_timeout share the "incorrect" row,
    # turn_cut/context_cut the "no solution" row (episode.md).
    def outcome_reward(self, outcome: str) -> float:
        table = {
            "correct": self.reward_correct,
            "incorrect": self.reward_incorrect,
            "pred_error": self.reward_incorrect,
            "pred_timeout": self.reward_incorrect,
            "no_solution": self.reward_no_solution,
            "turn_cut": self.reward_no_solution,
            "context_cut": self.reward_no_solution,
            "unsafe": self.reward_unsafe,
            "gold_error": self.reward_gold_error,
        }
        try:
            return table[outcome]
        except KeyError:
            raise PresetError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}") from None

    def method_for(self, task_method: str | None) -> str:
        """The grading method of a task: its own (when the preset honors task methods and it has
        one), else the preset's `semantics`."""
        if self.honor_task_methods and task_method:
            return task_method
        return self.semantics

    @property
    def reward_floor(self) -> float:
        """The lowest outcome reward; shaping terms never go below it unless penalties_below_floor."""
        return min(self.outcome_reward(o) for o in OUTCOMES)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Preset":
        """A copy with some fields changed (validated); unknown field names are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise PresetError(
                f"unknown preset field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}"
            )
        return dataclasses.replace(self, **changes)


_RECIPE = Preset(
    name="qwen3.6-35b-a3b",
    max_tool_calls=5,
    max_turns=7,  # 5 tool turns, the turn told the budget is spent, one more chance to answer
    max_turn_tokens=3072,
    max_context_tokens=32768,
    schema_max_chars=24000,  # about 6k tokens of schema
    example_values=3,
    example_value_chars=40,
    column_descriptions=True,
    description_max_chars=240,
    tool_max_rows=50,
    tool_max_cell_chars=120,
    tool_max_chars=4000,
    tool_count_cap=10000,
    tool_timeout_s=10.0,
    grade_timeout_s=30.0,
    semantics="multiset",
    honor_task_methods=True,  # BIRD-Verified's per-task methods: "name any five" is graded as such
    column_order="strict",
    float_digits=12,
    reward_correct=1.0,
    reward_incorrect=0.0,
    reward_no_solution=-1.0,
    reward_unsafe=-1.0,
    reward_gold_error=0.0,
    evidence_penalty=0.1,
    evidence_rule="enumerated",
    evidence_share=0.6,
    evidence_counts_sql=False,
    invalid_tool_penalty=0.05,
    invalid_tool_penalty_cap=0.2,
    penalties_below_floor=False,
    equivalence_penalty=0.2,  # the recipe's number (t2sql.episode.equivalence)
    equivalence_copies=6,  # 24.2% of derived false positives on BIRD dev refuted, no equivalent rewrite
    equivalence_seed=20250601,
    equivalence_max_bytes=128 * 1024 * 1024,  # 6 copies of the largest fit the 1 GiB copy cache
    equivalence_timeout_s=10.0,
    # The repetition guards (t2sql.episode.guards), off per counted event; our numbers, not the recipe's.
    redraft_penalty=0.1,
    repeated_tool_query_penalty=0.05,  # like an invalid call: a call spent to learn nothing
    ngram_repetition_penalty=0.1,
    repeated_turn_penalty=0.1,
    repetition_ngram_n=4,
    repetition_ngram_share=0.5,  # about "says everything twice"
    repetition_min_ngrams=40,
    repeated_turn_similarity=0.9,
    curriculum=True,
    curriculum_max_hint_level=3,
    curriculum_release_share=0.5,
    curriculum_weight_floor=0.01,  # 1/25 of the largest weight (0.25)
    curriculum_weighted_from_epoch=2,
    loss="cispo",
)

PRESETS: dict[str, Preset] = {
    _RECIPE.name: _RECIPE,
    # What the published run used: the outcome table only, no shaping, no extras.
    "bare": _RECIPE.replace(
        name="bare",
        evidence_penalty=0.0,
        invalid_tool_penalty=0.0,
        invalid_tool_penalty_cap=0.0,
        equivalence_penalty=0.0,
        redraft_penalty=0.0,
        repeated_tool_query_penalty=0.0,
        ngram_repetition_penalty=0.0,
        repeated_turn_penalty=0.0,
        curriculum=False,
        loss="grpo",
    ),
}

DEFAULT_PRESET = _RECIPE.name


def get_preset(name: str | None = None) -> Preset:
    """The named preset (default: the recipe's). Unknown names list the known ones."""
    name = DEFAULT_PRESET if name is None else name
    try:
        return PRESETS[name]
    except KeyError:
        raise PresetError(f"unknown preset {name!r}; choose one of: {', '.join(sorted(PRESETS))}") from None


# ---------------------------------------------------------------------------------------------
# Evidence rules

# English function words plus BIRD's evidence boilerplate ("X refers to Y", "commonsense evidence").
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being below
    between both but by can could did do does doing down during each few for from further had has have
    having he her here hers herself him himself his how i if in into is it its itself just me more most
    my myself no nor not now of off on once only or other our ours ourselves out over own same she should
    so some such than that the their theirs them themselves then there these they this those through to
    too under until up very was we were what when where which while who whom why will with would you your
    yours yourself yourselves also eg ie etc
    refer refers referred referring refer's mean means meaning meant denote denotes stands
    commonsense evidence
    """.split()
)

_TOKEN = re.compile(r"\d+(?:\.\d+)+|\w+")


def content_tokens(text: str) -> frozenset[str]:
    """The content tokens of a text (see the module doc for the exact rule)."""
    return frozenset(t for t in _TOKEN.findall(text.lower()) if t not in STOP_WORDS)


def coverage(evidence: str, text: str) -> float:
    """Share of the evidence's content tokens that appear in `text` (1.0 when there are none)."""
    wanted = content_tokens(evidence)
    if not wanted:
        return 1.0
    return len(wanted & content_tokens(text)) / len(wanted)


def evidence_pieces(evidence: str) -> list[str]:
    """The recipe's evidence pieces: the evidence split on ';', blank pieces dropped."""
    return [piece.strip() for piece in evidence.split(";") if piece.strip()]


def evidence_label_lines(pieces: list[str], kind: str, answer: str) -> str:
    """The recipe's labelled lines, one per piece: `<kind> of external knowledge i (<piece>): <answer>`
    for kind "Requirement" or "Verification" (what the prompt asks for and `evidence_labels` counts)."""
    return "".join(f"{kind} of external knowledge {i} ({piece}): {answer}\n" for i, piece in enumerate(pieces, 1))


# "Requirement of external knowledge 2 (" / "Verification of external knowledge 2 (": any case,
# any spacing (also around the number and before the parenthesis).
_LABEL = re.compile(r"(requirement|verification)\s+of\s+external\s+knowledge\s*(\d+)\s*\(", re.IGNORECASE)


def evidence_labels(text: str, kind: str, pieces: int) -> int:
    """How many of the labels `<kind> of external knowledge i (` for i = 1..pieces `text` holds
    (each number counts once: writing label 1 five times is one label)."""
    found = {int(m.group(2)) for m in _LABEL.finditer(text) if m.group(1).lower() == kind}
    return len(found & set(range(1, pieces + 1)))


@dataclass(frozen=True)
class EvidenceCheck:
    has_evidence: bool
    restated: bool
    checked: bool
    restated_coverage: float  # coverage: the token share; enumerated: the share of labels found
    checked_coverage: float
    rule: str = "coverage"
    pieces: int = 0  # enumerated: the evidence's pieces
    first_reply_answer: bool = False  # the solution came in the very first reply

    @property
    def skipped(self) -> int:
        """Rules the trajectory skipped (0 when the task has no evidence). Enumerated rule: a
        solution in the very first reply needs only one of the two blocks."""
        if not self.has_evidence:
            return 0
        missing = int(not self.restated) + int(not self.checked)
        if self.rule == "enumerated" and self.first_reply_answer:
            return int(missing == 2)
        return missing

    @property
    def met(self) -> int:
        return int(self.restated) + int(self.checked) if self.has_evidence else 0


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
    task: Any = dataclasses.field(default=None, compare=False)  # t2sql.episode.machine.Task
    grade: Any = dataclasses.field(default=None, compare=False)  # the grader's GradeResult
    grader: Any = dataclasses.field(default=None, compare=False)  # for terms that run SQL

    def check_evidence(self, preset: Preset) -> EvidenceCheck:
        if preset.evidence_rule == "enumerated":
            return self._check_enumerated()
        has = bool(content_tokens(self.evidence))
        turns = self.visible if preset.evidence_counts_sql else self.prose
        first_two = "\n".join(turns[:2])
        restated_cov = coverage(self.evidence, first_two) if has else 0.0
        if self.answer_turn is not None and has:
            answer = turns[self.answer_turn]
            checked_cov = coverage(self.evidence, answer)
            checked = checked_cov >= preset.evidence_share
        else:
            checked_cov, checked = 0.0, False
        return EvidenceCheck(
            has_evidence=has,
            restated=has and restated_cov >= preset.evidence_share,
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
        return self.switch is None or bool(getattr(preset, self.switch))


def _evidence_term(traj: Trajectory, preset: Preset) -> float:
    return -preset.evidence_penalty * traj.check_evidence(preset).skipped


def _invalid_tool_term(traj: Trajectory, preset: Preset) -> float:
    return -min(preset.invalid_tool_penalty * traj.invalid_tool_calls, preset.invalid_tool_penalty_cap)


_TERMS: list[RewardTerm] = [
    RewardTerm("evidence", _evidence_term, switch="evidence_penalty"),
    RewardTerm("invalid_tool_calls", _invalid_tool_term, switch="invalid_tool_penalty"),
]
_warned_unimplemented: set[str] = set()


def register_term(term: RewardTerm) -> None:
    """Add a term (or replace the one of the same name). Recipe extras use their reserved switch."""
    if term.switch is not None and term.switch not in {f.name for f in dataclasses.fields(Preset)}:
        raise PresetError(f"term {term.name!r}: switch {term.switch!r} is not a preset field")
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
    unapplied = tuple(s for s in RESERVED_SWITCHES if getattr(preset, s) and s not in covered)
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
    if not preset.penalties_below_floor:
        total = max(total, preset.reward_floor)
    return RewardBreakdown(traj.outcome, base, amounts, round(total, 10), evidence, unapplied, metrics)


def outcome_table(preset: Preset) -> Sequence[tuple[str, float]]:
    """(outcome, reward) for every outcome category, for printing."""
    return [(o, preset.outcome_reward(o)) for o in OUTCOMES]


# The recipe extras' terms, registered here so every importer of t2sql.episode.reward scores with them.
# (t2sql.episode.guards and t2sql.episode.equivalence import this module only inside functions, after it exists.)
from t2sql.episode import guards as _guards  # noqa: E402

from t2sql.episode import equivalence as _equivalence  # noqa: E402

for _term in (*_guards.reward_terms(), *_equivalence.reward_terms()):
    register_term(_term)
