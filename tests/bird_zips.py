"""Zips in BIRD's exact layout, built by the tests (Python's zipfile writes them; t2sql never reads with it).

    dev.zip                                   train.zip
      dev_20240627/                             train/
      dev_20240627/dev.json, dev_tables.json    train/train.json
      dev_20240627/dev_databases.zip            train/train_databases.zip
        dev_databases/<db_id>/<db_id>.sqlite      train_databases/<db_id>/<db_id>.sqlite
        dev_databases/<db_id>/database_description/*.csv
      dev_20240627/.DS_Store, __MACOSX/...      train/.DS_Store, __MACOSX/...

Options: `descriptors` writes the inner members with data descriptors (flag bit 3: zipfile does so when
the output cannot seek); `zip64` writes ZIP64 everywhere (local and central extras, the ZIP64 end records),
as an archive over 4 GiB has them, without writing 4 GiB; `inner_compression` / `outer_compression`.
`raw_zip` writes a zip field by field, for what zipfile will not write: a header (or a data descriptor, and
a directory record) that records another size than the data's, a directory that leaves a member out or lists
the members in the reverse order, a hundred thousand members in seconds.
Used by tests/test_archive.py and by the end-to-end prepare test (a mirror serving these files)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

BIRD = Path(__file__).resolve().parent / "data" / "bird"
SAMPLE_DEV_DBS = ("student_club", "superhero", "toxicology")
DEV_INNER = "dev_20240627/dev_databases.zip"
TRAIN_INNER = "train/train_databases.zip"
DATE = (2024, 6, 27, 12, 0, 0)


class Unseekable:
    """A write-only file: zipfile cannot seek back to fill in a header, so it writes data descriptors."""

    def __init__(self, f):
        self._f = f

    def write(self, data):
        return self._f.write(data)

    def flush(self):
        self._f.flush()


@contextlib.contextmanager
def _zip64_everywhere(on: bool):
    """zipfile writes ZIP64 records past its limits; lowered, it writes them for every member and the end."""
    if not on:
        yield
        return
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 0, 0
    try:
        yield
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved


def write_zip(dest: Path, members: list[tuple[str, bytes | Path | None]], *, descriptors: bool = False,
              zip64: bool = False, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """A zip of `members` in order: (name, bytes), (name, a file to copy in chunks) or (name/, None) for a
    directory entry."""
    dest = Path(dest)
    with open(dest, "wb") as raw, _zip64_everywhere(zip64):
        out = Unseekable(raw) if descriptors else raw
        with zipfile.ZipFile(out, "w", allowZip64=True) as zf:
            for name, content in members:
                info = zipfile.ZipInfo(name, DATE)
                if content is None:
                    info.external_attr = 0o40755 << 16 | 0x10
                    zf.writestr(info, b"")
                    continue
                info.compress_type = compression
                info.external_attr = 0o644 << 16
                with zf.open(info, "w", force_zip64=zip64) as w:
                    if isinstance(content, Path):
                        with open(content, "rb") as src:
                            while block := src.read(1 << 20):
                                w.write(block)
                    else:
                        w.write(content)
    return dest


def database_members(top: str, databases: dict[str, Path], *, junk: bool = True
                     ) -> list[tuple[str, bytes | Path | None]]:
    """Inner-zip members for `databases` (db_id -> a folder holding <db_id>.sqlite and maybe
    database_description/), with macOS junk beside them."""
    members: list[tuple[str, bytes | Path | None]] = [(f"{top}/", None)]
    for db_id, folder in sorted(databases.items()):
        members.append((f"{top}/{db_id}/", None))
        for path in sorted(Path(folder).rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if path.is_dir():
                members.append((f"{top}/{db_id}/{rel}/", None))
            else:
                members.append((f"{top}/{db_id}/{rel}", path))
        if junk:
            members.append((f"__MACOSX/{top}/{db_id}/._{db_id}.sqlite", b"\0\x05\x16\x07mac resource fork"))
            members.append((f"{top}/{db_id}/._{db_id}.sqlite", b"\0\x05\x16\x07apple double"))
    if junk:
        members.append((f"{top}/.DS_Store", b"Bud1" + b"\0" * 60))
        members.append(("__MACOSX/", None))
    return members


def build_outer(dest: Path, folder: str, inner_name: str, inner: Path, others: dict[str, bytes], *,
                outer_compression: int = zipfile.ZIP_DEFLATED, zip64: bool = False,
                outer_descriptors: bool = False) -> Path:
    members: list[tuple[str, bytes | Path | None]] = [(f"{folder}/", None)]
    for name, data in others.items():
        members.append((f"{folder}/{name}", data))
    members.append((f"{folder}/{inner_name}", inner))
    members += [(f"{folder}/.DS_Store", b"Bud1" + b"\0" * 60), ("__MACOSX/", None),
                (f"__MACOSX/{folder}/._{inner_name}", b"\0\x05\x16\x07apple double")]
    return write_zip(dest, members, zip64=zip64, compression=outer_compression, descriptors=outer_descriptors)


def build_dev_zip(dest: Path, databases: dict[str, Path] | None = None, *, descriptors: bool = False,
                  zip64: bool = False, inner_compression: int = zipfile.ZIP_DEFLATED,
                  outer_compression: int = zipfile.ZIP_DEFLATED, extra_inner: list | None = None) -> Path:
    """BIRD's dev.zip (dev_20240627) holding the sample dev databases of tests/data/bird (or `databases`)."""
    dest = Path(dest)
    databases = databases if databases is not None else {db: BIRD / db for db in SAMPLE_DEV_DBS}
    inner = dest.with_name(dest.name + ".inner.zip")
    write_zip(inner, database_members("dev_databases", databases) + list(extra_inner or []),
              descriptors=descriptors, zip64=zip64, compression=inner_compression)
    try:
        return build_outer(dest, "dev_20240627", "dev_databases.zip", inner,
                           {"dev.json": (BIRD / "dev.json").read_bytes(),
                            "dev_tables.json": (BIRD / "dev_tables.json").read_bytes()},
                           outer_compression=outer_compression, zip64=zip64)
    finally:
        inner.unlink()


