"""Mining every database of a split ahead of training (`t2sql gold`, `t2sql-train prepare`, the commands that check
pairs) into the equivalence cache, with progress, so no training check waits for it: a check on a database not
mined yet is skipped as not_ready. docs/episode.md, "The equivalence check" (Mining ahead)."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import t2sql
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.progress import Progress


@dataclass
class Mined:
    """What mining ahead did: databases mined now, found mined, unsupported (the check skips them, with
    why) and failed (not a readable database)."""

    databases: int = 0
    mined: int = 0
    found: int = 0
    mine_s: float = 0.0  # the longest one's mining seconds
    unsupported: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def line(self) -> str:
        parts = [f"{self.databases} databases: {self.mined} mined, {self.found} already mined"]
        if self.unsupported:
            parts.append(f"{len(self.unsupported)} unsupported (the check skips them)")
        if self.failed:
            parts.append(f"{len(self.failed)} unreadable")
        return ", ".join(parts) + f" ({self.elapsed_s:.1f}s, slowest {self.mine_s:.1f}s)"

    def problems(self) -> list[str]:
        return ([f"invariants of {p}: {why}" for p, why in self.unsupported.items()]
                + [f"invariants of {p}: {why}" for p, why in self.failed.items()])


def mine_ahead(paths: Iterable[str | Path], store: InvariantStore | None = None, *, concurrency: int = 1,
               label: str = "invariants", progress: bool = True, cancel: Any = None) -> Mined:
    """Mine each distinct database in `paths` (largest first, `concurrency` at once) into `store`'s cache
    (default: the equivalence cache training reads). `cancel` stops it (QueryCancelled)."""
    store = store if store is not None else InvariantStore()
    distinct = sorted({str(p) for p in paths}, key=lambda p: -_size(p))
    out = Mined(databases=len(distinct))
    started = time.perf_counter()

    def one(path: str) -> tuple[str, Any, bool]:
        try:
            found = store.ready(path)
            if found is not None:
                return path, found, True
            return path, store.get(path, cancel), False
        except t2sql.QueryCancelled:
            raise
        except t2sql.T2sqlError as e:
            return path, e, False

    with Progress(len(distinct), label, enabled=None if progress else False) as bar:
        with concurrent.futures.ThreadPoolExecutor(max(1, concurrency)) as pool:
            for fut in concurrent.futures.as_completed([pool.submit(one, p) for p in distinct]):
                path, got, found = fut.result()
                if isinstance(got, Exception):
                    out.failed[path] = str(got)
                else:
                    out.found += found
                    out.mined += not found
                    out.mine_s = max(out.mine_s, 0.0 if found else got.mine_s)
                    if got.unsupported:
                        out.unsupported[path] = got.unsupported
                bar.advance()
    out.elapsed_s = time.perf_counter() - started
    return out


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0
