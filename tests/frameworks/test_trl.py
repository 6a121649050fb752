"""t2sql inside TRL's own GRPOTrainer (TRL 1.16), on CPU: runs in .venv-trl (tests/envs/trl.sh builds it).

The main test trains for real: a tiny Qwen3 (hidden 64, 2 layers) on Qwen3.6's real vocabulary and TRL's
own Qwen3.6 chat template (so TRL picks its XML tool-call parser) is first fitted by a short supervised run
to call execute_sql_query and then answer in <solution> on three BIRD tasks (toxicology: the smallest schema
of tests/data/bird, so the shortest prompts); then GRPOTrainer generates with it, parses its tool calls,
calls SQLEnvironment's tool (which runs on t2sql's Grader), scores the rollouts with sql_reward and takes an
optimizer step. The episodes it ran are replayed through `t2sql eval` (tests/eval_replay.py): the same
turns give the same record.

Cost on CPU is the 248k vocabulary: the warm-up scores its targets against a sample of the vocabulary (a
warm-up, not the test's subject), and TRL's loss is let score only completion positions (see
`completion_positions_only`).
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402

from conftest import BIRD_ROOT, REPO, integration_help  # noqa: E402
from eval_replay import comparable, eval_records  # noqa: E402
from loopback_model import xml_tool_call  # noqa: E402
from t2sql.episode import rollout  # noqa: E402
from t2sql.episode.prompt import TOOL_SPEC  # noqa: E402
from t2sql.errors import DataError  # noqa: E402
from t2sql.integrations import settings_from_env  # noqa: E402
from t2sql.integrations import trl as t2sql_trl  # noqa: E402

PRESET = "qwen3.6-35b-a3b"
# Three toxicology tasks whose gold result is one row (tests/data/bird).
TASK_IDS = ("313", "323", "289")
PROBE = "SELECT COUNT(*) FROM molecule"  # the warm-up's tool call, the same for every task: one short row
SEED = 0
SFT_STEPS = 80
SFT_NEGATIVES = 8192  # vocabulary entries each warm-up step scores its targets against, besides the targets
TEMPLATE_KWARGS = {"enable_thinking": False}  # GRPOConfig's and the environment's: the prompts render alike


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    """The tasks as a BIRD-layout question file (their databases stay in tests/data/bird)."""
    questions = [q for q in json.loads((BIRD_ROOT / "dev.json").read_text()) if str(q["question_id"]) in TASK_IDS]
    path = tmp_path_factory.mktemp("tasks") / "dev.json"
    path.write_text(json.dumps(questions))
    return path


@pytest.fixture(scope="module")
def dataset(task_file):
    return t2sql_trl.train_dataset(task_file, db_root=BIRD_ROOT, preset=PRESET)


@pytest.fixture(scope="module")
def tokenizer():
    """Qwen3.6's tokenizer (tests/qwen36.py) with TRL's own Qwen3.6 chat template, unmodified."""
    from trl.chat_template_utils import qwen3_6_chat_template

    import qwen36

    tok = qwen36.build_tokenizer()
    tok.chat_template = qwen3_6_chat_template
    return tok


@pytest.fixture(scope="module")
def settings():
    settings = settings_from_env({}, preset=PRESET, db_root=str(BIRD_ROOT), concurrency=2)
    yield settings
    rollout.close_contexts()


def test_the_tool_trl_shows_the_model_is_t2sqls_tool_spec():
    from transformers.utils import get_json_schema

    assert get_json_schema(t2sql_trl.SQLEnvironment().execute_sql_query) == TOOL_SPEC


def test_train_dataset_reads_bird_questions_and_converted_rows(dataset, task_file, tmp_path):
    assert sorted(dataset["question_id"]) == sorted(TASK_IDS)
    assert [m["role"] for m in dataset[0]["prompt"]] == ["system", "user"]
    row = json.loads(dataset[0]["t2sql"])
    assert row["prompt"] == dataset[0]["prompt"] and row["metadata"]["preset"] == PRESET

    converted = tmp_path / "dev.jsonl"  # what `t2sql convert` writes: read back as it is
    converted.write_text("".join(r + "\n" for r in dataset["t2sql"]))
    again = t2sql_trl.train_dataset(converted)
    assert again["t2sql"] == dataset["t2sql"]
    with pytest.raises(DataError, match="built for preset"):
        t2sql_trl.train_dataset(converted, preset="bare")
    moved = t2sql_trl.train_dataset(converted, db_root=tmp_path / "elsewhere", split="dev")
    assert {json.loads(r)["metadata"]["db_path"] for r in moved["t2sql"]} == {
        str(tmp_path / "elsewhere" / "toxicology" / "toxicology.sqlite")}
    with pytest.raises(DataError, match="no rows of split 'train'"):
        t2sql_trl.train_dataset(converted, split="train")

    release = tmp_path / "release"  # a data release directory: <split>.json beside databases/
    release.mkdir()
    (release / "validation.json").write_text(task_file.read_text())
    (release / "databases").symlink_to(BIRD_ROOT)
    from_release = t2sql_trl.train_dataset(release, split="validation")
    assert {json.loads(r)["metadata"]["split"] for r in from_release["t2sql"]} == {"validation"}
    with pytest.raises(DataError, match="need their databases: pass db_root"):
        t2sql_trl.train_dataset("validation")  # the task file t2sql ships, without BIRD's databases
    with pytest.raises(DataError, match="no such file"):
        t2sql_trl.train_dataset(tmp_path / "missing.jsonl")


def test_the_documented_run_is_trl_1_16s(tmp_path):
    """docs/trl.md's script: its GRPOConfig settings are TRL 1.16's fields and construct (on CPU: without bf16
    and wandb), its batch is the recipe's 64 tasks x 16 on 8 processes, its budgets the preset's, and the
    environment's settings are t2sql's."""
    from trl import GRPOConfig, GRPOTrainer

    script = (REPO / "docs" / "trl.md").read_text().split("```python\n", 1)[1].split("```", 1)[0]
    calls = {node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id: node
             for node in ast.walk(ast.parse(script)) if isinstance(node, ast.Call)
             and isinstance(node.func, (ast.Name, ast.Attribute))}
    config = {k.arg: ast.literal_eval(k.value) for k in calls["GRPOConfig"].keywords}
    assert set(config) <= {f.name for f in dataclasses.fields(GRPOConfig)}
    args = GRPOConfig(**{**config, "output_dir": str(tmp_path), "bf16": False, "use_cpu": True, "report_to": "none"})
    preset = rollout.RolloutSettings(preset=PRESET).resolved_preset()
    assert (args.loss_type, args.num_generations, args.beta) == ("cispo", 16, 0.0)
    assert args.epsilon_high == 1.28  # CISPO's bound in TRL is absolute: the recipe's 1 + 0.28
    assert 8 * args.per_device_train_batch_size * args.gradient_accumulation_steps == 64 * 16
    assert args.steps_per_generation == args.gradient_accumulation_steps  # one optimizer step per batch
    assert args.max_tool_calling_iterations == preset.budgets.max_turns - 1
    assert args.vllm_max_model_length == preset.budgets.max_context_tokens
    assert {k.arg for k in calls["GRPOTrainer"].keywords} <= set(inspect.signature(GRPOTrainer).parameters)
    configured = {k.arg: k.value for k in calls["configured"].keywords}
    # The environment reads the model's tokens with the trainer's tokenizer and GRPOConfig's template kwargs.
    assert ast.unparse(configured["chat_template_kwargs"]) == "args.chat_template_kwargs"
    assert ast.unparse(configured["tokenizer"]) == "tokenizer"
    settings = set(configured) - {"tokenizer", "chat_template_kwargs"}
    assert settings <= {f.name for f in dataclasses.fields(rollout.RolloutSettings)} | {"preset"}
    literal = {k.arg: ast.literal_eval(k.value) for k in calls["configured"].keywords
               if k.arg in ("preset", "concurrency")}
    assert t2sql_trl.SQLEnvironment.configured(**literal)().settings.preset == PRESET


# ------------------------------------------------------------------------ the supervised warm-up


def tiny_qwen3(tokenizer):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=8192,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(SEED)
    return Qwen3ForCausalLM(config)


def render_ids(tokenizer, messages, **kwargs):
    return tokenizer.apply_chat_template(messages, tools=[TOOL_SPEC], tokenize=True, return_dict=False,
                                         **TEMPLATE_KWARGS, **kwargs)


def tool_suffix_ids(tokenizer, tool_message):
    """The ids TRL appends after a turn that called the tool: the template's tool block and the next
    generation prompt, cut after the turn's end-of-turn token (as GRPOTrainer._get_tool_suffix_ids)."""
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "execute_sql_query", "arguments": {}}}]}
    prefix = render_ids(tokenizer, [{"role": "user", "content": "dummy"}, call])
    full = render_ids(tokenizer, [{"role": "user", "content": "dummy"}, call, tool_message],
                      add_generation_prompt=True)
    end = max(i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id) + 1
    assert full[:end] == prefix[:end]
    return full[end:]


