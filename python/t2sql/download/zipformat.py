"""What every reader of the zip format in t2sql.download shares: the format's signatures and field limits, the
readers' chunk sizes, the fields read alike in a central directory and a local header (ZIP64 extra fields, names),
and the errors of a damaged or cut-short archive. Nothing here reads a file."""

from __future__ import annotations

import struct
from pathlib import Path

from t2sql.errors import ArchiveError

__all__ = ["CENTRAL", "CENTRAL_RECORD", "CHUNK", "DEFLATED", "DEFLATE_MAX_RATIO", "DESCRIPTOR", "EOCD", "EOCD64",
           "EOCD64_LOCATOR", "FOUR_GIB", "LOCAL", "MAX_OUT", "STORED", "U16", "U32", "U64", "damaged_error",
           "decode_name", "has_tag", "is_junk", "mismatch", "truncated_error", "zip64_fields"]

CHUNK = 1 << 20  # bytes read from the archive at a time
MAX_OUT = 4 << 20  # most bytes one decompress call may produce (a run of zeros inflates 1000x)

LOCAL = b"PK\x03\x04"
CENTRAL = b"PK\x01\x02"
EOCD = b"PK\x05\x06"
EOCD64 = b"PK\x06\x06"
EOCD64_LOCATOR = b"PK\x06\x07"
DESCRIPTOR = b"PK\x07\x08"
U16 = 0xFFFF
U32 = 0xFFFFFFFF
U64 = (1 << 64) - 1
FOUR_GIB = 1 << 32  # where 32-bit sizes and offsets wrap
STORED, DEFLATED = 0, 8
# Deflate's own limit: a 258-byte match coded in 2 bits (1-bit length and distance codes) is 1032 bytes out of
# one byte in, and nothing codes more; a deflate stream of C bytes inflates to less than 1032 * C.
DEFLATE_MAX_RATIO = 1032

# A central directory record's 46 fixed bytes: signature, version made by, version needed, flags, method, time,
# date, CRC32, compressed size, uncompressed size, name, extra and comment lengths, disk, internal and external
# attributes, local header offset.
CENTRAL_RECORD = struct.Struct("<4s6H3L5HLL")


# ------------------------------------------------------------------------------------------------- fields


def zip64_fields(extra: bytes, wanted: list[bool]) -> list[int | None]:
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


def has_tag(extra: bytes, tag: int) -> bool:
    i = 0
    while i + 4 <= len(extra):
        t, length = struct.unpack_from("<HH", extra, i)
        if t == tag:
            return True
        i += 4 + length
    return False


def decode_name(raw: bytes, flags: int) -> str:
    return raw.decode("utf-8" if flags & 0x800 else "cp437", errors="replace")


def is_junk(name: str) -> bool:
    """A member macOS's zip adds beside the content (`__MACOSX/`, `._*`, `.DS_Store`)."""
    parts = name.split("/")
    return parts[0] == "__MACOSX" or any(p.startswith("._") or p == ".DS_Store" for p in parts)


# ------------------------------------------------------------------------------------------------- errors


def truncated_error(archive: Path, what: str, member: str | None = None) -> ArchiveError:
    return ArchiveError(
        f"{archive} is truncated or damaged ({what}): the download did not complete or the file was cut "
        f"short; delete {archive} and run again to download it again", archive=str(archive), member=member)


def damaged_error(archive: Path, member: str, what: str, inside: str | None = None) -> ArchiveError:
    where = f"{member} (inside {inside} in {archive})" if inside else f"{member} in {archive}"
    return ArchiveError(f"{where} is damaged: {what}; delete {archive} and run again to download it again",
                        archive=str(archive), member=member)


def mismatch(want_crc: int, got_crc: int, want_size: int, got_size: int) -> str:
    if want_crc != got_crc:
        return f"CRC32 mismatch (recorded {want_crc:08x}, computed {got_crc:08x})"
    return f"size mismatch (recorded {want_size} bytes, got {got_size})"
