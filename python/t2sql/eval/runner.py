"""`t2sql eval`: run the training episode against any model endpoint, or the oracle policy. Every episode is the
same `t2sql.Episode` that training runs; this module only moves turns between it and a model (a policy), and
writes one JSON line per episode, resumable. docs/eval.md has the options, the policies and the output."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t2sql import Digest
from t2sql.episode.machine import Episode
from t2sql.episode.prompt import build_prompt_async, task_text_problem
from t2sql.episode.rollout import open_grader
from t2sql.errors import DataError, EndpointError, EvalError, UnknownDatabase
from t2sql.eval.endpoint import CallStats
from t2sql.eval.policies import Policy
from t2sql.eval.results import (
    EVAL_ERROR,
    UNFINISHED,
    VOTE_RECORD,
    VOTING_OUTCOMES,
    ResultsFile,
    episode_record,
    error_record,
    summarize,
)
from t2sql.grading import fallback_note
from t2sql.progress import Progress
from t2sql.tasks import Task, existing_database, load_questions, row_db_root

if TYPE_CHECKING:
    from t2sql.episode.machine import Episode
    from t2sql.episode.presets import Preset

# A turn loop longer than this is a bug in the episode, not a model behaviour; stop it loudly.
MAX_TURNS_GUARD = 64


# ---------------------------------------------------------------------------------------------
# Tasks


@dataclass
class LoadedTasks:
    tasks: list[Task]
    skipped: list[str]  # one message per row that could not become a task
    notes: list[str] = field(default_factory=list)  # tasks graded by --grading-method-fallback


def load_tasks(data: str | os.PathLike, db_root: str | os.PathLike | None, *, limit: int | None = None,
               method_fallback: str | None = None, preset: Preset | None = None) -> LoadedTasks:
    """A BIRD question json (list) or converted miles jsonl -> tasks. Bad rows are reported and skipped:
    a line that is not a task (t2sql.tasks.load_questions), a db_id or database the path rule refuses
    (t2sql.tasks.existing_database), and with `preset` a question or evidence over its limits.

    Without db_root, BIRD rows find their databases beside the question file (BIRD's layout) and
    miles rows use the db_path recorded at conversion.
    """

    path = Path(data)
    try:
        raw, problems = load_questions(path)
    except DataError as e:
        raise EvalError(f"--data {path}: {e}") from None
    if db_root is not None and not Path(db_root).is_dir():
        raise EvalError(f"--db-root {db_root} is not a directory (it must hold <db_id>/<db_id>.sqlite)")
    skipped = [f"{path}: {p}" for p in problems]
    notes: list[str] = []
    tasks: list[Task] = []
    seen: set[str] = set()
    unusable: dict[str, str | None] = {}  # db_path -> why it cannot be used (None: it can), checked once
    for row_number, row in raw:
        try:
            task = Task.from_row(row, row_db_root(row, db_root, path), method_fallback=method_fallback)
        except Exception as e:  # noqa: BLE001 - one bad row must not stop the run; it is reported
            skipped.append(f"{path}: row {row_number}: {type(e).__name__}: {e}; row skipped")
            continue
        if task.grading_method_given is not None:
            notes.append(fallback_note(task.grading_method_given, task.question_id, task.grading_method))
        if task.question_id in seen:
            skipped.append(f"{path}: row {row_number}: duplicate question_id {task.question_id}; row skipped")
            continue
        if task.db_path not in unusable:
            try:
                existing_database(task)
                unusable[task.db_path] = None
            except UnknownDatabase as e:
                unusable[task.db_path] = str(e)
        if unusable[task.db_path] is not None:
            skipped.append(f"{path}: row {row_number} (question_id {task.question_id}): {unusable[task.db_path]}; "
                           "row skipped")
            continue
        too_long = task_text_problem(task, preset) if preset is not None else None
        if too_long is not None:
            skipped.append(f"{path}: row {row_number} (question_id {task.question_id}): {too_long}; row skipped")
            continue
        seen.add(task.question_id)
        tasks.append(task)
        if limit is not None and len(tasks) >= limit:
            break
    if not tasks:
        detail = ("\n  " + "\n  ".join(skipped[:10])) if skipped else ""
        raise EvalError(f"--data {path}: no usable task{detail}")
    return LoadedTasks(tasks, skipped, notes)


# ---------------------------------------------------------------------------------------------
# Majority voting over the K samples of a task (maj@K)


async def vote(task: Task, records: list[dict[str, Any]], grader: Any, preset: Preset) -> dict[str, Any]:
    """The majority vote of one task's K finished episodes.

    Each solution that ran to a result votes with its result under the task's grading method: two
    solutions are in one group when their digests are equal (t2sql.Digest.same_result), however
    differently they are written. The grade kept each prediction's digest when it ran to its end; a
    solution whose grade stopped early (another column count, more rows than the gold) is run once
    more for its digest. The largest group wins; a tie goes to the group holding the earliest
    sample. The winner's correctness is its members' (equal results get the same verdict)."""

    spec = preset.grade_spec(task)
    voters: list[tuple[int, Any, bool]] = []
    for r in sorted(records, key=lambda r: int(r.get("sample") or 0)):
        solution = r.get("solution")
        if r.get("outcome") not in VOTING_OUTCOMES or not solution:
            continue
        digest_hex = (r.get("grade") or {}).get("pred_digest")
        data = bytes.fromhex(digest_hex) if digest_hex else None
        if data is None:
            g = await grader.gold(task.db_path, solution, spec)
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
        "method": preset.method_for(task.grading_method),
        "voters": len(voters),
        "groups": [{"samples": [v[0] for v in g], "size": len(g), "correct": g[0][2]} for g in groups],
        "winner": [v[0] for v in winner] if winner else None,
        "correct": bool(winner and winner[0][2]),
    }


# ---------------------------------------------------------------------------------------------
# Running episodes


async def run_episode(
    task: Task, policy: Policy, preset: Preset, grader: Any, run_info: dict[str, Any], sample: int = 0
) -> dict[str, Any]:
    """One episode, start to finish; an endpoint failure becomes an endpoint_error record."""
    record = await _run_episode(task, policy, preset, grader, run_info)
    record["sample"] = sample
    return record


async def _run_episode(task: Task, policy: Policy, preset: Preset, grader: Any,
                       run_info: dict[str, Any]) -> dict[str, Any]:

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
                            retryable=e.retryable, unreachable=e.unreachable)
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


DEFAULT_CONCURRENCY = 8  # episodes in flight (`t2sql eval --concurrency`)


async def evaluate(
    tasks: list[Task],
    policy: Policy,
    preset: Preset,
    out: str | os.PathLike,
    *,
    concurrency: int = DEFAULT_CONCURRENCY,
    grader: Any = None,
    run_info: dict[str, Any] | None = None,
    progress: bool | None = None,
    log: Any = None,
    samples: int = 1,
    identity: dict[str, Any] | None = None,
    inputs: tuple[str | os.PathLike, ...] = (),
    fresh: bool = False,
) -> EvalRun:
    """Run every unfinished (task, sample) through `policy`, appending to `out`; summarize.

    identity: what makes this run this run (the results file's header; default: run_info); a file of
    another run is refused. inputs: the files the run reads (never written as results). fresh: start
    `out` over."""
    if concurrency < 1:
        raise EvalError(f"--concurrency must be >= 1, got {concurrency}")
    if samples < 1:
        raise EvalError(f"--samples must be >= 1, got {samples}")
    log = log or (lambda message: print(message, file=sys.stderr))
    run_info = dict(run_info or {"policy": policy.name, "preset": getattr(preset, "name", None)})
    with ResultsFile.open(out, identity if identity is not None else run_info, inputs=inputs,
                          fresh=fresh) as results:
        return await _evaluate(results, tasks, policy, preset, concurrency=concurrency, grader=grader,
                               run_info=run_info, progress=progress, log=log, samples=samples)


async def _evaluate(results: ResultsFile, tasks: list[Task], policy: Policy, preset: Preset, *, concurrency: int,
                    grader: Any, run_info: dict[str, Any], progress: bool | None, log: Any,
                    samples: int) -> EvalRun:
    for warning in results.warnings:
        log(f"warning: {warning}")
    wanted = [(t, k) for t in tasks for k in range(samples)]
    todo = [(t, k) for t, k in wanted if (t.question_id, k) not in results.finished]
    skipped = len(wanted) - len(todo)
    if wanted and not todo:
        log(f"0 episodes run: all {len(wanted)} were in {results.path}; --fresh to run again")
    elif skipped:
        log(f"resuming {results.path}: {skipped} of {len(wanted)} episodes already finished, {len(todo)} to run")

    own_grader = grader is None
    if own_grader:
        grader = open_grader(preset)

    queue: asyncio.Queue[tuple[Task, int]] = asyncio.Queue()
    for item in todo:
        queue.put_nowait(item)
    bar = EpisodeProgress(len(todo), progress)
    counts = {"ran": 0, "errors": 0, "finished": 0, "fatal_streak": 0, "unreachable": 0}
    aborted: list[str] = []
    # Stop early when the endpoint refuses every request for a reason a retry cannot fix
    # (wrong model name, wrong API): no point sending the remaining thousands of episodes.
    fatal_limit = max(4, concurrency)
    # And when nothing is listening: a few tasks' worth of tries that never connected, not all of them.
    unreachable_limit = min(4, concurrency)
    unreachable: list[str] = []

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
                if record.get("unreachable") and counts["finished"] == 0:
                    counts["unreachable"] += 1
                    if counts["unreachable"] >= unreachable_limit and not aborted:
                        unreachable.append(record["error"])
                        aborted.append(record["error"])
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
        if unreachable:
            raise EvalError(
                f"nothing is listening at the endpoint: the first {counts['unreachable']} tasks could not connect, "
                f"{len(todo) - counts['ran']} not tried ({unreachable[0]}); start the server or check "
                "--endpoint, then rerun (the results file keeps what ran)")
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
