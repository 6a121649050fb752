"""Distinguishing rows made of real ones (t2sql.equivalence.distinguishing): a result row's row re-pointed at
another real parent row, a parent row without its children. On the bundled BIRD databases each catches
a lucky answer that no other of the gold's small databases tells apart, on databases that keep every
rule (problems() is [] with what the question presupposes)."""

from __future__ import annotations

import pytest

import t2sql
from conftest import bird_db, bird_root
from t2sql.episode.presets import get_preset
from t2sql.equivalence import check as machinery
from t2sql.equivalence.refutation import Trial, refutes

BIRD = bird_root()
CONFIG = machinery.EquivalenceConfig.from_preset(get_preset("qwen3.6-35b-a3b"))
SUPERHERO = bird_db("superhero")
TOXICOLOGY = bird_db("toxicology")
STUDENT_CLUB = bird_db("student_club")

# (database, gold, lucky prediction, what the databases that tell them apart are made by)
CASES = [
    # no Bad hero's skin is 'Green/Blue' today: a Bad hero re-pointed at that real colour tells = from LIKE
    (SUPERHERO, "SELECT COUNT(T1.id) FROM superhero AS T1 INNER JOIN alignment AS T2 ON T1.alignment_id = T2.id "
                "INNER JOIN colour AS T3 ON T1.skin_colour_id = T3.id "
                "WHERE T2.alignment = 'Bad' AND T3.colour = 'Green'",
     "SELECT COUNT(*) FROM superhero s JOIN colour c ON s.skin_colour_id = c.id JOIN alignment a ON "
     "s.alignment_id = a.id WHERE c.colour LIKE '%Green%' AND a.alignment = 'Bad'",
     "pointed at another real colour row"),
    # every iodine atom has a bond today: one without its connections tells an inner join from an outer one
    (TOXICOLOGY, "SELECT CAST(COUNT(T2.bond_id) AS REAL) / COUNT(T1.atom_id) FROM atom AS T1 INNER JOIN connected "
                 "AS T2 ON T1.atom_id = T2.atom_id WHERE T1.element = 'i'",
     "SELECT CAST(COUNT(T2.bond_id) AS REAL) / COUNT(T1.atom_id) FROM atom AS T1 LEFT JOIN connected AS T2 ON "
     "T1.atom_id = T2.atom_id WHERE T1.element = 'i'",
     "without its connected rows"),
    # one Katy today: pointed at another real major, she tells a query that dropped the major it names
    (STUDENT_CLUB, "SELECT T2.college FROM member AS T1 INNER JOIN major AS T2 ON T2.major_id = T1.link_to_major "
                   "WHERE T1.link_to_major = 'rec1N0upiVLy5esTO' AND T1.first_name = 'Katy'",
     "SELECT T2.college FROM member AS T1 INNER JOIN major AS T2 ON T2.major_id = T1.link_to_major "
     "WHERE T1.first_name = 'Katy'",
     "pointed at another real major row"),
]


@pytest.mark.parametrize("path, gold, pred, made_by", CASES)
def test_only_the_distinguishing_rows_tell_a_lucky_answer(equivalence_checker, path, gold, pred, made_by):
    assert t2sql.Database(path).grade(pred, gold).outcome == "match"  # a match on the real data
    inv = equivalence_checker.invariants.get(path)
    real = equivalence_checker.real_rows(path, inv)
    case = equivalence_checker.gold_case(path, inv, real, gold, CONFIG)
    made = [p for p in case.prepared if made_by in p.db.note]
    assert made, sorted({p.db.note for p in case.prepared})
    for p in case.prepared:
        assert p.db.problems() == [], p.db.note
    telling = {p.db.note for p in case.prepared if refutes(Trial(p, pred, gold))[0] == "refutes"}
    assert telling and all(made_by in note for note in telling), telling
    report = equivalence_checker.check_sync(path, pred, gold, CONFIG)
    assert report.refuted and made_by in report.witness.made_by


def test_a_repointed_row_points_at_a_real_parent_row(equivalence_checker):
    path, gold = CASES[0][:2]
    inv = equivalence_checker.invariants.get(path)
    real = equivalence_checker.real_rows(path, inv)
    colours = dict(real.rows("SELECT id, colour FROM colour"))
    case = equivalence_checker.gold_case(path, inv, real, gold, CONFIG)
    hero = inv.table("superhero")
    skin = hero.position("skin_colour_id")
    moved = [p for p in case.prepared if CASES[0][3] in p.db.note]
    assert moved
    for p in moved:
        # the colour table is the real one, whole and unchanged: each hero's skin is a real colour
        assert sorted(p.db.rows["colour"]) == sorted(real.rows("SELECT * FROM colour"))
        assert all(row[skin] in colours for row in p.db.rows["superhero"])


def test_a_limit_that_cut_nothing_meets_one_more_real_row(equivalence_checker):
    """The real blue-eyed heroes with brown hair, all of them, and a real hero with brown hair re-pointed at
    blue eyes: one more result row than the LIMIT keeps (copies under fresh keys did not tell here)."""
    gold = ("SELECT T1.superhero_name FROM superhero AS T1 INNER JOIN colour AS T2 ON T1.eye_colour_id = T2.id "
            "INNER JOIN colour AS T3 ON T1.hair_colour_id = T3.id WHERE T2.colour = 'Blue' AND T3.colour = 'Brown'")
    n = len(t2sql.Database(SUPERHERO).rows(gold))
    pred = f"{gold} LIMIT {n}"
    assert t2sql.Database(SUPERHERO).grade(pred, gold).outcome == "match"
    report = equivalence_checker.check_sync(SUPERHERO, pred, gold, CONFIG)
    assert report.refuted and "real ones and a superhero row" in report.witness.made_by, report.detail
