"""`t2sql eval`: run the training episode against any model endpoint, or the oracle policy.

    t2sql eval --endpoint URL --model NAME [--api openai|sglang] --data FILE --db-root DIR \\
               --out results.jsonl [--concurrency N] [--preset NAME] [--limit N]
    t2sql eval --policy oracle --out oracle.jsonl          # no model: checks data + pipeline

Every episode is the same `t2sql.episode.machine.Episode` that training runs: this module only moves
turns between it and a model (a *policy*):

    episode = Episode(task, preset, grader)
    loop: turn = await session.next_turn()            # model writes one assistant turn
          outcome = await episode.on_turn(turn.text, cut=turn.cut, tool_calls=turn.tool_calls)
          done? -> episode.result ; else session.observe(outcome.tool_messages)

Policies:
- `openai`: `/v1/chat/completions` with the tool spec; tool calls come back structured
  (`tool_calls`) or written in the text, the episode takes either. finish_reason "length" is a
  per-turn cut (a context cut when the context budget, not the turn limit, capped max_tokens). The
  context is counted from the server's `usage`; before the first reply it is estimated at
  4 characters per token.
- `sglang`: token-level `/generate` as in training: the prompt is the tokenizer's chat template
  (with the tool spec), the model's own output ids are appended, tool results are appended as the
  template's suffix for them, `max_new_tokens` = min(per-turn limit, context budget left).
- `oracle`: no model. Turn 1 restates the evidence and runs the gold query once as a real tool
  call; turn 2 quotes the evidence and answers with the gold query. Its accuracy is the share of
  gold queries that run and match themselves (1.0 on clean data).

Output: one JSON line per episode, appended (and flushed) as each finishes. Rerunning with the
same --out skips the (question id, sample) pairs already finished; a truncated last line (a crash
mid-write) is reported and dropped; an episode whose endpoint kept failing is written with outcome
"endpoint_error" (one that failed inside t2sql: "eval_error"), which does not count as finished,
so the next run retries it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Protocol

from t2sql.eval.endpoint import (
    CallStats,
    EndpointError,
    OpenAIChatClient,
    RetryPolicy,
    SglangGenerateClient,
)
from t2sql.episode.reward import OUTCOMES, evidence_label_lines, evidence_pieces  # the episode's outcome categories, in the summary's order
from t2sql.atomic import write_bytes_atomic
from t2sql.progress import Progress

if TYPE_CHECKING:
    from t2sql.episode.machine import Episode, Task
    from t2sql.episode.reward import Preset

ENDPOINT_ERROR = "endpoint_error"  # not an episode outcome: the model never finished the episode
EVAL_ERROR = "eval_error"  # not an episode outcome: this program failed (a bug); recorded, run goes on
UNFINISHED = frozenset({ENDPOINT_ERROR, EVAL_ERROR})  # lines a rerun retries
DIFFICULTY_ORDER = ("simple", "moderate", "challenging")
OPENAI_CHARS_PER_TOKEN = 4  # only for the first turn, before the server reported usage
# A turn loop longer than this is a bug in the episode, not a model behaviour; stop it loudly.
MAX_TURNS_GUARD = 64


class EvalError(Exception):
    """A usage or data problem that stops the run before it starts; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# Sample and data


def sample_dir() -> Path:
    """The embedded BIRD sample (superhero + its 129 dev questions), also inside an installed wheel."""
    try:
        from importlib.resources import files

        return Path(str(files("t2sql") / "sample"))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - odd loaders
        return Path(__file__).resolve().parent / "sample"


def sample_questions() -> Path:
    return sample_dir() / "dev.json"


@dataclass
class LoadedTasks:
    tasks: list[Task]
    skipped: list[str]  # one message per row that could not become a task


def load_tasks(data: str | os.PathLike, db_root: str | os.PathLike | None, *, limit: int | None = None,
               method_fallback: str | None = None) -> LoadedTasks:
    """A BIRD question json (list) or converted miles jsonl -> tasks. Bad rows are reported and skipped.

    Without db_root, BIRD rows find their databases beside the question file (BIRD's layout) and
    miles rows use the db_path recorded at conversion.
    """
    from t2sql.data.convert import DataError, load_questions
    from t2sql.episode.machine import Task

    path = Path(data)
    try:
        raw, problems = load_questions(path)
    except DataError as e:
        raise EvalError(f"--data {path}: {e}") from None
    if db_root is not None and not Path(db_root).is_dir():
        raise EvalError(f"--db-root {db_root} is not a directory (it must hold <db_id>/<db_id>.sqlite)")
    skipped = [f"{path}: {p}" for p in problems]
    tasks: list[Task] = []
    seen: set[str] = set()
    for row_number, row in raw:
        root = db_root
        if root is None and not isinstance(row.get("metadata"), dict):
            root = path.parent
        try:
            task = Task.from_row(row, root, method_fallback=method_fallback)
        except Exception as e:  # noqa: BLE001 - one bad row must not stop the run; it is reported
            skipped.append(f"{path}: row {row_number}: {type(e).__name__}: {e}; row skipped")
            continue
        if task.question_id in seen:
            skipped.append(f"{path}: row {row_number}: duplicate question_id {task.question_id}; row skipped")
            continue
        if not Path(task.db_path).is_file():
            skipped.append(
                f"{path}: row {row_number} (question_id {task.question_id}): database {task.db_path} not found "
                "(pass --db-root DIR holding <db_id>/<db_id>.sqlite); row skipped"
            )
            continue
        seen.add(task.question_id)
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        detail = ("\n  " + "\n  ".join(skipped[:10])) if skipped else ""
        raise EvalError(f"--data {path}: no usable task{detail}")
    return LoadedTasks(tasks, skipped)


