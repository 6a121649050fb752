"""How a download (t2sql.download.http) that cannot finish ends: the checks of its time limits, the choice
between keeping its partial file and deleting it, and the one-line errors that say what happened and what to
do. A `.part` is kept only when a rerun will resume it: its size and a validator are known and the server did
not refuse the last Range request (else a rerun would throw it away, so it is deleted now, and the error says
why); an error never says a rerun resumes unless it will.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from t2sql.download.limits import MIN_RATE_ENV, TimeLimits, TryBudget, seconds
from t2sql.download.partial import free_bytes, rangeable
from t2sql.errors import DownloadError, DownloadStalled, NoSpaceError, T2sqlError
from t2sql.progress import format_bytes


class TryFailed(T2sqlError):
    """One try failed in a way that another try may fix; `kind` is connect, stall, drop, status, or restart
    (the kept bytes were thrown away: the server would not continue them). The download's loop (http) catches
    it and tries again; when the tries are spent it ends as the DownloadError `Ending` makes of the last one,
    so no user sees it."""

    def __init__(self, kind: str, detail: str, status: int | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.status = kind, detail, status


class Ending:
    """The part of a download that ends it; the download (http._Download) keeps the state named here."""

    url: str
    part: Path
    hint: str | None
    expected_size: int | None
    ceiling: int
    limits: TimeLimits
    stall_timeout_s: float
    started: float
    budget: TryBudget
    meta: dict[str, Any] | None
    offset: int
    fetched: int
    tries: int
    refused: str | None  # how the server answered the last Range request when it did not resume
    announced: int | None = None  # the size the server last announced (kept across a restart)
    f: Any

    def reset(self) -> None:  # the download's: back to an empty .part
        raise NotImplementedError

    def check_time(self) -> None:
        """DownloadStalled when the call is under its floor rate or past its deadline."""
        elapsed = time.monotonic() - self.started
        if self.limits.under_floor(self.fetched, elapsed):
            raise DownloadStalled(
                f"{self.url}: the download is too slow: {format_bytes(self.fetched)} in {seconds(elapsed)} "
                f"({format_bytes(self.fetched / elapsed)}/s, {self._tried()}), under {self.limits.describe()}"
                f"{self._leave_part()}; try later, from a faster link, or lower ${MIN_RATE_ENV}{self._hint()}",
                url=self.url)
        size = self._size() or self.ceiling
        deadline = self.limits.deadline_s(size)
        if elapsed > deadline:
            raise DownloadStalled(
                f"{self.url}: not done within {seconds(deadline)}, the deadline for {format_bytes(size)} (a grace of "
                f"{seconds(self.limits.grace_s)} plus the size at {format_bytes(self.limits.min_rate)}/s; "
                f"{self.limits.describe()}): {format_bytes(self.fetched)} received in {self._tried()}"
                f"{self._leave_part()}; try later, or lower ${MIN_RATE_ENV}{self._hint()}", url=self.url)

    def _size(self) -> int | None:
        """The file's size as far as it is known: announced (now, or before a restart), else expected."""
        size = self.meta.get("size") if self.meta else None
        if isinstance(size, int):
            return size
        return self.announced if self.announced is not None else self.expected_size

    def _over_ceiling(self) -> None:
        what = "the size this file has" if self.expected_size is not None else \
            "max_size, the most this download takes from a server that announces no size"
        self._discard()
        raise DownloadError(f"{self.url} sent more than {self.ceiling:,} bytes ({what}) without announcing a size "
                            f"(no Content-Length); stopped there, and the partial file was deleted{self._hint()}",
                            url=self.url)

    def _no_space(self, total: int | None) -> None:
        have = os.fstat(self.f.fileno()).st_size
        size = total if total is not None else self.expected_size
        needed = size - have if size is not None else None
        why = self._why_not_resumable() if self.meta is not None else None
        if why is not None:
            self._discard()
        free = free_bytes(self.part.parent)
        need = f"{format_bytes(needed)} more needed, {format_bytes(free)} free" if needed is not None \
            else f"{format_bytes(free)} free"
        then = (f"run again: the download resumes at {format_bytes(have)}" if why is None and have else
                f"run again; the partial file was deleted, as a rerun could not resume it: {why}" if why else
                "run again")
        raise NoSpaceError(f"no space left on the disk of {self.part} ({need}); free space there (or choose a "
                           f"folder on a larger disk) and {then}",
                           path=str(self.part), needed=needed or 0, free=free) from None

    def _why_not_resumable(self) -> str | None:
        """Why a rerun would not resume the kept bytes (None: it would)."""
        meta = self.meta
        if meta is None or not isinstance(meta.get("size"), int):
            return "the server announced no size (no Content-Length)"
        if not rangeable(meta):
            return "the server gives neither an ETag nor a Last-Modified date to check a resume against"
        if self.refused:
            return f"the server does not resume ({self.refused})"
        return None

    def _discard(self) -> None:
        """Delete the partial file and its sidecar (the fd and the lock stay until the call ends)."""
        self.reset()
        self.part.unlink(missing_ok=True)

    def _leave_part(self) -> str:
        """At giving up: keep the partial file when a rerun will resume it, else delete it; say which."""
        size = self._size()
        of = f" of {format_bytes(size)}" if size else ""
        if self.offset:
            why = self._why_not_resumable()
            if why is None:
                return f"; {format_bytes(self.offset)}{of} kept in {self.part.name}: a rerun resumes there"
        elif self.refused:  # the last try threw the kept bytes away
            why = f"the server does not resume ({self.refused})"
        else:
            return ""
        furthest = max(self.budget.furthest, self.offset)
        self._discard()
        return (f"; the partial file was deleted, as a rerun could not resume it: {why}, so each try started again "
                f"from zero (the furthest one got {format_bytes(furthest)}{of})")

    def _tried(self) -> str:
        return f"{self.tries} {'try' if self.tries == 1 else 'tries'}"

    def _gave_up(self, last: TryFailed) -> DownloadError:
        kept = self._leave_part()
        tried = self._tried()
        if last.kind == "stall":
            return DownloadStalled(f"{self.url}: the server sent nothing for {self.stall_timeout_s:g} s "
                                   f"({tried}){kept}{self._hint()}", url=self.url)
        if last.kind == "connect":
            host = urlsplit(self.url).netloc
            return DownloadError(f"cannot reach {host} ({last.detail}; {tried}, {self.url}): check the network "
                                 f"and the URL{kept}{self._hint()}", url=self.url)
        if last.kind == "status":
            return DownloadError(f"{last.detail} ({tried}){kept}{self._hint()}", url=self.url, status=last.status)
        if last.kind == "restart":
            return DownloadError(f"{self.url}: no try could continue the partial download ({tried}){kept}"
                                 f"{self._hint()}", url=self.url)
        return DownloadError(f"{self.url}: the connection broke ({last.detail}; {tried}){kept}{self._hint()}",
                             url=self.url)

    def _hint(self) -> str:
        return f"; {self.hint}" if self.hint else ""
