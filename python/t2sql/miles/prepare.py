"""`t2sql-train prepare`: disk check, BIRD's databases, the data release as miles jsonl, manifests, the gold cache,
the equivalence check's invariants and the checkpoint, each download and conversion complete or absent (resumed
or redone by the next run). docs/training.md, "1. `t2sql-train prepare`"."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from t2sql.atomic import OutputFile
from t2sql.data import convert as data
from t2sql.download import bird
from t2sql.equivalence.mine_ahead import mine_ahead
from t2sql.errors import DataError, ForeignFilesError, LaunchError, cap_lines
from t2sql.grading import describe_methods
from t2sql.home import made_default_dir
from t2sql.miles.checkpoint import convert_torch_dist, download_repo, is_complete, own_checkpoint_problems
from t2sql.miles.flags import (
    CISPO_LOSS_PATH,
    HF_REPO,
    SPLITS,
    TrainConfig,
)
from t2sql.progress import Progress, format_bytes
from t2sql.serving.golds import GoldTask, run_golds
from t2sql.serving.grader import Grader
from t2sql.serving.manifest import Manifest, manifest_output
from t2sql.tasks import Task, parse_field_map, release_dir

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
    if c.hf_checkpoint:
        missing += [f"checkpoint: {p}" for p in own_checkpoint_problems(c.hf_checkpoint_path)]
    elif not is_complete(c.hf_checkpoint_path):
        state = "not complete" if c.hf_checkpoint_path.exists() else "not found"
        missing.append(f"checkpoint: {c.hf_checkpoint_path} {state} (run `t2sql-train prepare`; "
                       "it resumes an unfinished download)")
    if not is_complete(c.torch_dist_path):
        missing.append(f"torch_dist checkpoint: {c.torch_dist_path} not converted (run `t2sql-train prepare`)")
    probe = c.save_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not (probe.is_dir() and os.access(probe, os.W_OK | os.X_OK)):
        missing.append(f"checkpoints: {c.save_dir} cannot be created ({probe} is not a directory you can write); "
                       "choose another --output-dir")
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
        parts = " + ".join(f"{name} {format_bytes(n)}" for name, n in needs.items())
        raise LaunchError(
            f"not enough free disk on {path}: need {format_bytes(total)} ({parts}), "
            f"free {format_bytes(free)}. Free {format_bytes(total - free)} more, choose another --output-dir, or "
            "skip parts (--skip-model / --skip-data) that are already in place."
        )


def import_miles_command_utils(c: TrainConfig):
    if not miles_available(c):
        raise LaunchError(
            f"miles: no source checkout at {c.miles_path}; convert_checkpoint and execute_train come from "
            "miles.utils.external_utils.command_utils (use miles' Docker image, or pass --miles-path)"
        )
    for p in (c.miles_path, c.megatron_path):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        import miles.utils.external_utils.command_utils as command_utils  # noqa: PLC0415
    except ImportError as e:  # a dependency of miles' (ray, ...) that this Python lacks
        raise LaunchError(f"miles at {c.miles_path} cannot be imported ({e}); run inside miles' Docker image") from None
    return command_utils


def check_output_dir(root: Path, parts: tuple[Path, ...] = ()) -> None:
    """Create --output-dir (its parent must exist: no folders made from the root up) and prove a file
    can be written there, before any work; `parts` (its subdirectories) must be directories or absent.
    A LaunchError saying what to do otherwise."""
    if root.exists() and not root.is_dir():
        raise LaunchError(f"--output-dir {root}: exists and is not a directory; choose another --output-dir")
    if not root.exists():
        if not root.parent.is_dir():
            raise LaunchError(f"--output-dir {root}: its parent {root.parent} is not a directory; create it "
                              "first, or choose another --output-dir")
        try:
            root.mkdir(exist_ok=True)
        except OSError as e:
            raise LaunchError(f"--output-dir {root}: cannot create it ({e.strerror}); choose a directory "
                              "you can write, or fix its permissions") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".t2sql-write-test.", dir=root)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise LaunchError(f"--output-dir {root}: cannot write there ({e.strerror}); choose a directory you can "
                          "write, or fix its permissions") from None
    for part in parts:
        if part.exists() and not part.is_dir():
            raise LaunchError(f"{part} is in the way: prepare keeps a directory there; move it, or choose "
                              "another --output-dir")


class SplitOutputs(NamedTuple):
    """The files prepare writes for one split, under t2sql.atomic's rule: data/<split>.jsonl and
    data/<split>.manifest.json. What an earlier prepare (or convert, or gold) wrote there is replaced;
    anything else only with --force."""

    rows: OutputFile
    manifest: OutputFile


def split_outputs(c: TrainConfig, splits: list[str], force: bool) -> dict[str, SplitOutputs]:
    """Each split's outputs, checked now (before any download): OutputPathError for one in the way."""
    instead = "move it away, or choose another --output-dir"
    outputs = {split: SplitOutputs(
        data.converted_output(c.split_path(split), flag="split file", force=force, instead=instead),
        manifest_output(c.data_dir / f"{split}.manifest.json", flag="manifest", force=force, instead=instead))
        for split in splits}
    if c.data_dir.is_dir():  # else prepare makes it, empty
        for output in outputs.values():
            output.rows.check()
            output.manifest.check()
    return outputs