# ---------------------------------------------------------------------------------------------
# Policies: who writes the assistant turns


@dataclass(frozen=True)
class PolicyTurn:
    text: str
    cut: str | None = None  # None | "turn" | "context"
    tool_calls: list[dict[str, Any]] | None = None


class Session(Protocol):
    stats: CallStats

    async def next_turn(self) -> PolicyTurn: ...

    def observe(self, tool_messages: list[dict[str, Any]]) -> None: ...


class Policy(Protocol):
    name: str

    def session(self, episode: Episode) -> Session: ...

    async def aclose(self) -> None: ...


class OraclePolicy:
    """Explores once with the gold query (a real tool call), then answers with it.

    The text restates the evidence in turn 1 and checks it in the answer turn, in both rules'
    forms (the enumerated Requirement / Verification lines, and the evidence quoted), so a clean
    task scores the preset's full reward. The tool call is written in the qwen3_coder XML form.
    """

    name = "oracle"

    def session(self, episode: Episode) -> Session:
        return _OracleSession(episode)

    async def aclose(self) -> None:
        return None


class _OracleSession:
    def __init__(self, episode: Episode):
        self.episode = episode
        self.turn = 0
        self.stats = CallStats()

    async def next_turn(self) -> PolicyTurn:
        task = self.episode.task
        self.turn += 1
        evidence = task.evidence.strip()
        pieces = evidence_pieces(evidence)
        if self.turn == 1:
            restate = f"The evidence says: {evidence}\n" if evidence else ""
            restate += evidence_label_lines(pieces, "Requirement", "as stated.")
            return PolicyTurn(
                "<think>Run the query once and look at its result.</think>\n"
                f"{restate}Let me run the query.\n"
                "<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n"
                f"{task.gold_sql}\n"
                "</parameter>\n</function>\n</tool_call>"
            )
        check = f"Checked against the evidence: {evidence}\n" if evidence else ""
        check += evidence_label_lines(pieces, "Verification", "the query applies it.")
        return PolicyTurn(
            "<think>The result answers the question.</think>\n"
            f"{check}<solution>\n{task.gold_sql}\n</solution>"
        )

    def observe(self, tool_messages: list[dict[str, Any]]) -> None:
        return None


class OpenAIPolicy:
    """An OpenAI-compatible chat-completions endpoint writes the turns."""

    name = "openai"

    def __init__(self, client: OpenAIChatClient, preset: Preset):
        self.client = client
        self.preset = preset

    def session(self, episode: Episode) -> Session:
        return _OpenAISession(self, episode)

    async def aclose(self) -> None:
        await self.client.aclose()


class _OpenAISession:
    def __init__(self, policy: OpenAIPolicy, episode: Episode):
        self.policy = policy
        self.episode = episode
        self.stats = CallStats()
        self.known_tokens: int | None = None  # prompt + completion of the last reply, from usage
        self.unseen_chars = sum(_message_chars(m) for m in episode.messages)  # not yet counted by the server

    def context_estimate(self) -> int:
        return (self.known_tokens or 0) + math.ceil(self.unseen_chars / OPENAI_CHARS_PER_TOKEN)

    async def next_turn(self) -> PolicyTurn:
        preset = self.policy.preset
        turn_limit = int(preset.max_turn_tokens)
        context_limit = int(preset.max_context_tokens)
        max_tokens = self.episode.turn_token_budget(self.context_estimate())
        if max_tokens <= 0:
            return PolicyTurn("", cut="context")
        reply = await self.policy.client.complete(
            self.episode.messages, self.episode.tools, max_tokens=max_tokens, stats=self.stats
        )
        if reply.prompt_tokens is not None and reply.completion_tokens is not None:
            self.known_tokens = reply.prompt_tokens + reply.completion_tokens
            self.unseen_chars = 0
        else:
            self.unseen_chars += len(reply.text)
        cut = None
        if reply.finish_reason == "length":
            cut = "context" if max_tokens < turn_limit else "turn"
        elif self.known_tokens is not None and self.known_tokens > context_limit:
            cut = "context"  # the estimate was short and the turn went past the budget
        return PolicyTurn(reply.text, cut=cut, tool_calls=reply.tool_calls)

    def observe(self, tool_messages: list[dict[str, Any]]) -> None:
        self.unseen_chars += sum(_message_chars(m) for m in tool_messages)


def _message_chars(message: dict[str, Any]) -> int:
    content = message.get("content")
    return len(content) if isinstance(content, str) else len(json.dumps(content or ""))


