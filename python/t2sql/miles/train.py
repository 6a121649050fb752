"""`t2sql-train`: prepare and launch the recipe's miles run (Qwen3.6-35B-A3B, one 8xH200 node).

    t2sql-train prepare --output-dir /data/t2sql [--data-release PATH | --data-repo REPO]
    t2sql-train train   --output-dir /data/t2sql [--num-nodes N] [--loss grpo|cispo] [--dry-run]

The preset (--recipe) chooses the loss (--loss overrides it) and, when its `curriculum` switch is on,
adds the curriculum's data source and after-rollout hook (t2sql.miles.curriculum).

`prepare` checks free disk first, converts the data release into miles jsonl (t2sql.data.convert),
records the database manifest, runs every gold query once (validates the data and fills the gold
cache), then downloads the checkpoint (huggingface_hub) and converts it to Megatron's torch_dist
format with miles' own `convert_checkpoint` (torchrun on the GPUs).

`train` builds the full miles command line in named blocks (checkpoint, data, rollout, text-to-sql,
eval, loss, optimizer, routing replay, parallelism, sglang, logging, misc) — every setting visible
here, each overridable with --extra-args (later flags win in miles' argparse) — and hands it to
miles' `execute_train`, which starts Ray and submits miles' train.py. `--dry-run` prints the exact
command and environment and exits 0 on any machine. Without GPUs or a miles checkout, `train` stops
before starting anything and names what is missing.

Layout under --output-dir (one place, so prepare and train agree):
    models/Qwen3.6-35B-A3B             the HF checkpoint (--hf-checkpoint)
    models/Qwen3.6-35B-A3B_torch_dist  its torch_dist conversion (--ref-load)
    data/release/                      the downloaded data release (unless --data-release)
    data/{train,validation,arcwise}.jsonl, data/<split>.manifest.json (the database manifests)
    gold_cache/                        gold digests (--text-to-sql-cache-dir)
    checkpoints/<run-id>/              the run's own checkpoints (--save/--load)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

MODEL_NAME = "Qwen3.6-35B-A3B"
HF_REPO = "Qwen/Qwen3.6-35B-A3B"
MEGATRON_MODEL_TYPE = "qwen3.6-35B-A3B"  # miles' scripts/models/qwen3.6-35B-A3B.py
GENERATE_PATH = "t2sql.sql_episode.generate"
REWARD_PATH = "t2sql.sql_episode.reward_func"
CISPO_LOSS_PATH = "t2sql.cispo.cispo_loss"
CURRICULUM_DATA_SOURCE_PATH = "t2sql.curriculum.CurriculumDataSource"
CURRICULUM_HOOK_PATH = "t2sql.curriculum.record_rollout"
ROLLOUT_LOG_PATH = "t2sql.sql_episode.log_rollout"  # accuracy (correct), not only reward, per step
REWARD_KEY = "reward"  # the scalar in reward_func's dict
EVAL_REWARD_KEY = "correct"  # evaluation scores correct only (1 or 0)
CATEGORY_KEY = "category"  # the outcome category, for --log-reward-category
SPLITS = ("train", "validation", "arcwise")
EVAL_SPLITS = ("validation", "arcwise")

# Disk that `prepare` needs, in bytes (bf16 weights of 35B parameters ~ 72 GB, the same again for
# torch_dist, and the release's databases). Checkpoints saved during training come on top.
DISK_NEEDS = {"hf checkpoint": 72 * 10**9, "torch_dist checkpoint": 72 * 10**9, "data release": 40 * 10**9}


class LaunchError(RuntimeError):
    """The run cannot start; the message names what is missing and what to do."""


@dataclass
class TrainConfig:
    """Every knob of the launch. Defaults are the recipe's; a CLI flag exists for each field."""

    output_dir: str = "/root/t2sql"
    run_id: str = ""  # default: t2sql-<UTC time>
    recipe: str = "qwen3.6-35b-a3b"  # t2sql preset: budgets, reward table
    loss: str = ""  # grpo | cispo; empty: the preset's `loss` (cispo in the recipe, grpo in bare)
    num_nodes: int = 1
    num_gpus_per_node: int = 8
    miles_path: str = "/root/miles"
    megatron_path: str = "/root/Megatron-LM"
    hf_checkpoint: str = ""  # default: <output-dir>/models/Qwen3.6-35B-A3B
    # rollout: 64 tasks x 16 samples per step; 160 steps = 10,240 tasks = 5 epochs of 2,033
    num_rollout: int = 160
    rollout_batch_size: int = 64
    n_samples_per_prompt: int = 16
    global_batch_size: int = 1024  # one optimizer step per rollout step
    rollout_temperature: float = 1.0
    # eval on validation and arcwise every 5 steps
    eval_interval: int = 5
    n_samples_per_eval_prompt: int = 1
    eval_temperature: float = 0.6
    eval_top_p: float = 0.95
    # optimizer and GRPO
    lr: float = 1e-6
    eps_clip: float = 0.2
    eps_clip_high: float = 0.28
    # parallelism: TP1 EP8 on 8 GPUs
    tp: int = 1
    ep: int = 8
    cp: int = 1
    max_tokens_per_gpu: int = 16384
    sglang_mem_fraction_static: float = 0.7
    save_interval: int = 20
    # grader knobs handed to the adapter
    grader_concurrency: int = 16
    enable_thinking: bool = True
    wandb_project: str = ""
    wandb_team: str = ""
    extra_args: str = ""
    extra_env: list[str] = field(default_factory=list)  # KEY=VALUE for the Ray runtime env

    def __post_init__(self) -> None:
        if not self.run_id:
            self.run_id = "t2sql-" + datetime.datetime.now(datetime.timezone.utc).strftime("%y%m%d-%H%M%S")
        if not self.loss:
            self.loss = _preset(self).loss
        if self.loss not in LOSS_BLOCKS:
            raise LaunchError(f"--loss {self.loss!r}: choose one of {', '.join(LOSS_BLOCKS)}")
        if self.num_nodes < 1 or self.num_gpus_per_node < 1:
            raise LaunchError("--num-nodes and --num-gpus-per-node must be >= 1")

    # One place for the layout under output_dir.
    @property
    def root(self) -> Path:
        return Path(self.output_dir)

    @property
    def model_dir(self) -> Path:
        return self.root / "models"

    @property
    def hf_checkpoint_path(self) -> Path:
        return Path(self.hf_checkpoint) if self.hf_checkpoint else self.model_dir / MODEL_NAME

    @property
    def torch_dist_path(self) -> Path:
        # miles' convert_checkpoint writes <dir_dst>/<model_name>_torch_dist
        return self.model_dir / f"{MODEL_NAME}_torch_dist"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def cache_dir(self) -> Path:
        return self.root / "gold_cache"

    @property
    def save_dir(self) -> Path:
        return self.root / "checkpoints" / self.run_id

    def split_path(self, split: str) -> Path:
        return self.data_dir / f"{split}.jsonl"


