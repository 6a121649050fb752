"""The equivalence check on labelled answers (`t2sql equivalence --measure --answers`) and what a question
presupposes (t2sql.equivalence.presupposed): fixed lookup tables, evidence-stated keys, named entities."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import bird_db, bird_root
from t2sql.episode.presets import get_preset
from t2sql.equivalence import presupposed
from t2sql.equivalence.check import EquivalenceConfig
from t2sql.equivalence.checkbounds import CheckBudget
from t2sql.equivalence.smalldb import column_index
from t2sql.equivalence.targeted import targeted

BIRD = bird_root()
SUPERHERO = bird_db("superhero")
CONFIG = EquivalenceConfig.from_preset(get_preset("qwen3.6-35b-a3b"))

BLUE_BY_NAME = ("SELECT COUNT(T1.id) FROM superhero AS T1 INNER JOIN colour AS T2 ON T1.eye_colour_id = T2.id "
                "WHERE T2.colour = 'Blue'")
BLUE_BY_ID = "SELECT COUNT(*) FROM superhero WHERE eye_colour_id = 7"
POWERS_JOIN = ("SELECT T3.power_name FROM superhero AS T1 INNER JOIN hero_power AS T2 ON T1.id = T2.hero_id "
               "INNER JOIN superpower AS T3 ON T2.power_id = T3.id WHERE T1.superhero_name = '3-D Man'")
POWERS_SCALAR = ("SELECT power_name FROM superpower WHERE id IN (SELECT power_id FROM hero_power WHERE hero_id = "
                 "(SELECT id FROM superhero WHERE superhero_name = '3-D Man'))")


def test_a_key_the_evidence_states_is_kept_and_one_it_does_not_is_renumbered(equivalence_checker):
    lucky = equivalence_checker.check_sync(SUPERHERO, BLUE_BY_ID, BLUE_BY_NAME, CONFIG,
                               evidence="blue eyes refers to colour = 'Blue'")
    assert lucky.refuted  # the id was looked up in today's data
    stated = equivalence_checker.check_sync(SUPERHERO, BLUE_BY_ID, BLUE_BY_NAME, CONFIG,
                                evidence="blue eyes refers to colour.id = eye_colour_id = 7")
    assert stated.checked and not stated.refuted  # the evidence itself gives the id


def test_a_named_entity_is_neither_absent_nor_repeated(equivalence_checker):
    report = equivalence_checker.check_sync(SUPERHERO, POWERS_SCALAR, POWERS_JOIN, CONFIG)
    assert report.checked and not report.refuted  # differs only if two heroes were named '3-D Man'


def test_every_small_database_keeps_the_lookup_tables_whole_and_the_stated_keys(equivalence_checker):
    with CheckBudget.starting_now(60.0, None, 256).active():
        inv = equivalence_checker.invariants.get(SUPERHERO)
        real = equivalence_checker.real_rows(SUPERHERO, inv)
        fixed = {lk.table: lk for lk in presupposed.lookups(inv)}
        assert {"colour", "gender", "alignment"} <= set(fixed) and "superhero" not in fixed
        assert presupposed.stated_keys("male refers to gender.id = 1; blue refers to eye_colour_id = 7; id = 3",
                                       inv) == {("gender", 1), ("colour", 7)}
        p = presupposed.presupposition(real, inv, [POWERS_JOIN], "blue refers to eye_colour_id = 7")
        dbs, _ = targeted(real, inv, BLUE_BY_NAME, CONFIG.seed)
        dbs += targeted(real, inv, POWERS_JOIN, CONFIG.seed)[0]
        fitted = [f for f in (p.fit(db, real) for db in dbs) if f is not None]
        assert len(fitted) >= len(dbs) // 2
        assert any("renumbered" in db.note for db in fitted)
        for db in fitted:
            assert not db.problems()
            for name in ("colour", "gender"):
                t = inv.table(name)
                ni = column_index(t, fixed[name].name)
                assert sorted(r[ni] for r in db.rows[name]) == sorted(r[ni] for r in real.rows(f"SELECT * FROM {name}"))
            colour = inv.table("colour")
            assert (7, "Blue") in {(r[column_index(colour, "id")], r[column_index(colour, "colour")])
                                   for r in db.rows["colour"]}
            hero = inv.table("superhero")
            named = [r for r in db.rows["superhero"] if r[column_index(hero, "superhero_name")] == "3-D Man"]
            assert len(named) == 1
        # A database that drops a lookup row, or repeats the named hero, is not admissible.
        broken = fitted[0].copy()
        broken.rows["colour"] = broken.rows["colour"][1:]
        assert broken.problems()
        twice = fitted[0].copy()
        row = next(r for r in twice.rows["superhero"] if r[column_index(hero, "superhero_name")] == "3-D Man")
        twice.rows["superhero"].append(tuple(10**6 if i == column_index(hero, "id") else v for i, v in enumerate(row)))
        assert any("3-D Man" in p for p in twice.problems())


HEAVIEST_DC_BY_NAME = ("SELECT T1.superhero_name FROM superhero AS T1 INNER JOIN publisher AS T2 ON T1.publisher_id = "
                       "T2.id WHERE T2.publisher_name = 'DC Comics' ORDER BY T1.weight_kg DESC LIMIT 1")
HEAVIEST_DC_BY_ID = HEAVIEST_DC_BY_NAME.replace("T2.publisher_name = 'DC Comics'", "T2.id = 4")
AGILE_BLUE = ("SELECT COUNT(T1.id) FROM superhero AS T1 INNER JOIN hero_power AS T2 ON T1.id = T2.hero_id "
              "INNER JOIN superpower AS T3 ON T2.power_id = T3.id INNER JOIN colour AS T4 ON T1.eye_colour_id = T4.id "
              "WHERE T3.power_name = 'Agility' AND T4.colour = 'Blue'")


def test_the_suite_holds_a_lookup_table_renumbered_and_every_database_it_holds_is_kept(equivalence_checker):
    from t2sql.equivalence.suites import build_suite

    with CheckBudget.starting_now(120.0, None, 256).active():
        inv = equivalence_checker.invariants.get(SUPERHERO)
        real = equivalence_checker.real_rows(SUPERHERO, inv)
        suite = build_suite(real, inv, size=CONFIG.suite_size, seed=CONFIG.seed)
        whole = presupposed.presupposition(real, inv, [])
        assert suite and all(whole.fit(db, real) is not None for db in suite)  # none thrown away by every check

        def renumbered(db) -> bool:
            for lk in presupposed.lookups(inv):
                t = inv.table(lk.table)
                pairs = {(r[column_index(t, lk.key)], r[column_index(t, lk.name)]) for r in db.rows.get(t.name, [])}
                if not pairs <= set(real.rows(f"SELECT {lk.key}, {lk.name} FROM {lk.table}")):
                    return True
            return False

        assert any(renumbered(db) for db in suite)


def test_a_key_hard_coded_from_todays_data_is_refuted_where_the_key_moved_ties(equivalence_checker):
    # Renumbered among the rows held, the key points at a publisher whose heroes all weigh 0: a tie. The suite's
    # renumbered database or the gold's rotated keys (a publisher with no hero here) tell the two apart.
    report = equivalence_checker.check_sync(SUPERHERO, HEAVIEST_DC_BY_ID, HEAVIEST_DC_BY_NAME, CONFIG)
    assert report.refuted and ("renumbered" in report.witness.made_by or "rotated" in report.witness.made_by)


def test_the_golds_own_databases_rotate_the_lookup_keys_so_a_hard_coded_key_finds_nothing(equivalence_checker):
    import dataclasses

    with CheckBudget.starting_now(60.0, None, 256).active():
        inv = equivalence_checker.invariants.get(SUPERHERO)
        real = equivalence_checker.real_rows(SUPERHERO, inv)
        dbs, _ = targeted(real, inv, HEAVIEST_DC_BY_NAME, CONFIG.seed)
        [rotated] = [db for db in dbs if db.note == "lookup keys rotated"]
        fitted = presupposed.presupposition(real, inv, [HEAVIEST_DC_BY_NAME]).fit(rotated, real)
        assert fitted is not None and not fitted.problems()
        publisher, hero = inv.table("publisher"), inv.table("superhero")
        pk, pn = column_index(publisher, "id"), column_index(publisher, "publisher_name")
        names = {r[pk]: r[pn] for r in fitted.rows["publisher"]}
        real_names = dict(real.rows("SELECT id, publisher_name FROM publisher"))
        assert sorted(names) == sorted(real_names) and names[4] != "DC Comics"  # the same keys, other rows
        real_heroes = {r[0]: r[1] for r in real.rows("SELECT id, publisher_id FROM superhero")}
        for r in fitted.rows["superhero"]:  # every hero keeps its publisher, under its new key
            hid, pid = r[column_index(hero, "id")], r[column_index(hero, "publisher_id")]
            if hid in real_heroes and pid is not None:
                assert names[pid] == real_names[real_heroes[hid]]
    # Without a suite, the gold's own databases tell the hard-coded key apart.
    alone = dataclasses.replace(CONFIG, suite_size=0)
    report = equivalence_checker.check_sync(SUPERHERO, HEAVIEST_DC_BY_ID, HEAVIEST_DC_BY_NAME, alone)
    assert report.refuted and report.witness.made_by == "lookup keys rotated"


def test_where_a_limit_cuts_through_a_tie_only_rows_against_none_refute(equivalence_checker):
    # Every hero of the top weight, against the gold's one: the same where the top is one hero; where two tie,
    # the question is ambiguous, and the check's tied databases do not count that against it.
    top = "SELECT superhero_name FROM superhero ORDER BY weight_kg DESC LIMIT 1"
    every_top = "SELECT superhero_name FROM superhero WHERE weight_kg = (SELECT MAX(weight_kg) FROM superhero)"
    report = equivalence_checker.check_sync(SUPERHERO, every_top, top, CONFIG)
    assert report.checked and not report.refuted


def test_a_named_entity_in_another_case_is_the_entity_not_another_row(equivalence_checker):
    with CheckBudget.starting_now(60.0, None, 256).active():
        inv = equivalence_checker.invariants.get(SUPERHERO)
        real = equivalence_checker.real_rows(SUPERHERO, inv)
        p = presupposed.presupposition(real, inv, [AGILE_BLUE])
        power = inv.table("superpower")
        ni = column_index(power, "power_name")
        db = next(d for d in targeted(real, inv, AGILE_BLUE, CONFIG.seed)[0]
                  if any(r[ni] == "Agility" for r in d.rows.get("superpower", [])))
        cased = db.copy("Agility in another case")
        cased.rows["superpower"] = [tuple(v.swapcase() if j == ni and v == "Agility" else v for j, v in enumerate(r))
                                    for r in cased.rows["superpower"]]
        fitted = p.fit(cased, real)
        assert fitted is not None
        assert [r[ni] for r in fitted.rows["superpower"] if r[ni].lower() == "agility"] == ["Agility"]
    like = AGILE_BLUE.replace("T3.power_name = 'Agility'", "T3.power_name LIKE 'Agility'")
    report = equivalence_checker.check_sync(SUPERHERO, like, AGILE_BLUE, CONFIG)
    assert report.checked and not report.refuted  # no other power is named 'agility' in any case


def test_measure_answers_reports_both_errors_per_label_kind_and_reason(tmp_path):
    answers = tmp_path / "answers.jsonl"
    lines = [
        {"id": "a", "db_id": "superhero", "gold": BLUE_BY_NAME, "pred": BLUE_BY_ID, "label": "lucky",
         "lucky_kind": "hardcoded_value", "reason": "hard-codes the id", "systems": 3,
         "evidence": "blue eyes refers to colour = 'Blue'"},
        {"id": "b", "db_id": "superhero", "gold": BLUE_BY_NAME, "pred": BLUE_BY_ID, "label": "equivalent_in_practice",
         "reason": "the evidence gives the id", "systems": 2,
         "evidence": "blue eyes refers to colour.id = eye_colour_id = 7"},
        {"id": "c", "db_id": "superhero", "gold": BLUE_BY_NAME, "pred": BLUE_BY_NAME + " ", "label": "equivalent"},
        {"id": "d", "db_id": "superhero", "gold": "SELECT 1", "pred": "SELECT 1", "label": "maybe"},
        {"id": "e", "db_id": "nowhere", "gold": "SELECT 1", "pred": "SELECT 1", "label": "equivalent"},
    ]
    answers.write_text("\n".join(json.dumps(x) for x in lines) + "\n{not json\n")
    base = [sys.executable, "-m", "t2sql.cli", "equivalence", "--measure", "--answers", str(answers),
            "--db-root", str(BIRD)]
    proc = subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr  # some lines are not labelled answers
    assert "Traceback" not in proc.stderr
    got = json.loads(proc.stdout)
    assert got["labels"]["lucky"] == {"refuted": 1, "pairs": 1, "refuted_weight": 3, "weight": 3}
    assert got["labels"]["equivalent_in_practice"]["refuted"] == 0
    assert got["right_refuted"] == {"refuted": 0, "pairs": 2, "refuted_weight": 0, "weight": 3}
    assert got["lucky_kinds"]["hardcoded_value"]["refuted_weight"] == 3
    assert {e["reason"] for e in got["reasons"]} == {"hard-codes the id", "the evidence gives the id", ""}
    assert sorted(e["line"] for e in got["bad_lines"]) == [4, 5, 6]
    text = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert text.returncode == 1 and "right answers refuted: 0/2" in text.stdout and "bad line 6" in text.stdout
    both = subprocess.run(base + ["--data", str(BIRD / "dev.json")], capture_output=True, text=True, timeout=60)
    assert both.returncode == 2


def _blue_task(evidence: str):
    from t2sql.tasks import Task

    return Task(question_id="blue", db_id="superhero", db_path=SUPERHERO, question="How many heroes have blue eyes?",
                evidence=evidence, gold_sql=BLUE_BY_NAME)


def test_the_episode_passes_its_tasks_evidence_to_the_check():
    import asyncio

    from t2sql.episode import equivalence_term as eq
    from t2sql.episode.reward import Trajectory
    from t2sql.serving.grader import Grader

    def trajectory(evidence: str, grader=None) -> Trajectory:
        return Trajectory(outcome="correct", evidence="", visible=("x",), prose=("x",), answer_turn=0,
                          invalid_tool_calls=0, solution=BLUE_BY_ID, task=_blue_task(evidence), grader=grader)

    recipe = get_preset("qwen3.6-35b-a3b")
    named = asyncio.run(eq.check_trajectory(trajectory("blue eyes refers to colour = 'Blue'"), recipe))
    stated = asyncio.run(eq.check_trajectory(trajectory("blue eyes refers to eye_colour_id = 7"), recipe))
    assert named.refuted and stated.checked and not stated.refuted

    async def on_a_grader():
        with Grader(concurrency=1) as grader:
            return await eq.check_trajectory(trajectory("blue eyes refers to eye_colour_id = 7", grader), recipe)

    assert not asyncio.run(on_a_grader()).refuted


def test_invariants_lists_the_fixed_lookup_tables():
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "equivalence", "--invariants", "--db", SUPERHERO],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "fixed lookup table: colour (all 35 rows" in proc.stdout
    assert "fixed lookup table: superhero" not in proc.stdout
    as_json = subprocess.run([sys.executable, "-m", "t2sql.cli", "equivalence", "--invariants", "--db", SUPERHERO,
                              "--json"], capture_output=True, text=True, timeout=120)
    assert {"table": "gender", "key": "id", "name": "gender"} in json.loads(as_json.stdout)["lookups"]
