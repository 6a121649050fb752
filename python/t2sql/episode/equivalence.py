"""The equivalence check as a reward term: a prediction that matches the gold only by luck of the data
loses points. The check itself (the copies, their cache, the verdicts) is t2sql.serving.equivalence's.

A prediction graded `correct` returned the gold's result on the task's database. That does not make
it the same query: `SELECT name` where the gold says `SELECT DISTINCT name` matches whenever the
data happens to hold no duplicate names. The recipe refuted such matches with a verifier (VeriEQL);
t2sql runs both queries again on K perturbed in-memory copies of the database and refutes the match
when any copy tells them apart. The copies are made by the trusted core (`Database.perturbed`, with
its own SQL on a private connection; the model's SQL never touches a writable copy):

  sample     about a third of each table's rows deleted (foreign keys may dangle)
  duplicate  about a third of each table's rows inserted again under fresh keys (UNIQUE kept)
  shuffle    in each table, one non-key column's values permuted across rows
  nullify    in each table, a third of one nullable non-key column's values set to NULL

The rules (preset fields in t2sql.episode.presets, `equivalence_*`):

- Only an episode whose outcome is `correct` is checked. Copy i (0-based) of `equivalence_copies`
  is kind `KINDS[i % 4]` (sample, duplicate, shuffle, nullify, sample, ...) with a 64-bit seed derived from
  `equivalence_seed` and i (`copy_plan`). The seeds do not depend on the task, so the copies of a
  database are built once per process and shared by every task on it.
- Per copy, the core grades the prediction against the gold as the episode graded it (the task's
  grading spec: method, float_digits, column order), each query under `equivalence_timeout_s`.
  Copies run in plan order; the first one that tells the queries apart refutes the match and the
  rest are not run.
    match                      the copy agrees: not refuted by it
    mismatch                   refuted (the results differ)
    pred_error                 refuted: the gold runs on this valid state of the schema and the
                               prediction fails on it, so they are not the same query
    pred_timeout               not informative: speed is not meaning, and the copy's time limit is
                               shorter than grading's; a slow correct query must not lose points
    gold_error / gold_timeout  not informative: the copy says nothing about the gold's meaning
    unsafe                     not informative (cannot follow a match: same SQL, same checks)
- A refuted match loses `equivalence_penalty` (0.2 in the recipe preset, 0 = off in `bare`); the
  outcome stays `correct` (evaluation still scores it correct; only the training reward changes).
- Skipped, never refuted: a database larger than `equivalence_max_bytes`, or whose copies would not
  all fit in the copy cache at once ("too_large"; copies are in memory, and a cache that cannot
  hold them would rebuild them at every check), a database the core cannot copy
  ("database_error"), no copy informative ("no_informative_copy").
- Deterministic: the same (database file, prediction, gold, preset) gives the same verdict.
- Bounded: at most `equivalence_copies` x 2 queries, each under `equivalence_timeout_s` (the gold's
  digest on a copy is kept, so a group of samples of one task runs it once per copy); copies are
  kept in an LRU per process bounded by bytes (1 GiB, `T2SQL_EQUIVALENCE_CACHE_MIB`; with the
  process or Ray backend, per worker). The whole check runs as one job on one of the episode's
  Grader's SQL workers (`Grader.equivalence`), so it counts against the Grader's one concurrency
  limit like a tool call or a grade; its SQL runs with the GIL released, never on the event loop,
  and a cancelled episode interrupts it.

Metrics added to the episode (every episode scored with the term on):
  equivalence_checked (1.0 when at least one copy was informative), equivalence_refuted (1.0/0.0),
  equivalence_copy ("kind:seed" of the refuting copy, else ""), equivalence_skipped_reason ("" or
  not_correct / too_large / database_error / no_informative_copy / no_task),
  equivalence_copies_run (informative copies), equivalence_elapsed_s.

`t2sql equivalence --measure --data dev.json --db-root DIR`
(t2sql.commands.equivalence) measures the check on BIRD-layout data: derived false-positive pairs
refuted, gold against itself and equivalent rewrites never refuted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import t2sql
from t2sql.episode.presets import Preset
from t2sql.episode.reward import RewardTerm, TermResult, Trajectory
from t2sql.serving.equivalence import EquivalenceConfig, EquivalenceReport, default_checker, skipped

# ---------------------------------------------------------------------------------- the reward term

TERM_NAME = "equivalence"


async def check_trajectory(trajectory: Trajectory, preset: Preset) -> EquivalenceReport:
    """The report for a finished episode (a t2sql.episode.reward.Trajectory): on the episode's
    Grader, under its concurrency limit; a trajectory built without one is checked on a thread
    of its own."""
    if trajectory.outcome != "correct":
        return skipped("not_correct")
    task = trajectory.task
    if task is None or not trajectory.solution:
        return skipped("no_task", "the trajectory carries no task or solution")
    spec = trajectory.grade_spec if trajectory.grade_spec is not None else preset.grade_spec(task)
    config = EquivalenceConfig.from_preset(preset, spec)
    if trajectory.grader is not None:
        return await trajectory.grader.equivalence(task.db_path, trajectory.solution, task.gold_sql, config)
    cancel = t2sql.Cancel()
    check = asyncio.ensure_future(asyncio.to_thread(
        default_checker().check_sync, task.db_path, trajectory.solution, task.gold_sql, config, cancel=cancel))
    try:
        return await asyncio.shield(check)
    except asyncio.CancelledError:
        cancel.cancel()  # the running query stops at SQLite's next progress check
        raise


async def equivalence_term(trajectory: Trajectory, preset: Preset) -> Any:
    report = await check_trajectory(trajectory, preset)
    amount = -preset.equivalence_penalty if report.refuted else 0.0
    return TermResult(amount, report.to_metrics())


def reward_terms() -> list[RewardTerm]:
    """The RewardTerm t2sql.episode.reward registers (switch: equivalence_penalty)."""
    return [RewardTerm(TERM_NAME, equivalence_term, switch="equivalence_penalty")]
