"""The miles adapter over a real loopback HTTP server that answers like sglang's /generate.

No miles, no downloads: the tokenizer is built here (word-level, Qwen-like chat template in jinja2),
the policy is scripted, the databases are BIRD's superhero sample. Every episode outcome is driven
through `generate` and the Sample invariants of miles.md are checked on each.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Callable

import jinja2
import pytest

from conftest import bird_root
from miles_standins import GenerateFnInput, Sample
from t2sql.data import convert as data
from t2sql.episode.presets import get_preset
from t2sql.miles import adapter as sql_episode
from t2sql.miles import metrics

BIRD = bird_root()

LAYERS, TOPK = 3, 2
IM_START, IM_END = "<|im_start|>", "<|im_end|>"

# A Qwen-shaped chat template: tools in the system turn, tool results as a user turn of
# <tool_response> blocks, "<|im_end|>\n" after every turn, enable_thinking=False pre-closes <think>.
TEMPLATE = (
    "{%- set nl = '\\n' -%}"
    "{%- if tools -%}"
    "<|im_start|>system{{ nl }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}{{ nl }}{{ nl }}{% endif %}"
    "# Tools{{ nl }}<tools>{% for t in tools %}{{ nl }}{{ t | tojson }}{% endfor %}{{ nl }}</tools><|im_end|>{{ nl }}"
    "{%- elif messages[0].role == 'system' -%}<|im_start|>system{{ nl }}{{ messages[0].content }}<|im_end|>{{ nl }}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif -%}"
    "{{ nl }}<tool_response>{{ nl }}{{ m.content }}{{ nl }}</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>{{ nl }}{% endif -%}"
    "{%- elif m.role != 'system' -%}<|im_start|>{{ m.role }}{{ nl }}{{ m.content }}<|im_end|>{{ nl }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant{{ nl }}"
    "{%- if enable_thinking is defined and not enable_thinking %}"
    "<think>{{ nl }}{{ nl }}</think>{{ nl }}{{ nl }}{% endif -%}"
    "{%- endif -%}"
)


class WordTokenizer:
    """Special tokens, then words, runs of spaces, newlines and single punctuation, ids on first sight.

    Shared by the adapter and the server (one process), like an HF tokenizer both sides load."""

    eos_token = IM_END
    _piece = re.compile(r"<\|im_start\|>|<\|im_end\|>|\w+|\n|[^\S\n]+|[^\w\s]")

    def __init__(self, template: str = TEMPLATE) -> None:
        self.vocab: dict[str, int] = {IM_START: 0, IM_END: 1}
        self.pieces: list[str] = [IM_START, IM_END]
        self.lock = threading.Lock()
        self.template = jinja2.Environment(loader=jinja2.BaseLoader()).from_string(template)
        self.renders: list[dict] = []  # every apply_chat_template call's kwargs

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        pieces = self._piece.findall(text)
        assert "".join(pieces) == text, "the tokenizer must cover every character"
        with self.lock:
            ids = []
            for p in pieces:
                if p not in self.vocab:
                    self.vocab[p] = len(self.pieces)
                    self.pieces.append(p)
                ids.append(self.vocab[p])
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids if not (skip_special_tokens and i in (0, 1)))

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=True, **kwargs):
        self.renders.append(dict(kwargs))
        text = self.template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    **kwargs)
        return text if not tokenize else self.encode(text)


def expert_ids(position: int, layer: int, k: int) -> int:
    return (position * 7 + layer * 3 + k) % 256


class FakeSglang:
    """A loopback HTTP server answering POST /generate like sglang, from a scripted policy.

    policy(turn_index, prompt_text) -> (reply text, finish) where finish is "stop" (the reply ends with
    <|im_end|>), "abort", or "no_eos" (stops without the end token, like a stop string).
    """

    def __init__(self, tokenizer: WordTokenizer, policy: Callable[[int, str], Any]):
        self.tokenizer = tokenizer
        self.policy = policy
        self.requests: list[dict] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/generate":
                    self.send_error(404)
                    return
                out = json.dumps(server.answer(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, body: dict) -> dict:
        self.requests.append(body)
        input_ids = body["input_ids"]
        prompt_text = self.tokenizer.decode(input_ids)
        turn = prompt_text.count(f"{IM_START}assistant") - 1
        reply, finish = self.policy(turn, prompt_text)
        ids = self.tokenizer.encode(reply)
        if finish == "stop":
            ids.append(1)  # <|im_end|>: generated, kept in the ids, stripped from text
        limit = body["sampling_params"]["max_new_tokens"]
        if len(ids) > limit:
            ids, finish = ids[:limit], "length"
        elif finish == "no_eos":
            finish = "stop"
        meta = {
            "finish_reason": {"type": finish},
            "output_token_logprobs": [[-0.01 * (1 + i % 5), t, self.tokenizer.pieces[t]] for i, t in enumerate(ids)],
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": "7",
        }
        if body.get("return_routed_experts"):
            n = len(input_ids) + len(ids) - 1
            flat = [expert_ids(p, layer, k) for p in range(n) for layer in range(LAYERS) for k in range(TOPK)]
            meta["routed_experts"] = base64.b64encode(struct.pack(f"<{len(flat)}i", *flat)).decode()
        return {"text": self.tokenizer.decode(ids, skip_special_tokens=True), "meta_info": meta}

    def __enter__(self) -> FakeSglang:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- fixtures


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    questions = [r for r in json.loads((BIRD / "dev.json").read_text()) if r["db_id"] == "superhero"][:8]
    path = tmp_path_factory.mktemp("rows") / "q.json"
    path.write_text(json.dumps(questions))
    _, built = data.convert_split(path, BIRD, None, split="validation", check_gold_sql=False)
    return built


@pytest.fixture(autouse=True)
def _fresh_grader():
    yield
    sql_episode.close_contexts()


def make_args(port: int, **over) -> argparse_ns:
    values = dict(
        sglang_router_ip="127.0.0.1", sglang_router_port=port, rollout_max_context_len=None,
        use_rollout_routing_replay=True, num_layers=LAYERS, moe_router_topk=TOPK, reward_key="reward",
        apply_chat_template_kwargs={"enable_thinking": False}, text_to_sql_preset="qwen3.6-35b-a3b",
        text_to_sql_db_root=None, text_to_sql_cache_dir=None, text_to_sql_manifest=None,
        text_to_sql_grader_concurrency=2, text_to_sql_tool_timeout=None, text_to_sql_grade_timeout=None,
    )
    values.update(over)
    return SimpleNamespace(**values)


argparse_ns = SimpleNamespace


def tool_call(sql: str) -> str:
    return ("<tool_call>\n<function=execute_sql_query>\n<parameter=query>\n" + sql
            + "\n</parameter>\n</function>\n</tool_call>")


def run_episode(row: dict, replies: list, *, max_new_tokens: int = 3072, template: str = TEMPLATE,
                **arg_over) -> tuple[Sample, FakeSglang, Any]:
    """Drive generate() over the fake server; replies[i] answers turn i (a str, or (str, finish))."""
    tok = WordTokenizer(template)

    def policy(turn: int, prompt_text: str):
        reply = replies[min(turn, len(replies) - 1)]
        return reply if isinstance(reply, tuple) else (reply, "stop")

    with FakeSglang(tok, policy) as server:
        args = make_args(server.port, **arg_over)
        sample = Sample(index=3, group_index=1, prompt=row["prompt"], label=row["label"],
                        metadata=dict(row["metadata"], tools=row["tools"]))
        inp = GenerateFnInput(SimpleNamespace(args=args, tokenizer=tok), sample,
                              {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": max_new_tokens})
        out = asyncio.run(sql_episode.generate(inp))
    assert isinstance(out.samples, Sample) and out.samples is not sample  # the input is not mutated
    assert sample.response == "" and sample.tokens == []
    return out.samples, server, tok


def check_invariants(s: Sample, tok: WordTokenizer, server: FakeSglang, *, routing: bool = True,
                     thinking: bool = False) -> None:
    """miles.md: the trainer's assertions, plus what t2sql promises about the token stream."""
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    assert len(s.tokens) >= s.response_length
    assert isinstance(s.rollout_log_probs, list)
    prompt_ids = server.requests[0]["input_ids"]
    assert s.tokens[: len(prompt_ids)] == prompt_ids
    assert len(s.tokens) == len(prompt_ids) + s.response_length
    if s.response_length:
        assert s.loss_mask[-1] == 1, "a sample must never end on tool tokens"
    # Tool tokens: loss 0 and log-prob exactly 0.0; model tokens: the server's log-probs.
    for m, lp in zip(s.loss_mask, s.rollout_log_probs):
        assert m in (0, 1) and (m == 1 or lp == 0.0)
    # Every request continued exactly the tokens the sample holds.
    for req in server.requests[1:]:
        assert s.tokens[: len(req["input_ids"])] == req["input_ids"]
    if routing and s.response_length:
        arr = s.rollout_routed_experts
        assert tuple(arr.shape) == (len(s.tokens) - 1, LAYERS, TOPK)
        flat = arr.reshape(-1).tolist() if hasattr(arr, "reshape") else list(arr.values)
        n = len(s.tokens) - 1
        assert flat == [expert_ids(p, la, k) for p in range(n) for la in range(LAYERS) for k in range(TOPK)]
    # Every render used the run's chat-template kwargs.
    assert tok.renders and all(r.get("enable_thinking") is thinking for r in tok.renders)
    closed_think = "" if thinking else "<think>\n\n</think>\n\n"  # what the template adds when off
    for req in server.requests:
        assert tok.decode(req["input_ids"]).endswith(f"{IM_START}assistant\n{closed_think}")