def write_manifests(c: TrainConfig, split_roots: dict[str, Path],
                    outputs: dict[str, SplitOutputs] | None = None) -> list[Path]:
    """data/<split>.manifest.json: size, mtime and sha256 of every database a split uses
    (t2sql.serving.manifest's format; pass one to a Grader to refuse databases changed since prepare)."""

    written = []
    for split, db_root in split_roots.items():
        path = c.split_path(split)
        with path.open(encoding="utf-8") as f:
            db_ids = sorted({Task.from_row(json.loads(line)).db_id for line in f if line.strip()})
        out = outputs[split].manifest if outputs else manifest_output(c.data_dir / f"{split}.manifest.json")
        Manifest.build(db_root, db_ids).save(out)
        written.append(out.path)
    return written


def precompute_gold(c: TrainConfig, concurrency: int | None = None) -> str:
    """Run every gold query once through the Grader (t2sql.serving.golds, as `t2sql gold` does),
    filling the on-disk gold cache that the training run's Grader reads (--text-to-sql-cache-dir).
    Failures are reported, not fatal: convert already refused gold that fails to run, so a failure
    here is a timeout to look at."""
    import asyncio

    preset = c.resolved_preset()
    tasks = []
    for split in SPLITS:
        path = c.split_path(split)
        if path.is_file():
            with path.open(encoding="utf-8") as f:
                tasks += [GoldTask.of(n, Task.from_row(json.loads(line))) for n, line in enumerate(f, 1)]

    async def run_all() -> list:
        async with Grader(concurrency=concurrency, cache_dir=c.cache_dir,
                          grade_timeout_s=preset.grading.timeout_s) as grader:
            with Progress(len(tasks), "gold cache") as bar:
                return await run_golds(tasks, grader, preset.grade_spec, on_done=bar.advance)

    started = time.perf_counter()
    records = asyncio.run(run_all())
    elapsed = time.perf_counter() - started
    failed = [r for r in records if r.failed]
    for line in cap_lines([f"gold {r.question_id}: {r.source}: {r.error}" for r in failed]):
        print(line, file=sys.stderr)
    slowest = max((r.seconds or 0.0 for r in records), default=0.0)
    slow = f", slowest {slowest:.2f}s" if slowest > 0 else ""
    return f"{len(records) - len(failed)}/{len(records)} gold digests in {c.cache_dir} ({elapsed:.1f}s{slow})"


