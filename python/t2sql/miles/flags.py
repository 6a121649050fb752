"""TrainConfig and the miles command it becomes, in grouped blocks of flags (the dry run prints them)."""

from __future__ import annotations

import json
import math
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from t2sql.episode.presets import DEFAULT_PRESET, Preset, get_preset
from t2sql.errors import LaunchError
from t2sql.home import default_dir

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


@dataclass
class TrainConfig:
    """Every knob of the launch. Defaults are the recipe's; a CLI flag exists for each field."""

    output_dir: str = field(default_factory=lambda: str(default_dir("train")))  # t2sql.home's rule
    run_id: str = ""  # default: default_run_id(), stable, so rerunning the same command resumes
    preset: str = DEFAULT_PRESET  # t2sql preset: budgets, reward table
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
        """Every value is checked here, before anything runs: a LaunchError naming the flag (a usage error)."""
        for name in NUMBERS:
            check_number(name, getattr(self, name))
        if not self.loss:
            self.loss = self.resolved_preset().loss
        if self.loss not in LOSS_BLOCKS:
            raise LaunchError(f"--loss {self.loss!r}: choose one of {', '.join(LOSS_BLOCKS)}")
        if not self.run_id:
            self.run_id = default_run_id(self.preset, self.loss)
        check_run_id(self.run_id)
        try:
            extra = shlex.split(self.extra_args)
        except ValueError as e:  # an unclosed quote
            raise LaunchError(f"--extra-args {self.extra_args!r}: {e}; quote it as a shell would") from None
        if self.resolved_preset().curriculum.enabled and "--fully-async" in extra:
            raise LaunchError(
                f"preset {self.preset} turns the curriculum on, and its after-rollout hook cannot run with "
                "--fully-async; drop --fully-async or choose a preset with curriculum off (e.g. --preset bare)"
            )
        for item in self.extra_env:
            key, sep, _ = item.partition("=")
            if not sep or not key:
                raise LaunchError(f"--env {item!r}: expected KEY=VALUE")

    def resolved_preset(self) -> Preset:
        """The t2sql preset the run trains with (--preset)."""
        return get_preset(self.preset)

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
    def release_dir(self) -> Path:
        return self.data_dir / "release"  # the data release as prepare --data-repo downloads it

    @property
    def bird_dir(self) -> Path:
        return self.data_dir / "bird"  # BIRD's databases as prepare downloads them: <train|dev>_databases/

    @property
    def cache_dir(self) -> Path:
        return self.root / "gold_cache"

    @property
    def save_dir(self) -> Path:
        return self.root / "checkpoints" / self.run_id

    def split_path(self, split: str) -> Path:
        return self.data_dir / f"{split}.jsonl"


# Every numeric knob of TrainConfig and what it must be (the CLI flag is the name with dashes).
COUNT = "count"  # a whole number >= 1
POSITIVE = "positive"  # a finite number > 0
NON_NEGATIVE = "non-negative"  # a finite number >= 0
FRACTION = "fraction"  # a number in (0, 1]
NUMBERS = {
    "num_nodes": COUNT, "num_gpus_per_node": COUNT,
    "num_rollout": COUNT, "rollout_batch_size": COUNT, "n_samples_per_prompt": COUNT, "global_batch_size": COUNT,
    "rollout_temperature": NON_NEGATIVE,
    "eval_interval": COUNT, "n_samples_per_eval_prompt": COUNT, "eval_temperature": NON_NEGATIVE,
    "eval_top_p": FRACTION,
    "lr": POSITIVE, "eps_clip": NON_NEGATIVE, "eps_clip_high": NON_NEGATIVE,
    "tp": COUNT, "ep": COUNT, "cp": COUNT, "max_tokens_per_gpu": COUNT,
    "sglang_mem_fraction_static": FRACTION, "save_interval": COUNT, "grader_concurrency": COUNT,
}
_KIND_TEXT = {
    COUNT: "a whole number >= 1",
    POSITIVE: "a positive, finite number",
    NON_NEGATIVE: "zero or a positive, finite number",
    FRACTION: "a number above 0 and at most 1",
}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def number_problem(name: str, value: object) -> str:
    """What is wrong with `value` for field `name` (NUMBERS says what it must be), or "" when nothing is."""
    kind = NUMBERS[name]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (isinstance(value, int) or math.isfinite(value))  # an int of any size; float nan/inf are no number
    if ok and kind == COUNT:
        ok = isinstance(value, int) and value >= 1
    elif ok:
        ok = (value > 0 if kind in (POSITIVE, FRACTION) else value >= 0) and (kind != FRACTION or value <= 1)
    return "" if ok else f"give {_KIND_TEXT[kind]}"


