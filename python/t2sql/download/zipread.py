"""t2sql's own reading of the zip format, for the nested zips t2sql.download.archive lays out: the outer
archive's directory, its member read as a stream, and the readers of the inner zip's entries.

- The outer archive's central directory is read from its end (EOCD; the ZIP64 locator and record; ZIP64
  extra fields), so archives and members over 4 GiB work. An archive written with 32-bit fields past 4 GiB
  (macOS's Archive Utility does this: offsets and sizes wrap modulo 4 GiB) is read too: a local header that is
  not where the directory says is looked for 4 GiB further on, and a deflated member ends where its deflate
  stream ends; its sizes are then checked modulo 4 GiB. The directory is read record by record
  (`_members`), twice at most, never held whole.
- `_Stream` gives the outer member's bytes decompressed (deflate or stored), forward only: nothing seeks
  backwards in a decompressed stream. Its CRC32 and sizes are checked at its end; a member whose size is
  recorded exactly inflates to that size and no further.
- An inner entry's data is read by `_inflate` (to its deflate stream's end, and never past the size its
  local header records when it records one), `_copy` (a known size) or `_copy_to_descriptor` (a stored entry
  whose size comes after it: one pass, each byte searched and hashed once); a data descriptor (flag bit 3;
  32- or 64-bit sizes, with or without the signature) is read by `_descriptor` and must match what passed.
  Each gives back the CRC32 and sizes of what passed, for the caller to check. The inner zip's own central
  directory comes last in the stream: `_directory_digest` reads it record by record, for the caller to hold
  against the entries that passed through (`_entry_digest`).
- Time: linear in the bytes unpacked and the number of entries; an entry costs its own bytes plus a first
  read of `_FIRST_READ` bytes, whatever lies after it in the stream.
- Memory: chunks of 1 MiB in, at most 4 MiB out of one decompress call; nothing grows with the number of
  entries.

Nothing here writes a file: the bytes go to the caller's sink.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Protocol

from t2sql.errors import ArchiveError
from t2sql.progress import Progress

CHUNK = 1 << 20  # bytes read from the archive at a time
MAX_OUT = 4 << 20  # most bytes one decompress call may produce (a run of zeros inflates 1000x)
# An inner entry's first read from the stream, doubled on each further read up to CHUNK: a tiny entry costs
# little whatever lies after it, a large one soon reads whole chunks.
_FIRST_READ = 512

_LOCAL = b"PK\x03\x04"
_CENTRAL = b"PK\x01\x02"
_EOCD = b"PK\x05\x06"
_EOCD64 = b"PK\x06\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"
_DESCRIPTOR = b"PK\x07\x08"
_U16 = 0xFFFF
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1
_4G = 1 << 32
_STORED, _DEFLATED = 0, 8


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


class _Sink(Protocol):
    """What the entry readers need of t2sql.download.archive's _Sink: where an entry's bytes go."""

    def write(self, data: bytes) -> None: ...


class _Walk(Protocol):
    """What the entry readers need of t2sql.download.archive's _Walk: where the inner zip is (for their
    errors)."""

    archive: Path
    inner: str


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


@dataclass(frozen=True)
class _Directory:
    """Where an archive's central directory lies, from its end records."""

    start: int  # where it starts in the file
    size: int
    count: int  # members it lists (0xFFFF: unknown, from a 16-bit field that overflowed)
    shift: int  # to add to the recorded offsets (bytes prepended to the zip); offsets may still wrap
    file_size: int


def _directory(f: BinaryIO, archive: Path) -> _Directory:
    """The archive's central directory, as its end records give it."""
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
    return _Directory(cd_start, cd_size, count, shift, size)


