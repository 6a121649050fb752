"""Every number of an episode, in one named, frozen Preset of a few named parts: budgets, prompt, tool
preview, grading, rewards, equivalence check, curriculum, loss. Nothing else in t2sql hard-codes one of them."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Sequence

from t2sql._grader import COLUMN_ORDERS, GRADE_DEFAULTS, MAX_FLOAT_DIGITS, METHODS, GradeSpec, Method, ToolLimits
from t2sql.errors import PresetError
from t2sql.tasks import Task

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


# A preset-wide method: one the core names (METHODS) that needs no count, as a subset's does.
PRESET_METHODS = tuple(m for m in METHODS if Method(m.replace("N", "1")).count is None)


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


def _at_least(part: Any, minimum: float, *names: str) -> list[str]:
    return [f"{part.PART}.{n} must be >= {minimum}" for n in names if getattr(part, n) < minimum]


def _in_unit(part: Any, *names: str) -> list[str]:
    return [f"{part.PART}.{n} must be in (0, 1]" for n in names if not 0.0 < getattr(part, n) <= 1.0]


def _positive(part: Any, *names: str) -> list[str]:
    return [f"{part.PART}.{n} must be > 0" for n in names if not getattr(part, n) > 0]


@dataclass(frozen=True)
class Budgets:
    """How much one episode may do."""

    PART: ClassVar[str] = "budgets"
    max_tool_calls: int  # calls 1..max_tool_calls run; later ones are invalid calls
    max_turns: int  # safety stop: after this many assistant turns without a solution -> no_solution
    max_turn_tokens: int  # per-turn generation limit (thinking included)
    max_context_tokens: int  # whole trajectory: prompt + every turn + every tool message

    def problems(self) -> list[str]:
        return _at_least(self, 1, "max_tool_calls", "max_turns", "max_turn_tokens", "max_context_tokens")


@dataclass(frozen=True)
class PromptLimits:
    """What the first prompt shows of the task and its database."""

    PART: ClassVar[str] = "prompt"
    schema_max_chars: int  # budget of the rendered schema block; longer ones are shortened
    example_values: int  # distinct example values shown per column (0 = none)
    example_value_chars: int  # each example value cut to this many characters
    column_descriptions: bool  # add BIRD's database_description/*.csv when present
    description_max_chars: int  # each column description cut to this many characters
    question_max_chars: int  # a task whose question is longer is refused as bad input, never cut
    evidence_max_chars: int  # a task whose evidence is longer is refused as bad input, never cut

    def problems(self) -> list[str]:
        found = _at_least(self, 1, "schema_max_chars", "example_value_chars", "description_max_chars",
                          "question_max_chars", "evidence_max_chars")
        return found + _at_least(self, 0, "example_values")


@dataclass(frozen=True)
class ToolPreview:
    """What the model sees of one execute_sql_query call (Preset.tool_limits is it as the core's one value)."""

    PART: ClassVar[str] = "tool"
    max_rows: int
    max_cell_chars: int
    max_chars: int
    count_cap: int
    timeout_s: float

    def problems(self) -> list[str]:
        return (_at_least(self, 1, "max_rows", "max_cell_chars", "max_chars", "count_cap")
                + _positive(self, "timeout_s"))


@dataclass(frozen=True)
class Grading:
    """How an answer is compared with the gold (Preset.grade_spec is it for one task)."""

    PART: ClassVar[str] = "grading"
    timeout_s: float
    method: str  # multiset | ordered | set | auto: tasks without their own method
    honor_task_methods: bool  # a task's own grading_method (BIRD-Verified's) replaces `method`
    column_order: str  # strict | ignore (each row compared as the multiset of its cells)
    float_digits: int | None
    # MiB of SQLite temporary files (sorts, DISTINCT, GROUP BY) one query may hold, for a tool call, a gold
    # and a prediction alike; past it the query fails (the model is told, a grade is pred_error)
    max_temp_mb: int

    def problems(self) -> list[str]:
        found = _positive(self, "timeout_s") + _at_least(self, 1, "max_temp_mb")
        if self.method not in PRESET_METHODS:
            found.append(f"grading.method must be one of {', '.join(PRESET_METHODS)}")
        if self.column_order not in COLUMN_ORDERS:
            found.append(f"grading.column_order must be one of {', '.join(COLUMN_ORDERS)}")
        if self.float_digits is not None and not 1 <= self.float_digits <= MAX_FLOAT_DIGITS:
            found.append(f"grading.float_digits must be None or 1..{MAX_FLOAT_DIGITS}")
        return found


@dataclass(frozen=True)
class Rewards:
    """The outcome table and every term that shapes it. A term with a switch reads its amount here by name
    (RewardTerm.switch)."""

    PART: ClassVar[str] = "reward"
    # -- the outcome table
    correct: float
    incorrect: float  # also pred_error and pred_timeout
    no_solution: float  # also turn_cut and context_cut
    unsafe: float
    gold_error: float  # the data's fault: never the reward of a correct answer
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
    # -- thresholds of the repetition guards (t2sql.episode.guards reads them)
    repetition_ngram_n: int  # word n-grams compared inside one turn
    repetition_ngram_share: float  # a turn is repetitive at this share of repeated n-grams
    repetition_min_ngrams: int  # shorter turns are never judged
    repeated_turn_similarity: float  # trigram Jaccard at which a turn repeats an earlier one

    def problems(self) -> list[str]:
        found = _at_least(self, 1, "repetition_ngram_n", "repetition_min_ngrams")
        found += _in_unit(self, "repetition_ngram_share", "repeated_turn_similarity", "evidence_share")
        if self.evidence_rule not in EVIDENCE_RULES:
            found.append(f"reward.evidence_rule must be one of {', '.join(EVIDENCE_RULES)}")
        for f in ("evidence_penalty", "invalid_tool_penalty", "invalid_tool_penalty_cap", *RESERVED_SWITCHES):
            if getattr(self, f) < 0:
                found.append(f"reward.{f} is an amount taken off: give it as a number >= 0")
        if self.gold_error >= self.correct:
            found.append("reward.gold_error must be below reward.correct (a broken gold is never correct)")
        return found


@dataclass(frozen=True)
class EquivalenceSettings:
    """The equivalence check (t2sql.episode.equivalence_term reads them; on when reward.equivalence_penalty > 0)."""

    PART: ClassVar[str] = "equivalence"
    suite_size: int  # small databases in a database's suite (besides those built for each pair)
    seed: int  # the small databases' random draws derive from it (and the database's identity)
    timeout_s: float  # per query on a small database
    budget_s: float  # one whole check: past it no further small database is tried

    def problems(self) -> list[str]:
        found = _at_least(self, 0, "suite_size") + _positive(self, "timeout_s", "budget_s")
        if not 0 <= self.seed < 1 << 64:
            found.append("equivalence.seed must be in [0, 2**64)")
        return found


@dataclass(frozen=True)
class CurriculumSettings:
    """The curriculum (t2sql.miles.curriculum reads them; a miles data source, not a reward term)."""

    PART: ClassVar[str] = "curriculum"
    enabled: bool  # hints after a 0/N group, learnability-weighted draws
    max_hint_level: int  # 0..3: evidence, + FROM/JOIN skeleton, + SELECT list
    release_share: float  # a hinted group at least this correct gives a level back (0 = never)
    weight_floor: float  # draw weight max(p(1-p), floor): no task vanishes
    weighted_from_epoch: int  # 1-based; earlier epochs are plain seeded shuffles

    def problems(self) -> list[str]:
        return []  # CurriculumConfig checks these where the curriculum is built


PARTS = {cls.PART: cls for cls in (Budgets, PromptLimits, ToolPreview, Grading, Rewards, EquivalenceSettings,
                                   CurriculumSettings)}


@dataclass(frozen=True)
class Preset:
    """Every number of an episode, in named parts. Build one with `get_preset(name)` or `preset.replace(...)`.

    No field has a default on purpose: a preset states every number, so the numbers live only in
    the PRESETS table below; the tool preview's reach the core through `tool_limits` on every call (the
    core has no preview of its own), so changing one is a change here, no rebuild.
    """

    name: str
    budgets: Budgets
    prompt: PromptLimits
    tool: ToolPreview
    grading: Grading
    reward: Rewards
    equivalence: EquivalenceSettings
    curriculum: CurriculumSettings
    # t2sql.miles.train reads it; `t2sql-train train --loss` overrides it
    loss: str  # grpo | cispo (t2sql.miles.cispo, a miles custom loss)

    def __post_init__(self) -> None:
        problems = []
        for part, cls in PARTS.items():
            value = getattr(self, part)
            if not isinstance(value, cls):
                problems.append(f"{part} must be a {cls.__name__}, got {type(value).__name__}")
            else:
                problems += value.problems()
        if self.loss not in LOSSES:
            problems.append(f"loss must be one of {', '.join(LOSSES)}")
        if problems:
            raise PresetError(f"preset {self.name!r}: " + "; ".join(problems))

    # The outcome table, row by row. pred_error/pred_timeout share the "incorrect" row,
    # turn_cut/context_cut the "no solution" row (episode.md).
    def outcome_reward(self, outcome: str) -> float:
        r = self.reward
        table = {
            "correct": r.correct,
            "incorrect": r.incorrect,
            "pred_error": r.incorrect,
            "pred_timeout": r.incorrect,
            "no_solution": r.no_solution,
            "turn_cut": r.no_solution,
            "context_cut": r.no_solution,
            "unsafe": r.unsafe,
            "gold_error": r.gold_error,
        }
        try:
            return table[outcome]
        except KeyError:
            raise PresetError(f"unknown outcome {outcome!r}; expected one of {', '.join(OUTCOMES)}") from None

    @functools.cached_property
    def tool_limits(self) -> ToolLimits:
        """The tool part (and the grading part's temporary-disk cap) as the one value a tool call takes, built
        once per preset (a frozen dataclass keeps a cached_property in its __dict__; replace() makes a new
        preset, so a new one). Raises InvalidArgument for a number the core cannot take."""
        t = self.tool
        return ToolLimits(timeout_s=t.timeout_s, max_rows=t.max_rows, max_cell_chars=t.max_cell_chars,
                          max_chars=t.max_chars, count_cap=t.count_cap, max_temp_mb=self.grading.max_temp_mb)

    def grade_spec(self, task: Task) -> GradeSpec:
        """How `task` is graded under this preset, as one value: its method (method_for, resolved
        by the core against the task's gold, once) and the grading part's float_digits, column_order,
        timeout_s, max_temp_mb.
        Built once per task (an Episode keeps it; the regrade, votes, `t2sql gold` and prepare
        build it from the same task), and carried whole to the core."""
        g = self.grading
        return GradeSpec(self.method_for(task.grading_method), gold_sql=task.gold_sql,
                         float_digits=g.float_digits, column_order=g.column_order,
                         timeout_s=g.timeout_s, max_temp_mb=g.max_temp_mb)

    def method_for(self, task_method: str | None) -> str:
        """The grading method of a task: its own (when the preset honors task methods and it has
        one), else the grading part's `method`."""
        if self.grading.honor_task_methods and task_method:
            return task_method
        return self.grading.method

    @property
    def reward_floor(self) -> float:
        """The lowest outcome reward; shaping terms never go below it unless penalties_below_floor."""
        return min(self.outcome_reward(o) for o in OUTCOMES)

    def to_dict(self) -> dict[str, Any]:
        """Every field, each part as its own dict (what eval --verbose, the rollout log and --dry-run print)."""
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Preset":
        """A copy with some fields changed (validated). A part is given whole or as a mapping of its fields
        to change, e.g. `replace(tool={"max_rows": 7})`; unknown names are an error."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        for part, given in changes.items():
            if part in PARTS and isinstance(given, dict):
                fields = {f.name for f in dataclasses.fields(PARTS[part])}
                unknown += [f"{part}.{k}" for k in sorted(set(given) - fields)]
        if unknown:
            raise PresetError(
                f"unknown preset field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}"
                " (a part's fields: its class in t2sql.episode.presets)"
            )
        parts = {part: dataclasses.replace(getattr(self, part), **given)
                 for part, given in changes.items() if part in PARTS and isinstance(given, dict)}
        return dataclasses.replace(self, **{**changes, **parts})


# The recipe, part by part.
_RECIPE = Preset(
    name="qwen3.6-35b-a3b",
    budgets=Budgets(
        max_tool_calls=5,
        max_turns=7,  # 5 tool turns, the turn told the budget is spent, one more chance to answer
        max_turn_tokens=3072,
        max_context_tokens=32768,
    ),
    prompt=PromptLimits(
        schema_max_chars=24000,  # about 6k tokens of schema
        example_values=3,
        example_value_chars=40,
        column_descriptions=True,
        description_max_chars=240,
        question_max_chars=4000,  # BIRD's longest is 330 characters
        evidence_max_chars=16000,  # BIRD's longest is 591; about 4k tokens of the 32k context
    ),
    # The tool preview: the recipe's numbers, handed to the core whole (tool_limits) on every call.
    tool=ToolPreview(
        max_rows=50,
        max_cell_chars=120,
        max_chars=4000,
        count_cap=10000,
        timeout_s=10.0,
    ),
    grading=Grading(
        timeout_s=GRADE_DEFAULTS["timeout_s"],  # 30 s: the core's, as `t2sql grade` uses
        method="multiset",
        honor_task_methods=True,  # BIRD-Verified's per-task methods: "name any five" is graded as such
        column_order="strict",
        float_digits=GRADE_DEFAULTS["float_digits"],  # 12: the core's, as `t2sql grade` uses
        max_temp_mb=GRADE_DEFAULTS["max_temp_mb"],  # 1024: the core's cap, for tool calls and grades alike
    ),
    reward=Rewards(
        correct=1.0,
        incorrect=0.0,
        no_solution=-1.0,
        unsafe=-1.0,
        gold_error=0.0,
        evidence_penalty=0.1,
        evidence_rule="enumerated",
        evidence_share=0.6,
        evidence_counts_sql=False,
        invalid_tool_penalty=0.05,
        invalid_tool_penalty_cap=0.2,
        penalties_below_floor=False,
        # The recipe's number. The check refutes none of 2,458 equivalent pairs and 85% of the lucky ones on
        # BIRD dev (docs/recipe_extras.md, "Equivalence check"); the check it replaced refuted 8% and 19%.
        equivalence_penalty=0.2,
        # The repetition guards (t2sql.episode.guards), off per counted event; our numbers, not the recipe's.
        redraft_penalty=0.1,
        repeated_tool_query_penalty=0.05,  # like an invalid call: a call spent to learn nothing
        ngram_repetition_penalty=0.1,
        repeated_turn_penalty=0.1,
        repetition_ngram_n=4,
        repetition_ngram_share=0.5,  # about "says everything twice"
        repetition_min_ngrams=40,
        repeated_turn_similarity=0.9,
    ),
    equivalence=EquivalenceSettings(
        suite_size=8,
        seed=20250601,
        timeout_s=2.0,  # a small database holds a few dozen rows: any query is done in ms
        budget_s=10.0,
    ),
    curriculum=CurriculumSettings(
        enabled=True,
        max_hint_level=3,
        release_share=0.5,
        weight_floor=0.01,  # 1/25 of the largest weight (0.25)
        weighted_from_epoch=2,
    ),
    loss="cispo",
)


PRESETS: dict[str, Preset] = {
    _RECIPE.name: _RECIPE,
    # What the published run used: the outcome table only, no shaping, no extras.
    "bare": _RECIPE.replace(
        name="bare",
        reward={
            "evidence_penalty": 0.0,
            "invalid_tool_penalty": 0.0,
            "invalid_tool_penalty_cap": 0.0,
            "equivalence_penalty": 0.0,
            "redraft_penalty": 0.0,
            "repeated_tool_query_penalty": 0.0,
            "ngram_repetition_penalty": 0.0,
            "repeated_turn_penalty": 0.0,
        },
        curriculum={"enabled": False},
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


def outcome_table(preset: Preset) -> Sequence[tuple[str, float]]:
    """(outcome, reward) for every outcome category, for printing."""
    return [(o, preset.outcome_reward(o)) for o in OUTCOMES]
