"""`pip install .` without cargo: one line saying a Rust toolchain is needed and where to get one, before
anything is downloaded (maturin's own backend would fetch rustup and a ~730 MB toolchain, silently)."""

from __future__ import annotations

import http.server
import importlib.util
import os
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import REPO

BACKEND = REPO / "build_backend" / "t2sql_build.py"


def _backend():
    spec = importlib.util.spec_from_file_location("t2sql_build", BACKEND)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Index(http.server.BaseHTTPRequestHandler):
    """A package index on loopback that answers nothing and remembers every request."""

    requests: list[str] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        self.send_error(404)

    def log_message(self, *args):
        pass


def _path_without_cargo() -> str:
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "cargo"))]
    dirs.insert(0, os.path.dirname(sys.executable))
    return os.pathsep.join(dirs)


def test_pip_without_cargo_says_so_in_one_line_and_downloads_nothing(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = _path_without_cargo()
    assert shutil.which("cargo", path=path) is None
    env = {**os.environ, "PATH": path, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_port}/simple", "PIP_FIND_LINKS": "",
           "PIP_NO_INPUT": "1", "CARGO_HOME": str(tmp_path / "no-cargo-home"),
           "RUSTUP_HOME": str(tmp_path / "no-rustup-home")}
    env.pop("MATURIN_NO_INSTALL_RUST", None)
    try:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "-w", str(tmp_path / "w")],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0, said
    assert _backend().NEEDS_RUST in said and said.count("https://rustup.rs") == 1, said
    assert _Index.requests == [], _Index.requests  # not maturin, not puccinialin, not a toolchain
    assert "puccinialin" not in said and "Downloading" not in said and "Collecting" not in said
    assert not (tmp_path / "w").exists() or not any((tmp_path / "w").iterdir())
    assert not (tmp_path / "no-rustup-home").exists() and not (tmp_path / "no-cargo-home").exists()


def test_with_cargo_the_backend_asks_for_maturin_and_hands_over(monkeypatch, capsys):
    backend = _backend()
    assert "maturin" not in backend.__dict__  # maturin is imported only once cargo is found
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/opt/rust/bin/cargo" if name == "cargo" else None)
    for hook in ("get_requires_for_build_wheel", "get_requires_for_build_editable", "get_requires_for_build_sdist"):
        assert getattr(backend, hook)() == [backend.MATURIN]
    monkeypatch.setattr(shutil, "which", lambda *a, **k: None)
    for hook in ("get_requires_for_build_wheel", "get_requires_for_build_sdist"):
        with pytest.raises(SystemExit) as stopped:
            getattr(backend, hook)()
        assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.count(backend.NEEDS_RUST + "\n") == 2 and err.count("\n") == 2
