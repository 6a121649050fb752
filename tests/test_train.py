"""t2sql-train: the dry-run command (snapshot), the preflight refusal, the flag blocks, prepare's data path,
usage errors and network failures as one line, and downloads that are complete or absent (against a Hub
on loopback, tests/loopback_hub.py).

Update the snapshot after an intended change with:
    T2SQL_UPDATE_SNAPSHOTS=1 python3 -m pytest tests/test_train.py -k snapshot
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, bird_root
from loopback_hub import COMMIT, Hub
from t2sql.episode.presets import get_preset
from t2sql.errors import LaunchError
from t2sql.miles import checkpoint, prepare
from t2sql.miles import flags as train_flags

SNAPSHOT = REPO / "tests" / "snapshots" / "train_dry_run.txt"
LAUNCHER = REPO / "launcher" / "run_qwen3_6_35b_a3b_text_to_sql.py"
BIRD = bird_root()
FIXED = [
    "--output-dir", "/data/t2sql", "--run-id", "snapshot",
    "--miles-path", "/root/miles", "--megatron-path", "/root/Megatron-LM",
]


def _env(**extra: str) -> dict[str, str]:
    # No Hugging Face settings of this machine (token, endpoint, offline switch) reach the command.
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY" and not k.startswith("HF_")}
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
    assert _value(flags, "--rollout-max-response-len") == str(preset.budgets.max_turn_tokens) == "3072"
    assert _value(flags, "--rollout-max-context-len") == str(preset.budgets.max_context_tokens)
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
    bare = flags(preset="bare")
    assert "--loss-type" not in bare and "--custom-loss-function-path" not in bare
    assert "--data-source-path" not in bare and "--rollout-all-samples-process-path" not in bare
    assert _value(bare, "--advantage-estimator") == "grpo"
    overridden = flags(loss="grpo")  # --loss wins over the preset; the curriculum stays
    assert "--custom-loss-function-path" not in overridden and "--data-source-path" in overridden
    assert "--custom-loss-function-path" in flags(preset="bare", loss="cispo")
    proc = _run([*TRAIN, "train", "--dry-run", "--preset", "bare", *FIXED])
    assert proc.returncode == 0 and "loss grpo" in proc.stdout.splitlines()[0]
    # miles cannot run the curriculum's after-rollout hook under --fully-async: refused up front.
    with pytest.raises(LaunchError, match="--fully-async"):
        train_flags.train_argv(train_flags.TrainConfig(run_id="r", extra_args="--fully-async"))
    assert "--fully-async" in train_flags.train_argv(
        train_flags.TrainConfig(run_id="r", preset="bare", extra_args="--fully-async"))


def test_bad_options_are_refused_clearly():
    with pytest.raises(LaunchError, match="--loss"):
        train_flags.TrainConfig(loss="ppo2")
    proc = _run([*TRAIN, "train", "--dry-run", "--preset", "nope", *FIXED])
    assert proc.returncode == 2 and "nope" in proc.stderr and "qwen3.6-35b-a3b" in proc.stderr  # usage
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
    said = re.search(r"free ([\d.]+) GB\.", msg)  # in GB to 10 MB; the disk is shared, so within 1 GB
    assert "not enough free disk" in msg and said and abs(float(said[1]) * 1e9 - free) < 1e9 and "hf checkpoint" in msg
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
    assert "2 databases: " in proc.stdout  # the equivalence check's invariants, mined ahead of training
    assert any((out / "gold_cache").rglob("*")), "the gold cache was not filled"


# ------------------------------------------------------------------------ usage errors: one line, exit 2


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The single stderr line of a refused command (exit `code`, never a traceback)."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def _error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """The one line t2sql-train ends a failed run with, after what ran before it printed (huggingface_hub's
    progress bars and retry notes during a download); never a traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if line.startswith("t2sql-train ")]
    assert len(ours) == 1 and proc.stderr.strip().splitlines()[-1] == ours[0], proc.stderr
    return ours[0]


