"""A resumable, verified download of one file over HTTP(S): `download(url, dest)`.

- The body goes to `DEST.part`; beside it `DEST.part.json` (written atomically before the first body
  byte) records the URL, the ETag, the Last-Modified date and the size the server announced. `DEST`
  appears, by a rename, only once the file is complete and verified: `DEST` existing means done.
- A `.part` left by a cut connection, a SIGKILL or a Ctrl-C is resumed by the next call: a Range request
  guarded by If-Range on the ETag (on the Last-Modified date when there is no strong ETag). A 206 whose
  validators and total size match appends; anything else (a 200 to the ranged request, another ETag or
  date, another size) means the file changed on the server, and the download restarts from zero: two
  versions are never spliced.
- Within one call a dropped connection, a stall or a 5xx is retried, resuming, `retries` times in a row
  with a doubling backoff (a try that brought bytes resets the count).
- Verified: the size the server announced (Content-Length, or the total of Content-Range), the caller's
  `expected_size`, and the caller's `sha256` pin, computed while writing (on resume, over the kept prefix
  first). A sha256 mismatch deletes the partial file.
- A server that sends nothing for `stall_timeout_s` is a stall (DownloadStalled), never a hang.
- Errors are typed (t2sql.errors: DownloadError, DownloadStalled, ChecksumMismatch, NoSpaceError), one
  line each, naming the URL or the host and saying what to do.

Disk: a download needs `bytes_to_fetch(dest, size)` more bytes free (the `.part` grows in place and the
rename costs nothing); what comes after (extraction) is the caller's to add. `free_bytes` and
`check_free_space` are here for that sum.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from t2sql.atomic import atomic_write
from t2sql.download.transport import Sha256Thread, content_range, int_header, make_client, reason
from t2sql.errors import ChecksumMismatch, DownloadError, DownloadStalled, NoSpaceError
from t2sql.progress import Progress, format_bytes

# What the errors of a BIRD download suggest (the caller may pass its own `hint`).
BIRD_URL_HINT = "to download from a mirror, pass --bird-url BASE (one serving BASE/train.zip and BASE/dev.zip)"
SIDECAR_FORMAT = 1
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


def part_path(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".part")


def sidecar_path(dest: str | os.PathLike) -> Path:
    dest = Path(dest)
    return dest.with_name(dest.name + ".part.json")


def bytes_to_fetch(dest: str | os.PathLike, size: int, url: str | None = None) -> int:
    """Bytes a download of `dest` (a file of `size` bytes) still has to fetch, which is also the disk it
    still needs: 0 when `dest` exists; `size` minus the kept prefix when a `.part` of that size's file can
    be resumed (from `url`, when given); else `size`."""
    dest = Path(dest)
    if dest.exists():
        return 0
    meta = _read_sidecar(sidecar_path(dest))
    try:
        have = part_path(dest).stat().st_size
    except OSError:
        have = 0
    if meta is None or meta.get("size") != size or have > size or (url is not None and meta.get("url") != url):
        return size
    return size - have


def free_bytes(path: str | os.PathLike) -> int:
    """Free bytes (for this user) on the file system that holds `path`, or would hold it once created."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def check_free_space(path: str | os.PathLike, needed: int, what: str) -> None:
    """Raise NoSpaceError unless the file system of `path` has `needed` bytes free; `what` says what for."""
    free = free_bytes(path)
    if free < needed:
        raise NoSpaceError(
            f"not enough disk space in {path} for {what}: {format_bytes(needed)} needed, {format_bytes(free)} "
            f"free; free {format_bytes(needed - free)} there or choose a folder on a larger disk",
            path=str(path), needed=needed, free=free)