def build_train_zip(dest: Path, databases: dict[str, Path], *, descriptors: bool = False, zip64: bool = False,
                    inner_compression: int = zipfile.ZIP_DEFLATED,
                    outer_compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """BIRD's train.zip holding `databases` (db_id -> folder) as train/train_databases.zip."""
    dest = Path(dest)
    inner = dest.with_name(dest.name + ".inner.zip")
    write_zip(inner, database_members("train_databases", databases), descriptors=descriptors, zip64=zip64,
              compression=inner_compression)
    try:
        return build_outer(dest, "train", "train_databases.zip", inner, {"train.json": b"[]\n"},
                           outer_compression=outer_compression, zip64=zip64)
    finally:
        inner.unlink()


def make_database(path: Path, rows: int = 200, *, blob_bytes: int = 0, zero_bytes: int = 0) -> Path:
    """A small SQLite database; with `blob_bytes`, random blobs of that total (incompressible); with
    `zero_bytes`, one blob of zeros (it deflates about 1000 to 1)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
    con.execute("CREATE INDEX item_name ON item(name)")
    con.executemany("INSERT INTO item (name, price) VALUES (?, ?)",
                    [(f"{path.stem}-item-{i}", i * 1.5) for i in range(rows)])
    if blob_bytes:
        con.execute("CREATE TABLE blob (id INTEGER PRIMARY KEY, data BLOB)")
        piece = 1 << 20
        for _ in range(blob_bytes // piece):
            con.execute("INSERT INTO blob (data) VALUES (?)", (os.urandom(piece),))
    if zero_bytes:
        con.execute("CREATE TABLE zeros (id INTEGER PRIMARY KEY, data BLOB)")
        con.execute("INSERT INTO zeros (data) VALUES (zeroblob(?))", (zero_bytes,))
    con.commit()
    con.close()
    return path


def make_train_databases(folder: Path, n: int = 3, rows: int = 200) -> dict[str, Path]:
    """`n` generated databases in BIRD's layout under `folder`: db_id -> its folder."""
    out = {}
    for i in range(n):
        db_id = f"train_db_{i}"
        make_database(Path(folder) / db_id / f"{db_id}.sqlite", rows=rows + i)
        desc = Path(folder) / db_id / "database_description"
        desc.mkdir(exist_ok=True)
        (desc / "item.csv").write_text("original_column_name,column_description\nid,the item\n")
        out[db_id] = Path(folder) / db_id
    return out


def local_data_offset(zip_bytes: bytes, name: str) -> int:
    """Where member `name`'s data starts in a zip's bytes (from its local header)."""
    with zipfile.ZipFile(__import__("io").BytesIO(zip_bytes)) as zf:
        offset = zf.getinfo(name).header_offset
    nlen, xlen = struct.unpack_from("<HH", zip_bytes, offset + 26)
    return offset + 30 + nlen + xlen


def build_wrapped_zip(dest: Path, folder: str, inner_name: str, inner: bytes, *, pad: int = (1 << 32) + (1 << 20),
                      deflate: bool = True) -> Path:
    """An archive over 4 GiB written without ZIP64, as macOS's Archive Utility writes them: a stored
    `<folder>/pad.bin` of `pad` zero bytes (a sparse hole: no disk used), then `<folder>/<inner_name>`, whose
    local header offset, like the central directory's, is recorded modulo 4 GiB."""
    dest = Path(dest)
    body = zlib_raw(inner) if deflate else inner
    crc = __import__("zlib").crc32(inner)
    method = 8 if deflate else 0
    entries = []
    with open(dest, "wb") as f:
        name = f"{folder}/pad.bin".encode()
        f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 10, 0, 0, 0, 0x58DB, 0, pad % (1 << 32),
                            pad % (1 << 32), len(name), 0) + name)
        entries.append((name, 0, 0, pad, pad, 0))
        f.seek(f.tell() + pad)  # a hole
        offset = f.tell()
        name = f"{folder}/{inner_name}".encode()
        f.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x58DB, crc, len(body), len(inner),
                            len(name), 0) + name)
        f.write(body)
        entries.append((name, method, crc, len(body), len(inner), offset))
        cd_start = f.tell()
        for name, method, crc, csize, usize, offset in entries:
            f.write(struct.pack("<4s6H3L5HLL", b"PK\x01\x02", 0x315, 20, 0, method, 0, 0x58DB, crc,
                                csize % (1 << 32), usize % (1 << 32), len(name), 0, 0, 0, 0, 0o644 << 16,
                                offset % (1 << 32)) + name)
        cd_size = f.tell() - cd_start
        f.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), cd_size,
                            cd_start % (1 << 32), 0))
    return dest


