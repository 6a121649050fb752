"""The per-call episode API (record_turn / call_tool / finish), for frameworks that run tools one call at a
time: it gives the same records as whole turns (on_turn), under the same budget, invalid-call and unsafe
rules; and an episode built from async code reads its schema off the loop. Real BIRD databases, the
real Grader."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from conftest import bird_root
from loopback_model import xml_tool_call as xml_call
from t2sql.episode import prompt as prompts
from t2sql.episode.parsing import parse_tool_calls, split_think
from t2sql.errors import EpisodeFinished


@pytest.fixture(scope="module")
def ctx(bird_rollout):
    return bird_rollout


@pytest.fixture(scope="module")
def tasks(ctx) -> list:
    rows = json.loads((bird_root() / "dev.json").read_text())
    picked, seen = [], set()
    for row in rows:  # one task with evidence per database, so every database is exercised
        if row["evidence"] and row["db_id"] not in seen:
            seen.add(row["db_id"])
            picked.append(ctx.task(row))
    assert len(picked) >= 3
    return picked


def structured(i: int, arguments) -> dict:
    return {"id": f"call_{i}", "type": "function", "function": {"name": "execute_sql_query", "arguments": arguments}}


def scripts(task) -> dict[str, list[tuple[str, list | None]]]:
    """Named trajectories: each turn is (text, structured tool calls or None)."""
    gold = task.gold_sql
    restate = "Requirement of external knowledge 1 (as stated). " + task.evidence
    check = "Verification of external knowledge 1 (applied). " + task.evidence
    wrong = "SELECT 1"
    return {
        "oracle": [(f"<think>look</think>{restate}\n{xml_call(gold)}", None),
                   (f"<think>ok</think>{check}\n<solution>\n{gold}\n</solution>", None)],
        "wrong_after_errors": [
            ("Let me try.\n" + xml_call("SELECT 1 +") + xml_call("SELECT * FROM no_such_table"), None),
            ("<tool_call>\n<function=execute_sql_query>\n<parameter=sql>x</parameter>\n</function>\n"
             "</tool_call>", None),
            (f"<solution>{wrong}</solution>", None)],
        "structured": [("", [structured(1, {"query": gold}), structured(2, json.dumps({"query": wrong}))]),
                       ("", [structured(3, {"q": gold}), structured(4, "{not json")]),
                       (f"{check}<solution>{gold}</solution>", None)],
        "over_budget": [(xml_call(gold) * 4, None), (xml_call(wrong) * 3, None),
                        (f"<solution>{gold}</solution>", None)],
        "unsafe_tool": [(xml_call("DELETE FROM " + "x"), None)],
        "no_solution": [(xml_call(wrong), None), ("I give up.", None)],
        "empty_solution": [(xml_call(gold), None), ("<solution> </solution>", None)],
        "turn_cut": [(xml_call(gold), None), ("<think>long", "cut:turn")],
        "context_cut": [(f"<solution>{gold}</solution>", "cut:context")],
    }


def comparable(record: dict) -> dict:
    """The record without wall-clock times and whether the gold came from the cache (the second run
    finds it there): the only fields two runs of the same turns may differ in."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "elapsed" not in k and k != "gold_cached"}
        return value
    return strip(record)


async def by_turns(ctx, task, turns) -> dict:
    episode = await ctx.episode_async(task)
    for text, extra in turns:
        if episode.done:
            break
        if isinstance(extra, str):
            await episode.on_turn(text, cut=extra.split(":")[1])
        else:
            await episode.on_turn(text, tool_calls=extra)
    return episode.result.to_dict()


