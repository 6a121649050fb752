"""What a Grader (and `t2sql grade --pairs`) keeps in memory per gold: the most recently used entries, up to a count
and a number of bytes; an entry that falls out is read again from the Grader's `cache_dir`, else run again."""

from __future__ import annotations

from typing import NamedTuple

from t2sql.lru import Lru
from t2sql.serving.results import GoldResult

# Digests a Grader keeps in memory by default: more than the golds of a training split (BIRD's
# train has 9,428 questions), so training never runs a gold twice, and about 10 MB of small digests.
GOLD_MEMORY_ENTRIES = 16_384
# ... and at most this many bytes of them: a subset gold's digest holds 16 bytes per distinct row.
GOLD_MEMORY_BYTES = 256 * 1024 * 1024
# What one entry costs besides its own bytes: the key tuple, the GoldResult, the dict's slot
# (measured on CPython 3.11: about 400 bytes), so that many tiny entries still count.
ENTRY_OVERHEAD_BYTES = 512


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
