"""Mining ahead: invariants mined once per content, to the end, under a lock file; training's checks
skip a database not mined yet (not_ready) and never mine inline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

import t2sql
from conftest import SAMPLE_ROOT
from t2sql.equivalence import mining
from t2sql.equivalence.check import EquivalenceChecker, EquivalenceConfig
from t2sql.equivalence.diskcache import LOCK_STALE_S, DiskCache, database_key
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.invariants import INVARIANTS_VERSION
from t2sql.equivalence.mine_ahead import mine_ahead

CONFIG = EquivalenceConfig(suite_size=4, seed=0, budget_s=30.0)
GOLD = "SELECT superhero_name FROM superhero WHERE id = 1"


@pytest.fixture()
def db(tmp_path):
    """A copy of the bundled superhero sample with one changed byte past its end: content of its own, so no
    cache anywhere has it mined."""
    path = tmp_path / "superhero.sqlite"
    shutil.copyfile(SAMPLE_ROOT / "superhero" / "superhero.sqlite", path)
    with open(path, "ab") as f:
        f.write(os.urandom(16))  # past the last page: SQLite ignores it, the digest does not
    return str(path)


def test_a_training_check_on_a_database_not_mined_skips_at_once_and_mines_it_in_the_background(tmp_path, db):
    store = InvariantStore(DiskCache(tmp_path / "cache"))
    with EquivalenceChecker(invariants=store, mine_inline=False) as checker:
        first = checker.check_sync(db, GOLD, GOLD, CONFIG)
        assert first.skipped_reason == "not_ready" and "background" in first.detail
        deadline = time.monotonic() + 60
        while store.ready(db) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.ready(db) is not None  # mined by this process, once
        later = checker.check_sync(db, GOLD, GOLD, CONFIG)
    assert later.checked and not later.refuted


def test_the_same_file_gives_the_same_invariants_and_a_mined_file_is_not_mined_again(tmp_path, db, monkeypatch):
    first = mine_ahead([db], InvariantStore(DiskCache(tmp_path / "a")), progress=False)
    again = mine_ahead([db, db], InvariantStore(DiskCache(tmp_path / "a")), progress=False)
    assert (first.databases, first.mined, first.found) == (1, 1, 0)
    assert (again.databases, again.mined, again.found) == (1, 0, 1)

    def entry(root):
        data = json.loads((root / f"{database_key(db)}.invariants-v{INVARIANTS_VERSION}.json").read_text())
        return {k: v for k, v in data.items() if k != "mine_s"}

    mine_ahead([db], InvariantStore(DiskCache(tmp_path / "b")), progress=False)
    assert entry(tmp_path / "a") == entry(tmp_path / "b")


def test_a_mining_failure_is_kept_as_a_reason_to_skip(tmp_path, db, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug of mining's")

    monkeypatch.setattr(mining, "_mine", broken)
    store = InvariantStore(DiskCache(tmp_path / "cache"))
    inv = store.get(db)
    assert "mining failed" in inv.unsupported and "a bug" in inv.unsupported
    monkeypatch.setattr(mining, "_mine", lambda *a, **k: pytest.fail("mined again"))
    assert InvariantStore(DiskCache(tmp_path / "cache")).get(db) == inv  # another process reads it back
    with EquivalenceChecker(invariants=store) as checker:
        report = checker.check_sync(db, GOLD, GOLD, CONFIG)
    assert report.skipped_reason == "unsupported_schema" and "mining failed" in report.detail


def test_cancel_stops_mining_and_keeps_nothing(tmp_path, db):
    cancel = t2sql.Cancel()
    cancel.cancel()
    store = InvariantStore(DiskCache(tmp_path / "cache"))
    with pytest.raises(t2sql.QueryCancelled):
        store.get(db, cancel)
    assert store.ready(db) is None
    assert not list((tmp_path / "cache").glob("*.lock"))  # its lock is released


def test_one_process_mines_a_file_while_the_others_wait_or_go_on(tmp_path, db):
    disk = DiskCache(tmp_path / "cache")
    name = f"{database_key(db)}.invariants-v{INVARIANTS_VERSION}.lock"
    with disk.lock(name) as held:
        assert held
        with disk.lock(name) as second:
            assert not second  # held by a live process (this one)
        assert InvariantStore(disk).get(db, wait=False) is None  # a background start goes on without it
    assert InvariantStore(disk).get(db, wait=False) is not None  # released: mined


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_stale_lock_is_taken_over(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    import socket

    dead = root / "dead.lock"
    dead.write_text(json.dumps({"host": socket.gethostname(), "pid": _dead_pid(), "since": 0}))
    old = root / "old.lock"
    old.write_text(json.dumps({"host": "another-machine", "pid": 1, "since": 0}))
    os.utime(old, (time.time() - LOCK_STALE_S - 60,) * 2)
    fresh = root / "fresh.lock"
    fresh.write_text(json.dumps({"host": "another-machine", "pid": 1, "since": time.time()}))
    disk = DiskCache(root)
    for name, taken in (("dead.lock", True), ("old.lock", True), ("fresh.lock", False)):
        with disk.lock(name) as held:
            assert held == taken, name
    assert not dead.exists() and not old.exists() and fresh.exists()