def warm_up_batch(tokenizer, dataset, settings):
    """Per task: the prompt, a tool call (PROBE), its real tool result, and <solution> with the gold query,
    as the token sequence TRL itself concatenates; padded into one batch, with the model's positions."""
    env = t2sql_trl.SQLEnvironment(settings=settings)
    sequences = []
    for item in dataset:
        gold = json.loads(item["t2sql"])["label"]["gold_sql"]
        env.reset(**item)
        result = env.execute_sql_query(PROBE)
        call_ids = tokenizer.encode(xml_tool_call(PROBE) + "<|im_end|>", add_special_tokens=False)
        answer_ids = tokenizer.encode(f"<solution>{gold}</solution><|im_end|>", add_special_tokens=False)
        prompt_ids = render_ids(tokenizer, item["prompt"], add_generation_prompt=True)
        tool_ids = tool_suffix_ids(tokenizer, {"role": "tool", "name": "execute_sql_query", "content": result})
        ids = prompt_ids + call_ids + tool_ids + answer_ids
        mine = [False] * len(prompt_ids) + [True] * len(call_ids) + [False] * len(tool_ids) + [True] * len(answer_ids)
        sequences.append((ids, mine))
    width = max(len(ids) for ids, _ in sequences)
    ids = torch.full((len(sequences), width), tokenizer.pad_token_id)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    mine = torch.zeros((len(sequences), width), dtype=torch.bool)
    for row, (seq, own) in enumerate(sequences):
        ids[row, :len(seq)], attention[row, :len(seq)], mine[row, :len(seq)] = torch.tensor(seq), 1, torch.tensor(own)
    return ids, attention, mine


