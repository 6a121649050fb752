"""The endpoint client is bounded: a whole request by time, a reply by size, a reply by its shape.

Real servers on 127.0.0.1 that misbehave the way broken proxies and servers do: one that drips its
body one byte every half second, one that sends a reply of hundreds of megabytes, one whose replies
are JSON of the wrong shape. `t2sql eval` runs against them in a real process, whose own peak memory
is read from /proc.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loopback_model import ByteTokenizer, LoopbackModel, Reply, TaskScript, xml_tool_call
from t2sql.episode.presets import get_preset
from t2sql.eval.endpoint import (
    DEFAULT_MAX_BODY_BYTES,
    OpenAIChatClient,
    RetryPolicy,
    SglangGenerateClient,
    parse_chat_completion,
    parse_generate,
)
from t2sql.eval.policies import OpenAIPolicy, SglangPolicy
from t2sql.eval.runner import evaluate, load_tasks
from t2sql.tasks import sample_dir, sample_questions

HUGE = 500 * 1024 * 1024


class Misbehaving:
    """POST answers: "drip" (headers, then a byte per 0.5 s, forever), "huge_declared" (a
    500 MB Content-Length, streamed), "huge_undeclared" (500 MB, no length, connection closed)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                return

            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                try:
                    if server.mode == "drip":
                        self.send_header("Content-Length", "1000000")
                        self.end_headers()
                        while not server.stop.wait(0.5):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    else:
                        if server.mode == "huge_declared":
                            self.send_header("Content-Length", str(HUGE))
                        else:
                            self.send_header("Connection", "close")
                        self.end_headers()
                        block = b'{"choices": "' + b"x" * (1 << 20)
                        for _ in range(HUGE >> 20):
                            if server.stop.is_set():
                                break
                            self.wfile.write(block)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what it should do

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


# Runs `t2sql eval` in this process and reports its own peak memory (VmHWM) on stderr's last line.
_EVAL = """
import sys
from t2sql.cli import main
try:
    code = main(sys.argv[1:])
finally:
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print("PEAK_MIB", int(hwm.split()[1]) // 1024, file=sys.stderr)
sys.exit(code)
"""


def run_eval(url: str, tmp_path, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float, int]:
    out = tmp_path / "r.jsonl"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _EVAL, "eval", "--endpoint", url, "--model", "m", "--limit", "1",
         "--retries", "0", "--out", str(out), "--json", *extra],
        capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - started
    peak = int(proc.stderr.rsplit("PEAK_MIB", 1)[1].split()[0])
    return proc, elapsed, peak


def test_a_dripping_body_cannot_outlast_the_timeout(tmp_path):
    with Misbehaving("drip") as server:
        proc, elapsed, _ = run_eval(server.url, tmp_path, "--timeout-s", "5")
    assert elapsed < 5 + 10, proc.stderr  # the request's 5 s plus the process's start and imports
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]  # [0]: the header
    assert lines[0]["outcome"] == "endpoint_error"
    assert "no complete answer within 5s" in lines[0]["error"]
    assert proc.returncode == 1  # unfinished episodes: the next run retries them


@pytest.mark.parametrize("mode", ["huge_declared", "huge_undeclared"])
def test_a_huge_reply_is_refused_without_holding_it(tmp_path, mode):
    with Misbehaving(mode) as server:
        proc, _, peak = run_eval(server.url, tmp_path, "--timeout-s", "60")
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]  # [0]: the header
    assert lines[0]["outcome"] == "endpoint_error" and not lines[0]["retryable"]
    assert f"more than {DEFAULT_MAX_BODY_BYTES} bytes" in lines[0]["error"]
    assert peak < 300, f"peak {peak} MiB"  # the 500 MB reply was never held
    assert len((tmp_path / "r.jsonl").read_bytes()) < 100_000


def test_stored_transcripts_are_cut_and_say_so():
    from t2sql.eval.results import MAX_STORED_CHARS, stored_messages

    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a" * (MAX_STORED_CHARS + 5000)}]
    kept, cut = stored_messages(messages)
    assert cut == 5000 and kept[0] == messages[0]
    assert kept[1]["content"].startswith("a" * MAX_STORED_CHARS)
    assert kept[1]["content"].endswith("[t2sql: 5000 more characters not stored]")
    assert len(messages[1]["content"]) == MAX_STORED_CHARS + 5000  # the episode's own copy is untouched


def test_the_size_limit_is_a_flag(tmp_path):
    with Misbehaving("huge_declared") as server:
        run_eval(server.url, tmp_path, "--max-response-mb", "0.5")
    line = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[1])  # [0]: the header
    assert f"more than {512 * 1024} bytes" in line["error"]


# ---------------------------------------------------------------------------------------------
# Replies that are JSON but the wrong shape: an endpoint_error naming the field, never eval_error


def _tasks(limit: int = 2):
    return load_tasks(sample_questions(), sample_dir(), limit=limit).tasks


