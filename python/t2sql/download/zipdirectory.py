"""The outer archive's central directory, and where a member's data lies in the file: `open_archive`, `locate`,
`stored_span` and `find_directory` (any zip's end records, ZIP64 included, 32-bit fields wrapped past 4 GiB too),
read record by record, never held whole. docs/development.md, "How `download/` reads BIRD's zips"."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from t2sql.download.zipformat import (
    CENTRAL,
    CENTRAL_RECORD,
    CHUNK,
    DEFLATED,
    EOCD,
    EOCD64,
    EOCD64_LOCATOR,
    FOUR_GIB,
    LOCAL,
    U16,
    U32,
    decode_name,
    is_junk,
    truncated_error,
    zip64_fields,
)
from t2sql.errors import ArchiveError, T2sqlError

__all__ = ["Directory", "Member", "NoDirectory", "find_directory", "locate", "open_archive", "stored_span"]


@dataclass(frozen=True)
class Member:
    """One entry of a central directory."""

    name: str
    flags: int
    method: int
    crc: int
    compressed_size: int
    size: int
    header_offset: int
    exact_sizes: bool  # sizes from a ZIP64 extra; else 32-bit fields (wrapped modulo 4 GiB past 4 GiB)


def open_archive(archive: Path) -> BinaryIO:
    try:
        return open(archive, "rb")
    except FileNotFoundError:
        raise ArchiveError(f"{archive} does not exist; download it again", archive=str(archive)) from None
    except OSError as e:
        raise ArchiveError(f"cannot read {archive}: {e.strerror}", archive=str(archive)) from None


@dataclass(frozen=True)
class Directory:
    """Where a zip's central directory lies, from its end records (positions from the zip's start)."""

    start: int  # where it starts
    size: int
    count: int  # members it lists (0xFFFF: unknown, from a 16-bit field that overflowed)
    shift: int  # to add to the recorded offsets (bytes prepended to the zip); offsets may still wrap
    file_size: int  # the zip's own size


class NoDirectory(T2sqlError):
    """A zip's end records are missing or point outside it; the message says which."""


def find_directory(size: int, read_at: Callable[[int, int], bytes]) -> Directory:
    """The central directory of a zip of `size` bytes, as its end records give it; `read_at(at, n)` reads
    `n` bytes at `at` (fewer, or none, where it has no bytes). NoDirectory when they are not there."""
    tail_len = min(size, 22 + U16 + 20)
    tail = read_at(size - tail_len, tail_len)
    pos = tail.rfind(EOCD)
    while pos >= 0 and not (pos + 22 <= len(tail) and pos + 22 + struct.unpack_from("<H", tail, pos + 20)[0]
                            <= len(tail)):
        pos = tail.rfind(EOCD, 0, pos)
    if pos < 0:
        raise NoDirectory("no end-of-central-directory record at its end")
    eocd_at = size - tail_len + pos
    _, _, _, _, count, cd_size, cd_offset, _ = struct.unpack_from("<4s4H2LH", tail, pos)
    cd_end = eocd_at
    if pos >= 20 and tail[pos - 20:pos - 16] == EOCD64_LOCATOR:
        (record_offset,) = struct.unpack_from("<Q", tail, pos - 12)
        record = b""
        for at in (eocd_at - 20 - 56, record_offset):  # where it lies (no extensible data), where it says
            if 0 <= at <= size - 56:
                record = read_at(at, 56)
                if record[:4] == EOCD64 and len(record) == 56:
                    cd_end = at
                    break
        if record[:4] != EOCD64 or len(record) != 56:
            raise NoDirectory("its ZIP64 end-of-central-directory record is missing")
        count, cd_size, cd_offset = struct.unpack_from("<3Q", record, 32)
    cd_start = cd_end - cd_size
    if cd_start < 0:
        raise NoDirectory("its central directory lies outside the file")
    shift = cd_start - cd_offset
    if shift % FOUR_GIB == 0:  # none, or 32-bit offsets wrapped past 4 GiB (found member by member)
        shift = 0
    return Directory(cd_start, cd_size, count, shift, size)


def _directory(f: BinaryIO, archive: Path) -> Directory:
    """The archive's central directory, as its end records give it."""

    def read_at(at: int, n: int) -> bytes:
        f.seek(at)
        return f.read(n)

    try:
        return find_directory(os.fstat(f.fileno()).st_size, read_at)
    except NoDirectory as e:
        raise truncated_error(archive, str(e)) from None


