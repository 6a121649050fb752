"""A Hugging Face Hub on loopback (127.0.0.1) serving tiny repositories, for `t2sql-train prepare`'s
downloads: point huggingface_hub at it with HF_ENDPOINT=<hub.url>. It answers the calls
huggingface_hub makes for `repo_info`, `list_repo_tree` and `snapshot_download` (HEAD and GET of
/<repo>/resolve/<commit>/<file>, byte ranges included), and can fail one file part way: the body stops
after half its bytes, the way a dropped connection ends a download.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    def __init__(self, repos: dict[tuple[str, str], dict[str, bytes]]):
        """repos: {(repo_type, repo_id): {path: content}}, repo_type "model" or "dataset"."""
        self.repos = repos
        self.cut: set[str] = set()  # paths whose GET stops half way
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._serve(self, body=False)

            def do_GET(self):
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Hub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _files(self, repo_type: str, repo_id: str) -> dict[str, bytes] | None:
        return self.repos.get((repo_type, repo_id))

    def _serve(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlsplit(h.path).path)
        self.requests.append(f"{h.command} {path}")
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m:
            files = self._files(m[1][:-1], m[2])
            if files is None:
                return self._send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            info = {"id": m[2], "sha": COMMIT, "private": False, "siblings": [{"rfilename": p} for p in files]}
            return self._json(h, info, body)
        m = re.fullmatch(r"/api/(models|datasets)/([^/]+/[^/]+)/tree/[^/]+(?:/.*)?", path)
        if m:
            files = self._files(m[1][:-1], m[2])
            if files is None:
                return self._send(h, 404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"})
            tree = [{"type": "file", "path": p, "size": len(b), "oid": _oid(b)} for p, b in files.items()]
            return self._json(h, tree, body)
        m = re.fullmatch(r"/(datasets/)?([^/]+/[^/]+)/resolve/[^/]+/(.+)", path)
        if m:
            files = self._files("dataset" if m[1] else "model", m[2])
            data = None if files is None else files.get(m[3])
            if data is None:
                return self._send(h, 404, b"not found", {"X-Error-Code": "EntryNotFound"})
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{_oid(data)}"'}
            start = 0
            rng = h.headers.get("Range")
            if rng and (r := re.fullmatch(r"bytes=(\d+)-", rng)):
                start = int(r[1])
            status = 206 if start else 200
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            chunk = data[start:]
            if not body:
                return self._send(h, 200, b"", {**headers, "Content-Length": str(len(data))}, body=False)
            if m[3] in self.cut:  # a dropped connection: half the bytes, then nothing
                h.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(chunk))}.items():
                    h.send_header(k, v)
                h.send_header("Connection", "close")
                h.end_headers()
                h.wfile.write(chunk[: len(chunk) // 2])
                h.wfile.flush()
                h.close_connection = True
                return
            return self._send(h, status, chunk, headers)
        self._send(h, 404, b"no such endpoint")

    def _json(self, h, obj, body: bool) -> None:
        self._send(h, 200, json.dumps(obj).encode(), {"Content-Type": "application/json"}, body=body)

    @staticmethod
    def _send(h, status: int, data: bytes, headers: dict | None = None, *, body: bool = True) -> None:
        h.send_response(status)
        headers = dict(headers or {})
        headers.setdefault("Content-Length", str(len(data)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        if body:
            h.wfile.write(data)


def _oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