def fit(model, batch, steps):
    """Next-token training on the model's own positions. Each step scores the targets against themselves and
    a fresh random sample of the vocabulary (not all 248k entries: a warm-up, not the test's subject)."""
    ids, attention, mine = batch
    predicted = mine[:, 1:]
    targets = ids[:, 1:][predicted]
    sampler = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state[:, :-1][predicted]
        vocab = torch.unique(torch.cat([targets, torch.randint(0, model.config.vocab_size, (SFT_NEGATIVES,),
                                                               generator=sampler)]))
        logits = hidden @ model.lm_head.weight[vocab].T
        loss = torch.nn.functional.cross_entropy(logits, torch.searchsorted(vocab, targets))
        loss.backward()
        optimizer.step()
    return float(loss)


@pytest.fixture
def completion_positions_only(monkeypatch):
    """TRL 1.16's loss projects hidden states through the vocabulary in tiles; on a device without Triton it
    scores every position, prompt included (fixed tile shapes for compilers), and masks the prompt's after.
    With t2sql's ~1.7k-token prompts that is ~20 times the work of the completion positions it keeps, so
    here it takes its Triton devices' path: only the completion positions are scored (same numbers)."""
    import trl.trainer.utils

    monkeypatch.setattr(trl.trainer.utils, "_use_triton", lambda device: True)


# --------------------------------------------------------------------------------- GRPO in TRL