# ------------------------------------------------------------------------------------------ blocks
# Each block returns a list of argv tokens; `train_blocks` joins them in order.


def _preset(config: TrainConfig):
    from t2sql.episode.reward import get_preset

    return get_preset(config.recipe)


def checkpoint_block(c: TrainConfig) -> list[str]:
    return [
        "--hf-checkpoint", str(c.hf_checkpoint_path),
        "--ref-load", str(c.torch_dist_path),
        "--load", str(c.save_dir),  # resumes the run after a restart; empty on the first start
        "--save", str(c.save_dir),
        "--save-interval", str(c.save_interval),
    ]


def data_block(c: TrainConfig) -> list[str]:
    # No --apply-chat-template: the adapter needs the messages and renders them on every turn.
    return [
        "--prompt-data", str(c.split_path("train")),
        "--input-key", "prompt",
        "--label-key", "label",
        "--metadata-key", "metadata",
        "--tool-key", "tools",
        "--apply-chat-template-kwargs", json.dumps({"enable_thinking": c.enable_thinking}),
        "--rollout-shuffle",
    ]


def curriculum_block(c: TrainConfig) -> list[str]:
    """The curriculum's two miles hooks when the preset switches it on (t2sql.miles.curriculum reads the
    preset through --text-to-sql-recipe). miles refuses the after-rollout hook under --fully-async."""
    if not _preset(c).curriculum:
        return []
    if "--fully-async" in shlex.split(c.extra_args):
        raise LaunchError(
            f"preset {c.recipe} turns the curriculum on, and its after-rollout hook cannot run with "
            "--fully-async; drop --fully-async or choose a preset with curriculum off (e.g. --recipe bare)"
        )
    return [
        "--data-source-path", CURRICULUM_DATA_SOURCE_PATH,
        "--rollout-all-samples-process-path", CURRICULUM_HOOK_PATH,
    ]


