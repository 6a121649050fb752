"""t2sql's own reading of the zip format, for the nested zips t2sql.download.archive lays out: the outer
archive's directory, its member read as a stream, and the readers of the inner zip's entries.

- The outer archive's central directory is read from its end (EOCD; the ZIP64 locator and record; ZIP64
  extra fields), so archives and members over 4 GiB work. An archive written with 32-bit fields past 4 GiB
  (macOS's Archive Utility does this: offsets and sizes wrap modulo 4 GiB) is read too: a local header that is
  not where the directory says is looked for 4 GiB further on, and a deflated member ends where its deflate
  stream ends; its sizes are then checked modulo 4 GiB.
- `_Stream` gives the outer member's bytes decompressed (deflate or stored), forward only: nothing seeks
  backwards in a decompressed stream. Its CRC32 and sizes are checked at its end.
- An inner entry's data is read by `_inflate` (to its deflate stream's end), `_copy` (a known size) or
  `_copy_to_descriptor` (a stored entry whose size comes after it); a data descriptor (flag bit 3; 32- or
  64-bit sizes, with or without the signature) is read by `_descriptor` and must match what passed. Each
  gives back the CRC32 and sizes of what passed, for the caller to check. `_cross_check` holds the inner
  zip's own central directory (it comes last in the stream) against the entries that passed through.
- Memory: chunks of 1 MiB in, at most 4 MiB out of one decompress call.

Nothing here writes a file: the bytes go to the caller's sink.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from t2sql.errors import ArchiveError
from t2sql.progress import Progress

CHUNK = 1 << 20  # bytes read from the archive at a time
MAX_OUT = 4 << 20  # most bytes one decompress call may produce (a run of zeros inflates 1000x)

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
    errors) and the entries that passed through it (name -> CRC32, for the cross-check)."""

    archive: Path
    inner: str
    seen: dict | None


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