def mine_invariants(c: TrainConfig) -> str:
    """Mine the equivalence check's invariants of every database the splits use (t2sql.equivalence.mine_ahead,
    as `t2sql gold` does) into the cache the training run's checks read: a check on a database not mined
    is skipped (not_ready)."""
    paths = []
    for split in SPLITS:
        path = c.split_path(split)
        if path.is_file():
            with path.open(encoding="utf-8") as f:
                paths += [Task.from_row(json.loads(line)).db_path for line in f]
    mined = mine_ahead([p for p in paths if p], concurrency=os.cpu_count() or 1)
    for line in cap_lines(mined.problems()):
        print(f"note: {line}", file=sys.stderr)
    return mined.line()


def check_task_files(c: TrainConfig, args: argparse.Namespace, fields: dict[str, str]) -> None:
    """The shipped task files' checks that need no database (t2sql.data.convert.check_questions), before
    BIRD's archives are downloaded: a problem is a DataError naming each task, unless --drop-invalid (the
    conversion then drops those tasks and lists them)."""
    if args.drop_invalid:
        return
    for split, questions, _ in data.release_splits(release_dir(), args.splits):
        problems = data.check_questions(questions, split=split, fields=fields, preset=c.preset,
                                        method_fallback=args.grading_method_fallback)
        if problems:
            raise DataError(f"{questions}: {len(problems)} problem(s), found before downloading BIRD's databases; "
                            "nothing downloaded or written (fix them, or pass --drop-invalid to convert only "
                            "the valid tasks)", problems)


def bird_splits(c: TrainConfig, args: argparse.Namespace) -> tuple[list[tuple[str, Path, Path]], list[str]]:
    """(split, question file, database root) for the shipped task files, after laying out BIRD's databases
    they run on under <output-dir>/data/bird (or finding the user's own copy there: t2sql.download.bird); and
    one note per archive. A database a split's tasks name that is not there is an error naming it with its
    task count (a note with --drop-invalid, which then converts the tasks that can run)."""

    shipped = data.release_splits(release_dir(), args.splits)
    needed = bird.databases_needed((split, questions) for split, questions, _ in shipped)
    laid = bird.fetch(c.bird_dir, bird.archives_for(args.splits), needed, base_url=args.bird_url,
                      keep_archives=args.keep_archives)
    for x in laid:  # at once: what was fetched and checked stands even when a split fails below
        print(f"BIRD databases  {x.note}", flush=True)
    splits, missing = [], []
    for split, questions, _ in shipped:
        db_root = bird.folder_for(c.bird_dir, split)
        if lacking := bird.missing_databases(questions, db_root):
            missing.append(bird.describe_missing(split, lacking, db_root))
        splits.append((split, questions, db_root))
    if missing and not args.drop_invalid:
        raise DataError("; ".join(missing) + ". The archive lacks them: use another --bird-url, or pass "
                        "--drop-invalid to convert only the tasks whose databases are there")
    for text in missing:
        print(f"note: {text}; --drop-invalid drops their tasks", file=sys.stderr)
    return splits, [f"{x.folder} ({len(x.databases)} databases)" for x in laid]


def check_prepare_args(c: TrainConfig, args: argparse.Namespace) -> dict[str, str]:
    """prepare's usage errors, before anything runs (LaunchError/DataError: exit 2). Returns the field map."""
    if args.skip_model and args.skip_data:
        raise LaunchError("--skip-model and --skip-data together leave nothing to prepare; drop one")
    if not args.skip_data:
        if args.data_release and not Path(args.data_release).is_dir():
            raise LaunchError(f"--data-release {args.data_release}: not a directory (a local copy of the "
                              "data release)")
    if c.hf_checkpoint and not args.skip_model and (problems := own_checkpoint_problems(c.hf_checkpoint_path)):
        raise LaunchError(problems[0])
    return parse_field_map(args.field_map)


