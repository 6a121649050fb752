"""`t2sql eval` end to end: real SQLite, a real HTTP model on 127.0.0.1, real subprocesses.

The scripted model (tests/loopback_model.py) finds its task by the question in the prompt and
answers per turn; each test states the plan it scripts and checks what came back through the
episode, the results file and the summary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, bird_root
from loopback_model import (
    ByteTokenizer,
    Conversation,
    LoopbackModel,
    Reply,
    TaskScript,
    json_tool_call,
    structured_tool_call,
    xml_tool_call,
)
from t2sql.episode.presets import get_preset
from t2sql.errors import EndpointError, EvalError
from t2sql.eval.endpoint import (
    OpenAIChatClient,
    RetryPolicy,
    SglangGenerateClient,
    join_url,
    parse_chat_completion,
    parse_generate,
)
from t2sql.eval.policies import OpenAIPolicy, OraclePolicy, SglangPolicy
from t2sql.eval.results import (
    ENDPOINT_ERROR,
    RESULTS_FORMAT,
    ResultsFile,
    format_summary,
    header_record,
    summarize,
)
from t2sql.eval.runner import evaluate, load_tasks
from t2sql.tasks import sample_dir, sample_questions


@pytest.fixture(scope="module")
def preset():
    return get_preset()


@pytest.fixture(scope="module")
def sample_tasks():
    return load_tasks(sample_questions(), sample_dir()).tasks


def first_cell(task) -> str:
    """A value of the gold result the tool preview must show: the first non-NULL text or integer
    among the first rows (floats are left out: their rendering is the core's business)."""
    with sqlite3.connect(f"file:{task.db_path}?mode=ro", uri=True) as conn:
        cursor = conn.execute(task.gold_sql)
        rows = cursor.fetchmany(10)
    for row in rows:
        if isinstance(row[0], (str, int)):
            return str(row[0])
    return cursor.description[0][0]  # the column name is always shown


def retry(timeout_s: float = 5.0, retries: int = 2) -> RetryPolicy:
    return RetryPolicy(timeout_s=timeout_s, retries=retries, backoff_s=0.01, max_backoff_s=0.05)


def openai_policy(model: LoopbackModel, preset, **kw) -> OpenAIPolicy:
    return OpenAIPolicy(OpenAIChatClient(model.url, "loopback-model", retry=kw.pop("retry", retry()), **kw), preset)


def run(tasks, policy, preset, out, **kw):
    async def go():
        try:
            return await evaluate(tasks, policy, preset, out, log=kw.pop("log", lambda m: None), **kw)
        finally:
            await policy.aclose()

    return asyncio.run(go())


def read_lines(path: Path) -> list[dict]:
    """The result lines of a results file: its header line (t2sql's own, saying whose run) checked and left out."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert lines and lines[0]["format"] == RESULTS_FORMAT, lines[:1]
    return lines[1:]


def evidence_lines(task, kind: str) -> str:
    """The recipe's enumerated evidence lines for `task` ("Requirement" or "Verification")."""
    from t2sql.episode.evidence import evidence_label_lines, evidence_pieces

    return evidence_label_lines(evidence_pieces(task.evidence), kind, "yes.")


def explore_then_answer(tool_form):
    """Turn 1 restates the evidence and runs the gold query; turn 2 verifies it and answers."""

    def plan(task, conv: Conversation) -> Reply:
        if conv.turn == 1:
            return Reply(text=f"<think>look first</think>\n{evidence_lines(task, 'Requirement')}"
                              f"{tool_form(task.gold_sql)}")
        return Reply(text=f"<think>done</think>\n{evidence_lines(task, 'Verification')}"
                          f"<solution>\n{task.gold_sql}\n</solution>")

    return plan


# ---------------------------------------------------------------------------------------------
# OpenAI-compatible endpoint


@pytest.mark.parametrize("form", [xml_tool_call, json_tool_call], ids=["qwen3_coder_xml", "json_in_tool_call"])
def test_openai_tool_call_written_in_text_runs_and_answer_is_graded(tmp_path, preset, sample_tasks, form):
    tasks = sample_tasks[:4]
    script = TaskScript(tasks, explore_then_answer(form))
    out = tmp_path / "results.jsonl"
    with LoopbackModel(script) as model:
        result = run(tasks, openai_policy(model, preset), preset, out, concurrency=2)
        requests = model.chat_requests()
    records = {r["question_id"]: r for r in read_lines(out)}
    assert set(records) == {t.question_id for t in tasks}
    for task in tasks:
        r = records[task.question_id]
        assert (r["outcome"], r["correct"], r["turns"], r["tool_calls"], r["invalid_tool_calls"]) == (
            "correct", True, 2, 1, 0)
        assert r["reward"] == pytest.approx(preset.reward.correct)
        assert r["db_id"] == task.db_id and r["difficulty"] == task.difficulty
        tool_messages = [m for m in r["messages"] if m["role"] == "tool"]
        assert len(tool_messages) == 1 and first_cell(task) in tool_messages[0]["content"]
    # Every request carried the tool spec and the preset's per-turn limit.
    assert len(requests) == 2 * len(tasks)
    assert all(q.body["tools"][0]["function"]["name"] == "execute_sql_query" for q in requests)
    assert all(q.body["max_tokens"] <= preset.budgets.max_turn_tokens for q in requests)
    assert result.summary["accuracy"] == 1.0 and result.summary["episodes"] == 4


def test_openai_structured_tool_calls_round_trip_with_ids(tmp_path, preset, sample_tasks):
    task = sample_tasks[5]

    def plan(task, conv):
        if conv.turn == 1:
            return Reply(text="", reasoning=f"I should check. {task.evidence}",
                         tool_calls=[structured_tool_call(task.gold_sql, "call_abc")])
        return Reply(text=f"Checked: {task.evidence}\n<solution>{task.gold_sql}</solution>")

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript([task], plan)) as model:
        run([task], openai_policy(model, preset), preset, out)
        second = model.chat_requests()[1].body["messages"]
    [r] = read_lines(out)
    assert (r["outcome"], r["tool_calls"], r["invalid_tool_calls"]) == ("correct", 1, 0)
    assistant = [m for m in second if m["role"] == "assistant"][0]
    tool = [m for m in second if m["role"] == "tool"][0]
    # The second request replays the structured call and answers it under the same id.
    assert [c["id"] for c in assistant["tool_calls"]] == ["call_abc"]
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"query": task.gold_sql}
    assert tool["tool_call_id"] == "call_abc"
    assert first_cell(task) in tool["content"]