def _evaluate(tasks, policy, out, **kw):
    async def go():
        try:
            return await evaluate(tasks, policy, get_preset(), out, log=lambda m: None, progress=False, **kw)
        finally:
            await policy.aclose()

    return asyncio.run(go())


def _retry(retries: int = 2):
    return RetryPolicy(timeout_s=10, retries=retries, backoff_s=0.01, max_backoff_s=0.05)


def _openai(url: str, retries: int = 2):
    return OpenAIPolicy(OpenAIChatClient(url, "m", retry=_retry(retries)), get_preset())


def _sglang(url: str):
    return SglangPolicy(SglangGenerateClient(url, retry=_retry()), ByteTokenizer(), get_preset())


def _chat(message=None, **top):
    message = {"role": "assistant", "content": "hi"} if message is None else message
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], **top}


def _call(function):
    return {"id": "call_1", "type": "function", "function": function}


WRONG_CHAT = {
    "message_a_string": (_chat("hi"), "choices[0].message: expected an object, got str"),
    "content_a_number": (_chat({"content": 5}),
                         "choices[0].message.content: expected a string or a list of text parts, got int"),
    "content_an_object": (_chat({"content": {"text": "hi"}}),
                          "choices[0].message.content: expected a string or a list of text parts, got object"),
    "content_parts_not_text": (_chat({"content": [{"type": "text", "text": "a"},
                                                  {"type": "image_url", "image_url": {"url": "x"}}]}),
                               'choices[0].message.content[1].type: expected "text"'),
    "content_part_a_string": (_chat({"content": ["hi"]}), "choices[0].message.content[0]: expected an object"),
    "content_part_text_a_number": (_chat({"content": [{"type": "text", "text": 3}]}),
                                   "choices[0].message.content[0].text: expected a string, got int"),
    "tool_calls_of_strings": (_chat({"content": "hi", "tool_calls": ["x"]}),
                              "choices[0].message.tool_calls[0]: expected an object, got str"),
    "tool_calls_an_object": (_chat({"content": "", "tool_calls": {"id": "x"}}),
                             "choices[0].message.tool_calls: expected a list of tool calls, got object"),
    "function_a_string": (_chat({"content": "", "tool_calls": [_call("execute_sql_query")]}),
                          "choices[0].message.tool_calls[0].function: expected an object, got str"),
    "arguments_a_number": (_chat({"content": "", "tool_calls": [_call({"name": "execute_sql_query",
                                                                       "arguments": 5})]}),
                           "choices[0].message.tool_calls[0].function.arguments: expected a JSON string or an "
                           "object, got int"),
    "function_without_name": (_chat({"content": "", "tool_calls": [_call({"arguments": "{}"})]}),
                              "choices[0].message.tool_calls[0].function.name: expected a string, got nothing"),
    "usage_a_string": (_chat(usage="lots"), "usage: expected an object, got str"),
    "usage_tokens_a_string": (_chat(usage={"prompt_tokens": "12", "completion_tokens": 3}),
                              "usage.prompt_tokens: expected an integer or null, got str"),
    "reasoning_a_list": (_chat({"content": "hi", "reasoning_content": ["x"]}),
                         "choices[0].message.reasoning_content: expected a string or null, got list"),
    "finish_reason_a_number": ({"choices": [{"message": {"content": "hi"}, "finish_reason": 1}]},
                               "choices[0].finish_reason: expected a string or null, got int"),
    "choices_missing": ({"text": "hi", "meta_info": {}},
                        "choices: expected a non-empty list, got nothing (the field is missing)"),
    "choices_empty": ({"choices": []}, "choices: expected a non-empty list, got list []"),
    "choices_not_a_list": ({"choices": {"0": {}}}, "choices: expected a non-empty list, got object"),
    "choice_a_string": ({"choices": ["hi"]}, "choices[0]: expected an object, got str"),
}

WRONG_GENERATE = {
    "text_a_number": ({"text": 5, "meta_info": {}}, "text: expected a string, got int"),
    "text_missing": ({"choices": [{"message": {"content": "hi"}}]}, "text: expected a string, got nothing"),
    "meta_info_a_string": ({"text": "hi", "meta_info": "x"}, "meta_info: expected an object, got str"),
    "meta_info_missing": ({"text": "hi"}, "meta_info: expected an object, got nothing"),
    "finish_reason_a_number": ({"text": "hi", "meta_info": {"finish_reason": 5}},
                               "meta_info.finish_reason: expected an object"),
    "finish_type_a_number": ({"text": "hi", "meta_info": {"finish_reason": {"type": 7}}},
                             "meta_info.finish_reason.type: expected a string or null, got int"),
    "logprobs_a_string": ({"text": "hi", "meta_info": {"output_token_logprobs": "x"}},
                          "meta_info.output_token_logprobs: expected a list"),
    "logprob_entry_a_number": ({"text": "hi", "meta_info": {"output_token_logprobs": [5]}},
                               "meta_info.output_token_logprobs[0]: expected a list [logprob, token_id, text]"),
    "logprob_entry_too_short": ({"text": "hi", "meta_info": {"output_token_logprobs": [[-0.1, 104], [-0.2]]}},
                                "meta_info.output_token_logprobs[1]: expected a list"),
    "logprob_a_string": ({"text": "hi", "meta_info": {"output_token_logprobs": [["low", 104, "h"]]}},
                         "meta_info.output_token_logprobs[0][0]: expected a number"),
    "token_id_a_string": ({"text": "hi", "meta_info": {"output_token_logprobs": [[-0.1, "h", None]]}},
                          "meta_info.output_token_logprobs[0][1]: expected a token id (an integer >= 0), got str"),
    "tokens_a_string": ({"text": "hi", "meta_info": {"completion_tokens": "lots"}},
                        "meta_info.completion_tokens: expected an integer or null, got str"),
}


