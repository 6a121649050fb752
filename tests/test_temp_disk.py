"""Each query's temporary disk is capped (issue 25, part 6): SQLite's sorts, DISTINCT, GROUP BY and temporary
results past the query's max_temp_mb stop it, as pred_error for a prediction, gold_error for a gold and a message the
model can act on for a tool call, and the cap holds while SQLite sorts, long before the deadline. Measured on the red
team's own query (a DISTINCT over a 3-way cross join of superhero, 3.4 GB of spill before its 30 s deadline)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time

import pytest

import t2sql
from conftest import bird_root, tool_limits
from t2sql import Database, GradeSpec, TempDiskExceeded
from t2sql.episode.machine import Episode
from t2sql.episode.presets import get_preset
from t2sql.serving.grader import Grader
from t2sql.tasks import Task, sample_dir

SUPERHERO = str(sample_dir() / "superhero" / "superhero.sqlite")
CROSS = "superhero a, superhero b, superhero c"  # 750^3 = 422M rows
# The red team's query, counted: every distinct row goes into SQLite's temporary b-tree before the count comes out.
RED_TEAM = f"SELECT count(*) FROM (SELECT DISTINCT a.superhero_name, b.full_name, c.id FROM {CROSS})"
# The same rows sorted: SQLite sorts the 562,500 rows of each c.id in turn, about 20 MiB of sorter runs before a
# tool call sees its first row.
RED_TEAM_SORTED = f"SELECT a.superhero_name, b.full_name, c.id FROM {CROSS} ORDER BY 3, 2, 1"
CAP_MB = 8
MIB = 2**20
DEADLINE_S = 60.0  # generous: the cap, not the deadline, must be what stops these queries
NEEDED = f"the query needed more than {CAP_MB} MiB of temporary disk"


def deleted_files_in(pid: int, directory: str) -> int:
    """Bytes the files that process `pid` holds open under `directory` take (SQLite's temporary files are
    unlinked at once, so only /proc sees them)."""
    total = 0
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return 0
    for name in names:
        try:
            target = os.readlink(f"{fds}/{name}")
            if target.startswith(directory):
                total += os.stat(f"{fds}/{name}").st_size
        except OSError:
            continue  # closed meanwhile
    return total


def test_the_red_team_query_stops_at_its_cap_as_a_pred_error(tmp_path):
    """`t2sql grade --max-temp-mb 8` on the red team's query, SQLite's temporary directory pointed at a directory
    of the test's own, watched from outside through /proc while it runs."""
    temp_dir = tmp_path / "sqlite-tmp"
    temp_dir.mkdir()
    env = dict(os.environ, SQLITE_TMPDIR=str(temp_dir))
    command = [sys.executable, "-m", "t2sql.cli", "grade", "--db", SUPERHERO, "--pred", RED_TEAM,
               "--gold", "SELECT count(*) FROM superhero", "--max-temp-mb", str(CAP_MB),
               "--timeout-s", str(DEADLINE_S), "--json"]
    started = time.monotonic()
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    most = 0
    while child.poll() is None and time.monotonic() - started < DEADLINE_S + 30:
        most = max(most, deleted_files_in(child.pid, str(temp_dir)))
        time.sleep(0.005)
    out, err = child.communicate(timeout=30)
    elapsed = time.monotonic() - started
    verdict = json.loads(out)
    assert verdict["outcome"] == "pred_error", (verdict, err)
    assert verdict["detail"].startswith(NEEDED) and "--max-temp-mb" in verdict["detail"], verdict
    assert elapsed < DEADLINE_S / 2, "the deadline stopped it, not the cap"
    assert most <= CAP_MB * MIB, f"{most} bytes of temporary files at once"
    assert os.listdir(temp_dir) == []  # unlinked files: nothing is left behind either


def test_the_cap_holds_in_the_core_counter_and_the_default_runs_further():
    t2sql.temp_usage(reset=True)
    v = t2sql.grade(SUPERHERO, RED_TEAM, "SELECT count(*) FROM superhero", timeout_s=DEADLINE_S, max_temp_mb=CAP_MB)
    now, peak = t2sql.temp_usage()
    assert (v.outcome, v.detail.split(" (")[0]) == ("pred_error", NEEDED)
    assert CAP_MB * MIB // 2 < peak <= CAP_MB * MIB and now == 0, (now, peak)
    # Under the default cap (1 GiB) the same query runs past 8 MiB, to its deadline here.
    t2sql.temp_usage(reset=True)
    v = t2sql.grade(SUPERHERO, RED_TEAM, "SELECT count(*) FROM superhero", timeout_s=4.0)
    assert v.outcome == "pred_timeout" and t2sql.temp_usage()[1] > CAP_MB * MIB


