"""Realism rules mined from the data (t2sql.equivalence.realism): a relation stored both ways, column pairs that
never repeat, closed vocabularies, path copies and id prefixes are found in the bundled BIRD databases,
listed, kept by every small database the check builds (checked here by SQL of the test's own on the
database the core built), and the right answers that lean on them are not refuted, while lucky ones
still are."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

import t2sql
from conftest import bird_db, bird_root, tool_limits
from t2sql.episode.presets import get_preset
from t2sql.equivalence import check as machinery
from t2sql.equivalence.invariants import quote
from t2sql.equivalence.mining import mine

BIRD = bird_root()
CONFIG = machinery.EquivalenceConfig.from_preset(get_preset("qwen3.6-35b-a3b"))
SUPERHERO = bird_db("superhero")
STUDENT_CLUB = bird_db("student_club")
TOXICOLOGY = bird_db("toxicology")

# Right answers that differ from the gold only where a realism rule is broken.
RIGHT = [
    # connected holds every bond both ways: atoms absent from atom_id are absent from atom_id2 too
    (TOXICOLOGY, "SELECT DISTINCT T.element FROM atom AS T WHERE T.atom_id NOT IN (SELECT DISTINCT atom_id FROM "
                 "connected)",
     "SELECT DISTINCT element FROM atom a WHERE NOT EXISTS (SELECT 1 FROM connected c WHERE c.atom_id = a.atom_id) "
     "AND NOT EXISTS (SELECT 1 FROM connected c WHERE c.atom_id2 = a.atom_id)"),
    # ... and a bond's id names one pair of atoms: its rows are two, one each way
    (TOXICOLOGY, "SELECT COUNT(T.bond_id) FROM connected AS T WHERE SUBSTR(T.atom_id, -2) = '19'",
     "SELECT COUNT(DISTINCT bond_id) FROM connected WHERE atom_id LIKE '%_19' OR atom_id2 LIKE '%_19'"),
    # element's values are a closed set of lower-case symbols
    (TOXICOLOGY, "SELECT COUNT(*) FROM atom WHERE element = 'cl'", "SELECT COUNT(*) FROM atom WHERE element LIKE 'CL'"),
    # an atom's molecule is its bond's molecule
    (TOXICOLOGY, "SELECT DISTINCT T1.molecule_id FROM atom AS T1 INNER JOIN connected AS T2 ON T1.atom_id = "
                 "T2.atom_id WHERE T2.bond_id = 'TR001_1_7'",
     "SELECT molecule_id FROM bond WHERE bond_id = 'TR001_1_7'"),
]

# Lucky answers that must stay refuted.
LUCKY = [
    # 'Green/Blue' is a real colour: a lookup table's names stay open
    (SUPERHERO, "SELECT COUNT(T1.id) FROM superhero AS T1 INNER JOIN alignment AS T2 ON T1.alignment_id = T2.id "
                "INNER JOIN colour AS T3 ON T1.skin_colour_id = T3.id "
                "WHERE T2.alignment = 'Bad' AND T3.colour = 'Green'",
     "SELECT COUNT(*) FROM superhero s JOIN colour c ON s.skin_colour_id = c.id JOIN alignment a ON "
     "s.alignment_id = a.id WHERE c.colour LIKE '%Green%' AND a.alignment = 'Bad'"),
    # a whitelist of today's elements: another molecule may hold another of the vocabulary's values
    (TOXICOLOGY, "SELECT DISTINCT T.element FROM atom AS T WHERE T.molecule_id = 'TR004'",
     "SELECT DISTINCT element FROM atom WHERE molecule_id = 'TR004' AND element IN ('cl', 'c', 'h', 'o', 's', 'n', "
     "'p', 'na', 'br', 'f', 'i', 'sn', 'pb', 'te', 'ca')"),
    # a second secretary: a duplicated member takes another real zip code (member.zip never repeats)
    (STUDENT_CLUB, "SELECT first_name, last_name, email FROM member WHERE position = 'Secretary'",
     "SELECT first_name, last_name, email FROM member WHERE position = 'Secretary' LIMIT 1"),
    # LIKE '%c%' also takes 'cl', 'ca', 'cu': the vocabulary's values holding the literal come first
    (TOXICOLOGY, "SELECT COUNT(*) FROM atom WHERE molecule_id = 'TR004' AND element = 'c'",
     "SELECT COUNT(*) FROM atom WHERE molecule_id = 'TR004' AND element LIKE '%c%'"),
]


def test_the_rules_are_mined_from_the_data(equivalence_checker):
    tox = equivalence_checker.invariants.get(TOXICOLOGY)
    assert [(s.table, s.left, s.right, s.keyed) for s in tox.symmetries] == [("connected", "atom_id", "atom_id2", True)]
    vocab = {(v.table, v.column): set(v.values) for v in tox.vocabularies}
    assert "cl" in vocab[("atom", "element")] and "Cl" not in vocab[("atom", "element")]
    assert vocab[("bond", "bond_type")] == {"-", "=", "#"}
    assert ("atom", "molecule_id") not in vocab  # a reference column takes its values from its parent
    paths = {(p.first.parent, p.first_column, p.second.parent, p.second_column) for p in tox.path_copies}
    assert ("bond", "molecule_id", "atom", "molecule_id") in paths
    assert {(p.table, p.column, p.source_column) for p in tox.prefixes} >= {("atom", "atom_id", "molecule_id"),
                                                                            ("bond", "bond_id", "molecule_id")}
    club = equivalence_checker.invariants.get(STUDENT_CLUB)
    assert ("budget", ("category", "link_to_event")) in {(u.table, u.columns) for u in club.unique_sets}
    assert ("event", ("event_date", "status")) not in {(u.table, u.columns) for u in club.unique_sets}  # by chance
    hero = equivalence_checker.invariants.get(SUPERHERO)
    assert not any(v.table == "colour" for v in hero.vocabularies)  # a row per colour: open
    assert hero.symmetries == ()


def test_a_made_up_database_shows_what_counts(tmp_path):
    """A symmetric table only when every row has its mirror; a vocabulary only with many rows a value."""
    path = tmp_path / "made.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT, team TEXT)")
        db.execute("CREATE TABLE friend (a INTEGER REFERENCES person(id), b INTEGER REFERENCES person(id), "
                   "since INTEGER, PRIMARY KEY (a, b))")
        db.execute("CREATE TABLE follows (a INTEGER REFERENCES person(id), b INTEGER REFERENCES person(id), "
                   "PRIMARY KEY (a, b))")
        db.executemany("INSERT INTO person VALUES (?, ?, ?)",
                       [(i, f"name {i}", ("red", "blue")[i % 2]) for i in range(1, 41)])
        pairs = [(i, i + 1, 2000 + i) for i in range(1, 40)]
        db.executemany("INSERT INTO friend VALUES (?, ?, ?)", pairs + [(b, a, y) for a, b, y in pairs])
        db.executemany("INSERT INTO follows VALUES (?, ?)", [(i, i + 1) for i in range(1, 40)] + [(2, 1)])
    inv = mine(str(path))
    assert [(s.table, s.left, s.right, s.keyed) for s in inv.symmetries] == [("friend", "a", "b", True)]
    assert [(v.table, v.column, v.values) for v in inv.vocabularies] == [("person", "team", ("blue", "red"))]


def _kept_by_sql(prepared: machinery.Prepared, inv) -> list[str]:
    """Each rule checked by SQL of this test's own on the database the core built."""
    core = prepared.core
    bad = []

    def count(sql: str) -> int:
        return int(core.run_tool(sql, tool_limits()).rows[0][0])

    for s in inv.symmetries:
        t = inv.table(s.table)
        rest = [c for c in t.column_names if c not in (s.left, s.right)]
        mirror = ", ".join(quote(c) for c in [s.right, s.left, *rest])
        own = ", ".join(quote(c) for c in [s.left, s.right, *rest])
        if count(f"SELECT count(*) FROM {quote(s.table)} WHERE ({mirror}) NOT IN (SELECT {own} FROM {quote(s.table)})"):
            bad.append(f"a row of {s.table} without its mirror")
        pair = f"min({quote(s.left)}, {quote(s.right)}) || '|' || max({quote(s.left)}, {quote(s.right)})"
        names = ", ".join(quote(c) for c in rest)
        if s.keyed and count(f"SELECT count(*) FROM (SELECT {names} FROM {quote(s.table)} GROUP BY {names} "
                             f"HAVING count(DISTINCT {pair}) > 1)"):
            bad.append(f"one {s.table} row names two pairs")
    for u in inv.unique_sets:
        cols = ", ".join(quote(c) for c in u.columns)
        if count(f"SELECT count(*) FROM (SELECT {cols} FROM {quote(u.table)} GROUP BY {cols} HAVING count(*) > 1)"):
            bad.append(f"{u.table}({cols}) repeats")
    for v in inv.vocabularies:
        marks = ", ".join("?" * len(v.values))
        q = quote(v.column)
        found = core.run_tool(f"SELECT count(*) FROM {quote(v.table)} WHERE typeof({q}) = 'text' "
                              f"AND {q} COLLATE BINARY NOT IN ({', '.join(_lit(x) for x in v.values)})",
                              tool_limits()).rows
        if marks and int(found[0][0]):
            bad.append(f"a new value in {v.table}.{v.column}")
    for p in inv.path_copies:
        c = quote(p.first.child)
        on1 = " AND ".join(f"c.{quote(a)} = x.{quote(b)}"
                           for a, b in zip(p.first.child_columns, p.first.parent_columns))
        on2 = " AND ".join(f"c.{quote(a)} = y.{quote(b)}"
                           for a, b in zip(p.second.child_columns, p.second.parent_columns))
        if count(f"SELECT count(*) FROM {c} AS c JOIN {quote(p.first.parent)} AS x ON {on1} JOIN "
                 f"{quote(p.second.parent)} AS y ON {on2} WHERE x.{quote(p.first_column)} IS NOT "
                 f"y.{quote(p.second_column)}"):
            bad.append(f"path copy broken {p.first.parent}.{p.first_column}")
    for x in inv.prefixes:
        col, src = quote(x.column), quote(x.source_column)
        if count(f"SELECT count(*) FROM {quote(x.table)} WHERE substr({col}, 1, length({src})) IS NOT {src}"):
            bad.append(f"{x.table}.{x.column} without its prefix")
    return bad


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@pytest.mark.parametrize("path, gold, pred", RIGHT[:2] + LUCKY[1:] + [
    (STUDENT_CLUB, "SELECT category FROM budget WHERE link_to_event = 'recI43CzsZ0Q625ma'",
     "SELECT DISTINCT category FROM budget WHERE link_to_event = 'recI43CzsZ0Q625ma'")])