def test_openai_wrong_answer_is_incorrect_and_rewarded_by_preset(tmp_path, preset, sample_tasks):
    task = sample_tasks[0]

    def plan(task, conv):
        return Reply(text=f"{evidence_lines(task, 'Verification')}<solution>SELECT 12345</solution>")

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript([task], plan)) as model:
        result = run([task], openai_policy(model, preset), preset, out)
    [r] = read_lines(out)
    assert (r["outcome"], r["correct"], r["turns"], r["tool_calls"]) == ("incorrect", False, 1, 0)
    assert r["reward"] == pytest.approx(preset.reward.incorrect)
    assert result.summary["accuracy"] == 0.0 and result.summary["outcomes"]["incorrect"] == 1


def test_openai_finish_length_is_a_turn_cut(tmp_path, preset, sample_tasks):
    task = sample_tasks[1]

    def plan(task, conv):  # thinks past the per-turn limit; the server cuts at max_tokens
        return Reply(text="<think>" + "hmm " * preset.budgets.max_turn_tokens)

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript([task], plan)) as model:
        run([task], openai_policy(model, preset), preset, out)
        [request] = model.chat_requests()
    [r] = read_lines(out)
    assert request.body["max_tokens"] == preset.budgets.max_turn_tokens
    assert (r["outcome"], r["correct"], r["turns"]) == ("turn_cut", False, 1)
    assert r["reward"] == pytest.approx(preset.reward.no_solution)


def test_openai_turn_past_context_budget_is_a_context_cut_never_graded(tmp_path, preset, sample_tasks):
    task = sample_tasks[2]
    # The first request's estimate (4 chars/token) leaves room, but the byte-level server counts
    # one token per byte: its usage shows the turn ran past the budget, even though it answered.

    def plan(task, conv):
        return Reply(text=f"<solution>{task.gold_sql}</solution>")

    with LoopbackModel(TaskScript([task], plan)) as model:
        probe = tmp_path / "probe.jsonl"
        run([task], openai_policy(model, preset), preset, probe)
        [probe_record] = read_lines(probe)
        assert probe_record["outcome"] == "correct"
        prompt_tokens = probe_record["endpoint"]["prompt_tokens"]
        tight = preset.replace(budgets={"max_context_tokens": prompt_tokens + 5})
        out = tmp_path / "r.jsonl"
        run([task], openai_policy(model, tight), tight, out)
    [r] = read_lines(out)
    assert r["outcome"] == "context_cut" and r["correct"] is False
    assert r["reward"] == pytest.approx(tight.reward.no_solution)


# ---------------------------------------------------------------------------------------------
# Endpoint failures: retried, recorded, never losing other results


def test_endpoint_500_is_retried_with_backoff(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:2]
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(xml_tool_call))) as model:
        model.fail_next(2, 500)
        result = run(tasks, openai_policy(model, preset, retry=retry(retries=3)), preset, out, concurrency=1)
        statuses = [q.status for q in model.requests]
    assert statuses[:2] == [500, 500] and statuses[2:] == [200] * 4
    records = read_lines(out)
    assert [r["outcome"] for r in records] == ["correct", "correct"]
    assert records[0]["endpoint"]["retries"] == 2 and "HTTP 500" in records[0]["endpoint"]["errors"][0]
    assert result.endpoint_errors == 0


def test_endpoint_that_keeps_failing_is_recorded_and_retried_by_the_next_run(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:3]
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(xml_tool_call))) as model:
        model.fail_next(2, 503)  # both attempts of the first episode's first turn
        first = run(tasks, openai_policy(model, preset, retry=retry(retries=1)), preset, out, concurrency=1)
        lines = read_lines(out)
        assert [r["outcome"] for r in lines] == [ENDPOINT_ERROR, "correct", "correct"]
        assert "HTTP 503" in lines[0]["error"] and "failed 2 time(s)" in lines[0]["error"]
        assert first.summary["unfinished"] == 1 and first.summary["episodes"] == 2
        assert "rerun the same command" in format_summary(first.summary)

        second = run(tasks, openai_policy(model, preset), preset, out, concurrency=2)
    assert (second.ran, second.skipped_finished) == (1, 2)
    lines = read_lines(out)
    assert [r["outcome"] for r in lines] == [ENDPOINT_ERROR, "correct", "correct", "correct"]
    assert lines[3]["question_id"] == tasks[0].question_id
    assert second.summary["unfinished"] == 0 and second.summary["accuracy"] == 1.0


