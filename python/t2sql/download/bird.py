"""BIRD's databases for the recipe's splits: which archive each split needs (train.zip for train and validation,
dev.zip for arcwise), where it comes from, and laying it out verified under
`<bird_dir>/<train|dev>_databases/<db_id>/<db_id>.sqlite`, or using a user's own complete copy as it is.
docs/training.md, "The recipe's data: task files shipped, databases from BIRD"."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from t2sql.download.archive import extract_databases
from t2sql.download.bounds import UnpackCeiling
from t2sql.download.http import bytes_to_fetch, download
from t2sql.download.integrity import database_problem
from t2sql.download.marker import describe_foreign, foreign_files, verified
from t2sql.errors import DataError, ForeignFilesError
from t2sql.progress import format_bytes
from t2sql.tasks import database_path, list_databases, load_questions

BIRD_URL = "https://bird-bench.oss-cn-beijing.aliyuncs.com"


@dataclass(frozen=True)
class BirdArchive:
    """One of BIRD's official archives and what t2sql takes from it."""

    file: str  # its name under the base URL
    size: int  # bytes, as BIRD's server announces it
    sha256: str | None  # pinned where independent projects agree on one (dev only); applied to BIRD's server only
    inner_member: str  # the databases zip inside it
    folder: str  # the laid-out folder under <bird_dir>, as in BIRD's layout
    databases_bytes: int  # the databases unpacked, for the disk check: an estimate (BIRD publishes none)

    def ceiling(self) -> UnpackCeiling:
        """The most bytes its inner zip's entries may unpack to in all (t2sql.download.bounds): twice the
        estimate, which leaves room for an estimate short of the truth and for macOS's files beside the
        databases, and stops an archive that is not BIRD's long before it fills a disk meant for BIRD."""
        return UnpackCeiling(2 * self.databases_bytes, f"twice the {format_bytes(self.databases_bytes)} that "
                             f"BIRD's {self.folder} are estimated at")


ARCHIVES: dict[str, BirdArchive] = {
    "dev": BirdArchive("dev.zip", 346_207_293,
                       "cdd6d19faeb45a23970b98d3ef6c40a87987c95459c2cf12076897a60cf5a630",
                       "dev_20240627/dev_databases.zip", "dev_databases", 2 * 10**9),
    "train": BirdArchive("train.zip", 8_919_543_554, None,
                         "train/train_databases.zip", "train_databases", 34 * 10**9),
}
# The recipe's split -> the BIRD archive whose databases it runs on.
SPLIT_ARCHIVE: dict[str, str] = {"train": "train", "validation": "train", "arcwise": "dev"}


@dataclass(frozen=True)
class LaidOut:
    archive: BirdArchive
    folder: Path  # <bird_dir>/<folder>, verified
    databases: list[str]
    note: str  # one line for prepare's summary


def archives_for(splits: Iterable[str]) -> list[BirdArchive]:
    """The archives the named splits need, each once, dev first (the small one)."""
    unknown = sorted(set(splits) - set(SPLIT_ARCHIVE))
    if unknown:
        raise DataError(f"no BIRD databases are known for split(s) {', '.join(unknown)}; the recipe's splits are "
                        f"{', '.join(SPLIT_ARCHIVE)} (pass --data-release PATH for data of your own)")
    names = {SPLIT_ARCHIVE[s] for s in splits}
    return [ARCHIVES[n] for n in ("dev", "train") if n in names]


def folder_for(bird_dir: Path, split: str) -> Path:
    return bird_dir / ARCHIVES[SPLIT_ARCHIVE[split]].folder


def _identity(a: BirdArchive) -> dict:
    # What a laid-out folder is the extraction of. The source URL and the size are left out on purpose: a mirror
    # serves the same databases (perhaps packed another way), so a folder laid out from one is as good as one
    # from BIRD's server; every database's size and sha256 are in the marker's manifest.
    return {"archive": a.file, "member": a.inner_member}


def disk_needs(bird_dir: Path, archives: Iterable[BirdArchive]) -> dict[str, int]:
    """Bytes still needed per archive (what remains to download + its databases), for those not laid out
    (nor the user's own copy: nothing is downloaded for it)."""
    needs = {}
    for a in archives:
        folder = bird_dir / a.folder
        if verified(folder, _identity(a)) or foreign_files(folder):
            continue
        needs[f"BIRD {a.file} (download)"] = bytes_to_fetch(_archive_path(bird_dir, a), a.size)
        needs[f"BIRD {a.folder} (unpacked, estimated)"] = a.databases_bytes
    return needs


def _archive_path(bird_dir: Path, a: BirdArchive) -> Path:
    return bird_dir / ".downloads" / a.file


def databases_needed(splits: Iterable[tuple[str, Path]]) -> dict[str, set[str]]:
    """For (split, question file) pairs: archive file -> the db_ids those splits' tasks name."""
    needed: dict[str, set[str]] = {}
    for split, questions in splits:
        rows, _ = load_questions(questions)
        needed.setdefault(ARCHIVES[SPLIT_ARCHIVE[split]].file, set()).update(str(r.get("db_id", "")) for _, r in rows)
    return needed


