"""Re-draft and repetition guards: each detector on the cases it must catch and the ones it must let pass."""

from __future__ import annotations

import pytest

from t2sql.episode.guards import (
    GuardReport,
    check_turns,
    ngram_repetition,
    normalize_sql,
    repeated_tool_queries,
    repeated_turns,
    solution_redrafts,
    turn_similarity,
)

THRESHOLDS = dict(ngram_n=4, ngram_share=0.5, min_ngrams=32, turn_similarity_threshold=0.9)


# ------------------------------------------------------------------ repeated tool queries


def test_normalize_sql_collapses_whitespace_and_case_but_keeps_literals():
    assert normalize_sql("SELECT  name\n FROM   Hero WHERE id = 1;") == "select name from hero where id = 1"
    assert normalize_sql("select name from hero where id = 1") == "select name from hero where id = 1"
    assert normalize_sql("SELECT * FROM t WHERE n = 'Bob  O''Neil'") == "select * from t where n = 'Bob  O''Neil'"
    assert normalize_sql("  select 1 ;  ") == "select 1"


def test_same_query_twice_counts_once_per_repeat():
    queries = [
        "SELECT COUNT(*) FROM superhero",
        "select count(*)\nfrom   superhero;",  # same after normalisation
        "SELECT COUNT(*) FROM superhero",  # and again
        "SELECT COUNT(*) FROM colour",
    ]
    assert repeated_tool_queries(queries) == 2


def test_queries_differing_only_in_literal_case_are_different():
    assert repeated_tool_queries(["SELECT 1 FROM t WHERE n = 'Bob'", "SELECT 1 FROM t WHERE n = 'bob'"]) == 0


def test_empty_queries_are_not_repeats():
    assert repeated_tool_queries(["", "  ", ""]) == 0


# ------------------------------------------------------------------ solution re-drafts


def test_single_solution_is_not_a_redraft():
    assert solution_redrafts(["Checked.\n<solution>SELECT 1</solution>"]) == 0


def test_second_solution_after_a_complete_one_is_a_redraft():
    turn = "<solution>SELECT 1</solution>\nWait, better:\n<solution>SELECT 2</solution>"
    assert solution_redrafts([turn]) == 1
    assert solution_redrafts([turn + "\n<solution>SELECT 3"]) == 2  # an unclosed third draft counts too


def test_reopened_unclosed_solution_before_completion_is_not_a_redraft():
    # The first block never closed, so the second is the first complete one.
    assert solution_redrafts(["<solution>SELECT 1 <solution>SELECT 2</solution>"]) == 0


def test_redrafts_are_counted_per_turn_and_summed():
    a = "<solution>x</solution><solution>y</solution>"
    assert solution_redrafts([a, "no solution here", a]) == 2
    # Upper-case tags are not solution blocks to the parser (t2sql.episode.prompt), so not re-drafts either.
    assert solution_redrafts(["<SOLUTION>x</SOLUTION><SOLUTION>y</SOLUTION>"]) == 0


# ------------------------------------------------------------------ n-gram repetition inside a turn


PARAGRAPH = (
    "The question asks for the number of heroes whose eye colour is blue. The evidence says blue eyes "
    "refers to colour = 'Blue'. I will join superhero with colour on eye_colour_id and count rows."
)


def test_ordinary_prose_has_low_repetition():
    share, count = ngram_repetition(PARAGRAPH, 4)
    assert count > 32
    assert share < 0.1


def test_a_loop_has_high_repetition():
    share, _ = ngram_repetition(" ".join([PARAGRAPH] * 5), 4)
    assert share == pytest.approx(0.8, abs=0.02)  # k copies -> about (k-1)/k


def test_empty_and_short_text():
    assert ngram_repetition("", 4) == (0.0, 0)
    assert ngram_repetition("one two", 4) == (0.0, 0)
    with pytest.raises(ValueError):
        ngram_repetition("x", 0)


def test_short_turns_are_never_judged_repetitive():
    # "ok ok ok ok ok ok" repeats itself fully but has fewer than min_ngrams 4-grams.
    report = check_turns(["ok " * 10], [""], [], **THRESHOLDS)
    assert report.repetitive_turns == 0
    report = check_turns(["ok " * 200], [""], [], **THRESHOLDS)
    assert report.repetitive_turns == 1
    assert report.max_ngram_repetition > 0.9


# ------------------------------------------------------------------ turn repeating an earlier turn


def test_identical_turns_have_similarity_one_and_different_turns_low():
    assert turn_similarity(PARAGRAPH, PARAGRAPH) == 1.0
    other = "Let me look at the publisher table first and list the distinct publisher names it holds."
    assert turn_similarity(PARAGRAPH, other) < 0.1