def reward_of(s: Sample, args=None) -> dict:
    return asyncio.run(sql_episode.reward_func(args, s))


# ---- the outcomes


def test_correct_after_tool_calls_token_stream(rows):
    row = rows[0]
    gold = row["label"]["gold_sql"]
    replies = [
        "I look first.\n" + tool_call("SELECT COUNT(*) FROM superhero"),
        "Now the columns.\n" + tool_call("SELECT * FROM colour LIMIT 2"),
        f"Done.\n<solution>{gold}</solution>",
    ]
    # Thinking on: this template then renders earlier assistant turns exactly as generated.
    s, server, tok = run_episode(row, replies, apply_chat_template_kwargs={"enable_thinking": True})
    check_invariants(s, tok, server, thinking=True)
    rec = s.metadata["t2sql"]
    assert rec["outcome"] == "correct" and rec["tool_calls"] == 2 and rec["turns"] == 3
    assert s.status is Sample.Status.COMPLETED
    assert len(server.requests) == 3
    # The newline after <|im_end|>: loss 0, at the start of each tool segment; the whole stream reads
    # like the template's own rendering of the conversation (which ends "<|im_end|>\n").
    start = len(s.tokens) - s.response_length
    model_ends = [i for i in range(start, len(s.tokens)) if s.tokens[i] == 1 and s.loss_mask[i - start] == 1]
    assert len(model_ends) == 3 and model_ends[-1] == len(s.tokens) - 1  # three turns, each closed by the model
    for i in model_ends[:-1]:
        assert tok.pieces[s.tokens[i + 1]] == "\n" and s.loss_mask[i + 1 - start] == 0
    messages = list(row["prompt"])
    texts = [r for r in replies]
    tool_msgs = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", tok.decode(s.tokens), re.S)
    assert len(tool_msgs) == 2 and "Error" not in tool_msgs[0]
    for text, result in zip(texts[:2], tool_msgs):
        messages += [{"role": "assistant", "content": text}, {"role": "tool", "name": "execute_sql_query",
                                                               "content": result}]
    messages.append({"role": "assistant", "content": texts[2]})
    expected = tok.apply_chat_template(messages, tools=row["tools"], tokenize=False, enable_thinking=True)
    assert tok.decode(s.tokens) + "\n" == expected
    # Segments: model, tool, model, tool, model.
    runs = [m for i, m in enumerate(s.loss_mask) if i == 0 or s.loss_mask[i - 1] != m]
    assert runs == [1, 0, 1, 0, 1]
    r = reward_of(s)
    assert r == {"reward": rec["reward"], "category": "correct", "correct": 1.0, "turns": 3, "tool_calls": 2,
                 "invalid_tool_calls": 0}
    assert isinstance(r["reward"], float) and r["reward"] > 0


