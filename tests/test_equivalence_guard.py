"""The equivalence check inside the guard, and a reward that never raises (issue 35, items 1-4).

Each trigger the issue found is a small database or a prediction built here: the check ends with a
report (refuted with a witness, or not refuted with a typed skipped reason) and never with an exception;
a readable database is used minus its odd part; cache files are used only for the very same content and
only when they read back whole; a query whose result changes from run to run is never refuted for it;
every query the check runs stays under its one deadline, its Cancel and the temporary-disk cap."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
import tracemalloc

import pytest

import t2sql
from conftest import bird_root, tool_limits
from t2sql import GradeSpec
from t2sql.episode.presets import get_preset
from t2sql.equivalence import check as machinery
from t2sql.equivalence import querytext
from t2sql.equivalence.diskcache import DiskCache, database_key
from t2sql.equivalence.invariant_store import InvariantStore
from t2sql.equivalence.job import check_on
from t2sql.equivalence.mine_ahead import mine_ahead

BIRD = bird_root()
SUPERHERO = str(BIRD / "superhero" / "superhero.sqlite")
CONFIG = machinery.EquivalenceConfig.from_preset(get_preset("qwen3.6-35b-a3b"))


def config(budget_s: float = CONFIG.budget_s, *, max_temp_mb: int | None = None) -> machinery.EquivalenceConfig:
    spec = CONFIG.spec
    if max_temp_mb is not None:
        spec = GradeSpec(spec.method, float_digits=spec.float_digits, column_order=spec.column_order,
                         timeout_s=spec.timeout_s, max_temp_mb=max_temp_mb)
    return machinery.EquivalenceConfig(CONFIG.suite_size, CONFIG.seed, budget_s, spec)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Invariants and suites go to this test's own folder, never the user's cache."""
    monkeypatch.setenv("T2SQL_EQUIVALENCE_CACHE", str(tmp_path / "default-cache"))


@pytest.fixture()
def checker(tmp_path):
    with machinery.EquivalenceChecker(disk=DiskCache(tmp_path / "cache")) as c:
        yield c


def make_db(path, script: str, rows: dict[str, list[tuple]] | None = None, *, ignore_checks: bool = False) -> str:
    """A database file: `script`'s schema, then `rows` per table (CHECK constraints off with
    `ignore_checks`, as a file written by another tool may be)."""
    conn = sqlite3.connect(path)
    conn.executescript(script)
    if ignore_checks:
        conn.execute("PRAGMA ignore_check_constraints = 1")
    for table, values in (rows or {}).items():
        marks = ", ".join("?" * len(values[0]))
        conn.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    conn.commit()
    conn.close()
    return str(path)


NAMES = ["ANN", "BOB", "CY", "DEE", "EVE", "FAY", "GUS", "HAL"]
PEOPLE = [(i, name, 20 + i % 30) for i, name in enumerate(NAMES * 4, 1)]


def assert_a_verdict(report: machinery.EquivalenceReport) -> None:
    """A report the reward can use: refuted with a witness, or a typed reason; never the check's own failure."""
    assert report.skipped_reason in (None, *machinery.SKIP_REASONS)
    assert report.skipped_reason != "check_error", report.detail
    assert report.refuted == (report.witness is not None)
    assert report.refuted or report.checked or report.skipped_reason


# -- constraints the small databases break


def test_a_check_constraint_a_small_database_breaks_skips_that_database_only(tmp_path, checker):
    path = make_db(tmp_path / "people.sqlite", "CREATE TABLE person (id INTEGER PRIMARY KEY, "
                   "name TEXT NOT NULL CHECK (name = upper(name)), age INTEGER)", {"person": PEOPLE})
    # 'ANN' in another case breaks the CHECK: those small databases are refused, the rest tell.
    gold = "SELECT count(*) FROM person WHERE name = 'ANN'"
    report = checker.check_sync(path, "SELECT count(*) FROM person WHERE name LIKE 'ann'", gold, CONFIG)
    assert_a_verdict(report)
    assert report.refused > 0 and report.informative > 0
    assert not checker.check_sync(path, gold, gold, CONFIG).refuted


def test_every_small_database_refused_is_skipped_as_constraint(tmp_path, checker):
    # Rows written with CHECK constraints off: every small database holding them is refused by the core.
    path = make_db(tmp_path / "broken.sqlite", "CREATE TABLE person (id INTEGER PRIMARY KEY, "
                   "name TEXT CHECK (length(name) > 5), age INTEGER)", {"person": PEOPLE}, ignore_checks=True)
    report = checker.check_sync(path, "SELECT count(*) FROM person WHERE age > 30",
                                "SELECT count(*) FROM person WHERE age >= 31", CONFIG)
    assert_a_verdict(report)
    assert report.skipped_reason == "constraint" and report.refused > 0 and not report.refuted


