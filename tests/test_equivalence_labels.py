"""The measurement's labeller (t2sql.equivalence.measure.labels): a derived edit is called equivalent only where
the schema, the mined invariants and what the question presupposes make it so, and every such rule has a
near miss that stays different. And the check's own databases (t2sql.equivalence.targeted) for the misses the
rules do not cover. On the bundled BIRD databases (tests/data/bird)."""

from __future__ import annotations

import pytest

from conftest import bird_root
from t2sql.episode.presets import get_preset
from t2sql.equivalence import check as machinery
from t2sql.equivalence.diskcache import DiskCache
from t2sql.equivalence.measure.labels import label
from t2sql.equivalence.measure.row_bounds import distinct_rows, rows_at_most

BIRD = bird_root()
CONFIG = machinery.EquivalenceConfig.from_preset(get_preset("qwen3.6-35b-a3b"))
PATHS = {db: str(BIRD / db / f"{db}.sqlite") for db in ("superhero", "toxicology", "student_club")}


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    c = machinery.EquivalenceChecker(disk=DiskCache(tmp_path_factory.mktemp("labels-cache")))
    yield c
    c.close()


@pytest.fixture(scope="module")
def db(checker):
    """db_id -> (invariants, the real file's rows)."""
    out = {}

    def get(db_id: str):
        if db_id not in out:
            inv = checker.invariants.get(PATHS[db_id])
            out[db_id] = (inv, checker.real_rows(PATHS[db_id], inv).rows)
        return out[db_id]

    return get


HERO_POWERS = ("SELECT T3.power_name FROM superhero AS T1 INNER JOIN hero_power AS T2 ON T1.id = T2.hero_id "
               "INNER JOIN superpower AS T3 ON T2.power_id = T3.id WHERE T1.superhero_name = 'Deathlok'")
BOND_ATOMS = "SELECT T.atom_id FROM connected AS T WHERE T.bond_id = 'TR000_2_5'"


def test_distinct_over_rows_a_unique_set_keeps_apart_is_equivalent(db):
    inv, rows = db("superhero")
    # One hero (a named entity, held once), (hero_id, power_id) never repeats, a power's name is unique.
    assert distinct_rows(HERO_POWERS, inv, rows)
    assert label("add_distinct", HERO_POWERS, HERO_POWERS.replace("SELECT", "SELECT DISTINCT", 1), inv,
                 rows) == "equivalent"
    # Near misses: a name no real hero has names no entity (a database may hold it twice); one named only in
    # a subquery pins nothing outside it.
    assert not distinct_rows(HERO_POWERS.replace("'Deathlok'", "'Nobody At All'"), inv, rows)
    elsewhere = HERO_POWERS.replace("T1.superhero_name = 'Deathlok'", "T1.height_cm > (SELECT height_cm FROM "
                                    "superhero WHERE superhero_name = 'Deathlok')")
    assert not distinct_rows(elsewhere, inv, rows)
    # The heroes of a power, by their names (two heroes may share a name).
    by_power = ("SELECT T1.superhero_name FROM superhero AS T1 INNER JOIN hero_power AS T2 ON T1.id = T2.hero_id "
                "INNER JOIN superpower AS T3 ON T2.power_id = T3.id WHERE T3.power_name = 'Flight'")
    assert not distinct_rows(by_power, inv, rows)
    assert label("add_distinct", by_power, by_power.replace("SELECT", "SELECT DISTINCT", 1), inv,
                 rows) == "different"


def test_limit_over_one_keyed_symmetric_pair_is_equivalent_at_two(db):
    inv, rows = db("toxicology")
    # A bond's id names one pair of atoms, stored both ways: two rows, one each way.
    assert rows_at_most(BOND_ATOMS, inv, rows) == 2
    assert label("add_limit", BOND_ATOMS, BOND_ATOMS + " LIMIT 2", inv, rows) == "equivalent"
    assert label("add_limit", BOND_ATOMS, BOND_ATOMS + " LIMIT 1", inv, rows) == "different"
    # One side named as well: one row; DISTINCT over the other side's atoms changes nothing.
    one = BOND_ATOMS + " AND T.atom_id2 = 'TR000_2'"
    assert rows_at_most(one, inv, rows) == 1
    assert distinct_rows(BOND_ATOMS.replace("T.atom_id", "T.atom_id2", 1), inv, rows)
    # A key set to one of three literals: three rows at most.
    three = "SELECT molecule_id, T.label FROM molecule AS T WHERE T.molecule_id IN ('TR000', 'TR001', 'TR002')"
    assert rows_at_most(three, inv, rows) == 3
    assert label("add_limit", three, three + " LIMIT 2", inv, rows) == "different"
    # Near miss: an atom's bonds are as many as it has.
    atom = "SELECT T.bond_id FROM connected AS T WHERE T.atom_id2 = 'TR000_2'"
    assert rows_at_most(atom, inv, rows) is None
    assert label("add_limit", atom, atom + " LIMIT 4", inv, rows) == "different"


