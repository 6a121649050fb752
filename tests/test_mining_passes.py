"""Mining's shared passes (t2sql.equivalence.mining, t2sql.equivalence.realism_mining) find what a statement per
invariant would: a column's facts from one grouped statement, candidates refuted on leading rows, a keyed
symmetry counted from the rest's distinct values, path copies of one child in one pass, statements run side
by side. Each fast path is checked against the general one it stands for (a table whose CREATE statement
names a collation takes the general ones), and against what the data says."""

from __future__ import annotations

import re
import sqlite3

import pytest

import t2sql
from conftest import bird_root
from t2sql.equivalence import realism_mining
from t2sql.equivalence.invariants import FORMAT_LEAD, FORMATS
from t2sql.equivalence.mining import mine

BIRD = bird_root()


def _comparable(inv) -> dict:
    d = inv.to_dict()
    for key in ("path", "mine_s", "schema"):
        d.pop(key)
    return d


def test_every_shape_but_empty_starts_with_a_digit():
    """Mining tries the shapes only on texts that are empty or start with a digit (FORMAT_LEAD)."""
    for name, _, pattern in FORMATS:
        assert pattern == r"\A\Z" or pattern.startswith(r"\A[0-9]"), name
        assert not re.search(pattern, "x" + "0" * 20), name


def test_the_lead_is_an_empty_text_or_a_first_ascii_digit(tmp_path):
    """FORMAT_LEAD, run as mining runs it, says what the shapes' patterns start with."""
    values = ["", "0", "9", "09:30", "2024-01-01", ":", "/", "a", " 1", "\u0663", "1\u00e9", "9" * 40]
    path = tmp_path / "lead.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (v TEXT COLLATE NOCASE)")
        db.executemany("INSERT INTO t VALUES (?)", [(v,) for v in values])
    with t2sql.Database(str(path)) as db:
        got = db.rows(f"SELECT v, {FORMAT_LEAD.format(q='v')} FROM t")
    assert {v: bool(lead) for v, lead in got} == {v: v == "" or v[0] in "0123456789" for v in values}


@pytest.mark.parametrize("db_id", ["toxicology", "superhero", "student_club"])
def test_side_by_side_statements_give_the_same_invariants(db_id):
    path = str(BIRD / db_id / f"{db_id}.sqlite")
    one, two = mine(path, workers=1), mine(path, workers=2)
    assert not one.unsupported
    assert _comparable(one) == _comparable(two)