def download(url: str, dest: str | os.PathLike, *, expected_size: int | None = None, sha256: str | None = None,
             progress: bool = True, stall_timeout_s: float = 60.0, retries: int = 5, backoff_s: float = 1.0,
             hint: str | None = BIRD_URL_HINT, label: str | None = None, durable: bool = True) -> DownloadResult:
    """Fetch `url` into `dest` (resuming a `.part` an earlier call left), verify it, rename it into place.

    expected_size: the size the file must have (a server announcing another is an error before any body
    byte). sha256: the pinned hex digest, checked at the end. progress: a bytes bar on stderr (plain lines
    without a terminal). stall_timeout_s: seconds without a byte before a try counts as stalled. retries:
    failed tries in a row (no byte received) allowed before giving up. hint: appended to the messages of
    server and network errors (what else the user can do). label: the progress label (default: the name).
    durable: fsync the file before the rename, so `dest` is whole even after a power cut. A caller that
    checks every byte again before use (an archive whose members' CRCs the extraction checks) may pass
    False: a file a power cut left damaged is then refused there, never trusted.
    """
    dest = Path(dest)
    if dest.exists():
        return _check_existing(url, dest, expected_size, sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    job = _Download(url, dest, expected_size=expected_size, sha256=sha256, stall_timeout_s=stall_timeout_s,
                    retries=retries, backoff_s=backoff_s, hint=hint, durable=durable)
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


class _Retry(Exception):
    """One try failed in a way that another try may fix; `kind` is connect, stall, drop or status."""

    def __init__(self, kind: str, detail: str, status: int | None = None):
        super().__init__(detail)
        self.kind, self.detail, self.status = kind, detail, status


class _Restart(Exception):
    """The kept prefix is of another version of the file: start again from zero, now."""


class _Download:
    def __init__(self, url: str, dest: Path, *, expected_size: int | None, sha256: str | None,
                 stall_timeout_s: float, retries: int, backoff_s: float, hint: str | None, durable: bool) -> None:
        self.url, self.dest, self.durable = url, dest, durable
        self.part, self.sidecar = part_path(dest), sidecar_path(dest)
        self.expected_size = expected_size
        self.pin = sha256.lower() if sha256 else None
        self.stall_timeout_s, self.retries, self.backoff_s = stall_timeout_s, max(0, retries), backoff_s
        self.hint = hint
        self.f: Any = None
        self.bar: Progress | None = None
        self.meta: dict[str, Any] | None = None  # the sidecar: url, etag, last_modified, size
        self.offset = 0  # bytes in .part, all of the version `meta` names
        self.fetched = 0
        self.resumed = False
        self.restarted = False
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
        meta = _read_sidecar(self.sidecar)
        usable = (have > 0 and meta is not None and meta.get("url") == self.url
                  and isinstance(meta.get("size"), int) and have <= meta["size"]
                  and (_strong_etag(meta.get("etag")) or meta.get("last_modified"))
                  and (self.expected_size is None or meta["size"] == self.expected_size))
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
            self.f.truncate(0)  # appends ("ab") go to the new end
        self.sidecar.unlink(missing_ok=True)
        self.meta, self.offset, self.resumed = None, 0, False
        self.hasher.reset()
        if self.bar is not None:
            self.bar.done = 0

    def _write_sidecar(self, response: httpx.Response, size: int | None) -> None:
        self.meta = {"format": SIDECAR_FORMAT, "url": self.url, "etag": response.headers.get("ETag"),
                     "last_modified": response.headers.get("Last-Modified"), "size": size}
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
        failures = 0
        last: _Retry | None = None
        while not self.complete():
            before = self.fetched
            try:
                self.attempt(client)
                continue
            except _Restart:
                continue
            except _Retry as e:
                last = e
            if self.fetched > before:
                failures = 0  # that try made progress: the count is of tries in a row that brought nothing
            failures += 1
            if failures > self.retries:
                raise self._gave_up(last, failures)
            time.sleep(min(_MAX_BACKOFF_S, self.backoff_s * 2 ** (failures - 1)))

    def complete(self) -> bool:
        return self.meta is not None and self.meta.get("size") is not None and self.offset >= self.meta["size"]

    def attempt(self, client: httpx.Client) -> None:
        headers = {"Accept-Encoding": "identity"}
        ranged = self.offset > 0 and self.meta is not None
        if ranged:
            assert self.meta is not None
            headers["Range"] = f"bytes={self.offset}-"
            headers["If-Range"] = self.meta["etag"] if _strong_etag(self.meta.get("etag")) \
                else self.meta["last_modified"]
        try:
            with client.stream("GET", self.url, headers=headers) as response:
                total = self._accept(response, ranged)
                self._receive(response, total)
        except httpx.TimeoutException as e:
            kind = "connect" if isinstance(e, (httpx.ConnectTimeout, httpx.PoolTimeout)) else "stall"
            raise _Retry(kind, reason(e)) from None
        except httpx.ConnectError as e:
            raise _Retry("connect", reason(e)) from None
        except (httpx.NetworkError, httpx.RemoteProtocolError) as e:
            raise _Retry("drop", reason(e)) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.TooManyRedirects, httpx.LocalProtocolError) as e:
            raise DownloadError(f"cannot download {self.url}: {e}", url=self.url) from None

    def _accept(self, response: httpx.Response, ranged: bool) -> int | None:
        """Check the status and headers; set up .part and the sidecar; the total size (None: not announced)."""
        status = response.status_code
        if status == 206 and ranged:
            assert self.meta is not None
            span = content_range(response.headers.get("Content-Range"))
            same = (span is not None and span[0] == self.offset and span[2] == self.meta["size"]
                    and _same(self.meta.get("etag"), response.headers.get("ETag"))
                    and _same(self.meta.get("last_modified"), response.headers.get("Last-Modified")))
            if not same:
                self.reset()  # another version (or a range that is not ours): never splice
                self._note(f"{self.dest.name}: the file on the server is not the one partly downloaded (another "
                           "ETag, date or size): starting again from zero")
                raise _Restart()
            self._check_disk(self.meta["size"])
            self.resumed = True
            return self.meta["size"]
        if status == 200:
            if ranged:
                self.reset()  # If-Range failed: the file changed on the server (or it ignores ranges)
                self._note(f"{self.dest.name}: the file changed on the server since the partial download (or the "
                           "server does not resume): starting again from zero")
            total = int_header(response.headers.get("Content-Length"))
            self._check_announced(total)
            self._write_sidecar(response, total)
            assert self.bar is not None
            self.bar.total = total
            if total is not None:
                self._check_disk(total)
            return total
        if status == 416 and ranged:
            self.reset()
            raise _Restart()
        where = f"{self.url} answered {status} {response.reason_phrase}".rstrip()
        if status in _RETRY_STATUSES or status >= 500:
            raise _Retry("status", where, status)
        if status == 206:
            raise DownloadError(f"{where} to a request for the whole file; the server is not fit to download "
                                f"from{self._hint()}", url=self.url, status=status)
        if status in (401, 403, 404, 410):
            what = "no such file there" if status in (404, 410) else "access refused"
            raise DownloadError(f"{where} ({what}){self._hint()}", url=self.url, status=status)
        raise DownloadError(f"{where}{self._hint()}", url=self.url, status=status)

    def _check_announced(self, total: int | None) -> None:
        if self.expected_size is not None and total is not None and total != self.expected_size:
            raise DownloadError(
                f"{self.url} announces {total:,} bytes, but this file is {self.expected_size:,} bytes: the server "
                f"holds another file or another version{self._hint()}", url=self.url)

    def _check_disk(self, total: int) -> None:
        check_free_space(self.part.parent, total - self.offset, f"downloading {self.dest.name}")

    def _receive(self, response: httpx.Response, total: int | None) -> None:
        assert self.bar is not None
        write = self.f.write
        try:
            for chunk in response.iter_raw():
                done = write(chunk)
                while done < len(chunk):  # a short write (a signal, a disk filling up): the rest, or the error
                    done += write(memoryview(chunk)[done:])
                self.hasher.update(chunk)
                n = len(chunk)
                self.offset += n
                self.fetched += n
                self.bar.advance(n)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self._no_space(total)
            raise
        if total is None:  # nothing announced: the end of the body is the end of the file
            assert self.meta is not None
            self.meta["size"] = self.offset
            return
        if self.offset < total:
            raise _Retry("drop", f"the connection closed after {self.offset:,} of {total:,} bytes")
        if self.offset > total:
            self.reset()
            raise DownloadError(f"{self.url} sent more bytes than it announced ({total:,}); the partial file was "
                                f"deleted{self._hint()}", url=self.url)

    def _no_space(self, total: int | None) -> None:
        have = os.fstat(self.f.fileno()).st_size
        needed = (total - have) if total is not None else None
        free = free_bytes(self.part.parent)
        need = f"{format_bytes(needed)} more needed, {format_bytes(free)} free" if needed is not None \
            else f"{format_bytes(free)} free"
        raise NoSpaceError(f"no space left on the disk of {self.part} ({need}); free space there (or choose a "
                           "folder on a larger disk) and run again: the download resumes",
                           path=str(self.part), needed=needed or 0, free=free) from None

    def _gave_up(self, last: _Retry | None, tries: int) -> DownloadError:
        assert last is not None
        kept = ""
        if self.offset:
            size = self.meta.get("size") if self.meta else None
            of = f" of {format_bytes(size)}" if size else ""
            kept = f"; {format_bytes(self.offset)}{of} kept in {self.part.name}: a rerun resumes"
        tried = f"{tries} {'try' if tries == 1 else 'tries'}"
        if last.kind == "stall":
            return DownloadStalled(f"{self.url}: the server sent nothing for {self.stall_timeout_s:g} s "
                                   f"({tried}){kept}{self._hint()}", url=self.url)
        if last.kind == "connect":
            host = urlsplit(self.url).netloc
            return DownloadError(f"cannot reach {host} ({last.detail}; {tried}, {self.url}): check the network "
                                 f"and the URL{kept}{self._hint()}", url=self.url)
        if last.kind == "status":
            return DownloadError(f"{last.detail} ({tried}){kept}{self._hint()}", url=self.url, status=last.status)
        return DownloadError(f"{self.url}: the connection broke ({last.detail}; {tried}){kept}{self._hint()}",
                             url=self.url)

    def _note(self, message: str) -> None:
        """A line for the user beside the progress (silent when progress is off)."""
        bar = self.bar
        if bar is not None and bar.enabled:
            bar.stream.write(("\r\033[K" if bar.tty else "") + message + "\n")
            bar.stream.flush()

    def _hint(self) -> str:
        return f"; {self.hint}" if self.hint else ""

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


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == SIDECAR_FORMAT else None


def _strong_etag(etag: object) -> bool:
    return isinstance(etag, str) and etag.startswith('"')


def _same(kept: str | None, sent: str | None) -> bool:
    """A validator the 206 carries must be the one kept (a server that sends none proves nothing either way:
    If-Range already asked it)."""
    return kept is None or sent is None or kept == sent


