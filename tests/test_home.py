"""Where t2sql writes when no flag says where (t2sql.home, the one rule): every default folder under
$T2SQL_HOME when it is set (eval results, the equivalence cache, bench work, t2sql-train's output with its gold
cache and the curriculum's state), else the platform's places; a run with it set writes nothing elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from t2sql import home
from t2sql.commands.eval import default_out
from t2sql.equivalence import diskcache
from t2sql.miles.flags import TrainConfig

TRAIN = ["-c", "import sys; from t2sql.miles.train import main; sys.exit(main())"]


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No T2SQL_HOME, a HOME of the test's own, no XDG folders: each kind's platform place is under it."""
    for name in ("T2SQL_HOME", "T2SQL_EQUIVALENCE_CACHE", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    return tmp_path


def test_with_t2sql_home_every_default_folder_is_under_it(clean_env, monkeypatch):
    root = clean_env / "home"
    monkeypatch.setenv("T2SQL_HOME", str(root))
    places = {kind: home.default_dir(kind) for kind in home.KINDS}
    assert places == {"eval": root / "eval", "equivalence": root / "cache" / "equivalence",
                      "bench-grader": root / "bench" / "grader", "bench-pairs": root / "bench" / "pairs",
                      "bench-download": root / "bench" / "download",
                      "bench-equivalence-guard": root / "bench" / "equivalence-guard",
                      "bench-equivalence-scale": root / "bench" / "equivalence-scale", "train": root / "train"}
    # Each owner reads the rule: the eval results, the equivalence cache, t2sql-train's output (gold cache and
    # checkpoints, where the curriculum keeps its state, are folders of it).
    assert Path(default_out("oracle", "bare", Path("x/dev.json"), "0" * 64)).parent == root / "eval"
    assert diskcache.cache_dir() == root / "cache" / "equivalence"
    config = TrainConfig(run_id="r")
    assert config.root == root / "train" and config.cache_dir == root / "train" / "gold_cache"
    assert config.save_dir == root / "train" / "checkpoints" / "r"
    # A more specific variable still wins.
    monkeypatch.setenv("T2SQL_EQUIVALENCE_CACHE", str(clean_env / "eq"))
    assert diskcache.cache_dir() == clean_env / "eq"


def test_without_it_each_kind_goes_to_its_platform_place(clean_env, monkeypatch):
    user = clean_env / "user"
    assert home.default_dir("eval") == user / ".local" / "share" / "t2sql" / "eval"
    assert diskcache.cache_dir() == user / ".cache" / "t2sql" / "equivalence"
    assert home.default_dir("bench-grader") == Path(tempfile.gettempdir()) / "t2sql-bench"
    assert TrainConfig(run_id="r").output_dir == str(user / "t2sql")  # /root/t2sql in miles' image
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "xdg-cache"))
    assert diskcache.cache_dir() == clean_env / "xdg-cache" / "t2sql" / "equivalence"
    monkeypatch.setenv("T2SQL_HOME", "")  # empty is unset
    assert home.home() is None
    assert home.describe_default_dir("eval") == "$T2SQL_HOME/eval, else ~/.local/share/t2sql/eval"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("T2SQL_EQUIVALENCE_CACHE", "XDG_DATA_HOME", "XDG_CACHE_HOME")}
    return {**env, "HOME": str(tmp_path / "user"), "T2SQL_HOME": str(tmp_path / "home"),
            "T2SQL_PROGRESS_INTERVAL": "0", **extra}


def test_runs_with_t2sql_home_write_nothing_outside_it(tmp_path):
    """eval (with the recipe's equivalence check, which keeps a cache), bench grader and train's dry run, each
    with no folder flag: all of it lands under $T2SQL_HOME, nothing in the user's home or the cwd."""
    (tmp_path / "user").mkdir()
    (tmp_path / "cwd").mkdir()
    env = _env(tmp_path)
    run = lambda *args: subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300,  # noqa: E731
                                       cwd=tmp_path / "cwd", env=env)
    ev = run("-m", "t2sql.cli", "eval", "--policy", "oracle", "--limit", "5", "--json")
    assert ev.returncode == 0, ev.stderr
    root = tmp_path / "home"
    assert Path(json.loads(ev.stdout)["out"]).parent == root / "eval"
    assert any((root / "cache" / "equivalence").rglob("*")), "the equivalence check kept nothing"
    bench = run("-m", "t2sql.cli", "bench", "grader", "--rows", "2000", "--repeat", "1", "--skip",
                "python_counter,bird_python,sqlite_except,sqlite_vm_sum,t2sql_list", "--json")
    assert bench.returncode == 0, bench.stderr
    assert (root / "bench" / "grader" / "bench_2000.sqlite").is_file()
    dry = run(*TRAIN, "train", "--dry-run", "--run-id", "r", "--miles-path", "/m", "--megatron-path", "/g")
    assert dry.returncode == 0, dry.stderr
    assert f"{root / 'train' / 'checkpoints' / 'r'}" in dry.stdout
    assert str(tmp_path / "user" / "t2sql") not in dry.stdout
    assert list((tmp_path / "user").iterdir()) == [] and list((tmp_path / "cwd").iterdir()) == []
