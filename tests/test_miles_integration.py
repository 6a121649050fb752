"""t2sql inside miles' own code: runs only when MILES_SRC points at a miles source checkout.

Nothing of miles is copied here; its Python runs from the checkout, on CPU, in the environment that
`tests/miles_env.sh` builds (torch from PyPI, miles' import-time dependencies). MEGATRON_SRC (a
Megatron-LM checkout) is needed too for the launcher's flags, which go through Megatron's parser.

    MILES_SRC=../miles MEGATRON_SRC=../Megatron-LM .venv-miles/bin/python -m pytest tests/test_miles_integration.py

What runs, with exactly what miles passes:
- `t2sql-train train`'s whole command line (plus miles' own Qwen3.6-35B-A3B model flags) through
  miles' and Megatron's argument parsers.
- A training rollout through miles' `InferenceRolloutFn`: miles loads the curriculum data source
  from `--data-source-path`, calls `t2sql.sql_episode.generate` through its generate dispatch (with
  its own `GenerateState`, tokenizer loader and sampling params) against a loopback /generate
  server speaking Qwen3.6's real token ids, `reward_func` through its custom-rm dispatch, and the
  `--rollout-all-samples-process-path` hook as it calls it (with the bound `get_samples`). Then
  miles' `Sample.validate()`, `convert_samples_to_train_data` and its rollout logging, which calls
  `--custom-rollout-log-function-path t2sql.sql_episode.log_rollout`.
- An evaluation rollout through the same class (`--eval-prompt-data`, `--eval-reward-key correct`).
- CISPO through miles' loss dispatcher (`--loss-type custom_loss`) on miles' own reducers.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from unittest.mock import patch

import pytest

MILES_SRC = os.environ.get("MILES_SRC")
MEGATRON_SRC = os.environ.get("MEGATRON_SRC")
pytestmark = pytest.mark.skipif(not MILES_SRC, reason="set MILES_SRC to a miles checkout (see tests/miles_env.sh)")

if MILES_SRC:
    for path in (MEGATRON_SRC, MILES_SRC):
        if path and path not in sys.path:
            sys.path.insert(0, path)

from conftest import bird_root  # noqa: E402
from loopback_model import Conversation, LoopbackModel, Reply, TaskScript  # noqa: E402

LAYERS, TOPK = 2, 2  # the small checkpoint config the rollout test loads (routing replay shape)


def _qwen36_config(**text_config):
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeConfig

    # Qwen3.6-35B-A3B's architecture, as miles' scripts/models/qwen3.6-35B-A3B.py states it.
    values = dict(hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                  num_hidden_layers=40, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                  num_experts=256, num_experts_per_tok=8, vocab_size=248320, rms_norm_eps=1e-6,
                  tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25})
    values.update(text_config)
    return Qwen3_5MoeConfig(text_config=values)


@pytest.fixture(scope="module")
def checkpoint(qwen36_dir, tmp_path_factory) -> Path:
    """An --hf-checkpoint directory miles can load on CPU: Qwen3.6's tokenizer and chat template,
    and a config (no weights: nothing here runs the model)."""
    import shutil

    path = tmp_path_factory.mktemp("Qwen3.6-35B-A3B")
    shutil.copytree(qwen36_dir, path, dirs_exist_ok=True)
    _qwen36_config().save_pretrained(path)
    return path


def _model_text(tok, message: dict) -> str:
    from test_qwen36 import model_text

    return model_text(tok, message)


def _assistant(reasoning: str, content: str = "", sql: tuple[str, ...] = ()) -> dict:
    from test_qwen36 import assistant

    return assistant(reasoning, content, sql)


# ---------------------------------------------------------------------------------------------
# the launcher's flags through miles' and Megatron's parsers


@pytest.mark.skipif(not MEGATRON_SRC, reason="set MEGATRON_SRC to a Megatron-LM checkout")
def test_launcher_command_parses_under_miles_and_megatron(checkpoint, tmp_path):
    import torch
    from miles.utils.arguments import parse_args
    from miles.utils.external_utils.model_args_utils import load_model_args

    from t2sql.miles import flags as train_flags
    from t2sql.miles import train

    config = train.config_from_args(train.build_parser().parse_args(
        ["train", "--output-dir", str(tmp_path), "--dry-run"]))
    config.model_dir.mkdir(parents=True, exist_ok=True)
    config.torch_dist_path.mkdir(parents=True)  # --ref-load must exist
    argv = train_flags.train_argv(config)
    argv[argv.index("--hf-checkpoint") + 1] = str(checkpoint)
    # The model's own flags, as miles' execute_train adds them for megatron_model_type.
    argv += load_model_args(train_flags.MEGATRON_MODEL_TYPE).split()
    # Megatron asks the GPU's compute capability for grouped GEMM: answer as an H200 would.
    with patch("sys.argv", ["train.py", *argv]), \
            patch.object(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0)):
        args = parse_args()
    assert args.custom_generate_function_path == train_flags.GENERATE_PATH
    assert args.custom_rm_path == train_flags.REWARD_PATH
    assert args.rollout_all_samples_process_path == train_flags.CURRICULUM_HOOK_PATH
    assert args.data_source_path == train_flags.CURRICULUM_DATA_SOURCE_PATH
    assert args.custom_rollout_log_function_path == train_flags.ROLLOUT_LOG_PATH
    assert args.loss_type == "custom_loss" and args.custom_loss_function_path == train_flags.CISPO_LOSS_PATH
    assert args.text_to_sql_preset == config.preset  # generate.add_arguments was registered by miles
    assert args.hidden_size == 2048 and args.num_layers == 40


# ---------------------------------------------------------------------------------------------
# a rollout and an evaluation through miles' InferenceRolloutFn


def _write_split(rows: list[dict], path: Path) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """Three BIRD tasks converted by `t2sql convert` (train) and two for evaluation."""
    from t2sql.data import convert as data

    root = bird_root()
    questions = [q for q in json.loads((root / "dev.json").read_text()) if q.get("evidence")]
    picked = {db: [q for q in questions if q["db_id"] == db] for db in ("superhero", "toxicology", "student_club")}
    train_q = [qs[0] for qs in picked.values() if qs]
    eval_q = [qs[1] for qs in picked.values() if len(qs) > 1][:2]
    out = tmp_path_factory.mktemp("splits")
    (out / "train.json").write_text(json.dumps(train_q))
    (out / "val.json").write_text(json.dumps(eval_q))
    _, train_rows = data.convert_split(out / "train.json", root, out / "train.jsonl", split="train")
    _, eval_rows = data.convert_split(out / "val.json", root, out / "val.jsonl", split="validation")
    return out, root, train_rows, eval_rows


def _miles_args(checkpoint: Path, splits_dir: Path, port: int, tmp_path: Path, small_config: Path):
    from miles.utils.arguments import parse_args
    from miles.utils.http_utils import init_http_client

    argv = [
        "train.py", "--train-backend", "fsdp", "--ci-test",
        "--rollout-batch-size", "3", "--n-samples-per-prompt", "2", "--global-batch-size", "6", "--num-rollout", "1",
        "--rollout-num-gpus", "1", "--rollout-num-gpus-per-engine", "1",
        "--hf-checkpoint", str(small_config),
        "--prompt-data", str(splits_dir / "train.jsonl"),
        "--input-key", "prompt", "--label-key", "label", "--metadata-key", "metadata", "--tool-key", "tools",
        "--rollout-shuffle", "--rollout-seed", "7",
        "--eval-prompt-data", "validation", str(splits_dir / "val.jsonl"), "--n-samples-per-eval-prompt", "1",
        "--use-miles-router", "--sglang-router-ip", "127.0.0.1", "--sglang-router-port", str(port),
        "--rollout-max-response-len", "3072", "--rollout-max-context-len", "32768",
        "--rollout-function-path", "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn",
        "--custom-generate-function-path", "t2sql.sql_episode.generate",
        "--custom-rm-path", "t2sql.sql_episode.reward_func",
        "--reward-key", "reward", "--eval-reward-key", "correct", "--log-reward-category", "category",
        "--data-source-path", "t2sql.curriculum.CurriculumDataSource",
        "--rollout-all-samples-process-path", "t2sql.curriculum.record_rollout",
        "--custom-rollout-log-function-path", "t2sql.sql_episode.log_rollout",
        "--use-rollout-routing-replay", "--log-passrate",
        "--text-to-sql-preset", "qwen3.6-35b-a3b", "--text-to-sql-grader-concurrency", "2",
        "--save", str(tmp_path / "save"),
    ]
    with patch("sys.argv", argv):
        args = parse_args()
    init_http_client(args)
    return args


def test_rollout_and_eval_through_miles(qwen36_tokenizer, qwen36_dir, splits, tmp_path):
    import shutil

    from miles.ray.rollout import metrics as miles_metrics
    from miles.ray.rollout.rollout_data_conversion import postprocess_rollout_data
    from miles.ray.rollout.train_data_conversion import convert_samples_to_train_data
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnEvalInput, RolloutFnTrainInput
    from miles.rollout.inference_rollout.compatibility import call_rollout_function, load_rollout_function
    from miles.utils.misc import load_function
    from miles.utils.types import Sample

    from t2sql import curriculum, sql_episode  # the dotted paths miles is handed
    from t2sql.eval.runner import load_tasks

    tok = qwen36_tokenizer
    splits_dir, root, train_rows, eval_rows = splits
    # A small checkpoint config (2 layers, top-2) so the routed experts the server sends stay small.
    small = tmp_path / "small-ckpt"
    shutil.copytree(qwen36_dir, small)
    _qwen36_config(num_hidden_layers=LAYERS, num_experts_per_tok=TOPK).save_pretrained(small)

    tasks = load_tasks(splits_dir / "train.json", root).tasks + load_tasks(splits_dir / "val.json", root).tasks
    missed = tasks[0].question_id  # the model never answers this one right: its group is 0/2

    def plan(task, conv: Conversation) -> Reply:
        if conv.turn == 1:
            return Reply(text=_model_text(tok, _assistant("Look first.", "Checking the table.", (task.gold_sql,))))
        answer = "SELECT 1" if task.question_id == missed else task.gold_sql
        return Reply(text=_model_text(tok, _assistant("Answer.", f"<solution>{answer}</solution>")))

    import requests
    from miles.router.router import MilesRouter
    from miles.utils.http_utils import find_available_port
    from miles.utils.test_utils.uvicorn_thread_server import UvicornThreadServer

    script = TaskScript(tasks, plan)
    with LoopbackModel(script, tok, routing=(LAYERS, TOPK)) as model:
        # miles' own router in front of the loopback model, as in a real run (miles asks it for
        # its workers, and sends /generate through it).
        args = _miles_args(small, splits_dir, find_available_port(20000), tmp_path, small)
        router = UvicornThreadServer(MilesRouter(args, verbose=False).app, host=args.sglang_router_ip,
                                     port=args.sglang_router_port)
        router.start()
        try:
            requests.post(f"{router.url}/add_worker", params={"url": model.url}, timeout=5.0).raise_for_status()
            data_source = load_function(args.data_source_path)(args)  # what RolloutManager does
            fn = load_rollout_function(RolloutFnConstructorInput(args=args, data_source=data_source),
                                       args.rollout_function_path)
            out = call_rollout_function(fn, RolloutFnTrainInput(rollout_id=0))
            eval_fn = load_rollout_function(RolloutFnConstructorInput(args=args, data_source=data_source),
                                            args.eval_function_path)
            evaluated = call_rollout_function(eval_fn, RolloutFnEvalInput(rollout_id=0))
        finally:
            router.stop()
            sql_episode.close_contexts()

    groups = out.samples
    assert len(groups) == 3 and all(len(g) == 2 for g in groups)
    samples = [s for g in groups for s in g]
    for s in samples:
        s.validate()  # miles' own invariants (routed experts cover len(tokens) - 1, masks, log-probs)
        assert s.status == Sample.Status.COMPLETED
        assert s.rollout_routed_experts.shape == (len(s.tokens) - 1, LAYERS, TOPK)
        record = s.metadata["t2sql"]
        assert s.reward["category"] == record["outcome"] and s.reward["reward"] == record["reward"]
        assert record["tool_calls"] == 1
        correct = s.metadata["question_id"] != missed
        assert record["correct"] is correct and s.reward["correct"] == float(correct)

    # miles called the curriculum hook with its bound get_samples: the 0/2 group got a hint level.
    assert data_source.curriculum is not None
    assert data_source.curriculum.hint_level(missed) == 1
    assert all(data_source.curriculum.hint_level(t.question_id) == 0 for t in tasks[1:3])

    # What miles' RolloutManager does with the rollout next: flatten, log, convert to train data.
    flat, metadata = postprocess_rollout_data(args, groups, train_parallel_config=None)
    assert flat == samples
    logged: list[dict] = []
    with patch.object(miles_metrics.tracking, "log", lambda a, d, **k: logged.append(dict(d))):
        miles_metrics.log_rollout_data(0, args, flat, out.metrics, 1.0)
    train_data = convert_samples_to_train_data(args, flat, metadata=metadata,
                                               custom_convert_samples_to_train_data_func=None,
                                               custom_reward_post_process_func=None)
    assert [len(m) for m in train_data["loss_masks"]] == [s.response_length for s in samples]
    assert train_data["raw_reward"] == [s.reward["reward"] for s in samples]
    [metrics] = logged
    assert metrics["t2sql/accuracy"] == pytest.approx(4 / 6)
    assert metrics["t2sql/pass@2"] == pytest.approx(2 / 3)
    assert metrics["rollout/error_cat/correct"] == pytest.approx(4 / 6)  # miles' own metrics still there
    assert "rollout/response_len/mean" in metrics

    [name] = evaluated.data
    assert name == "validation"
    assert evaluated.data[name]["rewards"] == [1.0] * len(eval_rows)  # --eval-reward-key correct
    assert curriculum.record_rollout  # the hook's dotted path stays importable


# ---------------------------------------------------------------------------------------------
# CISPO through miles' loss dispatcher


def test_cispo_through_miles_loss_dispatcher():
    import torch
    import torch.distributed as dist
    from miles.backends.training_utils.cp_utils import get_sum_of_sample_mean
    from miles.backends.training_utils.loss_hub.losses import get_loss_function
    from miles.backends.training_utils.parallel import GroupInfo, ParallelState, set_parallel_state
    from miles.utils.http_utils import find_available_port

    from t2sql.miles.cispo import cispo_loss, cispo_reference

    # One process, tensor-parallel size 1: the default group miles' cross-entropy reduces over.
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_available_port(29500)}", rank=0,
                                world_size=1)
    trivial = GroupInfo(rank=0, size=1, group=None)
    tp = GroupInfo(rank=0, size=1, group=dist.group.WORLD)
    set_parallel_state(ParallelState(intra_dp=trivial, intra_dp_cp=trivial, cp=trivial, tp=tp, pp=trivial,
                                     ep=trivial, etp=trivial, indep_dp=trivial, is_pp_last_stage=True))
    from argparse import Namespace

    args = Namespace(loss_type="custom_loss", custom_loss_function_path="t2sql.cispo.cispo_loss",
                     advantage_estimator="grpo", eps_clip=0.2, eps_clip_high=0.28, qkv_format="thd",
                     rollout_temperature=1.0, allgather_cp=False, log_probs_chunk_size=-1, true_on_policy_mode=False,
                     use_rollout_logprobs=False, skip_actor_forward_only=False, entropy_coef=0.0,
                     observe_training_entropy=False, use_kl_loss=False, use_tis=False, get_mismatch_metrics=False,
                     use_opsm=False, calculate_per_token_loss=False)
    assert get_loss_function(args) is cispo_loss

    torch.manual_seed(0)
    vocab, prompt, responses = 11, [3, 2], [4, 2]
    tokens = [torch.randint(0, vocab, (p + r,)) for p, r in zip(prompt, responses)]
    total = [p + r for p, r in zip(prompt, responses)]
    logits = torch.randn(1, sum(total), vocab, requires_grad=True)
    masks = [torch.tensor([1, 0, 1, 1]), torch.tensor([1, 1])]
    advantages = [torch.full((4,), 1.5), torch.full((2,), -0.5)]
    # Old log-probs: the current ones shifted per token, so some ratios clip on each side.
    with torch.no_grad():
        logp = torch.log_softmax(logits[0], dim=-1)
        current = []
        offset = 0
        for t, p, r in zip(tokens, prompt, responses):
            positions = range(offset + p - 1, offset + p - 1 + r)
            current.append(torch.stack([logp[i, t[i - offset + 1]] for i in positions]))
            offset += p + r
    shifts = [torch.tensor([0.0, 0.3, -0.6, 0.05]), torch.tensor([0.5, -0.1])]
    old = [c - s for c, s in zip(current, shifts)]
    batch = {"advantages": advantages, "log_probs": old, "unconcat_tokens": tokens, "response_lengths": responses,
             "total_lengths": total, "loss_masks": masks}
    reduce = get_sum_of_sample_mean(total, responses, masks, False, "thd", None)
    loss, metrics = get_loss_function(args)(args, batch, logits, reduce)

    expected, _ = cispo_reference([c.tolist() for c in current], [o.tolist() for o in old],
                                  [a.tolist() for a in advantages], [m.float().tolist() for m in masks],
                                  eps_low=0.2, eps_high=0.28)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    assert logits.grad is not None and math.isfinite(float(logits.grad.abs().sum()))
    assert set(metrics) >= {"loss", "pg_loss", "pg_clipfrac", "cispo_weight", "ppo_kl"}