def _members(f: BinaryIO, archive: Path, cd: _Directory) -> Iterator[_Member]:
    """The members the central directory lists, in its order, read a chunk at a time (the file position is
    the caller's between two members: each read seeks first)."""
    buf, p, at, end, listed = b"", 0, cd.start, cd.start + cd.size, 0
    while True:
        if len(buf) - p < 46 + 3 * _U16 and at < end:  # the longest record may lie partly past the buffer
            f.seek(at)
            more = f.read(min(CHUNK, end - at))
            if not more:
                raise _truncated(archive, "its central directory is cut short")
            buf, p, at = buf[p:] + more, 0, at + len(more)
        if p + 46 > len(buf) or buf[p:p + 4] != _CENTRAL:
            break
        (_, _, _, flags, method, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         offset) = struct.unpack_from("<4s6H3L5HLL", buf, p)
        if p + 46 + nlen + xlen + clen > len(buf):
            raise _truncated(archive, "its central directory is cut short")
        raw = buf[p + 46:p + 46 + nlen]
        extra = buf[p + 46 + nlen:p + 46 + nlen + xlen]
        exact = False
        wide = _zip64_fields(extra, [usize == _U32, csize == _U32, offset == _U32])
        if wide[0] is not None:
            usize, exact = wide[0], True
        if wide[1] is not None:
            csize, exact = wide[1], True
        if wide[2] is not None:
            offset = wide[2]
        if cd.file_size < _4G:
            exact = True  # nothing in a file under 4 GiB can have wrapped
        yield _Member(_decode(raw, flags), flags, method, crc, csize, usize, offset + cd.shift, exact)
        listed += 1
        p += 46 + nlen + xlen + clen
    if listed != cd.count and cd.count != _U16:
        raise _truncated(archive, f"its central directory lists {listed} of {cd.count} members")


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
    """The member named `inner_member` (the last one, as unzip takes it), where its data starts, and where
    its data must end by (the next member's local header, or the central directory). Two passes over the
    directory: find the member, then the nearest header after it."""
    cd = _directory(f, archive)
    member, names = None, []
    for index, m in enumerate(_members(f, archive, cd)):
        if m.name == inner_member:
            member, member_index = m, index
        elif sum(map(len, names)) < 300 and not _is_junk(m.name):
            names.append(m.name)
    if member is None:
        listed = ", ".join(names)[:300]
        raise ArchiveError(
            f"{archive} has no member {inner_member} (it holds: {listed or 'nothing'}); it is not the archive "
            f"expected: delete it and run again to download it again", archive=str(archive), member=inner_member)
    offset = _find_local_header(f, member.header_offset, cd.start)
    if offset is None:
        raise _truncated(archive, f"no local header for {inner_member} where its directory says", inner_member)
    f.seek(offset)
    header = f.read(30)
    _, _, _, _, _, _, _, _, _, nlen, xlen = struct.unpack("<4s5H3L2H", header)
    data_start = offset + 30 + nlen + xlen
    limit = cd.start
    for index, m in enumerate(_members(f, archive, cd)):
        recorded = m.header_offset
        if index == member_index or recorded >= limit or (recorded <= offset and recorded + _4G >= limit):
            continue  # no place it may lie (recorded, or a multiple of 4 GiB further on) is nearer
        found = _find_local_header(f, recorded, cd.start, probe_only=True)
        if found is not None and offset < found < limit:
            limit = found
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
    """The outer member's bytes, decompressed, read forward only; its CRC32, size and compressed length are
    counted as they pass. `buf[at:]` is what was produced and not yet consumed; the bytes before `at` stay
    until the next refill, so that the last read can be given back (`unread`)."""

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
        self.at = 0
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
            m = self.member
            room = min(MAX_OUT, m.size - self.size + 1) if m.exact_sizes else MAX_OUT  # one byte over tells
            try:
                out = self.dec.decompress(data, room)
            except zlib.error as e:
                raise _damaged(self.archive, m.name, f"its compressed data is corrupt: {e}") from None
            if m.exact_sizes and self.size + len(out) > m.size:
                raise _damaged(self.archive, m.name, f"it inflates past the {m.size} bytes its directory records")
        self.crc = zlib.crc32(out, self.crc)
        self.size += len(out)
        self.bar.advance(len(out))
        self.buf += out

    def _fill(self, n: int) -> None:
        """At least `n` bytes unconsumed, unless the member ends first."""
        if len(self.buf) - self.at >= n:
            return
        del self.buf[:self.at]  # cheap: a bytearray drops its head by moving its start
        self.at = 0
        while len(self.buf) < n and not self.done:
            self._produce()

    def peek(self, n: int) -> bytes:
        """The next `n` bytes (fewer only at the end), not consumed."""
        self._fill(n)
        return bytes(self.buf[self.at:self.at + n])

    def skip(self, n: int) -> None:
        """Consume `n` bytes that a peek returned."""
        assert n <= len(self.buf) - self.at
        self.at += n

    def read(self, n: int, what: str) -> bytes:
        at = self.at
        if len(self.buf) - at < n:
            self._fill(n)
            at = self.at
            if len(self.buf) - at < n:
                raise _truncated(self.archive, f"{self.member.name} ends inside {what}", self.member.name)
        self.at = at + n
        return bytes(self.buf[at:at + n])

    def read_some(self, limit: int) -> bytes:
        """Up to `limit` bytes (b"" only at the end)."""
        self._fill(1)
        out = bytes(self.buf[self.at:self.at + limit])
        self.at += len(out)
        return out

    def unread(self, n: int) -> None:
        """Give back the last `n` bytes of the last read (not a seek: they were never dropped)."""
        assert n <= self.at
        self.at -= n

    def finish(self) -> None:
        """Read the rest, then check the member's CRC32 and sizes."""
        while True:
            self.at = len(self.buf)
            self._fill(1)
            if len(self.buf) == self.at:
                break
        m = self.member
        used = self.pos - self.start - (len(self.dec.unused_data) if self.dec is not None else 0)
        sizes_ok = (self.size, used) == (m.size, m.compressed_size) if m.exact_sizes else (
            self.size % _4G == m.size % _4G and used % _4G == m.compressed_size % _4G)
        if self.crc != m.crc or not sizes_ok:
            raise _damaged(self.archive, m.name, _mismatch(m.crc, self.crc, m.size, self.size))


