"""How much an extraction may unpack and write, each bound known before a byte it bounds is written: the ceiling on
all the inner zip's entries together (`UnpackCeiling`), each entry's bound (`EntryBounds.bound`) and the disk's
reserve (`DISK_RESERVE`). docs/development.md, "How `download/` reads BIRD's zips"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from t2sql.download.innerdirectory import InnerDirectory
from t2sql.download.zipentries import Bound
from t2sql.download.zipformat import damaged_error
from t2sql.progress import format_bytes

__all__ = ["DEFAULT_UNPACK_RATIO", "DISK_RESERVE", "EntryBounds", "UnpackCeiling", "default_ceiling"]

DEFAULT_UNPACK_RATIO = 100  # BIRD's train databases take about 4 times its zip: room for far more compressible ones
DISK_RESERVE = 250 * 10**6  # room for the logs, temporary files and checkpoints of whatever else runs there


@dataclass(frozen=True)
class UnpackCeiling:
    """The most bytes all of an inner zip's entries may unpack to together (laid out or skipped), and why that
    much, for the refusal."""

    size: int
    why: str


def default_ceiling(inner_size: int) -> UnpackCeiling:
    return UnpackCeiling(DEFAULT_UNPACK_RATIO * inner_size,
                         f"{DEFAULT_UNPACK_RATIO} times the inner zip's own {format_bytes(inner_size)}")


class EntryBounds:
    """The bounds of one walk's entries, in the walk's order. The inner zip's directory is read ahead only once an
    entry needs it (`open_directory`, called at most once); `close` lets go of it."""

    def __init__(self, ceiling: UnpackCeiling, archive: Path, inner: str,
                 open_directory: Callable[[], InnerDirectory | None]):
        self.ceiling, self.archive, self.inner = ceiling, archive, inner
        self.unpacked = 0  # bytes the entries passed so far unpacked to
        self._open_directory = open_directory
        self._directory: InnerDirectory | None = None
        self._opened = False

    def bound(self, name: str, raw_name: bytes, rank: int, at: int, method: int, declared: int | None) -> Bound:
        """The bound of the walk's entry of rank `rank` (0 for the first), its local header at `at` in the inner
        zip, named `raw_name` (`name` decoded), compressed by `method`; `declared` is the size its local header
        records (None when it comes after its data)."""
        left = self.ceiling.size - self.unpacked
        rest = Bound(left, f"left of the {self.ceiling.size} bytes that the entries of {self.inner} may take in all "
                           f"({self.ceiling.why})")
        if declared is not None:
            own, exact = Bound(declared, "its header records"), True
        else:
            listed = self._listed(rank, at, raw_name, method)
            if listed is None:
                return rest
            size, exact = listed
            own = Bound(size, "the inner zip's directory records" if exact else
                        "the inner zip's directory allows (its 32-bit size, wrapped as often as its compressed size "
                        "can hold)")
        if own.size <= left:
            return own
        if exact:
            raise damaged_error(self.archive, name, f"it is {own.size} bytes, as {own.what}: more than the {rest.size} "
                                f"bytes {rest.what}", self.inner)
        return rest

    def passed(self, size: int) -> None:
        """An entry unpacked to `size` bytes."""
        self.unpacked += size

    def _listed(self, rank: int, at: int, raw_name: bytes, method: int) -> tuple[int, bool] | None:
        if not self._opened:
            self._opened = True
            self._directory = self._open_directory()
        return None if self._directory is None else self._directory.size_bound(rank, at, raw_name, method)

    def close(self) -> None:
        if self._directory is not None:
            self._directory.close()