def zlib_raw(data: bytes) -> bytes:
    import zlib

    c = zlib.compressobj(6, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush()


@dataclass(frozen=True)
class Raw:
    """One member for raw_zip: `data` deflated (or stored); `declared` is the size its local header (or its
    data descriptor) and its directory record say (the true one when None); `listed=False` leaves it out of
    the directory; `descriptor=True` gives its CRC32 and sizes after its data, in a data descriptor with its
    signature (flag bit 3; the local header's are zero), as macOS's zip writes them."""

    name: str
    data: bytes = b""
    deflate: bool = True
    declared: int | None = None
    listed: bool = True
    descriptor: bool = False


def raw_zip(members: list[Raw], *, directory_reversed: bool = False) -> bytes:
    """A zip written field by field: local headers (with the sizes, or a data descriptor after the data), the
    central directory (in the data's order, or the reverse), and the ZIP64 end records when there are more
    members than a 16-bit count holds."""
    out, records = bytearray(), []
    for m in members:
        body = zlib_raw(m.data) if m.deflate else m.data
        crc, usize = zlib.crc32(m.data), len(m.data) if m.declared is None else m.declared
        name, method, offset = m.name.encode(), 8 if m.deflate else 0, len(out)
        flags, in_header = (8, (0, 0, 0)) if m.descriptor else (0, (crc, len(body), usize))
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, flags, method, 0, 0x58DB, *in_header, len(name), 0)
        out += name + body
        if m.descriptor:
            out += struct.pack("<4s3L", b"PK\x07\x08", crc, len(body), usize)
        if m.listed:
            records.append(struct.pack("<4s6H3L5HLL", b"PK\x01\x02", 0x314, 20, flags, method, 0, 0x58DB, crc,
                                       len(body), usize, len(name), 0, 0, 0, 0, 0o644 << 16, offset) + name)
    directory, listed = b"".join(reversed(records) if directory_reversed else records), len(records)
    start = len(out)
    out += directory
    if listed < 0xFFFF:
        out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, listed, listed, len(directory), start, 0)
    else:
        record = len(out)
        out += struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, listed, listed, len(directory), start)
        out += struct.pack("<4sLQL", b"PK\x06\x07", 0, record, 1)
        out += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return bytes(out)


def raw_database_members(databases: dict[str, Path] | None = None, top: str = "dev_databases") -> list[Raw]:
    """Raw members for `databases` (db_id -> folder; the sample dev databases by default), as
    database_members lays them out, without the macOS junk."""
    databases = databases if databases is not None else {db: BIRD / db for db in SAMPLE_DEV_DBS}
    return [Raw(f"{top}/{db_id}/{path.relative_to(folder).as_posix()}", path.read_bytes())
            for db_id, folder in sorted(databases.items()) for path in sorted(Path(folder).rglob("*"))
            if path.is_file()]


def build_raw_dev_zip(dest: Path, inner: list[Raw], *, outer_compression: int = zipfile.ZIP_DEFLATED,
                      directory_reversed: bool = False) -> Path:
    """BIRD's dev.zip whose inner dev_databases.zip is raw_zip(inner)."""
    dest = Path(dest)
    inner_path = dest.with_name(dest.name + ".inner.zip")
    inner_path.write_bytes(raw_zip(inner, directory_reversed=directory_reversed))
    try:
        return build_outer(dest, "dev_20240627", "dev_databases.zip", inner_path, {"dev.json": b"[]\n"},
                           outer_compression=outer_compression)
    finally:
        inner_path.unlink()
