"""What the framework integrations share, in the main environment (no framework installed): the one-line
FrameworkMissing, the settings from T2SQL_* variables, the dataset rows `t2sql convert --format verl|skyrl`
writes and the integrations read back, and the `t2sql eval` replay the frameworks' tests compare with."""

from __future__ import annotations

import asyncio
import json
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import bird_root, child_env
from eval_replay import comparable, eval_records
from loopback_model import xml_tool_call
from t2sql import integrations
from t2sql.episode.machine import EpisodeResult
from t2sql.episode.metrics import ROLLOUT_LOG_NAMES, record_metrics
from t2sql.episode.presets import OUTCOMES
from t2sql.errors import DataError
from t2sql.integrations import FrameworkMissing, SettingsError, require, rows, settings_from_env


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)


def test_import_t2sql_imports_no_integration():
    done = run_python("import sys, t2sql; print(sorted(m for m in sys.modules if m.startswith('t2sql.integrations')))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_missing_framework_is_one_line_naming_the_extra():
    with pytest.raises(FrameworkMissing) as raised:
        require("t2sql_no_such_framework", framework="NoSuch", extra="nosuch", minimum="1.2")
    assert str(raised.value) == (
        f'{__name__} needs NoSuch >= 1.2 (not installed): in the t2sql checkout, pip install ".[nosuch]"')


def test_run_as_the_program_a_missing_framework_prints_only_its_line():
    done = run_python("from t2sql.integrations import entry_point, require\n"
                      "with entry_point(__name__):\n"
                      "    require('t2sql_no_such_framework', framework='NoSuch', extra='nosuch', minimum='1.2')")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        'error: __main__ needs NoSuch >= 1.2 (not installed): in the t2sql checkout, pip install ".[nosuch]"']


INTEGRATIONS = sorted(m.name for m in pkgutil.iter_modules(integrations.__path__) if m.name != "rows")


@pytest.mark.parametrize("name", INTEGRATIONS)
def test_each_integration_without_its_framework_is_one_line_naming_its_extra(name):
    """Imported: a FrameworkMissing whose message is the line (the importer's traceback ends in it). Run as
    `python -m` (an entrypoint some ship): that single line, exit 1."""
    imported = run_python(f"import t2sql.integrations.{name}")
    if imported.returncode == 0:
        pytest.skip(f"{name}'s framework is installed in this environment")
    wanted = (f"t2sql.integrations.{name} needs ", f'in the t2sql checkout, pip install ".[{name}]"')  # not on PyPI
    last = imported.stderr.splitlines()[-1]
    assert imported.returncode == 1 and last.startswith(f"t2sql.integrations.FrameworkMissing: {wanted[0]}")
    assert last.endswith(wanted[1])
    done = subprocess.run([sys.executable, "-m", f"t2sql.integrations.{name}"], capture_output=True, text=True,
                          env=child_env(), timeout=120)
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: {wanted[0]}") and line.endswith(wanted[1])


def test_a_framework_of_another_version_is_one_line_with_the_version_found():
    with pytest.raises(FrameworkMissing) as raised:
        require("pytest", framework="pytest", extra="test", minimum="1", below="2")
    assert str(raised.value) == (f'{__name__} needs pytest >= 1, < 2 (found {pytest.__version__}): in the t2sql '
                                 'checkout, pip install ".[test]"')


def test_require_returns_the_module_when_the_version_is_in_range():
    module = require("pytest", framework="pytest", extra="test", minimum="7", below="999")
    assert module is pytest
    with pytest.raises(FrameworkMissing) as raised:
        require("pytest", framework="pytest", extra="test", minimum="999")
    assert isinstance(raised.value, ImportError) and "\n" not in str(raised.value)


def _installed(tmp_path: Path, name: str, version: str) -> None:
    """A distribution `name` of `version` (its dist-info and an empty module), importable from tmp_path."""
    (tmp_path / f"{name}.py").write_text("")
    info = tmp_path / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


