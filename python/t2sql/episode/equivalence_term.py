"""The equivalence check as a reward term: a `correct` match that a small database of the task's database's kind
refutes loses `reward.equivalence_penalty`, and the episode's metrics carry the verdict (`equivalence_*`). The check is
t2sql.equivalence.check's; its guard, budget and verdicts: docs/episode.md, "The equivalence check"; how the small
databases are made: docs/recipe_extras.md, "Equivalence check"."""

from __future__ import annotations

import asyncio
from typing import Any

import t2sql
from t2sql.episode.presets import Preset
from t2sql.episode.reward import RewardTerm, TermResult, Trajectory
from t2sql.equivalence.check import EquivalenceConfig, EquivalenceReport, default_checker, skipped
from t2sql.equivalence.job import check_on

# ---------------------------------------------------------------------------------- the reward term

TERM_NAME = "equivalence"


async def check_trajectory(trajectory: Trajectory, preset: Preset) -> EquivalenceReport:
    """The report for a finished episode (a t2sql.episode.reward.Trajectory): on the episode's
    Grader, under its concurrency limit; a trajectory built without one is checked on a thread
    of its own. It never raises but for the episode's own cancellation: a check the Grader could
    not run (its worker lost, the Grader closing) is a report that says so."""
    try:
        return await _check_trajectory(trajectory, preset)
    except asyncio.CancelledError:
        raise
    except t2sql.DatabaseError as e:
        return skipped("database_error", str(e))
    except Exception as e:  # the reward goes on; the report says what happened
        return skipped("check_error", f"{type(e).__name__}: {e}"[:500])


async def _check_trajectory(trajectory: Trajectory, preset: Preset) -> EquivalenceReport:
    if trajectory.outcome != "correct":
        return skipped("not_correct")
    task = trajectory.task
    if task is None or not trajectory.solution:
        return skipped("no_task", "the trajectory carries no task or solution")
    spec = trajectory.grade_spec if trajectory.grade_spec is not None else preset.grade_spec(task)
    config = EquivalenceConfig.from_preset(preset, spec)
    if trajectory.grader is not None:
        return await check_on(trajectory.grader, task.db_path, trajectory.solution, task.gold_sql, config,
                              evidence=task.evidence)
    cancel = t2sql.Cancel()
    check = asyncio.ensure_future(asyncio.to_thread(
        default_checker().check_sync, task.db_path, trajectory.solution, task.gold_sql, config, cancel=cancel,
        evidence=task.evidence))
    try:
        return await asyncio.shield(check)
    except asyncio.CancelledError:
        cancel.cancel()  # the running query stops at SQLite's next progress check
        raise


async def equivalence_term(trajectory: Trajectory, preset: Preset) -> Any:
    report = await check_trajectory(trajectory, preset)
    amount = -preset.reward.equivalence_penalty if report.refuted else 0.0
    return TermResult(amount, report.to_metrics())


def reward_terms() -> list[RewardTerm]:
    """The RewardTerm t2sql.episode.reward registers (switch: equivalence_penalty)."""
    return [RewardTerm(TERM_NAME, equivalence_term, switch="equivalence_penalty")]
