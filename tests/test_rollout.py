"""The framework-neutral rollout seam (t2sql.episode.rollout): docs/episode.md's example adapter for
another RL framework, run as it is written there, on a real BIRD database through the real Grader."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

from conftest import REPO, bird_root
from t2sql.episode import rollout
from t2sql.episode.machine import EpisodeResult
from t2sql.episode.rollout import RolloutSettings, context

BIRD = bird_root()
SETTINGS = RolloutSettings(db_root=str(BIRD), concurrency=2)


@pytest.fixture(scope="module")
def example() -> dict:
    """The code block of docs/episode.md's section on other frameworks, executed."""
    text = (REPO / "docs" / "episode.md").read_text()
    section = text[text.index("## An adapter for another RL framework"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/episode.md", "exec"), namespace)  # noqa: S102 - our own documentation
    yield namespace
    rollout.close_contexts()


@pytest.fixture(scope="module")
def row() -> dict:
    rows = json.loads((BIRD / "dev.json").read_text())
    return next(r for r in rows if r["db_id"] == "superhero" and r["evidence"])


def _oracle(gold: str):
    """A framework's generation stand-in: explores with the gold query, then answers with it."""
    turns = iter([
        f"<think>look</think>\n<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n{gold}\n"
        "</parameter>\n</function>\n</tool_call>",
        f"<think>done</think>\n<solution>\n{gold}\n</solution>",
    ])
    seen = []

    async def generate_turn(messages, tools, max_tokens):
        seen.append((len(messages), [t["function"]["name"] for t in tools], max_tokens))
        return next(turns), False

    return generate_turn, seen


def test_the_documented_adapter_runs_an_episode_to_its_record(example, row):
    generate_turn, seen = _oracle(row["SQL"])
    record = asyncio.run(example["rollout"](row, generate_turn, SETTINGS))
    assert record["outcome"] == "correct" and record["correct"] is True
    assert record["tool_calls"] == 1 and record["turns"] == 2
    # The record is EpisodeResult.to_dict(): every field, plain JSON.
    assert set(record) == {f.name for f in dataclasses.fields(EpisodeResult)}
    json.dumps(record)
    # The tool message came back between the turns; the budget is the preset's per-turn limit.
    preset = context(SETTINGS).preset
    assert [s[0] for s in seen] == [2, 4] and seen[0][1] == ["execute_sql_query"]
    assert seen[0][2] == preset.budgets.max_turn_tokens


def test_the_documented_regrade_scores_the_outcome_table(example, row):
    preset = context(SETTINGS).preset
    replay = example["reward_of_replayed"]
    answered = f"<think>a <solution>SELECT 1</solution> draft</think>\n<solution>{row['SQL']}</solution>"
    assert asyncio.run(replay(row, answered, SETTINGS)) == preset.reward.correct
    wrong = "<solution>SELECT 1</solution>"
    assert asyncio.run(replay(row, wrong, SETTINGS)) == preset.reward.incorrect
    assert asyncio.run(replay(row, "no answer here", SETTINGS)) == preset.reward.no_solution


def test_a_missing_database_is_the_datas_fault_in_a_regrade(row, tmp_path):
    ctx = context(RolloutSettings(db_root=str(tmp_path), concurrency=1))
    assert asyncio.run(ctx.regrade(ctx.task(row), f"<solution>{row['SQL']}</solution>")) == "gold_error"


def test_one_context_per_process_and_settings():
    a = context(SETTINGS)
    assert context(RolloutSettings(db_root=str(BIRD), concurrency=2)) is a
    assert context(dataclasses.replace(SETTINGS, grade_timeout_s=5.0)) is not a
    assert context(dataclasses.replace(SETTINGS, grade_timeout_s=5.0)).preset.grading.timeout_s == 5.0
    rollout.close_contexts()
    assert context(SETTINGS) is not a


def test_the_miles_record_is_the_episode_record_without_the_grade(example, row):
    from t2sql.miles import adapter

    generate_turn, _ = _oracle(row["SQL"])
    record = asyncio.run(example["rollout"](row, generate_turn, SETTINGS))
    result = EpisodeResult(**record)
    kept = adapter._result_record(result, "qwen3.6-35b-a3b")
    assert kept == {**{k: v for k, v in record.items() if k != "grade"}, "preset": "qwen3.6-35b-a3b"}
