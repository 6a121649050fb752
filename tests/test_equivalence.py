"""The equivalence check on real BIRD databases: gold against itself and equivalent rewrites are
never refuted, known false positives are, the verdict is deterministic, the size cap and the copy
cache hold, the outcomes on a copy count as documented, and a real Episode reports it all."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import t2sql
from conftest import bird_root
from t2sql import GradeSpec
from t2sql.commands import equivalence as measuring
from t2sql.episode import equivalence as eq
from t2sql.episode.machine import Episode
from t2sql.episode.presets import get_preset
from t2sql.episode.terms import registered_terms
from t2sql.errors import EquivalenceError
from t2sql.serving import equivalence as machinery
from t2sql.serving.grader import Grader
from t2sql.tasks import Task

BIRD = bird_root()  # BIRD dev: tests/data/bird, or $T2SQL_BIRD
RECIPE = get_preset("qwen3.6-35b-a3b")
BARE = get_preset("bare")
CHECKED = RECIPE.replace(equivalence_penalty=0.2)  # the recipe's number, on
CONFIG = machinery.EquivalenceConfig.from_preset(RECIPE)
SUPERHERO = str(BIRD / "superhero" / "superhero.sqlite")

# 3-D Man's powers. Gold joins hero_power; the IN form matches on the real data (no hero has a
# power twice) but not once hero_power rows are duplicated: a classic false positive.
GOLD_JOIN = ("SELECT T3.power_name FROM superhero AS T1 INNER JOIN hero_power AS T2 ON T1.id = T2.hero_id "
             "INNER JOIN superpower AS T3 ON T2.power_id = T3.id WHERE T1.superhero_name = '3-D Man'")
PRED_IN = ("SELECT power_name FROM superpower WHERE id IN (SELECT power_id FROM hero_power WHERE hero_id = "
           "(SELECT id FROM superhero WHERE superhero_name = '3-D Man'))")
# Right on the real data only because hero_power has exactly its real row count; a different count
# takes the other branch (a runtime error, or a query that never ends).
HERO_POWER_ROWS = "(SELECT COUNT(*) FROM hero_power) = 5825"
ERRORS_ELSEWHERE = f"SELECT CASE WHEN {HERO_POWER_ROWS} THEN 'x' ELSE abs(-9223372036854775807 - 1) END"
SLOW_ELSEWHERE = (f"SELECT CASE WHEN {HERO_POWER_ROWS} THEN 'x' ELSE (WITH RECURSIVE c(x) AS "
                  "(SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c) END")


def rows(db_ids=None) -> list[dict]:
    data = json.loads((BIRD / "dev.json").read_text())
    present = [r for r in data if (BIRD / r["db_id"] / f"{r['db_id']}.sqlite").exists()]
    return [r for r in present if db_ids is None or r["db_id"] in db_ids]


def db_path(row: dict) -> str:
    return str(BIRD / row["db_id"] / f"{row['db_id']}.sqlite")


@pytest.fixture(scope="module")
def checker():
    c = machinery.EquivalenceChecker()
    yield c
    c.close()


# -- invariants


def test_gold_against_itself_is_never_refuted(checker):
    data = rows()
    assert len(data) >= 100
    refuted, unchecked = [], []
    for row in data:
        report = checker.check_sync(db_path(row), row["SQL"], row["SQL"], CONFIG)
        if report.refuted:
            refuted.append((row["question_id"], report.refuting_copy, report.detail))
        if not report.checked:
            unchecked.append((row["question_id"], report.skipped_reason))
    assert refuted == []
    assert len(unchecked) <= len(data) // 50, unchecked  # nearly every gold is actually compared


def test_equivalent_rewrites_are_never_refuted(checker):
    seen: dict[str, int] = {}
    for row in rows({"superhero"}):
        db = t2sql.Database(db_path(row))
        for category, sql in measuring.derive_rewrites(row["SQL"]):
            assert db.grade(sql, row["SQL"]).outcome == "match", (category, sql)  # they mean the same
            report = checker.check_sync(db_path(row), sql, row["SQL"], CONFIG)
            assert not report.refuted, (row["question_id"], category, sql, report.detail)
            seen[category] = seen.get(category, 0) + 1
    assert set(seen) == set(measuring.REWRITES) and min(seen.values()) >= 10, seen


def test_known_false_positive_pairs_are_refuted(checker):
    db = t2sql.Database(SUPERHERO)
    assert db.grade(PRED_IN, GOLD_JOIN).outcome == "match"  # the grader alone calls it correct
    report = checker.check_sync(SUPERHERO, PRED_IN, GOLD_JOIN, CONFIG)
    assert report.refuted and report.checked and report.skipped_reason is None
    assert report.refuting_copy == report.copies[-1].name  # copies stop at the first refutation
    assert report.copies[-1].outcome == "mismatch"
    # LIMIT n with n = today's row count: right until the table grows.
    gold = "SELECT hero_id FROM hero_power WHERE power_id = 1"
    n = db.count_rows(gold)
    assert n > 1 and db.grade(f"{gold} LIMIT {n}", gold).outcome == "match"
    assert checker.check_sync(SUPERHERO, f"{gold} LIMIT {n}", gold, CONFIG).refuted


def test_derived_pairs_from_bird_golds_are_caught_in_part():
    # The measurement in miniature: some derived false positives are refuted, no rewrite is.
    data = rows({"superhero"})[:15]
    result = measuring.measure(data, str(BIRD), CONFIG, concurrency=2, progress=False)
    by = {(r["kind"], r["category"]): r for r in result["rows"]}
    mutations = [r for r in result["rows"] if r["kind"] == "mutation"]
    assert sum(r["kept"] for r in mutations) > 20
    assert sum(r["refuted"] for r in mutations) >= 2
    assert all(r["refuted"] == 0 for r in result["rows"] if r["kind"] == "rewrite")
    assert by[("rewrite", "self")]["kept"] == 15
    assert result["refuted_rewrites"] == [] and result["rewrites_not_matching"] == []


# -- what an outcome on a copy means


def test_a_prediction_failing_on_a_copy_is_refuted(checker):
    assert t2sql.Database(SUPERHERO).grade(ERRORS_ELSEWHERE, "SELECT 'x'").outcome == "match"
    report = checker.check_sync(SUPERHERO, ERRORS_ELSEWHERE, "SELECT 'x'", CONFIG)
    assert report.refuted and report.copies[-1].outcome == "pred_error"


def test_a_gold_failing_on_a_copy_makes_that_copy_uninformative(checker):
    report = checker.check_sync(SUPERHERO, "SELECT 'x'", ERRORS_ELSEWHERE, CONFIG)
    outcomes = {v.kind: (v.outcome, v.informative) for v in report.copies}
    assert not report.refuted and report.checked
    assert outcomes["duplicate"] == ("gold_error", False) and outcomes["shuffle"] == ("match", True)


def test_a_prediction_timing_out_on_a_copy_is_not_refuted():
    config = machinery.EquivalenceConfig(copies=3, seed=CONFIG.seed, max_bytes=CONFIG.max_bytes,
                                         spec=GradeSpec(timeout_s=0.3))
    with machinery.EquivalenceChecker() as c:
        report = c.check_sync(SUPERHERO, SLOW_ELSEWHERE, "SELECT 'x'", config)
        assert not report.refuted
        assert [v.outcome for v in report.copies if v.kind == "duplicate"] == ["pred_timeout"]
        assert not any(v.informative for v in report.copies if v.outcome == "pred_timeout")
        # Only copies that time out: nothing was compared, and the report says so.
        only_slow = machinery.EquivalenceConfig(copies=2, seed=CONFIG.seed, max_bytes=CONFIG.max_bytes,
                                                spec=GradeSpec(timeout_s=0.3))
        plan = machinery.copy_plan(2, CONFIG.seed)
        assert [k for k, _ in plan] == ["sample", "duplicate"]
        r2 = c.check_sync(SUPERHERO, SLOW_ELSEWHERE, "SELECT 'x'", only_slow)
        if all(v.outcome == "pred_timeout" for v in r2.copies):
            assert not r2.checked and r2.skipped_reason == "no_informative_copy"
        assert not r2.refuted


# -- determinism, bounds


def test_same_seed_same_verdict_other_seed_other_copies():
    def run(seed: int) -> list[tuple]:
        config = machinery.EquivalenceConfig(copies=4, seed=seed, max_bytes=CONFIG.max_bytes,
                                             spec=GradeSpec(timeout_s=5.0))
        with machinery.EquivalenceChecker() as c:  # a fresh cache: the copies are rebuilt
            out = []
            for pred, gold in ((PRED_IN, GOLD_JOIN), (GOLD_JOIN, GOLD_JOIN), ("SELECT superhero_name FROM superhero",
                                                                               "SELECT full_name FROM superhero")):
                r = c.check_sync(SUPERHERO, pred, gold, config)
                out.append((r.refuted, r.refuting_copy, tuple((v.name, v.outcome, v.detail) for v in r.copies)))
            return out

    first = run(7)
    assert first == run(7)
    assert machinery.copy_plan(4, 7) == machinery.copy_plan(4, 7)
    kinds = [k for k, _ in machinery.copy_plan(4, 7)]
    assert kinds == ["sample", "duplicate", "shuffle", "nullify"]
    seeds = [s for _, s in machinery.copy_plan(4, 7)] + [s for _, s in machinery.copy_plan(4, 8)]
    assert len(set(seeds)) == 8 and all(0 <= s < 1 << 64 for s in seeds)
    # Another seed makes other copies: the row counts of the same query differ on some copy.
    a = machinery.EquivalenceChecker()
    try:
        counts = {seed: a.cache.get(SUPERHERO, "sample", machinery.copy_seed(seed, 0), max_bytes=CONFIG.max_bytes)
                  .count_rows("SELECT * FROM hero_power") for seed in (7, 8)}
    finally:
        a.close()
    assert counts[7] != counts[8] and all(c < 5825 for c in counts.values())


def test_the_gold_runs_once_per_copy_for_a_whole_group():
    with machinery.EquivalenceChecker() as c:
        for pred in (PRED_IN, GOLD_JOIN, f"SELECT * FROM ({GOLD_JOIN})"):
            c.check_sync(SUPERHERO, pred, GOLD_JOIN, CONFIG)
        entries = [c.cache.entry(SUPERHERO, kind, seed, max_bytes=CONFIG.max_bytes)
                   for kind, seed in machinery.copy_plan(CONFIG.copies, CONFIG.seed)]
        assert c.cache.builds == CONFIG.copies
        assert [len(e.golds) for e in entries] == [1] * CONFIG.copies  # one digest per copy, reused
        # A gold that fails on a copy is not kept: it is tried again next time.
        c.check_sync(SUPERHERO, "SELECT 'x'", ERRORS_ELSEWHERE, CONFIG)
        assert sum(len(e.golds) for e in entries) < 2 * CONFIG.copies


def test_a_database_over_the_cap_is_skipped_and_never_refuted():
    size = os.path.getsize(SUPERHERO)
    config = machinery.EquivalenceConfig(copies=3, seed=1, max_bytes=size - 1, spec=GradeSpec(timeout_s=5.0))
    with machinery.EquivalenceChecker() as c:
        report = c.check_sync(SUPERHERO, PRED_IN, GOLD_JOIN, config)
        assert (report.checked, report.refuted, report.skipped_reason) == (False, False, "too_large")
        assert "equivalence_max_bytes" in report.detail and len(c.cache) == 0 and c.cache.builds == 0
        m = report.to_metrics()
        assert m["equivalence_skipped_reason"] == "too_large" and m["equivalence_refuted"] == 0.0
    # Under the per-file cap, but its copies would not fit in the cache together: skipped, not thrashed.
    small = machinery.CopyCache(max_bytes=3 * size)
    with machinery.EquivalenceChecker(cache=small) as c:
        report = c.check_sync(SUPERHERO, PRED_IN, GOLD_JOIN, CONFIG)
        assert report.skipped_reason == "too_large" and "copy cache" in report.detail and small.builds == 0
        three = machinery.EquivalenceConfig(copies=2, seed=1, max_bytes=CONFIG.max_bytes, spec=GradeSpec(timeout_s=5.0))
        assert c.check_sync(SUPERHERO, PRED_IN, GOLD_JOIN, three).skipped_reason in (None, "")


def test_a_missing_database_is_skipped_as_a_database_error(tmp_path):
    with machinery.EquivalenceChecker() as c:
        report = c.check_sync(str(tmp_path / "nope.sqlite"), "SELECT 1", "SELECT 1", CONFIG)
    assert report.skipped_reason == "database_error" and not report.refuted and "nope.sqlite" in report.detail


def test_copy_cache_is_bounded_and_builds_each_copy_once():
    cache = machinery.CopyCache(max_copies=2)
    got = []

    def fetch():
        got.append(cache.get(SUPERHERO, "duplicate", 5, max_bytes=CONFIG.max_bytes))

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.builds == 1 and len({id(d) for d in got}) == 1  # one build, shared
    cache.get(SUPERHERO, "sample", 5, max_bytes=CONFIG.max_bytes)
    cache.get(SUPERHERO, "shuffle", 5, max_bytes=CONFIG.max_bytes)
    assert len(cache) == 2 and cache.evictions == 1 and cache.builds == 3
    by_bytes = machinery.CopyCache(max_copies=10, max_bytes=os.path.getsize(SUPERHERO) + 1)
    by_bytes.get(SUPERHERO, "sample", 5, max_bytes=CONFIG.max_bytes)
    by_bytes.get(SUPERHERO, "shuffle", 5, max_bytes=CONFIG.max_bytes)
    assert len(by_bytes) == 1 and by_bytes.evictions == 1
    with pytest.raises(EquivalenceError, match="unknown perturbation"):
        cache.get(SUPERHERO, "reverse", 5, max_bytes=CONFIG.max_bytes)


def test_bad_configuration_is_refused_clearly():
    with pytest.raises(EquivalenceError, match="copies must be >= 1"):
        machinery.EquivalenceConfig(copies=0, seed=1, max_bytes=1, spec=GradeSpec(timeout_s=1.0))
    from t2sql.errors import PresetError

    with pytest.raises(PresetError, match="equivalence_timeout_s"):
        RECIPE.replace(equivalence_timeout_s=0)


def test_the_loop_keeps_running_and_cancel_interrupts_the_query():
    slow_config = machinery.EquivalenceConfig(copies=2, seed=CONFIG.seed, max_bytes=CONFIG.max_bytes,
                                              spec=GradeSpec(timeout_s=30.0))

    async def main():
        with Grader(concurrency=1) as grader:
            ticks = 0
            task = asyncio.ensure_future(grader.equivalence(SUPERHERO, SLOW_ELSEWHERE, "SELECT 'x'", slow_config))
            started = time.monotonic()
            while time.monotonic() - started < 0.8:
                await asyncio.sleep(0.01)
                ticks += 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The single worker is free again at once: the next check is not queued behind a
            # 30 s query.
            t0 = time.monotonic()
            report = await grader.equivalence(SUPERHERO, GOLD_JOIN, GOLD_JOIN, CONFIG)
            return ticks, time.monotonic() - t0, report, grader.stats()

    ticks, waited, report, stats = asyncio.run(main())
    assert ticks > 30  # the loop was never blocked by the running query
    assert waited < 5.0 and not report.refuted and report.checked
    assert stats["equivalence_checks"] == 2


def test_the_check_counts_against_the_graders_one_concurrency_limit():
    """With one SQL worker, a tool call sent while a check runs waits for the check (it would run
    beside it if the check had threads of its own), and no other thread runs SQL."""
    slow_config = machinery.EquivalenceConfig(copies=2, seed=CONFIG.seed, max_bytes=CONFIG.max_bytes,
                                              spec=GradeSpec(timeout_s=30.0))

    async def main():
        with Grader(concurrency=1) as grader:
            await grader.run_tool(SUPERHERO, "SELECT 1")  # the worker thread exists
            threads_before = {t.name for t in threading.enumerate()}
            check = asyncio.ensure_future(grader.equivalence(SUPERHERO, SLOW_ELSEWHERE, "SELECT 'x'", slow_config))
            await asyncio.sleep(0.5)  # the check is on the worker, in its slow query
            tool = asyncio.ensure_future(grader.run_tool(SUPERHERO, "SELECT COUNT(*) FROM superhero"))
            await asyncio.sleep(0.5)
            tool_waited = not tool.done()
            threads_during = {t.name for t in threading.enumerate()}
            check.cancel()
            with pytest.raises(asyncio.CancelledError):
                await check
            result = await asyncio.wait_for(tool, 10)
            return tool_waited, threads_before, threads_during, result

    tool_waited, before, during, result = asyncio.run(main())
    assert tool_waited, "a tool call ran beside the equivalence check on a Grader of one worker"
    assert result.row_count == 1
    assert during == before  # the check started no thread of its own
    assert not any("equivalence" in name for name in during)


def test_a_process_worker_runs_the_check_with_its_own_copies():
    async def main():
        with Grader(concurrency=1, backend="process") as grader:
            lucky = await grader.equivalence(SUPERHERO, PRED_IN, GOLD_JOIN, CONFIG)
            exact = await grader.equivalence(SUPERHERO, GOLD_JOIN, GOLD_JOIN, CONFIG)
            return lucky, exact

    builds_here = machinery.default_checker().cache.builds
    lucky, exact = asyncio.run(main())
    assert lucky.refuted and lucky.refuting_copy.split(":")[0] in machinery.KINDS
    assert exact.checked and not exact.refuted
    assert machinery.default_checker().cache.builds == builds_here  # the copies were built in the worker


# -- inside a real episode


def _task() -> Task:
    row = next(r for r in rows({"superhero"}) if r["SQL"].strip() == GOLD_JOIN)
    return Task.from_row(row, BIRD)


def _play(preset, solution: str):
    async def main():
        with Grader(concurrency=2) as grader:
            episode = Episode(_task(), preset, grader, prompt=[{"role": "system", "content": "s"},
                                                               {"role": "user", "content": "u"}])
            outcome = await episode.on_turn(f"<think>x</think>The evidence says: {_task().evidence}\n"
                                            f"<solution>{solution}</solution>")
            assert outcome.done
            return episode.result

    return asyncio.run(main())


def test_episode_takes_the_penalty_and_reports_the_metrics():
    assert any(t.name == "equivalence" and t.switch == "equivalence_penalty" for t in registered_terms())
    lucky = _play(CHECKED, PRED_IN)
    assert lucky.outcome == "correct" and lucky.correct  # evaluation still scores it correct
    assert lucky.reward_terms["equivalence"] == pytest.approx(-CHECKED.equivalence_penalty)
    assert lucky.metrics["equivalence_refuted"] == 1.0 and lucky.metrics["equivalence_checked"] == 1.0
    assert lucky.metrics["equivalence_copy"].split(":")[0] in machinery.KINDS
    assert lucky.metrics["equivalence_skipped_reason"] == ""
    assert "unapplied_switches" not in lucky.metrics
    exact = _play(CHECKED, GOLD_JOIN)
    assert exact.reward_terms["equivalence"] == 0.0 and exact.metrics["equivalence_refuted"] == 0.0
    assert exact.reward - lucky.reward == pytest.approx(CHECKED.equivalence_penalty)
    wrong = _play(CHECKED, "SELECT power_name FROM superpower LIMIT 2")
    assert wrong.outcome == "incorrect" and wrong.metrics["equivalence_skipped_reason"] == "not_correct"
    assert wrong.reward_terms["equivalence"] == 0.0
    bare = _play(BARE, PRED_IN)
    assert bare.reward == 1.0 and "equivalence" not in bare.reward_terms
    assert "equivalence_refuted" not in bare.metrics


def test_a_trajectory_without_a_grader_is_checked_on_a_thread_of_its_own():
    """score() on a Trajectory a user built (no Grader): the check still runs, off the loop."""
    from t2sql.episode.reward import Trajectory

    def trajectory(solution: str) -> Trajectory:
        return Trajectory(outcome="correct", evidence="", visible=("x",), prose=("x",), answer_turn=0,
                          invalid_tool_calls=0, solution=solution, task=_task())

    lucky = asyncio.run(eq.check_trajectory(trajectory(PRED_IN), RECIPE))
    exact = asyncio.run(eq.check_trajectory(trajectory(GOLD_JOIN), RECIPE))
    assert lucky.refuted and exact.checked and not exact.refuted


# -- the measurement command


def test_measure_command_prints_a_table_and_json(tmp_path):
    data = tmp_path / "dev.json"
    subset = rows({"superhero"})[:12]
    data.write_text(json.dumps([*subset, {"db_id": "superhero"}]))  # one bad entry: reported, skipped
    cmd = [sys.executable, "-m", "t2sql.cli", "equivalence", "--measure", "--data", str(data), "--db-root", str(BIRD)]
    proc = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "entry 12 skipped" in proc.stderr
    result = json.loads(proc.stdout)
    assert result["questions"] == 12
    assert {r["category"] for r in result["rows"]} == set(measuring.MUTATIONS) | set(measuring.REWRITES)
    table = subprocess.run([sys.executable, "-m", "t2sql.cli", "equivalence", "--measure", "--data", str(data),
                            "--db-root", str(BIRD)], capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "rewrite   self" in table.stdout and "12 gold queries" in table.stdout
    bad = subprocess.run([*cmd[:-2], "--db-root", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "no database for superhero" in bad.stderr
    no_mode = subprocess.run([c for c in cmd if c != "--measure"], capture_output=True, text=True, timeout=60)
    assert no_mode.returncode == 2 and "pass --measure" in no_mode.stderr
