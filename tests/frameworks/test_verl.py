"""t2sql's agent loop inside verl 0.9.1's own code, on CPU: run in the environment tests/envs/verl.sh builds.

    tests/envs/verl.sh && .venv-verl/bin/python -m pytest tests/frameworks/test_verl.py

What runs is verl's: its trainer config (hydra, `verl/trainer/config/ppo_trainer.yaml` with the overrides
docs/verl.md gives), its model config (HFModelConfig: Qwen3.6's real tokenizer and chat template, a
Qwen3.6-shaped config.json, no weights), its RLHFDataset reading the rows `t2sql convert --format verl`
wrote, the trainer's own batch steps (`_get_gen_batch`, repeat by rollout.n), its AgentLoopWorker (built as
verl builds it: the agent loop module imported through `actor_rollout_ref.model.external_lib`, the loop
instantiated with hydra from the registry by the rows' `agent_name`, its padding, its reward placement),
its LLMServerClient, `extract_reward` and its GRPO advantage and CISPO policy loss.

Once in the test's process (every detail of the ids, masks and records checked), once as the trainer runs
it: verl's AgentLoopManager on a local Ray, its worker a Ray actor reaching the server through verl's
GlobalRequestLoadBalancer actor.

What stands in, because it needs GPUs: the rollout server. verl's SGLang server (a Ray actor holding an
SGLang engine) is replaced by `LoopbackServer` (tests/frameworks/verl_standins.py), which does what that
server's `generate` does with a request (the token budget, the log-prob flag, the stop reason, the routed
experts) against a loopback sglang `/generate`
(tests/loopback_model.py) that plays scripted turns with Qwen3.6's real token ids; verl's LLMServerClient
reaches it in place of its Ray load balancer. A "vllm" dialect answers as verl's vLLM server does (stop
reason "completed" whether the turn stopped or was cut).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("verl", reason="runs inside verl's environment: tests/envs/verl.sh")
assert "datasets" not in sys.modules, "HF_DATASETS_CACHE must be set before datasets is imported"
# verl's dataset goes through Hugging Face datasets, which caches under the home directory unless told
# otherwise before it is imported: a folder of this module's own, removed after it (_hf_cache).
HF_CACHE = tempfile.mkdtemp(prefix="t2sql-verl-hf-")
os.environ["HF_DATASETS_CACHE"] = HF_CACHE

import numpy as np  # noqa: E402
import torch  # noqa: E402
from verl_standins import ROUTING, LoopbackServer  # noqa: E402

from conftest import REPO, bird_root, integration_help  # noqa: E402
from eval_replay import comparable, eval_records  # noqa: E402
from loopback_model import Conversation, LoopbackModel, Reply, TaskScript, expert_id  # noqa: E402

PRESET = "qwen3.6-35b-a3b"
DATABASES = ("superhero", "toxicology", "student_club")
LOOP_MODULE = "t2sql.integrations.verl"
LOGPROB = [-0.5 - 0.01 * (j % 7) for j in range(7)]  # the loopback server's log-prob pattern


# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def model_dir(qwen36_dir, tmp_path_factory) -> Path:
    """actor_rollout_ref.model.path for verl: Qwen3.6's tokenizer and chat template, and a small config of
    Qwen3.6's model type (verl picks its token builder and processor by it; nothing runs the model)."""
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig

    path = tmp_path_factory.mktemp("Qwen3.6-35B-A3B")
    shutil.copytree(qwen36_dir, path, dirs_exist_ok=True)
    config = Qwen3_5MoeConfig(text_config=dict(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_hidden_layers=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
        vocab_size=248320))
    config.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    config.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> SimpleNamespace:
    """One BIRD dev task with evidence per database, as `t2sql convert --format verl` writes them."""
    import json

    from t2sql import cli
    from t2sql.integrations import rows

    root = bird_root()
    questions = json.loads((root / "dev.json").read_text())
    picked = [[q for q in questions if q["db_id"] == db and q.get("evidence")][0] for db in DATABASES]
    out = tmp_path_factory.mktemp("verl-data")
    (out / "train.json").write_text(json.dumps(picked))
    assert cli.main(["convert", "--questions", str(out / "train.json"), "--db-root", str(root),
                     "--format", "verl", "--out-dir", str(out)]) == 0
    path = out / "train.verl.parquet"
    t2sql_rows = rows.read_rows(path)
    return SimpleNamespace(path=path, rows=t2sql_rows, by_db={r["metadata"]["db_id"]: r for r in t2sql_rows})