@pytest.mark.parametrize("schema", [
    "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, age INTEGER); "
    "CREATE UNIQUE INDEX person_initial ON person (substr(name, 1, 1))",
], ids=["unique_expression_index"])
def test_a_unique_rule_the_values_cannot_show_refuses_the_database_not_the_check(tmp_path, checker, schema):
    names = ["Ann", "bob", "Cy", "dee", "Eve", "fay", "Gus", "hal", "Ida", "jo"]
    path = make_db(tmp_path / "people.sqlite", schema, {"person": [(i, n, 20 + i) for i, n in enumerate(names, 1)]})
    gold = "SELECT age FROM person WHERE name = 'Ann'"
    report = checker.check_sync(path, "SELECT age FROM person WHERE name LIKE '%Ann%'", gold, CONFIG)
    assert_a_verdict(report)
    assert report.refused > 0  # a row 'Ann Gus' beside 'Ann': distinct values, yet one initial under the rule
    assert not checker.check_sync(path, gold, gold, CONFIG).refuted


@pytest.mark.parametrize("schema", [
    "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT UNIQUE COLLATE NOCASE, age INTEGER)",
    "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, age INTEGER); "
    "CREATE UNIQUE INDEX person_lower ON person (lower(name))",
], ids=["unique_nocase", "unique_lower_index"])
def test_unique_names_apart_in_case_stay_so(tmp_path, checker, schema):
    # Unique names the real data keeps apart in letter case are never given a twin in another case (what
    # such a rule would refuse anyway): a right answer that compares the name in any case stands.
    names = ["Ann", "bob", "Cy", "dee", "Eve", "fay", "Gus", "hal", "Ida", "jo"]
    path = make_db(tmp_path / "people.sqlite", schema, {"person": [(i, n, 20 + i) for i, n in enumerate(names, 1)]})
    gold = "SELECT age FROM person WHERE name = 'Ann'"
    report = checker.check_sync(path, "SELECT age FROM person WHERE lower(name) = 'ann'", gold, CONFIG)
    assert_a_verdict(report)
    assert report.checked and not report.refuted


# -- predictions the text reader cannot read, or the guard refuses


@pytest.mark.parametrize("pred, reason", [
    ("WITH x AS (SELECT 1) VALUES (3)", None),  # a query the text reader cannot read: checked all the same
    ("", "unsupported_query"),
    ("DROP TABLE superhero", "unsupported_query"),
    ("SELEC count(*) FROM superhero", "unsupported_query"),
    ("SELECT 1 -- " + "x" * 3_000_000, "unsupported_query"),
    ("SELECT id FROM superhero WHERE id = 99999999999999999999", None),  # above 2^63: a REAL to SQLite
    ("SELECT id FROM superhero WHERE id = " + "7" * 5000, None),  # past Python's int() digits
    ("SELECT id FROM superhero WHERE id IN (1, " + "9" * 4400 + ") ORDER BY id LIMIT " + "9" * 4400, None),
], ids=["with_values", "empty", "drop", "typo", "3MB", "above_2_63", "5000_digits", "huge_limit"])
def test_any_prediction_ends_with_a_verdict(checker, pred, reason):
    gold = "SELECT id FROM superhero WHERE id = 3"
    started = time.monotonic()
    report = checker.check_sync(SUPERHERO, pred, gold, CONFIG)
    assert_a_verdict(report)
    assert report.skipped_reason == reason or (reason is None and report.skipped_reason != "unsupported_query")
    assert time.monotonic() - started < CONFIG.budget_s + 5


def test_a_literal_above_2_63_matching_the_gold_is_checked():
    lit = "9223372036854775808"  # 2^63: SQLite reads it as REAL 9.223372036854775808e18
    with machinery.EquivalenceChecker() as c:
        report = c.check_sync(SUPERHERO, f"SELECT count(*) FROM superhero WHERE weight_kg < {lit}",
                              "SELECT count(*) FROM superhero WHERE weight_kg < 1e30", CONFIG)
    assert_a_verdict(report)
    assert report.checked


# -- odd parts of a readable database are left out, the rest used


