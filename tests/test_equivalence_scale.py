"""`t2sql bench equivalence-scale`'s copies: every invariant mined at 1x holds at k times the rows."""

from __future__ import annotations

import sqlite3

from conftest import bird_root
from t2sql.bench.equivalence_scale import comparable, scale_database
from t2sql.serving.diskcache import DiskCache
from t2sql.serving.invariant_store import InvariantStore

TOXICOLOGY = str(bird_root() / "toxicology" / "toxicology.sqlite")


def test_a_scaled_copy_keeps_every_invariant_mined_at_1x(tmp_path):
    one = InvariantStore(DiskCache(tmp_path / "a")).get(TOXICOLOGY)
    copy = tmp_path / "x3" / "toxicology.sqlite"
    scale_database(TOXICOLOGY, copy, 3, one)
    three = InvariantStore(DiskCache(tmp_path / "b")).get(str(copy))
    assert three.table("atom").rows == 3 * one.table("atom").rows
    assert comparable(three, 3) == comparable(one, 1)
    # the copies' names are new ones, and a copied text does not hold the original (LIKE finds only it)
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("SELECT count(*) FROM molecule WHERE molecule_id LIKE '%TR000%'").fetchone()[0] == 1
    finally:
        conn.close()
