"""A static file server on 127.0.0.1 with what a download client meets in the wild: HTTP/1.1 keep-alive,
single byte ranges (`Range: bytes=A-B`, `bytes=A-`, `bytes=-N`, 206 with Content-Range, 416 past the end),
`If-Range` on the ETag or the Last-Modified date (a mismatch answers 200 with the whole file), HEAD,
and faults injected per request: a status instead of the file, the connection cut after N body bytes,
the server stalling after N body bytes, a rate limit (a drip); and the ways servers in the wild
misbehave: a lying Content-Length, Range ignored, an ETag new at every request, a wrong Content-Range,
an endless body without a Content-Length. A fault is queued for the next request (`fault`) or stands
for every request (`always`): a server that misbehaves the same way each time.

The download, archive and end-to-end tests serve files with it, in-process (`t2sql bench download`
has a plain server of its own, t2sql.bench.serve):

    with LoopbackFileServer() as server:
        server.add("dev.zip", data)                     # bytes or a Path; ETag and Last-Modified made up
        server.fault(Fault(drop_after=100_000))         # the next request is cut after 100 kB of body
        server.always(Fault(ignore_range=True))         # every later request without a queued fault
        download(server.url("dev.zip"), dest)
        server.requests                                 # what was asked and what was sent, per request

Nothing here is fit to face a network: it binds 127.0.0.1 only.
"""

from __future__ import annotations

import email.utils
import hashlib
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_CHUNK = 64 * 1024


@dataclass
class Fault:
    """What the server does to one request instead of serving it plainly (the next request takes the
    next queued fault). `path` limits it to requests for that file name (None: any)."""

    status: int | None = None  # answer this status (with a short body) instead of the file
    drop_after: int | None = None  # cut the connection after this many body bytes
    stall_after: int | None = None  # stop sending after this many body bytes, for stall_s, then close
    stall_s: float = 3600.0
    rate: float | None = None  # bytes per second for this response
    announce: int | None = None  # send this Content-Length (a lie: the body is the real one, then a close)
    ignore_if_range: bool = False  # serve the range even when If-Range names another version (a broken server)
    ignore_range: bool = False  # answer a Range request with 200 and the whole file (a server that cannot resume)
    flip_etag: bool = False  # send an ETag no request saw before (a server whose validator changes every time)
    bad_content_range: bool = False  # a 206 whose Content-Range numbers the part from 0, not from where it starts
    endless: bool = False  # no Content-Length, and a body that repeats the file until the client hangs up
    path: str | None = None


@dataclass
class ServedFile:
    content: bytes | Path
    etag: str | None
    last_modified: str | None

    @property
    def size(self) -> int:
        return len(self.content) if isinstance(self.content, bytes) else self.content.stat().st_size


@dataclass
class Request:
    """One request as the server saw it and what it sent back."""

    method: str
    path: str
    range: str | None
    if_range: str | None
    status: int = 0
    start: int = 0  # first byte offset of the body sent
    sent: int = 0  # body bytes written to the socket
    fault: Fault | None = None


