"""The marker of a folder t2sql laid out, `<target>/.t2sql-extracted.json` (a database manifest plus the archive's
identity and every file laid out): whether the folder still holds it (`verified`), which files t2sql wrote and so
may delete (`remove_laid_out`), and which it did not (`foreign_files`).
docs/development.md, "How `download/` reads BIRD's zips"."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from t2sql import jsonl
from t2sql.atomic import atomic_write
from t2sql.serving.manifest import Manifest, ManifestEntry

__all__ = ["MARKER", "MARKER_FORMAT", "describe_foreign", "foreign_files", "marker_holds", "read_marker",
           "recorded_identity", "remove_laid_out", "verified", "write_marker"]

MARKER = ".t2sql-extracted.json"
MARKER_FORMAT = 2  # 2: "files" lists every file laid out; 1 (still read) listed the databases only


def recorded_identity(identity: dict) -> dict:
    """The identity as it reads back from JSON, so a tuple and a list compare equal."""
    return json.loads(json.dumps(identity, sort_keys=True))


def write_marker(folder: Path, target: Path, entries: dict[str, ManifestEntry], *, identity: dict,
                 inner_member: str, bytes_written: int, files: list[str]) -> None:
    """Write the marker into `folder` (atomically), for the databases `entries` and every file in `files`
    laid out there from `inner_member`, as they will lie once `folder` is renamed to `target`."""
    data = Manifest(target, entries).to_dict()
    data["extracted"] = {"format": MARKER_FORMAT, "identity": identity, "inner_member": inner_member,
                         "bytes_written": bytes_written, "files": sorted(files)}
    with atomic_write(folder / MARKER) as f:
        f.write(json.dumps(data, indent=1) + "\n")


def read_marker(target: Path) -> dict | None:
    """The marker's identity, databases ({db_id: (relative path, size)}) and files (every file t2sql laid out
    there, relative; a format-1 marker's are its databases), or None."""
    try:
        extracted = jsonl.loads((target / MARKER).read_bytes())["extracted"]
        if extracted.get("format") not in (1, MARKER_FORMAT):
            return None
        manifest = Manifest.load(target / MARKER, db_root=target)
        databases = {db_id: (e.path, e.size) for db_id, e in manifest.entries.items()}
        files = extracted["files"] if extracted["format"] == MARKER_FORMAT else [p for p, _ in databases.values()]
        if not all(isinstance(f, str) and _inside(f) for f in files):
            return None  # not a marker t2sql wrote: nothing in it may name what to delete
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {"identity": extracted.get("identity"), "databases": databases, "files": files}


def _inside(relative: str) -> bool:
    """A relative path that stays inside its folder ("a/b.csv", not "/x", "../x" or "a/../../x")."""
    parts = relative.split("/")
    return bool(relative) and not relative.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def marker_holds(target: Path, marker: dict, identity: dict) -> bool:
    if marker["identity"] != identity or not marker["databases"]:
        return False
    for relative, size in marker["databases"].values():
        try:
            if (target / relative).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


def verified(target: Path, identity: dict) -> bool:
    """The marker is there, records this `identity`, and every database it lists is present with the size
    it recorded (sizes only: the sha256 is not recomputed)."""
    target = Path(target).absolute()
    marker = read_marker(target)
    return marker is not None and marker_holds(target, marker, recorded_identity(identity))


def _own_folders(files: list[str]) -> set[str]:
    """The folders on the way to `files` (relative, without the root itself)."""
    return {"/".join(f.split("/")[:k]) for f in files for k in range(1, f.count("/") + 1)}


def foreign_files(target: Path) -> list[str]:
    """What `target` holds that t2sql did not lay out there, relative to it and sorted: each file, link or
    other non-folder its marker does not list, and each folder on no listed file's way (named once with a
    trailing "/", not walked into). Everything, when it has no marker; ["."] when `target` itself is a link
    or not a folder; [] when it does not exist."""
    target = Path(target).absolute()
    if not os.path.lexists(target):
        return []
    if target.is_symlink() or not target.is_dir():
        return ["."]
    marker = read_marker(target)
    own = set(marker["files"]) | {MARKER} if marker is not None else set()
    folders = _own_folders(list(own))
    foreign = []
    for dirpath, dirnames, filenames in os.walk(target):
        here = Path(dirpath).relative_to(target).as_posix()
        prefix = "" if here == "." else here + "/"
        for name in list(dirnames):
            if prefix + name not in folders or os.path.islink(os.path.join(dirpath, name)):
                foreign.append(prefix + name + ("" if os.path.islink(os.path.join(dirpath, name)) else "/"))
                dirnames.remove(name)
        for name in filenames:
            path = os.path.join(dirpath, name)
            if prefix + name not in own or os.path.islink(path) or not os.path.isfile(path):
                foreign.append(prefix + name)
    return sorted(foreign)


def describe_foreign(target: Path, foreign: list[str], writer: str = "t2sql", shown: int = 10) -> str:
    """`foreign_files(target)` for a message ("it holds NOTES.txt, which t2sql did not write"): the first
    `shown` names and how many in all."""
    if foreign == ["."]:
        return f"it is a link to {os.readlink(target)}" if os.path.islink(target) else "it is not a folder"
    if len(foreign) == 1:
        return f"it holds {foreign[0]}, which {writer} did not write"
    more = f", ... {len(foreign)} in all" if len(foreign) > shown else ""
    return f"it holds {len(foreign)} files or folders {writer} did not write ({', '.join(foreign[:shown])}{more})"


def remove_laid_out(folder: Path) -> None:
    """Delete what t2sql laid out in `folder` (the files its marker lists, then the marker, then the folders
    they leave empty, then `folder` when it is empty); anything else stays where it is."""
    marker = read_marker(folder)
    files = marker["files"] if marker is not None else []
    for relative in files:
        path = folder / relative
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):  # left in place; the folder then stays too
                path.unlink()
    if marker is not None:
        (folder / MARKER).unlink(missing_ok=True)
    for relative in sorted(_own_folders(files), key=lambda f: f.count("/"), reverse=True):
        with contextlib.suppress(OSError):  # not empty: something else is in it
            (folder / relative).rmdir()
    with contextlib.suppress(OSError):
        folder.rmdir()
