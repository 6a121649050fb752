"""t2sql-train: the dry-run command (snapshot), the preflight refusal, the flag blocks, prepare's data path.

Update the snapshot after an intended change with:
    T2SQL_UPDATE_SNAPSHOTS=1 python3 -m pytest tests/test_train.py -k snapshot
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, bird_root
from t2sql.episode.presets import get_preset
from t2sql.errors import LaunchError
from t2sql.miles import flags as train_flags
from t2sql.miles import prepare

SNAPSHOT = REPO / "tests" / "snapshots" / "train_dry_run.txt"
LAUNCHER = REPO / "launcher" / "run_qwen3_6_35b_a3b_text_to_sql.py"
BIRD = bird_root()
FIXED = [
    "--output-dir", "/data/t2sql", "--run-id", "snapshot",
    "--miles-path", "/root/miles", "--megatron-path", "/root/Megatron-LM",
]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env.update(extra)
    return env


# The `t2sql-train` console script, as a real process (its entry point: t2sql.miles.train:main).
TRAIN = ["-c", "import sys; from t2sql.miles.train import main; sys.exit(main())"]


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=_env(**env), timeout=120, check=False
    )


def _flags(text: str) -> list[str]:
    """The train_args of a dry run, as argv tokens (comments dropped)."""
    body = text.split("train_args=(", 1)[1].split("\n)", 1)[0]
    return [tok for line in body.splitlines() if not line.strip().startswith("#") for tok in shlex.split(line)]


def _value(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_dry_run_matches_snapshot():
    proc = _run([*TRAIN, "train", "--dry-run", *FIXED])
    assert proc.returncode == 0, proc.stderr
    if os.environ.get("T2SQL_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
        SNAPSHOT.write_text(proc.stdout)
    assert proc.stdout == SNAPSHOT.read_text(), "dry-run changed; update the snapshot if intended (see module doc)"


def test_launcher_is_the_same_command():
    via_launcher = _run([str(LAUNCHER), "--dry-run", *FIXED])  # no subcommand: train
    assert via_launcher.returncode == 0, via_launcher.stderr
    assert via_launcher.stdout == SNAPSHOT.read_text()


def test_recipe_settings_are_in_the_command():
    flags = _flags(train_flags.render_dry_run(train_flags.TrainConfig(output_dir="/d", run_id="r"), environ={}))
    preset = get_preset("qwen3.6-35b-a3b")
    assert _value(flags, "--num-rollout") == "160"
    assert int(_value(flags, "--rollout-batch-size")) * 160 >= 5 * 2033  # 5 epochs of the train split
    assert _value(flags, "--eval-interval") == "5"
    ev = flags.index("--eval-prompt-data")
    assert flags[ev + 1 : ev + 5] == ["validation", "/d/data/validation.jsonl", "arcwise", "/d/data/arcwise.jsonl"]
    assert (_value(flags, "--advantage-estimator"), _value(flags, "--eps-clip"), _value(flags, "--eps-clip-high")) == (
        "grpo", "0.2", "0.28")
    assert float(_value(flags, "--lr")) == 1e-6 and _value(flags, "--lr-decay-style") == "constant"
    assert {"--optimizer-cpu-offload", "--use-rollout-routing-replay", "--colocate"} <= set(flags)
    assert _value(flags, "--sglang-ep-size") == "8" and _value(flags, "--expert-model-parallel-size") == "8"
    assert _value(flags, "--rollout-max-response-len") == str(preset.max_turn_tokens) == "3072"
    assert _value(flags, "--rollout-max-context-len") == str(preset.max_context_tokens)
    assert _value(flags, "--custom-generate-function-path") == "t2sql.sql_episode.generate"
    assert _value(flags, "--custom-rm-path") == "t2sql.sql_episode.reward_func"
    assert _value(flags, "--log-reward-category") == "category"
    assert "--apply-chat-template" not in flags  # the adapter renders the messages itself
    assert json.loads(_value(flags, "--apply-chat-template-kwargs")) == {"enable_thinking": True}
    assert "--use-wandb" not in flags


def test_options_change_the_command():
    c = train_flags.TrainConfig(output_dir="/d", run_id="r", num_nodes=2, loss="cispo", wandb_project="p",
                          wandb_team="t", extra_args="--lr 2e-6 --foo 'a b'")
    text = train_flags.render_dry_run(c, environ={"WANDB_API_KEY": "sekrit"})
    flags = _flags(text)
    assert _value(flags, "--actor-num-nodes") == "2"
    assert "export MILES_SCRIPT_EXTERNAL_RAY=1" in text
    assert _value(flags, "--custom-loss-function-path") == train_flags.CISPO_LOSS_PATH
    assert _value(flags, "--loss-type") == "custom_loss"
    assert (_value(flags, "--wandb-project"), _value(flags, "--wandb-team"), _value(flags, "--wandb-group")) == (
        "p", "t", "r")
    assert "sekrit" not in text and "export WANDB_API_KEY='***'" in text
    assert flags[-4:] == ["--lr", "2e-6", "--foo", "a b"]  # extra args last: they win in argparse
    assert train_flags.runtime_env(c, {"WANDB_API_KEY": "sekrit"})["WANDB_API_KEY"] == "sekrit"  # the real run gets it


def test_the_preset_chooses_the_loss_and_the_curriculum_hooks():
    def flags(**kw) -> list[str]:
        return _flags(train_flags.render_dry_run(train_flags.TrainConfig(output_dir="/d", run_id="r", **kw),
                                                 environ={}))

    recipe = flags()
    assert get_preset("qwen3.6-35b-a3b").loss == "cispo" and get_preset("bare").loss == "grpo"
    assert _value(recipe, "--custom-loss-function-path") == train_flags.CISPO_LOSS_PATH
    assert _value(recipe, "--data-source-path") == "t2sql.curriculum.CurriculumDataSource"
    assert _value(recipe, "--rollout-all-samples-process-path") == "t2sql.curriculum.record_rollout"
    bare = flags(recipe="bare")
    assert "--loss-type" not in bare and "--custom-loss-function-path" not in bare
    assert "--data-source-path" not in bare and "--rollout-all-samples-process-path" not in bare
    assert _value(bare, "--advantage-estimator") == "grpo"
    overridden = flags(loss="grpo")  # --loss wins over the preset; the curriculum stays
    assert "--custom-loss-function-path" not in overridden and "--data-source-path" in overridden
    assert "--custom-loss-function-path" in flags(recipe="bare", loss="cispo")
    proc = _run([*TRAIN, "train", "--dry-run", "--recipe", "bare", *FIXED])
    assert proc.returncode == 0 and "loss grpo" in proc.stdout.splitlines()[0]
    # miles cannot run the curriculum's after-rollout hook under --fully-async: refused up front.
    with pytest.raises(LaunchError, match="--fully-async"):
        train_flags.train_argv(train_flags.TrainConfig(run_id="r", extra_args="--fully-async"))
    assert "--fully-async" in train_flags.train_argv(
        train_flags.TrainConfig(run_id="r", recipe="bare", extra_args="--fully-async"))


def test_bad_options_are_refused_clearly():
    with pytest.raises(LaunchError, match="--loss"):
        train_flags.TrainConfig(loss="ppo2")
    proc = _run([*TRAIN, "train", "--dry-run", "--recipe", "nope", *FIXED])
    assert proc.returncode == 1 and "nope" in proc.stderr and "qwen3.6-35b-a3b" in proc.stderr
    with pytest.raises(LaunchError, match="KEY=VALUE"):
        train_flags.runtime_env(train_flags.TrainConfig(extra_env=["novalue"]), {})


def test_train_without_gpus_or_miles_stops_before_starting(tmp_path):
    if prepare.count_gpus() >= 8:
        pytest.skip("this node has GPUs: the refusal path is not reachable")
    out = tmp_path / "run"
    proc = _run([*TRAIN, "train", "--output-dir", str(out), "--miles-path", str(tmp_path / "no-miles"),
                 "--run-id", "x"])
    assert proc.returncode == 1
    assert "GPUs: found" in proc.stderr and "miles: no source checkout" in proc.stderr
    assert "t2sql-train prepare" in proc.stderr  # checkpoint/data missing say what to run
    assert not out.exists()  # nothing created, nothing started


def test_disk_check_gives_the_numbers(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(LaunchError) as e:
        prepare.check_disk(tmp_path / "not" / "yet", {"hf checkpoint": free + 10**12})
    msg = str(e.value)
    assert "not enough free disk" in msg and f"free {free / 1e9:.1f} GB" in msg and "hf checkpoint" in msg
    prepare.check_disk(tmp_path, {"small": 1})  # fits: no error


def test_prepare_refuses_model_step_without_gpus(tmp_path):
    if prepare.count_gpus() >= 8:
        pytest.skip("this node has GPUs")
    proc = _run([*TRAIN, "prepare", "--output-dir", str(tmp_path), "--skip-disk-check",
                 "--data-release", str(tmp_path)])
    assert proc.returncode == 1 and "--skip-model" in proc.stderr
    assert not (tmp_path / "models").exists()


def test_prepare_data_only_from_a_local_release(tmp_path):
    # A release in the documented layout: <split>.json beside databases/<db_id>/<db_id>.sqlite.
    release = tmp_path / "release"
    (release / "databases").mkdir(parents=True)
    rows = json.loads((BIRD / "dev.json").read_text())
    for db_id in ("superhero", "toxicology"):
        (release / "databases" / db_id).mkdir()
        os.symlink(BIRD / db_id / f"{db_id}.sqlite", release / "databases" / db_id / f"{db_id}.sqlite")
    (release / "validation.json").write_text(json.dumps([r for r in rows if r["db_id"] == "superhero"][:20]))
    (release / "arcwise.json").write_text(json.dumps([r for r in rows if r["db_id"] == "toxicology"][:10]))
    (release / "train.json").write_text(json.dumps([r for r in rows if r["db_id"] == "toxicology"][10:40]))
    out = tmp_path / "out"
    proc = _run([*TRAIN, "prepare", "--output-dir", str(out), "--data-release", str(release),
                 "--skip-model"])
    assert proc.returncode == 0, proc.stderr
    counts = {s: len((out / "data" / f"{s}.jsonl").read_text().splitlines()) for s in train_flags.SPLITS}
    assert counts == {"train": 30, "validation": 20, "arcwise": 10}
    manifest = json.loads((out / "data" / "validation.manifest.json").read_text())
    assert list(manifest["databases"]) == ["superhero"] and len(manifest["databases"]["superhero"]["sha256"]) == 64
    assert "60/60 gold digests" in proc.stdout
    assert any((out / "gold_cache").rglob("*")), "the gold cache was not filled"
