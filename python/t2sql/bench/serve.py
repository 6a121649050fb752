"""The file server `t2sql bench download` measures against: `python -m t2sql.bench.serve DIR` serves DIR's
files on 127.0.0.1, prints its port and runs until killed. Plain GET and HEAD, the kernel copying the file
(sendfile); no ranges and no faults (the download tests' server, tests/loopback_http.py, has those)."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    directory: Path

    def log_message(self, format, *args) -> None:  # quiet: the bench prints its own report
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        name = unquote(urlsplit(self.path).path).lstrip("/")
        path = self.directory / name
        if "/" in name or not name or not path.is_file():  # the folder's own files only
            self.send_error(404)
            return
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if not head:
            with path.open("rb") as f:
                try:
                    self.connection.sendfile(f, 0, size)
                except (BrokenPipeError, ConnectionResetError):  # the client hung up: its business
                    self.close_connection = True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m t2sql.bench.serve DIR", file=sys.stderr)
        return 2
    handler = type("Handler", (_Handler,), {"directory": Path(args[0])})
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        print(httpd.server_address[1], flush=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