@pytest.mark.parametrize("args, named", [
    (["train", "--dry-run", "--extra-args", "--lr 'x"], "--extra-args"),
    (["train", "--dry-run", "--num-rollout", "-5"], "--num-rollout"),
    (["train", "--dry-run", "--rollout-batch-size", "0"], "--rollout-batch-size"),
    (["train", "--dry-run", "--n-samples-per-prompt", "1.5"], "--n-samples-per-prompt"),
    (["train", "--dry-run", "--global-batch-size", "many"], "--global-batch-size"),
    (["train", "--dry-run", "--eval-interval", "0"], "--eval-interval"),
    (["train", "--dry-run", "--lr", "0"], "--lr"),
    (["train", "--dry-run", "--lr", "nan"], "--lr"),
    (["train", "--dry-run", "--max-tokens-per-gpu", "-1"], "--max-tokens-per-gpu"),
    (["train", "--dry-run", "--grader-concurrency", "0"], "--grader-concurrency"),
    (["train", "--dry-run", "--num-nodes", "0"], "--num-nodes"),
    (["train", "--dry-run", "--num-gpus-per-node", "-8"], "--num-gpus-per-node"),
    (["train", "--dry-run", "--run-id", "../../etc"], "--run-id"),
    (["train", "--dry-run", "--run-id", ".."], "--run-id"),
    (["train", "--dry-run", "--run-id", "a/b"], "--run-id"),
    (["train", "--dry-run", "--run-id=-x"], "--run-id"),
    (["train", "--dry-run", "--env", "novalue"], "--env"),
    (["prepare", "--num-gpus-per-node", "0", "--skip-model", "--data-release", "."], "--num-gpus-per-node"),
    (["prepare", "--timeout-s", "0", "--skip-model", "--data-release", "."], "--timeout-s"),
    (["prepare", "--data-repo", "o/d", "--data-release", "."], "--data-release"),
    (["prepare", "--skip-model", "--bird-url", "ftp://mirror/bird"], "--bird-url"),
    (["prepare", "--skip-model", "--data-release", "no/such/release"], "--data-release"),
    (["prepare", "--skip-model", "--skip-data"], "--skip-data"),
    (["prepare", "--skip-model", "--data-release", ".", "--field-map", "gold_sql"], "--field-map"),
])
def test_a_wrong_command_line_is_one_line_and_exit_2(tmp_path, args, named):
    out = tmp_path / "out"
    proc = _run([*TRAIN, *args, "--output-dir", str(out), "--miles-path", str(tmp_path / "no-miles")])
    assert named in _one_line(proc, 2)
    assert not out.exists()  # refused before anything was made


def test_every_number_of_the_config_is_checked():
    for name, kind in train_flags.NUMBERS.items():
        for bad in (0 if kind == train_flags.COUNT else -1.0, float("nan"), True, "8"):
            if kind in (train_flags.POSITIVE, train_flags.FRACTION) and bad == -1.0:
                bad = 0.0
            with pytest.raises(LaunchError, match="--" + name.replace("_", "-")):
                train_flags.TrainConfig(run_id="r", **{name: bad})
    with pytest.raises(LaunchError, match="--eval-top-p"):
        train_flags.TrainConfig(eval_top_p=1.5)
    with pytest.raises(LaunchError, match="--tp"):
        train_flags.TrainConfig(tp=2.0)  # a count is a whole number
    train_flags.TrainConfig(rollout_temperature=0.0, eps_clip=0.0, eval_top_p=1.0, num_rollout=10**30)  # all fine