def _damaged(archive: Path, member: str, what: str, inside: str | None = None) -> ArchiveError:
    where = f"{member} (inside {inside} in {archive})" if inside else f"{member} in {archive}"
    return ArchiveError(f"{where} is damaged: {what}; delete {archive} and run again to download it again",
                        archive=str(archive), member=member)


def _mismatch(want_crc: int, got_crc: int, want_size: int, got_size: int) -> str:
    if want_crc != got_crc:
        return f"CRC32 mismatch (recorded {want_crc:08x}, computed {got_crc:08x})"
    return f"size mismatch (recorded {want_size} bytes, got {got_size})"

def _is_junk(name: str) -> bool:
    parts = name.split("/")
    return parts[0] == "__MACOSX" or any(p.startswith("._") or p == ".DS_Store" for p in parts)



# ---------------------------------------------------------------------------------- the inner zip's entries


def _has_tag(extra: bytes, tag: int) -> bool:
    i = 0
    while i + 4 <= len(extra):
        t, length = struct.unpack_from("<HH", extra, i)
        if t == tag:
            return True
        i += 4 + length
    return False


def _inflate(stream: _Stream, sink: _Sink, name: str, walk: _Walk, declared: int | None) -> tuple[int, int, int]:
    """Inflate one entry to its deflate stream's end, and never past `declared` (the size its local header
    records; None when its size comes after it, in a data descriptor): an entry that would is refused, with
    at most `declared` bytes given to the sink. What was read past its end is given back to the stream."""
    dec = zlib.decompressobj(-15)
    crc = size = used = 0
    want = _FIRST_READ
    while not dec.eof:
        data = dec.unconsumed_tail
        if not data:
            data = stream.read_some(want)
            want = min(CHUNK, 2 * want)
            if not data:
                raise _truncated(walk.archive, f"{name} in {walk.inner} ends early", name)
            used += len(data)
        room = MAX_OUT if declared is None else min(MAX_OUT, declared - size + 1)  # one byte over tells
        try:
            out = dec.decompress(data, room)
        except zlib.error as e:
            raise _damaged(walk.archive, name, f"its compressed data is corrupt: {e}", walk.inner) from None
        if declared is not None and size + len(out) > declared:
            raise _damaged(walk.archive, name, f"it inflates past the {declared} bytes its header records",
                           walk.inner)
        if out:
            sink.write(out)
            crc = zlib.crc32(out, crc)
            size += len(out)
    if dec.unused_data:
        stream.unread(len(dec.unused_data))
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


