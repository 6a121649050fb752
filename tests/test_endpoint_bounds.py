"""The endpoint client is bounded: a whole request by time, a reply by size.

Real servers on 127.0.0.1 that misbehave the way broken proxies and servers do: one that drips its
body one byte every half second, and one that sends a reply of hundreds of megabytes. `t2sql eval`
runs against them in a real process, whose own peak memory is read from /proc.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from t2sql.eval.endpoint import DEFAULT_MAX_BODY_BYTES

HUGE = 500 * 1024 * 1024


class Misbehaving:
    """POST answers: "drip" (headers, then a byte per 0.5 s, forever), "huge_declared" (a
    500 MB Content-Length, streamed), "huge_undeclared" (500 MB, no length, connection closed)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                return

            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                try:
                    if server.mode == "drip":
                        self.send_header("Content-Length", "1000000")
                        self.end_headers()
                        while not server.stop.wait(0.5):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                    else:
                        if server.mode == "huge_declared":
                            self.send_header("Content-Length", str(HUGE))
                        else:
                            self.send_header("Connection", "close")
                        self.end_headers()
                        block = b'{"choices": "' + b"x" * (1 << 20)
                        for _ in range(HUGE >> 20):
                            if server.stop.is_set():
                                break
                            self.wfile.write(block)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up: what it should do

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


# Runs `t2sql eval` in this process and reports its own peak memory (VmHWM) on stderr's last line.
_EVAL = """
import sys
from t2sql.cli import main
try:
    code = main(sys.argv[1:])
finally:
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print("PEAK_MIB", int(hwm.split()[1]) // 1024, file=sys.stderr)
sys.exit(code)
"""


def run_eval(url: str, tmp_path, *extra: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float, int]:
    out = tmp_path / "r.jsonl"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _EVAL, "eval", "--endpoint", url, "--model", "m", "--limit", "1",
         "--retries", "0", "--out", str(out), "--json", *extra],
        capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - started
    peak = int(proc.stderr.rsplit("PEAK_MIB", 1)[1].split()[0])
    return proc, elapsed, peak


def test_a_dripping_body_cannot_outlast_the_timeout(tmp_path):
    with Misbehaving("drip") as server:
        proc, elapsed, _ = run_eval(server.url, tmp_path, "--timeout", "5")
    assert elapsed < 5 + 10, proc.stderr  # the request's 5 s plus the process's start and imports
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]  # [0]: the header
    assert lines[0]["outcome"] == "endpoint_error"
    assert "no complete answer within 5s" in lines[0]["error"]
    assert proc.returncode == 1  # unfinished episodes: the next run retries them


@pytest.mark.parametrize("mode", ["huge_declared", "huge_undeclared"])
def test_a_huge_reply_is_refused_without_holding_it(tmp_path, mode):
    with Misbehaving(mode) as server:
        proc, _, peak = run_eval(server.url, tmp_path, "--timeout", "60")
    lines = [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()[1:]]  # [0]: the header
    assert lines[0]["outcome"] == "endpoint_error" and not lines[0]["retryable"]
    assert f"more than {DEFAULT_MAX_BODY_BYTES} bytes" in lines[0]["error"]
    assert peak < 300, f"peak {peak} MiB"  # the 500 MB reply was never held
    assert len((tmp_path / "r.jsonl").read_bytes()) < 100_000


def test_stored_transcripts_are_cut_and_say_so():
    from t2sql.eval.results import MAX_STORED_CHARS, stored_messages

    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a" * (MAX_STORED_CHARS + 5000)}]
    kept, cut = stored_messages(messages)
    assert cut == 5000 and kept[0] == messages[0]
    assert kept[1]["content"].startswith("a" * MAX_STORED_CHARS)
    assert kept[1]["content"].endswith("[t2sql: 5000 more characters not stored]")
    assert len(messages[1]["content"]) == MAX_STORED_CHARS + 5000  # the episode's own copy is untouched


def test_the_size_limit_is_a_flag(tmp_path):
    with Misbehaving("huge_declared") as server:
        run_eval(server.url, tmp_path, "--max-response-mb", "0.5")
    line = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[1])  # [0]: the header
    assert f"more than {512 * 1024} bytes" in line["error"]
