"""`t2sql bench download`: the download rate of t2sql's downloader (t2sql.download.http, as `prepare` runs it:
sha256 computed while writing, the file renamed into place) against `curl` for the same file, served on
127.0.0.1 by the same server (t2sql.bench.loopback, in its own process so that it shares no interpreter
with the client under test).

    t2sql bench download [--size-mb 300] [--repeat 3] [--work-dir DIR] [--json]

Each round fetches the file once with curl and once with t2sql, round-robin, into a fresh file that is
deleted after the round (outside the timing); the best round of each is reported, with the ratios. The
target is t2sql >= 0.8x curl. On loopback the network is out of the way: what is measured is the client's
own cost per byte, and the disk's.

t2sql fsyncs the file before renaming it into place (`DEST` existing means done, even after a power cut);
curl leaves it in the page cache, so on a real disk a few hundred MB land in memory for curl and on disk
for t2sql. Hence two curl rows: curl alone, and curl then an fsync of its file (the same durable end as
t2sql's). On a tmpfs (--work-dir /dev/shm) an fsync costs nothing and the two clients meet on CPU alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from t2sql.download.http import check_free_space, download
from t2sql.progress import format_bytes

TARGET_RATIO = 0.8
_NAME = "payload.bin"


def make_payload(path: Path, size: int) -> str:
    """`size` bytes of incompressible data at `path`; returns its sha256."""
    block = os.urandom(4 << 20)
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left > 0:
            piece = block[:min(left, len(block))]
            f.write(piece)
            h.update(piece)
            left -= len(piece)
    return h.hexdigest()


def _serve(directory: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "t2sql.bench.loopback", str(directory)],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")])})
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"the loopback server did not start (it printed {line!r})")
    return proc, int(line)


def _curl_version(curl: str) -> str:
    try:
        out = subprocess.run([curl, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "curl"
    return " ".join(out.split()[:2]) if out else "curl"


def bench_download(size_mb: int, work_dir: Path, repeat: int) -> dict[str, Any]:
    size = size_mb * 1_000_000
    work_dir.mkdir(parents=True, exist_ok=True)
    check_free_space(work_dir, 2 * size, f"the download bench ({format_bytes(size)} served and one copy fetched)")
    curl = shutil.which("curl")
    report: dict[str, Any] = {"bytes": size, "repeat": repeat, "curl": None, "curl_missing": curl is None,
                              "target_ratio": TARGET_RATIO, "load_average": round(os.getloadavg()[0], 2),
                              "cores": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="t2sql-bench-download-", dir=work_dir) as tmp:
        served, fetched = Path(tmp) / "served", Path(tmp) / "fetched"
        served.mkdir()
        fetched.mkdir()
        sha = make_payload(served / _NAME, size)
        server, port = _serve(served)
        url = f"http://127.0.0.1:{port}/{_NAME}"
        report["url"] = url
        rounds: dict[str, list[float]] = {"t2sql": [], **({"curl": [], "curl_fsync": []} if curl else {})}
        try:
            for i in range(repeat):
                if curl:
                    out = fetched / f"curl-{i}"
                    began = time.perf_counter()
                    subprocess.run([curl, "-sS", "--fail", "-o", str(out), url], check=True, timeout=3600)
                    rounds["curl"].append(time.perf_counter() - began)
                    fd = os.open(out, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                    rounds["curl_fsync"].append(time.perf_counter() - began)
                    if out.stat().st_size != size:
                        raise RuntimeError(f"curl fetched {out.stat().st_size} bytes, not {size}")
                    out.unlink()
                out = fetched / f"t2sql-{i}"
                began = time.perf_counter()
                result = download(url, out, sha256=sha, expected_size=size, progress=False, retries=0)
                rounds["t2sql"].append(time.perf_counter() - began)
                if result.sha256 != sha or result.fetched != size:
                    raise RuntimeError("t2sql's download does not match the served file")
                out.unlink()
        finally:
            server.kill()
            server.wait()
    for name, times in rounds.items():
        best = min(times)
        report[name] = {"best_s": best, "median_s": statistics.median(times), "mb_per_s": size / best / 1e6,
                        "median_mb_per_s": size / statistics.median(times) / 1e6}
    report["t2sql"]["command"] = "t2sql.download.http.download(URL, OUT, sha256=..., expected_size=...)"
    if curl:
        report["curl"]["command"] = f"curl -sS --fail -o OUT {url}"
        report["curl"]["version"] = _curl_version(curl)
        report["curl_fsync"]["command"] = "the same, then os.fsync(OUT)"
        report["ratio"] = report["t2sql"]["mb_per_s"] / report["curl"]["mb_per_s"]
        report["ratio_durable"] = report["t2sql"]["mb_per_s"] / report["curl_fsync"]["mb_per_s"]
    return report


def format_download(r: dict[str, Any]) -> str:
    lines = [f"t2sql bench download — {format_bytes(r['bytes'])} over loopback (127.0.0.1), best of {r['repeat']}; "
             f"{r['cores']} cores, load average {r['load_average']} at start",
             f"  {'client':<22}{'MB/s':>9}{'best s':>9}{'median MB/s':>13}  command"]
    rows = [("t2sql download", r["t2sql"])]
    if r["curl"]:
        rows[:0] = [(r["curl"].get("version", "curl"), r["curl"]), ("curl, then fsync", r["curl_fsync"])]
    for name, row in rows:
        lines.append(f"  {name:<22}{row['mb_per_s']:>9.1f}{row['best_s']:>9.3f}{row['median_mb_per_s']:>13.1f}  "
                     f"{row['command']}")
    if r["curl"]:
        for key, against in (("ratio", "curl"), ("ratio_durable", "curl then fsync")):
            verdict = "meets" if r[key] >= r["target_ratio"] else "BELOW"
            lines.append(f"  ratio t2sql / {against}: {r[key]:.2f}x ({verdict} the target of {r['target_ratio']:.1f}x)")
        lines.append("  (t2sql computes the sha256 while writing and fsyncs before its rename; curl does neither)")
    else:
        lines.append("  curl is not on PATH: no comparison (install curl to get the ratio)")
    return "\n".join(lines)
