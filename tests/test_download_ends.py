"""Downloads end: t2sql.download.http against loopback servers that misbehave the same way at every request
(tests/loopback_http.py, `server.always`). Each case ends with a typed error that says what happened and what
to do, within a bounded number of requests; a `.part` is kept only when a rerun really resumes it.

The pytest timeout is what an endless loop meets here: a download that does not end fails its test."""

from __future__ import annotations

import hashlib
import os

import pytest

from loopback_http import Fault, LoopbackFileServer
from t2sql.download.http import download, part_path, sidecar_path
from t2sql.errors import DownloadError, DownloadStalled, NoSpaceError

pytestmark = pytest.mark.timeout(30)

SIZE = 2_000_000
DATA = hashlib.sha256(b"seed").digest() * (SIZE // 32)
RETRIES = 3
# The settings as users set them (docs/training.md)
MIN_RATE_ENV, GRACE_ENV = "T2SQL_DOWNLOAD_MIN_RATE", "T2SQL_DOWNLOAD_GRACE_S"


@pytest.fixture
def server():
    with LoopbackFileServer() as s:
        s.add("dev.zip", DATA)
        yield s


def fast(**kw):
    return {"progress": False, "backoff_s": 0.0, "retries": RETRIES, **kw}


def leftovers(dest) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir())


def assert_nothing_kept(dest, message: str) -> None:
    """The partial file is gone and the message does not promise a resume that a rerun would not do."""
    assert leftovers(dest) == [], leftovers(dest)
    assert "resumes" not in message and "deleted" in message, message
    assert "\n" not in message and "--bird-url" in message


def test_a_server_that_ignores_range_and_drops_gives_up_within_the_retries(server, tmp_path, capfd):
    server.always(Fault(drop_after=500_000, ignore_range=True))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, **fast(progress=True))
    message = str(e.value)
    notes = capfd.readouterr().err  # each restart is said as it happens
    assert notes.count("dev.zip: the server ignored the Range request (same ETag): starting again from zero") \
        == RETRIES, notes
    # the first try (cut), then RETRIES more, each a restart from zero: a failed try, though it brought bytes
    assert len(server.requests) == RETRIES + 1
    assert all(r.status == 200 for r in server.requests) and all(r.range for r in server.requests[1:])
    assert "does not resume" in message and "answered a Range request with the whole file" in message, message
    assert "500.0 kB" in message and f"{RETRIES + 1} tries" in message
    assert_nothing_kept(dest, message)


def test_a_server_whose_etag_changes_at_every_request_gives_up(server, tmp_path):
    server.always(Fault(drop_after=500_000, flip_etag=True))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, **fast())
    message = str(e.value)
    assert len(server.requests) == RETRIES + 1
    assert "answered a Range request with another ETag" in message, message
    assert_nothing_kept(dest, message)


def test_a_server_with_a_wrong_content_range_gives_up(server, tmp_path):
    server.always(Fault(drop_after=500_000, bad_content_range=True))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, **fast())
    message = str(e.value)
    # each cut try is followed by a 206 that names the wrong bytes (a restart, counted): two requests a round
    assert len(server.requests) <= 2 * (RETRIES + 1)
    assert [r.status for r in server.requests[:2]] == [200, 206]
    assert "Content-Range" in message and "bytes 0-1499999/2000000" in message and "500.0 kB of 2.0 MB" in message
    assert_nothing_kept(dest, message)


def test_a_content_length_1000_bytes_high_is_said_after_two_requests(server, tmp_path):
    server.always(Fault(announce=SIZE + 1000))  # the whole file, then a close 1,000 bytes short of the promise
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, **fast())
    message = str(e.value)
    first, second = server.requests
    assert (first.status, first.sent) == (200, SIZE) and (second.range, second.status) == (f"bytes={SIZE}-", 416)
    assert f"announced {SIZE + 1000:,} bytes" in message and f"has {SIZE:,}" in message, message
    assert_nothing_kept(dest, message)


def test_a_drip_under_the_floor_rate_stops_after_the_grace(tmp_path, monkeypatch):
    """1 byte a second: the stall timeout never fires; the floor rate (set by the environment, as prepare's
    users set it) does, and the bytes that came are kept for a rerun, which resumes them."""
    monkeypatch.setenv(MIN_RATE_ENV, "100000")
    monkeypatch.setenv(GRACE_ENV, "1")
    with LoopbackFileServer() as server:
        server.add("dev.zip", DATA)
        server.fault(Fault(rate=20))
        dest = tmp_path / "dev.zip"
        with pytest.raises(DownloadStalled) as e:
            download(server.url("dev.zip"), dest, **fast())
        message = str(e.value)
        assert len(server.requests) == 1
        assert "too slow" in message and "100.0 kB/s" in message and MIN_RATE_ENV in message, message
        kept = part_path(dest).stat().st_size
        assert 0 < kept < 1000 and f"kept in {part_path(dest).name}: a rerun resumes" in message, message
        monkeypatch.delenv(MIN_RATE_ENV)
        r = download(server.url("dev.zip"), dest, **fast())
        assert r.resumed and r.fetched == SIZE - kept and dest.read_bytes() == DATA
        assert server.requests[-1].range == f"bytes={kept}-"