def _save_dir(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stderr
    return _value(_flags(proc.stdout), "--save")


def test_a_restart_without_run_id_resumes_the_same_checkpoints(tmp_path):
    out = str(tmp_path / "out")
    first = _save_dir(_run([*TRAIN, "train", "--dry-run", "--output-dir", out]))
    again = _save_dir(_run([*TRAIN, "train", "--dry-run", "--output-dir", out]))
    assert first == again == str(tmp_path / "out" / "checkpoints" / "qwen3.6-35b-a3b-cispo")
    assert _value(_flags(_run([*TRAIN, "train", "--dry-run", "--output-dir", out]).stdout), "--load") == first
    # Another loss is another run; a new --run-id is a fresh one.
    assert _save_dir(_run([*TRAIN, "train", "--dry-run", "--output-dir", out, "--loss", "grpo"])).endswith(
        "checkpoints/qwen3.6-35b-a3b-grpo")
    assert _save_dir(_run([*TRAIN, "train", "--dry-run", "--output-dir", out, "--run-id", "fresh-2"])).endswith(
        "checkpoints/fresh-2")
    assert "--run-id" in _run([*TRAIN, "train", "--help"]).stdout and "fresh run" in _run(
        [*TRAIN, "train", "--help"]).stdout


# ------------------------------------------------------------------- prepare: output dir, later OSErrors


def _release(tmp_path: Path) -> Path:
    """A small release in the documented layout: <split>.json beside databases/<db_id>/<db_id>.sqlite."""
    release = tmp_path / "release"
    (release / "databases").mkdir(parents=True)
    rows = json.loads((BIRD / "dev.json").read_text())
    for db_id in ("superhero", "toxicology"):
        (release / "databases" / db_id).mkdir()
        shutil.copyfile(BIRD / db_id / f"{db_id}.sqlite", release / "databases" / db_id / f"{db_id}.sqlite")
    (release / "validation.json").write_text(json.dumps([r for r in rows if r["db_id"] == "superhero"][:4]))
    (release / "arcwise.json").write_text(json.dumps([r for r in rows if r["db_id"] == "toxicology"][:3]))
    (release / "train.json").write_text(json.dumps([r for r in rows if r["db_id"] == "toxicology"][3:8]))
    return release


def test_an_unusable_output_dir_is_refused_before_any_work(tmp_path):
    release = _release(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")

    def prepare_into(out: Path) -> str:
        proc = _run([*TRAIN, "prepare", "--output-dir", str(out), "--data-release", str(release), "--skip-model"])
        assert proc.stdout == ""  # no conversion, no gold run: refused first
        return _one_line(proc, 1)

    assert "--output-dir" in prepare_into(a_file / "out")  # under a file: cannot be created
    assert "--output-dir" in prepare_into(a_file)  # a file itself
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "data").write_text("")  # a file where prepare keeps a directory
    assert "out/data" in prepare_into(tmp_path / "out")
    if os.geteuid() != 0:  # root writes anywhere: the permission case needs an ordinary user
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert "--output-dir" in prepare_into(locked / "out")
        assert "--output-dir" in prepare_into(locked)


def test_a_directory_where_a_split_file_goes_is_refused_before_any_work(tmp_path):
    out = tmp_path / "out"
    (out / "data" / "validation.jsonl").mkdir(parents=True)  # where the split file goes: a directory
    proc = _run([*TRAIN, "prepare", "--output-dir", str(out), "--data-release", str(_release(tmp_path)),
                 "--skip-model"])
    assert "validation.jsonl is a directory" in _one_line(proc, 2)  # t2sql.atomic's rule: exit 2
    assert proc.stdout == "" and not (out / "data" / "train.jsonl").exists()  # refused before converting


# -------------------------------------------------------------- downloads: one line, complete or absent

MODEL_REPO = ("model", train_flags.HF_REPO)


def _model_files() -> dict[str, bytes]:
    """A tiny checkpoint in Hugging Face's layout: config, index, two weight shards."""
    shards = {f"model-0000{i}-of-00002.safetensors": bytes([i]) * 200_000 for i in (1, 2)}
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    return {"config.json": b'{"model_type": "qwen3_5_moe"}', "model.safetensors.index.json": json.dumps(index).encode(),
            **shards}


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening, then closed: connections are refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def gpu_node(tmp_path) -> dict[str, str]:
    """What prepare's model step looks for on a training node, stood in: 8 GPUs in `nvidia-smi -L`, and a
    miles checkout whose convert_checkpoint keeps miles' contract (writes <dir_dst>/<model>_torch_dist, the
    tracker saying "release" last; a failing torchrun is a CalledProcessError, as miles' exec_command raises).
    The real conversion needs the GPUs and miles' image. Returns the env and flags that point at them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; done\n")
    smi.chmod(0o755)
    miles = tmp_path / "miles"
    pkg = miles / "miles" / "utils" / "external_utils"
    pkg.mkdir(parents=True)
    for d in (miles / "miles", miles / "miles" / "utils", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "command_utils.py").write_text('''
import json, os, subprocess
from pathlib import Path


def convert_checkpoint(model_name, megatron_model_type, num_gpus_per_node, dir_dst, hf_checkpoint, megatron_path,
                       **kw):
    with open(os.environ["STANDIN_LOG"], "a") as log:
        log.write(json.dumps({"dir_dst": dir_dst, "hf_checkpoint": hf_checkpoint}) + "\\n")
    assert (Path(hf_checkpoint) / "config.json").is_file()
    dst = Path(dir_dst) / f"{model_name}_torch_dist"
    (dst / "release").mkdir(parents=True, exist_ok=True)
    (dst / "release" / "__0_0.distcp").write_bytes(b"weights")
    if os.environ.get("STANDIN_CONVERT_FAILS"):
        subprocess.run(["false"], check=True)  # torchrun dies part way
    (dst / "latest_checkpointed_iteration.txt").write_text("release")


def execute_train(**kw):
    raise SystemExit("stand-in: execute_train must not run in tests")
''')
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "STANDIN_LOG": str(tmp_path / "convert.log"),
            "HF_HOME": str(tmp_path / "hf-home"), "miles": str(miles)}


def _prepare_model(out: Path, node: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    extra = {k: v for k, v in node.items() if k != "miles"}
    return _run([*TRAIN, "prepare", "--output-dir", str(out), "--skip-data", "--skip-disk-check",
                 "--miles-path", node["miles"]], **extra, **env)


def _train_missing(out: Path, node: dict[str, str]) -> str:
    """`train`'s refusal (its data is not prepared in these tests, so it never starts)."""
    extra = {k: v for k, v in node.items() if k != "miles"}
    proc = _run([*TRAIN, "train", "--output-dir", str(out), "--miles-path", node["miles"]], **extra)
    assert proc.returncode == 1 and "cannot start training" in proc.stderr and "Traceback" not in proc.stderr
    return proc.stderr


def _conversions(node: dict[str, str]) -> int:
    log = Path(node["STANDIN_LOG"])
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.mark.parametrize("offline", [False, True], ids=["connection-refused", "HF_HUB_OFFLINE"])
def test_prepare_without_network_says_what_failed_in_one_line(tmp_path, gpu_node, offline):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {"HF_ENDPOINT": endpoint, **({"HF_HUB_OFFLINE": "1"} if offline else {})}
    out = tmp_path / "out"
    data = _run([*TRAIN, "prepare", "--output-dir", str(out), "--skip-model", "--data-repo", "org/t2sql-release"],
                HF_HOME=gpu_node["HF_HOME"], **env)
    line = _one_line(data, 1)
    assert "org/t2sql-release" in line and "--data-release" in line
    assert ("HF_HUB_OFFLINE" in line) if offline else (endpoint in line and "network" in line)
    line = _one_line(_prepare_model(out, gpu_node, **env), 1)
    assert train_flags.HF_REPO in line and "--hf-checkpoint" in line
    assert ("HF_HUB_OFFLINE" in line) if offline else (endpoint in line and "Connection refused" in line)
    assert _conversions(gpu_node) == 0
    assert "checkpoint: " in _train_missing(out, gpu_node)


def test_a_failed_model_download_is_not_trusted_and_a_rerun_completes_it(tmp_path, gpu_node):
    out = tmp_path / "out"
    model_dir = out / "models" / train_flags.MODEL_NAME
    with Hub({MODEL_REPO: _model_files()}) as hub:
        hub.cut.add("model-00002-of-00002.safetensors")  # the connection drops in the middle of a shard
        line = _error_line(_prepare_model(out, gpu_node, HF_ENDPOINT=hub.url), 1)
        assert train_flags.HF_REPO in line and hub.url in line
        assert not checkpoint.is_complete(model_dir) and _conversions(gpu_node) == 0
        missing = _train_missing(out, gpu_node)
        assert f"checkpoint: {model_dir} not complete" in missing and "torch_dist checkpoint" in missing

        hub.cut.clear()
        proc = _prepare_model(out, gpu_node, HF_ENDPOINT=hub.url)
        assert proc.returncode == 0, proc.stderr
        record = json.loads((model_dir / checkpoint.COMPLETE).read_text())
        assert (record["repo_id"], record["commit"], record["files"]) == (train_flags.HF_REPO, COMMIT, 4)
        for name, content in _model_files().items():
            assert (model_dir / name).read_bytes() == content
        torch_dist = out / "models" / f"{train_flags.MODEL_NAME}_torch_dist"
        assert checkpoint.is_complete(torch_dist) and (torch_dist / "latest_checkpointed_iteration.txt").read_text() \
            == "release"
        assert [p.name for p in (out / "models").iterdir() if p.name.startswith(".")] == []  # no staging left
        missing = _train_missing(out, gpu_node)
        assert "checkpoint: " not in missing and "torch_dist" not in missing and "data: " in missing

        # A third run keeps both: no file is fetched again, nothing is converted again.
        hub.requests.clear()
        proc = _prepare_model(out, gpu_node, HF_ENDPOINT=hub.url)
        assert proc.returncode == 0 and "(kept)" in proc.stdout, proc.stderr
        assert hub.requests == [] and _conversions(gpu_node) == 1


def test_an_empty_leftover_checkpoint_directory_is_downloaded_into(tmp_path, gpu_node):
    out = tmp_path / "out"
    model_dir = out / "models" / train_flags.MODEL_NAME
    model_dir.mkdir(parents=True)  # what a failed download left before downloads were marked complete
    assert f"checkpoint: {model_dir} not complete" in _train_missing(out, gpu_node)
    with Hub({MODEL_REPO: _model_files()}) as hub:
        proc = _prepare_model(out, gpu_node, HF_ENDPOINT=hub.url)
    assert proc.returncode == 0, proc.stderr
    assert checkpoint.is_complete(model_dir) and (model_dir / "config.json").is_file()


def test_a_failed_conversion_is_redone_by_the_next_prepare(tmp_path, gpu_node):
    out = tmp_path / "out"
    torch_dist = out / "models" / f"{train_flags.MODEL_NAME}_torch_dist"
    with Hub({MODEL_REPO: _model_files()}) as hub:
        line = _error_line(_prepare_model(out, gpu_node, HF_ENDPOINT=hub.url, STANDIN_CONVERT_FAILS="1"), 1)
        assert "conversion failed" in line and "rerun" in line
        assert checkpoint.is_complete(out / "models" / train_flags.MODEL_NAME)  # the download itself finished
        assert not torch_dist.exists()  # the half-written conversion never took the target's name
        assert "torch_dist checkpoint" in _train_missing(out, gpu_node)
        proc = _prepare_model(out, gpu_node, HF_ENDPOINT=hub.url)
    assert proc.returncode == 0, proc.stderr
    assert _conversions(gpu_node) == 2 and checkpoint.is_complete(torch_dist)
    assert sorted(p.name for p in torch_dist.iterdir()) == [checkpoint.COMPLETE, "latest_checkpointed_iteration.txt",
                                                            "release"]
    assert "torch_dist" not in _train_missing(out, gpu_node)


def test_your_own_checkpoint_is_used_as_is(tmp_path, gpu_node):
    own = tmp_path / "my-checkpoint"
    own.mkdir()
    for name, content in _model_files().items():
        (own / name).write_bytes(content)
    before = sorted(own.iterdir())
    out = tmp_path / "out"
    with Hub({}) as hub:  # a Hub with nothing: prepare must not ask it
        proc = _prepare_model(out, gpu_node, HF_ENDPOINT=hub.url)
        proc = _run([*TRAIN, "prepare", "--output-dir", str(out), "--skip-data", "--skip-disk-check",
                     "--miles-path", gpu_node["miles"], "--hf-checkpoint", str(own)],
                    **{k: v for k, v in gpu_node.items() if k != "miles"}, HF_ENDPOINT=hub.url)
        assert proc.returncode == 0, proc.stderr
        assert not any(r.startswith("GET /" + train_flags.HF_REPO) for r in hub.requests)
    assert sorted(own.iterdir()) == before  # nothing written into it
    (own / "model-00002-of-00002.safetensors").unlink()
    proc = _run([*TRAIN, "prepare", "--output-dir", str(out), "--skip-data", "--hf-checkpoint", str(own)])
    assert "weight files" in _one_line(proc, 2)


def test_a_failed_data_download_is_resumed_and_then_converted(tmp_path):
    release = _release(tmp_path)
    files = {str(p.relative_to(release)): p.read_bytes() for p in sorted(release.rglob("*")) if p.is_file()}
    out = tmp_path / "out"
    env = {"HF_HOME": str(tmp_path / "hf-home")}
    args = [*TRAIN, "prepare", "--output-dir", str(out), "--skip-model", "--data-repo", "org/t2sql-release"]
    with Hub({("dataset", "org/t2sql-release"): files}) as hub:
        hub.cut.add("databases/superhero/superhero.sqlite")
        line = _error_line(_run(args, HF_ENDPOINT=hub.url, **env), 1)
        assert "org/t2sql-release" in line and "resumes" in line
        assert not checkpoint.is_complete(out / "data" / "release") and not (out / "data" / "train.jsonl").exists()
        hub.cut.clear()
        proc = _run(args, HF_ENDPOINT=hub.url, **env)
    assert proc.returncode == 0, proc.stderr
    assert checkpoint.is_complete(out / "data" / "release")
    assert len((out / "data" / "validation.jsonl").read_text().splitlines()) == 4


def test_a_closed_stdout_is_exit_141_not_success(tmp_path):
    # `t2sql-train train --dry-run | head -1`, with a reader that is gone before anything is written.
    command = (f"set -o pipefail; {shlex.quote(sys.executable)} -c "
               f"{shlex.quote('import sys; from t2sql.miles.train import main; sys.exit(main())')} train --dry-run "
               f"--output-dir {shlex.quote(str(tmp_path / 'out'))} 2> {shlex.quote(str(tmp_path / 'err'))} | true")
    proc = subprocess.run(["bash", "-c", command], env=_env(), timeout=120)
    assert proc.returncode == 141
    err = (tmp_path / "err").read_text()
    assert "Traceback" not in err and "Exception ignored" not in err, err


def test_training_doc_names_the_target_the_image_and_the_default_run_id():
    doc = (REPO / "docs" / "training.md").read_text()
    for fact in ("61.3", "90.2", "52.6", "90.0", "160 steps", "8×H200", "radixark/miles:latest", "31f1ca9",
                 "2e64d788b", train_flags.default_run_id("qwen3.6-35b-a3b", "cispo"),
                 train_flags.default_run_id("qwen3.6-35b-a3b", "grpo"), checkpoint.COMPLETE):
        assert fact in doc, fact
    assert "(a restart resumes)" not in doc
    env = (REPO / "tests" / "miles_env.sh").read_text()
    assert "31f1ca9" in env and "2e64d788b" in env  # the pair the doc names is the pair the test ran