def test_incorrect_pred_error_no_solution(rows):
    row = rows[1]
    for reply, outcome, reward in [
        ("<solution>SELECT 1</solution>", "incorrect", None),
        ("<solution>SELECT nope FROM nowhere</solution>", "pred_error", None),
        ("I do not know.", "no_solution", -1.0),
    ]:
        s, server, tok = run_episode(row, [reply])
        check_invariants(s, tok, server)
        assert s.metadata["t2sql"]["outcome"] == outcome and s.status is Sample.Status.COMPLETED
        r = reward_of(s)
        assert r["category"] == outcome and r["correct"] == 0.0
        assert r["reward"] <= 0.0 and (reward is None or r["reward"] == reward)


def test_unsafe_tool_call_ends_at_once(rows):
    s, server, tok = run_episode(rows[2], [tool_call("DELETE FROM superhero"), "<solution>SELECT 1</solution>"])
    check_invariants(s, tok, server)
    assert len(server.requests) == 1 and s.metadata["t2sql"]["outcome"] == "unsafe"
    assert s.status is Sample.Status.COMPLETED and reward_of(s)["reward"] == -1.0
    assert set(s.loss_mask) == {1}  # no tool tokens were appended after the unsafe call


def test_turn_cut_is_truncated_with_reward(rows):
    long = "<think>" + " ".join(["ponder"] * 400) + "</think><solution>SELECT 1</solution>"
    s, server, tok = run_episode(rows[3], [long], max_new_tokens=50)
    check_invariants(s, tok, server)
    assert s.response_length == 50 and server.requests[0]["sampling_params"]["max_new_tokens"] == 50
    assert s.metadata["t2sql"]["outcome"] == "turn_cut" and s.status is Sample.Status.TRUNCATED
    assert reward_of(s)["reward"] == -1.0


