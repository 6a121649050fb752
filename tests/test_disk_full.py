"""Disk-full figures are right: what still has to be written, against the space free now.

The extraction runs on a simulated small disk: its writes go to real files under a folder with a capacity,
and fail with ENOSPC past it; the free space the messages quote is that folder's (an injected free-space
function: the machine's own disk is far larger than these archives)."""

from __future__ import annotations

import errno
import re

import pytest

from bird_zips import DEV_INNER, build_dev_zip
from t2sql.download import archive as archive_mod
from t2sql.download.archive import extract_databases
from t2sql.download.bounds import DISK_RESERVE
from t2sql.download.marker import MARKER
from t2sql.errors import LaunchError, NoSpaceError
from t2sql.miles import prepare
from t2sql.progress import format_bytes

ID = {"archive": "dev.zip", "member": DEV_INNER}


class SmallDisk:
    """A folder that holds `capacity` bytes: a write past it raises ENOSPC, as a full file system does.
    `least_free` is the least free space any write left."""

    def __init__(self, root, capacity: int):
        self.root, self.capacity = root, capacity
        self.least_free = capacity

    def used(self) -> int:
        return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())

    def free(self, path=None) -> int:
        return self.capacity - self.used()

    def open(self, path):
        disk = self

        class Capped:
            def __init__(self):
                self.f = open(path, "wb", buffering=0)  # its size on disk is what was written

            def write(self, data):
                if disk.used() + len(data) > disk.capacity:
                    room = max(0, disk.capacity - disk.used())
                    self.f.write(bytes(data[:room]))
                    raise OSError(errno.ENOSPC, "No space left on device")
                done = self.f.write(data)
                disk.least_free = min(disk.least_free, disk.free())
                return done

            def __getattr__(self, name):
                return getattr(self.f, name)

        return Capped()


@pytest.mark.parametrize("reserve", [DISK_RESERVE, 0], ids=["the-reserve", "no-reserve"])
def test_a_full_disk_while_extracting_says_what_the_databases_need_against_what_is_free(tmp_path, monkeypatch,
                                                                                      reserve):
    """The disk holds two thirds of the databases above the reserve t2sql leaves free: the extraction stops short
    of the reserve (it used to fill the disk to its last byte), and says what it needs to the byte. Without a
    reserve it stops at the last byte, as before."""
    zp = build_dev_zip(tmp_path / "dev.zip")
    whole = tmp_path / "whole"
    extract_databases(zp, DEV_INNER, whole, identity=ID, progress=False)
    needed = sum(p.stat().st_size for p in whole.rglob("*") if p.is_file() and p.name != MARKER)

    disk = SmallDisk(tmp_path / "disk", capacity=reserve + needed * 2 // 3)
    disk.root.mkdir()
    monkeypatch.setattr(archive_mod, "_open_output", disk.open)
    monkeypatch.setattr(archive_mod, "free_bytes", disk.free, raising=False)
    monkeypatch.setattr(archive_mod, "DISK_RESERVE", reserve)
    with pytest.raises(NoSpaceError) as e:
        extract_databases(zp, DEV_INNER, disk.root / "dev_databases", identity=ID, progress=False)
    message = str(e.value)
    assert reserve <= disk.least_free < disk.capacity  # it wrote, and never into the reserve
    assert (e.value.needed, e.value.free) == (needed, disk.capacity)  # all of it, against the disk emptied
    assert f"the databases need {format_bytes(needed)} in all" in message, message
    assert f"t2sql leaves {format_bytes(reserve)} free there" in message, message
    assert f"{format_bytes(disk.capacity)} is free now" in message, message
    assert f"free at least {format_bytes(needed + reserve - disk.capacity)} more there" in message, message
    # nothing half-laid out is left (the lock file that serialises runs on the target stays, empty)
    assert disk.used() == 0 and [p.name for p in disk.root.iterdir()] == [".dev_databases.lock"]


def test_prepare_s_disk_check_gives_figures_to_the_byte_scale(tmp_path):
    """A partly downloaded dev.zip leaves 100 MB to fetch: said as 100.0 MB, not rounded to 0 GB."""
    needs = {"BIRD dev.zip (download)": 100_000_000, "hf checkpoint": 10**18}
    with pytest.raises(LaunchError) as e:
        prepare.check_disk(tmp_path, needs)
    message = str(e.value)
    assert "BIRD dev.zip (download) 100.0 MB" in message and " 0 GB" not in message, message
    free = re.search(r"free ([\d.]+ [kMGT]?B)\.", message)
    assert free is not None and f"need {format_bytes(sum(needs.values()))}" in message, message