def test_grpo_trainer_runs_t2sql_episodes_and_steps(tokenizer, dataset, settings, completion_positions_only,
                                                   tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    model = tiny_qwen3(tokenizer)
    final_loss = fit(model, warm_up_batch(tokenizer, dataset, settings), SFT_STEPS)
    assert final_loss < 0.1, final_loss

    grader = rollout.context(settings).grader
    tool_calls_before = grader.stats()["tool_calls"]
    factory = t2sql_trl.SQLEnvironment.configured(tokenizer=tokenizer, chat_template_kwargs=TEMPLATE_KWARGS,
                                                  preset=PRESET, db_root=str(BIRD_ROOT), concurrency=2)
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), seed=SEED, use_cpu=True, report_to="none", save_strategy="no",
        per_device_train_batch_size=4, num_generations=4, max_steps=1, logging_steps=1,
        loss_type="cispo", epsilon_high=1.28, beta=0.0, learning_rate=1e-4, temperature=1.0, top_k=10,
        max_completion_length=160,
        max_tool_calling_iterations=rollout.RolloutSettings(preset=PRESET).resolved_preset().budgets.max_turns - 1,
        chat_template_kwargs=TEMPLATE_KWARGS, dataloader_num_workers=0,
    )
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[t2sql_trl.sql_reward],
                          environment_factory=factory, train_dataset=dataset, args=args)
    trainer.train()

    environments = trainer.environments
    results = [env.result for env in environments]
    assert all(r is not None for r in results)
    # Real tool calls, parsed by TRL from the model's own text, reached the Grader through the episode.
    executed = sum(r.metrics["executed_tool_calls"] for r in results)
    assert executed > 0
    assert grader.stats()["tool_calls"] - tool_calls_before >= executed  # a replayed episode runs its calls again
    # One group of four rollouts of one task, and its rewards differ: there is an advantage to learn from.
    assert len({env.task_row["metadata"]["question_id"] for env in environments}) == 1
    rewards = [r.reward for r in results]
    assert len(set(rewards)) > 1, rewards
    # An optimizer step ran, with a finite loss and a non-zero gradient that moved the weights.
    logs = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    assert trainer.state.global_step == 1
    assert math.isfinite(logs["loss"]), logs
    assert math.isfinite(logs["grad_norm"]) and logs["grad_norm"] > 0, logs
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # The episodes' numbers went to TRL's log the TRL way.
    assert logs["t2sql/accuracy"] == pytest.approx(sum(r.correct for r in results) / len(results))
    assert logs["t2sql/tool_calls_mean"] == pytest.approx(sum(r.tool_calls for r in results) / len(results))
    assert logs["tools/call_frequency"] > 0  # TRL's own count of the tool calls it parsed and made

    # The same turns through `t2sql eval` give the same record (each distinct rollout once).
    rollouts = {tuple(eval_script(env)): env for env in environments}
    for number, (script, env) in enumerate(rollouts.items()):
        question_id = env.task_row["metadata"]["question_id"]
        replay_dir = tmp_path / f"eval-{number}"
        replay_dir.mkdir()
        record = eval_records([env.task_row], {question_id: list(script)}, preset=PRESET,
                              tmp_path=replay_dir)[question_id]
        assert comparable(env.result.to_dict()) == comparable(record), script


def eval_script(env):
    """The rollout's turns as tests/eval_replay.py takes them: a turn TRL cut goes as one stopped at length."""
    return list(env.turns) if env.cut is None else [*env.turns[:-1], (env.turns[-1], "length")]


# ------------------------------------------ scripted turns inside GRPOTrainer: what the reward grades


