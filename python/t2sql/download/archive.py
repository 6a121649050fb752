"""Laying out BIRD's databases from its nested zips (`extract_databases`, `inner_size`): the inner zip read where it
lies in the outer archive, never written to disk, every member checked and bounded, laid out all or nothing, and
nothing deleted that t2sql did not write. What it does for users: docs/training.md, "The recipe's data"; how the
zip reader's modules fit: docs/development.md, "How `download/` reads BIRD's zips"."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from t2sql.download.bounds import DISK_RESERVE, EntryBounds, UnpackCeiling, default_ceiling
from t2sql.download.innerdirectory import read_ahead
from t2sql.download.integrity import database_problem
from t2sql.download.marker import (
    describe_foreign,
    foreign_files,
    marker_holds,
    read_marker,
    recorded_identity,
    remove_laid_out,
    write_marker,
)
from t2sql.download.partial import free_bytes
from t2sql.download.zipdirectory import Member, locate, open_archive, stored_span
from t2sql.download.zipentries import (
    DIGEST_MODULUS,
    copy_entry,
    copy_to_descriptor,
    directory_digest,
    entry_digest,
    inflate_entry,
    read_descriptor,
)
from t2sql.download.zipformat import (
    CENTRAL,
    DEFLATED,
    EOCD,
    EOCD64,
    FOUR_GIB,
    LOCAL,
    STORED,
    U32,
    damaged_error,
    decode_name,
    has_tag,
    is_junk,
    mismatch,
    zip64_fields,
)
from t2sql.download.zipstream import MemberStream
from t2sql.errors import ArchiveError, ForeignFilesError, NoSpaceError
from t2sql.progress import Progress, format_bytes
from t2sql.serving.manifest import ManifestEntry

__all__ = ["ExtractResult", "UnpackCeiling", "extract_databases", "inner_size"]


@dataclass(frozen=True)
class ExtractResult:
    target: Path  # the folder laid out
    databases: list[str]  # db_ids laid out, sorted
    bytes_written: int
    skipped: bool  # True when verified() already held and nothing was done



# ---------------------------------------------------------------------------------------------- public API


def extract_databases(archive: Path, inner_member: str, target: Path, *, identity: dict,
                      progress: bool = True, ceiling: UnpackCeiling | None = None) -> ExtractResult:
    """Lay out the databases of the zip `inner_member` inside the zip `archive` as `target/<db_id>/...` (the
    inner zip's top folder stripped), all or nothing; skip when `verified(target, identity)` already holds.
    `ceiling`: the most bytes the inner zip's entries may unpack to in all (by default bounds.default_ceiling
    of the inner zip's size). Raises ArchiveError (damaged, cut short, unsafe, past its bounds, a database that
    fails its check) or NoSpaceError."""
    archive, target = Path(archive), Path(target).absolute()
    identity = recorded_identity(identity)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _Lock(target):
            return _extract_under_lock(archive, inner_member, target, identity, progress, ceiling)
    except OSError as e:  # what the walk itself did not already turn into a typed error
        where = f"{e.filename}: " if e.filename else ""
        if _disk_full(e):
            free = free_bytes(target.parent)
            raise NoSpaceError(f"no space left on the disk of {target.parent} while laying out {target} "
                               f"({where}{e.strerror}; {format_bytes(free)} free). Free space there (or choose a "
                               "folder on a larger disk) and run again", path=str(target.parent), needed=0,
                               free=free) from None
        raise ArchiveError(f"cannot lay out {target} from {archive}: {where}{e.strerror or e}",
                           archive=str(archive)) from None


def _extract_under_lock(archive: Path, inner_member: str, target: Path, identity: dict, progress: bool,
                        ceiling: UnpackCeiling | None) -> ExtractResult:
    _remove_partials(target)
    marker = read_marker(target)
    if marker is not None and marker_holds(target, marker, identity):
        return ExtractResult(target, sorted(marker["databases"]), 0, True)
    _refuse_foreign(target)
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    partial.mkdir()
    try:
        written, entries, files = _extract(archive, inner_member, partial, progress, ceiling)
        write_marker(partial, target, entries, identity=identity, inner_member=inner_member, bytes_written=written,
                     files=files)
        _fsync_dir(partial)
        _refuse_foreign(target)  # again: something may have been put there while the archive was read
        _move_into_place(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ExtractResult(target, sorted(entries), written, False)


def _refuse_foreign(target: Path) -> None:
    if foreign := foreign_files(target):
        raise ForeignFilesError(
            f"{target}: {describe_foreign(target, foreign)}; t2sql deletes nothing it did not write, so it lays "
            "nothing out there: move them elsewhere (or choose another folder) and run again", folder=str(target),
            files=foreign)


def inner_size(archive: Path, inner_member: str) -> int:
    """The uncompressed size of the zip `inner_member` inside `archive` (for the disk check: the databases
    take at least this much, usually more, as the inner zip's members are compressed)."""
    archive = Path(archive)
    with open_archive(archive) as f:
        return _inner_size(f, *locate(f, archive, inner_member))


def _inner_size(f: BinaryIO, member: Member, data_start: int, limit: int) -> int:
    if member.exact_sizes:
        return member.size
    if member.method == STORED:
        return stored_span(f, member, data_start, limit)
    # 32-bit sizes past 4 GiB: the smallest size with these low 32 bits that a deflate stream of the
    # bytes available could hold (deflate never grows data by more than a little).
    span = limit - data_start
    size = member.size
    while size + FOUR_GIB <= span * 0.999 - 1024:
        size += FOUR_GIB
    return size


# ------------------------------------------------------------------------------------- the inner stream walk


_DRIVE = re.compile(r"[A-Za-z]:")


def _safe_parts(name: str, archive: Path, inner: str) -> list[str]:
    """The path components of a member name; ArchiveError for an absolute name or one that climbs out."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or _DRIVE.match(name) or "\0" in name or ".." in parts:
        raise ArchiveError(f"{inner} in {archive} holds an unsafe member name {name!r} (absolute, or with '..'); "
                           "refusing to extract it: this is not BIRD's archive as published, delete it and "
                           "download it again", archive=str(archive), member=name)
    return [p for p in parts if p not in ("", ".")]


@dataclass
class _Walk:
    archive: Path
    inner: str
    top: str
    partial: Path
    bounds: EntryBounds  # what each entry may unpack to
    written: int = 0  # bytes of the files laid out (or, once the disk is full, that would have been)
    entries: dict = field(default_factory=dict)  # db_id -> ManifestEntry of each database laid out
    files: list = field(default_factory=list)  # every file laid out, relative to the target
    count: int = 0  # entries that passed through (files and folders, laid out or skipped)
    digest: int = 0  # the sum of their zipentries.entry_digest, for the check against the inner directory
    full: bool = False  # the disk filled: nothing more is written, the walk goes on to count what is needed


def _extract(archive: Path, inner_member: str, partial: Path, progress: bool, ceiling: UnpackCeiling | None
             ) -> tuple[int, dict[str, ManifestEntry], list[str]]:
    top = Path(inner_member).name.removesuffix(".zip")
    with open_archive(archive) as f, contextlib.ExitStack() as cleanup:
        member, data_start, limit = locate(f, archive, inner_member)
        total = member.size if member.exact_sizes else None
        bounds = EntryBounds(ceiling or default_ceiling(_inner_size(f, member, data_start, limit)), archive,
                             inner_member, lambda: read_ahead(archive, member, data_start, limit))
        cleanup.callback(bounds.close)
        walk = _Walk(archive, inner_member, top, partial, bounds)
        with Progress(total, f"extracting {Path(inner_member).name}", unit="bytes", enabled=progress) as bar:
            stream = MemberStream(f, archive, member, data_start, limit, bar)
            try:
                while stream.peek(4) == LOCAL:
                    _entry(stream, walk)
            except OSError as e:
                if _disk_full(e):  # not from an output file (those are the sinks'): what is needed is unknown
                    raise _no_space(walk, partial, counted=False) from None
                where = f"{e.filename}: " if e.filename else ""
                raise ArchiveError(f"cannot extract {archive} into {partial.parent}: {where}{e.strerror or e}",
                                   archive=str(archive)) from None
            following = stream.peek(4)
            if following not in (CENTRAL, EOCD, EOCD64):
                raise damaged_error(archive, inner_member, f"unexpected bytes after its entry {walk.count} "
                               f"({following.hex() or 'the end'}) where a zip entry or directory should be")
            listed, digest = directory_digest(stream)
            stream.finish()
    if listed != walk.count:
        raise damaged_error(archive, inner_member, f"its directory lists {listed} member(s) and its data holds "
                       f"{walk.count}")
    if digest != walk.digest:
        raise damaged_error(archive, inner_member, "its directory and its data disagree on the name, CRC32 or size of "
                       "at least one member")
    if walk.full:
        raise _no_space(walk, partial, counted=True)
    if not walk.entries:
        raise ArchiveError(f"{inner_member} in {archive} holds no database ({top}/<db_id>/<db_id>.sqlite); it "
                           "is not the archive expected: delete it and download it again", archive=str(archive),
                           member=inner_member)
    for db_id, entry in sorted(walk.entries.items()):
        _check_database(partial / entry.path, db_id, archive, inner_member)
    return walk.written, walk.entries, walk.files


def _laid_out(parts: list[str]) -> bool:
    """Whether a member's path under the inner zip's top folder is one t2sql lays out: `<db_id>/<db_id>.sqlite`
    and `<db_id>/database_description/*.csv`, nothing else (no -wal, -shm or -journal beside a database,
    which SQLite would take as part of it)."""
    if len(parts) == 2:
        return parts[1] == f"{parts[0]}.sqlite"
    return len(parts) == 3 and parts[1] == "database_description" and parts[2].lower().endswith(".csv")


def _entry(stream: MemberStream, walk: _Walk) -> None:
    """Pass one local entry of the inner zip: write it (or skip it), checking its CRC32 and size, and never
    more than its bound (t2sql.download.bounds)."""
    at = stream.offset
    header = stream.read(30, "a local header")
    _, _, flags, method, _, _, crc, csize, usize, nlen, xlen = struct.unpack("<4s5H3L2H", header)
    rest = stream.read(nlen + xlen, "a local header")
    raw_name, extra = rest[:nlen], rest[nlen:]
    name = decode_name(raw_name, flags)
    wide = zip64_fields(extra, [usize == U32, csize == U32])
    zip64 = any(v is not None for v in wide) or has_tag(extra, 1)
    usize = usize if wide[0] is None else wide[0]
    csize = csize if wide[1] is None else wide[1]
    if flags & 1:
        raise ArchiveError(f"{name} in {walk.inner} ({walk.archive}) is encrypted; t2sql cannot read it",
                           archive=str(walk.archive), member=name)
    descriptor = bool(flags & 8)  # the sizes come after the data; the header's are zero
    parts = _safe_parts(name, walk.archive, walk.inner)
    relative = parts[1:]
    out_path = None
    if not (name.endswith("/") or is_junk(name)) and len(parts) > 1 and parts[0] == walk.top \
            and _laid_out(relative):
        out_path = walk.partial.joinpath(*relative)
    is_db = out_path is not None and len(relative) == 2
    if method not in (DEFLATED, STORED):
        raise ArchiveError(f"{name} in {walk.inner} ({walk.archive}) uses compression method {method}, which "
                           "t2sql cannot read (only stored and deflate)", archive=str(walk.archive), member=name)
    if method == DEFLATED:
        declared = None if descriptor else usize
    else:
        declared = None if descriptor and csize == 0 and usize == 0 else csize  # None: the size comes after it
    bound = walk.bounds.bound(name, raw_name, walk.count, at, method, declared)
    sink = _Sink(out_path, hashed=is_db, walk=walk)
    try:
        if method == DEFLATED:
            got_crc, got_size, used = inflate_entry(stream, sink, name, walk, bound)
        elif declared is None:
            got_crc, got_size, used = copy_to_descriptor(stream, sink, name, walk, bound)
        else:
            got_crc, got_size, used = copy_entry(stream, sink, csize, name)
        sink.close()
    except BaseException:
        sink.abort()
        raise
    if descriptor:
        crc, usize = read_descriptor(stream, zip64, got_crc, got_size, used, name, walk)
    elif used != csize:
        raise damaged_error(walk.archive, name, f"compressed size mismatch (recorded {csize} bytes, read {used})",
                       walk.inner)
    if crc != got_crc or got_size != usize:
        raise damaged_error(walk.archive, name, mismatch(crc, got_crc, usize, got_size), walk.inner)
    walk.count += 1
    walk.bounds.passed(got_size)
    walk.digest = (walk.digest + entry_digest(raw_name, got_crc, got_size)) % DIGEST_MODULUS
    if out_path is not None:
        walk.written += got_size
        walk.files.append("/".join(relative))
    if walk.full:
        stream.bar.status = "disk full: writing nothing, counting what the databases need"
    if is_db and sink.path is not None:
        walk.entries[relative[0]] = sink.manifest_entry(relative[0], "/".join(relative))


class _Sink:
    """Where an entry's bytes go: a file (hashed when it is a database), or nowhere (skipped entries, and every
    entry once the disk is full)."""

    def __init__(self, path: Path | None, hashed: bool, walk: _Walk):
        self.walk = walk
        self.path = None if walk.full else path
        self.file = None
        self.sha = hashlib.sha256() if hashed and self.path is not None else None
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.file = _open_output(self.path)
            except OSError as e:
                self._full(e)

    def write(self, data: bytes) -> None:
        if self.file is not None and free_bytes(self.walk.partial) - len(data) < DISK_RESERVE:
            self._give_up()  # the disk's reserve: as if it were full
        if self.file is not None:
            try:
                self.file.write(data)
            except OSError as e:
                self._full(e)
        if self.sha is not None:
            self.sha.update(data)

    def close(self) -> None:
        if self.file is not None:
            try:
                self.file.flush()
                os.fsync(self.file.fileno())
                self.file.close()
            except OSError as e:
                self._full(e)

    def _full(self, e: OSError) -> None:
        """A full disk: give the space written back at once, and write nothing more (the walk goes on, counting
        what the databases need). Any other error is the walk's."""
        if not _disk_full(e):
            raise e
        self._give_up()

    def _give_up(self) -> None:
        self.abort()
        self.walk.full = True
        shutil.rmtree(self.walk.partial, ignore_errors=True)
        self.path, self.file, self.sha = None, None, None

    def abort(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError:  # a full disk's last flush: the file is being given up anyway
                pass

    def manifest_entry(self, db_id: str, relative: str) -> ManifestEntry:
        assert self.path is not None and self.sha is not None
        st = self.path.stat()
        return ManifestEntry(db_id, relative, st.st_size, st.st_mtime_ns, self.sha.hexdigest(), st.st_ctime_ns,
                             st.st_ino)


def _open_output(path: Path) -> BinaryIO:
    return open(path, "wb")


def _disk_full(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def _no_space(walk: _Walk, partial: Path, counted: bool) -> NoSpaceError:
    """The error of a full disk, once the partial folder is gone: `counted` when the walk went to the end, so
    `walk.written` is all the databases need (else only what had been written)."""
    shutil.rmtree(partial, ignore_errors=True)
    free = free_bytes(partial.parent)
    need = f"{'' if counted else 'more than '}{format_bytes(walk.written)}"
    # "at least": the file system's own blocks and directories come on top of the files' bytes
    short = (f"free at least {format_bytes(walk.written + DISK_RESERVE - free)} more there"
             if counted and walk.written + DISK_RESERVE > free else "free more space there")
    return NoSpaceError(
        f"no space left on the disk of {partial.parent} while extracting {walk.inner} from {walk.archive}: "
        f"the databases need {need} in all, t2sql leaves {format_bytes(DISK_RESERVE)} free there for whatever "
        f"else runs, and {format_bytes(free)} is free now (the partial extraction removed); {short} (or choose "
        "a folder on a larger disk) and run again", path=str(partial.parent), needed=walk.written, free=free)


# ------------------------------------------------------------------ the databases' check, the target's replacement


def _check_database(path: Path, db_id: str, archive: Path, inner: str) -> None:
    if (problem := database_problem(path)) is not None:
        raise ArchiveError(f"database {db_id} ({path.name} in {inner} of {archive}): {problem}; delete {archive} "
                           "and download it again", archive=str(archive), member=f"{db_id}/{path.name}")


class _Lock:
    """One extraction per target at a time (an flock on `<parent>/.<name>.lock`, released by the kernel when
    its process dies)."""

    def __init__(self, target: Path):
        self.path = target.parent / f".{target.name}.lock"
        self.fd = -1

    def __enter__(self) -> _Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


def _remove_partials(target: Path) -> None:
    """Remove what dead runs left: under the lock no live run has a partial folder of this target. A
    `.partial-<pid>` folder holds only what that run extracted; a `.partial-<pid>.old` one is a target it was
    replacing, of which only what t2sql laid out is removed."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.partial-\d+(\.old)?$")
    for p in target.parent.iterdir():
        if pattern.match(p.name):
            if p.name.endswith(".old"):
                remove_laid_out(p)
            else:
                shutil.rmtree(p, ignore_errors=True)


def _move_into_place(partial: Path, target: Path) -> None:
    """Rename `partial` to `target`. An existing target (which holds nothing but what t2sql laid out: the
    caller checked) is moved aside first, then what t2sql laid out in it is removed."""
    old = None
    if os.path.lexists(target):
        old = partial.with_name(partial.name + ".old")
        os.rename(target, old)
    os.rename(partial, target)
    _fsync_dir(target.parent)
    if old is not None:
        remove_laid_out(old)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