def rollout_block(c: TrainConfig) -> list[str]:
    preset = _preset(c)
    return [
        "--num-rollout", str(c.num_rollout),
        "--rollout-batch-size", str(c.rollout_batch_size),
        "--n-samples-per-prompt", str(c.n_samples_per_prompt),
        "--global-batch-size", str(c.global_batch_size),
        "--rollout-max-response-len", str(preset.max_turn_tokens),  # per turn
        "--rollout-max-context-len", str(preset.max_context_tokens),  # whole trajectory
        "--rollout-temperature", str(c.rollout_temperature),
        "--balance-data",
    ]


def text_to_sql_block(c: TrainConfig) -> list[str]:
    return [
        "--custom-generate-function-path", GENERATE_PATH,
        "--custom-rm-path", REWARD_PATH,
        "--reward-key", REWARD_KEY,
        "--eval-reward-key", EVAL_REWARD_KEY,
        "--log-reward-category", CATEGORY_KEY,
        "--text-to-sql-recipe", c.recipe,
        "--text-to-sql-cache-dir", str(c.cache_dir),
        "--text-to-sql-grader-concurrency", str(c.grader_concurrency),
    ]


def eval_block(c: TrainConfig) -> list[str]:
    preset = _preset(c)
    pairs: list[str] = []
    for split in EVAL_SPLITS:
        pairs += [split, str(c.split_path(split))]
    return [
        "--eval-interval", str(c.eval_interval),
        "--eval-prompt-data", *pairs,
        "--n-samples-per-eval-prompt", str(c.n_samples_per_eval_prompt),
        "--eval-max-response-len", str(preset.max_turn_tokens),
        "--eval-temperature", str(c.eval_temperature),
        "--eval-top-p", str(c.eval_top_p),
    ]


def grpo_loss_flags(c: TrainConfig) -> list[str]:
    return [
        "--advantage-estimator", "grpo",
        "--use-kl-loss", "--kl-loss-coef", "0.00", "--kl-loss-type", "low_var_kl",
        "--entropy-coef", "0.00",
        "--eps-clip", str(c.eps_clip),
        "--eps-clip-high", str(c.eps_clip_high),
    ]


def cispo_loss_flags(c: TrainConfig) -> list[str]:
    """The CISPO hook: GRPO advantages, t2sql.miles.cispo's loss in place of miles' policy loss.

    The clip bounds are --eps-clip/--eps-clip-high unless the loss reads its own from
    --custom-config-path (see t2sql/cispo.py).
    """
    return grpo_loss_flags(c) + ["--loss-type", "custom_loss", "--custom-loss-function-path", CISPO_LOSS_PATH]


LOSS_BLOCKS = {"grpo": grpo_loss_flags, "cispo": cispo_loss_flags}


def loss_block(c: TrainConfig) -> list[str]:
    return LOSS_BLOCKS[c.loss](c)


def optimizer_block(c: TrainConfig) -> list[str]:
    return [
        "--optimizer", "adam",
        "--lr", str(c.lr),
        "--lr-decay-style", "constant",
        "--weight-decay", "0.1",
        "--adam-beta1", "0.9",
        "--adam-beta2", "0.98",
        "--optimizer-cpu-offload",
        "--overlap-cpu-optimizer-d2h-h2d",
        "--use-precision-aware-optimizer",
    ]