class SglangPolicy:
    """sglang's token-level /generate writes the turns; this side owns the token ids, as in training.

    The token bookkeeping is the miles adapter's own renderer (`t2sql.miles.adapter`), so eval extends
    the sequence exactly as training does: the chat template with the tool spec and the template
    kwargs on every render, the model's own output ids appended, tool messages appended as the
    template's suffix for them (with the newline the model never writes after its end-of-turn token).

    `tokenizer` is a Hugging Face tokenizer (or anything with `apply_chat_template(messages,
    tools=..., tokenize=False, add_generation_prompt=...)`, `encode(text, add_special_tokens=False)`,
    `decode(ids)`). The end-of-turn token is read from the chat template, never from eos_token.
    """

    name = "sglang"

    def __init__(
        self,
        client: SglangGenerateClient,
        tokenizer: Any,
        preset: Preset,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
    ):
        self.client = client
        self.tokenizer = tokenizer
        self.preset = preset
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def session(self, episode: Episode) -> Session:
        return _SglangSession(self, episode)

    def count_tokens(self, text: str) -> int:
        """Think/visible token metrics in the model's own tokens, as in training."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    async def aclose(self) -> None:
        await self.client.aclose()


class _SglangSession:
    def __init__(self, policy: SglangPolicy, episode: Episode):
        from t2sql.miles.adapter import _Renderer  # the training adapter's: one way to extend the ids

        self.policy = policy
        self.episode = episode
        self.stats = CallStats()
        self.render = _Renderer(policy.tokenizer, episode.tools, policy.chat_template_kwargs)
        self.ids: list[int] = self.render.encode(self.render.text(episode.messages, generation_prompt=True))
        self.prompt_length = len(self.ids)
        self.closed = False  # the model's last turn ended with the end-of-turn token

    async def next_turn(self) -> PolicyTurn:
        turn_limit = int(self.policy.preset.max_turn_tokens)
        # Like miles: len(input_ids) + max_new_tokens never passes the context budget.
        max_new = self.episode.turn_token_budget(len(self.ids))
        if max_new <= 0:
            return PolicyTurn("", cut="context")
        reply = await self.policy.client.generate(self.ids, max_new_tokens=max_new, stats=self.stats)
        output_ids = reply.output_ids if reply.output_ids is not None else self.render.encode(reply.text)
        self.ids.extend(output_ids)
        self.closed = bool(output_ids) and self.policy.tokenizer.decode([output_ids[-1]]) == self.render.end_of_turn()
        cut = None
        if reply.finish_reason == "length":
            cut = "context" if max_new < turn_limit else "turn"
        return PolicyTurn(reply.text, cut=cut)

    def observe(self, tool_messages: list[dict[str, Any]]) -> None:
        if not tool_messages:
            return
        before = self.episode.messages[: len(self.episode.messages) - len(tool_messages)]
        segment = self.render.tool_segment(before, tool_messages, closed=self.closed)
        self.ids.extend(self.render.encode(segment))


def load_tokenizer(path: str) -> Any:
    """A Hugging Face tokenizer, loaded only for --api sglang."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise EvalError("--api sglang needs transformers to load --tokenizer: pip install transformers") from None
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - any loader failure becomes one clear message
        raise EvalError(f"--tokenizer {path}: cannot load a tokenizer: {e}") from None


# ---------------------------------------------------------------------------------------------
# Results file: append-only jsonl, resumable


@dataclass
class ResultsFile:
    """The --out jsonl: what is already finished, and an appender for new lines."""

    path: Path
    # (question_id, sample) -> the last line that finished it / the last error line of an unfinished one
    finished: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    errored: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    votes: dict[str, dict[str, Any]] = field(default_factory=dict)  # question_id -> its latest vote line
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, path: str | os.PathLike) -> ResultsFile:
        results = cls(Path(path))
        if results.path.is_dir():
            raise EvalError(f"--out {results.path} is a directory; pass a file name such as results.jsonl")
        if results.path.exists():
            results._read()
        else:
            results.path.parent.mkdir(parents=True, exist_ok=True)
        return results

    def _read(self) -> None:
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        complete, tail = lines[:-1], lines[-1]
        if tail.strip():
            # A line without its newline is a write a crash cut short: drop it, keep the rest intact.
            self.warnings.append(
                f"{self.path}: the last line is truncated ({len(tail)} bytes, from an interrupted run); "
                "it is dropped and that episode runs again"
            )
            self._rewrite(b"".join(line + b"\n" for line in complete))
        for number, raw in enumerate(complete, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                if isinstance(record, dict) and record.get("record") == VOTE_RECORD:
                    self.votes[str(record["question_id"])] = record
                    continue
                key = episode_key(record)
                outcome = record["outcome"]
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
                self.warnings.append(f"{self.path}: line {number} is not a result line; ignored")
                continue
            self._note(key, outcome, record)

    def _note(self, key: tuple[str, int], outcome: str, record: dict[str, Any]) -> None:
        if outcome in UNFINISHED:
            if key not in self.finished:
                self.errored[key] = record
        else:
            self.finished[key] = record
            self.errored.pop(key, None)

    def _rewrite(self, content: bytes) -> None:
        write_bytes_atomic(self.path, content)

    def check_compatible(self, run_info: dict[str, Any]) -> None:
        """Resuming must not mix results of another model, policy or preset into one file."""
        for record in self.finished.values():
            old = record.get("run") or {}
            clash = {k: (old.get(k), v) for k, v in run_info.items() if k in old and old[k] != v}
            if clash:
                what = ", ".join(f"{k} {a!r} (file) vs {b!r} (now)" for k, (a, b) in clash.items())
                raise EvalError(
                    f"--out {self.path} holds results of another run: {what}; "
                    "pass a new --out, or the same settings to resume"
                )
            return

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, default=_json_default) + "\n"
        # One write of one whole line, flushed: a crash leaves at most a truncated last line.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
        if record.get("record") == VOTE_RECORD:
            self.votes[str(record["question_id"])] = record
            return
        self._note(episode_key(record), record["outcome"], record)