def prepare(c: TrainConfig, args: argparse.Namespace, fields: dict[str, str]) -> int:
    """`fields`: check_prepare_args' field map (main runs that first: its errors are usage errors)."""

    # Fail before anything is written when the model step cannot run here.
    if not args.skip_model:
        gpus = count_gpus()
        if gpus < c.num_gpus_per_node:
            raise LaunchError(
                f"checkpoint conversion runs torchrun on {c.num_gpus_per_node} GPUs; found {gpus}. "
                "Run prepare on the training node, or pass --skip-model to prepare only the data."
            )
        import_miles_command_utils(c)
    if getattr(args, "output_dir", None) is None:  # the default: made with its parents under $T2SQL_HOME
        made_default_dir("train")
    check_output_dir(c.root, (c.data_dir, c.model_dir, c.cache_dir))
    outputs = split_outputs(c, args.splits, args.force) if not args.skip_data else {}
    if not args.skip_data and not args.data_release and not args.data_repo:
        check_task_files(c, args, fields)
    needs = {}
    if not args.skip_model:
        if not c.hf_checkpoint and not is_complete(c.hf_checkpoint_path):
            needs["hf checkpoint"] = DISK_NEEDS["hf checkpoint"]
        if not is_complete(c.torch_dist_path):
            needs["torch_dist checkpoint"] = DISK_NEEDS["torch_dist checkpoint"]
    if not args.skip_data and args.data_repo and not is_complete(c.release_dir):
        needs["data release"] = DISK_NEEDS["data release"]
    if not args.skip_data and not args.data_release and not args.data_repo:
        needs.update(bird.disk_needs(c.bird_dir, bird.archives_for(args.splits)))
    if needs and not args.skip_disk_check:
        check_disk(c.root, needs)

    steps: list[tuple[str, str]] = []
    if not args.skip_data:
        if args.data_release:
            splits = data.release_splits(Path(args.data_release), args.splits)
        elif args.data_repo:
            steps.append(("download data", download_repo(
                args.data_repo, c.release_dir, repo_type="dataset",
                instead="pass --data-release PATH (a local copy of the data release)")))
            splits = data.release_splits(c.release_dir, args.splits)
        else:  # the task files t2sql ships, on BIRD's databases fetched from BIRD (or --bird-url)
            try:
                splits, notes = bird_splits(c, args)
            except ForeignFilesError as e:  # files of the user's where prepare would lay out: a usage error
                print(f"t2sql-train prepare: {e}", file=sys.stderr)
                return 2
            steps.extend(("BIRD databases", note) for note in notes)
        reports = []
        split_roots: dict[str, Path] = {}
        built: list[tuple[str, list[dict]]] = []
        # Validate every split before writing any, so a bad split leaves nothing half-done.
        for split, questions, db_root in splits:
            report, rows = data.convert_split(
                questions, db_root, None, split=split, fields=fields, preset=c.preset,
                gold_timeout_s=args.timeout_s, drop_invalid=args.drop_invalid,
                method_fallback=args.grading_method_fallback,
            )
            if not rows:  # every task dropped: a split miles cannot train or evaluate on
                raise DataError(f"{split}: none of its {report.rows_in} tasks can be converted "
                                f"({len(report.problems)} problems, e.g. {report.problems[0]}); fix the data or "
                                f"leave the split out (--splits)" if report.problems else
                                f"{split}: the question file holds no task")
            reports.append(report)
            split_roots[split] = db_root
            built.append((split, rows))
        c.data_dir.mkdir(exist_ok=True)  # prepare's own folder, under --output-dir (made above)
        for split, rows in built:
            data.write_jsonl_atomic(outputs[split].rows, rows)
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
        manifests = write_manifests(c, split_roots, outputs)
        steps.append(("database manifest", ", ".join(str(m) for m in manifests)))
        steps.append(("gold", precompute_gold(c)))
        steps.append(("invariants", mine_invariants(c)))
    if not args.skip_model:
        command_utils = import_miles_command_utils(c)
        if not c.hf_checkpoint:  # --hf-checkpoint is the user's own copy, used as is
            steps.append(("download checkpoint", download_repo(
                HF_REPO, c.hf_checkpoint_path, repo_type=None,
                instead=f"pass --hf-checkpoint PATH (a local copy of {HF_REPO})")))
        steps.append(("convert checkpoint", convert_torch_dist(c, command_utils)))
    width = max((len(s) for s, _ in steps), default=0)
    for step, what in steps:
        print(f"{step.ljust(width)}  {what}")
    return 0