def test_the_deadline_scales_with_the_size_and_ends_a_download_that_keeps_restarting(tmp_path):
    """Fast enough for the floor at every moment, never done: the whole file is due grace + size / floor."""
    with LoopbackFileServer() as server:
        server.add("dev.zip", DATA)
        server.always(Fault(drop_after=SIZE - 100_000, ignore_range=True, rate=4_000_000))
        dest = tmp_path / "dev.zip"
        with pytest.raises(DownloadStalled) as e:  # the floor is a tenth of the rate: only the deadline is met
            download(server.url("dev.zip"), dest, **fast(retries=1000, min_rate=400_000, grace_s=0.5))
        message = str(e.value)
        assert "not done within 5.5 s" in message and "2.0 MB" in message and "400.0 kB/s" in message, message
        assert 2 <= len(server.requests) < 30


def test_an_endless_body_without_a_size_stops_at_the_expected_size(server, tmp_path):
    server.always(Fault(endless=True, rate=5_000_000))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, expected_size=SIZE, **fast())
    message = str(e.value)
    assert f"more than {SIZE:,} bytes" in message and "without announcing" in message, message
    assert server.requests[0].sent < SIZE + 3_000_000
    assert_nothing_kept(dest, message)


def test_an_endless_body_stops_at_the_ceiling_when_no_size_is_expected(server, tmp_path):
    server.always(Fault(endless=True))
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, max_size=3_000_000, **fast())
    assert "more than 3,000,000 bytes" in str(e.value)
    assert_nothing_kept(dest, str(e.value))


def test_an_announced_size_over_the_ceiling_stops_before_the_body(server, tmp_path):
    dest = tmp_path / "dev.zip"
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), dest, max_size=SIZE - 1, **fast())
    assert f"announces {SIZE:,} bytes" in str(e.value) and f"{SIZE - 1:,}" in str(e.value)
    assert leftovers(dest) == [] and len(server.requests) == 1


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_without_a_size_does_not_promise_a_resume(server, tmp_path):
    server.always(Fault(endless=True))
    dest = tmp_path / "dev.zip"
    part_path(dest).symlink_to("/dev/full")  # every write fails with ENOSPC, as on a full disk
    with pytest.raises(NoSpaceError) as e:
        download(server.url("dev.zip"), dest, expected_size=SIZE, **fast())
    message = str(e.value)
    assert "announced no size" in message and "2.0 MB more needed" in message, message
    assert "resumes" not in message and leftovers(dest) == []


def test_a_server_without_validators_restarts_a_cut_download_from_zero(tmp_path):
    """No ETag, no Last-Modified: a Range cannot be guarded, so a cut try starts again from zero, and says so."""
    with LoopbackFileServer() as server:
        server.add("dev.zip", DATA, etag=None, last_modified=None)
        server.fault(Fault(drop_after=500_000))
        dest = tmp_path / "dev.zip"
        r = download(server.url("dev.zip"), dest, **fast())
        assert dest.read_bytes() == DATA and r.restarted and not r.resumed
        assert [q.range for q in server.requests] == [None, None]

        server.always(Fault(drop_after=500_000))
        dest.unlink()
        with pytest.raises(DownloadError) as e:
            download(server.url("dev.zip"), dest, **fast())
        message = str(e.value)
        assert "neither an ETag nor a Last-Modified date" in message and len(server.requests) == 2 + RETRIES + 1
        assert_nothing_kept(dest, message)


def test_a_server_that_resumes_keeps_going_through_many_cuts(server, tmp_path):
    """The budget counts tries that take the file no further: cuts that each bring new bytes are not spent."""
    server.fault(*[Fault(drop_after=150_000)] * 12)
    dest = tmp_path / "dev.zip"
    r = download(server.url("dev.zip"), dest, **fast())
    assert dest.read_bytes() == DATA and r.resumed and len(server.requests) == 13
    assert not sidecar_path(dest).exists()


@pytest.mark.parametrize("value", ["fast", "0", "-5", "nan", "inf"])
def test_a_bad_limit_setting_is_a_typed_error_naming_it(server, tmp_path, monkeypatch, value):
    monkeypatch.setenv(MIN_RATE_ENV, value)
    with pytest.raises(DownloadError) as e:
        download(server.url("dev.zip"), tmp_path / "dev.zip", **fast())
    assert MIN_RATE_ENV in str(e.value) and repr(value) in str(e.value) and server.requests == []