def routing_replay_block(c: TrainConfig) -> list[str]:
    # R3: the trainer reuses the experts sglang chose; TIS corrects the remaining mismatch.
    return ["--use-rollout-routing-replay", "--use-tis"]


def parallel_block(c: TrainConfig) -> list[str]:
    return [
        "--tensor-model-parallel-size", str(c.tp),
        "--sequence-parallel",
        "--pipeline-model-parallel-size", "1",
        "--context-parallel-size", str(c.cp),
        "--expert-model-parallel-size", str(c.ep),
        "--expert-tensor-parallel-size", "1",
        "--recompute-granularity", "full",
        "--recompute-method", "uniform",
        "--recompute-num-layers", "1",
        "--use-dynamic-batch-size",
        "--max-tokens-per-gpu", str(c.max_tokens_per_gpu),
    ]


def sglang_block(c: TrainConfig) -> list[str]:
    return [
        "--rollout-num-gpus-per-engine", str(c.num_gpus_per_node),
        "--sglang-ep-size", str(c.num_gpus_per_node),
        "--sglang-mem-fraction-static", str(c.sglang_mem_fraction_static),
    ]


def logging_block(c: TrainConfig) -> list[str]:
    flags = ["--log-multi-turn", "--log-passrate", "--custom-rollout-log-function-path", ROLLOUT_LOG_PATH]
    if c.wandb_project:
        # The key travels in the Ray runtime env (WANDB_API_KEY), never on the command line.
        flags += ["--use-wandb", "--wandb-project", c.wandb_project, "--wandb-group", c.run_id]
        if c.wandb_team:
            flags += ["--wandb-team", c.wandb_team]
    return flags


def misc_block(c: TrainConfig) -> list[str]:
    return [
        "--attention-dropout", "0.0",
        "--hidden-dropout", "0.0",
        "--accumulate-allreduce-grads-in-fp32",
        "--attention-softmax-in-fp32",
        "--attention-backend", "flash",
        "--moe-token-dispatcher-type", "flex",
        "--actor-num-nodes", str(c.num_nodes),
        "--actor-num-gpus-per-node", str(c.num_gpus_per_node),
        "--num-gpus-per-node", str(c.num_gpus_per_node),
        "--colocate",
    ]


BLOCKS = (
    ("checkpoint", checkpoint_block),
    ("data", data_block),
    ("curriculum", curriculum_block),
    ("rollout", rollout_block),
    ("text-to-sql", text_to_sql_block),
    ("eval", eval_block),
    ("loss", loss_block),
    ("optimizer", optimizer_block),
    ("routing replay", routing_replay_block),
    ("parallelism", parallel_block),
    ("sglang", sglang_block),
    ("logging", logging_block),
    ("misc", misc_block),
)


def train_blocks(c: TrainConfig) -> list[tuple[str, list[str]]]:
    blocks = [(name, flags) for name, build in BLOCKS if (flags := build(c))]  # an empty block is off
    if c.extra_args.strip():
        blocks.append(("extra", shlex.split(c.extra_args)))
    return blocks


def train_argv(c: TrainConfig) -> list[str]:
    return [tok for _, flags in train_blocks(c) for tok in flags]


