"""The equivalence check as a reward term: a prediction that matches the gold only by luck of the data
loses points. The check itself (the small databases, their invariants, the verdicts) is
t2sql.serving.equivalence's.

A prediction graded `correct` returned the gold's result on the task's database. That does not make
it the same query: `SELECT name` where the gold says `SELECT DISTINCT name` matches whenever the
data happens to hold no duplicate names; `colour = 'blue'` for `colour = 'Blue'` matches whenever no
value differs in case alone. The recipe refuted such matches with a verifier (VeriEQL); t2sql runs
both queries on small databases of the task's database's kind and refutes the match when one tells
them apart. A right answer must never lose points, so every small database keeps what every real
database of that kind keeps: the declared constraints (keys, UNIQUE, NOT NULL, foreign keys closed)
and the invariants mined from its data (no NULL where there is none, no repeat where there is none,
undeclared references closed, parents that always have children keep one, denormalised copies equal,
sums that always hold, values of the column's types and formats, identifiers in their letter case;
t2sql.serving.invariants). A database that breaks one is thrown away before any query sees it.

The rules (preset fields in t2sql.episode.presets, `equivalence_*`):

- Only an episode whose outcome is `correct` is checked, graded on each small database as the
  episode graded it (the task's grading spec: method, float_digits, column order; a subset method
  asks only that each predicted row be a gold row there), each query under `equivalence.timeout_s`.
- The small databases: those built for the pair (the real rows each query joins and keeps, and those
  meeting all but one of its conditions, closed under the references; values at and beside each
  literal; duplicates under fresh keys; NULLs; integer keys renumbered) and the database's suite
  (`equivalence.suite_size` small databases distilled against neighbour queries, built once per
  database file and kept on disk). The gold's are prepared once and shared by every prediction of
  its task.
- Per small database:
    match                      agrees: not refuted by it
    mismatch / pred_error      refutes, when it holds on the database's mirror too (the rows in
                               reverse order, SQLite's unordered scans reversed), neither query's
                               result changes there, and no ORDER BY ... LIMIT keeps one of tied rows
                               (a result that is a choice proves nothing, but rows against none)
    anything else              not informative (a timeout, a gold that fails there, ...)
  The first database that refutes is the witness: shrunk to as few rows as still refute, shown as
  INSERT statements with both queries' results there.
- A refuted match loses `reward.equivalence_penalty` (0.2 in the recipe preset, 0 = off in `bare`); the outcome
  stays `correct` (evaluation still scores it correct; only the training reward changes).
- Never raised: the check ends refuted with a witness, checked, or skipped for one of
  t2sql.serving.equivalence.SKIP_REASONS (a query the guard does not run, a part of the schema left
  out, an unreadable file, a database not mined yet, every small database refused by a constraint, a
  result that changes from run to run, the budget spent, no informative database, the check's own
  failure); docs/episode.md states each.
- Mined ahead: a database's invariants are mined before training (`t2sql gold`, `t2sql-train
  prepare`; t2sql.serving.mine_ahead), never inside a check: a check on a database not mined yet is
  skipped (not_ready) at once and the process mines that database in the background, once.
- What a question presupposes is kept too (t2sql.serving.presupposed; the task's evidence is passed
  with the pair): fixed lookup tables whole, with the keys the evidence states; the entities the
  gold names, once; an aggregate's one row never NULL where the real one is not.
- Deterministic: the same (database file, prediction, gold, evidence, preset) gives the same verdict
  and witness.
- Bounded: every query the check runs (on the small databases, on the real file) goes
  through the core's guard, under its timeout cut at one deadline for the whole check
  (`equivalence.budget_s`), the episode's Cancel and the temporary-disk cap; each query on a small
  database runs under `equivalence.timeout_s`; the check is one job on one of the episode's
  Grader's SQL workers (`Grader.equivalence`), so it counts against the Grader's one concurrency
  limit, runs with the GIL released, never on the event loop, and a cancelled episode frees it.

Metrics added to the episode (every episode scored with the term on): equivalence_checked,
equivalence_refuted, equivalence_skipped_reason ("" or one of SKIP_REASONS), equivalence_databases
(small databases tried),
equivalence_elapsed_s, equivalence_witness (the witness as text, "" when not refuted).

`t2sql equivalence --measure --data dev.json --db-root DIR` (t2sql.bench.equivalence) measures both
errors per kind; `t2sql equivalence --pairs FILE` checks given pairs; `--invariants --db FILE` lists
what a database's small databases keep.
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
        return await trajectory.grader.equivalence(task.db_path, trajectory.solution, task.gold_sql, config,
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