# A data descriptor's signature, where what follows it (12 or 20 bytes: CRC32 and two 32- or 64-bit sizes) is
# followed by what may come after an entry (the next entry, the directory, or the end records): the walk refuses
# anything else there, so no other signature can end a stored entry. The search runs in C: only a signature so
# followed is looked at in Python.
_NEXT = b"|".join(re.escape(signature) for signature in (_LOCAL, _CENTRAL, _EOCD64, _EOCD))
_DESCRIPTOR_THEN_NEXT = re.compile(re.escape(_DESCRIPTOR) + rb"(?=(?:.{12}|.{20})(?:" + _NEXT + rb"))", re.DOTALL)
_DESCRIPTOR_REACH = 4 + 20 + 4  # the bytes from a signature to the end of what must follow it
_SIZE_LOW = struct.Struct("<L")


def _copy_to_descriptor(stream: _Stream, sink: _Sink, name: str, walk: _Walk) -> tuple[int, int, int]:
    """A stored entry whose size is only in the descriptor after it: copy up to the first descriptor
    signature followed by the CRC32 and size of the bytes before it (a false match needs a CRC collision), and
    then by the next entry or the directory. One pass, each byte searched once and hashed once, however many
    signatures the data holds: a candidate costs a look at the size after it, and only one whose size is right
    brings the CRC32 (which runs on from the last one) up to it."""
    crc = size = 0  # of the bytes given to the sink
    want = _FIRST_READ
    while True:
        window = stream.peek(want + _DESCRIPTOR_REACH - 1)
        at_end = len(window) < want + _DESCRIPTOR_REACH - 1
        # A signature at or past `settled` may have what follows it in the next window (unless the stream ends).
        settled = len(window) if at_end else want
        view = memoryview(window)
        run_crc, run_at = crc, 0
        for found in _DESCRIPTOR_THEN_NEXT.finditer(window, 0, len(window)):
            i = found.start()
            if i >= settled:
                break
            n = size + i
            if _SIZE_LOW.unpack_from(window, i + 8)[0] != n & _U32:  # both layouts: CRC32, then the size's low half
                continue
            run_crc, run_at = zlib.crc32(view[run_at:i], run_crc), i
            for fields, mask in (("<LLL", _U32), ("<LQQ", _U64)):
                if i + 4 + struct.calcsize(fields) <= len(window) and \
                        struct.unpack_from(fields, window, i + 4) == (run_crc, n & mask, n & mask):
                    sink.write(view[:i])
                    stream.skip(i)
                    return run_crc, n, n
        if at_end:
            raise _truncated(walk.archive, f"{name} in {walk.inner} has no data descriptor after it", name)
        sink.write(view[:settled])
        crc, size = zlib.crc32(view[run_at:settled], run_crc), size + settled
        stream.skip(settled)
        want = min(CHUNK, 2 * want)


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


def _entry_digest(raw_name: bytes, crc: int, size: int) -> int:
    """One entry's share of the digest that holds the inner zip's directory against the entries that passed
    through (its name as stored, CRC32 and size modulo 4 GiB, as a 32-bit directory field holds it). Shares
    are added modulo 2**128, so the sum does not depend on the order and memory does not grow with the
    number of entries."""
    key = raw_name + struct.pack("<LL", crc, size & _U32)
    return int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little")


_DIGEST_MODULUS = 1 << 128


def _directory_digest(stream: _Stream) -> tuple[int, int]:
    """Read the inner zip's central directory where the stream stands, record by record: the number of
    files it lists and the sum of their `_entry_digest`s."""
    count = digest = 0
    while stream.peek(4) == _CENTRAL:
        record = stream.read(46, "its central directory")
        (_, _, _, _, _, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         offset) = struct.unpack("<4s6H3L5HLL", record)
        rest = stream.read(nlen + xlen + clen, "its central directory")
        raw, extra = rest[:nlen], rest[nlen:nlen + xlen]
        wide = _zip64_fields(extra, [usize == _U32, csize == _U32, offset == _U32])
        if wide[0] is not None:
            usize = wide[0]
        digest = (digest + _entry_digest(raw, crc, usize)) % _DIGEST_MODULUS
        count += 1
    return count, digest
