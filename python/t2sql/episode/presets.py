"""Every number of an episode, in one named, frozen Preset: budgets, tool preview caps, timeouts,
the outcome table, the shaping penalties. Nothing else in t2sql hard-codes one of them."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Sequence

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
SEMANTICS = PRESET_METHODS  # the older name


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


@dataclass(frozen=True)
class Preset:
    """Every number of an episode. Build one with `get_preset(name)` or `preset.replace(...)`.

    No field has a default on purpose: a preset states every number, so the numbers live only in
    the PRESETS table below; the tool preview's reach the core through `tool_limits` on every call (not
    the core's own defaults), so changing one is a change here, no rebuild.
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
    question_max_chars: int  # a task whose question is longer is refused as bad input, never cut
    evidence_max_chars: int  # a task whose evidence is longer is refused as bad input, never cut
    # -- tool preview (what the model sees for one execute_sql_query); `tool_limits` is them as one value
    tool_max_rows: int
    tool_max_cell_chars: int
    tool_max_chars: int
    tool_count_cap: int
    tool_timeout_s: float
    # -- grading
    grade_timeout_s: float
    method: str  # multiset | ordered | set | auto: tasks without their own method (`semantics` in replace())
    honor_task_methods: bool  # a task's own grading_method (BIRD-Verified's) replaces `method`
    column_order: str  # strict | ignore (each row compared as the multiset of its cells)
    float_digits: int | None
    # -- temporary disk: MiB of SQLite temporary files (sorts, DISTINCT, GROUP BY) one query may hold, for a
    # tool call, a gold and a prediction alike; past it the query fails (the model is told, a grade is pred_error)
    max_temp_mb: int
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
    equivalence_suite_size: int  # small databases in a database's suite (besides those built for each pair)
    equivalence_seed: int  # the small databases' random draws derive from it (and the database's identity)
    equivalence_timeout_s: float  # per query on a small database
    equivalence_budget_s: float  # one whole check: past it no further small database is tried
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
                  "tool_count_cap", "example_value_chars", "description_max_chars", "question_max_chars",
                  "evidence_max_chars"):
            if getattr(self, f) < 1:
                problems.append(f"{f} must be >= 1")
        if self.repetition_ngram_n < 1 or self.repetition_min_ngrams < 1:
            problems.append("repetition_ngram_n and repetition_min_ngrams must be >= 1")
        for f in ("repetition_ngram_share", "repeated_turn_similarity"):
            if not 0.0 < getattr(self, f) <= 1.0:
                problems.append(f"{f} must be in (0, 1]")
        if self.example_values < 0:
            problems.append("example_values must be >= 0")
        if self.max_temp_mb < 1:
            problems.append("max_temp_mb must be >= 1")
        if self.equivalence_suite_size < 0:
            problems.append("equivalence_suite_size must be >= 0")
        if not 0 <= self.equivalence_seed < 1 << 64:
            problems.append("equivalence_seed must be in [0, 2**64)")
        for f in ("tool_timeout_s", "grade_timeout_s", "equivalence_timeout_s", "equivalence_budget_s"):
            if not getattr(self, f) > 0:
                problems.append(f"{f} must be > 0")
        if self.loss not in LOSSES:
            problems.append(f"loss must be one of {', '.join(LOSSES)}")
        if self.method not in PRESET_METHODS:
            problems.append(f"method must be one of {', '.join(PRESET_METHODS)}")
        if self.column_order not in COLUMN_ORDERS:
            problems.append(f"column_order must be one of {', '.join(COLUMN_ORDERS)}")
        if self.evidence_rule not in EVIDENCE_RULES:
            problems.append(f"evidence_rule must be one of {', '.join(EVIDENCE_RULES)}")
        if self.float_digits is not None and not 1 <= self.float_digits <= MAX_FLOAT_DIGITS:
            problems.append(f"float_digits must be None or 1..{MAX_FLOAT_DIGITS}")
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

    @functools.cached_property
    def tool_limits(self) -> ToolLimits:
        """The tool_* fields as the one value a tool call takes, built once per preset (a frozen
        dataclass keeps a cached_property in its __dict__; replace() makes a new preset, so a new
        one). Raises InvalidArgument for a number the core cannot take."""
        return ToolLimits(timeout_s=self.tool_timeout_s, max_rows=self.tool_max_rows,
                          max_cell_chars=self.tool_max_cell_chars, max_chars=self.tool_max_chars,
                          count_cap=self.tool_count_cap, max_temp_mb=self.max_temp_mb)

    def grade_spec(self, task: Task) -> GradeSpec:
        """How `task` is graded under this preset, as one value: its method (method_for, resolved
        by the core against the task's gold, once), float_digits, column_order, grade_timeout_s,
        max_temp_mb.
        Built once per task (an Episode keeps it; the regrade, votes, `t2sql gold` and prepare
        build it from the same task), and carried whole to the core."""
        return GradeSpec(self.method_for(task.grading_method), gold_sql=task.gold_sql,
                         float_digits=self.float_digits, column_order=self.column_order,
                         timeout_s=self.grade_timeout_s, max_temp_mb=self.max_temp_mb)

    def method_for(self, task_method: str | None) -> str:
        """The grading method of a task: its own (when the preset honors task methods and it has
        one), else the preset's `method`."""
        if self.honor_task_methods and task_method:
            return task_method
        return self.method

    @property
    def semantics(self) -> str:
        """The older name of `method`."""
        return self.method

    @property
    def reward_floor(self) -> float:
        """The lowest outcome reward; shaping terms never go below it unless penalties_below_floor."""
        return min(self.outcome_reward(o) for o in OUTCOMES)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> "Preset":
        """A copy with some fields changed (validated); unknown field names are an error. `semantics`
        is the older name of `method`."""
        if "semantics" in changes:
            if "method" in changes:
                raise PresetError("give the method once: `semantics` is the older name of `method`")
            changes["method"] = changes.pop("semantics")
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
    question_max_chars=4000,  # BIRD's longest is 330 characters
    evidence_max_chars=16000,  # BIRD's longest is 591; about 4k tokens of the 32k context
    # The tool preview: the recipe's numbers, handed to the core whole (tool_limits) on every call.
    tool_max_rows=50,
    tool_max_cell_chars=120,
    tool_max_chars=4000,
    tool_count_cap=10000,
    tool_timeout_s=10.0,
    grade_timeout_s=GRADE_DEFAULTS["timeout_s"],  # 30 s: the core's, as `t2sql grade` uses
    method="multiset",
    honor_task_methods=True,  # BIRD-Verified's per-task methods: "name any five" is graded as such
    column_order="strict",
    float_digits=GRADE_DEFAULTS["float_digits"],  # 12: the core's, as `t2sql grade` uses
    max_temp_mb=GRADE_DEFAULTS["max_temp_mb"],  # 1024: the core's cap, for tool calls and grades alike
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
    # The recipe's number. The check refutes none of 2,458 equivalent pairs and 85% of the lucky ones on
    # BIRD dev (docs/recipe_extras.md, "Equivalence check"); the check it replaced refuted 8% and 19%.
    equivalence_penalty=0.2,
    equivalence_suite_size=8,
    equivalence_seed=20250601,
    equivalence_timeout_s=2.0,  # a small database holds a few dozen rows: any query is done in ms
    equivalence_budget_s=10.0,
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


def outcome_table(preset: Preset) -> Sequence[tuple[str, float]]:
    """(outcome, reward) for every outcome category, for printing."""
    return [(o, preset.outcome_reward(o)) for o in OUTCOMES]
