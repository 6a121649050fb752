"""Reading the inner zip's entries from the outer member's stream: each entry's data (`inflate_entry`, `copy_entry`,
`copy_to_descriptor`, never past the caller's `Bound`), its data descriptor (`read_descriptor`) and, last in the
stream, the inner zip's own central directory (`directory_digest`). Each gives back the CRC32 and sizes of what
passed, for the caller to check. Nothing here writes a file."""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from t2sql.download.zipformat import (
    CENTRAL,
    CENTRAL_RECORD,
    CHUNK,
    DESCRIPTOR,
    EOCD,
    EOCD64,
    LOCAL,
    MAX_OUT,
    U32,
    U64,
    damaged_error,
    truncated_error,
    zip64_fields,
)
from t2sql.download.zipstream import MemberStream

__all__ = ["DIGEST_MODULUS", "Bound", "copy_entry", "copy_to_descriptor", "directory_digest", "entry_digest",
           "inflate_entry", "read_descriptor"]

# An inner entry's first read from the stream, doubled on each further read up to CHUNK: a tiny entry costs
# little whatever lies after it, a large one soon reads whole chunks.
_FIRST_READ = 512


class _Sink(Protocol):
    """What the entry readers need of where an entry's bytes go (t2sql.download.archive's sink)."""

    def write(self, data: bytes) -> None: ...


class _Walk(Protocol):
    """What the entry readers need of the walk over the inner zip (t2sql.download.archive's): where the inner
    zip is, for their errors."""

    archive: Path
    inner: str


@dataclass(frozen=True)
class Bound:
    """The most bytes an entry may give the sink, and what sets that, for the refusal ("its header records")."""

    size: int
    what: str


def inflate_entry(stream: MemberStream, sink: _Sink, name: str, walk: _Walk, bound: Bound) -> tuple[int, int, int]:
    """Inflate one entry to its deflate stream's end, and never past `bound`: an entry that would is refused,
    with at most `bound.size` bytes given to the sink. What was read past its end is given back to the
    stream."""
    dec = zlib.decompressobj(-15)
    crc = size = used = 0
    want = _FIRST_READ
    while not dec.eof:
        data = dec.unconsumed_tail
        if not data:
            data = stream.read_some(want)
            want = min(CHUNK, 2 * want)
            if not data:
                raise truncated_error(walk.archive, f"{name} in {walk.inner} ends early", name)
            used += len(data)
        try:
            out = dec.decompress(data, min(MAX_OUT, bound.size - size + 1))  # one byte over tells
        except zlib.error as e:
            raise damaged_error(walk.archive, name, f"its compressed data is corrupt: {e}", walk.inner) from None
        if size + len(out) > bound.size:
            raise damaged_error(walk.archive, name, f"it inflates past the {bound.size} bytes {bound.what}",
                                walk.inner)
        if out:
            sink.write(out)
            crc = zlib.crc32(out, crc)
            size += len(out)
    if dec.unused_data:
        stream.unread(len(dec.unused_data))
        used -= len(dec.unused_data)
    return crc, size, used


def copy_entry(stream: MemberStream, sink: _Sink, size: int, name: str) -> tuple[int, int, int]:
    crc = done = 0
    while done < size:
        data = stream.read_some(min(CHUNK, size - done))
        if not data:
            raise truncated_error(stream.archive, f"{name} ends early", name)
        sink.write(data)
        crc = zlib.crc32(data, crc)
        done += len(data)
    return crc, done, done


# A data descriptor's signature, where what follows it (12 or 20 bytes: CRC32 and two 32- or 64-bit sizes) is
# followed by what may come after an entry (the next entry, the directory, or the end records): the walk refuses
# anything else there, so no other signature can end a stored entry. The search runs in C: only a signature so
# followed is looked at in Python.
_NEXT = b"|".join(re.escape(signature) for signature in (LOCAL, CENTRAL, EOCD64, EOCD))
_DESCRIPTOR_THEN_NEXT = re.compile(re.escape(DESCRIPTOR) + rb"(?=(?:.{12}|.{20})(?:" + _NEXT + rb"))", re.DOTALL)
_DESCRIPTOR_REACH = 4 + 20 + 4  # the bytes from a signature to the end of what must follow it
_SIZE_LOW = struct.Struct("<L")


