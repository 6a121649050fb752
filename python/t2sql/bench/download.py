"""`t2sql bench download`: the download rate of t2sql's downloader against `curl` for the same file on 127.0.0.1
(served by t2sql.bench.serve in its own process), and the peak RSS of an extraction in a fresh interpreter.
What it measures and its targets: docs/benchmarks.md, "The downloader: `t2sql bench download`"."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from t2sql.download.http import check_free_space, download
from t2sql.progress import format_bytes

TARGET_RATIO = 0.8
TARGET_RSS_MIB = 64
_NAME = "payload.bin"
# BIRD's dev.zip: the outer folder and the inner zip's name (docs/training.md)
DEV_INNER = "dev_20240627/dev_databases.zip"
_EXTRACT_DBS = 3  # databases in the generated archive
_ZERO_SHARE = 0.4  # of each database's bytes, zero-filled (the compressible part); the rest random


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


def _env() -> dict[str, str]:
    """The environment of a child interpreter that imports this t2sql (the one running), not an installed one."""
    here = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)}


def _serve(directory: Path) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, "-m", "t2sql.bench.serve", str(directory)],
                            stdout=subprocess.PIPE, text=True, env=_env())
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.isdigit():
        proc.kill()
        raise RuntimeError(f"the file server did not start (it printed {line!r})")
    return proc, int(line)


def _curl_version(curl: str) -> str:
    try:
        out = subprocess.run([curl, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "curl"
    return " ".join(out.split()[:2]) if out else "curl"


def bench_download(size_mb: int, work_dir: Path, repeat: int, extract_mb: int = 0) -> dict[str, Any]:
    """The download rounds, then (with `extract_mb`) the extraction's peak RSS under report["extract"]."""
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
        rounds: dict[str, list[float]] = {"t2sql": [], "t2sql_durable": [],
                                          **({"curl": [], "curl_fsync": []} if curl else {})}
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
                for name, durable in (("t2sql", False), ("t2sql_durable", True)):
                    out = fetched / f"{name}-{i}"
                    began = time.perf_counter()
                    result = download(url, out, sha256=sha, expected_size=size, progress=False, retries=0,
                                      durable=durable)
                    rounds[name].append(time.perf_counter() - began)
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
    report["t2sql"]["command"] = "download(URL, OUT, sha256=..., expected_size=..., durable=False), as prepare"
    report["t2sql_durable"]["command"] = "the same with durable=True (fsync before the rename)"
    if curl:
        report["curl"]["command"] = f"curl -sS --fail -o OUT {url}"
        report["curl"]["version"] = _curl_version(curl)
        report["curl_fsync"]["command"] = "the same, then os.fsync(OUT)"
        report["ratio"] = report["t2sql"]["mb_per_s"] / report["curl"]["mb_per_s"]
        report["ratio_durable"] = report["t2sql_durable"]["mb_per_s"] / report["curl_fsync"]["mb_per_s"]
    report["extract"] = bench_extract(extract_mb, work_dir) if extract_mb > 0 else None
    return report


def format_download(r: dict[str, Any]) -> str:
    lines = [f"t2sql bench download — {format_bytes(r['bytes'])} over loopback (127.0.0.1), best of {r['repeat']}; "
             f"{r['cores']} cores, load average {r['load_average']} at start",
             f"  {'client':<22}{'MB/s':>9}{'best s':>9}{'median MB/s':>13}  command"]
    rows = [("t2sql download", r["t2sql"]), ("t2sql, durable=True", r["t2sql_durable"])]
    if r["curl"]:
        rows[:0] = [(r["curl"].get("version", "curl"), r["curl"]), ("curl, then fsync", r["curl_fsync"])]
    for name, row in rows:
        lines.append(f"  {name:<22}{row['mb_per_s']:>9.1f}{row['best_s']:>9.3f}{row['median_mb_per_s']:>13.1f}  "
                     f"{row['command']}")
    if r["curl"]:
        for key, ours, against in (("ratio", "t2sql", "curl"), ("ratio_durable", "t2sql durable", "curl then fsync")):
            verdict = "meets" if r[key] >= r["target_ratio"] else "BELOW"
            lines.append(f"  ratio {ours} / {against}: {r[key]:.2f}x ({verdict} the target of "
                         f"{r['target_ratio']:.1f}x)")
        lines.append("  (t2sql computes the sha256 while writing; curl does not)")
    else:
        lines.append("  curl is not on PATH: no comparison (install curl to get the ratio)")
    if r.get("extract"):
        lines += ["", format_extract(r["extract"])]
    return "\n".join(lines)


# Run in a fresh interpreter: its RSS after the imports, then the extraction as prepare runs it, then its own
# peak. VmHWM is this process's own high-water mark; ru_maxrss (the fallback off Linux; bytes on macOS) would
# also count what the parent held when it forked.
_EXTRACT_SCRIPT = """
import json, resource, sys, time
from pathlib import Path

def rss_kib(field):
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak

import t2sql
from t2sql.download.archive import extract_databases
baseline, baseline_now = rss_kib("VmHWM"), rss_kib("VmRSS")
began = time.perf_counter()
result = extract_databases(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), identity={"bench": 1}, progress=False)
seconds = time.perf_counter() - began
print(json.dumps({"bytes_written": result.bytes_written, "databases": result.databases, "seconds": seconds,
                  "baseline_kib": baseline, "baseline_now_kib": baseline_now, "peak_kib": rss_kib("VmHWM")}))
"""