def test_every_small_database_keeps_the_rules(equivalence_checker, path, gold, pred):
    inv = equivalence_checker.invariants.get(path)
    real = equivalence_checker.real_rows(path, inv)
    case = equivalence_checker.gold_case(path, inv, real, gold, CONFIG)  # the gold's targeted databases and the suite
    built = equivalence_checker.targeted(path, inv, real, pred, CONFIG.seed)[0]
    own = [machinery.Prepared(db, gold, CONFIG.spec) for db in built]
    assert len(case.prepared) >= 5
    notes = {p.db.note for p in case.prepared + own}
    assert any("duplicated under fresh keys" in n for n in notes)  # the variants that could break them are there
    for prepared in case.prepared + own:
        assert _kept_by_sql(prepared, inv) == [], prepared.db.note
    for p in own:
        p.close()


def test_a_broken_rule_is_a_problem(equivalence_checker):
    inv = equivalence_checker.invariants.get(TOXICOLOGY)
    real = equivalence_checker.real_rows(TOXICOLOGY, inv)
    [db] = machinery.targeted(real, inv, RIGHT[0][1], 1)[0][:1]
    assert db.problems() == [] and db.rows["connected"]
    lonely = db.copy()
    del lonely.rows["connected"][0]
    assert any("lacks its mirror" in p for p in lonely.problems())
    atom = inv.table("atom")
    cased = db.copy()
    row = cased.rows["atom"][0]
    cased.rows["atom"][0] = tuple(v.upper() if i == atom.position("element") else v for i, v in enumerate(row))
    assert any("is not one of its values" in p for p in cased.problems())
    moved = db.copy()
    row = moved.rows["atom"][0]
    moved.rows["atom"][0] = tuple("TR999_1" if i == atom.position("atom_id") else v for i, v in enumerate(row))
    assert any("does not start with" in p for p in moved.problems())