def test_endpoint_that_hangs_times_out_then_retries(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:2]
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(xml_tool_call))) as model:
        model.hang_next(1, 30.0)  # first request hangs; the retry gets an answer
        started = time.monotonic()
        result = run(tasks, openai_policy(model, preset, retry=retry(timeout_s=0.5, retries=2)), preset, out,
                     concurrency=1)
        healed = time.monotonic() - started
        model.hang_next(2, 30.0)  # now both attempts hang: recorded, not fatal
        out2 = tmp_path / "r2.jsonl"
        started = time.monotonic()
        stuck = run(tasks, openai_policy(model, preset, retry=retry(timeout_s=0.5, retries=1)), preset, out2,
                    concurrency=1)
        gave_up = time.monotonic() - started
    assert result.summary["accuracy"] == 1.0 and read_lines(out)[0]["endpoint"]["retries"] == 1
    assert healed < 10
    lines = read_lines(out2)
    assert [r["outcome"] for r in lines] == [ENDPOINT_ERROR, "correct"]
    assert "no complete answer within 0.5s" in lines[0]["error"]
    assert stuck.endpoint_errors == 1 and gave_up < 10


def test_endpoint_refusing_every_request_stops_the_run(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:10]
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(xml_tool_call))) as model:
        model.fail_next(1000, 404)
        result = run(tasks, openai_policy(model, preset), preset, out, concurrency=1)
        requests = len(model.requests)
    assert result.aborted and "404" in result.aborted and "not retried" in result.aborted
    assert result.ran == 4 and requests == 4  # a 404 is not retried, and the run stopped early
    assert all(r["outcome"] == ENDPOINT_ERROR for r in read_lines(out))


def test_endpoint_client_errors_are_typed(tmp_path):
    with pytest.raises(ValueError, match="http://"):
        join_url("localhost:8000", "/generate")
    assert join_url("http://h:1/v1", "/v1/chat/completions") == "http://h:1/v1/chat/completions"
    assert join_url("http://h:1/", "/generate") == "http://h:1/generate"

    with socket.socket() as probe:  # a port nobody listens on: bound, then closed
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]

    async def call_dead_port():
        client = SglangGenerateClient(f"http://127.0.0.1:{dead_port}", retry=retry(timeout_s=1, retries=1))
        try:
            await client.generate([1, 2], max_new_tokens=4)
        finally:
            await client.aclose()

    with pytest.raises(EndpointError, match="cannot connect") as info:
        asyncio.run(call_dead_port())
    assert info.value.attempts == 2 and info.value.retryable and info.value.unreachable

    # The wrong --api: each reply format names the other one, and a retry would not help.
    with pytest.raises(EndpointError, match="--api sglang") as info:
        parse_chat_completion({"text": "hi", "meta_info": {}})
    assert not info.value.retryable
    with pytest.raises(EndpointError, match="--api openai"):
        parse_generate({"choices": [{"message": {"content": "hi"}}]})
    reply = parse_chat_completion({"choices": [{"message": {"content": "ok", "reasoning_content": "hmm"},
                                                "finish_reason": "length"}]})
    assert reply.text.startswith("<think>hmm</think>") and reply.text.endswith("ok")
    assert reply.finish_reason == "length" and reply.prompt_tokens is None


# ---------------------------------------------------------------------------------------------
# sglang /generate: token ids as in training


def test_sglang_generate_appends_model_ids_and_tool_suffix(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:3]
    tokenizer = ByteTokenizer()
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(xml_tool_call)), tokenizer) as model:
        client = SglangGenerateClient(model.url, retry=retry(), sampling={"temperature": 0.0})
        policy = SglangPolicy(client, tokenizer, preset, chat_template_kwargs={"enable_thinking": True})
        result = run(tasks, policy, preset, out, concurrency=3)
        requests = [q.body for q in model.requests]
    assert result.summary["accuracy"] == 1.0
    records = {r["question_id"]: r for r in read_lines(out)}
    assert all(r["tool_calls"] == 1 and r["turns"] == 2 for r in records.values())
    assert len(requests) == 6
    # Every render got the template kwargs (not only the first).
    assert tokenizer.render_kwargs and all(k == {"enable_thinking": True} for k in tokenizer.render_kwargs)
    by_question = {}
    for body in requests:
        text = tokenizer.decode(body["input_ids"])
        task = max((t for t in tasks if t.question in text), key=lambda t: len(t.question))
        by_question.setdefault(task.question_id, []).append(body)
    for task in tasks:
        first, second = by_question[task.question_id]
        assert first["return_logprob"] is True
        # The text params miles sends in training: the episode reads the same text in eval.
        assert first["sampling_params"] == {"temperature": 0.0, "max_new_tokens": preset.budgets.max_turn_tokens,
                                            "skip_special_tokens": False, "no_stop_trim": True}
        first_text = tokenizer.decode(first["input_ids"])
        assert first_text.endswith("<|im_start|>assistant\n") and "# Tools" in first_text
        # Append-only: turn 2's ids = turn 1's ids + the model's own ids + the template's tool suffix,
        # with the newline the model never writes after <|im_end|>.
        assert second["input_ids"][: len(first["input_ids"])] == first["input_ids"]
        added = tokenizer.decode(second["input_ids"][len(first["input_ids"]):])
        assert added.startswith("<think>look first</think>")
        assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n" in added
        assert first_cell(task) in added and added.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert second["sampling_params"]["max_new_tokens"] == preset.budgets.max_turn_tokens