# Against >= 1.16, < 2 (TRL's range): PEP 440's order. A pre-release or dev build of the minimum comes
# before it, so it is refused (the release numbers alone, as before `packaging`, would let it pass).
VERSIONS = [("1.16.0", True), ("1.16.0+cu121", True), ("1.17.0rc1", True), ("1.99.post1", True),
            ("1.16.0rc1", False), ("1.16.0.dev3", False), ("1.15.9", False), ("2.0.0rc1", False), ("2.0", False)]


@pytest.mark.parametrize("version, accepted", VERSIONS)
def test_a_version_is_checked_as_pep_440_orders_it(tmp_path, monkeypatch, version, accepted):
    name = f"t2sql_fake_fw_{abs(hash(version))}"
    _installed(tmp_path, name, version)
    monkeypatch.syspath_prepend(str(tmp_path))
    if accepted:
        assert require(name, framework="Fake", extra="fake", minimum="1.16", below="2").__name__ == name
    else:
        with pytest.raises(FrameworkMissing, match=rf"needs Fake >= 1.16, < 2 \(found {re.escape(version)}\)"):
            require(name, framework="Fake", extra="fake", minimum="1.16", below="2")


def test_a_framework_missing_changes_nothing_process_wide():
    """Raised (and caught, as a script that falls back would), it leaves sys.excepthook as it was; other
    errors keep their traceback."""
    done = run_python("import sys\nbefore = sys.excepthook\n"
                      "from t2sql.integrations import require, FrameworkMissing\n"
                      "try:\n    require('t2sql_no_such', framework='X', extra='x', minimum='1')\n"
                      "except FrameworkMissing:\n    pass\n"
                      "print(sys.excepthook is before)\n"
                      "raise KeyError('other')")
    assert done.stdout.split() == ["True"]
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError: 'other'" in done.stderr


def test_an_episode_records_numbers_are_one_reading_for_every_adapter():
    """record_metrics: what TRL, SkyRL, verl and miles log of a record, before their own prefix and names."""
    result = EpisodeResult(outcome="incorrect", reward=-0.25, correct=False, solution="SELECT 1", turns=3,
                           tool_calls=2, invalid_tool_calls=1, has_evidence=True, evidence_restated=True,
                           evidence_checked=False, detail="", reward_terms={"invalid_tool_calls": -0.25}, grade=None,
                           metrics={})
    assert record_metrics(result.to_dict()) == {
        "reward": -0.25, "correct": 0.0, "turns": 3.0, "tool_calls": 2.0, "invalid_tool_calls": 1.0,
        **{f"outcome/{o}": float(o == "incorrect") for o in OUTCOMES},
        "reward_terms/invalid_tool_calls": -0.25, "evidence_restated": 1.0, "evidence_checked": 0.0}
    without = record_metrics({**result.to_dict(), "has_evidence": False, "correct": True})
    assert without["correct"] == 1.0 and "evidence_restated" not in without and "evidence_checked" not in without
    assert record_metrics({"outcome": "unsafe", "tool_calls": 4}) == {
        "tool_calls": 4.0, **{f"outcome/{o}": float(o == "unsafe") for o in OUTCOMES}}
    # The names TRL's log and the miles rollout log give them (both under "t2sql/"): dashboards read these.
    assert ROLLOUT_LOG_NAMES == {"correct": "accuracy", "tool_calls": "tool_calls_mean",
                                 "invalid_tool_calls": "invalid_tool_calls_mean", "turns": "turns_mean",
                                 "evidence_restated": "evidence_restated_rate",
                                 "evidence_checked": "evidence_checked_rate"}