def test_context_cut_trims_the_last_tool_segment(rows):
    row = rows[4]
    # Find how long the prompt is, then leave room for one turn + its tool result, not for another turn.
    tok = WordTokenizer()
    prompt_len = len(tok.encode(tok.apply_chat_template(row["prompt"], tools=row["tools"], add_generation_prompt=True,
                                                        tokenize=False, enable_thinking=False)))
    first = "Look.\n" + tool_call("SELECT * FROM superhero LIMIT 20")
    budget = prompt_len + 60
    s, server, tok = run_episode(row, [first, "<solution>SELECT 1</solution>"], rollout_max_context_len=budget)
    check_invariants(s, tok, server)
    assert s.metadata["t2sql"]["outcome"] == "context_cut" and s.status is Sample.Status.TRUNCATED
    assert len(server.requests) == 1  # no room for a second turn: the tool segment was trimmed
    assert set(s.loss_mask) == {1} and len(s.tokens) <= budget
    assert "<tool_response>" not in s.response
    assert reward_of(s)["reward"] == -1.0


def test_context_budget_caps_the_request(rows):
    row = rows[4]
    tok = WordTokenizer()
    prompt_len = len(tok.encode(tok.apply_chat_template(row["prompt"], tools=row["tools"], add_generation_prompt=True,
                                                        tokenize=False, enable_thinking=False)))
    long = " ".join(["word"] * 200)
    s, server, tok = run_episode(row, [long], rollout_max_context_len=prompt_len + 30)
    check_invariants(s, tok, server)
    assert server.requests[0]["sampling_params"]["max_new_tokens"] == 30
    assert s.metadata["t2sql"]["outcome"] == "context_cut" and s.status is Sample.Status.TRUNCATED


def test_budget_spent_invalid_calls_then_answer(rows):
    row = rows[5]
    calls = [tool_call(f"SELECT {i}") for i in range(6)] + [f"<solution>{row['label']['gold_sql']}</solution>"]
    s, server, tok = run_episode(row, calls)
    check_invariants(s, tok, server)
    rec = s.metadata["t2sql"]
    assert rec["outcome"] == "correct" and rec["tool_calls"] == 6 and rec["invalid_tool_calls"] == 1
    assert "budget is spent" in s.response
    r = reward_of(s)
    assert r["invalid_tool_calls"] == 1 and r["reward"] < 1.0  # the recipe's invalid-call penalty