def copy_to_descriptor(stream: MemberStream, sink: _Sink, name: str, walk: _Walk, bound: Bound
                       ) -> tuple[int, int, int]:
    """A stored entry whose size is only in the descriptor after it: copy up to the first descriptor
    signature followed by the CRC32 and size of the bytes before it (a false match needs a CRC collision), and
    then by the next entry or the directory, and never past `bound`: an entry that runs past it is refused,
    with at most `bound.size` bytes given to the sink. One pass, each byte searched once and hashed once,
    however many signatures the data holds: a candidate costs a look at the size after it, and only one whose
    size is right brings the CRC32 (which runs on from the last one) up to it."""
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
            if n > bound.size:
                break  # refused below: no descriptor further on can end it within its bound
            if _SIZE_LOW.unpack_from(window, i + 8)[0] != n & U32:  # both layouts: CRC32, then the size's low half
                continue
            run_crc, run_at = zlib.crc32(view[run_at:i], run_crc), i
            for fields, mask in (("<LLL", U32), ("<LQQ", U64)):
                if i + 4 + struct.calcsize(fields) <= len(window) and \
                        struct.unpack_from(fields, window, i + 4) == (run_crc, n & mask, n & mask):
                    sink.write(view[:i])
                    stream.skip(i)
                    return run_crc, n, n
        if size + settled > bound.size:
            raise damaged_error(walk.archive, name, f"it runs past the {bound.size} bytes {bound.what}", walk.inner)
        if at_end:
            raise truncated_error(walk.archive, f"{name} in {walk.inner} has no data descriptor after it", name)
        sink.write(view[:settled])
        crc, size = zlib.crc32(view[run_at:settled], run_crc), size + settled
        stream.skip(settled)
        want = min(CHUNK, 2 * want)


def read_descriptor(stream: MemberStream, zip64: bool, crc: int, size: int, used: int, name: str, walk: _Walk
                ) -> tuple[int, int]:
    """Read the data descriptor after an entry: the layout (signature or not, 32- or 64-bit sizes) that
    matches what passed is taken; when none does, the recorded CRC and size are returned for the error."""
    head = stream.peek(24)
    layouts = [(True, True), (True, False), (False, True), (False, False)]
    if not zip64:
        layouts = [(True, False), (True, True), (False, False), (False, True)]
    first = None
    for signed, wide in layouts:
        if signed and head[:4] != DESCRIPTOR:
            continue
        fmt = ("<4s" if signed else "<") + ("LQQ" if wide else "LLL")
        length = struct.calcsize(fmt)
        if len(head) < length:
            continue
        values = struct.unpack_from(fmt, head)[1 if signed else 0:]
        rcrc, rcsize, rusize = values
        first = first or (length, rcrc, rusize)
        mask = (1 << 64) - 1 if wide else U32
        if (rcrc, rcsize, rusize) == (crc, used & mask, size & mask):
            stream.read(length, "a data descriptor")
            return rcrc, size
    if first is None:
        raise truncated_error(walk.archive, f"{name} in {walk.inner} has no data descriptor after it", name)
    stream.read(first[0], "a data descriptor")
    return first[1], first[2]


def entry_digest(raw_name: bytes, crc: int, size: int) -> int:
    """One entry's share of the digest that holds the inner zip's directory against the entries that passed
    through (its name as stored, CRC32 and size modulo 4 GiB, as a 32-bit directory field holds it). Shares
    are added modulo 2**128, so the sum does not depend on the order and memory does not grow with the
    number of entries."""
    key = raw_name + struct.pack("<LL", crc, size & U32)
    return int.from_bytes(hashlib.blake2b(key, digest_size=16).digest(), "little")


DIGEST_MODULUS = 1 << 128


def directory_digest(stream: MemberStream) -> tuple[int, int]:
    """Read the inner zip's central directory where the stream stands, record by record: the number of
    files it lists and the sum of their `entry_digest`s."""
    count = digest = 0
    while stream.peek(4) == CENTRAL:
        record = stream.read(CENTRAL_RECORD.size, "its central directory")
        (_, _, _, _, _, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _, offset) = CENTRAL_RECORD.unpack(record)
        rest = stream.read(nlen + xlen + clen, "its central directory")
        raw, extra = rest[:nlen], rest[nlen:nlen + xlen]
        wide = zip64_fields(extra, [usize == U32, csize == U32, offset == U32])
        if wide[0] is not None:
            usize = wide[0]
        digest = (digest + entry_digest(raw, crc, usize)) % DIGEST_MODULUS
        count += 1
    return count, digest
