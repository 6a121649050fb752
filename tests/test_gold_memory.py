"""What a Grader keeps in memory per gold: the most recently used digests, up to a count and a size;
on the bundled superhero sample."""

from __future__ import annotations

import pytest

from t2sql import GradeSpec
from t2sql.lru import Lru
from t2sql.serving.gold_memory import ENTRY_OVERHEAD_BYTES
from t2sql.serving.grader import Grader
from t2sql.tasks import database_path, sample_dir

SUPERHERO = str(database_path(sample_dir(), "superhero"))


def sized(key, value: bytes) -> int:
    return len(value)


def test_the_least_recently_used_go_first_past_the_count():
    lru: Lru[bytes] = Lru(3)
    for key in "abc":
        lru.put(key, key.encode())
    assert lru.get("a") == b"a"  # now the most recent: "b" is the oldest
    lru.put("d", b"d")
    assert [k for k in "abcd" if lru.get(k) is not None] == ["a", "c", "d"]
    assert len(lru) == 3 and lru.evicted == 1


def test_the_bytes_bound_drops_old_entries_and_never_keeps_one_above_it():
    lru: Lru[bytes] = Lru(100, max_bytes=10, size_of=sized)
    lru.put("a", b"x" * 4)
    lru.put("b", b"x" * 4)
    lru.put("c", b"x" * 4)  # 12 bytes: "a" goes
    assert lru.get("a") is None and lru.nbytes == 8 and len(lru) == 2
    lru.put("b", b"x" * 1)  # a new value replaces the old one's bytes
    assert lru.nbytes == 5
    lru.put("huge", b"x" * 11)
    assert lru.get("huge") is None and lru.get("b") == b"x" and lru.nbytes == 5


def test_a_bound_under_one_entry_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        Lru(0)


def test_a_grader_keeps_its_most_recent_golds_and_runs_a_forgotten_one_again():
    golds = [f"SELECT superhero_name FROM superhero WHERE id = {i}" for i in range(1, 21)]
    with Grader(concurrency=1, gold_memory_entries=5) as grader:
        for gold in golds:
            assert grader.gold_sync(SUPERHERO, gold).source == "computed"
        stats = grader.stats()
        assert (stats["gold_memory_held"], stats["gold_memory_evicted"]) == (5, 15)
        assert grader.gold_sync(SUPERHERO, golds[-1]).source == "memory"
        assert grader.gold_sync(SUPERHERO, golds[0]).source == "computed"  # forgotten: run again
        assert grader.stats()["gold_computed"] == 21
        # The verdicts do not depend on what is remembered.
        assert grader.grade_sync(SUPERHERO, golds[1], golds[1]).outcome == "match"


def test_a_grader_bounds_the_bytes_of_its_digests():
    """A subset gold's digest holds its distinct rows: a few such golds fill the bytes bound."""
    gold = "SELECT id FROM superhero"
    spec = GradeSpec("subset,>=,1", gold_sql=gold)
    with Grader(concurrency=1) as grader:
        one = len(grader.gold_sync(SUPERHERO, gold, spec).digest)
    assert one > 750 * 8  # the sample's 750 heroes' keys
    limit = 3 * (one + ENTRY_OVERHEAD_BYTES + len(gold) + 20)
    with Grader(concurrency=1, gold_memory_bytes=limit) as grader:
        for i in range(8):  # the same rows under 8 gold texts: 8 digests of the same size
            grader.gold_sync(SUPERHERO, f"{gold} WHERE {i} = {i}", spec)
        assert grader.stats()["gold_memory_held"] == 3, (one, limit)