def test_sglang_caps_max_new_tokens_by_context_budget(tmp_path, preset, sample_tasks):
    task = sample_tasks[3]
    tokenizer = ByteTokenizer()

    def plan(task, conv):  # a long answer: cut by whichever budget is smaller
        return Reply(text="<think>" + "x" * 5000 + f"</think><solution>{task.gold_sql}</solution>")

    with LoopbackModel(TaskScript([task], plan), tokenizer) as model:
        policy = SglangPolicy(SglangGenerateClient(model.url, retry=retry()), tokenizer, preset)
        run([task], policy, preset, tmp_path / "turn.jsonl")
        prompt_len = len(model.requests[0].body["input_ids"])
        tight = preset.replace(budgets={"max_context_tokens": prompt_len + 100})
        policy = SglangPolicy(SglangGenerateClient(model.url, retry=retry()), tokenizer, tight)
        run([task], policy, tight, tmp_path / "ctx.jsonl")
        capped = model.requests[1].body["sampling_params"]["max_new_tokens"]
    [turn_cut] = read_lines(tmp_path / "turn.jsonl")
    [context_cut] = read_lines(tmp_path / "ctx.jsonl")
    assert turn_cut["outcome"] == "turn_cut"
    assert capped == 100  # len(input_ids) + max_new_tokens == the context budget
    assert context_cut["outcome"] == "context_cut" and context_cut["reward"] == pytest.approx(tight.reward.no_solution)


# ---------------------------------------------------------------------------------------------
# Resuming


def test_resume_skips_finished_and_drops_a_truncated_last_line(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:5]
    out = tmp_path / "r.jsonl"
    run(tasks[:3], OraclePolicy(), preset, out, concurrency=2)
    full = read_lines(out)
    # A crash mid-write: half of the 4th episode's line, no newline.
    other = tmp_path / "other.jsonl"
    run(tasks[3:4], OraclePolicy(), preset, other)
    with open(out, "a") as f:
        f.write(other.read_text()[:100])
    messages: list[str] = []
    result = run(tasks, OraclePolicy(), preset, out, concurrency=2, log=messages.append)
    assert any("truncated" in m for m in messages)
    assert (result.ran, result.skipped_finished) == (2, 3)
    lines = read_lines(out)  # every line parses: the truncated one is gone
    assert [r["question_id"] for r in lines[:3]] == [r["question_id"] for r in full]
    assert sorted(r["question_id"] for r in lines) == sorted(t.question_id for t in tasks)
    assert result.summary["episodes"] == 5 and result.summary["accuracy"] == 1.0


def test_resume_refuses_results_of_another_run(tmp_path, preset, sample_tasks):
    out = tmp_path / "r.jsonl"
    run(sample_tasks[:1], OraclePolicy(), preset, out, run_info={"policy": "oracle", "preset": preset.name})
    with pytest.raises(EvalError, match="holds results of another run"):
        run(sample_tasks[:2], OraclePolicy(), preset, out, run_info={"policy": "openai", "preset": preset.name})


def eval_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "t2sql.cli", "eval", *args]


def test_resume_after_killing_a_running_eval(tmp_path, sample_tasks):
    tasks = sample_tasks[:8]
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(xml_tool_call))) as model:
        model.slow(0.25)
        cmd = eval_cmd("--endpoint", model.url, "--model", "m", "--out", str(out), "--limit", "8",
                       "--concurrency", "2", "--json")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out.exists() or len(read_lines(out)) < 2):
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done_before = {r["question_id"] for r in read_lines(out)}
        assert 2 <= len(done_before) < 8, "the kill came too late to test resuming"
        model.slow(0.0)
        finished = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    summary = json.loads(finished.stdout)
    assert summary["resumed_skipped"] == len(done_before) and summary["ran"] == 8 - len(done_before)
    ids = [r["question_id"] for r in read_lines(out)]
    assert sorted(ids) == sorted(t.question_id for t in tasks)  # each exactly once
    assert summary["accuracy"] == 1.0


# ---------------------------------------------------------------------------------------------
# Oracle policy, data, summary, CLI


def test_oracle_over_all_bird_dev_questions(tmp_path, preset):
    bird = bird_root()
    loaded = load_tasks(bird / "dev.json", None)
    assert len(loaded.tasks) == 432 and not loaded.skipped
    out = tmp_path / "oracle.jsonl"
    result = run(loaded.tasks, OraclePolicy(), preset, out, concurrency=4)
    records = read_lines(out)
    assert len(records) == 432
    assert result.summary["accuracy"] == 1.0, [r for r in records if not r["correct"]][:3]
    assert all(r["tool_calls"] == 1 and r["turns"] == 2 for r in records)
    assert all(r["reward"] == pytest.approx(preset.reward.correct) for r in records)
    assert set(result.summary["by_difficulty"]) == {"simple", "moderate", "challenging"}