def test_short_turns_compare_token_for_token():
    assert turn_similarity("ok", "OK") == 1.0
    assert turn_similarity("ok", "no") == 0.0
    assert turn_similarity("", "") == 0.0


def test_repeated_turn_counted_against_any_earlier_turn():
    other = "Let me look at the publisher table first and list the distinct publisher names it holds."
    turns = [PARAGRAPH, other, PARAGRAPH + " ", other.upper()]
    count, highest = repeated_turns(turns, 0.9)
    assert count == 2
    assert highest == 1.0
    # A near copy with a small edit still counts at 0.8, not at 0.99.
    edited = PARAGRAPH.replace("count rows", "count the rows")
    count_low, sim = repeated_turns([PARAGRAPH, edited], 0.8)
    assert count_low == 1 and 0.8 <= sim < 0.99
    assert repeated_turns([PARAGRAPH, edited], 0.99)[0] == 0


def test_bare_tool_call_turns_are_left_to_the_tool_query_guard():
    call = "<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
    a = call.format("SELECT COUNT(*) FROM superhero AS T1 JOIN colour AS T2 ON T1.eye_colour_id = T2.id "
                    "WHERE T2.colour = 'Blue'")
    b = call.format("SELECT COUNT(*) FROM superhero AS T1 JOIN colour AS T2 ON T1.eye_colour_id = T2.id "
                    "WHERE T2.colour = 'blue'")
    queries = [a.split("\n")[3], b.split("\n")[3]]
    probing = check_turns([a, b], [a, b], queries, **THRESHOLDS)
    assert probing.repeated_turns == 0 and probing.repeated_tool_queries == 0  # probing case is exploration
    same = check_turns([a, a], [a, a], [queries[0], queries[0]], **THRESHOLDS)
    assert same.repeated_turns == 0 and same.repeated_tool_queries == 1  # counted once, by the query guard
    # The same thinking around two calls is still a repeated turn.
    think = f"<think>{PARAGRAPH}</think>"
    assert check_turns([think + a, think + b], [a, b], queries, **THRESHOLDS).repeated_turns == 1


# ------------------------------------------------------------------ the report


def test_clean_episode_reports_zero_everywhere():
    texts = [
        "<think>restate</think>The evidence says blue eyes refers to colour = 'Blue'.<tool_call>...</tool_call>",
        "<think>ok</think>Blue is colour id 7. "
        "<solution>SELECT COUNT(*) FROM superhero WHERE eye_colour_id = 7</solution>",
    ]
    visible = [t.split("</think>", 1)[1] for t in texts]
    report = check_turns(texts, visible, ["SELECT id FROM colour WHERE colour = 'Blue'"], **THRESHOLDS)
    assert report == GuardReport(0, 0, 0, report.max_ngram_repetition, 0, report.max_turn_similarity)
    metrics = report.to_metrics()
    assert set(metrics) == {
        "guard_repeated_tool_queries",
        "guard_solution_redrafts",
        "guard_repetitive_turns",
        "guard_max_ngram_repetition",
        "guard_repeated_turns",
        "guard_max_turn_similarity",
    }
    assert all(isinstance(v, float) for v in metrics.values())


def test_collapsed_episode_trips_every_guard():
    loop = " ".join([PARAGRAPH] * 4)
    texts = [loop, loop, "<solution>SELECT 1</solution><solution>SELECT 2</solution>"]
    visible = ["", "", texts[2]]
    report = check_turns(texts, visible, ["SELECT 1", "select 1"], **THRESHOLDS)
    assert report.repeated_tool_queries == 1
    assert report.solution_redrafts == 1
    assert report.repetitive_turns == 2
    assert report.repeated_turns == 1


def test_bad_thresholds_are_rejected():
    with pytest.raises(ValueError, match="ngram_share"):
        check_turns([], [], [], **{**THRESHOLDS, "ngram_share": 0.0})
    with pytest.raises(ValueError, match="turn_similarity_threshold"):
        check_turns([], [], [], **{**THRESHOLDS, "turn_similarity_threshold": 1.5})


# ------------------------------------------------------------------ as reward terms of the presets


def _trajectory(texts, tool_queries, outcome="correct"):
    from t2sql.episode.reward import Trajectory

    visible = tuple(t.split("</think>", 1)[-1] for t in texts)
    answer = next((i for i, v in enumerate(visible) if "<solution>" in v), None)
    return Trajectory(
        outcome=outcome,
        evidence="",
        visible=visible,
        prose=visible,
        answer_turn=answer,
        invalid_tool_calls=0,
        tool_queries=tuple(tool_queries),
        texts=tuple(texts),
    )