@pytest.fixture(scope="module", autouse=True)
def _hf_cache():
    yield
    shutil.rmtree(HF_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _graders_closed():
    """Each test's Graders are closed after it."""
    yield
    from t2sql.episode import rollout

    rollout.close_contexts()


def documented_overrides() -> dict[str, str]:
    """The overrides of the `python -m verl.trainer.main_ppo` command docs/verl.md gives, by key."""
    import shlex

    text = (REPO / "docs" / "verl.md").read_text()
    block = re.search(r"```bash\n(python -m verl\.trainer\.main_ppo .*?)```", text, re.S)
    assert block, "docs/verl.md shows no `python -m verl.trainer.main_ppo` command"
    words = shlex.split(block.group(1).replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "verl.trainer.main_ppo"]
    return dict(word.split("=", 1) for word in words[3:])


def compose(overrides: dict[str, str]):
    """verl's own trainer config as `python -m verl.trainer.main_ppo` composes it (hydra, verl's
    ppo_trainer.yaml) with these overrides."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=[f"{k}={v}" for k, v in overrides.items()])


def verl_config(model_dir: Path, tmp_path: Path, **overrides: str):
    """docs/verl.md's config, then the test's: the loopback model, a CPU-sized batch, the gold cache in
    tmp_path, then `overrides`."""
    values = documented_overrides()
    values.update({"actor_rollout_ref.model.path": str(model_dir), "actor_rollout_ref.rollout.n": "2",
                   "data.train_batch_size": "3", "actor_rollout_ref.actor.ppo_mini_batch_size": "3",
                   "+t2sql.cache_dir": str(tmp_path / "gold-cache"),
                   # verl's length filter hashes the whole tokenizer through datasets' fingerprint: 30 s here
                   "data.filter_overlong_prompts": "false"})
    values.update(overrides)
    return compose(values)


# ------------------------------------------------------------------------------ the server stand-in


def server_client(config: Any, server: LoopbackServer) -> Any:
    """verl's LLMServerClient, reaching the one loopback server where it would ask its Ray load balancer."""
    from verl.workers.rollout.llm_server import LLMServerClient

    handle = SimpleNamespace(generate=SimpleNamespace(remote=server.generate))  # a Ray handle's shape

    class OneServerClient(LLMServerClient):
        async def _acquire_server(self, request_id, **extra):
            return "loopback", handle

        def _release_server(self, server_id, request_id=None):
            return None

    return OneServerClient(config, load_balancer_handle=None)


# ------------------------------------------------------------------------------- scripted episodes


def assistant(reasoning: str, content: str = "", sql: tuple[str, ...] = ()) -> dict[str, Any]:
    from test_qwen36 import assistant as message

    return message(reasoning, content, sql)


def model_text(tok: Any, message: dict[str, Any]) -> str:
    from test_qwen36 import model_text as text

    return text(tok, message)


def plans(row: dict) -> dict[int, list[dict]]:
    """Two episodes of a task (its group of rollout.n = 2), each a list of assistant messages. The first
    turn names the episode ("Draft k"), so the server can tell the group's episodes apart."""
    gold = row["label"]["gold_sql"]
    db = row["metadata"]["db_id"]
    table = re.split(r"\s+", gold.split("FROM", 1)[1].strip())[0].strip("`\"")
    look = f"SELECT COUNT(*) FROM {table}"
    answer = assistant("The query's shape is right.", f"<solution>\n{gold}\n</solution>")
    if db == "superhero":  # correct / incorrect
        return {0: [assistant("Draft 0: look first.", "Checking.", (look,)), answer],
                1: [assistant("Draft 1: answer at once.", "<solution>SELECT 1</solution>")]}
    if db == "toxicology":  # an unsafe tool call ends it at once / correct after two calls in one turn
        return {0: [assistant("Draft 0: clean up.", "", ("DELETE FROM atom",))],
                1: [assistant("Draft 1: two checks.", "", (look, "SELECT 1 + 1")), answer]}
    return {0: [assistant("Draft 0: I cannot tell.", "The schema does not say.")],  # no_solution / correct
            1: [assistant("Draft 1: look.", "", (look,)), answer]}


class GroupScript:
    """The loopback model's script: episode k of a task plays plans(row)[k] turn by turn. Which episode a
    request belongs to: "Draft k" in its conversation, or (first turn) the next k not yet handed out."""

    def __init__(self, tok: Any, data: SimpleNamespace, plan_of=None):
        self.tok = tok
        self.rows = data.rows
        self.plans = {r["metadata"]["question_id"]: (plan_of or plans)(r) for r in data.rows}
        self.handed: dict[str, int] = {}
        self.lock = threading.Lock()
        tasks = [SimpleNamespace(question_id=r["metadata"]["question_id"], question=r["metadata"]["question"])
                 for r in data.rows]
        self.script = TaskScript(tasks, self.reply)

    def reply(self, task: Any, conversation: Conversation) -> Reply:
        found = re.search(r"Draft (\d)", conversation.raw)
        if found:
            k = int(found.group(1))
        else:
            with self.lock:
                k = self.handed.get(task.question_id, 0)
                self.handed[task.question_id] = k + 1
        turn = self.plans[task.question_id][k][conversation.turn - 1]
        return turn if isinstance(turn, Reply) else Reply(text=model_text(self.tok, turn))


def spy_tool_messages(monkeypatch) -> dict[tuple[str, int], list[list[dict]]]:
    """The tool messages each episode returned per turn, by (question_id, draft k): {key: [[turn 1's], ...]}."""
    from t2sql.episode import machine

    recorded: dict[tuple[str, int], list[list[dict]]] = {}
    on_turn = machine.Episode.on_turn

    async def spy(self, text, **kwargs):
        outcome = await on_turn(self, text, **kwargs)
        first = next(m["content"] for m in self.messages if m["role"] == "assistant")
        key = (self.task.question_id, int(re.search(r"Draft (\d)", first).group(1)))
        recorded.setdefault(key, []).append(list(outcome.tool_messages))
        return outcome

    monkeypatch.setattr(machine.Episode, "on_turn", spy)
    return recorded


def render(tok: Any, messages: list[dict], *, generation_prompt: bool, **template_kwargs: Any) -> list[int]:
    from t2sql.episode.prompt import tool_specs

    text = tok.apply_chat_template(messages, tools=tool_specs(), tokenize=False,
                                   add_generation_prompt=generation_prompt, **template_kwargs)
    return tok.encode(text, add_special_tokens=False)


# --------------------------------------------------------------------------------- verl's own path


def rollout_batch(config: Any, client: Any, data_path: Path) -> tuple[Any, Any]:
    """What verl's PPO trainer does for one step's rollout, on verl's own functions: RLHFDataset and its
    collate_fn, DataProto, uids, `_get_gen_batch`, repeat by rollout.n, AgentLoopWorker.generate_sequences,
    then the union with the batch. Returns (the worker, the batch with the rollout in it)."""
    import uuid

    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    worker = AgentLoopWorker(config, client)  # imports external_lib, registering the t2sql loop
    dataset = RLHFDataset(data_files=[str(data_path)], tokenizer=worker.tokenizer, config=config.data)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)  # verl's own; it reads nothing of the trainer
    n = config.actor_rollout_ref.rollout.n
    output = run_async(worker.generate_sequences(gen_batch.repeat(repeat_times=n, interleave=True)))
    return worker, batch.repeat(repeat_times=n, interleave=True).union(output)