async def by_calls(ctx, task, turns) -> dict:
    """The per-call API as a framework that runs tools itself drives it: the turn's text recorded,
    each call run alone, the last turn handed to finish."""
    episode = await ctx.episode_async(task)
    for n, (text, extra) in enumerate(turns):
        if episode.done:
            break
        if n == len(turns) - 1 and extra is None and not parse_tool_calls(split_think(text)[1]):
            await episode.finish(text)
        elif isinstance(extra, str):
            await episode.finish(text, cut=extra.split(":")[1])
        elif extra is not None:
            episode.record_turn(text, tool_calls=extra)
            for call in extra:
                await episode.call_tool(call["function"]["arguments"], call_id=call["id"])
        else:
            episode.record_turn(text)
            for call in parse_tool_calls(split_think(text)[1]):
                arguments = {"query": call.query} if call.valid else call
                await episode.call_tool(arguments)
                if episode.done:
                    break
    return episode.result.to_dict()


def test_the_per_call_api_gives_the_records_whole_turns_give(ctx, tasks):
    outcomes = set()
    for task in tasks:
        for name, turns in scripts(task).items():
            whole = asyncio.run(by_turns(ctx, task, turns))
            per_call = asyncio.run(by_calls(ctx, task, turns))
            assert comparable(per_call) == comparable(whole), (task.question_id, name)
            outcomes.add(whole["outcome"])
    # The scripts reach every kind of ending, so the comparison covers each path of the machine.
    assert {"correct", "incorrect", "unsafe", "no_solution", "turn_cut", "context_cut"} <= outcomes


def test_call_tool_runs_one_call_under_the_budget_and_the_unsafe_rule(ctx, tasks):
    task = tasks[0]

    async def run():
        episode = await ctx.episode_async(task)
        texts = [await episode.call_tool({"query": "SELECT 1"}) for _ in range(episode.preset.budgets.max_tool_calls)]
        over = await episode.call_tool('{"query": "SELECT 2"}')
        bad = await episode.call_tool({"sql": "SELECT 3"})
        not_run = await episode.call_tool({"query": "DROP TABLE x"})  # past the budget: never run
        other = await ctx.episode_async(task)
        unsafe = await other.call_tool({"query": "DROP TABLE x"})
        return episode, texts, over, bad, not_run, other, unsafe

    episode, texts, over, bad, not_run, other, unsafe = asyncio.run(run())
    assert texts[0].startswith("1") and "tool calls left" in texts[0]
    assert "last tool call" in texts[-1]
    assert over.startswith("Error: the tool budget is spent")
    assert bad.startswith("Error: the tool budget is spent")  # past the budget, malformed or not
    assert not_run.startswith("Error: the tool budget is spent") and not episode.done
    result = asyncio.run(episode.finish("<solution>SELECT 1</solution>"))
    assert result.invalid_tool_calls == 3 and result.tool_calls == episode.preset.budgets.max_tool_calls + 3
    assert other.done and other.result.outcome == "unsafe" and unsafe.startswith("Error: unsafe query")
    with pytest.raises(EpisodeFinished):
        asyncio.run(other.call_tool({"query": "SELECT 1"}))
    with pytest.raises(EpisodeFinished):
        asyncio.run(other.finish("<solution>SELECT 1</solution>"))


def test_a_malformed_call_is_invalid_and_says_the_expected_form(ctx, tasks):
    async def run():
        episode = await ctx.episode_async(tasks[0])
        return episode, await episode.call_tool({"sql": "SELECT 1"}), await episode.call_tool("{oops")

    episode, missing, not_json = asyncio.run(run())
    assert "'query' argument is missing" in missing and prompts.EXPECTED_FORM in missing
    assert "not valid JSON" in not_json
    assert not episode.done and episode._invalid == 2


def test_episode_async_builds_the_prompt_off_the_event_loop(ctx, tasks, monkeypatch):
    threads = []
    real = prompts.build_prompt

    def spy(*args, **kwargs):
        threads.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(prompts, "build_prompt", spy)

    async def run():
        loop_thread = threading.current_thread()
        episode = await ctx.episode_async(tasks[1])
        return loop_thread, episode

    loop_thread, episode = asyncio.run(run())
    assert threads and all(t is not loop_thread for t in threads)
    assert episode.messages == [dict(m) for m in real(tasks[1], ctx.preset)]