def runtime_env(c: TrainConfig, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Variables t2sql adds to the Ray runtime env (miles' execute_train adds its own)."""
    environ = os.environ if environ is None else environ
    env = {"PYTHONPATH": os.pathsep.join([c.megatron_path, c.miles_path])}
    if c.num_nodes > 1:
        env["MILES_SCRIPT_EXTERNAL_RAY"] = "1"  # the Ray cluster is started beforehand on every node
    if c.wandb_project and environ.get("WANDB_API_KEY"):
        env["WANDB_API_KEY"] = environ["WANDB_API_KEY"]
    for item in c.extra_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LaunchError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def _masked(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if any(m in k.upper() for m in _SECRET_MARKERS) else v) for k, v in env.items()}


def render_dry_run(c: TrainConfig, environ: dict[str, str] | None = None) -> str:
    """The exact command and environment as a bash script: one flag per line, grouped by block."""
    lines = [f"# t2sql-train: {MODEL_NAME}, recipe {c.recipe}, loss {c.loss}, run {c.run_id}"]
    lines.append(f"# {c.num_nodes} node(s) x {c.num_gpus_per_node} GPUs; miles at {c.miles_path}")
    lines.append("# environment (Ray runtime env, added to miles' own; secrets masked):")
    for k, v in _masked(runtime_env(c, environ)).items():
        lines.append(f"export {k}={shlex.quote(v)}")
    lines.append("train_args=(")
    for name, flags in train_blocks(c):
        lines.append(f"  # {name}")
        for chunk in _flag_groups(flags):
            lines.append("  " + " ".join(shlex.quote(t) for t in chunk))
    lines.append(")")
    lines.append(
        f"# miles' execute_train submits this to Ray, with the model flags of "
        f"scripts/models/{MEGATRON_MODEL_TYPE}.py before train_args:"
    )
    lines.append(f'python3 {shlex.quote(str(Path(c.miles_path) / "train.py"))} "${{train_args[@]}}"')
    return "\n".join(lines) + "\n"


def _flag_groups(flags: list[str]) -> list[list[str]]:
    """Split argv into one group per flag with its values."""
    groups: list[list[str]] = []
    for tok in flags:
        if tok.startswith("--") or not groups:
            groups.append([tok])
        else:
            groups[-1].append(tok)
    return groups


# -------------------------------------------------------------------------------- preflight checks


def count_gpus() -> int:
    """GPUs visible through nvidia-smi (0 when there is no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def miles_available(c: TrainConfig) -> bool:
    return (Path(c.miles_path) / "miles" / "utils" / "external_utils" / "command_utils.py").is_file()


def missing_for_train(c: TrainConfig) -> list[str]:
    """Everything `train` needs that is not there; empty when the launch can go ahead."""
    missing = []
    gpus = count_gpus()
    if gpus < c.num_gpus_per_node:
        missing.append(
            f"GPUs: found {gpus} on this node, need {c.num_gpus_per_node} (nvidia-smi -L); "
            "run on the training node"
        )
    if not miles_available(c):
        missing.append(
            f"miles: no source checkout at {c.miles_path} (use miles' Docker image, or pass --miles-path)"
        )
    if shutil.which("ray") is None:
        missing.append("ray: the `ray` command is not on PATH (pip install 'ray[default]', as in miles' image)")
    if not c.hf_checkpoint_path.is_dir():
        missing.append(f"checkpoint: {c.hf_checkpoint_path} not found (run `t2sql-train prepare` first)")
    if not (c.torch_dist_path / "latest_checkpointed_iteration.txt").is_file():
        missing.append(f"torch_dist checkpoint: {c.torch_dist_path} not converted (run `t2sql-train prepare`)")
    for split in SPLITS:
        if not c.split_path(split).is_file():
            missing.append(f"data: {c.split_path(split)} not found (run `t2sql-train prepare`)")
    if c.loss == "cispo" and importlib.util.find_spec(CISPO_LOSS_PATH.rsplit(".", 1)[0]) is None:
        missing.append(f"loss: --loss cispo needs {CISPO_LOSS_PATH}, which is not importable")
    return missing


def check_disk(path: Path, needs: dict[str, int]) -> None:
    """Raise LaunchError with the numbers when `path`'s file system cannot hold `needs`."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    total = sum(needs.values())
    if free < total:
        parts = " + ".join(f"{name} {n / 1e9:.0f} GB" for name, n in needs.items())
        raise LaunchError(
            f"not enough free disk on {path}: need {total / 1e9:.0f} GB ({parts}), "
            f"free {free / 1e9:.1f} GB. Free space, choose another --output-dir, or skip parts "
            "(--skip-model / --skip-data) that are already in place."
        )


# ------------------------------------------------------------------------------------------ prepare


def _import_miles_command_utils(c: TrainConfig):
    if not miles_available(c):
        raise LaunchError(
            f"miles: no source checkout at {c.miles_path}; convert_checkpoint and execute_train come from "
            "miles.utils.external_utils.command_utils (use miles' Docker image, or pass --miles-path)"
        )
    for p in (c.miles_path, c.megatron_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    import miles.utils.external_utils.command_utils as command_utils  # noqa: PLC0415

    return command_utils


def _snapshot_download(repo_id: str, local_dir: Path, *, repo_type: str | None = None) -> None:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise LaunchError("huggingface_hub is not installed: pip install 'huggingface_hub' (or t2sql[train])") from None
    local_dir.mkdir(parents=True, exist_ok=True)
    snapshot_download(repo_id=repo_id, repo_type=repo_type, local_dir=str(local_dir))


def write_manifests(c: TrainConfig, split_roots: dict[str, Path]) -> list[Path]:
    """data/<split>.manifest.json: size, mtime and sha256 of every database a split uses
    (t2sql.serving.manifest's format; pass one to a Grader to refuse databases changed since prepare)."""
    from t2sql.serving.manifest import Manifest

    written = []
    for split, db_root in split_roots.items():
        path = c.split_path(split)
        with path.open(encoding="utf-8") as f:
            db_ids = sorted({json.loads(line)["metadata"]["db_id"] for line in f if line.strip()})
        out = c.data_dir / f"{split}.manifest.json"
        Manifest.build(db_root, db_ids).save(out)
        written.append(out)
    return written


def precompute_gold(c: TrainConfig, concurrency: int | None = None) -> str:
    """Run every gold query once through the Grader, filling the on-disk gold cache that the
    training run's Grader reads (--text-to-sql-cache-dir). Failures are reported, not fatal:
    convert already refused gold that fails to run, so a failure here is a timeout to look at."""
    import asyncio

    from t2sql.progress import Progress
    from t2sql.serving.grader import Grader

    preset = _preset(c)
    tasks = []
    for split in SPLITS:
        path = c.split_path(split)
        if path.is_file():
            with path.open(encoding="utf-8") as f:
                for line in f:
                    row = json.loads(line)
                    tasks.append((row["metadata"]["db_path"], row["label"]["gold_sql"], row["label"]["question_id"],
                                  row["label"].get("grading_method")))

    async def run_all() -> list:
        grader = Grader(concurrency=concurrency, cache_dir=c.cache_dir, grade_timeout_s=preset.grade_timeout_s)
        try:
            with Progress(len(tasks), "gold cache") as bar:
                async def one(t):
                    r = await grader.gold(t[0], t[1], semantics=preset.method_for(t[3]),
                                          float_digits=preset.float_digits, column_order=preset.column_order)
                    bar.advance()
                    return r
                return await asyncio.gather(*(one(t) for t in tasks))
        finally:
            await grader.aclose()

    started = time.perf_counter()
    results = asyncio.run(run_all())
    elapsed = time.perf_counter() - started
    failed = [(t[2], r.outcome, r.detail) for t, r in zip(tasks, results) if not r.ok]
    for qid, outcome, detail in failed:
        print(f"gold {qid}: {outcome}: {detail}", file=sys.stderr)
    slowest = max((r.elapsed_s for r in results), default=0.0)
    slow = f", slowest {slowest:.2f}s" if slowest > 0 else ""
    return f"{len(results) - len(failed)}/{len(results)} gold digests in {c.cache_dir} ({elapsed:.1f}s{slow})"


def prepare(c: TrainConfig, args: argparse.Namespace) -> int:
    from t2sql.data import convert as data
    from t2sql.grading import describe_methods

    needs = {}
    if not args.skip_model:
        if not c.hf_checkpoint_path.is_dir():
            needs["hf checkpoint"] = DISK_NEEDS["hf checkpoint"]
        if not (c.torch_dist_path / "latest_checkpointed_iteration.txt").is_file():
            needs["torch_dist checkpoint"] = DISK_NEEDS["torch_dist checkpoint"]
    if not args.skip_data and not args.data_release:
        needs["data release"] = DISK_NEEDS["data release"]
    if needs and not args.skip_disk_check:
        check_disk(c.root, needs)
    # Fail before any download when the model step cannot run here.
    if not args.skip_model:
        gpus = count_gpus()
        if gpus < c.num_gpus_per_node:
            raise LaunchError(
                f"checkpoint conversion runs torchrun on {c.num_gpus_per_node} GPUs; found {gpus}. "
                "Run prepare on the training node, or pass --skip-model to prepare only the data."
            )
        _import_miles_command_utils(c)

    steps: list[tuple[str, str]] = []
    if not args.skip_data:
        if args.data_release:
            release = Path(args.data_release)
        elif args.data_repo:
            release = c.data_dir / "release"
            _snapshot_download(args.data_repo, release, repo_type="dataset")
            steps.append(("download data", f"{args.data_repo} -> {release}"))
        else:
            raise LaunchError("no data: pass --data-release PATH (a local copy) or --data-repo HF_DATASET_ID")
        fields = data.parse_field_map(args.field_map)
        reports = []
        split_roots: dict[str, Path] = {}
        built: list[tuple[str, list[dict]]] = []
        # Validate every split before writing any, so a bad split leaves nothing half-done.
        for split, questions, db_root in data.release_splits(release, args.splits):
            report, rows = data.convert_split(
                questions, db_root, None, split=split, fields=fields, recipe=c.recipe,
                gold_timeout_s=args.gold_timeout, drop_invalid=args.drop_invalid,
                method_fallback=args.grading_method_fallback,
            )
            reports.append(report)
            split_roots[split] = db_root
            built.append((split, rows))
        for split, rows in built:
            data.write_jsonl_atomic(c.split_path(split), rows)
        for r in reports:
            r.out_path = c.split_path(r.split)
            expected = data.RELEASE_SPLITS.get(r.split)
            if expected is not None and r.rows_written != expected:
                print(f"note: {r.split} has {r.rows_written} tasks; the recipe's release has {expected}",
                      file=sys.stderr)
        print(data.summary_table(reports))
        for r in reports:
            print(f"{r.split} grading methods: " + describe_methods(r.methods))
        steps.append(("convert data", ", ".join(f"{r.split} {r.rows_written}" for r in reports)))
        manifests = write_manifests(c, split_roots)
        steps.append(("database manifest", ", ".join(str(m) for m in manifests)))
        steps.append(("gold", precompute_gold(c)))
    if not args.skip_model:
        command_utils = _import_miles_command_utils(c)
        if not c.hf_checkpoint_path.is_dir():
            _snapshot_download(HF_REPO, c.hf_checkpoint_path)
            steps.append(("download checkpoint", f"{HF_REPO} -> {c.hf_checkpoint_path}"))
        command_utils.convert_checkpoint(
            model_name=MODEL_NAME,
            megatron_model_type=MEGATRON_MODEL_TYPE,
            num_gpus_per_node=c.num_gpus_per_node,
            dir_dst=str(c.model_dir),
            hf_checkpoint=str(c.hf_checkpoint_path),
            megatron_path=c.megatron_path,
        )
        steps.append(("convert checkpoint", str(c.torch_dist_path)))
    width = max((len(s) for s, _ in steps), default=0)
    for step, what in steps:
        print(f"{step.ljust(width)}  {what}")
    return 0


# -------------------------------------------------------------------------------------------- train


def train(c: TrainConfig, args: argparse.Namespace) -> int:
    if args.dry_run:
        sys.stdout.write(render_dry_run(c))
        return 0
    missing = missing_for_train(c)
    if missing:
        raise LaunchError("cannot start training; missing:\n" + "\n".join(f"  - {m}" for m in missing)
                          + "\n(`t2sql-train train --dry-run` prints the command without starting anything)")
    command_utils = _import_miles_command_utils(c)
    from t2sql.episode.reward import get_preset

    print(json.dumps({"preset": get_preset(c.recipe).to_dict()}, indent=1))
    command_utils.execute_train(
        train_args=shlex.join(train_argv(c)),
        num_gpus_per_node=c.num_gpus_per_node,
        megatron_model_type=MEGATRON_MODEL_TYPE,
        extra_env_vars=runtime_env(c),
        megatron_path=c.megatron_path,
    )
    return 0


# ---------------------------------------------------------------------------------------------- CLI


def _add_common(p: argparse.ArgumentParser) -> None:
    d = TrainConfig(run_id="x")
    p.add_argument("--output-dir", default=d.output_dir, help="models, data, gold cache and checkpoints live here")
    p.add_argument("--recipe", default=d.recipe, help="t2sql preset (budgets and reward)")
    p.add_argument("--num-gpus-per-node", type=int, default=d.num_gpus_per_node)
    p.add_argument("--miles-path", default=d.miles_path, help="miles source checkout (as in miles' image)")
    p.add_argument("--megatron-path", default=d.megatron_path)
    p.add_argument("--hf-checkpoint", default="", help=f"default: <output-dir>/models/{MODEL_NAME}")


def build_parser() -> argparse.ArgumentParser:
    from t2sql.grading import method_arg

    parser = argparse.ArgumentParser(prog="t2sql-train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = TrainConfig(run_id="x")

    p = sub.add_parser("prepare", help="download and convert the checkpoint and the data release")
    _add_common(p)
    p.add_argument("--data-release", default=None, help="a local copy of the data release (a directory)")
    p.add_argument("--data-repo", default=None, help="Hugging Face dataset id of the data release")
    p.add_argument("--field-map", nargs="*", default=[], metavar="FIELD=KEY", help="see `t2sql convert --help`")
    p.add_argument("--splits", nargs="+", default=list(SPLITS), help="splits of the release to convert")
    p.add_argument("--gold-timeout", type=float, default=60.0, help="seconds per gold query while validating")
    p.add_argument("--drop-invalid", action="store_true", help="write the valid rows, report the dropped ones")
    p.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                   help="the method for tasks whose grading_method cannot be read (two BIRD-Verified train "
                        "tasks say a bare 'subset'); without it they fail the conversion")
    p.add_argument("--skip-model", action="store_true", help="prepare the data only")
    p.add_argument("--skip-data", action="store_true", help="prepare the checkpoint only")
    p.add_argument("--skip-disk-check", action="store_true")

    t = sub.add_parser("train", help="launch the miles run (or print it with --dry-run)")
    _add_common(t)
    t.add_argument("--run-id", default="", help="names the checkpoint directory and the wandb group")
    t.add_argument("--loss", choices=sorted(LOSS_BLOCKS), default="",
                   help="default: the preset's loss (cispo in qwen3.6-35b-a3b, grpo in bare)")
    t.add_argument("--num-nodes", type=int, default=d.num_nodes, help="nodes of an already started Ray cluster")
    t.add_argument("--num-rollout", type=int, default=d.num_rollout)
    t.add_argument("--rollout-batch-size", type=int, default=d.rollout_batch_size)
    t.add_argument("--n-samples-per-prompt", type=int, default=d.n_samples_per_prompt)
    t.add_argument("--global-batch-size", type=int, default=d.global_batch_size)
    t.add_argument("--eval-interval", type=int, default=d.eval_interval)
    t.add_argument("--lr", type=float, default=d.lr)
    t.add_argument("--max-tokens-per-gpu", type=int, default=d.max_tokens_per_gpu)
    t.add_argument("--grader-concurrency", type=int, default=d.grader_concurrency)
    t.add_argument("--wandb-project", default="")
    t.add_argument("--wandb-team", default="")
    t.add_argument("--extra-args", default="", help="more miles flags, appended last (later flags win)")
    t.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="more Ray runtime env vars")
    t.add_argument("--dry-run", action="store_true", help="print the command and environment, start nothing")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    if "env" in vars(args):
        values["extra_env"] = args.env
    return TrainConfig(**values)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    try:
        config = config_from_args(args)
        if args.command == "prepare":
            return prepare(config, args)
        return train(config, args)
    except LaunchError as e:
        print(f"t2sql-train {args.command}: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # DataError and PresetError carry their own instructions
        from t2sql.data.convert import DataError

        try:
            from t2sql.episode.reward import PresetError
        except ImportError:  # pragma: no cover
            PresetError = DataError  # noqa: N806
        if isinstance(e, (DataError, PresetError)):
            print(f"t2sql-train {args.command}: {e}", file=sys.stderr)
            return 1
        raise
