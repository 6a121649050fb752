"""The episode state machine: one assistant turn in, the next action out (`Episode.on_turn`), or the same rules one
call at a time (`record_turn`, `call_tool`, `finish`, on which `on_turn` is written). It knows nothing about
miles, tokens or HTTP. The rules, in order: docs/episode.md, "One turn, in this order"."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import t2sql
from t2sql.episode import parsing, terms
from t2sql.episode import prompt as prompts
from t2sql.episode import reward as rewards
from t2sql.episode.budget import Budget
from t2sql.episode.presets import Preset
from t2sql.errors import EpisodeFinished
from t2sql.tasks import Task

if TYPE_CHECKING:
    from t2sql.serving.grader import Grader

CUTS = (None, "turn", "context")


# The grader's verdict outcome -> the episode's outcome category.
VERDICT_OUTCOMES: dict[str, str] = {
    "match": "correct",
    "mismatch": "incorrect",
    "pred_error": "pred_error",
    "pred_timeout": "pred_timeout",
    "unsafe": "unsafe",
    "gold_error": "gold_error",
    "gold_timeout": "gold_error",
}


@dataclass(frozen=True)
class TurnOutcome:
    done: bool
    tool_messages: list[dict[str, Any]]  # appended to episode.messages; [] when done


@dataclass(frozen=True)
class EpisodeResult:
    outcome: str  # one of t2sql.episode.presets.OUTCOMES
    reward: float
    correct: bool  # what evaluation scores
    solution: str | None
    turns: int
    tool_calls: int  # every call the model made, past the budget and malformed ones included
    invalid_tool_calls: int
    has_evidence: bool
    evidence_restated: bool
    evidence_checked: bool
    detail: str  # why the episode ended (grader detail, error text, cut)
    reward_terms: dict[str, float]  # every enabled shaping term's signed amount
    grade: dict[str, Any] | None  # the grader's GradeResult, when graded
    metrics: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The episode record, every field as plain JSON: what `t2sql eval` writes per episode and
        the miles adapter keeps in sample.metadata (the one list of the fields)."""
        record = dataclasses.asdict(self)
        record.update(reward=float(self.reward), correct=bool(self.correct), has_evidence=bool(self.has_evidence))
        return record


@dataclass
class _Turn:
    text: str
    think: str
    visible: str
    prose: str
    think_tokens: int


def whitespace_tokens(text: str) -> int:
    """The default token count for metrics: whitespace-separated words (a tokenizer can be hooked)."""
    return len(text.split())


def _check_cut(cut: str | None) -> None:
    if cut not in CUTS:
        raise ValueError(f"cut must be None, 'turn' or 'context', got {cut!r}")


