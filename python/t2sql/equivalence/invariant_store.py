"""Where a database's invariants are kept once mined (t2sql.equivalence.mining): in memory and on disk
(t2sql.equivalence.diskcache), keyed by the file's content, with a lock file beside the entry so that one
process mines a file while the others wait (`get`) or go on without it (`start`, mining in the
background)."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

import t2sql
from t2sql.equivalence.diskcache import DiskCache, database_key
from t2sql.equivalence.invariants import INVARIANTS_VERSION, Invariants
from t2sql.equivalence.invariants_read import read_invariants
from t2sql.equivalence.mining import mine, unsupported
from t2sql.equivalence.mining_reader import MINE_TEMP_MB

log = logging.getLogger("t2sql.equivalence.invariant_store")

# Databases whose invariants are kept in memory (each with its memo, at most MEMO_BYTES); more are read
# back from disk.
INVARIANTS_KEPT = 16

LOCK_POLL_S = 0.5  # how often a process waiting for another's mining looks for its entry


class InvariantStore:
    """Invariants per database content, mined once: in memory (an LRU) and on disk. A disk entry is used
    only when it reads back whole, of this version and for this very content; anything else is mined
    again. What mining concluded is kept, an unsupported database included (a file whose mining failed
    is not mined again); a cancelled run keeps nothing.

    `ready` never mines; `get` mines when no entry exists (or waits for the thread or process that
    mines it: a lock file beside the entry); `start` mines in a background thread of this process, once
    per content, unless another process holds the lock. `close` cancels background mining."""

    def __init__(self, disk: DiskCache | None = None, *, keep: int = INVARIANTS_KEPT,
                 max_temp_mb: int = MINE_TEMP_MB):
        self.disk = disk if disk is not None else DiskCache()
        self.keep = keep
        self.max_temp_mb = max_temp_mb
        self._lock = threading.Lock()
        self._mem: OrderedDict[str, Invariants] = OrderedDict()
        self._building: dict[str, threading.Event] = {}
        self._started: set[str] = set()  # contents this process began mining in the background
        self._cancel = t2sql.Cancel()  # background mining's

    def ready(self, path: str) -> Invariants | None:
        """The invariants when mined (in memory or on disk), else None; never mines."""
        key = database_key(path)
        with self._lock:
            inv = self._mem.get(key)
            if inv is not None:
                self._mem.move_to_end(key)
                return inv if inv.path == path else _at(inv, path)
        inv = self._load(key, path)
        if inv is not None:
            self._remember(key, inv)
        return inv

    def get(self, path: str, cancel: Any = None, *, wait: bool = True) -> Invariants | None:
        """The invariants, mined now when no entry exists; `cancel` stops mining or waiting
        (QueryCancelled). While another process mines the file: wait for its entry, or with
        `wait=False` answer None at once."""
        key = database_key(path)
        while True:
            inv = self.ready(path)
            if inv is not None:
                return inv
            with self._lock:
                event = self._building.get(key)
                if event is None:
                    event = self._building[key] = threading.Event()
                    break
            while not event.wait(LOCK_POLL_S):  # another thread mines it
                _checkpoint(cancel)
        try:
            return self._mine_once(key, path, cancel, wait)
        finally:
            with self._lock:
                self._building.pop(key, None)
            event.set()

    def _mine_once(self, key: str, path: str, cancel: Any, wait: bool) -> Invariants | None:
        name = _entry(key)
        while True:
            with self.disk.lock(_entry(key, "lock")) as held:
                inv = self._load(key, path)  # another process may have finished it
                if inv is None and held:
                    try:
                        inv = mine(path, cancel=cancel, max_temp_mb=self.max_temp_mb)
                    except (t2sql.QueryCancelled, t2sql.DatabaseError):
                        raise  # nothing concluded (a file that cannot be read: the check says so)
                    except Exception as e:  # a failure of mining's own: kept, so no check mines it again
                        log.warning("mining %s failed: %s", path, e)
                        inv = unsupported(path, f"mining failed: {type(e).__name__}: {e}"[:500])
                    self.disk.store(name, {"database": key, **inv.to_dict()})
            if inv is not None:
                self._remember(key, inv)
                return inv
            if not wait:
                return None
            for _ in range(int(10 / LOCK_POLL_S)):  # another process mines it: its entry, or its lock gone
                _checkpoint(cancel)
                time.sleep(LOCK_POLL_S)
                inv = self._load(key, path)
                if inv is not None:
                    self._remember(key, inv)
                    return inv

    def start(self, path: str) -> None:
        """Mine `path` in a background thread of this process, once per content (unless mined, or mining
        here or in another process)."""
        try:
            key = database_key(path)
        except t2sql.T2sqlError:
            return  # the check reports the file
        with self._lock:
            if key in self._started or key in self._mem or key in self._building:
                return
            self._started.add(key)
            cancel = self._cancel
        threading.Thread(target=self._background, args=(key, path, cancel), daemon=True,
                         name="t2sql-mining").start()

    def _background(self, key: str, path: str, cancel: Any) -> None:
        try:
            if self.get(path, cancel, wait=False) is None:
                with self._lock:  # another process mines it: a later start looks again (its lock may go stale)
                    self._started.discard(key)
        except t2sql.QueryCancelled:
            with self._lock:
                self._started.discard(key)  # a later start mines it again
        except Exception as e:  # the checks report the file (skipped) when they read it
            log.warning("mining %s in the background failed: %s", path, e)

    def close(self) -> None:
        """Stop background mining (what it finished stays; a later start mines again)."""
        with self._lock:
            cancel, self._cancel = self._cancel, t2sql.Cancel()
        cancel.cancel()

    def _remember(self, key: str, inv: Invariants) -> None:
        with self._lock:
            self._mem[key] = inv
            self._mem.move_to_end(key)
            while len(self._mem) > self.keep:
                self._mem.popitem(last=False)

    def _load(self, key: str, path: str) -> Invariants | None:
        data = self.disk.load(_entry(key))
        if data is None or data.get("database") != key:
            return None  # none, or another database's
        try:
            inv = read_invariants({k: v for k, v in data.items() if k != "database"})
        except ValueError:
            return None
        return inv if inv.path == path else _at(inv, path)


def _entry(key: str, kind: str = "json") -> str:
    """The cache entry's name (and its lock's): versioned, so that two t2sql versions sharing a cache
    keep their own entries instead of mining over each other's."""
    return f"{key}.invariants-v{INVARIANTS_VERSION}.{kind}"


def _checkpoint(cancel: Any) -> None:
    if cancel is not None and cancel.cancelled:
        raise t2sql.QueryCancelled("query cancelled")


def _at(inv: Invariants, path: str) -> Invariants:
    """The same invariants for the same content at another path."""
    return dataclasses.replace(inv, path=path)