def test_settings_from_environment_variables_with_overrides_winning():
    env = {"T2SQL_PRESET": "bare", "T2SQL_DB_ROOT": "/data/bird", "T2SQL_GRADER_CONCURRENCY": "8",
           "T2SQL_TOOL_TIMEOUT_S": "2.5", "T2SQL_CACHE_DIR": ""}
    settings = settings_from_env(env, db_root="/elsewhere", cache_dir=None)
    assert (settings.preset, settings.db_root, settings.concurrency, settings.tool_timeout_s, settings.cache_dir) == (
        "bare", "/elsewhere", 8, 2.5, None)
    assert settings_from_env({}) == type(settings)()
    with pytest.raises(SettingsError, match="T2SQL_GRADER_CONCURRENCY='many'"):
        settings_from_env({"T2SQL_GRADER_CONCURRENCY": "many"})
    with pytest.raises(SettingsError, match="unknown t2sql setting"):
        settings_from_env({}, dbroot="/x")


# Every value a rollout setting may not take, as a T2SQL_* variable gives it: each a one-line SettingsError
# naming the variable (t2sql.episode.rollout.check_setting).
BAD_VARIABLES = [
    ("T2SQL_GRADER_CONCURRENCY", "99999999999", "from 1 to 1024"),
    ("T2SQL_GRADER_CONCURRENCY", "5000", "from 1 to 1024"),
    ("T2SQL_GRADER_CONCURRENCY", "0", "from 1 to 1024"),
    ("T2SQL_GRADER_CONCURRENCY", "2.5", "not a whole number"),
    ("T2SQL_GRADER_CONCURRENCY", "9" * 5000, "not a whole number"),
    ("T2SQL_TOOL_TIMEOUT_S", "inf", "above 0 and at most 3600"),
    ("T2SQL_TOOL_TIMEOUT_S", "1e308", "above 0 and at most 3600"),
    ("T2SQL_TOOL_TIMEOUT_S", "nan", "above 0 and at most 3600"),
    ("T2SQL_TOOL_TIMEOUT_S", "0", "above 0 and at most 3600"),
    ("T2SQL_GRADE_TIMEOUT_S", "-1", "above 0 and at most 3600"),
    ("T2SQL_GRADE_TIMEOUT_S", "soon", "not a number"),
    ("T2SQL_PRESET", "no-such-preset", "unknown preset"),
    ("T2SQL_MANIFEST", "/dev/zero", "is a device, not a regular file"),
    ("T2SQL_MANIFEST", "/no/such/manifest.json", "cannot be read"),
]


@pytest.mark.parametrize("variable,value,says", BAD_VARIABLES, ids=[f"{v}={x[:12]}" for v, x, _ in BAD_VARIABLES])
def test_a_bad_variable_is_one_line_naming_it(variable, value, says):
    with pytest.raises(SettingsError) as raised:
        settings_from_env({variable: value})
    message = str(raised.value)
    assert message.startswith(f"{variable}=") and says in message and "\n" not in message, message