def _make_database(path: Path, random_bytes: int, zero_bytes: int) -> None:
    """A SQLite database of about `random_bytes` of random blobs (incompressible) and `zero_bytes` of zeros."""
    con = sqlite3.connect(path)
    try:
        con.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT, price REAL)")
        con.executemany("INSERT INTO item (name, price) VALUES (?, ?)",
                        [(f"{path.stem}-item-{i}", i * 1.5) for i in range(1000)])
        con.execute("CREATE TABLE blob (id INTEGER PRIMARY KEY, data BLOB)")
        left = random_bytes
        while left > 0:
            piece = min(left, 1 << 20)
            con.execute("INSERT INTO blob (data) VALUES (?)", (os.urandom(piece),))
            left -= piece
        if zero_bytes:
            con.execute("INSERT INTO blob (data) VALUES (zeroblob(?))", (zero_bytes,))
        con.commit()
    finally:
        con.close()


def make_dev_archive(dest: Path, total_bytes: int, scratch: Path) -> dict[str, Any]:
    """An outer zip at `dest` in BIRD's dev layout, `DEV_INNER` holding `_EXTRACT_DBS` databases of about
    `total_bytes` together (each written, zipped and deleted in turn, in `scratch`). Python's zipfile writes
    it; t2sql reads it with its own reader."""
    inner = scratch / "dev_databases.zip"
    database_bytes = 0
    with zipfile.ZipFile(inner, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("dev_databases/", b"")
        for i in range(_EXTRACT_DBS):
            db_id = f"bench_db_{i}"
            share = total_bytes // _EXTRACT_DBS
            zeros = int(share * _ZERO_SHARE)
            db = scratch / f"{db_id}.sqlite"
            _make_database(db, share - zeros, zeros)
            database_bytes += db.stat().st_size
            zf.writestr(f"dev_databases/{db_id}/", b"")
            zf.write(db, f"dev_databases/{db_id}/{db_id}.sqlite")
            db.unlink()
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr(DEV_INNER.split("/")[0] + "/", b"")
        zf.writestr(DEV_INNER.split("/")[0] + "/dev.json", b"[]\n")
        zf.write(inner, DEV_INNER)
    inner_bytes = inner.stat().st_size
    inner.unlink()
    return {"database_bytes": database_bytes, "inner_zip_bytes": inner_bytes, "archive_bytes": dest.stat().st_size,
            "databases": _EXTRACT_DBS}


def bench_extract(extract_mb: int, work_dir: Path) -> dict[str, Any]:
    """Peak RSS and rate of extract_databases on a generated ~`extract_mb` MB archive (see the module's doc)."""
    total = extract_mb * 1_000_000
    work_dir.mkdir(parents=True, exist_ok=True)
    # the databases (one at a time) + the inner zip + the outer zip, then the outer zip + what is laid out
    check_free_space(work_dir, 3 * total, f"the extraction bench ({format_bytes(total)} of databases, zipped "
                                          "twice, then laid out)")
    with tempfile.TemporaryDirectory(prefix="t2sql-bench-extract-", dir=work_dir) as tmp:
        archive = Path(tmp) / "dev.zip"
        report = make_dev_archive(archive, total, Path(tmp))
        proc = subprocess.run([sys.executable, "-c", _EXTRACT_SCRIPT, str(archive), DEV_INNER,
                               str(Path(tmp) / "dev_databases")],
                              capture_output=True, text=True, timeout=3600, env=_env())
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise RuntimeError(f"the extraction under measurement failed: {last}")
        got = json.loads(proc.stdout)
    if got["bytes_written"] < report["database_bytes"]:
        raise RuntimeError(f"the extraction wrote {got['bytes_written']} bytes, not the "
                           f"{report['database_bytes']} of its databases")
    peak, base = got["peak_kib"] / 1024, got["baseline_kib"] / 1024
    report.update({
        "bytes_written": got["bytes_written"], "seconds": got["seconds"],
        "mb_per_s": got["bytes_written"] / got["seconds"] / 1e6 if got["seconds"] > 0 else None,
        "peak_rss_mib": peak, "baseline_rss_mib": base, "added_rss_mib": peak - base,
        "target_rss_mib": TARGET_RSS_MIB, "meets_target": peak <= TARGET_RSS_MIB,
        "rss_source": "VmHWM" if Path("/proc/self/status").exists() else "ru_maxrss",
        "command": f"t2sql.download.archive.extract_databases(ARCHIVE, {DEV_INNER!r}, TARGET, identity=..., "
                   "progress=False), in a fresh interpreter",
    })
    return report


def format_extract(e: dict[str, Any]) -> str:
    verdict = "meets" if e["meets_target"] else "ABOVE"
    rate = f"{e['mb_per_s']:.1f}" if e["mb_per_s"] is not None else "-"
    return "\n".join([
        f"t2sql extract — {e['databases']} databases, {format_bytes(e['database_bytes'])} "
        f"(inner zip {format_bytes(e['inner_zip_bytes'])}, outer {format_bytes(e['archive_bytes'])}, "
        f"both deflated), BIRD's dev layout ({DEV_INNER})",
        f"  {'peak RSS MiB':>13}{'after imports':>15}{'added':>8}{'MB/s':>8}{'seconds':>9}{'written':>11}",
        f"  {e['peak_rss_mib']:>13.1f}{e['baseline_rss_mib']:>15.1f}{e['added_rss_mib']:>8.1f}{rate:>8}"
        f"{e['seconds']:>9.2f}{format_bytes(e['bytes_written']):>11}",
        f"  peak RSS ({e['rss_source']}) {e['peak_rss_mib']:.1f} MiB: {verdict} the target of "
        f"{e['target_rss_mib']} MiB; the rate includes the CRC checks, fsyncs and each database's quick_check",
        f"  {e['command']}",
    ])