def _made_up(path, collate: str) -> None:
    """People, friendships stored both ways (a `since` per pair), links stored both ways under one tag,
    text pairs stored both ways, places, and visits whose person, place and guide (when there is one)
    share a city."""
    c = collate
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE person (id INTEGER PRIMARY KEY, name TEXT{c}, city TEXT{c}, score)")
        db.execute(f"CREATE TABLE place (id INTEGER PRIMARY KEY, city TEXT{c})")
        db.execute(f"CREATE TABLE friend (a INTEGER REFERENCES person(id), b INTEGER REFERENCES person(id), "
                   f"since INTEGER{c}, PRIMARY KEY (a, b))")
        db.execute(f"CREATE TABLE link (a INTEGER REFERENCES person(id), b INTEGER REFERENCES person(id), "
                   f"tag TEXT{c}, PRIMARY KEY (a, b))")
        db.execute(f"CREATE TABLE visit (id INTEGER PRIMARY KEY, person_id INTEGER REFERENCES person(id), "
                   f"place_id INTEGER REFERENCES place(id), guide_id INTEGER REFERENCES person(id), "
                   f"label TEXT{c})")
        db.execute(f"CREATE TABLE code (id TEXT{c} PRIMARY KEY)")
        # Text pairs stored both ways, with a weight per pair (a column whose values the mirrored statements
        # count on half the rows): every row's mirror (the second column's statement is implied); the same but
        # for one row past the leading ones, with x > y (edge) or x < y (arc); with a row its own mirror
        # (loop: still both ways); with a row that has no partner (hole: not).
        for table in ("tie", "edge", "arc", "loop", "hole"):
            db.execute(f"CREATE TABLE {table} (x TEXT{c} REFERENCES code(id), y TEXT{c} REFERENCES code(id), "
                       f"w TEXT{c}, PRIMARY KEY (x, y))")
        db.executemany("INSERT INTO code VALUES (?)", [(f"C{i:04d}",) for i in range(1300)] + [("z9",)])
        ties = [(f"C{i:04d}", f"C{i + 1:04d}", f"w{i % 7}") for i in range(0, 1280, 2)]
        for table in ("tie", "edge", "arc", "loop", "hole"):
            db.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", ties + [(y, x, w) for x, y, w in ties])
        db.execute("INSERT INTO edge VALUES ('z9', 'C0000', 'w0')")  # last in either order, no mirror
        db.execute("INSERT INTO arc VALUES ('C0000', 'z9', 'W')")
        db.execute("INSERT INTO loop VALUES ('C0003', 'C0003', 'W')")
        db.execute("INSERT INTO hole VALUES (NULL, 'C0003', 'w1')")
        cities = ["Oslo", "Rome", "Lima", "Kyiv"]
        # A score column mixing 1 and 1.0: one value, two storage classes.
        db.executemany("INSERT INTO person VALUES (?, ?, ?, ?)",
                       [(i, f"P{i:03d}", cities[i % 4], (1, 1.0, 2)[i % 3]) for i in range(1, 61)])
        db.executemany("INSERT INTO place VALUES (?, ?)", [(i, cities[i % 4]) for i in range(1, 41)])
        pairs = [(i, i + 1, 2000 + i) for i in range(1, 50)]
        db.executemany("INSERT INTO friend VALUES (?, ?, ?)", pairs + [(b, a, y) for a, b, y in pairs])
        db.executemany("INSERT INTO link VALUES (?, ?, ?)",
                       [(a, b, "t") for a, b, _ in pairs] + [(b, a, "t") for a, b, _ in pairs])
        db.executemany("INSERT INTO visit VALUES (?, ?, ?, ?, ?)",
                       [(v, p, 4 * (v % 10) + p % 4 or 4, None if v % 3 else (p + 3) % 60 + 1, f"V{v}-{p}")
                        for v, p in ((v, v % 60 + 1) for v in range(1, 121))])


def test_the_fast_paths_find_what_the_general_ones_do(tmp_path):
    plain, collated = tmp_path / "plain.sqlite", tmp_path / "collated.sqlite"
    _made_up(plain, "")
    _made_up(collated, " COLLATE BINARY")  # the same comparisons, the general statements
    fast, general = mine(str(plain)), mine(str(collated))
    assert not fast.unsupported
    assert _comparable(fast) == _comparable(general)
    assert sorted((s.table, s.left, s.right, s.keyed) for s in fast.symmetries) == [
        ("friend", "a", "b", True), ("link", "a", "b", False), ("loop", "x", "y", False), ("tie", "x", "y", False)]
    assert fast.table("arc").column("w").cases == ("lower", "upper")
    assert fast.table("tie").column("w").cases == ("lower",)
    edge = fast.table("edge")
    assert edge.column("x").cases == ("lower", "upper") and edge.column("y").cases == ("upper",)
    assert {frozenset([(p.first.child_columns, p.first_column), (p.second.child_columns, p.second_column)])
            for p in fast.path_copies} == {
        frozenset([(("person_id",), "city"), (("place_id",), "city")]),
        frozenset([(("person_id",), "city"), (("guide_id",), "city")]),
        frozenset([(("place_id",), "city"), (("guide_id",), "city")])}
    score = fast.table("person").column("score")
    assert set(score.types) == {"integer", "real"} and not score.unique and score.formats == ()
    name = fast.table("person").column("name")
    assert name.unique and name.cases == ("upper",) and name.formats == ("text",)


def test_a_column_unique_only_letter_case_apart_repeats_under_its_collation(tmp_path):
    path = tmp_path / "nocase.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE tag (id INTEGER PRIMARY KEY, name TEXT COLLATE NOCASE, code TEXT)")
        db.executemany("INSERT INTO tag VALUES (?, ?, ?)", [(1, "a", "a"), (2, "A", "A"), (3, "b", "b")])
    t = mine(str(path)).table("tag")
    assert not t.column("name").unique and t.column("code").unique
    assert t.column("code").cases == ("lower", "upper")