def test_cli_oracle_on_the_embedded_sample(tmp_path):
    out = tmp_path / "oracle.jsonl"
    proc = subprocess.run(eval_cmd("--policy", "oracle", "--out", str(out), "--json"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["episodes"] == 129 and summary["accuracy"] == 1.0 and summary["ran"] == 129
    assert summary["outcomes"]["correct"] == 129
    # The preset in one line at the start (every field with --verbose, below).
    assert ("\npreset qwen3.6-35b-a3b: 5 tool calls, 7 turns, graded by the task's method, else multiset "
            "(every field: --verbose)\n") in proc.stderr
    assert "max_tool_calls=5" not in proc.stderr
    assert len(read_lines(out)) == 129
    again = subprocess.run(eval_cmd("--policy", "oracle", "--out", str(out)), capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"0 episodes run: all 129 were in {out}; --fresh to run again" in again.stderr
    assert "accuracy (correct only)" in again.stdout and "1.000" in again.stdout


def test_cli_usage_errors_are_clear(tmp_path):
    def eval_err(*args):
        proc = subprocess.run(eval_cmd(*args, "--out", str(tmp_path / "x.jsonl")), capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2
        return proc.stderr

    assert "--endpoint URL is required" in eval_err("--limit", "1")
    assert "qwen3.6-35b-a3b" in eval_err("--policy", "oracle", "--preset", "nope")
    assert "--tokenizer PATH is required" in eval_err("--endpoint", "http://127.0.0.1:9", "--api", "sglang")
    assert "not found" in eval_err("--policy", "oracle", "--data", str(tmp_path / "missing.json"))
    assert not (tmp_path / "x.jsonl").exists()
    proc = subprocess.run(eval_cmd("--policy", "oracle", "--limit", "1", "--out", str(tmp_path)), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "is a directory" in proc.stderr


def test_load_tasks_reports_and_skips_bad_rows(tmp_path, sample_tasks):
    rows = json.loads(sample_questions().read_text())[:3]
    data = tmp_path / "q.jsonl"
    with open(data, "w") as f:
        f.write(json.dumps(rows[0]) + "\n")
        f.write("{not json\n")
        f.write(json.dumps({**rows[1], "db_id": "no_such_db"}) + "\n")
        f.write(json.dumps(rows[2]) + "\n")
    loaded = load_tasks(data, sample_dir())
    assert [t.question_id for t in loaded.tasks] == [str(rows[0]["question_id"]), str(rows[2]["question_id"])]
    assert len(loaded.skipped) == 2
    assert (any("row 2" in s and "not JSON" in s for s in loaded.skipped)
            and any("no_such_db" in s for s in loaded.skipped))
    with pytest.raises(EvalError, match="no usable task"):
        load_tasks(data, tmp_path)  # no database under this root
    assert len(load_tasks(sample_questions(), sample_dir(), limit=7).tasks) == 7


def test_summary_counts_by_outcome_and_difficulty():
    records = [
        {"outcome": "correct", "correct": True, "reward": 1.0, "difficulty": "simple", "turns": 2, "tool_calls": 1,
         "invalid_tool_calls": 0, "evidence_restated": True, "evidence_checked": True},
        {"outcome": "incorrect", "correct": False, "reward": 0.0, "difficulty": "simple", "turns": 3,
         "tool_calls": 2, "invalid_tool_calls": 1, "evidence_restated": False, "evidence_checked": None},
        {"outcome": "turn_cut", "correct": False, "reward": -1.0, "difficulty": "challenging", "turns": 1,
         "tool_calls": 0, "invalid_tool_calls": 0, "evidence_restated": None, "evidence_checked": None},
    ]
    s = summarize(records, pending=["9"], errored=[{"outcome": ENDPOINT_ERROR, "error": "boom"}])
    assert s["accuracy"] == pytest.approx(1 / 3) and s["mean_turns"] == pytest.approx(2.0)
    assert s["outcomes"]["correct"] == 1 and s["outcomes"]["turn_cut"] == 1 and s["outcomes"]["unsafe"] == 0
    assert s["by_difficulty"]["simple"] == {"episodes": 2, "correct": 1, "accuracy": 0.5}
    assert list(s["by_difficulty"]) == ["simple", "challenging"]
    assert s["evidence_restated_rate"] == 0.5 and s["evidence_checked_rate"] == 1.0
    assert s["unfinished"] == 1 and s["endpoint_errors"] == 1 and s["eval_errors"] == 0 and s["last_error"] == "boom"
    text = format_summary(s)
    assert "accuracy (correct only)" in text and "0.333" in text and "boom" in text


def test_results_file_keeps_the_last_line_per_question(tmp_path):
    path = tmp_path / "r.jsonl"
    identity = {"policy": "oracle", "model": None, "preset": "bare", "data_sha256": "0" * 64}
    path.write_text(
        json.dumps(header_record(identity)) + "\n"
        + json.dumps({"question_id": 1, "outcome": ENDPOINT_ERROR}) + "\n"
        + "garbage line\n"
        + json.dumps({"question_id": 1, "outcome": "correct"}) + "\n"
        + json.dumps({"question_id": 2, "outcome": ENDPOINT_ERROR}) + "\n"
    )
    with ResultsFile.open(path, identity) as results:
        assert set(results.finished) == {("1", 0)} and set(results.errored) == {("2", 0)}
        assert any("line 3" in w for w in results.warnings)  # numbered as the file's lines, header included


def test_sample_is_packaged_with_its_notice():
    root = sample_dir()
    assert (root / "superhero" / "superhero.sqlite").is_file()
    assert len(list((root / "superhero" / "database_description").glob("*.csv"))) == 10
    assert len(json.loads((root / "dev.json").read_text())) == 129
    notice = (root / "NOTICE.md").read_text()
    assert "CC BY-SA 4.0" in notice and "BIRD" in notice


def test_a_broken_task_is_recorded_and_the_others_finish(tmp_path, preset, sample_tasks):
    root = tmp_path / "dbs"
    (root / "broken").mkdir(parents=True)
    (root / "broken" / "broken.sqlite").write_bytes(b"this is not a SQLite database" * 100)
    row = {"question_id": "b1", "db_id": "broken", "question": "How many?", "evidence": "", "SQL": "SELECT 1"}
    data = tmp_path / "q.json"
    data.write_text(json.dumps([row]))
    broken = load_tasks(data, root).tasks
    out = tmp_path / "r.jsonl"
    result = run(broken + sample_tasks[:2], OraclePolicy(), preset, out, concurrency=1)
    by_id = {r["question_id"]: r for r in read_lines(out)}
    assert by_id["b1"]["outcome"] in ("gold_error", "eval_error") and by_id["b1"]["correct"] is False
    assert [by_id[t.question_id]["outcome"] for t in sample_tasks[:2]] == ["correct", "correct"]
    assert result.summary["correct"] == 2


def test_progress_lines_without_a_terminal(tmp_path, preset, sample_tasks, capfd, monkeypatch):
    monkeypatch.setenv("T2SQL_PROGRESS_INTERVAL", "0")  # a line per episode (30 s apart by default)
    run(sample_tasks[:3], OraclePolicy(), preset, tmp_path / "r.jsonl", progress=True)
    err = capfd.readouterr().err
    assert "eval: 1/3" in err and "eval: 3/3" in err and "acc 1.000" in err and "\r" not in err
    run(sample_tasks[:3], OraclePolicy(), preset, tmp_path / "r2.jsonl", progress=False)
    assert "eval:" not in capfd.readouterr().err


def test_run_from_the_command_line_parser_in_sglang_mode(tmp_path, sample_tasks, capsys):
    from t2sql.cli import build_parser
    from t2sql.commands import eval as evaluate

    tasks = sample_tasks[:2]
    tokenizer = ByteTokenizer()
    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, explore_then_answer(json_tool_call)), tokenizer) as model:
        argv = ["eval", "--api", "sglang", "--endpoint", model.url, "--limit", "2", "--out", str(out),
                "--preset", "bare", "--chat-template-kwargs", '{"enable_thinking": false}', "--json"]
        args = build_parser(argv).parse_args(argv)
        code = evaluate.run(args, tokenizer=tokenizer)  # a tokenizer object instead of --tokenizer PATH
        prompts = [tokenizer.decode(q.body["input_ids"]) for q in model.requests]
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 2 and summary["accuracy"] == 1.0 and summary["run"]["preset"] == "bare"
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in prompts)


def test_sglang_without_transformers_or_tokenizer_says_what_to_do(tmp_path):
    proc = subprocess.run(eval_cmd("--api", "sglang", "--endpoint", "http://127.0.0.1:9", "--tokenizer",
                                   str(tmp_path / "no-tokenizer"), "--out", str(tmp_path / "x.jsonl")),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "pip install transformers" in proc.stderr or "cannot load a tokenizer" in proc.stderr


# ---------------------------------------------------------------------------------------------
# The reward table end to end: scripted turns over HTTP -> outcome and reward from the preset

TABLES = ("superhero", "publisher", "colour", "race", "gender", "alignment", "attribute")


def _turns_for(case: str, task) -> list[str]:
    said = evidence_lines(task, "Requirement")
    answer = f"{evidence_lines(task, 'Verification')}<solution>{task.gold_sql}</solution>"
    if case == "correct":
        return [said + answer]
    if case == "evidence_missed":
        return [f"<solution>{task.gold_sql}</solution>"]
    if case == "incorrect":
        return [said + "<solution>SELECT 12345</solution>"]
    if case == "pred_error":
        return [said + "<solution>SELECT nope FROM nowhere_at_all</solution>"]
    if case == "no_solution":
        return [said + "I cannot answer this."]
    if case == "unsafe_tool":
        return [said + xml_tool_call("DROP TABLE superhero")]
    if case == "unsafe_solution":
        return [said + "<solution>DELETE FROM superhero</solution>"]
    if case == "malformed_call":
        return [said + '<tool_call>\n{"name": "execute_sql_query", "arguments": {}}\n</tool_call>', answer]
    if case == "sixth_call":
        calls = [f"Step {k}: how many rows does {t} hold?\n" + xml_tool_call(f"SELECT COUNT(*) FROM {t}")
                 for k, t in enumerate(TABLES[:6], start=1)]
        return [said + calls[0], *calls[1:], answer]
    if case == "several_solutions":
        return [said + "<solution>SELECT 1</solution>\nNo, better:\n" + answer]
    raise AssertionError(case)


REWARD_CASES = {
    # case: (outcome, tool_calls, invalid_tool_calls, reward as a function of the preset)
    "correct": ("correct", 0, 0, lambda p: p.reward.correct),
    # A solution in the very first reply needs only one of the two evidence blocks: both missing
    # cost one penalty (the enumerated rule).
    "evidence_missed": ("correct", 0, 0, lambda p: p.reward.correct - p.reward.evidence_penalty),
    "incorrect": ("incorrect", 0, 0, lambda p: p.reward.incorrect),
    "pred_error": ("pred_error", 0, 0, lambda p: p.reward.incorrect),
    "no_solution": ("no_solution", 0, 0, lambda p: p.reward.no_solution),
    "unsafe_tool": ("unsafe", 1, 0, lambda p: p.reward.unsafe),
    "unsafe_solution": ("unsafe", 0, 0, lambda p: p.reward.unsafe),
    "malformed_call": ("correct", 1, 1, lambda p: p.reward.correct - p.reward.invalid_tool_penalty),
    "sixth_call": ("correct", 6, 1, lambda p: p.reward.correct - p.reward.invalid_tool_penalty),
    "several_solutions": ("correct", 0, 0, lambda p: p.reward.correct - p.reward.redraft_penalty),
}


def test_every_row_of_the_reward_table_over_http(tmp_path, preset, sample_tasks):
    task = next(t for t in sample_tasks if len(t.evidence.split()) >= 4)
    cases = list(REWARD_CASES)
    # One task per case: the same question, told apart by a case tag the script reads in the prompt.
    tagged = [dataclasses.replace(task, question_id=f"{task.question_id}-{c}", question=f"[{c}] {task.question}")
              for c in cases]

    def plan(t, conv):
        case = t.question_id.split("-", 1)[1]
        turns = _turns_for(case, t)
        return Reply(text=turns[min(conv.turn, len(turns)) - 1])

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tagged, plan)) as model:
        run(tagged, openai_policy(model, preset), preset, out, concurrency=4)
    records = {r["question_id"].split("-", 1)[1]: r for r in read_lines(out)}
    for case, (outcome, calls, invalid, reward) in REWARD_CASES.items():
        r = records[case]
        assert (case, r["outcome"], r["tool_calls"], r["invalid_tool_calls"]) == (case, outcome, calls, invalid)
        assert r["reward"] == pytest.approx(reward(preset)), case
        assert r["correct"] is (outcome == "correct")
    sixth = [m["content"] for m in records["sixth_call"]["messages"] if m["role"] == "tool"]
    assert len(sixth) == 6 and "budget is spent" in sixth[5] and "budget is spent" not in sixth[4]
    assert records["evidence_missed"]["evidence_rules_met"] == 0 and records["correct"]["evidence_rules_met"] == 2


def test_eval_reads_a_converted_miles_jsonl(tmp_path, preset):
    convert = subprocess.run(
        [sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(sample_questions()), "--db-root",
         str(sample_dir()), "--out-dir", str(tmp_path), "--split-name", "sample", "--json"],
        capture_output=True, text=True, timeout=300)
    assert convert.returncode == 0, convert.stderr
    converted = tmp_path / "sample.jsonl"
    first = json.loads(converted.read_text().splitlines()[0])
    assert "label" in first and "metadata" in first
    loaded = load_tasks(converted, None, limit=6)  # no --db-root: the db_path recorded at conversion
    assert [t.question_id for t in loaded.tasks] == [str(q["question_id"]) for q in
                                                      json.loads(sample_questions().read_text())[:6]]
    assert all(Path(t.db_path).samefile(sample_dir() / "superhero" / "superhero.sqlite") for t in loaded.tasks)
    result = run(loaded.tasks, OraclePolicy(), preset, tmp_path / "r.jsonl")
    assert result.summary["episodes"] == 6 and result.summary["accuracy"] == 1.0


def test_samples_give_avg_and_pass_at_k_and_resume_per_sample(tmp_path, preset, sample_tasks):
    tasks = sample_tasks[:3]
    episodes_seen: dict[str, int] = {}

    def plan(task, conv):  # every third episode of a question answers right, the others wrong
        if conv.turn == 1:
            episodes_seen[task.question_id] = episodes_seen.get(task.question_id, 0) + 1
        right = episodes_seen[task.question_id] % 3 == 1
        sql = task.gold_sql if right else "SELECT 12345"
        return Reply(text=f"Checked against the evidence: {task.evidence}\n<solution>{sql}</solution>")

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, plan)) as model:
        first = run(tasks, openai_policy(model, preset), preset, out, concurrency=1, samples=2)
        assert first.summary["pass_at_k"] == {"k": 2, "questions": 3, "passed": 3, "pass": 1.0}
        assert first.summary["accuracy"] == pytest.approx(0.5)
        more = run(tasks, openai_policy(model, preset), preset, out, concurrency=1, samples=3)
    assert (more.ran, more.skipped_finished) == (3, 6)  # only the third sample of each question ran
    everything = read_lines(out)
    lines = [r for r in everything if r.get("record") != "vote"]
    # Each run voted for every task whose samples were all finished: 3 votes of k=2, then 3 of k=3.
    assert [v["k"] for v in everything if v.get("record") == "vote"] == [2, 2, 2, 3, 3, 3]
    assert sorted((r["question_id"], r["sample"]) for r in lines) == sorted(
        (t.question_id, k) for t in tasks for k in range(3))
    assert more.summary["episodes"] == 9 and more.summary["accuracy"] == pytest.approx(1 / 3)
    assert more.summary["pass_at_k"]["pass"] == 1.0 and "pass@3" in format_summary(more.summary)