def test_gold_error_and_aborted(rows):
    row = dict(rows[6], label=dict(rows[6]["label"], gold_sql="SELECT broken FROM nowhere"))
    s, server, tok = run_episode(row, ["<solution>SELECT 1</solution>"])
    check_invariants(s, tok, server)
    assert s.metadata["t2sql"]["outcome"] == "gold_error" and s.status is Sample.Status.COMPLETED
    r = reward_of(s)
    assert r["category"] == "gold_error" and r["correct"] == 0.0 and r["reward"] < 1.0

    s, server, tok = run_episode(rows[6], [tool_call("SELECT 1"), ("partial", "abort")])
    assert s.status is Sample.Status.ABORTED and "t2sql" not in s.metadata
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    # Routing replay: the aborted response's experts are assigned too (miles' Sample.validate()).
    assert tuple(s.rollout_routed_experts.shape) == (len(s.tokens) - 1, LAYERS, TOPK)


def test_missing_end_token_is_closed_by_the_tool_segment(rows):
    row = rows[7]
    s, server, tok = run_episode(row, [(tool_call("SELECT COUNT(*) FROM superhero"), "no_eos"),
                                       "<solution>SELECT 1</solution>"])
    check_invariants(s, tok, server)
    start = len(s.tokens) - s.response_length
    ends = [i - start for i in range(start, len(s.tokens)) if s.tokens[i] == 1]
    # The first <|im_end|> was not generated: it is part of the tool segment (loss 0);
    # the last one was generated by the model (loss 1).
    assert s.loss_mask[ends[0]] == 0 and s.loss_mask[ends[-1]] == 1


def test_routing_replay_off_and_string_prompt(rows):
    row = rows[0]
    tok_prompt = "a pre-rendered prompt (--apply-chat-template)"
    row2 = dict(row, prompt=tok_prompt)
    s, server, tok = run_episode(row2, ["<solution>SELECT 1</solution>"], use_rollout_routing_replay=False)
    check_invariants(s, tok, server, routing=False)
    assert s.rollout_routed_experts is None and "return_routed_experts" in server.requests[0]
    assert server.requests[0]["return_routed_experts"] is False
    # The messages were rebuilt from the row, so the model saw the real question, not the string.
    assert row["metadata"]["question"] in tok.decode(server.requests[0]["input_ids"])


def test_reward_func_on_replayed_samples(rows):
    row = rows[0]
    gold = row["label"]["gold_sql"]
    s, server, tok = run_episode(row, [tool_call("SELECT 1"), f"<solution>{gold}</solution>"])
    live = reward_of(s, make_args(server.port))
    # Replay: the sample goes through JSON (as miles' dumps do) and comes back; args=None.
    as_json = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(s).items()
                                     if k not in ("rollout_routed_experts", "status")}))
    replayed = Sample(**as_json)
    assert reward_of(replayed) == live and live["correct"] == 1.0
    # A sample without the adapter's record is regraded from its response (outcome table only).
    bare = Sample(**dict(as_json, metadata={k: v for k, v in as_json["metadata"].items() if k != "t2sql"}))
    regraded = reward_of(bare)
    assert regraded["category"] == "correct" and regraded["reward"] == get_preset().reward.correct
    wrong = Sample(**dict(dataclasses.asdict(bare), response="<think>x</think><solution>SELECT 1</solution>"))
    assert reward_of(wrong)["category"] == "incorrect"
    none = Sample(**dict(dataclasses.asdict(bare), response="no answer"))
    assert reward_of(none) == {"reward": -1.0, "category": "no_solution", "correct": 0.0, "regraded": 1.0}
    custom_key = reward_of(s, SimpleNamespace(reward_key="score"))
    assert custom_key["score"] == live["reward"] and "reward" not in custom_key


def test_import_without_miles_and_flags():
    import argparse
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", "import sys, t2sql.miles.adapter as m; "
         "assert 'miles' not in sys.modules and 'torch' not in sys.modules; "
         "assert m.generate.add_arguments is m.add_arguments; print('ok')"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    parser = argparse.ArgumentParser()
    sql_episode.generate.add_arguments(parser)
    args = parser.parse_args(["--text-to-sql-db-root", "/dbs", "--text-to-sql-grader-concurrency", "4"])
    assert args.text_to_sql_preset == "qwen3.6-35b-a3b" and args.text_to_sql_db_root == "/dbs"
    assert args.text_to_sql_grader_concurrency == 4 and args.text_to_sql_cache_dir is None
    import inspect

    assert list(inspect.signature(sql_episode.generate).parameters) == ["input"]  # miles' new form