def test_guard_terms_are_registered_and_scored_from_the_recipe_preset():
    import asyncio

    from t2sql.episode.guards import GUARD_TERMS
    from t2sql.episode.presets import get_preset
    from t2sql.episode.terms import registered_terms, score

    assert set(GUARD_TERMS) <= {t.name for t in registered_terms()}
    preset = get_preset("qwen3.6-35b-a3b")
    loop = " ".join([PARAGRAPH] * 4)
    traj = _trajectory(
        [loop, loop, "<think>x</think><solution>SELECT 1</solution><solution>SELECT 2</solution>"],
        ["SELECT 1", "select 1"],
    )
    breakdown = asyncio.run(score(traj, preset))
    assert breakdown.terms["repeated_tool_queries"] == pytest.approx(-preset.reward.repeated_tool_query_penalty * 1)
    assert breakdown.terms["solution_redrafts"] == pytest.approx(-preset.reward.redraft_penalty * 1)
    assert breakdown.terms["ngram_repetition"] == pytest.approx(-preset.reward.ngram_repetition_penalty * 2)
    assert breakdown.terms["repeated_turns"] == pytest.approx(-preset.reward.repeated_turn_penalty * 1)
    assert all(getattr(preset.reward, switch) > 0 for switch, _ in GUARD_TERMS.values())  # on in the recipe
    expected = preset.reward.correct + sum(breakdown.terms.values())
    assert breakdown.total == pytest.approx(expected)
    assert not set(breakdown.unapplied) & {s for s, _ in GUARD_TERMS.values()}


def test_guard_terms_are_off_in_bare_and_never_push_below_the_floor():
    import asyncio

    from t2sql.episode.presets import get_preset
    from t2sql.episode.terms import score

    loop = " ".join([PARAGRAPH] * 4)
    traj = _trajectory([loop, loop, loop], ["SELECT 1", "select 1", "SELECT 1"], outcome="no_solution")
    bare = asyncio.run(score(traj, get_preset("bare")))
    assert not {"repeated_tool_queries", "ngram_repetition", "repeated_turns"} & set(bare.terms)
    recipe = get_preset("qwen3.6-35b-a3b")
    scored = asyncio.run(score(traj, recipe))
    assert scored.terms["repeated_turns"] < 0
    assert scored.total == recipe.reward_floor  # -1 stays the worst, whatever the guards add


# ------------------------------------------------------------------ in a real episode (real SQLite, real grader)


def test_guards_in_a_real_episode_are_named_in_metrics_and_reward():
    import asyncio
    import json
    from pathlib import Path

    import t2sql
    from t2sql.episode.machine import Episode
    from t2sql.episode.presets import get_preset
    from t2sql.serving.grader import Grader
    from t2sql.tasks import Task

    sample = Path(t2sql.__file__).parent / "sample"
    row = json.loads((sample / "dev.json").read_text())[0]  # "superpowers of 3-D Man"
    task = Task.from_row(row, sample)
    preset = get_preset("qwen3.6-35b-a3b")
    probe = "SELECT id FROM superhero WHERE superhero_name = '3-D Man'"
    call = "<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n{}\n</parameter>\n</function>\n</tool_call>"
    restate = f"The evidence says: {task.evidence}"
    turns = [
        f"<think>find the hero</think>{restate}\n" + call.format(probe),
        "<think>again</think>Checking once more.\n" + call.format(probe.lower().replace("3-d man", "3-D Man")),
        f"<think>done</think>{restate}\n<solution>SELECT 1</solution>\nActually:\n<solution>{task.gold_sql}</solution>",
    ]

    async def play():
        async with Grader(concurrency=1) as grader:
            episode = Episode(task, preset, grader)
            for text in turns:
                outcome = await episode.on_turn(text)
                if outcome.done:
                    break
            return episode.result

    result = asyncio.run(play())
    assert result.outcome == "correct"  # the last block is the answer
    assert result.metrics["guard_repeated_tool_queries"] == 1.0
    assert result.metrics["guard_solution_redrafts"] == 1.0
    assert result.metrics["guard_repeated_turns"] == 0.0
    assert result.reward_terms["repeated_tool_queries"] == pytest.approx(-preset.reward.repeated_tool_query_penalty)
    assert result.reward_terms["solution_redrafts"] == pytest.approx(-preset.reward.redraft_penalty)
    assert result.reward == pytest.approx(preset.reward.correct + sum(result.reward_terms.values()))
    assert result.reward < preset.reward.correct
