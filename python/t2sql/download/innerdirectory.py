"""The inner zip's central directory, read ahead of its entries (`read_ahead`): the bound of an entry whose sizes come
only after its data (a data descriptor, flag bit 3), known before a byte of it is written
(`InnerDirectory.size_bound`). The first pass over a deflated member keeps its tail and the inflater's state at a
few points before its end, and reads the records by inflating on from there (nothing here writes a file):
docs/development.md, "How `download/` reads BIRD's zips"."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from t2sql.download.zipdirectory import Directory, Member, NoDirectory, find_directory, open_archive, stored_span
from t2sql.download.zipformat import (
    CENTRAL,
    CENTRAL_RECORD,
    DEFLATE_MAX_RATIO,
    DEFLATED,
    FOUR_GIB,
    MAX_OUT,
    STORED,
    U32,
    zip64_fields,
)

__all__ = ["InnerDirectory", "read_ahead", "wrapped_size_bound"]

# The end records lie in a zip's last 22 + 65,535 (the EOCD and its longest comment) + 20 + 56 (the ZIP64 locator
# and record) bytes.
_TAIL = 128 << 10
_NEAREST_POINT = 64 << 10  # the first pass keeps its state this far before the member's end, twice as far, ...
_READ = 64 << 10  # the most bytes one inflate call gives the directory's reader
# Compressed bytes read at a time by the first pass and the directory's reader: a copy of the inflater keeps
# the input it has not consumed yet, so this is what each point may hold besides the inflater's own state.
_PASS_READ = 64 << 10


def wrapped_size_bound(recorded: int, compressed: int, method: int) -> int:
    """The largest size an entry whose 32-bit size field says `recorded` may have (the field holds the size
    modulo 4 GiB), when its compressed bytes are known to be `compressed`: a stored entry holds as many bytes
    as it takes, a deflate stream inflates to less than DEFLATE_MAX_RATIO times its own."""
    most = compressed if method == STORED else DEFLATE_MAX_RATIO * compressed
    if most <= recorded:
        return recorded
    return recorded + (most - recorded) // FOUR_GIB * FOUR_GIB


@dataclass(frozen=True)
class _Record:
    raw_name: bytes
    compressed_size: int
    size: int
    offset: int  # of its local header in the inner zip
    exact_sizes: bool  # from a ZIP64 field, or in an inner zip under 4 GiB; else modulo 4 GiB
    exact_offset: bool


class _Reader(Protocol):
    def read(self, n: int) -> bytes: ...


class InnerDirectory:
    """The inner zip's central directory, read one record at a time as the walk asks (see the module's
    docstring); `close` lets go of its handle of the archive."""

    def __init__(self, f: BinaryIO, reader: _Reader, directory: Directory):
        self._f, self._reader, self._directory = f, reader, directory
        self._read = 0  # records read
        self._last: _Record | None = None  # the last one
        self._in_step = True

    def size_bound(self, rank: int, at: int, raw_name: bytes, method: int) -> tuple[int, bool] | None:
        """The most bytes the walk's entry of rank `rank` (0 for the first), whose local header lies at `at` in
        the inner zip under the name `raw_name` and which is compressed by `method`, may unpack to by its record,
        and whether that is its exact size; None when the directory is out of step with the data, or its record
        bounds nothing."""
        while self._in_step and self._read <= rank:
            self._last = self._next()
            self._read += 1
            self._in_step = self._last is not None
        record = self._last
        if not self._in_step or record is None or self._read != rank + 1:
            return None
        if record.raw_name != raw_name or (record.offset != at if record.exact_offset else
                                           (record.offset - at) % FOUR_GIB):
            self._in_step = False
            return None
        if record.exact_sizes:
            return record.size, True
        if record.compressed_size + FOUR_GIB <= self._directory.start - at:
            return None  # its compressed size may have wrapped too: it bounds nothing
        bound = wrapped_size_bound(record.size, record.compressed_size, method)
        return bound, bound == record.size  # no wrap possible: the size recorded is the size

    def _next(self) -> _Record | None:
        fixed = self._reader.read(CENTRAL_RECORD.size)
        if len(fixed) < CENTRAL_RECORD.size or fixed[:4] != CENTRAL:
            return None
        (_, _, _, _, _, _, _, _, csize, usize, nlen, xlen, clen, _, _, _, offset) = CENTRAL_RECORD.unpack(fixed)
        rest = self._reader.read(nlen + xlen + clen)
        if len(rest) < nlen + xlen + clen:
            return None
        wide_usize, wide_csize, wide_offset = zip64_fields(rest[nlen:nlen + xlen],
                                                           [usize == U32, csize == U32, offset == U32])
        small = self._directory.file_size < FOUR_GIB  # nothing in a zip under 4 GiB can have wrapped
        return _Record(rest[:nlen], csize if wide_csize is None else wide_csize,
                       usize if wide_usize is None else wide_usize,
                       (offset if wide_offset is None else wide_offset) + self._directory.shift,
                       small or wide_usize is not None, small or wide_offset is not None)

    def close(self) -> None:
        self._f.close()


def read_ahead(archive: Path, member: Member, data_start: int, limit: int) -> InnerDirectory | None:
    """The central directory of the zip that the outer `member` holds (its data from `data_start`, ending by
    `limit`), ready to be read in step with its entries; None where it cannot be reached (see the module's
    docstring)."""
    f = open_archive(archive)
    try:
        if member.method == STORED:
            length = member.compressed_size if member.exact_sizes else stored_span(f, member, data_start, limit)
            found = _in_range(f, data_start, length)
        elif member.method == DEFLATED and member.exact_sizes:
            found = _inflated_ahead(f, member, data_start)
        else:
            found = None
    except BaseException:
        f.close()
        raise
    if found is None:
        f.close()
        return None
    return InnerDirectory(f, *found)


def _in_range(f: BinaryIO, data_start: int, length: int) -> tuple[_Reader, Directory] | None:
    def read_at(at: int, n: int) -> bytes:
        f.seek(data_start + at)
        return f.read(max(0, min(n, length - at)))

    try:
        directory = find_directory(length, read_at)
    except NoDirectory:
        return None
    return _FileRange(f, data_start + directory.start, directory.size), directory


class _FileRange:
    """`length` bytes of the archive from `start`, read forward."""

    def __init__(self, f: BinaryIO, start: int, length: int):
        f.seek(start)
        self.f, self.left = f, length

    def read(self, n: int) -> bytes:
        data = self.f.read(min(n, self.left))
        self.left -= len(data)
        return data


@dataclass(frozen=True)
class _Point:
    """The first pass's inflater `out_at` bytes into the member: a copy of it (its state, and the input it had
    not consumed yet), and where in the archive the input it had not read yet starts."""

    out_at: int
    in_at: int
    state: Any  # a zlib decompress object


def _inflated_ahead(f: BinaryIO, member: Member, data_start: int) -> tuple[_Reader, Directory] | None:
    """The first pass over a deflated member of known size (see the module's docstring): its end records, and a
    reader of its directory inflating on from the last point before it."""
    size, end = member.size, data_start + member.compressed_size
    stops = sorted(size - (_NEAREST_POINT << k) for k in range(64) if _NEAREST_POINT << k < size)
    dec = zlib.decompressobj(-15)
    points = [_Point(0, data_start, dec.copy())]
    tail, tail_from = bytearray(), size - _TAIL
    f.seek(data_start)
    pos, out, pending = data_start, 0, b""
    while out < size:
        if not pending:
            pending = f.read(min(_PASS_READ, end - pos))
            pos += len(pending)
            if not pending:
                return None  # cut short: the walk says so when it gets there
        stop = stops[len(points) - 1] if len(points) - 1 < len(stops) else size
        try:
            got = dec.decompress(pending, min(MAX_OUT, stop - out))
        except zlib.error:
            return None  # corrupt: the walk says so when it gets there
        if not got and dec.eof:
            return None  # the stream ends short of its recorded size: likewise
        pending = dec.unconsumed_tail
        if out + len(got) > tail_from:
            tail += got[max(0, tail_from - out):]
        out += len(got)
        if out == stop < size:
            points.append(_Point(out, pos, dec.copy()))
    tail_at = size - len(tail)

    def read_at(at: int, n: int) -> bytes:
        return bytes(tail[at - tail_at:at - tail_at + n]) if at >= tail_at else b""

    try:
        directory = find_directory(size, read_at)
    except NoDirectory:
        return None
    point = max((p for p in points if p.out_at <= directory.start), key=lambda p: p.out_at)
    reader = _Inflating(f, point, end, directory.start + directory.size)
    reader.skip(directory.start - point.out_at)
    return reader, directory


class _Inflating:
    """A deflated member's bytes from a point of the first pass up to `stop`, inflated forward."""

    def __init__(self, f: BinaryIO, point: _Point, end: int, stop: int):
        f.seek(point.in_at)
        self.f, self.dec, self.pos, self.end = f, point.state.copy(), point.in_at, end
        self.out, self.stop = point.out_at, stop
        self.buf = bytearray()

    def read(self, n: int) -> bytes:
        """The next `n` bytes (fewer at the stop, or where the stream fails: the walk says why when it gets
        there)."""
        while len(self.buf) < n and self._inflate(n - len(self.buf)):
            pass
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def skip(self, n: int) -> None:
        """Pass `n` bytes, holding no more than `_READ` of them at a time."""
        while n > 0 and (self.buf or self._inflate(_READ)):
            take = min(n, len(self.buf))
            del self.buf[:take]
            n -= take

    def _inflate(self, want: int) -> bool:
        """Add up to `want` bytes to the buffer (at most `_READ`; perhaps none, when the input read held
        none); False when no more can come."""
        data = self.dec.unconsumed_tail
        if not data:
            data = self.f.read(min(_PASS_READ, self.end - self.pos))
            self.pos += len(data)
        if not data or self.out >= self.stop or self.dec.eof:
            return False
        try:
            got = self.dec.decompress(data, min(want, _READ, self.stop - self.out))
        except zlib.error:
            return False
        self.out += len(got)
        self.buf += got
        return bool(got) or not self.dec.eof
