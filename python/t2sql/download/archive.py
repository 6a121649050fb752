"""Laying out BIRD's databases from its nested zips, with t2sql's own zip reading:
`extract_databases(archive, inner_member, target, identity=...)`.

BIRD ships `dev.zip` / `train.zip`, each holding an inner zip (`dev_20240627/dev_databases.zip`,
`train/train_databases.zip`) of `<top>/<db_id>/<db_id>.sqlite` and `<top>/<db_id>/database_description/*.csv`.
Info-ZIP refuses train.zip ("overlapped components (possible zip bomb)") and recent CPython zipfile has a like
check; users who forced it got about 30 empty databases. So the zips are read here, by the format:

- The outer archive's central directory is read from its end (EOCD; the ZIP64 locator and record; ZIP64
  extra fields), so archives and members over 4 GiB work. An archive written with 32-bit fields past 4 GiB
  (macOS's Archive Utility does this: offsets and sizes wrap modulo 4 GiB) is read too: a local header that is
  not where the directory says is looked for 4 GiB further on, and a deflated member ends where its deflate
  stream ends; its sizes are then checked modulo 4 GiB.
- The inner zip is never written to disk: the outer member's bytes are decompressed (deflate or stored) in
  order, and the inner zip's local file headers are walked as a stream. A deflated entry with a data
  descriptor (flag bit 3) ends where its deflate stream ends; its descriptor (32- or 64-bit sizes, with or
  without the signature) is then read and must match. Nothing seeks backwards in a decompressed stream. At
  the end the inner zip's own central directory is read (it comes last in the stream) and every file it
  lists must have passed through.
- Every member's CRC32 and size are checked as it is extracted, the inner ones and the outer one.
- `__MACOSX/`, `._*`, `.DS_Store` and directory entries are skipped; an absolute name or one with `..` is
  refused (ArchiveError).
- All or nothing: the databases go to `<parent>/.<name>.partial-<pid>`; only when every member passed and
  every `<db_id>/<db_id>.sqlite` is non-empty, opens read-only and passes `PRAGMA quick_check`, the marker
  `<target>/.t2sql-extracted.json` is written (atomically, last) and the folder is renamed into place (an
  unverified target is moved aside first, then removed). A crash, a bad CRC or a full disk leaves only a
  `.partial-*` folder, which nothing trusts and the next run removes (runs on one target are serialised by a
  lock file `<parent>/.<name>.lock`, so any partial folder found under the lock is a dead run's).
- The marker is a database manifest (t2sql.serving.manifest's format, rooted at the target: each database's
  size, times, inode and sha256, hashed as it was written) plus the caller's `identity` of the archive under
  the key "extracted". `verified(target, identity)` checks the identity and each database's presence and size
  (not its sha256: rehashing 33 GB on every run would take minutes; a Grader given the manifest rehashes a
  file whose stat moved).
- Memory: chunks of 1 MiB in, at most 4 MiB out of one decompress call; peak RSS stays well under 64 MB.

Disk: the databases (the inner zip's contents) beside the outer archive; nothing else is written.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import sqlite3
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from t2sql.atomic import atomic_write
from t2sql.errors import ArchiveError, NoSpaceError
from t2sql.progress import Progress, format_bytes
from t2sql.serving.manifest import Manifest, ManifestEntry

MARKER = ".t2sql-extracted.json"
MARKER_FORMAT = 1
CHUNK = 1 << 20  # bytes read from the archive at a time
MAX_OUT = 4 << 20  # most bytes one decompress call may produce (a run of zeros inflates 1000x)
_INNER_CD_CAP = 32 << 20  # the inner central directory is kept for the cross-check up to this size

_LOCAL = b"PK\x03\x04"
_CENTRAL = b"PK\x01\x02"
_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_DESCRIPTOR = b"PK\x07\x08"
_U16 = 0xFFFF
_U32 = 0xFFFFFFFF
_4G = 1 << 32
_STORED, _DEFLATED = 0, 8


@dataclass(frozen=True)
class ExtractResult:
    target: Path  # the folder laid out
    databases: list[str]  # db_ids laid out, sorted
    bytes_written: int
    skipped: bool  # True when verified() already held and nothing was done


@dataclass(frozen=True)
class _Member:
    """One entry of a central directory."""

    name: str
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int
    exact_sizes: bool  # sizes from a ZIP64 extra; else 32-bit fields (wrapped modulo 4 GiB past 4 GiB)


# ---------------------------------------------------------------------------------------------- public API


def extract_databases(archive: Path, inner_member: str, target: Path, *, identity: dict,
                      progress: bool = True) -> ExtractResult:
    """Lay out the databases of the zip `inner_member` inside the zip `archive` as `target/<db_id>/...` (the
    inner zip's top folder stripped), all or nothing; skip when `verified(target, identity)` already holds.
    Raises ArchiveError (damaged, cut short, unsafe, a database that fails its check) or NoSpaceError."""
    archive, target = Path(archive), Path(target).absolute()
    identity = _jsonable(identity)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _Lock(target):
            return _extract_under_lock(archive, inner_member, target, identity, progress)
    except OSError as e:  # what the walk itself did not already turn into a typed error
        where = f"{e.filename}: " if e.filename else ""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            free = shutil.disk_usage(target.parent).free
            raise NoSpaceError(f"no space left on the disk of {target.parent} while laying out {target} "
                               f"({where}{e.strerror}; {format_bytes(free)} free). Free space there (or choose a "
                               "folder on a larger disk) and run again", path=str(target.parent), needed=0,
                               free=free) from None
        raise ArchiveError(f"cannot lay out {target} from {archive}: {where}{e.strerror or e}",
                           archive=str(archive)) from None


def _extract_under_lock(archive: Path, inner_member: str, target: Path, identity: dict, progress: bool
                        ) -> ExtractResult:
    _remove_partials(target)
    marker = _read_marker(target)
    if marker is not None and _marker_holds(target, marker, identity):
        return ExtractResult(target, sorted(marker["databases"]), 0, True)
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    partial.mkdir()
    try:
        written, entries = _extract(archive, inner_member, partial, target, progress)
        data = Manifest(target, entries).to_dict()
        data["extracted"] = {"format": MARKER_FORMAT, "identity": identity, "inner_member": inner_member,
                             "bytes_written": written}
        with atomic_write(partial / MARKER) as f:
            f.write(json.dumps(data, indent=1) + "\n")
        _fsync_dir(partial)
        _move_into_place(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ExtractResult(target, sorted(entries), written, False)


def verified(target: Path, identity: dict) -> bool:
    """The marker is there, records this `identity`, and every database it lists is present with the size
    it recorded (sizes only: the sha256 is not recomputed)."""
    target = Path(target).absolute()
    marker = _read_marker(target)
    return marker is not None and _marker_holds(target, marker, _jsonable(identity))


def inner_size(archive: Path, inner_member: str) -> int:
    """The uncompressed size of the zip `inner_member` inside `archive` (for the disk check: the databases
    take at least this much, usually more, as the inner zip's members are compressed)."""
    archive = Path(archive)
    with _open_archive(archive) as f:
        member, data_start, limit = _locate(f, archive, inner_member)
        if member.exact_sizes:
            return member.size
        if member.method == _STORED:
            return _stored_span(f, member, data_start, limit)
        # 32-bit sizes past 4 GiB: the smallest size with these low 32 bits that a deflate stream of the
        # bytes available could hold (deflate never grows data by more than a little).
        span = limit - data_start
        size = member.size
        while size + _4G <= span * 0.999 - 1024:
            size += _4G
        return size


# ---------------------------------------------------------------------------------------- the outer archive


def _open_archive(archive: Path) -> BinaryIO:
    try:
        return open(archive, "rb")
    except FileNotFoundError:
        raise ArchiveError(f"{archive} does not exist; download it again", archive=str(archive)) from None
    except OSError as e:
        raise ArchiveError(f"cannot read {archive}: {e.strerror}", archive=str(archive)) from None


def _truncated(archive: Path, what: str, member: str | None = None) -> ArchiveError:
    return ArchiveError(
        f"{archive} is truncated or damaged ({what}): the download did not complete or the file was cut "
        f"short; delete {archive} and run again to download it again", archive=str(archive), member=member)


def _central_directory(f: BinaryIO, archive: Path) -> tuple[list[_Member], int, int]:
    """The members of the archive, where its central directory starts, and the shift to add to the
    recorded offsets (bytes prepended to the zip); offsets may still be wrapped modulo 4 GiB."""
    size = os.fstat(f.fileno()).st_size
    tail_len = min(size, 22 + _U16 + 20)
    f.seek(size - tail_len)
    tail = f.read(tail_len)
    pos = tail.rfind(_EOCD)
    while pos >= 0 and not (pos + 22 <= len(tail) and pos + 22 + struct.unpack_from("<H", tail, pos + 20)[0]
                            <= len(tail)):
        pos = tail.rfind(_EOCD, 0, pos)
    if pos < 0:
        raise _truncated(archive, "no end-of-central-directory record at its end")
    eocd_at = size - tail_len + pos
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack_from("<4s4H2LH", tail, pos)
    cd_end = eocd_at
    if pos >= 20 and tail[pos - 20:pos - 16] == _EOCD64_LOCATOR:
        (record_offset,) = struct.unpack_from("<Q", tail, pos - 12)
        record = b""
        for at in (eocd_at - 20 - 56, record_offset):  # where it lies (no extensible data), where it says
            if 0 <= at <= size - 56:
                f.seek(at)
                record = f.read(56)
                if record[:4] == _EOCD64:
                    cd_end = at
                    break
        if record[:4] != _EOCD64:
            raise _truncated(archive, "its ZIP64 end-of-central-directory record is missing")
        count, cd_size, cd_offset = struct.unpack_from("<3Q", record, 32)
    cd_start = cd_end - cd_size
    if cd_start < 0:
        raise _truncated(archive, "its central directory lies outside the file")
    shift = cd_start - cd_offset
    if shift % _4G == 0:  # none, or 32-bit offsets wrapped past 4 GiB (found member by member)
        shift = 0
    f.seek(cd_start)
    cd = f.read(cd_size)
    if len(cd) < cd_size:
        raise _truncated(archive, "its central directory is cut short")
    members, p = [], 0
    while p + 46 <= len(cd) and cd[p:p + 4] == _CENTRAL:
        (_, _, _, flags, method, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         offset) = struct.unpack_from("<4s6H3L5HLL", cd, p)
        raw = cd[p + 46:p + 46 + nlen]
        extra = cd[p + 46 + nlen:p + 46 + nlen + xlen]
        exact = False
        wide = _zip64_fields(extra, [usize == _U32, csize == _U32, offset == _U32])
        if wide[0] is not None:
            usize, exact = wide[0], True
        if wide[1] is not None:
            csize, exact = wide[1], True
        if wide[2] is not None:
            offset = wide[2]
        if size < _4G:
            exact = True  # nothing in a file under 4 GiB can have wrapped
        members.append(_Member(_decode(raw, flags), flags, method, crc, csize, usize, offset + shift, exact))
        p += 46 + nlen + xlen + clen
    if len(members) != count and count != _U16:
        raise _truncated(archive, f"its central directory lists {len(members)} of {count} members")
    return members, cd_start, shift


def _zip64_fields(extra: bytes, wanted: list[bool]) -> list[int | None]:
    """From a ZIP64 extra field (tag 1), the 64-bit values of the fields whose 32-bit value was 0xFFFFFFFF,
    in the order the format gives (uncompressed size, compressed size, local header offset)."""
    out: list[int | None] = [None] * len(wanted)
    i = 0
    while i + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, i)
        if tag == 1:
            body, j = extra[i + 4:i + 4 + length], 0
            for k, want in enumerate(wanted):
                if want and j + 8 <= len(body):
                    (out[k],) = struct.unpack_from("<Q", body, j)
                    j += 8
            break
        i += 4 + length
    return out


def _decode(raw: bytes, flags: int) -> str:
    return raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")


def _locate(f: BinaryIO, archive: Path, inner_member: str) -> tuple[_Member, int, int]:
    """The member named `inner_member`, where its data starts, and where its data must end by (the next
    member's local header, or the central directory)."""
    members, cd_start, _ = _central_directory(f, archive)
    found = [m for m in members if m.name == inner_member]
    if not found:
        names = ", ".join(m.name for m in members if not _is_junk(m.name))[:300]
        raise ArchiveError(
            f"{archive} has no member {inner_member} (it holds: {names or 'nothing'}); it is not the archive "
            f"expected: delete it and run again to download it again", archive=str(archive), member=inner_member)
    member = found[-1]
    offset = _find_local_header(f, member.header_offset, cd_start)
    if offset is None:
        raise _truncated(archive, f"no local header for {inner_member} where its directory says", inner_member)
    f.seek(offset)
    header = f.read(30)
    _, _, _, _, _, _, _, _, _, nlen, xlen = struct.unpack("<4s5H3L2H", header)
    data_start = offset + 30 + nlen + xlen
    later = [o for o in (_find_local_header(f, m.header_offset, cd_start, probe_only=True) for m in members
                         if m is not member) if o is not None and o > offset]
    limit = min(later + [cd_start])
    if not member.exact_sizes or member.method == _DEFLATED:
        pass  # the data ends by `limit`; a deflate stream says itself where
    elif data_start + member.compressed_size > limit:
        raise _truncated(archive, f"{inner_member} runs past the end of the data", inner_member)
    return member, data_start, limit


def _find_local_header(f: BinaryIO, recorded: int, cd_start: int, probe_only: bool = False) -> int | None:
    """Where a local header recorded at `recorded` lies: there, or a multiple of 4 GiB further on (32-bit
    offsets wrapped past 4 GiB)."""
    at = recorded
    while at + 30 <= cd_start:
        f.seek(at)
        if f.read(4) == _LOCAL:
            return at
        if recorded > _U32 or probe_only and at > recorded + 8 * _4G:
            return None
        at += _4G
    return None


def _stored_span(f: BinaryIO, member: _Member, data_start: int, limit: int) -> int:
    """The true size of a stored member whose 32-bit size may have wrapped: the first candidate (the
    recorded size plus a multiple of 4 GiB) followed by a zip signature (the next header, a descriptor,
    the central directory) or by a descriptor without one (the member's CRC); else the recorded size."""
    size = member.compressed_size
    while data_start + size <= limit:
        f.seek(data_start + size)
        after = f.read(4)
        if after[:2] == b"PK" or after == struct.pack("<L", member.crc):
            return size
        size += _4G
    return member.compressed_size


class _Stream:
    """The outer member's bytes, decompressed, read forward only (a buffer of what was produced and not yet
    consumed); its CRC32, size and compressed length are counted as they pass."""

    def __init__(self, f: BinaryIO, archive: Path, member: _Member, data_start: int, limit: int, bar: Progress):
        self.f, self.archive, self.member, self.bar = f, archive, member, bar
        self.pos = data_start
        self.start = data_start
        if member.method == _STORED:
            length = member.compressed_size if member.exact_sizes else _stored_span(f, member, data_start, limit)
            self.end = data_start + length
            self.dec = None
        elif member.method == _DEFLATED:
            self.end = data_start + member.compressed_size if member.exact_sizes else limit
            self.dec = zlib.decompressobj(-15)
        else:
            raise ArchiveError(f"{member.name} in {archive} uses compression method {member.method}, which t2sql "
                               "cannot read (only stored and deflate)", archive=str(archive), member=member.name)
        f.seek(data_start)
        self.buf = bytearray()
        self.crc = 0
        self.size = 0
        self.done = False

    def _produce(self) -> None:
        if self.dec is None:
            n = min(CHUNK, self.end - self.pos)
            if n <= 0:
                self.done = True
                return
            out = self.f.read(n)
            if len(out) < n:
                raise _truncated(self.archive, f"the data of {self.member.name} ends early", self.member.name)
            self.pos += n
        else:
            if self.dec.eof:
                self.done = True
                return
            data = self.dec.unconsumed_tail
            if not data:
                data = self.f.read(min(CHUNK, self.end - self.pos))
                self.pos += len(data)
                if not data:
                    raise _truncated(self.archive, f"the compressed data of {self.member.name} ends early",
                                     self.member.name)
            try:
                out = self.dec.decompress(data, MAX_OUT)
            except zlib.error as e:
                raise _damaged(self.archive, self.member.name, f"its compressed data is corrupt: {e}") from None
        self.crc = zlib.crc32(out, self.crc)
        self.size += len(out)
        self.bar.advance(len(out))
        self.buf += out

    def _fill(self, n: int) -> None:
        while len(self.buf) < n and not self.done:
            self._produce()

    def peek(self, n: int) -> bytes:
        self._fill(n)
        return bytes(self.buf[:n])

    def read(self, n: int, what: str) -> bytes:
        self._fill(n)
        if len(self.buf) < n:
            raise _truncated(self.archive, f"{self.member.name} ends inside {what}", self.member.name)
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def read_some(self, limit: int) -> bytes:
        """Up to `limit` bytes (b"" only at the end)."""
        self._fill(1)
        out = bytes(self.buf[:limit])
        del self.buf[:len(out)]
        return out

    def unread(self, data: bytes) -> None:
        """Give back bytes read past the end of an entry (not a seek: they were never consumed)."""
        self.buf[0:0] = data

    def finish(self, keep: int) -> bytes:
        """Read the rest (at most `keep` bytes of it returned: b"" when there was more), then check the member."""
        rest, over = bytearray(), False
        while chunk := self.read_some(CHUNK):
            if not over:
                rest += chunk
                over = len(rest) > keep
                if over:
                    rest = bytearray()
        m = self.member
        used = self.pos - self.start - (len(self.dec.unused_data) if self.dec is not None else 0)
        sizes_ok = (self.size, used) == (m.size, m.compressed_size) if m.exact_sizes else (
            self.size % _4G == m.size % _4G and used % _4G == m.compressed_size % _4G)
        if self.crc != m.crc or not sizes_ok:
            raise _damaged(self.archive, m.name, _mismatch(m.crc, self.crc, m.size, self.size))
        return b"" if over else bytes(rest)


def _damaged(archive: Path, member: str, what: str, inside: str | None = None) -> ArchiveError:
    where = f"{member} (inside {inside} in {archive})" if inside else f"{member} in {archive}"
    return ArchiveError(f"{where} is damaged: {what}; delete {archive} and run again to download it again",
                        archive=str(archive), member=member)


def _mismatch(want_crc: int, got_crc: int, want_size: int, got_size: int) -> str:
    if want_crc != got_crc:
        return f"CRC32 mismatch (recorded {want_crc:08x}, computed {got_crc:08x})"
    return f"size mismatch (recorded {want_size} bytes, got {got_size})"


# ------------------------------------------------------------------------------------- the inner stream walk


def _is_junk(name: str) -> bool:
    parts = name.split("/")
    return parts[0] == "__MACOSX" or any(p.startswith("._") or p == ".DS_Store" for p in parts)


def _safe_parts(name: str, archive: Path, inner: str) -> list[str]:
    """The path components of a member name; ArchiveError for an absolute name or one that climbs out."""
    parts = name.replace("\\", "/").split("/")
    if (name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or "\0" in name
            or any(p == ".." for p in parts)):
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
    written: int = 0
    entries: dict | None = None
    seen: dict | None = None  # name -> crc of every entry that passed through


def _extract(archive: Path, inner_member: str, partial: Path, target: Path, progress: bool
             ) -> tuple[int, dict[str, ManifestEntry]]:
    top = Path(inner_member).name.removesuffix(".zip")
    with _open_archive(archive) as f:
        member, data_start, limit = _locate(f, archive, inner_member)
        total = member.size if member.exact_sizes else None
        walk = _Walk(archive, inner_member, top, partial, entries={}, seen={})
        with Progress(total, f"extracting {Path(inner_member).name}", unit="bytes", enabled=progress) as bar:
            stream = _Stream(f, archive, member, data_start, limit, bar)
            try:
                while stream.peek(4) == _LOCAL:
                    _entry(stream, walk)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise _no_space(walk, stream, total, partial) from None
                where = f"{e.filename}: " if e.filename else ""
                raise ArchiveError(f"cannot extract {archive} into {partial.parent}: {where}{e.strerror or e}",
                                   archive=str(archive)) from None
            following = stream.peek(4)
            if following not in (_CENTRAL, _EOCD, _EOCD64):
                raise _damaged(archive, inner_member, f"unexpected bytes after its entry {len(walk.seen)} "
                               f"({following.hex() or 'the end'}) where a zip entry or directory should be")
            tail = stream.finish(_INNER_CD_CAP)
    _cross_check(tail, walk)
    if not walk.entries:
        raise ArchiveError(f"{inner_member} in {archive} holds no database ({top}/<db_id>/<db_id>.sqlite); it "
                           "is not the archive expected: delete it and download it again", archive=str(archive),
                           member=inner_member)
    for db_id, entry in sorted(walk.entries.items()):
        _check_database(partial / entry.path, db_id, archive, inner_member)
    return walk.written, walk.entries


def _entry(stream: _Stream, walk: _Walk) -> None:
    """Pass one local entry of the inner zip: write it (or skip it), checking its CRC32 and size."""
    header = stream.read(30, "a local header")
    _, _, flags, method, _, _, crc, csize, usize, nlen, xlen = struct.unpack("<4s5H3L2H", header)
    name = _decode(stream.read(nlen, "a member name"), flags)
    extra = stream.read(xlen, f"the header of {name}")
    wide = _zip64_fields(extra, [usize == _U32, csize == _U32])
    zip64 = any(v is not None for v in wide) or _has_tag(extra, 1)
    usize = usize if wide[0] is None else wide[0]
    csize = csize if wide[1] is None else wide[1]
    if flags & 1:
        raise ArchiveError(f"{name} in {walk.inner} ({walk.archive}) is encrypted; t2sql cannot read it",
                           archive=str(walk.archive), member=name)
    descriptor = bool(flags & 8)
    parts = _safe_parts(name, walk.archive, walk.inner)
    out_path = None
    if not (name.endswith("/") or _is_junk(name)) and len(parts) > 1 and parts[0] == walk.top:
        out_path = walk.partial.joinpath(*parts[1:])
    is_db = out_path is not None and len(parts) == 3 and parts[2] == f"{parts[1]}.sqlite"
    sink = _Sink(out_path, hashed=is_db)
    try:
        if method == _DEFLATED:
            got_crc, got_size, used = _inflate(stream, sink, name, walk)  # to its deflate end
        elif method == _STORED:
            if descriptor and csize == 0 and usize == 0:  # the size comes after the data
                got_crc, got_size, used = _copy_to_descriptor(stream, sink, name, walk)
            else:
                got_crc, got_size, used = _copy(stream, sink, csize, name)
        else:
            raise ArchiveError(f"{name} in {walk.inner} ({walk.archive}) uses compression method {method}, which "
                               "t2sql cannot read (only stored and deflate)", archive=str(walk.archive), member=name)
        sink.close()
    except BaseException:
        sink.abort()
        raise
    if descriptor:
        crc, usize = _descriptor(stream, zip64, got_crc, got_size, used, name, walk)
        exact = True
    else:
        exact = zip64 or got_size < _4G
    if crc != got_crc or (got_size != usize if exact else got_size % _4G != usize % _4G) or (
            not descriptor and used % _4G != csize % _4G):
        raise _damaged(walk.archive, name, _mismatch(crc, got_crc, usize, got_size), walk.inner)
    walk.seen[name] = got_crc
    if out_path is not None:
        walk.written += got_size
    if is_db:
        walk.entries[parts[1]] = sink.manifest_entry(parts[1], f"{parts[1]}/{parts[2]}")


def _has_tag(extra: bytes, tag: int) -> bool:
    i = 0
    while i + 4 <= len(extra):
        t, length = struct.unpack_from("<HH", extra, i)
        if t == tag:
            return True
        i += 4 + length
    return False


class _Sink:
    """Where an entry's bytes go: a file (hashed when it is a database), or nowhere (skipped entries)."""

    def __init__(self, path: Path | None, hashed: bool):
        self.path = path
        self.file = None
        self.sha = hashlib.sha256() if hashed else None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = _open_output(path)

    def write(self, data: bytes) -> None:
        if self.file is not None:
            self.file.write(data)
        if self.sha is not None:
            self.sha.update(data)

    def close(self) -> None:
        if self.file is not None:
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()

    def abort(self) -> None:
        if self.file is not None:
            self.file.close()

    def manifest_entry(self, db_id: str, relative: str) -> ManifestEntry:
        assert self.path is not None and self.sha is not None
        st = self.path.stat()
        return ManifestEntry(db_id, relative, st.st_size, st.st_mtime_ns, self.sha.hexdigest(), st.st_ctime_ns,
                             st.st_ino)


def _open_output(path: Path) -> BinaryIO:
    return open(path, "wb")


def _inflate(stream: _Stream, sink: _Sink, name: str, walk: _Walk) -> tuple[int, int, int]:
    """Inflate one entry to its deflate stream's end (whatever its header says: a 32-bit size may have
    wrapped, a descriptor's comes after); give back what was read past it."""
    dec = zlib.decompressobj(-15)
    crc = size = used = 0
    while not dec.eof:
        data = dec.unconsumed_tail
        if not data:
            data = stream.read_some(CHUNK)
            if not data:
                raise _truncated(walk.archive, f"{name} in {walk.inner} ends early", name)
            used += len(data)
        try:
            out = dec.decompress(data, MAX_OUT)
        except zlib.error as e:
            raise _damaged(walk.archive, name, f"its compressed data is corrupt: {e}", walk.inner) from None
        if out:
            sink.write(out)
            crc = zlib.crc32(out, crc)
            size += len(out)
    if dec.unused_data:
        stream.unread(dec.unused_data)
        used -= len(dec.unused_data)
    return crc, size, used


def _copy(stream: _Stream, sink: _Sink, size: int, name: str) -> tuple[int, int, int]:
    crc = done = 0
    while done < size:
        data = stream.read_some(min(CHUNK, size - done))
        if not data:
            raise _truncated(stream.archive, f"{name} ends early", name)
        sink.write(data)
        crc = zlib.crc32(data, crc)
        done += len(data)
    return crc, done, done


def _copy_to_descriptor(stream: _Stream, sink: _Sink, name: str, walk: _Walk) -> tuple[int, int, int]:
    """A stored entry whose size is only in the descriptor after it: copy up to the first descriptor
    signature followed by the CRC32 and size of the bytes before it (a false match needs a CRC collision)."""
    crc = size = 0
    window = bytearray()
    while True:
        chunk = stream.read_some(CHUNK)
        if not chunk:
            raise _truncated(walk.archive, f"{name} in {walk.inner} has no data descriptor after it", name)
        window += chunk
        hold = max(0, len(window) - 23)  # a signature there may have its fields in the next chunk
        i = window.find(_DESCRIPTOR)
        while i >= 0:
            if len(window) - i < 24 and chunk:
                hold = min(hold, i)
                break
            c, n = zlib.crc32(window[:i], crc), size + i
            for fmt in ("<LLL", "<LQQ"):
                mask = _U32 if fmt == "<LLL" else (1 << 64) - 1
                if len(window) - i - 4 >= struct.calcsize(fmt) and \
                        struct.unpack_from(fmt, window, i + 4) == (c, n & mask, n & mask):
                    sink.write(bytes(window[:i]))
                    stream.unread(bytes(window[i:]))
                    return c, n, n
            i = window.find(_DESCRIPTOR, i + 1)
        if hold:
            data = bytes(window[:hold])
            sink.write(data)
            crc, size = zlib.crc32(data, crc), size + hold
            del window[:hold]


def _descriptor(stream: _Stream, zip64: bool, crc: int, size: int, used: int, name: str, walk: _Walk
                ) -> tuple[int, int]:
    """Read the data descriptor after an entry: the layout (signature or not, 32- or 64-bit sizes) that
    matches what passed is taken; when none does, the recorded CRC and size are returned for the error."""
    head = stream.peek(24)
    layouts = [(True, True), (True, False), (False, True), (False, False)]
    if not zip64:
        layouts = [(True, False), (True, True), (False, False), (False, True)]
    first = None
    for signed, wide in layouts:
        if signed and head[:4] != _DESCRIPTOR:
            continue
        fmt = ("<4s" if signed else "<") + ("LQQ" if wide else "LLL")
        length = struct.calcsize(fmt)
        if len(head) < length:
            continue
        values = struct.unpack_from(fmt, head)[1 if signed else 0:]
        rcrc, rcsize, rusize = values
        first = first or (length, rcrc, rusize)
        mask = (1 << 64) - 1 if wide else _U32
        if (rcrc, rcsize, rusize) == (crc, used & mask, size & mask):
            stream.read(length, "a data descriptor")
            return rcrc, size
    if first is None:
        raise _truncated(walk.archive, f"{name} in {walk.inner} has no data descriptor after it", name)
    stream.read(first[0], "a data descriptor")
    return first[1], first[2]


def _cross_check(tail: bytes, walk: _Walk) -> None:
    """Every file the inner zip's central directory lists passed through the stream with its CRC."""
    if not tail:
        return  # a directory over the cap: the stream walk's own checks stand
    p, missing = 0, []
    while p + 46 <= len(tail) and tail[p:p + 4] == _CENTRAL:
        _, _, _, flags, _, _, _, crc, _, _, nlen, xlen, clen, _, _, _, _ = struct.unpack_from("<4s6H3L5HLL", tail, p)
        name = _decode(tail[p + 46:p + 46 + nlen], flags)
        if walk.seen.get(name) != crc:
            missing.append(name)
        p += 46 + nlen + xlen + clen
    if missing:
        raise _damaged(walk.archive, walk.inner, f"its directory lists {len(missing)} member(s) that its data did "
                       f"not hold as recorded (first: {missing[0]})")


def _no_space(walk: _Walk, stream: _Stream, total: int | None, partial: Path) -> NoSpaceError:
    read = stream.size
    estimate = int(walk.written * total / read) if total and read else None
    shutil.rmtree(partial, ignore_errors=True)
    free = shutil.disk_usage(partial.parent).free
    need = (f"the databases need about {format_bytes(estimate)} in all" if estimate
            else f"the databases need more than the {format_bytes(walk.written)} written")
    return NoSpaceError(
        f"no space left on the disk of {partial.parent} while extracting {walk.inner} from {walk.archive}: "
        f"{format_bytes(walk.written)} written when {format_bytes(read)} of the archive had been read; {need} "
        f"({format_bytes(free)} free now). Free space there (or choose a folder on a larger disk) and run again",
        path=str(partial.parent), needed=estimate or walk.written, free=free)


# ------------------------------------------------------------------------------------------ checks and marker


def _check_database(path: Path, db_id: str, archive: Path, inner: str) -> None:
    where = f"{db_id} ({path.name} in {inner} of {archive})"
    if path.stat().st_size == 0:
        raise ArchiveError(f"database {where} is empty; delete {archive} and download it again",
                           archive=str(archive), member=f"{db_id}/{path.name}")
    problem = None
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = con.execute("PRAGMA quick_check").fetchall()
        finally:
            con.close()
        if rows != [("ok",)]:
            problem = "; ".join(str(r[0]) for r in rows[:3]).replace("\n", "; ")
            problem = problem if len(problem) <= 200 else problem[:200] + " ..."
    except sqlite3.Error as e:
        problem = str(e)
    if problem is not None:
        raise ArchiveError(f"database {where} fails its integrity check (PRAGMA quick_check: {problem}); delete "
                           f"{archive} and download it again", archive=str(archive), member=f"{db_id}/{path.name}")


def _jsonable(identity: dict) -> dict:
    """The identity as it reads back from JSON, so a tuple and a list compare equal."""
    return json.loads(json.dumps(identity, sort_keys=True))


def _read_marker(target: Path) -> dict | None:
    """The marker's identity and databases ({db_id: (relative path, size)}), or None."""
    try:
        data = json.loads((target / MARKER).read_text())
        extracted = data["extracted"]
        if extracted.get("format") != MARKER_FORMAT:
            return None
        manifest = Manifest.load(target / MARKER, db_root=target)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return {"identity": extracted.get("identity"),
            "databases": {db_id: (e.path, e.size) for db_id, e in manifest.entries.items()}}


def _marker_holds(target: Path, marker: dict, identity: dict) -> bool:
    if marker["identity"] != identity or not marker["databases"]:
        return False
    for relative, size in marker["databases"].values():
        try:
            if (target / relative).stat().st_size != size:
                return False
        except OSError:
            return False
    return True


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
    """Remove what dead runs left: under the lock no live run has a partial folder of this target."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.partial-\d+(\.old)?$")
    for p in target.parent.iterdir():
        if pattern.match(p.name):
            shutil.rmtree(p, ignore_errors=True)


def _move_into_place(partial: Path, target: Path) -> None:
    """Rename `partial` to `target`; an existing (unverified) target is moved aside first, then removed."""
    old = None
    if target.exists() or target.is_symlink():
        old = partial.with_name(partial.name + ".old")
        os.rename(target, old)
    os.rename(partial, target)
    _fsync_dir(target.parent)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