def run_async(coroutine):
    import asyncio

    return asyncio.new_event_loop().run_until_complete(coroutine)


def unpadded(batch: Any, i: int) -> tuple[list[int], list[int], list[int], list[float] | None]:
    """Sample i's prompt ids, response ids, response mask and log-probs, without verl's padding."""
    prompt_len = batch.batch["prompts"].shape[1]
    attention = batch.batch["attention_mask"][i]
    prompt = batch.batch["prompts"][i][attention[:prompt_len].bool()].tolist()
    keep = attention[prompt_len:].bool()
    response = batch.batch["responses"][i][keep].tolist()
    mask = batch.batch["response_mask"][i][keep].tolist()
    logprobs = batch.batch["rollout_log_probs"][i][keep].tolist() if "rollout_log_probs" in batch.batch else None
    return prompt, response, mask, logprobs


# ------------------------------------------------------------------------------------------- tests


def test_group_rollout_through_verls_agent_loop_worker(qwen36_tokenizer, model_dir, data, tmp_path, monkeypatch):
    tok = qwen36_tokenizer
    config = verl_config(model_dir, tmp_path, **{"+t2sql.db_root": str(bird_root()),
                                                 "actor_rollout_ref.rollout.enable_rollout_routing_replay": "true"})
    tools_of = spy_tool_messages(monkeypatch)
    # As in a fresh Ray worker: the loop is neither imported nor registered until verl imports external_lib.
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    monkeypatch.delitem(_agent_loop_registry, "t2sql", raising=False)
    monkeypatch.delitem(sys.modules, LOOP_MODULE, raising=False)
    script = GroupScript(tok, data)
    with LoopbackModel(script.script, tok, routing=ROUTING) as model:
        server = LoopbackServer(model.url, config.actor_rollout_ref.rollout)
        _, batch = rollout_batch(config, server_client(config, server), data.path)

    assert _agent_loop_registry["t2sql"] == {"_target_": f"{LOOP_MODULE}.SQLAgentLoop"}
    assert len(batch) == 6
    records = batch.non_tensor_batch["t2sql"]
    infos = batch.non_tensor_batch["extra_info"]
    outcomes: dict[tuple[str, int], dict] = {}
    for i in range(len(batch)):
        qid = infos[i]["question_id"]
        row = next(r for r in data.rows if r["metadata"]["question_id"] == qid)
        prompt, response, mask, logprobs = unpadded(batch, i)
        k = int(re.search(r"Draft (\d)", tok.decode(response)).group(1))
        turns = plans(row)[k]
        record = records[i]
        outcomes[(qid, k)] = record
        # The prompt: the row's messages through Qwen3.6's template with the tool and verl's template kwargs.
        assert prompt == render(tok, row["prompt"], generation_prompt=True, enable_thinking=True)
        # The whole sequence: the template's rendering of the conversation (minus the final "\n" the
        # model never writes), with the tool messages this episode's tool calls returned.
        tools = tools_of[(qid, k)]
        assert len(tools) == len(turns)
        conversation = [dict(m) for m in row["prompt"]]
        starts = []
        for turn, tool_messages in zip(turns, tools):
            starts.append(len(render(tok, conversation, generation_prompt=True)) - len(prompt))
            conversation += [turn, *tool_messages]
        full = render(tok, conversation, generation_prompt=False)
        assert prompt + response == full[:-1]
        # Masks and log-probs: each turn's sampled ids (its text and <|im_end|>) 1 with the server's
        # log-probs, each tool segment (the "\n" after <|im_end|> included) 0 with log-prob 0.
        expected_mask, expected_logprobs = [], []
        for j, turn in enumerate(turns):
            n = len(tok.encode(model_text(tok, turn), add_special_tokens=False)) + 1
            end = starts[j + 1] if j + 1 < len(starts) else len(response)
            expected_mask += [1] * n + [0] * (end - starts[j] - n)
            expected_logprobs += [LOGPROB[x % 7] for x in range(n)] + [0.0] * (end - starts[j] - n)
        assert mask == expected_mask
        assert logprobs == pytest.approx(expected_logprobs)
        # Routed experts: the last turn's (the whole sequence but its last token), where verl places them.
        experts = batch.batch["routed_experts"][i]
        start = batch.batch["prompts"].shape[1] - len(prompt)
        sequence = len(prompt) + len(response)
        assert experts[start:start + sequence - 1, 1, 1].tolist() == [expert_id(q, 1, 1) for q in range(sequence - 1)]
        # The reward: the episode's, on the last response token only (verl's placement), and its extras.
        scores = batch.batch["rm_scores"][i]
        last = len(response) - 1
        assert scores[last].item() == pytest.approx(record["reward"])
        assert torch.count_nonzero(scores[:last]) == 0 and torch.count_nonzero(scores[last + 1:]) == 0
        assert batch.non_tensor_batch["acc"][i] == (1.0 if record["correct"] else 0.0)
        assert batch.non_tensor_batch["outcome"][i] == record["outcome"]
        assert batch.non_tensor_batch["__num_turns__"][i] == 1 + len(turns) + sum(1 for t in tools if t)
        assert record["preset"] == PRESET

    expected = {"superhero": ("correct", "incorrect"), "toxicology": ("unsafe", "correct"),
                "student_club": ("no_solution", "correct")}
    for row in data.rows:
        qid, db = row["metadata"]["question_id"], row["metadata"]["db_id"]
        assert (outcomes[(qid, 0)]["outcome"], outcomes[(qid, 1)]["outcome"]) == expected[db], \
            (outcomes[(qid, 0)]["detail"], outcomes[(qid, 1)]["detail"])

    # verl's own reward extraction and GRPO advantage: every group holds a better and a worse episode.
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage
    from verl.trainer.ppo.reward import extract_reward

    reward_tensor, extra = extract_reward(batch)
    assert set(batch.meta_info["reward_extra_keys"]) == {"acc", "outcome", "turns", "tool_calls",
                                                         "invalid_tool_calls"}
    assert list(extra["acc"]) == list(batch.non_tensor_batch["acc"])
    advantages, _ = compute_grpo_outcome_advantage(reward_tensor, batch.batch["response_mask"],
                                                   batch.non_tensor_batch["uid"])
    for g in range(3):
        pair = [advantages[2 * g + j][batch.batch["response_mask"][2 * g + j].bool()] for j in range(2)]
        assert all(p.numel() > 0 for p in pair)
        assert (pair[0].mean() > 0) != (pair[1].mean() > 0), "a group's better episode gets the positive advantage"

    # verl's CISPO policy loss (the documented loss_mode) on this batch: finite, and its gradient reaches
    # the model's tokens only (the tool segments are masked out).
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    actor = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    assert actor.policy_loss.loss_mode == "cispo"
    old = batch.batch["rollout_log_probs"]
    new = (old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(0))).requires_grad_()
    mask = batch.batch["response_mask"]
    loss, _ = get_policy_loss_fn("cispo")(old_log_prob=old, log_prob=new, advantages=advantages,
                                            response_mask=mask, loss_agg_mode=actor.loss_agg_mode, config=actor)
    loss.backward()
    assert torch.isfinite(loss)
    nonzero = new.grad != 0
    assert torch.equal(nonzero, mask.bool() & (advantages != 0))

    # The same task and preset give the same reward record as `t2sql eval`, replaying these turns.
    for k in (0, 1):
        (tmp_path / f"eval-{k}").mkdir()
        turns = {r["metadata"]["question_id"]: [model_text(tok, t) for t in plans(r)[k]] for r in data.rows}
        replayed = eval_records(data.rows, turns, preset=PRESET, tmp_path=tmp_path / f"eval-{k}",
                                db_root=bird_root())
        for qid, record in replayed.items():
            assert comparable(outcomes[(qid, k)]) == comparable(record), (qid, k)