@pytest.mark.parametrize("path, gold, pred", RIGHT)
def test_right_answers_leaning_on_them_are_not_refuted(equivalence_checker, path, gold, pred):
    assert t2sql.Database(path).grade(pred, gold).outcome == "match"
    report = equivalence_checker.check_sync(path, pred, gold, CONFIG)
    assert not report.refuted, report.witness and report.witness.to_text()


@pytest.mark.parametrize("path, gold, pred", LUCKY)
def test_lucky_answers_are_still_refuted(equivalence_checker, path, gold, pred):
    assert t2sql.Database(path).grade(pred, gold).outcome == "match"  # a match on the real data
    report = equivalence_checker.check_sync(path, pred, gold, CONFIG)
    assert report.refuted


def test_the_invariants_command_lists_them(tmp_path):
    env_cache = {"T2SQL_EQUIVALENCE_CACHE": str(tmp_path)}
    import os

    env = {**os.environ, **env_cache}
    text = subprocess.run([sys.executable, "-m", "t2sql.cli", "equivalence", "--invariants", "--db", TOXICOLOGY],
                          capture_output=True, text=True, timeout=120, env=env).stdout
    assert "symmetric: connected(atom_id, atom_id2) holds every row both ways" in text
    assert "closed vocabulary: atom.element in" in text and "prefix: atom.atom_id starts with molecule_id" in text
    assert "path copy: bond.molecule_id" in text
    as_json = json.loads(subprocess.run([sys.executable, "-m", "t2sql.cli", "equivalence", "--invariants", "--db",
                                         STUDENT_CLUB, "--json"], capture_output=True, text=True, timeout=120,
                                        env=env).stdout)
    assert {"table": "budget", "columns": ["category", "link_to_event"]} in as_json["unique_sets"]
