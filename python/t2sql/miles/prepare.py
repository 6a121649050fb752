"""`t2sql-train prepare`: disk check, checkpoints, the data release as miles jsonl, manifests, the gold cache."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from t2sql.errors import LaunchError
from t2sql.miles.flags import (
    CISPO_LOSS_PATH,
    HF_REPO,
    MEGATRON_MODEL_TYPE,
    MODEL_NAME,
    SPLITS,
    TrainConfig,
    _preset,
)

# Disk that `prepare` needs, in bytes (bf16 weights of 35B parameters ~ 72 GB, the same again for
# torch_dist, and the release's databases). Checkpoints saved during training come on top.
DISK_NEEDS = {"hf checkpoint": 72 * 10**9, "torch_dist checkpoint": 72 * 10**9, "data release": 40 * 10**9}


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
    """Run every gold query once through the Grader (t2sql.serving.golds, as `t2sql gold` does),
    filling the on-disk gold cache that the training run's Grader reads (--text-to-sql-cache-dir).
    Failures are reported, not fatal: convert already refused gold that fails to run, so a failure
    here is a timeout to look at."""
    import asyncio

    from t2sql.progress import Progress
    from t2sql.serving.golds import GoldTask, run_golds
    from t2sql.serving.grader import Grader

    preset = _preset(c)
    tasks = []
    for split in SPLITS:
        path = c.split_path(split)
        if path.is_file():
            with path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    row = json.loads(line)
                    label = row["label"]
                    tasks.append(GoldTask(n, label["question_id"], label.get("db_id", ""), label["gold_sql"],
                                          row["metadata"]["db_path"], method=label.get("grading_method")))

    async def run_all() -> list:
        async with Grader(concurrency=concurrency, cache_dir=c.cache_dir,
                          grade_timeout_s=preset.grade_timeout_s) as grader:
            with Progress(len(tasks), "gold cache") as bar:
                return await run_golds(tasks, grader, semantics=lambda t: preset.method_for(t.method),
                                       float_digits=preset.float_digits, timeout_s=preset.grade_timeout_s,
                                       on_done=bar.advance, column_order=preset.column_order)

    started = time.perf_counter()
    records = asyncio.run(run_all())
    elapsed = time.perf_counter() - started
    failed = [r for r in records if r.failed]
    for r in failed:
        print(f"gold {r.question_id}: {r.source}: {r.error}", file=sys.stderr)
    slowest = max((r.seconds or 0.0 for r in records), default=0.0)
    slow = f", slowest {slowest:.2f}s" if slowest > 0 else ""
    return f"{len(records) - len(failed)}/{len(records)} gold digests in {c.cache_dir} ({elapsed:.1f}s{slow})"


def prepare(c: TrainConfig, args: argparse.Namespace) -> int:
    from t2sql.data import convert as data
    from t2sql.data import tasks as data_tasks
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
        fields = data_tasks.parse_field_map(args.field_map)
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
            for note in r.fallbacks:
                print(f"note: {r.split}: {note}", file=sys.stderr)
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