def test_the_documented_command_composes_in_verls_config():
    """Every key of docs/verl.md's command exists in verl 0.9.1's config and means what the page says."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass

    from t2sql.episode.presets import get_preset
    from t2sql.integrations import verl as loop

    config = compose(documented_overrides())
    rollout_config = omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    assert rollout_config.n == 16 and rollout_config.multi_turn.enable and rollout_config.calculate_log_probs
    context = get_preset(PRESET).budgets.max_context_tokens
    assert rollout_config.prompt_length + rollout_config.response_length == context
    assert config.actor_rollout_ref.model.external_lib == loop.__name__
    assert config.actor_rollout_ref.actor.policy_loss.loss_mode == "cispo"
    assert get_policy_loss_fn("cispo") is not None
    actor = config.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.28)
    assert dict(config.data.apply_chat_template_kwargs) == {"enable_thinking": True}
    assert config.data.train_files.endswith("train.verl.parquet")  # what `t2sql convert --format verl` names it
    settings = loop.loop_settings(config, {})
    assert (settings.preset, settings.cache_dir, settings.concurrency) == (PRESET, "/data/t2sql/gold_cache", 2)


def cut_plans(row: dict) -> dict[int, list]:
    """One episode per task (rollout.n = 1): an aborted request, a turn the response budget cuts, an answer."""
    gold = row["label"]["gold_sql"]
    db = row["metadata"]["db_id"]
    if db == "superhero":
        return {0: [assistant("Draft 0: look.", "", ("SELECT COUNT(*) FROM superhero",)),
                    Reply(text="partial thou", finish="abort")]}
    if db == "toxicology":
        return {0: [assistant("Draft 0: look.", "", ("SELECT COUNT(*) FROM atom",)),
                    assistant("A long thought. " * 300, f"<solution>{gold}</solution>")]}
    return {0: [assistant("Draft 0: answer.", f"<solution>{gold}</solution>")]}


RESPONSE_BUDGET = 400  # tokens: room for one look and its tool message, not for a 1,200-token second turn


def test_response_budget_aborts_and_a_loop_config_entry(qwen36_tokenizer, model_dir, data, tmp_path, monkeypatch):
    """vLLM's naming (a cut turn says "completed"), thinking off, no log-probs, and the loop's settings from an
    agent_loop_config_path entry (preset bare)."""
    from verl.experimental.agent_loop import agent_loop

    tok = qwen36_tokenizer
    entry = tmp_path / "agent_loop.yaml"
    entry.write_text(f"- name: t2sql\n  _target_: {LOOP_MODULE}.SQLAgentLoop\n  preset: bare\n")
    monkeypatch.setitem(agent_loop._agent_loop_registry, "t2sql", {"_target_": f"{LOOP_MODULE}.SQLAgentLoop"})
    config = verl_config(model_dir, tmp_path, **{
        "actor_rollout_ref.rollout.n": "1", "data.max_response_length": str(RESPONSE_BUDGET),
        "+data.apply_chat_template_kwargs.enable_thinking": "false",
        "actor_rollout_ref.rollout.calculate_log_probs": "false",
        "actor_rollout_ref.rollout.agent.agent_loop_config_path": str(entry)})
    script = GroupScript(tok, data, cut_plans)
    with LoopbackModel(script.script, tok) as model:
        server = LoopbackServer(model.url, config.actor_rollout_ref.rollout, dialect="vllm")
        _, batch = rollout_batch(config, server_client(config, server), data.path)

    assert "rollout_log_probs" not in batch.batch.keys()
    infos = [info["question_id"] for info in batch.non_tensor_batch["extra_info"]]
    for db, row in data.by_db.items():
        i = infos.index(row["metadata"]["question_id"])
        prompt, response, mask, _ = unpadded(batch, i)
        # verl's data.apply_chat_template_kwargs reached the template: thinking off.
        assert prompt == render(tok, row["prompt"], generation_prompt=True, enable_thinking=False)
        assert prompt != render(tok, row["prompt"], generation_prompt=True, enable_thinking=True)
        assert len(response) <= RESPONSE_BUDGET
        record = batch.non_tensor_batch["t2sql"][i]
        score = batch.batch["rm_scores"][i][len(response) - 1].item()
        if db == "superhero":  # aborted: kept, never graded, never trained on
            assert record is None and batch.non_tensor_batch["outcome"][i] == "aborted"
            assert tok.decode(response).endswith("partial thou") and mask == [0] * len(response)
            assert score == 0.0
            continue
        assert record["preset"] == "bare"
        if db == "toxicology":  # the second turn ran into the response budget: cut there, exactly
            assert record["outcome"] == "context_cut", record["detail"]
            assert len(response) == RESPONSE_BUDGET and mask[-1] == 1 and score == -1.0
            last = max((r for r in server.requests if r["input_ids"][:len(prompt)] == prompt),
                       key=lambda r: len(r["input_ids"]))
            assert last["sampling_params"]["max_new_tokens"] == RESPONSE_BUDGET - (len(last["input_ids"]) - len(prompt))
        else:
            assert record["outcome"] == "correct" and score == 1.0  # bare: the outcome table only


def test_a_prompt_longer_than_verls_prompt_length_is_refused_naming_it(qwen36_tokenizer, model_dir, data, tmp_path):
    from t2sql.errors import AdapterError

    config = verl_config(model_dir, tmp_path, **{"data.max_prompt_length": "256",
                                                 "data.filter_overlong_prompts": "false"})
    with LoopbackModel(GroupScript(qwen36_tokenizer, data).script, qwen36_tokenizer) as model:
        server = LoopbackServer(model.url, config.actor_rollout_ref.rollout)
        with pytest.raises(AdapterError, match=r"prompt_length=256; raise data\.max_prompt_length"):
            rollout_batch(config, server_client(config, server), data.path)
    assert server.requests == []  # refused before anything was generated


def test_settings_come_from_the_environment_then_verls_config_then_the_loop_entry(monkeypatch):
    from omegaconf import OmegaConf

    from t2sql.integrations import SettingsError
    from t2sql.integrations.verl import loop_settings

    monkeypatch.setenv("T2SQL_PRESET", "bare")
    monkeypatch.setenv("T2SQL_GRADER_CONCURRENCY", "3")
    monkeypatch.setenv("T2SQL_DB_ROOT", "/from/env")
    config = OmegaConf.create({"t2sql": {"preset": PRESET, "concurrency": 5}})
    settings = loop_settings(config, {"concurrency": 7})
    assert (settings.preset, settings.concurrency, settings.db_root) == (PRESET, 7, "/from/env")
    assert loop_settings(OmegaConf.create({}), {}).preset == "bare"
    with pytest.raises(SettingsError, match="unknown t2sql setting"):  # the pre-release spelling is gone
        loop_settings(OmegaConf.create({"t2sql": {"recipe": "bare"}}), {})
    with pytest.raises(SettingsError, match=r"\+t2sql\.preset="):
        loop_settings(OmegaConf.create({"t2sql": "bare"}), {})
    # Each value is checked by type and range, as verl's config hands it over (concurrency="8" was a
    # TypeError, tool_timeout_s=0 was silently ignored).
    with pytest.raises(SettingsError, match=r"^t2sql\.concurrency='8' must be a whole number from 1 to 1024"):
        loop_settings(OmegaConf.create({"t2sql": {"concurrency": "8"}}), {})
    with pytest.raises(SettingsError, match=r"^t2sql\.tool_timeout_s=0 must be a number of seconds above 0"):
        loop_settings(OmegaConf.create({"t2sql": {"tool_timeout_s": 0}}), {})
    with pytest.raises(SettingsError, match=r"^t2sql\.grade_timeout_s=inf must be"):
        loop_settings(OmegaConf.create({"t2sql": {"grade_timeout_s": float("inf")}}), {})


def test_the_rollout_through_ray_as_the_trainer_runs_it(qwen36_tokenizer, model_dir, data, tmp_path, monkeypatch):
    """verl's AgentLoopManager on a local Ray: its AgentLoopWorker in a Ray actor of its own (a fresh process,
    where external_lib registers the loop), verl's LLMServerClient through verl's GlobalRequestLoadBalancer
    actor to the server stand-in, itself a Ray actor."""
    import ray
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    import t2sql

    tok = qwen36_tokenizer
    config = verl_config(model_dir, tmp_path, **{"actor_rollout_ref.rollout.n": "1",
                                                 "actor_rollout_ref.rollout.agent.num_workers": "1"})
    paths = [str(Path(t2sql.__file__).resolve().parent.parent), str(REPO / "tests"), str(REPO / "tests" / "frameworks")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # Ray's worker processes start with this
    ray_dir = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must stay under 107 bytes
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address="127.0.0.1", _temp_dir=ray_dir, _system_config={"enable_worker_prestart": False})
    try:
        with LoopbackModel(GroupScript(tok, data).script, tok) as model:
            server = ray.remote(LoopbackServer).remote(model.url, config.actor_rollout_ref.rollout)
            balancer = get_router_handle(servers={"loopback": server})
            manager = AgentLoopManager.create(config, LLMServerClient(config, load_balancer_handle=balancer))
            dataset = RLHFDataset(data_files=[str(data.path)], tokenizer=tok, config=config.data)
            batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
            output = manager.generate_sequences(batch)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert len(output) == 3
    for i, record in enumerate(output.non_tensor_batch["t2sql"]):
        prompt_len = output.batch["prompts"].shape[1]
        last = int(output.batch["attention_mask"][i][prompt_len:].sum()) - 1
        assert output.batch["rm_scores"][i][last].item() == pytest.approx(record["reward"])
        assert output.non_tensor_batch["outcome"][i] == record["outcome"]
    assert sorted(output.non_tensor_batch["outcome"]) == ["correct", "no_solution", "unsafe"]  # the drafts 0


def test_python_m_t2sql_integrations_verl_help_runs_cleanly_here():
    """The entrypoint's --help in the framework's own environment (tests/envs/verl.sh, which also runs it with
    only the documented install): its usage, exit 0, no traceback."""
    done = integration_help("verl")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "docs/verl.md" in done.stdout and "SQLAgentLoop" in done.stdout