def test_limit_over_a_closed_vocabularys_distinct_values_is_equivalent(db):
    inv, rows = db("toxicology")
    labels = ("SELECT DISTINCT T2.label FROM atom AS T1 INNER JOIN molecule AS T2 ON T1.molecule_id = "
              "T2.molecule_id WHERE T1.element != 'sn'")
    bound = rows_at_most(labels, inv, rows)
    assert bound is not None and bound >= 2
    assert label("add_limit", labels, f"{labels} LIMIT {bound}", inv, rows) == "equivalent"
    assert label("add_limit", labels, f"{labels} LIMIT {bound - 1}", inv, rows) == "different"
    # Near miss: an open column's distinct values are as many as the data holds.
    ids = labels.replace("T2.label", "T2.molecule_id")
    assert rows_at_most(ids, inv, rows) is None


def test_groups_of_pinned_rows_are_as_many_as_the_choices_left(db):
    inv, rows = db("toxicology")
    # One molecule named: its label, grouped over its many bonds, is one group.
    grouped = ("SELECT COUNT(T1.bond_id), T2.label FROM bond AS T1 INNER JOIN molecule AS T2 ON T1.molecule_id = "
               "T2.molecule_id WHERE T1.bond_type = '=' AND T2.molecule_id = 'TR006' GROUP BY T2.label")
    assert rows_at_most(grouped, inv, rows) == 1
    assert label("add_limit", grouped, f"{grouped} LIMIT 1", inv, rows) == "equivalent"
    assert label("add_distinct", grouped, grouped.replace("SELECT ", "SELECT DISTINCT ", 1), inv, rows) == "equivalent"
    # A bond named pins its molecule: the DISTINCT label is one row, fewer than the vocabulary's two.
    distinct = ("SELECT DISTINCT T2.label FROM atom AS T1 INNER JOIN molecule AS T2 ON T1.molecule_id = T2.molecule_id "
                "INNER JOIN bond AS T3 ON T2.molecule_id = T3.molecule_id WHERE T3.bond_id = 'TR001_2_4'")
    assert rows_at_most(distinct, inv, rows) == 1
    # Near misses: grouped by a column of the rows left free (the bonds), or nothing named.
    assert rows_at_most(grouped.replace("GROUP BY T2.label", "GROUP BY T1.bond_type"), inv, rows) is None
    assert rows_at_most(grouped.replace(" AND T2.molecule_id = 'TR006'", ""), inv, rows) is None


def test_one_row_is_what_the_outer_select_aggregates_not_a_subquery_or_a_window():
    from t2sql.equivalence.measure.derive import derive_mutations, returns_one_row

    share = ("SELECT (CAST(COUNT(*) AS REAL) * 100 / (SELECT COUNT(*) FROM superhero)), CAST(SUM(CASE WHEN "
             "T2.publisher_name = 'Marvel Comics' THEN 1 ELSE 0 END) AS REAL) FROM superhero AS T1 INNER JOIN "
             "publisher AS T2 ON T1.publisher_id = T2.id")
    assert returns_one_row(share)
    assert not any(kind == "add_limit" for kind, _ in derive_mutations(share, 1))
    assert returns_one_row("SELECT IIF(x > 1, MAX(a), 0) FROM t")
    for per_row in ("SELECT a, (SELECT COUNT(*) FROM u) FROM t", "SELECT MAX(a, b) FROM t",
                    "SELECT COUNT(*) OVER () FROM t", "SELECT max(a, (SELECT max(b) FROM u)) FROM t",
                    "SELECT COUNT(*) FROM t GROUP BY a"):
        assert not returns_one_row(per_row), per_row