class ScriptedSampling:
    """Stands in for the model's sampling only (GRPOTrainer._generate_single_turn, transformers' path): each
    rollout's next scripted turn, as token ids ending in <|im_end|>. Everything else is TRL's: its tool-call
    parser, its tool loop calling SQLEnvironment, the ids it appends for the tool results, the reward call
    with completion_ids, the loss. A rollout is told apart by its prompt (the task) and its first turn."""

    def __init__(self, tokenizer, prompts, scripts):
        self.tokenizer = tokenizer
        self.prompts = prompts  # question_id -> prompt ids (as TRL renders them)
        self.scripts = scripts  # question_id -> [turns, turns]: one script per generation of the task
        self.started = {qid: 0 for qid in scripts}
        self.served = {}  # (question_id, script number) -> turns served
        self.order = []  # (question_id, script number) of each rollout, in the batch's order

    def ids(self, text):
        return self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)

    def __call__(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        out = []
        for sequence in prompt_ids:
            qid = next(q for q, p in self.prompts.items() if sequence[:len(p)] == p)
            completion = sequence[len(self.prompts[qid]):]
            if not completion:
                number = self.started[qid]
                self.started[qid] += 1
                self.order.append((qid, number))
            else:
                number = next(n for n, turns in enumerate(self.scripts[qid])
                              if completion[:len(self.ids(turns[0]))] == self.ids(turns[0]))
            turn = self.served.get((qid, number), 0)
            self.served[(qid, number)] = turn + 1
            out.append(self.ids(self.scripts[qid][number][turn]))
        return out, None


def test_inside_grpo_trainer_the_reward_grades_the_text_the_model_wrote(tokenizer, dataset, settings,
                                                                         completion_positions_only, tmp_path,
                                                                         monkeypatch):
    """Turns where TRL's parsed messages and the model's text part: text before and after a tool call (TRL's
    parser keeps one content span and drops the text before the call), a <solution> before a call, a call
    with an extra argument, a tool call and a solution in one turn, an unsafe query, and a rollout TRL stops
    while the model still calls the tool. Each rollout's reward is the one `t2sql eval` gives its turns."""
    from trl import GRPOConfig, GRPOTrainer

    items = {item["question_id"]: item for item in dataset}
    gold = {qid: json.loads(item["t2sql"])["label"]["gold_sql"] for qid, item in items.items()}
    requirement = "Requirement of external knowledge 1 (label = '+' mean molecules are carcinogenic)"
    verification = "Verification of external knowledge 1 (label = '+' mean molecules are carcinogenic)"
    extra_argument = xml_tool_call(PROBE).replace("</parameter>\n",
                                                  "</parameter>\n<parameter=limit>\n5\n</parameter>\n")
    scripts = {
        "289": [
            # Text on both sides of the call: the evidence label before it is what the evidence rule reads.
            [f"{requirement}: '+' marks a carcinogenic molecule.\n\n"
             + xml_tool_call("SELECT label FROM molecule WHERE molecule_id = 'TR151'")
             + "\n\nThe label answers the question.",
             f"{verification}: the label is the answer.\n\n<solution>{gold['289']}</solution>"],
            # TRL stops (max_tool_calling_iterations) while the model still calls the tool.
            [xml_tool_call(PROBE), xml_tool_call("SELECT label FROM molecule LIMIT 1"),
             xml_tool_call("SELECT COUNT(*) FROM atom")],
        ],
        "313": [
            # The right <solution> before a call (text after it), a wrong one next turn: the rules end at the first.
            [f"<solution>{gold['313']}</solution>\n\n" + xml_tool_call(PROBE) + "\n\nLet me check it first.",
             "<solution>SELECT 1</solution>"],
            # A tool call and a solution in one turn: TRL runs the call and goes on; the rules end at the solution.
            [xml_tool_call(PROBE) + f"\n<solution>{gold['313']}</solution>", "<solution>SELECT 1</solution>"],
        ],
        "323": [
            # An unsafe query ends the episode at once; TRL goes on to the next turn.
            [xml_tool_call("DELETE FROM molecule"), f"<solution>{gold['323']}</solution>"],
            # A call with an extra argument runs, as in `t2sql eval` (the tool reads only `query`).
            [extra_argument, f"<solution>{gold['323']}</solution>"],
        ],
    }
    prompts = {qid: render_ids(tokenizer, items[qid]["prompt"], add_generation_prompt=True) for qid in scripts}
    factory = t2sql_trl.SQLEnvironment.configured(tokenizer=tokenizer, chat_template_kwargs=TEMPLATE_KWARGS,
                                                  preset=PRESET, db_root=str(BIRD_ROOT), concurrency=2)
    args = GRPOConfig(
        output_dir=str(tmp_path / "grpo"), seed=SEED, use_cpu=True, report_to="none", save_strategy="no",
        per_device_train_batch_size=6, num_generations=2, max_steps=1, logging_steps=1,
        loss_type="cispo", epsilon_high=1.28, beta=0.0, learning_rate=1e-4, max_completion_length=1024,
        max_tool_calling_iterations=2, chat_template_kwargs=TEMPLATE_KWARGS, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=tiny_qwen3(tokenizer), processing_class=tokenizer,
                          reward_funcs=[t2sql_trl.sql_reward], environment_factory=factory,
                          train_dataset=dataset, args=args)
    sampling = ScriptedSampling(tokenizer, prompts, scripts)
    monkeypatch.setattr(trainer, "_generate_single_turn", sampling)
    trainer.train()

    by_script = dict(zip(sampling.order, trainer.environments))  # TRL keeps one environment per batch position
    assert len(by_script) == 6
    assert all(env.task_row["metadata"]["question_id"] == qid for (qid, _), env in by_script.items())
    assert all(env.turns[0] == scripts[qid][n][0] for (qid, n), env in by_script.items())  # the text, whole
    outcome = {key: (env.result.outcome, env.result.reward) for key, env in by_script.items()}
    # The evidence label written before the call counts (TRL's message lost it: 0.9); the right solution
    # before a call ends the episode (graded from TRL's messages, the wrong one after it scored -0.2).
    assert outcome[("289", 0)] == ("correct", 1.0) and by_script[("289", 0)].result.evidence_restated
    assert outcome[("313", 0)] == ("correct", 1.0) and len(by_script[("313", 0)].turns) == 1
    assert outcome[("313", 1)][0] == "correct" and len(by_script[("313", 1)].turns) == 1
    assert outcome[("323", 0)][0] == "unsafe" and len(by_script[("323", 0)].turns) == 1
    extra = by_script[("323", 1)].result
    assert (extra.outcome, extra.invalid_tool_calls, extra.metrics["executed_tool_calls"]) == ("correct", 0, 1)
    stopped = by_script[("289", 1)]
    assert (stopped.result.outcome, stopped.result.tool_calls, stopped.cut) == ("turn_cut", 2, "turn")
    logs = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    assert logs["rewards/sql_reward/mean"] == pytest.approx(sum(r for _, r in outcome.values()) / 6)

    for number in (0, 1):  # `t2sql eval` replays each task once a run: one run per script number
        (tmp_path / f"eval-{number}").mkdir()
        replayed = eval_records([json.loads(items[qid]["t2sql"]) for qid in scripts],
                                {qid: eval_script(by_script[(qid, number)]) for qid in scripts},
                                preset=PRESET, tmp_path=tmp_path / f"eval-{number}")
        for qid in scripts:
            env = by_script[(qid, number)]
            assert comparable(env.result.to_dict()) == comparable(replayed[qid]), env.turns


def test_without_the_tokenizer_the_reward_refuses_to_guess(dataset, settings):
    """The reward reads the model's tokens; an environment without the tokenizer cannot, and says how to fix it
    (it never falls back to TRL's parsed messages)."""
    from t2sql.errors import AdapterError

    env = t2sql_trl.SQLEnvironment(settings=settings)
    env.reset(**dataset[0])
    with pytest.raises(AdapterError, match=r"SQLEnvironment.configured\(tokenizer="):
        t2sql_trl.sql_reward([[{"role": "assistant", "content": "<solution>SELECT 1</solution>"}]],
                             environments=[env], completion_ids=[[1, 2]])


def test_python_m_t2sql_integrations_trl_help_runs_cleanly_here():
    """The entrypoint's --help in the framework's own environment (tests/envs/trl.sh, which also runs it with
    only the documented install): its usage, exit 0, no traceback."""
    done = integration_help("trl")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "docs/trl.md" in done.stdout and "SQLEnvironment" in done.stdout
