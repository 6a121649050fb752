"""The bounded inflater of the outer archive's member: `MemberStream` gives its bytes decompressed (deflate or
stored), forward only (`peek` looks ahead, `unread` gives back the tail of the last read), counts its CRC32 and
sizes and checks them at its end (`finish`), never inflating past its recorded size. Nothing here writes a file."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import BinaryIO

from t2sql.download.zipdirectory import Member, stored_span
from t2sql.download.zipformat import (
    CHUNK,
    DEFLATED,
    FOUR_GIB,
    MAX_OUT,
    STORED,
    damaged_error,
    mismatch,
    truncated_error,
)
from t2sql.errors import ArchiveError
from t2sql.progress import Progress

__all__ = ["MemberStream"]


class MemberStream:
    """The outer member's bytes, decompressed, read forward only; its CRC32, size and compressed length are
    counted as they pass. `buf[at:]` is what was produced and not yet consumed; the bytes before `at` stay
    until the next refill, so that the last read can be given back (`unread`)."""

    def __init__(self, f: BinaryIO, archive: Path, member: Member, data_start: int, limit: int, bar: Progress):
        self.f, self.archive, self.member, self.bar = f, archive, member, bar
        self.pos = data_start
        self.start = data_start
        if member.method == STORED:
            length = member.compressed_size if member.exact_sizes else stored_span(f, member, data_start, limit)
            self.end = data_start + length
            self.dec = None
        elif member.method == DEFLATED:
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

    @property
    def offset(self) -> int:
        """Where the next unconsumed byte lies in the member (for the inner zip: its offset in that zip)."""
        return self.size - (len(self.buf) - self.at)

    def _produce(self) -> None:
        if self.dec is None:
            n = min(CHUNK, self.end - self.pos)
            if n <= 0:
                self.done = True
                return
            out = self.f.read(n)
            if len(out) < n:
                raise truncated_error(self.archive, f"the data of {self.member.name} ends early", self.member.name)
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
                    raise truncated_error(self.archive, f"the compressed data of {self.member.name} ends early",
                                     self.member.name)
            m = self.member
            room = min(MAX_OUT, m.size - self.size + 1) if m.exact_sizes else MAX_OUT  # one byte over tells
            try:
                out = self.dec.decompress(data, room)
            except zlib.error as e:
                raise damaged_error(self.archive, m.name, f"its compressed data is corrupt: {e}") from None
            if m.exact_sizes and self.size + len(out) > m.size:
                raise damaged_error(self.archive, m.name, f"it inflates past the {m.size} bytes its directory records")
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
                raise truncated_error(self.archive, f"{self.member.name} ends inside {what}", self.member.name)
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
            self.size % FOUR_GIB == m.size % FOUR_GIB and used % FOUR_GIB == m.compressed_size % FOUR_GIB)
        if self.crc != m.crc or not sizes_ok:
            raise damaged_error(self.archive, m.name, mismatch(m.crc, self.crc, m.size, self.size))
