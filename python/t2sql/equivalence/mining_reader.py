"""The statements mining runs on the core (`Reader`): each to its end, a hang guard aside, under mining's
Cancel and temporary-disk cap, one at a time or side by side on a few connections to the file; a
statement that fails is `Unverified` (t2sql.equivalence.mining then reports the database unsupported)."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from typing import Any, Callable

import t2sql
from t2sql.errors import T2sqlError

# No statement of mining's is timed out by load: this only ends one that hangs (a file on a dead mount).
STATEMENT_TIMEOUT_S = 6 * 3600.0

# Temporary disk per mining statement (a count(DISTINCT) sorts one column of one table): large enough for
# the release's largest columns; a statement past it leaves its invariant unverified (same file, same
# outcome).
MINE_TEMP_MB = 16 * 1024

ANSWER_BYTES = 4 * 1024 * 1024  # what one mining statement may return

# What a tally (Database.tally: a column's distinct values counted in a hash) may hold before the column
# is grouped in SQL instead: about 150,000 short values.
TALLY_BYTES = 16 * 1024 * 1024

TALLY = "tally"  # a `many` item's kind: its statement tallied, not read (Reader.tally)

# Connections that run independent statements at once (a table's columns, the references): the same
# answers, each statement its own cost; more than the machine's cores only queues.
MINE_WORKERS = 2


class Unverified(T2sqlError):
    """A statement of mining's failed: what it was to verify, and why (caught inside mine(), which
    then reports the database unsupported)."""


def _unverified(why: str) -> Any:
    raise Unverified(why)


class Reader:
    """Mining's statements on the core, each to its end (a hang guard aside), under mining's Cancel and
    temporary-disk cap. `rows` raises Unverified when a statement fails; `catalog` answers None (the
    part is left out, t2sql.equivalence.declared). `many` runs independent statements on up to `workers`
    connections to the file at once (each its own statement's cost; the answers are the same)."""

    def __init__(self, db: t2sql.Database, cancel: Any = None, max_temp_mb: int = MINE_TEMP_MB,
                 path: str | None = None, workers: int = 1):
        self.db = db
        self.cancel = cancel
        self.max_temp_mb = max_temp_mb
        self.statements = 0
        self.path = path
        self.workers = workers if path is not None else 1
        self._idle: queue.SimpleQueue[t2sql.Database] = queue.SimpleQueue()
        self._opened: list[t2sql.Database] = []
        self._counting = threading.Lock()

    def _ask(self, run: Callable[[], list[tuple]], fail: Callable[[str], Any]) -> Any:
        with self._counting:
            self.statements += 1
        try:
            return run()
        except t2sql.QueryCancelled:
            raise
        except t2sql.QueryTimeout:
            raise Unverified(f"a statement ran past {STATEMENT_TIMEOUT_S:g}s") from None
        except t2sql.T2sqlError as e:
            return fail(f"{type(e).__name__}: {e}"[:300])

    def rows(self, sql: str, params: tuple = (), *, db: t2sql.Database | None = None) -> list[tuple]:
        """The rows of a statement of ours (through the guard); Unverified when it failed."""
        on = db or self.db
        return self._ask(lambda: on.rows(
            sql, list(params), timeout_s=STATEMENT_TIMEOUT_S, max_temp_mb=self.max_temp_mb,
            max_bytes=ANSWER_BYTES, cancel=self.cancel), _unverified)

    def tally(self, sql: str, *, db: t2sql.Database | None = None) -> list[tuple] | None:
        """Database.tally of a statement of ours (through the guard): None past TALLY_BYTES of
        groups; Unverified when it failed."""
        on = db or self.db
        return self._ask(lambda: on.tally(sql, timeout_s=STATEMENT_TIMEOUT_S, max_temp_mb=self.max_temp_mb,
                                          max_bytes=TALLY_BYTES, cancel=self.cancel), _unverified)

    def many(self, asked: list[tuple[str, ...]]) -> list[Any]:
        """The answer to each (what, sql) (its rows) or (what, sql, TALLY) (its tally), in order;
        Unverified naming the first (in order) that failed."""
        if self.workers <= 1 or len(asked) <= 1:
            return [self._named(*item, db=self.db) for item in asked]
        for _ in range(min(self.workers, len(asked)) - len(self._opened)):
            extra = t2sql.Database(self.path)
            self._opened.append(extra)
            self._idle.put(extra)

        def one(item: tuple[str, ...]) -> Any:
            db = self._idle.get()
            try:
                return self._named(*item, db=db)
            finally:
                self._idle.put(db)
        with concurrent.futures.ThreadPoolExecutor(min(self.workers, len(asked))) as pool:
            futures = [pool.submit(one, item) for item in asked]
        return [f.result() for f in futures]  # the first failure in order is raised

    def aside(self, part: Callable[[Callable[..., list[tuple]]], Any]) -> Callable[[], Any]:
        """`part` run with statements on a connection of its own, beside the caller's (inline, when it
        asks for the answer, with one worker); the call returned waits for its answer or raises its
        failure."""
        if self.workers <= 1:
            return lambda: part(self.rows)
        own = t2sql.Database(self.path)
        self._opened.append(own)
        pool = concurrent.futures.ThreadPoolExecutor(1)
        future = pool.submit(part, lambda sql, params=(): self.rows(sql, params, db=own))
        pool.shutdown(wait=False)
        return future.result

    def _named(self, what: str, sql: str, kind: str = "", *, db: t2sql.Database) -> Any:
        try:
            return self.tally(sql, db=db) if kind == TALLY else self.rows(sql, db=db)
        except Unverified as e:
            raise Unverified(f"{what}: {e}") from None

    def close(self) -> None:
        for db in self._opened:
            db.close()
        self._opened.clear()

    def catalog(self, pragma: str, name: str | None = None) -> list[tuple] | None:
        """The rows of a catalog pragma (t2sql.Database.catalog), or None when it failed (the same for
        the same file)."""
        return self._ask(lambda: self.db.catalog(pragma, name, timeout_s=STATEMENT_TIMEOUT_S, cancel=self.cancel),
                         lambda why: None)