class LoopbackFileServer:
    """Serves named files (`add`) at http://127.0.0.1:PORT/NAME from a thread; `with` starts and stops it."""

    def __init__(self, *, rate: float | None = None, tls: tuple[str, str] | None = None) -> None:
        """rate: bytes per second for every response (None: as fast as the socket takes). tls: (certificate
        file, key file) to serve https:// instead."""
        self.files: dict[str, ServedFile] = {}
        self.rate = rate
        self.tls = tls
        self.requests: list[Request] = []
        self._faults: list[Fault] = []
        self._standing: list[Fault] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- files and faults ---------------------------------------------------------------------------------
    def add(self, name: str, content: bytes | str | os.PathLike, *, etag: str | None = "auto",
            last_modified: str | None = "auto") -> ServedFile:
        """Serve `content` (bytes, or a file read at each request) as /NAME. etag/last_modified: "auto"
        makes one from the content (so new content gets a new one), None sends none, else the value."""
        body = content if isinstance(content, bytes) else Path(content)
        if etag == "auto":
            if isinstance(body, bytes):
                etag = '"' + hashlib.sha1(body).hexdigest()[:20] + '"'
            else:
                st = body.stat()
                etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        if last_modified == "auto":
            mtime = time.time() if isinstance(body, bytes) else body.stat().st_mtime
            last_modified = email.utils.formatdate(mtime, usegmt=True)
        served = ServedFile(body, etag, last_modified)
        with self._lock:
            self.files[name.lstrip("/")] = served
        return served

    def fault(self, *faults: Fault) -> None:
        """Queue faults: each following request (for its `path`, when set) takes the next one."""
        with self._lock:
            self._faults.extend(faults)

    def always(self, fault: Fault) -> None:
        """A fault for every later request (for its `path`, when set) that no queued fault takes."""
        with self._lock:
            self._standing.append(fault)

    def sent(self, name: str | None = None) -> int:
        """Body bytes sent so far (for one file name, or all)."""
        with self._lock:
            return sum(r.sent for r in self.requests if name is None or r.path == name)

    def _take_fault(self, path: str) -> Fault | None:
        with self._lock:
            for i, f in enumerate(self._faults):
                if f.path is None or f.path == path:
                    return self._faults.pop(i)
            for f in self._standing:
                if f.path is None or f.path == path:
                    return f
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        assert self._httpd is not None, "the server is not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def url(self, name: str) -> str:
        return f"{self.base_url}/{name.lstrip('/')}"

    def start(self) -> "LoopbackFileServer":
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        if self.tls:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="loopback-http",
                                        daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()  # wakes stalled and rate-limited responses
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "LoopbackFileServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        """A client that hung up (a download that gave up on a response) is not the server's error."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_owner: LoopbackFileServer

    def log_message(self, format, *args) -> None:  # quiet: the tests read `requests` instead
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        owner = self.server_owner
        name = unquote(urlsplit(self.path).path).lstrip("/")
        req = Request(self.command, name, self.headers.get("Range"), self.headers.get("If-Range"))
        with owner._lock:
            owner.requests.append(req)
        fault = owner._take_fault(name)
        req.fault = fault
        served = owner.files.get(name)
        if fault is not None and fault.status is not None:
            return self._plain(req, fault.status, f"{fault.status} injected\n")
        if served is None:
            return self._plain(req, 404, f"no file {name!r} here\n")
        size = served.size
        etag = served.etag
        if fault is not None and fault.flip_etag:
            with owner._lock:
                etag = f'"flip-{len(owner.requests)}"'
        start, end, status = 0, size - 1, 200
        wanted = _parse_range(req.range, size) if req.range and not (fault is not None and fault.ignore_range) \
            else None
        if wanted is not None and req.if_range is not None and req.if_range not in (etag, served.last_modified) \
                and not (fault is not None and fault.ignore_if_range):
            wanted = None  # the client's copy is of another version: the whole file
        if wanted == "unsatisfiable":
            return self._plain(req, 416, "range not satisfiable\n", {"Content-Range": f"bytes */{size}"})
        if isinstance(wanted, tuple):
            start, end = wanted
            status = 206
        length = max(0, end - start + 1)
        req.status, req.start = status, start
        endless = fault is not None and fault.endless
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        if endless:  # the end of the body is the close, which never comes
            self.send_header("Connection", "close")
        else:
            announced = fault.announce if fault is not None and fault.announce is not None else length
            self.send_header("Content-Length", str(announced))
        self.send_header("Accept-Ranges", "bytes")
        if etag:
            self.send_header("ETag", etag)
        if served.last_modified:
            self.send_header("Last-Modified", served.last_modified)
        if status == 206:
            first = 0 if fault is not None and fault.bad_content_range else start
            self.send_header("Content-Range", f"bytes {first}-{first + length - 1}/{size}")
        self.end_headers()
        if head:
            return
        if endless:
            return self._endless(req, served, fault)
        self._body(req, served, start, length, fault)

    def _body(self, req: Request, served: ServedFile, start: int, length: int, fault: Fault | None) -> None:
        owner = self.server_owner
        limit = length
        cut = None
        if fault is not None and fault.drop_after is not None:
            limit, cut = min(length, fault.drop_after), "drop"
        if fault is not None and fault.stall_after is not None:
            limit, cut = min(length, fault.stall_after), "stall"
        rate = fault.rate if fault is not None and fault.rate is not None else owner.rate
        try:
            if rate is None and cut is None and isinstance(served.content, Path):
                with served.content.open("rb") as f:  # the fast path: the kernel copies the file
                    req.sent = self.connection.sendfile(f, start, length)
            else:
                self._write_slowly(req, served, start, limit, rate)
        except (BrokenPipeError, ConnectionResetError):  # the client went away: its business
            self.close_connection = True
            return
        if cut == "stall":
            owner._stop.wait(fault.stall_s)
        if cut is not None or (fault is not None and fault.announce is not None):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _endless(self, req: Request, served: ServedFile, fault: Fault) -> None:
        """The file again and again (at the fault's or the server's rate), until the client hangs up or the
        server stops."""
        owner = self.server_owner
        self.close_connection = True
        content = served.content if isinstance(served.content, bytes) else served.content.read_bytes()
        rate = fault.rate if fault.rate is not None else owner.rate
        step = min(_CHUNK, max(1, int(rate / 20))) if rate is not None else _CHUNK
        began = time.monotonic()
        try:
            while content and not owner._stop.is_set():
                at = req.sent % len(content)
                chunk = content[at:at + step]
                self.wfile.write(chunk)
                req.sent += len(chunk)
                if rate is not None:
                    ahead = req.sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        owner._stop.wait(ahead)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _write_slowly(self, req: Request, served: ServedFile, start: int, limit: int, rate: float | None) -> None:
        owner = self.server_owner
        began = time.monotonic()
        f = None if isinstance(served.content, bytes) else served.content.open("rb")
        try:
            if f is not None:
                f.seek(start)
            while req.sent < limit and not owner._stop.is_set():
                n = min(_CHUNK, limit - req.sent)
                if rate is not None:
                    n = min(n, max(1, int(rate / 20)))  # ~20 writes a second at a low rate
                if f is None:
                    chunk = memoryview(served.content)[start + req.sent:start + req.sent + n]
                else:
                    chunk = f.read(n)
                    if not chunk:
                        break
                self.wfile.write(chunk)
                req.sent += len(chunk)
                if rate is not None:
                    ahead = req.sent / rate - (time.monotonic() - began)
                    if ahead > 0:
                        owner._stop.wait(ahead)
        finally:
            if f is not None:
                f.close()

    def _plain(self, req: Request, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        body = text.encode()
        req.status = status
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _parse_range(value: str, size: int):
    """One byte range -> (start, end) inclusive; "unsatisfiable"; None when not understood (serve all)."""
    unit, _, spec = value.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        return None
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            return (max(0, size - n), size - 1) if n > 0 and size else "unsatisfiable"
        start = int(first)
        end = int(last) if last else size - 1
    except ValueError:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size - 1)