def test_halves_of_a_child_sum_to_the_whole():
    """Path copies' counts and sums, split over two halves of the child's rowids, are the whole table's."""
    path = str(BIRD / "toxicology" / "toxicology.sqlite")
    connected = mine(path).table("connected")
    sql = 'SELECT count(*), sum(c.atom_id < c.atom_id2), sum(c.bond_id LIKE \'%_1_%\') FROM "connected" AS c'
    with t2sql.Database(path) as db:
        whole = [tuple(r) for r in db.rows(sql)]
        halves = realism_mining._summed(db.rows, lambda sqls: [db.rows(s) for s in sqls], connected, sql)
    assert whole[0][0] == connected.rows and halves == whole


def test_a_mirror_counted_on_half_the_rows_says_what_the_whole_count_does(tmp_path):
    """mirror_sql's `halved` statement (the rows with x < y looked up) equals the rows' count exactly when
    the whole statement's does: every row has its mirror."""
    path = tmp_path / "made_up.sqlite"
    _made_up(path, "")
    with t2sql.Database(str(path)) as db:
        for table, both_ways in (("tie", True), ("loop", True), ("edge", False), ("arc", False), ("hole", False)):
            whole, halved = (db.rows(realism_mining.mirror_sql(table, ["x", "y", "w"], "x", "y", halved=h)[0])[0]
                             for h in (False, True))
            assert whole[:2] == halved[:2], table
            assert (whole[2] == whole[0]) is (halved[2] == halved[0]) is both_ways, (table, whole, halved)


def test_a_partial_unique_index_is_no_key(tmp_path):
    """A unique index with a WHERE keeps apart only the rows it names: the column repeats elsewhere."""
    path = tmp_path / "partial.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE item (id INTEGER PRIMARY KEY, code TEXT, live INTEGER)")
        db.execute("CREATE UNIQUE INDEX live_code ON item (code) WHERE live = 1")
        db.executemany("INSERT INTO item VALUES (?, ?, ?)", [(1, "a", 1), (2, "a", 0), (3, "b", 1)])
    t = mine(str(path)).table("item")
    assert not t.column("code").unique and ("code",) not in t.keys


@pytest.mark.parametrize("value", ["abc", "ABC", "TR000_1", "A\x00b", "\x00a", "a\x00", "\u00e9A\x00b", "\u00e9",
                                   "\u00c9", "\U0001f600z", "[]*?", "", "Z", "\x00"])
def test_letter_cases_are_read_as_the_small_databases_read_them(tmp_path, value):
    """A column's letter cases, as mining counts them (GLOB up to a NUL, the fold past it), are
    smalldb.letter_cases' reading of its values."""
    from t2sql.equivalence.smalldb import letter_cases

    path = tmp_path / "cases.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT, w TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, value, f"{value}{i % 2}") for i in range(4)])
    t = mine(str(path)).table("t")
    want = tuple(k for k in ("lower", "upper") if k in letter_cases(value))
    assert t.column("v").cases == want and t.column("w").cases == want


def test_a_tally_gives_the_grouped_statements_facts(tmp_path):
    """A column's facts from its tally (Database.tally: groups counted in a hash) equal the grouped
    statement's: numbers equal as integer and real, texts by their bytes, blobs, NULs, shapes, cases."""
    from t2sql.equivalence.mining_columns import column_sql, column_stats, tallied_stats, tally_sql

    values = [1, 1.0, 2, 2.5, -0.0, 0, "1", "a", "A", "a", "\x00a", "2024-01-31", "2024-01-31 10:00", "12:30",
              "007", "", "\u00e9", b"a", b"\x00", 9007199254740993, 9007199254740992.0, None, "x" * 300]
    path = tmp_path / "tally.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v, w TEXT COLLATE NOCASE, n INTEGER)")
        db.executemany("INSERT INTO t (v, w, n) VALUES (?, ?, ?)",
                       [(v, v if isinstance(v, str) else None, i % 3) for i, v in enumerate(values * 3)])
    with t2sql.Database(str(path)) as db:
        for c in ("v", "w", "n"):
            tallied = tallied_stats(db.tally(tally_sql("t", c)))
            assert tallied == column_stats(db.rows(column_sql("t", c))), c
        assert db.tally(tally_sql("t", "v"), max_bytes=200) is None
    inv = mine(str(path))
    assert set(inv.table("t").column("v").types) == {"integer", "real", "text", "blob"}