def test_a_foreign_key_naming_a_missing_column_is_left_out_and_later_checks_still_work(tmp_path):
    path = make_db(tmp_path / "club.sqlite", """
        CREATE TABLE team (id INTEGER PRIMARY KEY, name TEXT);
        CREATE TABLE member (id INTEGER PRIMARY KEY, team_id INTEGER REFERENCES team (nope), name TEXT);""",
                   {"team": [(i, f"t{i}") for i in range(1, 6)],
                    "member": [(i, 1 + i % 5, f"m{i}") for i in range(1, 30)]})
    gold = "SELECT name FROM member WHERE team_id = 2"
    for _ in range(2):  # the second check reads the invariants back from the cache
        with machinery.EquivalenceChecker(disk=DiskCache(tmp_path / "cache")) as c:
            report = c.check_sync(path, "SELECT DISTINCT name FROM member WHERE team_id = 2", gold, CONFIG)
            inv = c.invariants.get(path)
        assert_a_verdict(report)
        assert report.checked, report.detail
        assert [(kind, why.split(",")[0]) for kind, _, why in inv.left_out] == [
            ("reference", "it names team.nope")]


def test_a_table_of_300_columns_is_mined_whole(tmp_path, checker):
    wide = ", ".join(f"c{i} INTEGER" for i in range(300))
    path = make_db(tmp_path / "wide.sqlite", f"CREATE TABLE wide (id INTEGER PRIMARY KEY, {wide}); "
                                             "CREATE TABLE other (id INTEGER PRIMARY KEY, v TEXT)",
                   {"wide": [(r, *[r * i for i in range(300)]) for r in range(1, 20)],
                    "other": [(1, "a"), (2, "b")]})
    inv = checker.invariants.get(path)
    assert all(c.mined for c in inv.table("wide").columns) and len(inv.table("wide").columns) == 301
    report = checker.check_sync(path, "SELECT c299 FROM wide WHERE id < 5", "SELECT c299 FROM wide WHERE id <= 4",
                                CONFIG)
    assert_a_verdict(report)
    assert report.checked


def test_a_virtual_table_is_left_out_and_a_query_reading_it_skipped(tmp_path, checker):
    path = make_db(tmp_path / "fts.sqlite", "CREATE TABLE doc (id INTEGER PRIMARY KEY, body TEXT); "
                   "CREATE VIRTUAL TABLE doc_index USING fts5(body)",
                   {"doc": [(i, f"text {i}") for i in range(1, 10)]})
    inv = checker.invariants.get(path)
    assert ("table", "doc_index", "a virtual table") in inv.left_out
    plain = checker.check_sync(path, "SELECT body FROM doc WHERE id < 3", "SELECT body FROM doc WHERE id <= 2",
                               CONFIG)
    assert plain.checked
    reading = checker.check_sync(path, "SELECT count(*) FROM doc_index", "SELECT count(*) FROM doc", CONFIG)
    assert reading.skipped_reason == "unsupported_schema" and "doc_index" in reading.detail


# -- caches that cannot lie


def _key_file(cache, path: str, kind: str) -> os.PathLike:
    key = database_key(path)
    return next(cache.glob(f"{key}.{kind}*.json"))