def test_null_ignoring_aggregates_of_the_outer_joined_side_are_equivalent(db):
    inv, rows = db("student_club")
    gold = ("SELECT SUM(T2.amount) FROM event AS T1 INNER JOIN budget AS T2 ON T1.event_id = T2.link_to_event "
            "WHERE T1.event_name = 'October Speaker'")
    assert label("left_join", gold, gold.replace("INNER JOIN", "LEFT JOIN"), inv, rows) == "equivalent"
    ratio = ("SELECT CAST(COUNT(T2.link_to_event) AS REAL) / COUNT(DISTINCT T2.link_to_event) FROM event AS T1 "
             "INNER JOIN attendance AS T2 ON T1.event_id = T2.link_to_event WHERE T1.type = 'Meeting'")
    assert label("left_join", ratio, ratio.replace("INNER JOIN", "LEFT JOIN"), inv, rows) == "equivalent"
    # Near misses: COUNT(*) counts the partner-less row; a CASE turns its NULL into 0; GROUP BY adds a group.
    for near in (gold.replace("SUM(T2.amount)", "COUNT(*)"),
                 gold.replace("SUM(T2.amount)", "SUM(CASE WHEN T1.type = 'x' THEN T2.amount ELSE 0 END)"),
                 gold.replace("SUM(T2.amount)", "T1.type, SUM(T2.amount)") + " GROUP BY T1.type",
                 gold.replace("SUM(T2.amount)", "SUM(T1.event_id)")):
        assert label("left_join", near, near.replace("INNER JOIN", "LEFT JOIN"), inv, rows) == "different", near


def test_a_date_literal_inside_a_date_only_column_is_the_date(db):
    inv, rows = db("student_club")
    gold = "SELECT SUM(cost) FROM expense WHERE expense_date = '2019-08-20'"
    assert label("like_substring", gold, gold.replace("= '2019-08-20'", "LIKE '%2019-08-20%'"), inv,
                 rows) == "equivalent"
    # Near miss: part of a date is inside many.
    month = "SELECT SUM(cost) FROM expense WHERE expense_date = '2019-08'"
    assert label("like_substring", month, month.replace("= '2019-08'", "LIKE '%2019-08%'"), inv,
                 rows) == "different"


def test_the_edited_comparison_is_read_where_the_edit_is(db):
    inv, rows = db("superhero")
    # The gold compares publisher_name twice; the edit is on the second ('DC Comics'): on the fixed lookup
    # table of publishers, LIKE 'DC Comics' picks the row = 'DC Comics' picks.
    gold = ("SELECT SUM(CASE WHEN T2.publisher_name = 'Marvel Comics' THEN 1 ELSE 0 END) - SUM(CASE WHEN "
            "T2.publisher_name = 'DC Comics' THEN 1 ELSE 0 END) FROM superhero AS T1 INNER JOIN publisher AS T2 "
            "ON T1.publisher_id = T2.id")
    pred = gold.replace("T2.publisher_name = 'DC Comics'", "T2.publisher_name LIKE 'DC Comics'")
    assert label("like_for_eq", gold, pred, inv, rows) == "equivalent"
    # Near miss: a substring that other publishers' names hold too.
    wide = gold.replace("T2.publisher_name = 'DC Comics'", "T2.publisher_name LIKE '%Comics%'")
    assert label("like_substring", gold, wide, inv, rows) == "different"


def test_a_limit_that_cuts_a_distinct_second_row_is_refuted(checker):
    # The bond's two atoms are of one element today; a database where they are of two is one of its kind.
    gold = ("SELECT DISTINCT T1.element FROM atom AS T1 INNER JOIN connected AS T2 ON T1.atom_id = T2.atom_id "
            "WHERE T2.bond_id = 'TR004_8_9'")
    report = checker.check_sync(PATHS["toxicology"], gold + " LIMIT 1", gold, CONFIG)
    assert report.refuted and report.witness is not None


def test_copies_for_more_result_rows_keep_what_the_filter_reads(checker):
    # budget's (event, category) never repeats: a copy for a new event keeps its category, so the copies
    # are result rows too and a LIMIT below their number is refuted.
    gold = ("SELECT T1.event_name FROM event AS T1 INNER JOIN budget AS T2 ON T1.event_id = T2.link_to_event "
            "WHERE T2.category = 'Food'")
    report = checker.check_sync(PATHS["student_club"], gold + " LIMIT 22", gold, CONFIG)
    assert report.refuted and report.witness is not None