def test_a_manifest_that_is_a_fifo_or_too_large_is_refused_unread(tmp_path):
    """A FIFO blocked the reader forever, /dev/zero filled memory: the setting and Manifest.load (what the
    Grader reads it with) both refuse by the file's stat, and never read past the bound."""
    from t2sql.serving.manifest import MAX_MANIFEST_BYTES, Manifest

    fifo = tmp_path / "manifest.fifo"
    os.mkfifo(fifo)
    large = tmp_path / "large.json"
    with open(large, "wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: no disk spent
    for path, says in ((fifo, "is a FIFO, not a regular file"), (large, "over the"),
                       (Path("/dev/zero"), "is a device")):
        with pytest.raises(SettingsError, match=f"T2SQL_MANIFEST=.*{says}"):
            settings_from_env({"T2SQL_MANIFEST": str(path)})
        with pytest.raises(ValueError, match=says):
            Manifest.load(path)
    with pytest.raises(FileNotFoundError):
        Manifest.load(tmp_path / "missing.json")


BAD_CONFIG = [
    ({"concurrency": "8"}, "t2sql.concurrency='8' must be a whole number from 1 to 1024, not a str"),
    ({"concurrency": True}, "t2sql.concurrency=True must be a whole number from 1 to 1024, not a bool"),
    ({"concurrency": 2000}, "t2sql.concurrency=2000 must be a whole number from 1 to 1024"),
    ({"tool_timeout_s": 0}, "t2sql.tool_timeout_s=0 must be a number of seconds above 0"),
    ({"grade_timeout_s": float("inf")}, "t2sql.grade_timeout_s=inf must be a number of seconds above 0"),
    ({"tool_timeout_s": "10"}, "t2sql.tool_timeout_s='10' must be a number of seconds, not a str"),
    ({"hash_databases": "yes"}, "t2sql.hash_databases='yes' must be true or false"),
    ({"db_root": 3}, "t2sql.db_root=3 must be a path"),
    ({"preset": ""}, "t2sql.preset='' must be a preset's name"),
]


@pytest.mark.parametrize("config,says", BAD_CONFIG, ids=[next(iter(c)) + "=" + repr(next(iter(c.values())))
                                                         for c, _ in BAD_CONFIG])
def test_a_bad_config_value_is_one_line_naming_it(config, says):
    """What verl's `+t2sql.*` block and SkyRL's env_config hand over: typed values, each checked by type and
    range (a str is no number; a timeout of 0 was ignored; a concurrency of "8" was a TypeError)."""
    with pytest.raises(SettingsError) as raised:
        settings_from_env({}, config="t2sql.", **config)
    assert str(raised.value).startswith(says), str(raised.value)


def test_every_reader_of_the_settings_checks_them_the_same_way():
    """RolloutSettings itself (what miles' flags and every integration build) refuses what the variables
    refuse, naming the field; the values kept are normalized (a path as str, a timeout as float)."""
    from t2sql.episode.rollout import RolloutSettings

    with pytest.raises(SettingsError, match="^concurrency=5000 must be"):
        RolloutSettings(concurrency=5000)
    with pytest.raises(SettingsError, match="^tool_timeout_s=1e\\+308 must be"):
        RolloutSettings(tool_timeout_s=1e308)
    settings = RolloutSettings(db_root=Path("databases"), tool_timeout_s=2)
    assert (settings.db_root, settings.tool_timeout_s) == ("databases", 2.0)
    assert settings.resolved_preset().tool.timeout_s == 2.0


@pytest.mark.parametrize("value", ["99999999999", "5000"])
def test_a_huge_concurrency_neither_aborts_nor_starts_threads(value):
    """T2SQL_GRADER_CONCURRENCY=99999999999 aborted the process in the core's thread pool, =5000 started
    5,001 threads: now the process opening its rollout context gets the SettingsError, and no thread."""
    code = ("import os, sys\n"
            "from t2sql.episode import rollout\n"
            "from t2sql.integrations import settings_from_env\n"
            "from t2sql.errors import SettingsError\n"
            "try:\n"
            "    rollout.context(settings_from_env())\n"
            "except SettingsError as e:\n"
            "    print(len(os.listdir('/proc/self/task')), e)\n"
            "    sys.exit(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=child_env(T2SQL_GRADER_CONCURRENCY=value))
    assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
    threads, message = done.stdout.split(" ", 1)
    assert int(threads) < 16 and message.startswith(f"T2SQL_GRADER_CONCURRENCY={value!r} must be")


# ------------------------------------------------------------------------------------ dataset rows


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """BIRD dev converted by the real command (t2sql's own rows), the file every other format starts from."""
    out = tmp_path_factory.mktemp("converted")
    done = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(bird_root() / "dev.json"),
                           "--db-root", str(bird_root()), "--out-dir", str(out), "--no-check-gold"],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return out / "dev.jsonl"


def convert(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", *args], capture_output=True, text=True,
                          env=child_env(), timeout=timeout)


@pytest.mark.parametrize("framework,file_type", [("verl", "parquet"), ("verl", "jsonl"), ("skyrl", "parquet"),
                                                 ("skyrl", "jsonl")])
def test_convert_format_writes_framework_rows_that_carry_the_t2sql_row_whole(converted, tmp_path, framework,
                                                                               file_type):
    done = convert("--rows", str(converted), "--out-dir", str(tmp_path), "--format", framework,
                   "--file-type", file_type)
    assert done.returncode == 0, done.stderr
    path = tmp_path / f"dev.{framework}.{file_type}"
    assert done.stdout.strip().endswith(f"wrote {path}")
    if file_type == "parquet":
        import pyarrow.parquet as pq

        written = pq.read_table(path).to_pylist()
    else:
        written = [json.loads(line) for line in path.read_text().splitlines()]
    original = rows.read_rows(converted)
    assert len(written) == len(original) == 432
    first = written[0]
    if framework == "verl":
        assert first["agent_name"] == rows.AGENT_NAME and first["extra_info"]["index"] == 0
        assert first["reward_model"]["ground_truth"] == original[0]["label"]["gold_sql"]
    else:
        assert first["env_class"] == rows.ENV_CLASS and first["index"] == 0
        assert first["reward_spec"]["ground_truth"] == original[0]["label"]["gold_sql"]
    assert first["prompt"] == original[0]["prompt"]
    assert [rows.t2sql_row(r) for r in written] == original
    assert rows.read_rows(path) == original
    # A rerun replaces the file it wrote; a file it did not write is refused, and left as it was.
    assert convert("--rows", str(converted), "--out-dir", str(tmp_path), "--format", framework,
                   "--file-type", file_type).returncode == 0
    foreign = tmp_path / f"notes.{framework}.{file_type}"
    foreign.write_text("my notes\n")
    refused = convert("--rows", str(converted), "--split-name", "notes", "--out-dir", str(tmp_path),
                      "--format", framework, "--file-type", file_type)
    assert refused.returncode == 2 and "not a split t2sql converted" in refused.stderr
    assert foreign.read_text() == "my notes\n"


def test_convert_questions_straight_to_a_framework_and_back(tmp_path, converted):
    done = convert("--questions", str(bird_root() / "dev.json"), "--db-root", str(bird_root()), "--out-dir",
                   str(tmp_path), "--format", "skyrl", "--no-check-gold")
    assert done.returncode == 0, done.stderr
    assert rows.read_rows(tmp_path / "dev.skyrl.parquet") == rows.read_rows(converted)
    # The framework file reshaped again keeps the split's name (dev, not dev.skyrl).
    again = convert("--rows", str(tmp_path / "dev.skyrl.parquet"), "--out-dir", str(tmp_path), "--format", "verl")
    assert again.returncode == 0, again.stderr
    assert rows.read_rows(tmp_path / "dev.verl.parquet") == rows.read_rows(converted)


def test_convert_refuses_what_cannot_be_written_in_one_line(tmp_path, converted):
    no_root = convert("--questions", str(bird_root() / "dev.json"), "--out-dir", str(tmp_path))
    assert no_root.returncode == 2 and no_root.stderr.strip().endswith("needs --db-root (the directory holding "
                                                                       "<db_id>/<db_id>.sqlite)")
    parquet_for_miles = convert("--rows", str(converted), "--out-dir", str(tmp_path), "--file-type", "parquet")
    assert parquet_for_miles.returncode == 2 and "Traceback" not in parquet_for_miles.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["/dev/null", "../x", "a/b", "..", ".", ""])