def fetch(bird_dir: Path, archives: Iterable[BirdArchive], needed: dict[str, set[str]], *,
          base_url: str | None = None, keep_archives: bool = False, progress: bool = True) -> list[LaidOut]:
    """Download and lay out each archive's databases, skipping those already verified and using the user's own
    copy where there is one (`needed`: archive file -> the db_ids it must hold, as databases_needed gives).
    Raises ForeignFilesError for a copy of the user's that is not complete, before anything is downloaded."""
    base = (base_url or BIRD_URL).rstrip("/")
    official = base == BIRD_URL
    laid = []
    for a in archives:
        folder = bird_dir / a.folder
        identity = _identity(a)
        if verified(folder, identity):
            laid.append(LaidOut(a, folder, list_databases(folder), f"{a.folder}: already laid out and verified"))
            continue
        if foreign := foreign_files(folder):
            laid.append(_user_copy(a, folder, foreign, sorted(needed.get(a.file, ()))))
            continue
        dest = _archive_path(bird_dir, a)
        # BIRD's server announces the size recorded here; a mirror may pack the same files another way, but not
        # into twice the bytes (the ceiling for a mirror that announces no size).
        # No fsync (durable=False): the extraction checks every byte of the archive again (each member's CRC32)
        # before anything is laid out, and the archive is deleted once it is; a power cut's damage is refused
        # there, never trusted, and the download runs at the disk's write-back speed, as curl's does.
        got = download(f"{base}/{a.file}", dest, expected_size=a.size if official else None, max_size=2 * a.size,
                       sha256=a.sha256 if official else None, progress=progress, durable=False)
        pin = ("sha256 pin checked" if got.sha256_checked else
               "no sha256 pin for this archive" if a.sha256 is None else
               f"sha256 pin not applied (from a mirror, not BIRD's server; sha256 {got.sha256})")
        result = extract_databases(dest, a.inner_member, folder, identity=identity, progress=progress,
                                   ceiling=a.ceiling())
        if not keep_archives:
            dest.unlink(missing_ok=True)
        laid.append(LaidOut(a, folder, result.databases,
                            f"{a.folder}: {len(result.databases)} databases, {format_bytes(result.bytes_written)} "
                            f"from {base}/{a.file} ({format_bytes(got.size)}; {pin})"))
    return laid


def _user_copy(a: BirdArchive, folder: Path, foreign: list[str], db_ids: list[str]) -> LaidOut:
    """The user's own copy at `folder`, checked as a laid-out one is (every database there, passing its
    integrity check) without writing there; ForeignFilesError when it falls short."""
    absent = [d for d in db_ids if not _nonempty_file(database_path(folder, d))]
    problems = []
    if absent:
        listed = ", ".join(absent[:10]) + (f", ... {len(absent)} in all" if len(absent) > 10 else "")
        problems.append(f"it lacks {len(absent)} of the {len(db_ids)} databases the chosen splits need ({listed})")
    else:
        bad = [f"{d}: {problem}" for d in db_ids if (problem := database_problem(database_path(folder, d)))]
        problems += bad[:5] + ([f"... {len(bad)} databases in all"] if len(bad) > 5 else [])
    if problems:
        raise ForeignFilesError(
            f"{folder}: {describe_foreign(folder, foreign, 'prepare')}, so prepare takes it for your own copy "
            f"of BIRD's {a.folder} and uses it only when it is complete; it is not: {'; '.join(problems)}. prepare "
            f"deletes nothing it did not write and lays nothing out over it: complete the copy there, or move those "
            f"files out of {folder} (prepare then downloads {a.file} and lays out its databases there), or leave "
            "it and pass --data-release DIR (data of your own) or another --output-dir", folder=str(folder),
            files=foreign)
    return LaidOut(a, folder, list_databases(folder),
                   f"{a.folder}: your own copy, used as it is ({len(db_ids)} databases the chosen splits need, each "
                   "passing PRAGMA quick_check; nothing written or deleted there)")


def _nonempty_file(path: Path) -> bool:
    try:
        return path.is_file() and path.stat().st_size > 0
    except OSError:
        return False


def missing_databases(questions: Path, db_root: Path) -> Counter:
    """db_id -> task count, for the tasks of `questions` whose database is not under `db_root`."""
    rows, _ = load_questions(questions)
    wanted = Counter(str(row.get("db_id", "")) for _, row in rows)
    return Counter({d: n for d, n in wanted.items() if not database_path(db_root, d).is_file()})


def describe_missing(split: str, missing: Counter, db_root: Path, shown: int = 20) -> str:
    items = sorted(missing.items())
    listed = ", ".join(f"{d} ({n} task{'s' if n != 1 else ''})" for d, n in items[:shown])
    if len(items) > shown:
        listed += f", ... and {len(items) - shown} more"
    return (f"{split}: {len(missing)} database(s) its tasks name are not in {db_root}, "
            f"{sum(missing.values())} tasks in all: {listed}")