def test_readme_command_needs_no_out_and_writes_nothing_in_the_cwd(tmp_path):
    # The README's `t2sql eval --policy oracle` on a fresh machine: every episode runs, the results
    # go under $T2SQL_HOME/eval (else ~/.local/share/t2sql/eval), nothing lands in the cwd.
    import os

    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    env = {**os.environ, "T2SQL_HOME": str(home), "T2SQL_PROGRESS_INTERVAL": "0"}
    proc = subprocess.run(eval_cmd("--policy", "oracle", "--limit", "3", "--json", "--verbose"), capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["ran"] == 3 and summary["resumed_skipped"] == 0
    [written] = list((home / "eval").glob("eval-oracle-*.jsonl"))
    assert len(read_lines(written)) == 3 and summary["out"] == str(written)
    assert list(cwd.iterdir()) == []
    # With no terminal, progress comes as plain lines (here every episode: interval 0).
    assert "eval: 1/3" in proc.stderr and "eval: 3/3" in proc.stderr
    # With --verbose the preset is printed in full, on lines a person can read.
    preset_lines = proc.stderr.split("preset ", 1)[1].split("results:", 1)[0].splitlines()
    assert len(preset_lines) > 3 and max(len(x) for x in preset_lines) <= 100
    assert "max_tool_calls=5" in proc.stderr


def test_no_results_file_is_committed_at_the_repository_root():
    # A committed results file would be resumed by a fresh clone's eval, which would then run nothing.
    tracked = subprocess.run(["git", "ls-files", "*.jsonl"], capture_output=True, text=True, cwd=REPO)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    assert [f for f in tracked.stdout.split() if "/" not in f] == []


# ---------------------------------------------------------------------------------------------
# Majority voting: --samples K -> maj@K


def test_majority_vote_groups_equal_results_written_differently(tmp_path, preset, sample_tasks):
    from t2sql.eval.runner import VOTE_RECORD

    win, tie, wrong_majority = sample_tasks[:3]
    gold = {t.question_id: t.gold_sql for t in (win, tie, wrong_majority)}
    # Per task, what samples 0..3 answer (one reply each; run one at a time, so in sample order).
    answers = {
        # the gold twice, written differently, beats one wrong answer; an error does not vote
        win.question_id: ["SELECT 1", gold[win.question_id], f"SELECT * FROM ({gold[win.question_id]})",
                          "SELECT nope FROM nowhere"],
        # one wrong, one right, two unsafe: a tie of 1 vs 1 goes to the earliest sample (wrong)
        tie.question_id: ["SELECT 5", gold[tie.question_id], "DELETE FROM superhero", "DROP TABLE hero_power"],
        # the same wrong result three ways (two of them stop early: more rows than the gold) beats the gold
        wrong_majority.question_id: ["SELECT id FROM superhero", "SELECT id FROM superhero ORDER BY id DESC",
                                     "SELECT id FROM superhero WHERE id > 0", gold[wrong_majority.question_id]],
    }
    seen: dict[str, int] = {}

    def plan(task, conv):
        k = seen.get(task.question_id, 0)
        seen[task.question_id] = k + 1
        return Reply(text=f"<solution>{answers[task.question_id][k]}</solution>")

    out = tmp_path / "r.jsonl"
    tasks = [win, tie, wrong_majority]
    with LoopbackModel(TaskScript(tasks, plan)) as model:
        result = run(tasks, openai_policy(model, preset), preset, out, concurrency=1, samples=4)
    lines = read_lines(out)
    votes = {v["question_id"]: v for v in lines if v.get("record") == VOTE_RECORD}
    assert votes[win.question_id]["groups"] == [{"samples": [0], "size": 1, "correct": False},
                                                {"samples": [1, 2], "size": 2, "correct": True}]
    assert votes[win.question_id]["winner"] == [1, 2] and votes[win.question_id]["correct"]
    assert votes[tie.question_id]["voters"] == 2 and votes[tie.question_id]["winner"] == [0]
    assert not votes[tie.question_id]["correct"]
    assert votes[wrong_majority.question_id]["winner"] == [0, 1, 2]
    assert not votes[wrong_majority.question_id]["correct"]
    maj = result.summary["maj_at_k"]
    assert maj == {"k": 4, "questions": 3, "correct": 1, "accuracy": pytest.approx(1 / 3)}
    assert result.summary["pass_at_k"]["passed"] == 3  # every task had a correct sample
    assert "maj@4" in format_summary(result.summary)
    # A rerun resumes every episode, renews the votes, and reads the vote lines without a warning.
    logs: list[str] = []
    again = run(tasks, OraclePolicy(), preset, out, concurrency=1, samples=4, log=logs.append,
                run_info={"policy": "openai", "preset": preset.name})
    assert again.ran == 0 and again.summary["maj_at_k"]["correct"] == 1
    assert not any("not a result line" in m for m in logs)


def test_nothing_listening_stops_the_run_early_with_one_line(tmp_path):
    # A port with nothing behind it: a few tasks' worth of tries, then one clear line and exit 2 (not 129 x 4).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "t2sql.cli", "eval", "--endpoint", f"http://127.0.0.1:{port}", "--model", "m",
           "--retry-backoff", "0", "--concurrency", "2", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("t2sql eval: nothing is listening at the endpoint") and "--endpoint" in last
    tried = read_lines(out)
    assert 2 <= len(tried) <= 4 and all(r["outcome"] == ENDPOINT_ERROR and r["unreachable"] for r in tried)