def test_convert_split_name_is_one_file_name_inside_out_dir(tmp_path, converted, name):
    """--split-name /dev/null wrote /dev/null.jsonl, ../x wrote beside --out-dir: a name that is not one file
    name is a usage error (exit 2), before anything is read or written."""
    out = tmp_path / "out"
    done = convert("--rows", str(converted), "--split-name", name, "--out-dir", str(out))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"argument --split-name: {name!r} is not a split name" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # ../x went beside --out-dir; /dev/null went to /dev/null.jsonl


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_convert_rows_on_a_fifo_or_device_is_refused_unread(tmp_path, kind):
    """--rows on a FIFO waited forever for a writer; on /dev/zero it would read without end: refused by its
    stat (exit 2), never opened for a blocking read. So is every reader of rows files (rows.read_rows)."""
    if kind == "fifo":
        source = tmp_path / "rows.jsonl"
        os.mkfifo(source)
        says = "is a FIFO, not a regular file"
    else:
        source, says = Path("/dev/zero"), "is a device, not a regular file"
    done = convert("--rows", str(source), "--out-dir", str(tmp_path / "out"), timeout=60)  # a hang fails here
    assert done.returncode == 2 and f"--rows file {source} {says}" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
    with pytest.raises(DataError, match=says):
        rows.read_rows(source)


