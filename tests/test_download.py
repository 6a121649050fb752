"""t2sql.download.http against a real HTTP server on 127.0.0.1 (tests/loopback_http.py): resume by Range
guarded by If-Range, restart when the file changed on the server, the announced size and the sha256 pin
checked, stalls and server errors typed, a SIGKILLed or interrupted download resumed by a new process."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import child_env
from loopback_http import Fault, LoopbackFileServer
from t2sql.download import transport
from t2sql.download.http import bytes_to_fetch, download, part_path, sidecar_path
from t2sql.errors import ChecksumMismatch, DownloadError, DownloadStalled, NoSpaceError

pytestmark = pytest.mark.timeout(120)

SIZE = 2_000_000
DATA = hashlib.sha256(b"seed").digest() * (SIZE // 32)  # 2 MB, the same in every process
OTHER = hashlib.sha256(b"another version").digest() * (SIZE // 32)
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.fixture
def server():
    with LoopbackFileServer() as s:
        s.add("dev.zip", DATA)
        yield s


def fast(**kw):
    """Tries without the production backoff (the retries are what is tested, not the waiting)."""
    return {"progress": False, "backoff_s": 0.0, **kw}


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir())


def test_a_download_lands_whole_and_verified(server, tmp_path):
    dest = tmp_path / "dev.zip"
    r = download(server.url("dev.zip"), dest, sha256=SHA, expected_size=SIZE, **fast())
    assert dest.read_bytes() == DATA and leftovers(dest) == ["dev.zip"]  # no .part, no sidecar
    assert (r.path, r.size, r.sha256, r.fetched) == (dest, SIZE, SHA, SIZE)
    assert r.sha256_checked and not r.resumed and not r.restarted and not r.already_done
    assert r.etag == server.files["dev.zip"].etag and r.last_modified == server.files["dev.zip"].last_modified
    # dest existing means done: a second call asks the server nothing and checks the file
    asked = len(server.requests)
    again = download(server.url("dev.zip"), dest, sha256=SHA, **fast())
    assert again.already_done and again.fetched == 0 and again.sha256 == SHA and len(server.requests) == asked
    assert bytes_to_fetch(dest, SIZE) == 0


def test_a_dropped_connection_is_resumed_within_the_call(server, tmp_path):
    server.fault(Fault(drop_after=SIZE * 2 // 5))
    dest = tmp_path / "dev.zip"
    r = download(server.url("dev.zip"), dest, sha256=SHA, **fast())
    assert dest.read_bytes() == DATA
    first, second = server.requests
    assert (first.status, first.sent) == (200, SIZE * 2 // 5)
    assert second.range == f"bytes={SIZE * 2 // 5}-" and second.if_range == server.files["dev.zip"].etag
    assert second.status == 206 and r.resumed and not r.restarted
    assert server.sent("dev.zip") < 1.2 * SIZE and r.fetched == SIZE


def test_a_cut_download_leaves_a_part_the_next_call_resumes(server, tmp_path):
    server.fault(Fault(drop_after=700_000))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, retries=0, **fast())
    assert server.url("dev.zip") in str(e.value) and "a rerun resumes" in str(e.value)
    assert not dest.exists() and part_path(dest).stat().st_size == 700_000
    meta = json.loads(sidecar_path(dest).read_text())
    assert meta["url"] == server.url("dev.zip") and meta["size"] == SIZE
    assert meta["etag"] == server.files["dev.zip"].etag and meta["last_modified"]
    assert bytes_to_fetch(dest, SIZE) == SIZE - 700_000
    assert bytes_to_fetch(dest, SIZE, url="http://elsewhere/dev.zip") == SIZE

    r = download(server.url("dev.zip"), dest, sha256=SHA, **fast())
    assert dest.read_bytes() == DATA and leftovers(dest) == ["dev.zip"]
    assert r.resumed and r.fetched == SIZE - 700_000 and r.sha256_checked  # the kept prefix was hashed first
    assert server.sent("dev.zip") < 1.2 * SIZE


def test_without_an_etag_the_last_modified_date_guards_the_resume(tmp_path):
    with LoopbackFileServer() as server:
        served = server.add("dev.zip", DATA, etag=None)
        server.fault(Fault(drop_after=500_000))
        dest = tmp_path / "dev.zip"
        download(server.url("dev.zip"), dest, **fast())
        assert dest.read_bytes() == DATA
        assert server.requests[1].if_range == served.last_modified and server.requests[1].status == 206


@pytest.mark.parametrize("change", ["new etag", "new etag, If-Range ignored", "new size, same etag, If-Range ignored"])
def test_a_file_changed_on_the_server_restarts_from_zero(server, tmp_path, change):
    server.fault(Fault(drop_after=800_000))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError):
        download(server.url("dev.zip"), dest, retries=0, **fast())
    old_etag = server.files["dev.zip"].etag
    new = OTHER if change != "new size, same etag, If-Range ignored" else OTHER + b"longer"
    server.add("dev.zip", new, etag=old_etag if "same etag" in change else "auto")
    if "ignored" in change:  # a broken server: answers the range of the new version with a 206
        server.fault(Fault(ignore_if_range=True))
    r = download(server.url("dev.zip"), dest, **fast())
    assert dest.read_bytes() == new  # the new version, whole: never 800 kB of the old spliced in
    assert r.restarted and not r.resumed and r.sha256 == hashlib.sha256(new).hexdigest()
    assert not sidecar_path(dest).exists()


@pytest.mark.parametrize("status", [404, 403, 500])
def test_server_errors_name_the_url_and_the_mirror_flag(server, tmp_path, status):
    dest = tmp_path / "dev.zip"
    server.fault(*[Fault(status=status)] * 3)
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, retries=2, **fast())
    message = str(e.value)
    assert server.url("dev.zip") in message and str(status) in message and "--bird-url BASE" in message
    assert e.value.status == status and "\n" not in message
    assert len(server.requests) == (3 if status == 500 else 1)  # a 5xx is retried, a 404/403 is not
    assert leftovers(dest) == []  # nothing half-written: no dest, no empty .part


def test_a_missing_file_is_a_404_that_names_it(server, tmp_path):
    with pytest.raises(DownloadError) as e:
        download(server.url("train.zip"), tmp_path / "train.zip", **fast())
    assert "train.zip answered 404" in str(e.value) and e.value.url == server.url("train.zip")


def test_a_refused_connection_names_the_host(tmp_path):
    with LoopbackFileServer() as s:
        port = s.port  # a port that was just ours and is closed now
    with pytest.raises(DownloadError) as e:
        download(f"http://127.0.0.1:{port}/dev.zip", tmp_path / "dev.zip", retries=1, **fast())
    message = str(e.value)
    assert f"cannot reach 127.0.0.1:{port}" in message and "connection refused" in message
    assert "--bird-url" in message and leftovers(tmp_path / "dev.zip") == []


def test_a_stalled_server_is_a_clear_error_not_a_hang(server, tmp_path):
    server.fault(Fault(stall_after=300_000, stall_s=60), Fault(stall_after=0, stall_s=60))
    dest = tmp_path / "dev.zip"
    began = time.monotonic()
    with pytest.raises(DownloadStalled) as e:
        download(server.url("dev.zip"), dest, stall_timeout_s=1, retries=1, **fast())
    assert time.monotonic() - began < 30  # two 1 s stalls, not the server's 60 s
    message = str(e.value)
    assert "sent nothing for 1 s" in message and server.url("dev.zip") in message and "--bird-url" in message
    assert part_path(dest).stat().st_size == 300_000  # kept for a rerun
    assert download(server.url("dev.zip"), dest, **fast()).resumed and dest.read_bytes() == DATA


def test_a_sha256_mismatch_deletes_the_download(server, tmp_path):
    dest = tmp_path / "dev.zip"
    with pytest.raises(ChecksumMismatch) as e:
        download(server.url("dev.zip"), dest, sha256="0" * 64, **fast())
    assert e.value.actual == SHA and e.value.expected == "0" * 64 and SHA in str(e.value)
    assert leftovers(dest) == []


def test_a_size_other_than_expected_stops_before_the_body(server, tmp_path):
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, expected_size=SIZE + 1, **fast())
    assert f"announces {SIZE:,} bytes" in str(e.value) and leftovers(dest) == []


def test_a_part_complete_but_not_renamed_is_finished_without_the_network(server, tmp_path):
    """A run killed between its last byte and the rename: the next call renames, asking the server nothing."""
    dest = tmp_path / "dev.zip"
    server.fault(Fault(drop_after=600_000))
    with pytest.raises(DownloadError):
        download(server.url("dev.zip"), dest, retries=0, **fast())
    with open(part_path(dest), "ab") as f:  # the rest, as the killed run had written it
        f.write(DATA[600_000:])
    asked = len(server.requests)
    r = download(server.url("dev.zip"), dest, sha256=SHA, **fast())
    assert len(server.requests) == asked and r.fetched == 0 and r.sha256_checked and dest.read_bytes() == DATA
    assert leftovers(dest) == ["dev.zip"]


def test_too_little_disk_is_said_before_the_body(server, tmp_path):
    server.fault(Fault(announce=10**18))  # a Content-Length no disk holds
    dest = tmp_path / "dev.zip"
    with pytest.raises(NoSpaceError) as e:  # (a size the download takes: past the default ceiling of 100 GB)
        download(server.url("dev.zip"), dest, max_size=10**19, **fast())
    assert e.value.needed == 10**18 and "needed" in str(e.value) and "free" in str(e.value)
    assert not dest.exists() and (not part_path(dest).exists() or part_path(dest).stat().st_size == 0)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_while_writing_says_how_much_is_needed(server, tmp_path):
    dest = tmp_path / "dev.zip"
    part_path(dest).symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    with pytest.raises(NoSpaceError) as e:
        download(server.url("dev.zip"), dest, **fast())
    assert "no space left" in str(e.value) and "2.0 MB more needed" in str(e.value)
    assert e.value.needed == SIZE and not dest.exists()


def test_two_downloads_of_one_file_do_not_interleave(tmp_path):
    with LoopbackFileServer(rate=1_000_000) as server:
        server.add("dev.zip", DATA)
        dest = tmp_path / "dev.zip"
        first = threading.Thread(target=download, args=(server.url("dev.zip"), dest), kwargs=fast())
        first.start()
        while not part_path(dest).exists() or part_path(dest).stat().st_size == 0:
            time.sleep(0.02)
        with pytest.raises(DownloadError) as e:
            download(server.url("dev.zip"), dest, **fast())
        assert "being written by another download" in str(e.value)
        first.join(timeout=60)
        assert dest.read_bytes() == DATA


CHILD = """
import json, sys
from t2sql.download.http import download
r = download(sys.argv[1], sys.argv[2], sha256=sys.argv[3], progress=False)
print(json.dumps({"resumed": r.resumed, "fetched": r.fetched, "size": r.size}))
"""


def child(url: str, dest: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, url, str(dest), SHA], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_download_resumes_in_a_new_process(server, tmp_path, sig):
    dest = tmp_path / "dev.zip"
    server.fault(Fault(rate=500_000))  # 2 MB at 500 kB/s: four seconds to kill it in
    proc = child(server.url("dev.zip"), dest)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (not part_path(dest).exists() or part_path(dest).stat().st_size < 400_000):
        time.sleep(0.02)
    proc.send_signal(sig)  # SIGINT is Ctrl-C: KeyboardInterrupt in the child
    proc.communicate(timeout=30)
    kept = part_path(dest).stat().st_size
    assert proc.returncode != 0 and 400_000 <= kept < SIZE and not dest.exists()
    assert json.loads(sidecar_path(dest).read_text())["size"] == SIZE

    rerun = child(server.url("dev.zip"), dest)
    out, err = rerun.communicate(timeout=60)
    assert rerun.returncode == 0, err
    result = json.loads(out)
    assert result["resumed"] and result["fetched"] < SIZE and result["fetched"] == SIZE - kept
    last = server.requests[-1]
    assert (last.range, last.status, last.sent) == (f"bytes={kept}-", 206, SIZE - kept)
    assert dest.read_bytes() == DATA and leftovers(dest) == ["dev.zip"]


def test_progress_off_a_terminal_is_plain_lines_with_the_resume_said(server, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("T2SQL_PROGRESS_INTERVAL", "0")  # a line at every chunk
    dest = tmp_path / "dev.zip"
    server.fault(Fault(drop_after=SIZE // 2))
    with pytest.raises(DownloadError):
        download(server.url("dev.zip"), dest, retries=0, backoff_s=0)
    download(server.url("dev.zip"), dest, backoff_s=0)
    err = capfd.readouterr().err
    assert "\r" not in err and "dev.zip: resuming at 1.0 MB of 2.0 MB" in err
    assert "dev.zip: 2.0 MB/2.0 MB" in err and "B/s" in err


def test_bench_download_runs_and_reports_both_clients(tmp_path):
    env = child_env()
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "download", "--size-mb", "4", "--repeat", "1",
                           "--extract-mb", "3", "--work-dir", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["bytes"] == 4_000_000 and report["t2sql"]["mb_per_s"] > 0
    extract = report["extract"]  # the second measurement: peak RSS of extract_databases, in its own interpreter
    assert extract["databases"] == 3 and extract["bytes_written"] >= extract["database_bytes"] >= 3_000_000
    assert 0 < extract["baseline_rss_mib"] <= extract["peak_rss_mib"] and extract["target_rss_mib"] == 64
    assert extract["meets_target"] == (extract["peak_rss_mib"] <= 64) and extract["mb_per_s"] > 0
    if shutil.which("curl"):
        assert report["curl"]["mb_per_s"] > 0 and report["ratio"] > 0 and "curl -sS" in report["curl"]["command"]
    else:
        assert report["curl_missing"]
    assert list(tmp_path.iterdir()) == []  # the served file and the copies are gone
    bad = subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "download", "--size-mb", "0"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "--size-mb" in bad.stderr and "Traceback" not in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "t2sql.cli", "bench", "download", "--extract-mb", "-1"],
                         capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and "--extract-mb" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.skipif(not shutil.which("openssl"), reason="makes its test certificate with the openssl command")
def test_https_resumes_too(tmp_path, monkeypatch):
    """BIRD's URLs are https: the TLS stream (under the big-read wrapper) resumes like plain HTTP."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # httpx trusts it, as it would a site's CA
    with LoopbackFileServer(tls=(str(cert), str(key))) as server:
        server.add("dev.zip", DATA)
        server.fault(Fault(drop_after=SIZE // 3))
        dest = tmp_path / "out" / "dev.zip"
        r = download(server.url("dev.zip"), dest, sha256=SHA, **fast())
        assert server.url("dev.zip").startswith("https://") and r.resumed and dest.read_bytes() == DATA
        assert [q.status for q in server.requests] == [200, 206]


def test_the_client_reads_the_socket_in_big_pieces():
    """httpcore's 64 KiB reads cap a fast link at a quarter of curl's rate; if an httpx release moves the
    internals the wrapper hooks into, this says so instead of the downloads quietly slowing down."""
    with transport.make_client(5) as client:
        assert isinstance(client._transport._pool._network_backend, transport._BigReads)