class Episode:
    def __init__(
        self,
        task: Task,
        preset: Preset,
        grader: Grader,
        *,
        prompt: Sequence[Mapping[str, Any]] | None = None,
        count_tokens: Callable[[str], int] | None = None,
    ):
        """`prompt`: the [system, user] messages if already built (a converted data row carries
        them); otherwise built here (the first episode of a database runs SQL for example values:
        from async code build it with `t2sql.episode.prompt.build_prompt_async` and pass it in)."""
        self.task = task
        self.preset = preset
        self.grader = grader
        self.count_tokens = count_tokens or whitespace_tokens
        built = prompt if prompt is not None else prompts.build_prompt(task, preset)
        self.messages: list[dict[str, Any]] = [dict(m) for m in built]
        self.tools: list[dict[str, Any]] = prompts.tool_specs()
        self.grade_spec = preset.grade_spec(task)  # how the answer is graded: built once, carried whole
        self.result: EpisodeResult | None = None
        self._turns: list[_Turn] = []
        self._tool_calls = 0
        self._invalid = 0
        self._executed = 0
        self._tool_queries: list[str] = []
        self._tool_errors = 0
        self._tool_elapsed = 0.0
        self._started = time.monotonic()

    # -- budgets the adapters ask for

    @property
    def done(self) -> bool:
        return self.result is not None

    @property
    def tool_calls_left(self) -> int:
        return max(0, self.preset.budgets.max_tool_calls - self._tool_calls)

    def turn_token_budget(self, context_tokens_used: int = 0) -> int:
        """Tokens the next turn may generate: the per-turn limit, never past the context budget.
        <= 0 means the context is full: end the episode with `on_turn("", cut="context")`."""
        return Budget.of(self.preset).room(context_tokens_used)

    # -- the state machine: whole turns

    async def on_turn(
        self, text: str, *, cut: str | None = None, tool_calls: Sequence[Any] | None = None
    ) -> TurnOutcome:
        """Take one assistant turn (the full text, <think> included) and act on it: written on the
        per-call API below (`record_turn`, `call_tool`, the answer of `finish`), so the two cannot drift."""
        self._check_open()
        _check_cut(cut)
        turn = self.record_turn(text, tool_calls=tool_calls)
        if cut is not None or parsing.parse_solution(turn.visible) is not None:
            await self._answer(turn, cut)
            return TurnOutcome(True, [])

        calls = (parsing.parse_structured_tool_calls(tool_calls) if tool_calls
                 else parsing.parse_tool_calls(turn.visible))
        if not calls:
            await self._finish("no_solution", "the turn has neither a tool call nor a <solution>")
            return TurnOutcome(True, [])

        tool_messages: list[dict[str, Any]] = []
        for call in calls:
            content = await self.call_tool(call)
            if self.result is not None:  # an unsafe query ended the episode
                return TurnOutcome(True, [])
            tool_message: dict[str, Any] = {"role": "tool", "name": prompts.TOOL_NAME, "content": content}
            if call.id:
                tool_message["tool_call_id"] = call.id
            tool_messages.append(tool_message)

        if len(self._turns) >= self.preset.budgets.max_turns:
            await self._finish("no_solution", f"no <solution> within max_turns={self.preset.budgets.max_turns} turns")
            return TurnOutcome(True, [])
        self.messages.extend(tool_messages)
        return TurnOutcome(False, tool_messages)

    # -- the state machine: one call at a time (frameworks that run tools themselves)

    def record_turn(self, text: str, *, tool_calls: Sequence[Any] | None = None) -> _Turn:
        """Record one assistant turn's text without acting on it: a framework that runs the turn's tool
        calls one at a time (`call_tool`) records the text they came in here, so the evidence rules
        read it. `finish` and `on_turn` record their turn themselves."""
        self._check_open()
        text = text or ""
        think, visible = parsing.split_think(text)
        turn = _Turn(text, think, visible, parsing.prose(visible), self.count_tokens(think))
        self._turns.append(turn)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = [dict(c) if isinstance(c, Mapping) else c for c in tool_calls]
        self.messages.append(message)
        return turn

    async def call_tool(self, arguments: Mapping[str, Any] | str | parsing.ToolCall, *,
                        call_id: str | None = None) -> str:
        """Run one tool call and return the tool message's text. `arguments`: the call's arguments
        (`{"query": SQL}` or their JSON text) or a parsed call. The same budget, invalid-call and unsafe
        rules (and penalties) as inside a turn: every call takes the next number; a malformed call or
        one past the budget is not run and counts as invalid; an unsafe query ends the episode at once
        (`done` is then True and the returned text says so). The caller keeps the conversation:
        `episode.messages` is not extended here."""
        self._check_open()
        call = arguments if isinstance(arguments, parsing.ToolCall) else parsing.tool_call_from_arguments(
            arguments, call_id)
        content = await self._run_call(call)
        if self.result is not None:
            return f"Error: {self.result.detail}; the episode has ended ({self.result.outcome})."
        return content

    async def finish(self, text: str, *, cut: str | None = None) -> EpisodeResult:
        """The answer turn: record `text` and end the episode, graded as `on_turn` grades a turn with
        a <solution> (cut="turn"/"context": the turn was cut, never graded; no <solution>: no_solution).
        Returns the episode's result."""
        self._check_open()
        _check_cut(cut)
        turn = self.record_turn(text)
        await self._answer(turn, cut, "the turn has neither a tool call nor a <solution>"
                           if not parsing.parse_tool_calls(turn.visible) else "the answer turn has no <solution>")
        assert self.result is not None
        return self.result

    def _check_open(self) -> None:
        if self.result is not None:
            raise EpisodeFinished(
                f"episode {self.task.question_id} already ended ({self.result.outcome}); start a new Episode"
            )

    async def _answer(self, turn: _Turn, cut: str | None, no_solution: str = "") -> None:
        """End the episode on its answer turn: a cut, the last <solution> graded, or no solution."""
        if cut == "context":
            await self._finish("context_cut", "the context budget cut the turn (never graded)")
            return
        if cut == "turn":
            await self._finish("turn_cut", f"the turn reached max_turn_tokens={self.preset.budgets.max_turn_tokens}")
            return
        solution = parsing.parse_solution(turn.visible)
        if solution is None:
            await self._finish("no_solution", no_solution)
        elif not solution.strip():
            # An empty block answers nothing: log it as no_solution, not as the core's "unsafe".
            await self._finish("no_solution", "the <solution> block is empty")
        else:
            await self._grade(solution)

    async def _run_call(self, call: parsing.ToolCall) -> str:
        self._tool_calls += 1
        number, budget = self._tool_calls, self.preset.budgets.max_tool_calls
        if call.query is not None:
            self._tool_queries.append(call.query)
        if number > budget:
            self._invalid += 1
            return (f"Error: the tool budget is spent ({budget} calls); this call was not run. "
                    "Give your final answer now: one SQLite query inside <solution>...</solution>.")
        if not call.valid:
            self._invalid += 1
            return (f"Error: invalid tool call ({call.error}); it was not run but counts as one of your "
                    f"{budget} calls. Call the tool like this:\n{prompts.EXPECTED_FORM}"
                    + self._calls_left_note(number, budget))
        limits = self.preset.tool_limits
        started = time.monotonic()
        try:
            content = (await self.grader.run_tool(self.task.db_path, call.query, limits)).text
        except t2sql.UnsafeQuery as e:
            self._executed += 1
            await self._finish("unsafe", f"unsafe query in tool call {number}: {e}")
            return ""
        except t2sql.QueryTimeout:
            self._tool_errors += 1
            content = f"Error: query timed out after {limits.timeout_s:g}s"
        except t2sql.TempDiskExceeded:  # the model can write a cheaper query, not raise the cap
            self._tool_errors += 1
            content = (f"Error: the query used too much temporary disk (over {limits.max_temp_mb} MiB for sorting, "
                       "DISTINCT, GROUP BY or intermediate results) and was stopped; write a cheaper query, "
                       "e.g. filter before joining and avoid cross joins")
        except t2sql.SqlError as e:
            self._tool_errors += 1
            content = f"Error: {e}"
        except t2sql.DatabaseError as e:
            await self._finish("gold_error", f"the task's database failed in tool call {number}: {e}")
            return ""
        finally:
            self._tool_elapsed += time.monotonic() - started
        self._executed += 1
        return content + self._calls_left_note(number, budget)

    @staticmethod
    def _calls_left_note(number: int, budget: int) -> str:
        """Every tool result says how many calls are left (the recipe's tool preview)."""
        if number >= budget:
            return (f"\n\n(That was your last tool call: {budget} of {budget} used. "
                    "Answer next with <solution>...</solution>.)")
        left = budget - number
        return f"\n\n({left} tool call{'s' if left != 1 else ''} left.)"

    async def _grade(self, solution: str) -> None:
        try:
            graded = await self.grader.grade(self.task.db_path, solution, self.task.gold_sql, self.grade_spec)
        except t2sql.DatabaseError as e:
            await self._finish("gold_error", f"the task's database failed at grading: {e}", solution=solution)
            return
        outcome = VERDICT_OUTCOMES.get(graded.outcome)
        if outcome is None:
            raise RuntimeError(f"the grader returned an unknown outcome {graded.outcome!r}")
        grade = graded.to_dict()
        await self._finish(outcome, graded.detail or graded.outcome, solution=solution, grade=grade)

    async def _finish(self, outcome: str, detail: str, *, solution: str | None = None,
                      grade: dict[str, Any] | None = None) -> None:
        answer_turn = len(self._turns) - 1 if solution is not None else None
        trajectory = rewards.Trajectory(
            outcome=outcome,
            evidence=self.task.evidence,
            visible=tuple(t.visible for t in self._turns),
            prose=tuple(t.prose for t in self._turns),
            answer_turn=answer_turn,
            invalid_tool_calls=self._invalid,
            tool_queries=tuple(self._tool_queries),
            solution=solution,
            texts=tuple(t.text for t in self._turns),
            task=self.task,
            grader=self.grader,
            grade_spec=self.grade_spec,
        )
        breakdown = await terms.score(trajectory, self.preset)
        evidence = breakdown.evidence
        metrics: dict[str, Any] = {
            "turns": len(self._turns),
            "tool_calls": self._tool_calls,
            "executed_tool_calls": self._executed,
            "invalid_tool_calls": self._invalid,
            "tool_errors": self._tool_errors,
            "think_tokens": [t.think_tokens for t in self._turns],
            "think_tokens_total": sum(t.think_tokens for t in self._turns),
            "visible_tokens": [self.count_tokens(t.visible) for t in self._turns],
            "evidence_rules_met": evidence.met,
            "evidence_restated_coverage": round(evidence.restated_coverage, 4),
            "evidence_checked_coverage": round(evidence.checked_coverage, 4),
            "tool_elapsed_s": round(self._tool_elapsed, 4),
            "episode_elapsed_s": round(time.monotonic() - self._started, 4),
            "outcome_reward": breakdown.outcome_reward,
        }
        if breakdown.unapplied:
            metrics["unapplied_switches"] = list(breakdown.unapplied)
        metrics.update(breakdown.metrics)  # named metrics of the reward terms (the guards, the equivalence check)
        self.result = EpisodeResult(
            outcome=outcome,
            reward=breakdown.total,
            correct=outcome == "correct",
            solution=solution,
            turns=len(self._turns),
            tool_calls=self._tool_calls,
            invalid_tool_calls=self._invalid,
            has_evidence=evidence.has_evidence,
            evidence_restated=evidence.restated,
            evidence_checked=evidence.checked,
            detail=detail,
            reward_terms=dict(breakdown.terms),
            grade=grade,
            metrics=metrics,
        )