def _members(f: BinaryIO, archive: Path, cd: Directory) -> Iterator[Member]:
    """The members the central directory lists, in its order, read a chunk at a time (the file position is
    the caller's between two members: each read seeks first)."""
    buf, p, at, end, listed = b"", 0, cd.start, cd.start + cd.size, 0
    while True:
        if len(buf) - p < 46 + 3 * U16 and at < end:  # the longest record may lie partly past the buffer
            f.seek(at)
            more = f.read(min(CHUNK, end - at))
            if not more:
                raise truncated_error(archive, "its central directory is cut short")
            buf, p, at = buf[p:] + more, 0, at + len(more)
        if p + 46 > len(buf) or buf[p:p + 4] != CENTRAL:
            break
        (_, _, _, flags, method, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         offset) = CENTRAL_RECORD.unpack_from(buf, p)
        if p + 46 + nlen + xlen + clen > len(buf):
            raise truncated_error(archive, "its central directory is cut short")
        raw = buf[p + 46:p + 46 + nlen]
        extra = buf[p + 46 + nlen:p + 46 + nlen + xlen]
        exact = False
        wide = zip64_fields(extra, [usize == U32, csize == U32, offset == U32])
        if wide[0] is not None:
            usize, exact = wide[0], True
        if wide[1] is not None:
            csize, exact = wide[1], True
        if wide[2] is not None:
            offset = wide[2]
        if cd.file_size < FOUR_GIB:
            exact = True  # nothing in a file under 4 GiB can have wrapped
        yield Member(decode_name(raw, flags), flags, method, crc, csize, usize, offset + cd.shift, exact)
        listed += 1
        p += 46 + nlen + xlen + clen
    if listed != cd.count and cd.count != U16:
        raise truncated_error(archive, f"its central directory lists {listed} of {cd.count} members")


def locate(f: BinaryIO, archive: Path, inner_member: str) -> tuple[Member, int, int]:
    """The member named `inner_member` (the last one, as unzip takes it), where its data starts, and where
    its data must end by (the next member's local header, or the central directory). Two passes over the
    directory: find the member, then the nearest header after it."""
    cd = _directory(f, archive)
    member, names = None, []
    for index, m in enumerate(_members(f, archive, cd)):
        if m.name == inner_member:
            member, member_index = m, index
        elif sum(map(len, names)) < 300 and not is_junk(m.name):
            names.append(m.name)
    if member is None:
        listed = ", ".join(names)[:300]
        raise ArchiveError(
            f"{archive} has no member {inner_member} (it holds: {listed or 'nothing'}); it is not the archive "
            f"expected: delete it and run again to download it again", archive=str(archive), member=inner_member)
    offset = _find_local_header(f, member.header_offset, cd.start)
    if offset is None:
        raise truncated_error(archive, f"no local header for {inner_member} where its directory says", inner_member)
    f.seek(offset)
    header = f.read(30)
    _, _, _, _, _, _, _, _, _, nlen, xlen = struct.unpack("<4s5H3L2H", header)
    data_start = offset + 30 + nlen + xlen
    limit = cd.start
    for index, m in enumerate(_members(f, archive, cd)):
        recorded = m.header_offset
        if index == member_index or recorded >= limit or (recorded <= offset and recorded + FOUR_GIB >= limit):
            continue  # no place it may lie (recorded, or a multiple of 4 GiB further on) is nearer
        found = _find_local_header(f, recorded, cd.start, probe_only=True)
        if found is not None and offset < found < limit:
            limit = found
    if not member.exact_sizes or member.method == DEFLATED:
        pass  # the data ends by `limit`; a deflate stream says itself where
    elif data_start + member.compressed_size > limit:
        raise truncated_error(archive, f"{inner_member} runs past the end of the data", inner_member)
    return member, data_start, limit


def _find_local_header(f: BinaryIO, recorded: int, cd_start: int, probe_only: bool = False) -> int | None:
    """Where a local header recorded at `recorded` lies: there, or a multiple of 4 GiB further on (32-bit
    offsets wrapped past 4 GiB)."""
    at = recorded
    while at + 30 <= cd_start:
        f.seek(at)
        if f.read(4) == LOCAL:
            return at
        if recorded > U32 or probe_only and at > recorded + 8 * FOUR_GIB:
            return None
        at += FOUR_GIB
    return None


def stored_span(f: BinaryIO, member: Member, data_start: int, limit: int) -> int:
    """The true size of a stored member whose 32-bit size may have wrapped: the first candidate (the
    recorded size plus a multiple of 4 GiB) followed by a zip signature (the next header, a descriptor,
    the central directory) or by a descriptor without one (the member's CRC); else the recorded size."""
    size = member.compressed_size
    while data_start + size <= limit:
        f.seek(data_start + size)
        after = f.read(4)
        if after[:2] == b"PK" or after == struct.pack("<L", member.crc):
            return size
        size += FOUR_GIB
    return member.compressed_size
