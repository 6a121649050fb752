"""The HTTP plumbing under t2sql.download.http: an httpx client that reads the socket in big pieces, a
sha256 computed in a thread beside the transfer, and the parsing of headers and network failures."""

from __future__ import annotations

import hashlib
import queue
import socket
import threading
from typing import Any

import httpx

_READ_BYTES = 1 << 20  # socket reads (httpcore asks for 64 KiB: a quarter of the rate on a fast link)


class Sha256Thread:
    """sha256 in a thread beside the socket reads and the writes (hashlib lets go of the GIL), so hashing
    does not halve the rate of a fast link."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()
        self._q: queue.Queue[bytes | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def update(self, data: bytes) -> None:
        if self._q is None:
            self._q = queue.Queue(maxsize=16)
            self._thread = threading.Thread(target=self._work, args=(self._q, self._h), daemon=True,
                                            name="t2sql-sha256")
            self._thread.start()
        self._q.put(data)

    def _work(self, q: queue.Queue[bytes | None], h: Any) -> None:
        while (data := q.get()) is not None:  # drained to the end even after an error, so no put blocks
            if self._error is None:
                try:
                    h.update(data)
                except BaseException as e:  # surfaced by hexdigest
                    self._error = e

    def _stop(self) -> None:
        if self._q is not None and self._thread is not None:
            self._q.put(None)
            self._thread.join()
        self._q, self._thread = None, None
        if self._error is not None:
            raise self._error

    def reset(self) -> None:
        self._stop()
        self._h = hashlib.sha256()

    def hexdigest(self) -> str:
        self._stop()
        return self._h.hexdigest()

    def close(self) -> None:
        """Stop the thread (a download given up or interrupted); the digest so far is dropped."""
        self._error = None
        self._stop()

    def __del__(self) -> None:  # an interrupted download: let the thread end
        if self._q is not None:
            try:
                self._q.put_nowait(None)
            except queue.Full:
                pass


def make_client(stall_timeout_s: float) -> httpx.Client:
    timeout = httpx.Timeout(stall_timeout_s, connect=min(30.0, stall_timeout_s))
    client = httpx.Client(timeout=timeout, follow_redirects=True, headers={"User-Agent": "t2sql-download"})
    # httpcore reads the socket 64 KiB at a time, which holds a fast link (loopback, a cluster's mirror) to
    # a quarter of what curl gets; bigger reads for every transport the client has (proxies included).
    # Internals of httpx: when they are not there, the defaults stay (slower, still correct).
    for transport in [getattr(client, "_transport", None), *getattr(client, "_mounts", {}).values()]:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and hasattr(backend, "connect_tcp"):
            pool._network_backend = _BigReads(backend)
    return client


class _BigReadStream:
    """httpcore's NetworkStream, asked for at least _READ_BYTES a read (duck-typed, as httpcore takes it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max(max_bytes, _READ_BYTES), timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> _BigReadStream:
        return _BigReadStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _BigReads:
    """httpcore's NetworkBackend whose streams read big."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _BigReadStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _BigReadStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def int_header(value: str | None) -> int | None:
    try:
        n = int(value) if value is not None else None
    except ValueError:
        return None
    return n if n is None or n >= 0 else None


def content_range(value: str | None) -> tuple[int, int, int] | None:
    """'bytes START-END/TOTAL' -> (start, end, total); None when absent or not of that form."""
    if not value or not value.startswith("bytes "):
        return None
    try:
        span, _, total = value[6:].partition("/")
        start, _, end = span.partition("-")
        return int(start), int(end), int(total)
    except ValueError:
        return None


def unsatisfied_range_size(value: str | None) -> int | None:
    """A 416's 'bytes */SIZE' -> SIZE, the size of the file the server has; None when absent or not so."""
    if not value or not value.startswith("bytes */"):
        return None
    return int_header(value[8:].strip())


def reason(e: BaseException) -> str:
    """Why a connection failed, in words: the name that does not resolve, the refusal, the cut."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, socket.gaierror):
            return f"the host name does not resolve: {cause.strerror or cause}"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    text = str(e) or type(e).__name__
    if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text \
            or "Temporary failure in name resolution" in text:
        return f"the host name does not resolve: {text}"
    if "Connection refused" in text:
        return "connection refused"
    return text
