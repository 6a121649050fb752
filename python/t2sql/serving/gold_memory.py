"""What a Grader (and `t2sql grade --pairs`) keeps in memory per gold: the most recently used
entries, up to a count and a number of bytes, so that a run over millions of distinct golds holds
as much as one over a few thousand.

An entry that falls out is not lost work for long: a gold digest is read again from the Grader's
`cache_dir` when it has one, else the gold runs again the next time it is asked for."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, NamedTuple, TypeVar

from t2sql.serving.results import GoldResult

# Digests a Grader keeps in memory by default: more than the golds of a training split (BIRD's
# train has 9,428 questions), so training never runs a gold twice, and about 10 MB of small digests.
GOLD_MEMORY_ENTRIES = 16_384
# ... and at most this many bytes of them: a subset gold's digest holds 16 bytes per distinct row.
GOLD_MEMORY_BYTES = 256 * 1024 * 1024
# What one entry costs besides its own bytes: the key tuple, the GoldResult, the dict's slot
# (measured on CPython 3.11: about 400 bytes), so that many tiny entries still count.
ENTRY_OVERHEAD_BYTES = 512

V = TypeVar("V")


class Lru(Generic[V]):
    """A dict of at most `max_entries` entries and `max_bytes` bytes (as `size_of` counts each
    entry), that drops the least recently used ones to stay there. Safe to share between threads.
    A single entry above `max_bytes` is not kept at all."""

    def __init__(self, max_entries: int, max_bytes: int | None = None,
                 size_of: Callable[[Hashable, V], int] | None = None):
        if max_entries < 1:
            raise ValueError(f"an LRU holds at least 1 entry, not {max_entries}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._size_of = size_of
        self._entries: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evicted = 0  # entries dropped to stay within the bounds, since creation

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                return None
            self._entries.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V) -> None:
        size = self._size_of(key, value) if self._size_of is not None else 0
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if self.max_bytes is not None and size > self.max_bytes:
                self.evicted += 1
                return
            self._entries[key] = (value, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or (
                    self.max_bytes is not None and self._bytes > self.max_bytes):
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
                self.evicted += 1


class GoldKey(NamedTuple):
    """What a digest in memory is the digest of: the parts of the disk cache's key (the SQLite
    version is the process's own), and the hash secret it was made with."""

    database: str  # the database's identity (GraderIdentity.cache_id), one string per database
    gold_sql: str
    method: str
    float_digits: int | None
    column_order: str
    secret_id: str


def _gold_size(key: GoldKey, result: GoldResult) -> int:
    """An entry's bytes: its digest, its gold SQL, and the objects around them."""
    return ENTRY_OVERHEAD_BYTES + len(result.digest or b"") + len(key.gold_sql)


def gold_memory(max_entries: int | None = None, max_bytes: int | None = None) -> Lru[GoldResult]:
    """A Grader's digests in memory (the defaults above when None)."""
    return Lru(GOLD_MEMORY_ENTRIES if max_entries is None else max_entries,
               GOLD_MEMORY_BYTES if max_bytes is None else max_bytes, _gold_size)