def test_an_outer_join_whose_missing_partner_the_where_drops_is_equivalent(db):
    inv, rows = db("student_club")
    # A condition on the joined side that NULL never meets drops the rows without a partner.
    gold = ("SELECT city FROM member AS T1 INNER JOIN major AS T2 ON T2.major_id = T1.link_to_major INNER JOIN "
            "zip_code AS T3 ON T3.zip_code = T1.zip WHERE department = 'Art and Design Department'")
    assert label("left_join", gold, gold.replace("INNER JOIN major", "LEFT JOIN major"), inv, rows) == "equivalent"
    # A reference the WHERE keeps from NULL names its parent.
    named = ("SELECT T2.college FROM member AS T1 INNER JOIN major AS T2 ON T2.major_id = T1.link_to_major "
             "WHERE T1.link_to_major = 'rec1N0upiVLy5esTO'")
    assert label("left_join", named, named.replace("INNER JOIN", "LEFT JOIN"), inv, rows) == "equivalent"
    # Near miss: IS NULL keeps them.
    kept = gold.replace("department = 'Art and Design Department'", "department IS NULL")
    assert label("left_join", kept, kept.replace("INNER JOIN major", "LEFT JOIN major"), inv, rows) == "different"


def test_like_around_an_identifier_of_one_width_is_equivalent(db):
    inv, rows = db("toxicology")
    # Molecule ids are TR000 ... TR342, upper case: no other holds 'TR151', and none is made longer.
    gold = "SELECT T.label FROM molecule AS T WHERE T.molecule_id = 'TR151'"
    assert label("like_substring", gold, gold.replace("= 'TR151'", "LIKE '%TR151%'"), inv, rows) == "equivalent"
    # Near misses: part of an id is inside many; a bond id's width varies (TR000_1_2, TR000_10_11).
    part = gold.replace("'TR151'", "'TR15'")
    assert label("like_substring", part, part.replace("= 'TR15'", "LIKE '%TR15%'"), inv, rows) == "different"
    bond = "SELECT T.bond_type FROM bond AS T WHERE T.bond_id = 'TR001_1_8'"
    assert label("like_substring", bond, bond.replace("= 'TR001_1_8'", "LIKE '%TR001_1_8%'"), inv,
                 rows) == "different"


def test_a_unique_name_keeps_apart_in_letter_case(checker):
    # Power names never repeat, in any case: no database holds 'cryokinesis' beside 'Cryokinesis'.
    gold = "SELECT id FROM superpower WHERE power_name = 'Cryokinesis'"
    pred = "SELECT id FROM superpower WHERE LOWER(power_name) = 'cryokinesis'"
    assert not checker.check_sync(PATHS["superhero"], pred, gold, CONFIG).refuted
    # Near miss: heroes' full names repeat, so another one in another case may be there.
    gold = "SELECT id FROM superhero WHERE full_name = 'Charles Chandler'"
    pred = "SELECT id FROM superhero WHERE lower(full_name) = 'charles chandler'"
    assert checker.check_sync(PATHS["superhero"], pred, gold, CONFIG).refuted


def test_a_named_rows_unique_name_in_any_case_is_equivalent(db):
    inv, rows = db("superhero")
    gold = "SELECT id FROM superpower WHERE power_name = 'Cryokinesis'"
    for kind, pred in (("literal_case", "SELECT id FROM superpower WHERE lower(power_name) = 'cryokinesis'"),
                       ("like_for_eq", "SELECT id FROM superpower WHERE power_name LIKE 'Cryokinesis'")):
        assert label(kind, gold, pred, inv, rows) == "equivalent"
    # Near misses: a name no row holds (nothing presupposes it); full names repeat.
    nobody = gold.replace("Cryokinesis", "Nothing Like It")
    lowered = nobody.replace("power_name = 'Nothing Like It'", "lower(power_name) = 'nothing like it'")
    assert label("literal_case", nobody, lowered, inv, rows) == "different"
    name = "SELECT id FROM superhero WHERE full_name = 'Charles Chandler'"
    assert label("literal_case", name, name.replace("full_name = 'Charles Chandler'",
                                                    "lower(full_name) = 'charles chandler'"), inv, rows) == "different"


def test_a_derived_tables_column_is_read_as_its_tables(db):
    inv, rows = db("toxicology")
    # element is a closed vocabulary of lower-case symbols, read here through a derived table.
    gold = ("SELECT COUNT(CASE WHEN T.element = 'cl' THEN 1 END) FROM (SELECT T1.atom_id, T1.element FROM atom AS T1 "
            "WHERE T1.molecule_id = 'TR000') AS T")
    assert label("literal_case", gold, gold.replace("T.element = 'cl'", "lower(T.element) = 'cl'"), inv,
                 rows) == "equivalent"
    # Near miss: 'c' is inside 'cl' and 'ca'.
    carbon = gold.replace("'cl'", "'c'")
    assert label("like_substring", carbon, carbon.replace("T.element = 'c'", "T.element LIKE '%c%'"), inv,
                 rows) == "different"