# Like Qwen3's template: the LAST assistant turn without reasoning gets an empty <think></think>, so
# rendering with and without the tool messages is not append-only for the real conversation.
LAST_TURN_TEMPLATE = TEMPLATE.replace(
    "{%- elif m.role != 'system' -%}",
    "{%- elif m.role == 'assistant' and loop.last and not m.reasoning_content -%}"
    "<|im_start|>assistant{{ nl }}<think>{{ nl }}{{ nl }}</think>{{ nl }}{{ nl }}{{ m.content }}<|im_end|>{{ nl }}"
    "{%- elif m.role != 'system' -%}",
)


def test_template_not_append_only_for_the_last_turn(rows):
    row = rows[1]
    assert LAST_TURN_TEMPLATE != TEMPLATE
    replies = [tool_call("SELECT COUNT(*) FROM superhero"), f"<solution>{row['label']['gold_sql']}</solution>"]
    s, server, tok = run_episode(row, replies, template=LAST_TURN_TEMPLATE)
    check_invariants(s, tok, server)
    assert s.metadata["t2sql"]["outcome"] == "correct"
    text = tok.decode(s.tokens)
    first_end = text.index(IM_END, text.index("</tool_call>"))
    assert text[first_end:].startswith(f"{IM_END}\n{IM_START}user\n<tool_response>\n")
    assert "stand-in" not in text  # only the suffix of the stand-in conversation is used


def test_pred_timeout_and_unsafe_solution(rows):
    runaway = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    s, server, tok = run_episode(rows[2], [f"<solution>{runaway}</solution>"], text_to_sql_grade_timeout=0.2)
    check_invariants(s, tok, server)
    rec = s.metadata["t2sql"]
    assert rec["outcome"] == "pred_timeout" and s.status is Sample.Status.COMPLETED
    r = reward_of(s)
    assert r["category"] == "pred_timeout" and r["correct"] == 0.0 and -1.0 <= r["reward"] <= 0.0

    s, server, tok = run_episode(rows[2], ["<solution>DROP TABLE superhero</solution>"])
    check_invariants(s, tok, server)
    assert s.metadata["t2sql"]["outcome"] == "unsafe" and reward_of(s)["reward"] == -1.0


def test_concurrent_trajectories_on_one_loop(rows):
    """miles runs every trajectory of a group on one event loop with one Grader: they must not mix."""
    tok = WordTokenizer()
    by_question = {r["metadata"]["question"]: r for r in rows}

    def policy(turn: int, prompt_text: str):
        row = next(r for q, r in by_question.items() if q in prompt_text)
        if turn == 0:
            return tool_call(f"SELECT '{row['metadata']['question_id']}' AS qid"), "stop"
        good = int(row["metadata"]["question_id"]) % 2 == 0
        return f"<solution>{row['label']['gold_sql'] if good else 'SELECT 1'}</solution>", "stop"

    async def run_all(args):
        inputs = [GenerateFnInput(SimpleNamespace(args=args, tokenizer=tok),
                                  Sample(index=i, prompt=r["prompt"], label=r["label"], metadata=dict(r["metadata"])),
                                  {"max_new_tokens": 3072}) for i, r in enumerate(rows)]
        outs = await asyncio.gather(*(sql_episode.generate(x) for x in inputs))
        return [o.samples for o in outs]

    with FakeSglang(tok, policy) as server:
        samples = asyncio.run(run_all(make_args(server.port)))
    assert len(server.requests) == 2 * len(rows)
    for s, row in zip(samples, rows):
        assert s.label == row["label"]
        qid = row["metadata"]["question_id"]
        assert "<tool_response>\n" in s.response and qid in s.response.split("<tool_response>")[1]
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        assert tuple(s.rollout_routed_experts.shape) == (len(s.tokens) - 1, LAYERS, TOPK)
        expected = "correct" if int(qid) % 2 == 0 else "incorrect"
        assert s.metadata["t2sql"]["outcome"] == expected, (qid, s.metadata["t2sql"])


