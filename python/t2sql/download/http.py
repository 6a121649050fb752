"""A resumable, verified download of one file over HTTP(S): `download(url, dest)`. `DEST` appears, by a rename, only
once complete and verified; a `.part` is resumed by a Range request guarded by its validators, and every call ends
(t2sql.download.limits). What a user sees: docs/training.md, "The recipe's data"; the `.part` and its sidecar are
t2sql.download.partial's."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from t2sql.atomic import atomic_write
from t2sql.download.ending import Ending, TryFailed
from t2sql.download.limits import TimeLimits, TryBudget, size_ceiling
from t2sql.download.partial import (
    SIDECAR_FORMAT,
    bytes_to_fetch,
    check_free_space,
    free_bytes,
    part_path,
    rangeable,
    read_sidecar,
    sidecar_path,
    strong_etag,
)
from t2sql.download.transport import (
    Sha256Thread,
    content_range,
    int_header,
    make_client,
    reason,
    unsatisfied_range_size,
)
from t2sql.errors import ChecksumMismatch, DownloadError
from t2sql.progress import Progress, format_bytes

__all__ = ["BIRD_URL_HINT", "SIDECAR_FORMAT", "DownloadResult", "bytes_to_fetch", "check_free_space", "download",
           "free_bytes", "part_path", "sidecar_path"]

# What the errors of a BIRD download suggest (the caller may pass its own `hint`).
BIRD_URL_HINT = "to download from a mirror, pass --bird-url BASE (one serving BASE/train.zip and BASE/dev.zip)"
_RETRY_STATUSES = {408, 425, 429, 500, 502, 503, 504}
_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class DownloadResult:
    path: Path  # the complete, verified file
    size: int
    sha256: str  # of the whole file (always computed)
    etag: str | None  # as the server sent them (None when already done: not asked)
    last_modified: str | None
    fetched: int  # body bytes received over the network by this call
    resumed: bool  # part of the file came by a Range request continuing a kept prefix (an earlier call's or a
    #                cut connection's in this call)
    sha256_checked: bool  # a pinned sha256 was given and matched
    restarted: bool = False  # a kept prefix was thrown away (the file changed on the server, or it was unusable)
    already_done: bool = False  # `dest` existed: nothing was fetched, the file was only checked


def download(url: str, dest: str | os.PathLike, *, expected_size: int | None = None, sha256: str | None = None,
             progress: bool = True, stall_timeout_s: float = 60.0, retries: int = 5, backoff_s: float = 1.0,
             hint: str | None = BIRD_URL_HINT, label: str | None = None, durable: bool = True,
             max_size: int | None = None, min_rate: float | None = None, grace_s: float | None = None
             ) -> DownloadResult:
    """Fetch `url` into `dest` (resuming a `.part` an earlier call left), verify it, rename it into place.

    expected_size: the size the file must have (a server announcing another is an error before any body
    byte). sha256: the pinned hex digest, checked at the end. progress: a bytes bar on stderr (plain lines
    without a terminal). stall_timeout_s: seconds without a byte before a try counts as stalled. retries:
    failed tries in a row (none taking the file further) allowed before giving up. max_size: the most bytes
    taken from a server that announces no size when `expected_size` is not given (default 100 GB).
    min_rate (bytes a second) and grace_s: the floor rate and its grace (default: the environment's
    settings, else 50 kB/s after 600 s; t2sql.download.limits). hint: appended to the messages of
    server and network errors (what else the user can do). label: the progress label (default: the name).
    durable: fsync the file before the rename, so `dest` is whole even after a power cut. A caller that
    checks every byte again before use (an archive whose members' CRCs the extraction checks) may pass
    False: a file a power cut left damaged is then refused there, never trusted.
    """
    dest = Path(dest)
    limits = TimeLimits.resolve(url, min_rate, grace_s)
    if dest.exists():
        return _check_existing(url, dest, expected_size, sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    job = _Download(url, dest, expected_size=expected_size, sha256=sha256, stall_timeout_s=stall_timeout_s,
                    retries=retries, backoff_s=backoff_s, hint=hint, durable=durable, limits=limits,
                    ceiling=size_ceiling(expected_size, max_size))
    # Unbuffered: every byte written is the kernel's at once, so a SIGKILL loses nothing written and a full
    # disk raises at the write, never later at close.
    bar = Progress(None, label or dest.name, unit="bytes", enabled=progress)
    with open(job.part, "ab", buffering=0) as f, bar:
        job.f, job.bar = f, bar
        job.lock()
        try:
            job.load()
            with make_client(stall_timeout_s) as client:
                job.run(client)
            return job.finish()
        except BaseException:
            job.hasher.close()
            job.drop_if_empty()  # a try that got no byte (a 404, a refused connection) leaves nothing behind
            raise


class _Download(Ending):
    def __init__(self, url: str, dest: Path, *, expected_size: int | None, sha256: str | None,
                 stall_timeout_s: float, retries: int, backoff_s: float, hint: str | None, durable: bool,
                 limits: TimeLimits, ceiling: int) -> None:
        self.url, self.dest, self.durable = url, dest, durable
        self.part, self.sidecar = part_path(dest), sidecar_path(dest)
        self.expected_size = expected_size
        self.pin = sha256.lower() if sha256 else None
        self.stall_timeout_s, self.retries, self.backoff_s = stall_timeout_s, max(0, retries), backoff_s
        self.hint = hint
        self.limits, self.ceiling = limits, ceiling
        self.f: Any = None
        self.bar: Progress | None = None
        self.meta: dict[str, Any] | None = None  # the sidecar: url, etag, last_modified, size
        self.offset = 0  # bytes in .part, all of the version `meta` names
        self.fetched = 0
        self.resumed = False
        self.restarted = False
        self.restarts = 0  # kept bytes thrown away in this call, counted
        self.refused: str | None = None  # how the server answered the last Range request when it did not resume
        self.tries = 0
        self.started = time.monotonic()
        self.budget = TryBudget(retries, 0)
        self.hasher = Sha256Thread()

    # -- state on disk -------------------------------------------------------------------------------------
    def lock(self) -> None:
        try:
            fcntl.flock(self.f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DownloadError(f"{self.part} is being written by another download right now; wait for it to "
                                "finish (or stop it) and run again", url=self.url) from None

    def load(self) -> None:
        """Take up the kept prefix when the sidecar says which version it is of; else start from zero."""
        have = os.fstat(self.f.fileno()).st_size
        meta = read_sidecar(self.sidecar)
        usable = (have > 0 and meta is not None and meta.get("url") == self.url and rangeable(meta)
                  and have <= meta["size"] and (self.expected_size is None or meta["size"] == self.expected_size))
        if not usable:
            self.reset()
            return
        self.meta, self.offset = meta, have
        self._hash_prefix()
        assert self.bar is not None
        self.bar.total, self.bar.done = meta["size"], have
        self._note(f"{self.dest.name}: resuming at {format_bytes(have)} of {format_bytes(meta['size'])}")

    def drop_if_empty(self) -> None:
        if self.f is not None and not self.f.closed and os.fstat(self.f.fileno()).st_size == 0:
            self.part.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)

    def reset(self) -> None:
        """Back to an empty .part: truncated first, so a crash here never pairs old bytes with new headers."""
        if os.fstat(self.f.fileno()).st_size:
            self.restarted = True
            self.restarts += 1
            self.f.truncate(0)  # appends ("ab") go to the new end
        self.sidecar.unlink(missing_ok=True)
        self.meta, self.offset, self.resumed = None, 0, False
        self.hasher.reset()
        if self.bar is not None:
            self.bar.done = 0

    def _write_sidecar(self, response: httpx.Response, size: int | None) -> None:
        self.meta = {"format": SIDECAR_FORMAT, "url": self.url, "etag": response.headers.get("ETag"),
                     "last_modified": response.headers.get("Last-Modified"), "size": size}
        self.announced = size if size is not None else self.announced
        try:
            with atomic_write(self.sidecar) as out:
                json.dump(self.meta, out)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self._no_space(size)
            raise

    def _hash_prefix(self) -> None:
        with open(self.part, "rb") as kept:
            left = self.offset
            while left > 0:
                block = kept.read(min(left, 1 << 20))
                if not block:
                    raise DownloadError(f"{self.part} shrank while it was read; run again", url=self.url)
                self.hasher.update(block)
                left -= len(block)

    # -- the tries -----------------------------------------------------------------------------------------
    def run(self, client: httpx.Client) -> None:
        self.started = time.monotonic()
        self.budget = TryBudget(self.retries, self.offset)
        while not self.complete():
            self.check_time()
            restarts = self.restarts
            try:
                self.attempt(client)
                continue
            except TryFailed as e:
                last = e
            self.budget.failed(self.offset, self.restarts > restarts)
            if self.budget.spent:
                raise self._gave_up(last)
            assert self.bar is not None
            self.bar.status = f"retry {self.budget.failures}"
            time.sleep(min(_MAX_BACKOFF_S, self.backoff_s * 2 ** (self.budget.failures - 1)))

    def complete(self) -> bool:
        return self.meta is not None and self.meta.get("size") is not None and self.offset >= self.meta["size"]

    def attempt(self, client: httpx.Client) -> None:
        self.tries += 1
        headers = {"Accept-Encoding": "identity"}
        if self.offset > 0 and not (self.meta is not None and rangeable(self.meta)):
            why = self._why_not_resumable()
            self.reset()  # no validator to guard a Range with (or no size): never splice
            self._note(f"{self.dest.name}: {why}: starting again from zero")
        ranged = self.offset > 0
        if ranged:
            assert self.meta is not None
            headers["Range"] = f"bytes={self.offset}-"
            headers["If-Range"] = self.meta["etag"] if strong_etag(self.meta.get("etag")) \
                else self.meta["last_modified"]
        try:
            with client.stream("GET", self.url, headers=headers) as response:
                total = self._accept(response, ranged)
                self._receive(response, total)
        except httpx.TimeoutException as e:
            kind = "connect" if isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)) else "stall"
            raise TryFailed(kind, reason(e)) from None
        except httpx.ConnectError as e:
            raise TryFailed("connect", reason(e)) from None
        except (httpx.NetworkError, httpx.RemoteProtocolError) as e:
            raise TryFailed("drop", reason(e)) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.TooManyRedirects, httpx.LocalProtocolError) as e:
            raise DownloadError(f"cannot download {self.url}: {e}", url=self.url) from None

    def _accept(self, response: httpx.Response, ranged: bool) -> int | None:
        """Check the status and headers; set up .part and the sidecar; the total size (None: not announced)."""
        status = response.status_code
        if status == 206 and ranged:
            assert self.meta is not None
            given = response.headers.get("Content-Range")
            span = content_range(given)
            if span is None or span[0] != self.offset:  # a range that is not ours: never splice
                self._refuse(f"it answered a Range request from byte {self.offset:,} with Content-Range {given!r}",
                             "the server sent other bytes than those asked for (Content-Range "
                             f"{given!r}, asked from byte {self.offset:,})")
            if not (span[2] == self.meta["size"] and self._same_version(response)):
                self._refuse("it answered a Range request with another ETag, Last-Modified date or size",
                             "the file on the server is not the one partly downloaded (another ETag, date or size)")
            self._check_disk(self.meta["size"])
            self.resumed, self.refused = True, None
            return self.meta["size"]
        if status == 200:
            total = int_header(response.headers.get("Content-Length"))
            if ranged:
                assert self.meta is not None
                if total == self.meta["size"] and self._same_version(response):
                    same = "ETag" if strong_etag(self.meta.get("etag")) else "Last-Modified date"
                    self.refused = f"it answered a Range request with the whole file, same {same}"
                    note = f"the server ignored the Range request (same {same})"
                else:  # If-Range did its work: the file changed on the server
                    self.refused = "it answered a Range request with another ETag, Last-Modified date or size"
                    note = "the file on the server changed since the partial download (another ETag, date or size)"
                self.reset()
                self._note(f"{self.dest.name}: {note}: starting again from zero")
            self._check_announced(total)
            self._write_sidecar(response, total)
            assert self.bar is not None
            self.bar.total = total
            if total is not None or self.expected_size is not None:
                self._check_disk(total if total is not None else self.ceiling)
            return total
        if status == 416 and ranged:
            assert self.meta is not None
            has = unsatisfied_range_size(response.headers.get("Content-Range"))
            if has == self.offset:  # it has the bytes we have, and announced more: its size was wrong
                announced = self.meta["size"]
                self._discard()
                raise DownloadError(
                    f"{self.url} announced {announced:,} bytes, sent {has:,}, and now says its file has {has:,} "
                    f"(a 416 to a Range request from byte {has:,}): the size it announces is wrong, so the "
                    f"download cannot be checked; the partial file was deleted{self._hint()}", url=self.url)
            self._refuse(f"it has a file of {has:,} bytes now, not the one of {self.meta['size']:,} partly "
                         "downloaded" if has is not None else "it answered a Range request with a 416",
                         "the file on the server is shorter than the part downloaded (a 416 to the Range request)")
        where = f"{self.url} answered {status} {response.reason_phrase}".rstrip()
        if status in _RETRY_STATUSES or status >= 500:
            raise TryFailed("status", where, status)
        if status == 206:
            raise DownloadError(f"{where} to a request for the whole file; the server is not fit to download "
                                f"from{self._hint()}", url=self.url, status=status)
        if status in (401, 403, 404, 410):
            what = "no such file there" if status in (404, 410) else "access refused"
            raise DownloadError(f"{where} ({what}){self._hint()}", url=self.url, status=status)
        raise DownloadError(f"{where}{self._hint()}", url=self.url, status=status)

    def _refuse(self, refused: str, note: str) -> None:
        """The server would not continue the kept bytes: throw them away, say so, and try again from zero."""
        self.refused = refused
        self.reset()
        self._note(f"{self.dest.name}: {note}: starting again from zero")
        raise TryFailed("restart", note)

    def _same_version(self, response: httpx.Response) -> bool:
        assert self.meta is not None
        return (_same(self.meta.get("etag"), response.headers.get("ETag"))
                and _same(self.meta.get("last_modified"), response.headers.get("Last-Modified")))

    def _check_announced(self, total: int | None) -> None:
        if self.expected_size is not None and total is not None and total != self.expected_size:
            raise DownloadError(
                f"{self.url} announces {total:,} bytes, but this file is {self.expected_size:,} bytes: the server "
                f"holds another file or another version{self._hint()}", url=self.url)
        if total is not None and total > self.ceiling:
            raise DownloadError(
                f"{self.url} announces {total:,} bytes, more than the {self.ceiling:,} this download takes "
                f"(max_size): it is not the file expected{self._hint()}", url=self.url)

    def _check_disk(self, total: int) -> None:
        check_free_space(self.part.parent, total - self.offset, f"downloading {self.dest.name}")

    def _receive(self, response: httpx.Response, total: int | None) -> None:
        assert self.bar is not None
        write = self.f.write
        try:
            for chunk in response.iter_raw():
                if total is None and self.offset + len(chunk) > self.ceiling:
                    self._over_ceiling()
                done = write(chunk)
                while done < len(chunk):  # a short write (a signal, a disk filling up): the rest, or the error
                    done += write(memoryview(chunk)[done:])
                self.hasher.update(chunk)
                n = len(chunk)
                self.offset += n
                self.fetched += n
                self.bar.advance(n)
                self.check_time()
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self._no_space(total)
            raise
        if total is None:  # nothing announced: the end of the body is the end of the file
            assert self.meta is not None
            self.meta["size"] = self.offset
            return
        if self.offset < total:
            raise TryFailed("drop", f"the connection closed after {self.offset:,} of {total:,} bytes")
        if self.offset > total:
            self.reset()
            raise DownloadError(f"{self.url} sent more bytes than it announced ({total:,}); the partial file was "
                                f"deleted{self._hint()}", url=self.url)

    def _note(self, message: str) -> None:
        """A line for the user beside the progress (silent when progress is off)."""
        bar = self.bar
        if bar is not None and bar.enabled:
            bar.stream.write(("\r\033[K" if bar.tty else "") + message + "\n")
            bar.stream.flush()

    # -- the end -------------------------------------------------------------------------------------------
    def finish(self) -> DownloadResult:
        assert self.meta is not None
        size = self.offset
        if self.expected_size is not None and size != self.expected_size:
            self.reset()
            raise DownloadError(f"{self.url} gave {size:,} bytes, but this file is {self.expected_size:,} bytes; "
                                f"the partial file was deleted{self._hint()}", url=self.url)
        digest = self.hasher.hexdigest()
        if self.pin is not None and digest != self.pin:
            self.reset()
            self.part.unlink(missing_ok=True)
            raise ChecksumMismatch(
                f"{self.url}: the downloaded file's sha256 is {digest}, not the pinned {self.pin}: the server holds "
                f"another version or the transfer was corrupted; the download was deleted, run again to fetch it "
                f"anew{self._hint()}", url=self.url, expected=self.pin, actual=digest)
        if self.durable:
            os.fsync(self.f.fileno())
        os.replace(self.part, self.dest)  # the fd (and the lock) stay valid across the rename
        self.sidecar.unlink(missing_ok=True)
        return DownloadResult(self.dest, size, digest, self.meta.get("etag"), self.meta.get("last_modified"),
                              self.fetched, self.resumed, self.pin is not None, self.restarted)


def _check_existing(url: str, dest: Path, expected_size: int | None, pin: str | None) -> DownloadResult:
    size = dest.stat().st_size
    if expected_size is not None and size != expected_size:
        raise DownloadError(f"{dest} exists but is {size:,} bytes, not {expected_size:,}: it is not this file "
                            f"({url}); delete it to download it again", url=url)
    h = hashlib.sha256()
    with open(dest, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    digest = h.hexdigest()
    if pin is not None and digest != pin.lower():
        raise ChecksumMismatch(f"{dest} exists but its sha256 is {digest}, not the pinned {pin.lower()}; delete it "
                               f"to download it again ({url})", url=url, expected=pin.lower(), actual=digest)
    if not part_path(dest).exists():
        sidecar_path(dest).unlink(missing_ok=True)  # left by a run stopped between the rename and this
    return DownloadResult(dest, size, digest, None, None, 0, False, pin is not None, already_done=True)


def _same(kept: str | None, sent: str | None) -> bool:
    """A validator the 206 carries must be the one kept (a server that sends none proves nothing either way:
    If-Range already asked it)."""
    return kept is None or sent is None or kept == sent


