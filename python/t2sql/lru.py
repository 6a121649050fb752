"""A dict bounded by a count of entries and a number of bytes, dropping the least recently used:
what the Grader's gold digests, `t2sql grade --pairs` and the equivalence check's caches hold."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

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