def test_rows_file_with_bad_lines_names_each_and_writes_nothing(tmp_path, converted):
    lines = converted.read_text().splitlines()[:3]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], "{not json", json.dumps({"prompt": []}), lines[1]]) + "\n")
    done = convert("--rows", str(bad), "--out-dir", str(tmp_path / "out"), "--format", "verl")
    assert done.returncode == 1
    assert "row 2: bad_line" in done.stderr and "row 3: bad_line" in done.stderr
    assert "carries no t2sql task" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()


def test_t2sql_row_says_what_is_missing():
    with pytest.raises(DataError, match="carries no t2sql task"):
        rows.t2sql_row({"prompt": [], "extra_info": {"index": 1}})
    with pytest.raises(DataError, match="not a t2sql row's JSON"):
        rows.t2sql_row("{broken")
    with pytest.raises(DataError, match="JSON but not a t2sql row"):
        rows.t2sql_row(json.dumps({"label": {}, "metadata": {}}))


# ------------------------------------------------------------------------------ the eval replay


def scripted_turns(task) -> dict[str, list]:
    gold = task.gold_sql
    return {
        "correct": [f"<think>look</think>{xml_tool_call(gold)}", f"<solution>{gold}</solution>"],
        "wrong": [xml_tool_call("SELECT 1 +"), "<solution>SELECT 1</solution>"],
        "cut": [xml_tool_call(gold), ("<think>" + "long " * 50, "length")],
    }


def test_eval_replay_gives_the_records_the_episode_gives(bird_rollout, converted, tmp_path):
    """The helper the frameworks' tests compare with: its records are the in-process episode's."""
    original = rows.read_rows(converted)[:3]
    tasks = [bird_rollout.task(r) for r in original]
    plans = {t.question_id: scripted_turns(t) for t in tasks}
    kinds = ["correct", "wrong", "cut"]
    turns = {t.question_id: plans[t.question_id][kind] for t, kind in zip(tasks, kinds)}
    replayed = eval_records(original, turns, preset=bird_rollout.preset.name, tmp_path=tmp_path)

    async def in_process(task, script):
        episode = await bird_rollout.episode_async(task)
        for turn in script:
            text, cut = (turn, None) if isinstance(turn, str) else (turn[0], "turn")
            if (await episode.on_turn(text, cut=cut)).done:
                break
        return episode.result.to_dict()

    for task, kind in zip(tasks, kinds):
        mine = asyncio.run(in_process(task, turns[task.question_id]))
        assert comparable(replayed[task.question_id]) == comparable(mine), kind
    outcomes = [replayed[t.question_id]["outcome"] for t in tasks]
    assert outcomes == ["correct", "incorrect", "turn_cut"]
    # It tells different turns apart: the same task answered wrongly is another record.
    other = asyncio.run(in_process(tasks[0], plans[tasks[0].question_id]["wrong"]))
    assert comparable(other) != comparable(replayed[tasks[0].question_id])


def test_the_episode_loop_is_one_per_process_and_refuses_its_own_thread():
    import threading

    from t2sql.errors import AdapterError
    from t2sql.integrations import on_episode_loop

    async def which_loop():
        return asyncio.get_running_loop(), threading.current_thread()

    seen = []
    workers = [threading.Thread(target=lambda: seen.append(on_episode_loop(which_loop()))) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    loops, threads = {id(loop) for loop, _ in seen}, {t for _, t in seen}
    assert len(seen) == 3 and len(loops) == 1 and len(threads) == 1 and threading.current_thread() not in threads

    async def reenter():
        return on_episode_loop(which_loop())

    with pytest.raises(AdapterError, match="own episode loop"):
        on_episode_loop(reenter())