# ---- training metrics (--custom-rollout-log-function-path t2sql.sql_episode.log_rollout)


def _graded_sample(group: int, correct: bool, reward: float, **record) -> Sample:
    rec = {"outcome": "correct" if correct else "incorrect", "reward": reward, "correct": correct,
           "tool_calls": 2, "invalid_tool_calls": 0, "has_evidence": True, "evidence_restated": True,
           "evidence_checked": False, **record}
    return Sample(group_index=group, metadata={"t2sql": rec},
                  reward={"reward": reward, "category": rec["outcome"], "correct": 1.0 if correct else 0.0})


def test_rollout_metrics_count_correct_not_reward_one():
    import itertools

    # Shaped rewards: a correct answer that skipped an evidence rule earns 0.9, which miles'
    # reward == 1 pass@k would count as a miss.
    pattern = [[True, False, False, False], [True, True, False, True], [False] * 4]
    samples = [_graded_sample(g, c, 0.9 if c else 0.0) for g, row in enumerate(pattern) for c in row]
    m = metrics.rollout_metrics(samples, group_size=4)
    assert m["t2sql/accuracy"] == pytest.approx(4 / 12)
    assert m["t2sql/samples"] == 12

    def brute_pass(row, k):  # the share of k-subsets holding a correct sample
        subsets = list(itertools.combinations(row, k))
        return sum(any(s) for s in subsets) / len(subsets)

    for k in (1, 2, 4):
        assert m[f"t2sql/pass@{k}"] == pytest.approx(sum(brute_pass(r, k) for r in pattern) / 3)
    assert "t2sql/pass@8" not in m
    assert m["t2sql/evidence_restated_rate"] == 1.0 and m["t2sql/evidence_checked_rate"] == 0.0
    assert m["t2sql/tool_calls_mean"] == 2.0


def test_rollout_metrics_leave_out_incomplete_groups_and_ungraded_samples():
    samples = [_graded_sample(0, True, 1.0), _graded_sample(0, False, 0.0), _graded_sample(1, True, 1.0),
               Sample(group_index=1)]  # an aborted sample: no reward, no record
    m = metrics.rollout_metrics(samples, group_size=2)
    assert m["t2sql/accuracy"] == pytest.approx(2 / 3)
    assert m["t2sql/pass@1"] == pytest.approx(0.5)  # group 0 only; group 1 has one graded sample
    assert metrics.rollout_metrics([Sample()], group_size=2) == {}


def test_episode_record_carries_what_the_metrics_read(rows):
    row = rows[0]
    s, server, tok = run_episode(row, [f"<solution>{row['label']['gold_sql']}</solution>"])
    m = metrics.rollout_metrics([s])
    assert m["t2sql/accuracy"] == 1.0
    assert s.metadata["t2sql"]["has_evidence"] is bool(row["metadata"].get("evidence"))


def test_a_tasks_grading_method_travels_into_the_episode_and_the_regrade(rows):
    row = rows[0]
    gold = "SELECT superhero_name FROM superhero WHERE id < 10"
    answer = "SELECT superhero_name FROM superhero WHERE id IN (2, 4, 6)"
    subset_row = dict(row, label=dict(row["label"], gold_sql=gold, grading_method="subset,=,3"))
    s, server, tok = run_episode(subset_row, [f"<solution>{answer}</solution>"])
    assert s.metadata["t2sql"]["outcome"] == "correct", s.metadata["t2sql"]["detail"]
    # Without the task's method the preset's (multiset) applies: three of nine rows are not the gold.
    plain_row = dict(row, label=dict(row["label"], gold_sql=gold))
    s2, _, _ = run_episode(plain_row, [f"<solution>{answer}</solution>"])
    assert s2.metadata["t2sql"]["outcome"] == "incorrect"
    # reward_func's regrade (a sample without the episode's record) uses the task's method too.
    del s.metadata["t2sql"]
    assert reward_of(s)["category"] == "correct"
    # The bare preset honors task methods as well.
    s3, _, _ = run_episode(subset_row, [f"<solution>{answer}</solution>"], text_to_sql_preset="bare")
    assert s3.metadata["t2sql"]["outcome"] == "correct"