@pytest.mark.parametrize(("api", "case"), [("openai", c) for c in WRONG_CHAT] + [("sglang", c) for c in WRONG_GENERATE])
def test_a_wrong_shaped_reply_is_an_endpoint_error_naming_the_field(tmp_path, api, case):
    body, detail = (WRONG_CHAT if api == "openai" else WRONG_GENERATE)[case]
    tasks = _tasks()
    out = tmp_path / "r.jsonl"
    with LoopbackModel(lambda conversation: Reply(text="unused")) as model:
        model.answer_raw(body)
        result = _evaluate(tasks, _openai(model.url) if api == "openai" else _sglang(model.url), out,
                           concurrency=1)
        requests = len(model.requests)
    lines = [json.loads(x) for x in out.read_text().splitlines()[1:]]  # [0]: the header
    assert [r["outcome"] for r in lines] == ["endpoint_error"] * len(tasks)
    for r in lines:
        assert f"sent a reply of the wrong shape: {detail}" in r["error"], r["error"]
        assert "please report it" not in r["error"]
        assert r["retryable"] is False  # deterministic for a server, as a reply without the fields: not retried
    assert requests == len(tasks)  # one request each: no retries in this run (a rerun tries them again)
    assert result.summary["eval_errors"] == 0 and result.summary["endpoint_errors"] == len(tasks)
    if case in ("choices_missing", "text_missing"):  # the other API's reply: the message names the right --api
        assert ("--api sglang" if api == "openai" else "--api openai") in lines[0]["error"]


def test_legal_reply_shapes_are_read():
    turn = parse_chat_completion({"choices": [{"message": {"content": [{"type": "text", "text": "a"},
                                                                       {"type": "text", "text": "b"}]}}]})
    assert (turn.text, turn.finish_reason, turn.tool_calls, turn.prompt_tokens) == ("ab", "stop", None, None)
    call = _call({"name": "execute_sql_query", "arguments": {"query": "SELECT 1"}})  # arguments as an object
    turn = parse_chat_completion({"choices": [{"message": {"content": None, "tool_calls": [call]},
                                               "finish_reason": None}], "usage": None})
    assert (turn.text, turn.tool_calls, turn.finish_reason) == ("", [call], "stop")
    turn = parse_chat_completion(_chat({"content": "", "tool_calls": []}, usage={"prompt_tokens": 7}))
    assert (turn.tool_calls, turn.prompt_tokens, turn.completion_tokens) == (None, 7, None)
    turn = parse_generate({"text": "hi", "meta_info": {"finish_reason": "length"}})
    assert (turn.text, turn.finish_reason, turn.output_ids) == ("hi", "length", None)
    turn = parse_generate({"text": "hi", "meta_info": {"output_token_logprobs": [[-0.5, 104, "h"], [0, 105]]}})
    assert (turn.output_ids, turn.output_logprobs) == ([104, 105], [-0.5, 0.0])


def test_content_as_text_parts_is_read_through_whole_episodes(tmp_path):
    tasks = _tasks()
    texts: dict[str, list[str]] = {t.question_id: [] for t in tasks}

    def plan(task, conversation):
        if conversation.turn == 1:
            text = f"Let me look.\n{xml_tool_call(task.gold_sql)}"
        else:
            text = f"The result answers it.\n<solution>\n{task.gold_sql}\n</solution>"
        texts[task.question_id].append(text)
        return Reply(text=text)

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, plan), content_parts=True) as model:
        result = _evaluate(tasks, _openai(model.url), out, concurrency=1)
        sent = [r.body for r in model.requests]
    records = [json.loads(x) for x in out.read_text().splitlines()[1:]]  # [0]: the header
    assert [(r["outcome"], r["turns"], r["tool_calls"], r["invalid_tool_calls"]) for r in records] == [
        ("correct", 2, 1, 0)] * len(tasks)
    for r in records:  # the parts were joined in order: the episode holds the turns the model wrote
        assert [m["content"] for m in r["messages"] if m["role"] == "assistant"] == texts[r["question_id"]]
    # The second request of each episode replays turn 1 as one string.
    assert all(isinstance(m["content"], str) for body in sent for m in body["messages"])
    assert result.summary["accuracy"] == 1.0