# ---------------------------------------------------------------------------------------------
# Majority voting over the K samples of a task (maj@K)

VOTE_RECORD = "vote"  # the "record" field of a vote line in the results file
VOTING_OUTCOMES = ("correct", "incorrect")  # a solution that ran to a result; errors, timeouts, unsafe: no vote


async def vote(task: Task, records: list[dict[str, Any]], grader: Any, preset: Preset) -> dict[str, Any]:
    """The majority vote of one task's K finished episodes.

    Each solution that ran to a result votes with its result under the task's grading method: two
    solutions are in one group when their digests are equal (t2sql.Digest.same_result), however
    differently they are written. The grade kept each prediction's digest when it ran to its end; a
    solution whose grade stopped early (another column count, more rows than the gold) is run once
    more for its digest. The largest group wins; a tie goes to the group holding the earliest
    sample. The winner's correctness is its members' (equal results get the same verdict)."""
    from t2sql import Digest

    method = preset.method_for(task.grading_method)
    voters: list[tuple[int, Any, bool]] = []
    for r in sorted(records, key=lambda r: int(r.get("sample") or 0)):
        solution = r.get("solution")
        if r.get("outcome") not in VOTING_OUTCOMES or not solution:
            continue
        digest_hex = (r.get("grade") or {}).get("pred_digest")
        data = bytes.fromhex(digest_hex) if digest_hex else None
        if data is None:
            g = await grader.gold(task.db_path, solution, semantics=method, float_digits=preset.float_digits,
                                  timeout_s=preset.grade_timeout_s, column_order=preset.column_order)
            if not g.ok:
                continue
            data = g.digest
        voters.append((int(r.get("sample") or 0), Digest.from_bytes(data), bool(r.get("correct"))))
    groups: list[list[tuple[int, Any, bool]]] = []
    for voter in voters:
        home = next((g for g in groups if g[0][1].same_result(voter[1])), None)
        if home is None:
            groups.append([voter])
        else:
            home.append(voter)
    winner = max(groups, key=lambda g: (len(g), -g[0][0])) if groups else None
    return {
        "record": VOTE_RECORD,
        "question_id": task.question_id,
        "k": len(records),
        "method": method,
        "voters": len(voters),
        "groups": [{"samples": [v[0] for v in g], "size": len(g), "correct": g[0][2]} for g in groups],
        "winner": [v[0] for v in winner] if winner else None,
        "correct": bool(winner and winner[0][2]),
    }


def _maj_at_k(votes: list[dict[str, Any]], k: int) -> dict[str, Any]:
    correct = sum(1 for v in votes if v.get("correct"))
    return {"k": k, "questions": len(votes), "correct": correct,
            "accuracy": correct / len(votes) if votes else None}


def episode_key(record: dict[str, Any]) -> tuple[str, int]:
    """What a result line is the result of: its question and, with --samples, which sample."""
    return str(record["question_id"]), int(record.get("sample") or 0)


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# ---------------------------------------------------------------------------------------------
# Running episodes