def test_a_gold_past_its_cap_is_a_gold_error_in_the_same_words_through_the_grader():
    spec = GradeSpec("multiset", timeout_s=DEADLINE_S, max_temp_mb=CAP_MB)
    core = Database(SUPERHERO).grade("SELECT 1", RED_TEAM, spec)
    with Grader(concurrency=2) as grader:
        served = grader.grade_sync(SUPERHERO, "SELECT 1", RED_TEAM, spec)
        with pytest.raises(TempDiskExceeded, match=NEEDED):
            grader.run_tool_sync(SUPERHERO, RED_TEAM_SORTED, tool_limits(timeout_s=DEADLINE_S, max_temp_mb=CAP_MB))
    assert core.outcome == served.outcome == "gold_error" and not served.retried
    assert core.detail == served.detail and served.detail.startswith(f"gold query failed: {NEEDED}"), served


def test_a_tool_call_past_its_cap_tells_the_model_to_write_a_cheaper_query():
    row = next(r for r in json.loads((sample_dir() / "dev.json").read_text()) if r["db_id"] == "superhero")
    task = Task.from_row(row, sample_dir())
    preset = get_preset("bare").replace(grading={"max_temp_mb": CAP_MB}, tool={"timeout_s": DEADLINE_S})
    call = ("<tool_call>\n" + json.dumps({"name": "execute_sql_query", "arguments": {"query": RED_TEAM_SORTED}})
            + "\n</tool_call>")
    with Grader(concurrency=1) as grader:
        episode = Episode(task, preset, grader)
        started = time.monotonic()
        outcome = asyncio.run(episode.on_turn(call))
    assert time.monotonic() - started < DEADLINE_S / 2
    (message,) = outcome.tool_messages
    assert not outcome.done
    assert message["content"].startswith(
        f"Error: the query used too much temporary disk (over {CAP_MB} MiB for sorting, DISTINCT, GROUP BY or "
        "intermediate results) and was stopped; write a cheaper query"), message


def test_queries_on_many_workers_are_each_held_to_their_own_cap():
    """Four at once on four workers: the three under the small cap stop, the one under the default cap runs to its
    preview; nothing is held once they are done."""
    small = tool_limits(timeout_s=DEADLINE_S, max_temp_mb=CAP_MB)
    large = tool_limits(timeout_s=DEADLINE_S)

    async def run() -> list:
        with Grader(concurrency=4) as grader:
            calls = [grader.run_tool(SUPERHERO, RED_TEAM_SORTED, limits) for limits in (small, small, small, large)]
            return await asyncio.gather(*calls, return_exceptions=True)

    t2sql.temp_usage(reset=True)
    outcomes = asyncio.run(run())
    assert [type(o) for o in outcomes[:3]] == [TempDiskExceeded] * 3, outcomes
    preview = outcomes[3]
    assert isinstance(preview, t2sql.ToolResult) and preview.row_count_capped, preview
    now, peak = t2sql.temp_usage()
    assert now == 0 and peak > CAP_MB * MIB  # the default-capped one held more than a small cap allows


def test_the_grader_states_its_bound_and_warns_when_the_disk_holds_less(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SQLITE_TMPDIR", str(tmp_path))
    assert t2sql._grader.sqlite_temp_dir() == tmp_path
    caplog.set_level(logging.WARNING, logger="t2sql.serving.temp_disk")
    with Grader(concurrency=3, max_temp_mb=5) as grader:
        assert grader.temp_disk_bound_mb == grader.stats()["temp_disk_bound_mb"] == 15
    assert caplog.records == []  # 15 MiB fit
    huge = 2**40  # MiB: no disk has this much free
    with Grader(concurrency=3, max_temp_mb=huge) as grader:
        assert grader.stats()["temp_disk_bound_mb"] == 3 * huge
    (record,) = caplog.records
    text = record.getMessage()
    assert "\n" not in text and text.startswith(f"temporary disk: {tmp_path} has ")
    assert f"below the {3 * huge} MiB that 3 queries of up to {huge} MiB each (max_temp_mb)" in text


def test_every_bird_gold_runs_under_the_default_cap():
    """The 432 BIRD dev golds of tests/data/bird, digested and previewed under the default cap: none fails on it,
    and the most temporary disk any held at once stays far below it."""
    bird = bird_root()
    questions = json.loads((bird / "dev.json").read_text())
    databases = {d: Database(str(bird / d / f"{d}.sqlite")) for d in {q["db_id"] for q in questions}}
    cap = t2sql._grader.GRADE_DEFAULTS["max_temp_mb"] * MIB
    most = 0
    for q in questions:
        db = databases[q["db_id"]]
        t2sql.temp_usage(reset=True)
        db.digest(q["SQL"], GradeSpec("set", timeout_s=30))
        db.run_tool(q["SQL"], tool_limits(timeout_s=30))
        most = max(most, t2sql.temp_usage()[1])
    assert most < cap // 64, most  # today none of them writes a temporary file at all