@pytest.mark.parametrize("damage", ["truncated", "wrong_types", "deep", "foreign", "not_an_object"])
def test_a_malformed_or_foreign_cache_entry_is_built_again(tmp_path, damage):
    cache = tmp_path / "cache"
    gold = "SELECT count(*) FROM superhero WHERE height_cm > 200"
    pred = "SELECT count(id) FROM superhero WHERE height_cm > 200"
    with machinery.EquivalenceChecker(disk=DiskCache(cache)) as c:
        first = c.check_sync(SUPERHERO, pred, gold, CONFIG)
    entries = [_key_file(cache, SUPERHERO, "invariants"), _key_file(cache, SUPERHERO, "suite")]
    good = [json.loads(e.read_text()) for e in entries]
    for entry, data in zip(entries, good):
        text = json.dumps(data)
        if damage == "truncated":
            entry.write_text(text[: len(text) // 2])
        elif damage == "wrong_types":
            data = json.loads(text)  # a copy: `good` stays what was written
            if "tables" in data:
                data["tables"][0]["columns"][0]["unique"] = "yes"
                data["tables"][1]["keys"] = "id"
            else:
                data["suite"][0]["rows"] = {"superhero": [[1, 2]]}
            entry.write_text(json.dumps(data))
        elif damage == "deep":
            entry.write_text('{"version": 4, "tables": ' + "[" * 200_000 + "]" * 200_000 + "}")
        elif damage == "foreign":
            entry.write_text(json.dumps({**data, "database": "another-" + data["database"]}))
        else:
            entry.write_text("[1, 2, 3]")
    with machinery.EquivalenceChecker(disk=DiskCache(cache)) as c:
        again = c.check_sync(SUPERHERO, pred, gold, CONFIG)
    assert_a_verdict(again)
    assert (again.checked, again.refuted, again.databases) == (first.checked, first.refuted, first.databases)
    def same(entry: dict) -> dict:
        return {k: v for k, v in entry.items() if k != "mine_s"}  # the seconds mining took differ

    assert [same(json.loads(e.read_text())) for e in entries] == [same(g) for g in good]  # built again, whole


def test_another_database_of_the_same_name_size_header_and_mtime_is_mined_afresh(tmp_path):
    """Archives keep 1-second mtimes: two files that agree in all but content get their own invariants."""
    schema = "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT)"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = make_db(tmp_path / "a" / "club.sqlite", schema, {"person": [(1, "ann"), (2, "bob"), (3, "cy")]})
    b = make_db(tmp_path / "b" / "club.sqlite", schema, {"person": [(1, "ann"), (2, "ann"), (3, "cy")]})
    stamp = 1_700_000_000
    os.utime(a, (stamp, stamp))
    os.utime(b, (stamp, stamp))
    assert os.path.getsize(a) == os.path.getsize(b) and open(a, "rb").read(100) == open(b, "rb").read(100)
    store = InvariantStore(DiskCache(tmp_path / "cache"))
    assert store.get(a).table("person").column("name").unique  # no name repeats in a ...
    assert not store.get(b).table("person").column("name").unique  # ... 'ann' twice in b
    assert database_key(a) != database_key(b)


def test_caches_keyed_by_prediction_text_are_bounded_in_bytes(monkeypatch):
    """100 distinct predictions of ~89 KB each: the text reader's cache holds its byte bound, not 100 entries
    of megabytes."""
    bound = 4 * 1024 * 1024
    monkeypatch.setattr(querytext, "_read", querytext.Lru(4096, bound, querytext._read._size_of))
    body = " OR ".join(f"superhero_name = 'name {i}'" for i in range(3000))
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for n in range(100):
            assert querytext.read(f"SELECT id FROM superhero WHERE id = {n} AND ({body})") is not None
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert len(body) > 80_000
    assert held < 2 * bound, f"{held / 2**20:.1f} MiB held"


# -- nondeterminism is not a refutation


@pytest.mark.parametrize("query", [
    "SELECT count(*) FROM superhero WHERE abs(random()) % 2 = 0",  # refuted 3 times in 3 before the fix
    "SELECT id FROM superhero WHERE id < 10 AND abs(random()) % 3 = 0",
    "SELECT superhero_name FROM superhero ORDER BY random() LIMIT 1",
    "SELECT count(*) FROM superhero WHERE julianday('now') - julianday('2000-01-01') > id",
])
def test_a_random_or_clock_gold_is_never_refuted_against_itself(checker, query):
    for _ in range(3):
        report = checker.check_sync(SUPERHERO, query, query, CONFIG)
        assert not report.refuted, report.witness and report.witness.to_text()
        assert report.skipped_reason == "nondeterministic"


def test_a_view_of_random_rows_is_nondeterministic_too(tmp_path, checker):
    path = make_db(tmp_path / "view.sqlite", "CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, age INTEGER); "
                   "CREATE VIEW someone AS SELECT name FROM person ORDER BY random() LIMIT 1", {"person": PEOPLE})
    report = checker.check_sync(path, "SELECT name FROM someone", "SELECT name FROM someone", CONFIG)
    assert report.skipped_reason == "nondeterministic" and "someone" in report.detail


def test_a_result_that_changes_when_run_again_is_no_refutation(checker):
    """The second line, for what the text does not show: both queries run again on the database that
    would refute, and a result that changed makes it uncertain."""
    from t2sql.equivalence.refutation import NONDETERMINISTIC, Trial, refutes

    gold = "SELECT superhero_name FROM superhero WHERE id = 1"
    inv = checker.invariants.get(SUPERHERO)
    case = checker.gold_case(SUPERHERO, inv, checker.real_rows(SUPERHERO, inv), gold, CONFIG)
    prepared = case.prepared[0]
    assert Trial(prepared, gold, gold).repeatable() is True
    changing = "SELECT hex(randomblob(16)) FROM superhero WHERE id = 1"  # another value at every run
    assert Trial(prepared, changing, gold).repeatable() is False
    assert refutes(Trial(prepared, changing, gold)) == ("uncertain", NONDETERMINISTIC)


# -- one deadline, one Cancel, the temporary-disk cap


# Runs only where the prediction's first condition fails: the grade short-circuits it, the lineage query
# ("all but condition 1") runs it on every other row of the real table.
SLOW_X = ("(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000 + id) "
          "SELECT count(*) FROM c) < 0")  # never true: the lineage query scans every row


def test_a_lineage_query_that_runs_long_stays_inside_the_checks_budget(checker):
    pred = f"SELECT superhero_name FROM superhero WHERE id = 1 AND (id = 1 OR {SLOW_X})"
    gold = "SELECT superhero_name FROM superhero WHERE id = 1"
    assert t2sql.Database(SUPERHERO).grade(pred, gold).outcome == "match"
    checker.check_sync(SUPERHERO, gold, gold, CONFIG)  # the invariants, the suite and the gold's databases
    started = time.monotonic()
    report = checker.check_sync(SUPERHERO, pred, gold, config(1.0))
    assert_a_verdict(report)
    assert time.monotonic() - started < 1.0 + 1.0


class PeakRss:
    """The process's peak RSS above where it stood at the start, sampled every 5 ms."""

    def __enter__(self) -> PeakRss:
        import threading

        self.base = self.peak = self._rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._rss())
            time.sleep(0.005)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS is read from /proc (Linux)")
def test_a_huge_value_in_a_lineage_query_is_refused_by_the_core(checker):
    pred = "SELECT superhero_name FROM superhero WHERE id = 1 AND (id = 1 OR length(hex(zeroblob(400000000))) > 0)"
    gold = "SELECT superhero_name FROM superhero WHERE id = 1"
    checker.check_sync(SUPERHERO, gold, gold, CONFIG)  # warm
    started = time.monotonic()
    with PeakRss() as rss:
        report = checker.check_sync(SUPERHERO, pred, gold, CONFIG)
    assert_a_verdict(report)
    assert time.monotonic() - started < CONFIG.budget_s + 5
    assert rss.growth < 256 * 2**20, f"{rss.growth / 2**20:.0f} MiB"  # 800 MB of hex under Python's sqlite3


def test_lineage_and_mining_queries_stay_under_the_temp_cap(tmp_path):
    # 40,000 distinct texts of 200 bytes: sorting them (DISTINCT, GROUP BY) needs ~8 MiB of temporary files.
    path = make_db(tmp_path / "big.sqlite", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
                   {"t": [(i, f"{i:08d}" + "x" * 192) for i in range(1, 40_001)]})
    cap = config(CONFIG.budget_s, max_temp_mb=1)
    with machinery.EquivalenceChecker(disk=DiskCache(tmp_path / "cache")) as c:
        c.invariants.get(path)  # mined ahead, under mining's own cap
        t2sql.temp_usage(reset=True)
        report = c.check_sync(path, "SELECT v FROM t WHERE id = 1 AND (id = 1 OR "
                                    "(SELECT count(*) FROM (SELECT v || id AS k FROM t GROUP BY k)) < 0)",
                              "SELECT v FROM t WHERE id = 1", cap)
    assert_a_verdict(report)
    assert report.skipped_reason != "nondeterministic"  # the lineage query ran (and met the cap)
    assert t2sql.temp_usage()[1] <= 1024 * 1024 + 64 * 1024  # never past the cap (a page of slack)


def test_an_invariant_mining_cannot_verify_is_never_used(tmp_path):
    path = make_db(tmp_path / "big.sqlite", "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)",
                   {"t": [(i, f"{i:08d}" + "x" * 192) for i in range(1, 40_001)]})
    t2sql.temp_usage(reset=True)
    store = InvariantStore(DiskCache(tmp_path / "cache"), max_temp_mb=1)
    inv = store.get(path)
    assert t2sql.temp_usage()[1] <= 1024 * 1024 + 64 * 1024
    # v's grouped statement (its repeats) needs more than the cap: not assumed unique, the database is
    # unsupported (with why) ...
    assert "values of t.v" in inv.unsupported and not inv.tables
    # ... and that conclusion is kept, so the next process does not mine again.
    assert InvariantStore(DiskCache(tmp_path / "cache")).ready(path) == inv
    with machinery.EquivalenceChecker(invariants=store) as c:
        report = c.check_sync(path, "SELECT v FROM t WHERE id = 1", "SELECT v FROM t WHERE id = 1", CONFIG)
    assert report.skipped_reason == "unsupported_schema" and "values of t.v" in report.detail


def test_cancel_frees_the_graders_worker_at_once(tmp_path):
    path = make_db(tmp_path / "slow.sqlite", "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)",
                   {"t": [(i, f"n{i}") for i in range(1, 2001)]})
    slow_x = SLOW_X.replace("3000000", "300000")
    pred = f"SELECT name FROM t WHERE id = 1 AND (id = 1 OR {slow_x})"
    gold = "SELECT name FROM t WHERE id = 1"
    mine_ahead([path], progress=False)  # as `t2sql gold` does: training's checks never mine

    async def main():
        with t2sql.Grader(concurrency=1) as grader:
            await check_on(grader, path, gold, gold, CONFIG)  # warm: the next check starts with its lineage
            check = asyncio.ensure_future(check_on(grader, path, pred, gold, config(60.0)))
            await asyncio.sleep(1.5)
            running = not check.done()
            check.cancel()
            cancelled = time.monotonic()
            tool = await grader.run_tool(path, "SELECT count(*) FROM t", tool_limits())
            return running, time.monotonic() - cancelled, tool

    running, freed_after, tool = asyncio.run(main())
    assert running and tool.row_count == 1
    assert freed_after < 1.0


# -- the reward and the commands never raise


def test_episode_finish_returns_a_result_when_the_check_cannot_run(monkeypatch):
    from t2sql.episode import equivalence_term as term
    from t2sql.episode.reward import Trajectory
    from t2sql.tasks import Task

    row = next(r for r in json.loads((BIRD / "dev.json").read_text()) if r["db_id"] == "superhero")
    task = Task.from_row(row, BIRD)
    trajectory = Trajectory(outcome="correct", evidence="", visible=("x",), prose=("x",), answer_turn=0,
                            invalid_tool_calls=0, solution=row["SQL"], task=task)

    def broken(*args, **kwargs):
        raise RuntimeError("the worker is gone")

    monkeypatch.setattr(machinery.EquivalenceChecker, "check_sync", broken)
    report = asyncio.run(term.check_trajectory(trajectory, get_preset("qwen3.6-35b-a3b")))
    assert report.skipped_reason == "check_error" and "worker is gone" in report.detail


def test_pairs_writes_one_line_per_input_line_whatever_the_pair(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "root"
    (root / "people").mkdir(parents=True)
    make_db(root / "people" / "people.sqlite", "CREATE TABLE person (id INTEGER PRIMARY KEY, "
            "name TEXT CHECK (length(name) > 5), age INTEGER)", {"person": PEOPLE}, ignore_checks=True)
    (root / "superhero").mkdir()
    (root / "superhero" / "superhero.sqlite").write_bytes(open(SUPERHERO, "rb").read())
    gold = "SELECT id FROM superhero WHERE id = 3"
    preds = ["", "DROP TABLE superhero", "SELEC 1", "WITH x AS (SELECT 1) VALUES (3)",
             "SELECT id FROM superhero WHERE id = " + "7" * 5000, "SELECT 1 -- " + "x" * 3_000_000]
    lines = [{"id": f"p{i}", "db_id": "superhero", "pred": p, "gold": gold} for i, p in enumerate(preds)]
    lines.append({"id": "checked", "db_id": "people", "pred": "SELECT count(*) FROM person WHERE age > 30",
                  "gold": "SELECT count(*) FROM person WHERE age >= 31"})
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "equivalence", "--pairs", str(pairs), "--db-root",
                           str(root), "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "T2SQL_EQUIVALENCE_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr
    got = [json.loads(x) for x in out.read_text().splitlines()]
    assert [g["id"] for g in got] == [x["id"] for x in lines]
    assert all(g["skipped"] != "check_error" for g in got)
    assert got[-1]["skipped"] == "constraint"


def test_measure_finishes_when_a_question_cannot_be_measured(tmp_path):
    from t2sql.equivalence.measure.run import measure

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bad.sqlite").write_bytes(b"not a database at all" * 100)
    rows = [{"question_id": 1, "db_id": "bad", "SQL": "SELECT 1"}]
    result = measure(rows, str(tmp_path), CONFIG, progress=False,
                     checker=machinery.EquivalenceChecker(disk=DiskCache(tmp_path / "cache")))
    assert [f["question_id"] for f in result["questions_failed"]] == [1]