def _result_dict(result: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    if isinstance(result, dict):
        return dict(result)
    return {k: v for k, v in vars(result).items() if not k.startswith("_")}


# The longest message text a results line keeps (a turn of 3k tokens is ~12k characters).
MAX_STORED_CHARS = 100_000


def stored_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The transcript as a results line keeps it: each text over MAX_STORED_CHARS cut there, with
    a marker saying how much was cut. Returns (messages, characters cut)."""
    kept: list[dict[str, Any]] = []
    cut_total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and len(content) > MAX_STORED_CHARS:
            cut = len(content) - MAX_STORED_CHARS
            cut_total += cut
            m = {**m, "content": content[:MAX_STORED_CHARS] + f"\n[t2sql: {cut} more characters not stored]"}
        kept.append(m)
    return kept, cut_total


def episode_record(task: Task, episode: Episode, run_info: dict[str, Any], stats: CallStats, elapsed_s: float) -> dict[str, Any]:
    result = _result_dict(episode.result)
    # A task without evidence has no evidence rules: None, so rates count only tasks that have them.
    has_evidence = result.get("has_evidence", True)
    restated = result.get("evidence_restated") if has_evidence else None
    checked = result.get("evidence_checked") if has_evidence else None
    metrics = result.get("metrics") or {}
    record: dict[str, Any] = {
        "question_id": task.question_id,
        "db_id": task.db_id,
        "difficulty": task.difficulty,
        "outcome": result.get("outcome"),
        "reward": result.get("reward"),
        "correct": bool(result.get("correct")),
        "turns": result.get("turns"),
        "tool_calls": result.get("tool_calls"),
        "invalid_tool_calls": result.get("invalid_tool_calls"),
        "evidence_restated": restated,
        "evidence_checked": checked,
        "evidence_rules_met": metrics.get("evidence_rules_met", sum(1 for v in (restated, checked) if v is True)),
        "solution": result.get("solution"),
        "detail": result.get("detail"),
        "reward_terms": result.get("reward_terms"),
        "grade": result.get("grade"),
        "metrics": metrics,
        "endpoint": stats.to_dict(),
        "elapsed_s": round(elapsed_s, 3),
        "run": run_info,
    }
    record["messages"], cut = stored_messages(episode.messages)
    if cut:
        record["stored_chars_cut"] = cut
    return record


def error_record(
    task: Task, episode: Episode | None, run_info: dict[str, Any], stats: CallStats, elapsed_s: float, error: str,
    outcome: str = ENDPOINT_ERROR, retryable: bool = True,
) -> dict[str, Any]:
    return {
        "question_id": task.question_id,
        "db_id": task.db_id,
        "difficulty": task.difficulty,
        "outcome": outcome,
        "reward": None,
        "correct": False,
        "error": error,
        "retryable": retryable,  # False: the endpoint refused in a way a retry cannot fix
        "endpoint": stats.to_dict(),
        "elapsed_s": round(elapsed_s, 3),
        "run": run_info,
        "messages": stored_messages(episode.messages)[0] if episode is not None else [],
    }


async def run_episode(
    task: Task, policy: Policy, preset: Preset, grader: Any, run_info: dict[str, Any], sample: int = 0
) -> dict[str, Any]:
    """One episode, start to finish; an endpoint failure becomes an endpoint_error record."""
    record = await _run_episode(task, policy, preset, grader, run_info)
    record["sample"] = sample
    return record


async def _run_episode(task: Task, policy: Policy, preset: Preset, grader: Any, run_info: dict[str, Any]) -> dict[str, Any]:
    from t2sql.episode.machine import Episode
    from t2sql.episode.prompt import build_prompt_async

    started = time.monotonic()
    episode: Episode | None = None
    stats = CallStats()
    try:
        # The first episode of a database runs SQL for the schema's example values: off the loop.
        episode = Episode(task, preset, grader, prompt=await build_prompt_async(task, preset),
                          count_tokens=getattr(policy, "count_tokens", None))
        session = policy.session(episode)
        stats = session.stats
        for _ in range(MAX_TURNS_GUARD):
            turn = await session.next_turn()
            outcome = await episode.on_turn(turn.text, cut=turn.cut, tool_calls=turn.tool_calls)
            if outcome.done:
                break
            session.observe(list(outcome.tool_messages))
        else:
            raise RuntimeError(f"episode {task.question_id} did not end after {MAX_TURNS_GUARD} turns")
    except EndpointError as e:
        return error_record(task, episode, run_info, stats, time.monotonic() - started, str(e),
                            retryable=e.retryable)
    except Exception as e:  # noqa: BLE001 - a bug in one episode must not lose the others' results
        error = f"{type(e).__name__}: {e} (a t2sql bug or a broken task; please report it)"
        return error_record(task, episode, run_info, stats, time.monotonic() - started, error, EVAL_ERROR,
                            retryable=False)
    return episode_record(task, episode, run_info, stats, time.monotonic() - started)


class EpisodeProgress:
    """t2sql.progress.Progress over finished episodes, with the running accuracy beside the count."""

    def __init__(self, total: int, enabled: bool | None = None):
        self.bar = Progress(total, "eval", enabled=enabled)
        self.correct = self.errors = 0

    def update(self, record: dict[str, Any]) -> None:
        self.correct += bool(record.get("correct"))
        self.errors += record.get("outcome") in UNFINISHED
        finished = self.bar.done + 1 - self.errors
        accuracy = f"{self.correct / finished:.3f}" if finished else "-"
        self.bar.advance(status=f"acc {accuracy}" + (f" errors {self.errors}" if self.errors else ""))

    def close(self) -> None:
        self.bar.close()


@dataclass
class EvalRun:
    """What one call of `evaluate` did; `summary` covers every selected task the file has finished."""

    ran: int
    skipped_finished: int
    endpoint_errors: int
    aborted: str | None
    summary: dict[str, Any]


async def evaluate(
    tasks: list[Task],
    policy: Policy,
    preset: Preset,
    out: str | os.PathLike,
    *,
    concurrency: int = 8,
    grader: Any = None,
    run_info: dict[str, Any] | None = None,
    progress: bool | None = None,
    log: Any = None,
    samples: int = 1,
) -> EvalRun:
    """Run every unfinished (task, sample) through `policy`, appending to `out`; summarize."""
    if concurrency < 1:
        raise EvalError(f"--concurrency must be >= 1, got {concurrency}")
    if samples < 1:
        raise EvalError(f"--samples must be >= 1, got {samples}")
    log = log or (lambda message: print(message, file=sys.stderr))
    run_info = dict(run_info or {"policy": policy.name, "preset": getattr(preset, "name", None)})
    results = ResultsFile.open(out)
    for warning in results.warnings:
        log(f"warning: {warning}")
    results.check_compatible(run_info)
    wanted = [(t, k) for t in tasks for k in range(samples)]
    todo = [(t, k) for t, k in wanted if (t.question_id, k) not in results.finished]
    skipped = len(wanted) - len(todo)
    if skipped:
        log(f"resuming {results.path}: {skipped} of {len(wanted)} episodes already finished, {len(todo)} to run")

    own_grader = grader is None
    if own_grader:
        from t2sql.serving.grader import Grader

        grader = Grader(tool_timeout_s=preset.tool_timeout_s, grade_timeout_s=preset.grade_timeout_s)

    queue: asyncio.Queue[tuple[Task, int]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    bar = EpisodeProgress(len(todo), progress)
    counts = {"ran": 0, "errors": 0, "finished": 0, "fatal_streak": 0}
    aborted: list[str] = []
    # Stop early when the endpoint refuses every request for a reason a retry cannot fix
    # (wrong model name, wrong API): no point sending the remaining thousands of episodes.
    fatal_limit = max(4, concurrency)

    async def worker() -> None:
        while not aborted:
            try:
                task, sample = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            record = await run_episode(task, policy, preset, grader, run_info, sample)
            results.append(record)
            counts["ran"] += 1
            if record["outcome"] in UNFINISHED:
                counts["errors"] += 1
                fatal = record.get("retryable") is False
                if counts["finished"] == 0 and fatal:
                    counts["fatal_streak"] += 1
                    if counts["fatal_streak"] >= fatal_limit and not aborted:
                        aborted.append(record["error"])
            else:
                counts["finished"] += 1
            bar.update(record)

    votes: list[dict[str, Any]] = []
    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, max(1, len(todo))))))
        bar.close()
        if samples > 1:
            # maj@K: every task with all K episodes finished gets (or renews) its vote line.
            for task in tasks:
                records = [results.finished.get((task.question_id, k)) for k in range(samples)]
                if all(r is not None for r in records):
                    ballot = await vote(task, records, grader, preset)  # type: ignore[arg-type]
                    results.append(ballot)
                    votes.append(ballot)
    finally:
        bar.close()
        if own_grader:
            await grader.aclose()
    if aborted:
        log(f"error: stopped after {counts['ran']} episodes; every one failed in a way a retry cannot fix: "
            f"{aborted[0]}")
    selected = [(t.question_id, k) for t, k in wanted]
    summary = summarize(
        [results.finished[key] for key in selected if key in results.finished],
        pending=[key for key in selected if key not in results.finished],
        errored=[results.errored[key] for key in selected if key in results.errored],
        samples=samples,
        votes=votes,
    )
    return EvalRun(counts["ran"], skipped, counts["errors"], aborted[0] if aborted else None, summary)


# ---------------------------------------------------------------------------------------------
# Summary


def summarize(
    records: Iterable[dict[str, Any]],
    *,
    pending: Iterable[Any] = (),
    errored: Iterable[dict[str, Any]] = (),
    samples: int = 1,
    votes: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Accuracy (correct only), outcome breakdown, means, accuracy by difficulty, over finished episodes.

    With several samples per question, accuracy is the mean over every episode (avg@k), pass@k
    the share of questions, among those with all k samples finished, that any sample answered,
    and maj@k the share whose majority vote (see `vote`) is correct.
    """
    records = list(records)
    pending = list(pending)
    errored = list(errored)
    n = len(records)
    outcomes = Counter(str(r.get("outcome")) for r in records)
    by_difficulty: dict[str, dict[str, Any]] = {}
    for r in records:
        d = str(r.get("difficulty") or "unknown")
        slot = by_difficulty.setdefault(d, {"episodes": 0, "correct": 0})
        slot["episodes"] += 1
        slot["correct"] += bool(r.get("correct"))
    for slot in by_difficulty.values():
        slot["accuracy"] = slot["correct"] / slot["episodes"]
    order = {d: i for i, d in enumerate(DIFFICULTY_ORDER)}
    by_difficulty = dict(sorted(by_difficulty.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    def mean(key: str) -> float | None:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    def rate(key: str) -> float | None:
        values = [r.get(key) for r in records if isinstance(r.get(key), bool)]  # None: task has no evidence
        return sum(values) / len(values) if values else None

    breakdown = {k: outcomes.get(k, 0) for k in OUTCOMES}
    for k, v in outcomes.items():
        if k not in breakdown:
            breakdown[k] = v
    correct = sum(1 for r in records if r.get("correct"))
    return {
        "episodes": n,
        "correct": correct,
        "accuracy": correct / n if n else None,
        "mean_reward": mean("reward"),
        "outcomes": breakdown,
        "mean_turns": mean("turns"),
        "mean_tool_calls": mean("tool_calls"),
        "mean_invalid_tool_calls": mean("invalid_tool_calls"),
        "evidence_restated_rate": rate("evidence_restated"),
        "evidence_checked_rate": rate("evidence_checked"),
        "by_difficulty": by_difficulty,
        "unfinished": len(pending),
        "endpoint_errors": sum(1 for r in errored if r.get("outcome", ENDPOINT_ERROR) == ENDPOINT_ERROR),
        "eval_errors": sum(1 for r in errored if r.get("outcome") == EVAL_ERROR),
        "last_error": errored[-1].get("error") if errored else None,
        "samples": samples,
        "pass_at_k": _pass_at_k(records, samples) if samples > 1 else None,
        "maj_at_k": _maj_at_k(list(votes), samples) if samples > 1 else None,
        "completion_tokens": sum(int((r.get("endpoint") or {}).get("completion_tokens") or 0) for r in records),
    }


def _pass_at_k(records: list[dict[str, Any]], k: int) -> dict[str, Any]:
    by_question: dict[str, list[bool]] = {}
    for r in records:
        by_question.setdefault(str(r.get("question_id")), []).append(bool(r.get("correct")))
    complete = [hits for hits in by_question.values() if len(hits) >= k]
    passed = sum(1 for hits in complete if any(hits))
    return {"k": k, "questions": len(complete), "passed": passed,
            "pass": passed / len(complete) if complete else None}


def format_summary(summary: dict[str, Any]) -> str:
    def num(value: Any, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    n = summary["episodes"]
    lines = [
        f"{'episodes finished':<26}{n:>8}",
        f"{'accuracy (correct only)':<26}{num(summary['accuracy']):>8}   {summary['correct']}/{n}",
        f"{'mean reward':<26}{num(summary['mean_reward']):>8}",
    ]
    pass_k = summary.get("pass_at_k")
    if pass_k:
        lines.append(f"{'pass@' + str(pass_k['k']):<26}{num(pass_k['pass']):>8}   "
                     f"{pass_k['passed']}/{pass_k['questions']} questions")
    maj_k = summary.get("maj_at_k")
    if maj_k:
        lines.append(f"{'maj@' + str(maj_k['k']):<26}{num(maj_k['accuracy']):>8}   "
                     f"{maj_k['correct']}/{maj_k['questions']} questions")
    lines += [
        f"{'mean turns':<26}{num(summary['mean_turns'], 2):>8}",
        f"{'mean tool calls':<26}{num(summary['mean_tool_calls'], 2):>8}",
        f"{'mean invalid tool calls':<26}{num(summary['mean_invalid_tool_calls'], 2):>8}",
        f"{'evidence restated':<26}{num(summary['evidence_restated_rate']):>8}",
        f"{'evidence checked':<26}{num(summary['evidence_checked_rate']):>8}",
        "",
        f"{'outcome':<26}{'count':>8}{'share':>9}",
    ]
    for outcome, count in summary["outcomes"].items():
        share = count / n if n else 0.0
        lines.append(f"  {outcome:<24}{count:>8}{share:>9.3f}")
    lines += ["", f"{'difficulty':<26}{'episodes':>8}{'accuracy':>9}"]
    for difficulty, slot in summary["by_difficulty"].items():
        lines.append(f"  {difficulty:<24}{slot['episodes']:>8}{slot['accuracy']:>9.3f}")
    if summary["unfinished"]:
        lines += [
            "",
            f"unfinished: {summary['unfinished']} episode(s) ({summary['endpoint_errors']} endpoint errors, "
            f"{summary['eval_errors']} eval errors); "
            "rerun the same command to retry them",
        ]
        if summary["last_error"]:
            lines.append(f"last error: {summary['last_error']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Command line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from t2sql.grading import method_arg

    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--policy", choices=("model", "oracle"), default="model",
                      help="model: an endpoint writes the turns; oracle: scripted gold answers, no endpoint")
    what.add_argument("--data", default=None,
                      help="BIRD question json (list) or converted miles jsonl (default: the embedded superhero sample)")
    what.add_argument("--db-root", default=None,
                      help="directory holding <db_id>/<db_id>.sqlite (default: beside --data, or the embedded sample)")
    what.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    what.add_argument("--samples", type=int, default=1,
                      help="episodes per task (with --temperature > 0): accuracy is then avg@k, plus pass@k "
                           "and maj@k (majority vote of the k answers by result; each task's vote is a line "
                           "of the results file)")
    what.add_argument("--preset", default=None,
                      help="recipe preset, e.g. qwen3.6-35b-a3b (default) or bare; printed in full at the start")
    what.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                      help="the method for tasks whose grading_method cannot be read (a bare 'subset'); "
                           "without it such a task is skipped with a line saying why")

    model = parser.add_argument_group("model endpoint")
    model.add_argument("--endpoint", default=None, help="server URL, e.g. http://127.0.0.1:30000")
    model.add_argument("--model", default=None, help="model name the server serves (--api openai)")
    model.add_argument("--api", choices=("openai", "sglang"), default="openai",
                       help="openai: /v1/chat/completions; sglang: token-level /generate as in training")
    model.add_argument("--tokenizer", default=None, help="tokenizer path or hub name for --api sglang")
    model.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                       help='chat template kwargs, e.g. \'{"enable_thinking": true}\' (sglang: every render; '
                            "openai: sent as chat_template_kwargs)")
    model.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the server's)")
    model.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: the server's)")
    model.add_argument("--api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding a bearer token for --api openai, if set")
    model.add_argument("--timeout", type=float, default=600.0,
                       help="seconds one whole request may take, the reply's last byte included")
    model.add_argument("--max-response-mb", type=float, default=16.0,
                       help="a reply larger than this is refused unread (an endpoint_error), never held whole")
    model.add_argument("--retries", type=int, default=3, help="retries of a failed request, with backoff")
    model.add_argument("--retry-backoff", type=float, default=1.0, help="first backoff in seconds (doubles)")

    run_group = parser.add_argument_group("run")
    run_group.add_argument("--out", default=None,
                           help="results jsonl, appended; rerun to resume (default: "
                                "eval-<model or policy>-<preset>-<data>.jsonl under $T2SQL_HOME/eval, "
                                "else ~/.local/share/t2sql/eval)")
    run_group.add_argument("--concurrency", type=int, default=8, help="episodes in flight")
    run_group.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")


def _sampling(args: argparse.Namespace) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if args.top_p is not None:
        sampling["top_p"] = args.top_p
    return sampling


def _chat_template_kwargs(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise EvalError(f"--chat-template-kwargs is not JSON ({e.msg}); e.g. '{{\"enable_thinking\": true}}'") from None
    if not isinstance(value, dict):
        raise EvalError("--chat-template-kwargs must be a JSON object, e.g. '{\"enable_thinking\": true}'")
    return value


def build_policy(args: argparse.Namespace, preset: Preset, *, tokenizer: Any = None) -> Policy:
    if args.policy == "oracle":
        return OraclePolicy()
    if not args.endpoint:
        raise EvalError("--endpoint URL is required with --policy model (or use --policy oracle)")
    try:
        retry = RetryPolicy(timeout_s=args.timeout, retries=args.retries, backoff_s=args.retry_backoff,
                            max_body_bytes=int(args.max_response_mb * 1024 * 1024))
    except ValueError as e:
        raise EvalError(str(e)) from None
    kwargs = _chat_template_kwargs(args.chat_template_kwargs)
    try:
        if args.api == "openai":
            if not args.model:
                raise EvalError("--model NAME is required with --api openai (the name the server serves)")
            extra = {"chat_template_kwargs": kwargs} if kwargs else {}
            client = OpenAIChatClient(
                args.endpoint, args.model, retry=retry, sampling=_sampling(args),
                api_key=os.environ.get(args.api_key_env) if args.api_key_env else None,
                extra_body=extra, max_connections=args.concurrency,
            )
            return OpenAIPolicy(client, preset)
        if tokenizer is None:
            if not args.tokenizer:
                raise EvalError("--tokenizer PATH is required with --api sglang (the served model's tokenizer)")
            tokenizer = load_tokenizer(args.tokenizer)
        client = SglangGenerateClient(
            args.endpoint, retry=retry, sampling=_sampling(args), max_connections=args.concurrency
        )
        return SglangPolicy(client, tokenizer, preset, chat_template_kwargs=kwargs)
    except ValueError as e:
        raise EvalError(str(e)) from None


def results_home() -> Path:
    """Where eval results go without --out: $T2SQL_HOME/eval, else $XDG_DATA_HOME/t2sql/eval,
    else ~/.local/share/t2sql/eval. Never the current directory (nor a checkout's root)."""
    if os.environ.get("T2SQL_HOME"):
        return Path(os.environ["T2SQL_HOME"]) / "eval"
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "t2sql" / "eval"


def default_out(who: str | None, preset_name: str, data: Path) -> str:
    """<results_home>/eval-<model or policy>-<preset>-<data>.jsonl: a rerun of the same command
    finds its own file and resumes it."""
    parts = [who or "model", preset_name, data.stem if data.stem != "dev" else f"{data.parent.name}-dev"]
    name = "eval-" + "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", p).strip("_") for p in parts) + ".jsonl"
    return str(results_home() / name)


def describe_preset(preset: Preset, width: int = 100) -> str:
    """The preset in full, as a few readable lines (every field, wrapped)."""
    import textwrap

    fields = _preset_dict(preset)
    name = fields.pop("name", getattr(preset, "name", "?"))
    body = " ".join(f"{k}={v}" for k, v in sorted(fields.items()))
    return f"preset {name}:\n" + textwrap.fill(body, width, initial_indent="  ", subsequent_indent="  ")


def _preset_dict(preset: Preset) -> dict[str, Any]:
    to_dict = getattr(preset, "to_dict", None)
    return to_dict() if callable(to_dict) else _result_dict(preset)


def run(args: argparse.Namespace, *, tokenizer: Any = None) -> int:
    from t2sql.grading import describe_methods, method_counts
    from t2sql.episode.reward import get_preset

    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        if args.limit is not None and args.limit < 1:
            raise EvalError(f"--limit must be >= 1, got {args.limit}")
        if args.samples < 1:
            raise EvalError(f"--samples must be >= 1, got {args.samples}")
        if args.samples > 1 and args.policy == "model" and not args.temperature:
            log(f"note: --samples {args.samples} without --temperature > 0: samples differ only if the "
                "server's default sampling is random")
        if args.data is None and args.db_root is not None:
            raise EvalError("--db-root needs --data (the embedded sample brings its own database)")
        data, db_root = (args.data, args.db_root) if args.data else (sample_questions(), sample_dir())
        try:
            preset = get_preset(args.preset)  # None: the recipe's default
        except ValueError as e:
            raise EvalError(str(e)) from None
        loaded = load_tasks(data, db_root, limit=args.limit, method_fallback=args.grading_method_fallback)
        for message in loaded.skipped:
            log(f"skipped: {message}")
        policy = build_policy(args, preset, tokenizer=tokenizer)
    except EvalError as e:
        log(f"t2sql eval: {e}")
        return 2

    preset_name = getattr(preset, "name", args.preset)
    if args.out is None:
        args.out = default_out(args.model if args.policy == "model" else args.policy, preset_name, Path(data))
    run_info = {
        "policy": policy.name,
        "model": args.model if args.policy == "model" else None,
        "preset": preset_name,
    }
    log(f"t2sql eval: {len(loaded.tasks)} tasks from {data} | policy {policy.name}"
        + (f" | model {args.model} at {args.endpoint}" if args.policy == "model" else ""))
    methods = method_counts(preset.method_for(t.grading_method) for t in loaded.tasks)
    log("grading methods: " + describe_methods(methods))
    log(describe_preset(preset))
    log(f"results: {args.out}" + (" (resuming: it exists)" if Path(args.out).exists() else ""))

    async def main() -> EvalRun:
        try:
            return await evaluate(
                loaded.tasks, policy, preset, args.out, concurrency=args.concurrency, run_info=run_info, log=log,
                samples=args.samples,
            )
        finally:
            await policy.aclose()

    try:
        outcome = asyncio.run(main())
    except EvalError as e:
        log(f"t2sql eval: {e}")
        return 2
    summary = {**outcome.summary, "ran": outcome.ran, "resumed_skipped": outcome.skipped_finished,
               "aborted": outcome.aborted, "out": str(args.out), "run": run_info}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(format_summary(outcome.summary))
        print(f"results: {args.out}")
    return 1 if (outcome.aborted or outcome.summary["unfinished"]) else 0