def check_number(name: str, value: object) -> None:
    if problem := number_problem(name, value):
        raise LaunchError(f"{_flag(name)} {value!r}: {problem}")


def read_number(name: str, text: str) -> int | float:
    """The CLI's reading of field `name`'s flag: an int for a count, else a float; ValueError saying
    what to give when it is not what NUMBERS says."""
    try:
        value: int | float | None = int(text) if NUMBERS[name] == COUNT else float(text)
    except ValueError:
        value = None
    if problem := number_problem(name, value):
        raise ValueError(f"{problem}, not {text!r}")
    return value


RUN_ID = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*")


def check_run_id(run_id: str) -> str:
    """A run id names a directory under <output-dir>/checkpoints: one plain name, never a path."""
    if not RUN_ID.fullmatch(run_id) or run_id in (".", ".."):
        raise LaunchError(
            f"--run-id {run_id!r}: give a plain name (letters, digits, '.', '_', '-'; not starting with '-'; "
            "not '.' or '..'): it names the directory checkpoints/<run-id> under --output-dir"
        )
    return run_id


def default_run_id(preset: str, loss: str) -> str:
    """The run id when none is given: the same for the same preset and loss, so rerunning a command
    resumes its checkpoints (a new --run-id starts afresh)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{preset}-{loss}").lstrip("-.")
    return name or "default"


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
    preset through --text-to-sql-preset). miles refuses the after-rollout hook under --fully-async
    (TrainConfig refuses that pair up front)."""
    if not c.resolved_preset().curriculum.enabled:
        return []
    return [
        "--data-source-path", CURRICULUM_DATA_SOURCE_PATH,
        "--rollout-all-samples-process-path", CURRICULUM_HOOK_PATH,
    ]


def rollout_block(c: TrainConfig) -> list[str]:
    preset = c.resolved_preset()
    return [
        "--num-rollout", str(c.num_rollout),
        "--rollout-batch-size", str(c.rollout_batch_size),
        "--n-samples-per-prompt", str(c.n_samples_per_prompt),
        "--global-batch-size", str(c.global_batch_size),
        "--rollout-max-response-len", str(preset.budgets.max_turn_tokens),  # per turn
        "--rollout-max-context-len", str(preset.budgets.max_context_tokens),  # whole trajectory
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
        "--text-to-sql-preset", c.preset,
        "--text-to-sql-cache-dir", str(c.cache_dir),
        "--text-to-sql-grader-concurrency", str(c.grader_concurrency),
    ]


def eval_block(c: TrainConfig) -> list[str]:
    preset = c.resolved_preset()
    pairs: list[str] = []
    for split in EVAL_SPLITS:
        pairs += [split, str(c.split_path(split))]
    return [
        "--eval-interval", str(c.eval_interval),
        "--eval-prompt-data", *pairs,
        "--n-samples-per-eval-prompt", str(c.n_samples_per_eval_prompt),
        "--eval-max-response-len", str(preset.budgets.max_turn_tokens),
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
    for item in c.extra_env:  # KEY=VALUE, checked by TrainConfig
        key, _, value = item.partition("=")
        env[key] = value
    return env


_SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD")


def _masked(env: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if any(m in k.upper() for m in _SECRET_MARKERS) else v) for k, v in env.items()}


def render_dry_run(c: TrainConfig, environ: dict[str, str] | None = None) -> str:
    """The exact command and environment as a bash script: one flag per line, grouped by block."""
    lines = [f"# t2sql-train: {MODEL_NAME}, preset {c.preset}, loss {c.loss}, run {c.run_id}"]
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
