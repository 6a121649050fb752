"""What `t2sql-train prepare` downloads from the Hugging Face Hub (the checkpoint; a data release with
--data-repo) and the checkpoint's torch_dist conversion: each complete or absent. A finished download or
conversion gets a record written last, atomically (COMPLETE); anything without one is resumed or redone
on the next run, never trusted."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
from pathlib import Path

from t2sql.atomic import write_bytes_atomic
from t2sql.errors import LaunchError
from t2sql.miles.flags import HF_REPO, MEGATRON_MODEL_TYPE, MODEL_NAME, TrainConfig

COMPLETE = ".t2sql-complete.json"  # in a downloaded or converted directory, written last, atomically


def is_complete(path: Path) -> bool:
    """Whether prepare finished and verified the download or conversion in `path`."""
    return (path / COMPLETE).is_file()


def mark_complete(path: Path, record: dict) -> None:
    record = {**record, "completed": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    write_bytes_atomic(path / COMPLETE, (json.dumps(record, indent=1) + "\n").encode())


def own_checkpoint_problems(path: Path) -> list[str]:
    """What is wrong with a checkpoint passed as --hf-checkpoint (the user's own copy, used as is)."""
    if not path.is_dir():
        return [f"--hf-checkpoint {path}: not a directory (drop --hf-checkpoint to let prepare download "
                f"{HF_REPO} into <output-dir>/models)"]
    if not (path / "config.json").is_file():
        return [f"--hf-checkpoint {path}: no config.json there; pass the directory of a Hugging Face checkpoint"]
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return [f"--hf-checkpoint {path}: cannot read {index.name} ({e})"]
        absent = [s for s in shards if not (path / s).is_file()]
        if absent:
            return [f"--hf-checkpoint {path}: {len(absent)} of {len(shards)} weight files named in {index.name} "
                    f"are missing (first: {absent[0]})"]
    return []


def _hub():
    try:
        import huggingface_hub
    except ImportError:
        raise LaunchError("huggingface_hub is not installed: pip install 'huggingface_hub' (or t2sql[train])") from None
    return huggingface_hub


def download_repo(repo_id: str, target: Path, *, repo_type: str | None, instead: str) -> str:
    """Download Hub repository `repo_id` into `target` and mark it complete once every listed file is
    there with its listed size. A rerun resumes an unfinished one (huggingface_hub keeps its partial
    files under `target`/.cache); a complete one is kept. `instead`: the local alternative, for the
    message when the Hub cannot be used. Returns what was done, for prepare's summary."""
    if is_complete(target):
        try:
            had = json.loads((target / COMPLETE).read_text(encoding="utf-8")).get("repo_id")
        except (OSError, ValueError, AttributeError):
            had = None
        if had not in (None, repo_id):
            raise LaunchError(f"{target} holds {had}, not {repo_id}; move it away (or choose another --output-dir) "
                              f"to download {repo_id}")
        return f"{repo_id}: complete in {target} (kept)"
    hub = _hub()
    from huggingface_hub.hf_api import RepoFile

    endpoint = hub.constants.ENDPOINT
    try:
        api = hub.HfApi()
        commit = api.repo_info(repo_id, repo_type=repo_type).sha
        listed = {f.path: (f.lfs.size if f.lfs is not None else f.size)
                  for f in api.list_repo_tree(repo_id, repo_type=repo_type, revision=commit, recursive=True)
                  if isinstance(f, RepoFile)}
        target.mkdir(parents=True, exist_ok=True)
        hub.snapshot_download(repo_id, repo_type=repo_type, revision=commit, local_dir=str(target))
    except Exception as e:  # the Hub's and the network's errors, in every version: one line, never a traceback
        raise LaunchError(download_failure(e, repo_id, repo_type, endpoint, target, instead)) from None
    if not listed:
        raise LaunchError(f"{repo_id} on {endpoint} lists no files; check the repository id")
    wrong = [p for p, size in sorted(listed.items())
             if not (target / p).is_file() or (size is not None and (target / p).stat().st_size != size)]
    if wrong:
        raise LaunchError(f"download of {repo_id} into {target} is not complete: {len(wrong)} of {len(listed)} "
                          f"files missing or of the wrong size (first: {wrong[0]}); rerun `t2sql-train prepare` "
                          "to resume it")
    mark_complete(target, {"repo_id": repo_id, "repo_type": repo_type or "model", "commit": commit,
                           "endpoint": endpoint, "files": len(listed),
                           "bytes": sum(size or 0 for size in listed.values())})
    return f"{repo_id}@{commit[:12]} -> {target} ({len(listed)} files)"


def download_failure(error: BaseException, repo_id: str, repo_type: str | None, endpoint: str, target: Path,
                     instead: str) -> str:
    """One line: what failed (the repository, the endpoint) and what to do."""
    from huggingface_hub import constants, errors

    what = f"{'dataset' if repo_type == 'dataset' else 'model'} {repo_id}"
    resume = "; a rerun of `t2sql-train prepare` resumes the download"
    if isinstance(error, errors.OfflineModeIsEnabled) or constants.HF_HUB_OFFLINE:
        return (f"cannot download {what}: HF_HUB_OFFLINE is set, so huggingface_hub makes no requests; unset "
                f"HF_HUB_OFFLINE, or {instead}")
    if isinstance(error, errors.GatedRepoError):
        return (f"cannot download {what} from {endpoint}: the repository is gated; accept its terms on the Hub "
                "and log in (`hf auth login`, or HF_TOKEN)")
    if isinstance(error, errors.RepositoryNotFoundError):
        return (f"cannot download {what}: {endpoint} has no such repository, or it needs a login; check the "
                f"id, log in (`hf auth login`, or HF_TOKEN) if it is private, or {instead}")
    root = error
    for _ in range(20):  # the first cause: what the network or the disk said
        nxt = root.__cause__ or (None if root.__suppress_context__ else root.__context__)
        if nxt is None:
            break
        root = nxt
    if isinstance(error, errors.HfHubHTTPError) and getattr(error, "response", None) is not None:
        status = error.response.status_code
        return f"cannot download {what}: {endpoint} answered HTTP {status}; try again later, or {instead}{resume}"
    reason = (str(root).strip().splitlines() or [""])[0][:200]
    if isinstance(root, OSError) and root.errno is not None and root.filename:
        return f"cannot download {what} into {target}: {root.strerror}: {root.filename}{resume}"
    return (f"cannot download {what} from {endpoint} ({type(root).__name__}: {reason}); check the network "
            f"(and HF_ENDPOINT, proxy settings), or {instead}{resume}")


TRACKER = "latest_checkpointed_iteration.txt"  # Megatron's; miles' converter writes "release" into it last


def _converted(path: Path) -> bool:
    tracker = path / TRACKER
    try:
        return tracker.read_text(encoding="utf-8").strip() == "release" and (path / "release").is_dir()
    except OSError:
        return False


def convert_torch_dist(c: TrainConfig, command_utils) -> str:
    """The torch_dist conversion with miles' own convert_checkpoint, in a temporary directory beside
    the target, renamed into place once miles' converter wrote its last step."""
    target = c.torch_dist_path
    record = {"hf_checkpoint": str(c.hf_checkpoint_path), "megatron_model_type": MEGATRON_MODEL_TYPE}
    if is_complete(target):
        return f"{target} (kept)"
    if target.is_dir() and _converted(target):  # converted by miles itself, or by an earlier t2sql
        mark_complete(target, record)
        return f"{target} (found converted: tracker says release)"
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()  # an empty leftover
    elif target.exists():
        raise LaunchError(f"{target} holds an unfinished conversion (its {TRACKER} does not say 'release'); "
                          "remove it and rerun `t2sql-train prepare` to convert again")
    staging = target.parent / f".{target.name}.partial"  # only prepare writes here: redone from scratch
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        command_utils.convert_checkpoint(
            model_name=MODEL_NAME,
            megatron_model_type=MEGATRON_MODEL_TYPE,
            num_gpus_per_node=c.num_gpus_per_node,
            dir_dst=str(staging),
            hf_checkpoint=str(c.hf_checkpoint_path),
            megatron_path=c.megatron_path,
        )
    except subprocess.CalledProcessError as e:
        raise LaunchError(f"checkpoint conversion failed (exit {e.returncode}; its output is above); rerun "
                          "`t2sql-train prepare` to convert again") from None
    produced = staging / target.name  # miles writes <dir_dst>/<model_name>_torch_dist
    if not _converted(produced):
        raise LaunchError(f"checkpoint conversion ended without its last step ({TRACKER} saying 'release' "
                          f"in {produced}); rerun `t2sql-train prepare` to convert again")
    mark_complete(produced, record)
    os.replace(produced, target)
    shutil.rmtree(staging)
    return str(target)
