"""Path copies over a table stored both ways (t2sql.equivalence.realism_mining): where mining's mirror check
proved every row's mirror a row, the one-pass statement reads only the rows with NOT a > b and adds, on
those with a < b, the terms through the swapped references (a term and its mirror's, summed over every
row, being one number). It finds exactly the path copies the statement over every row finds (that one
forced here by taking the proof away); any table the proof does not cover takes the statement over every
row."""

from __future__ import annotations

import sqlite3

import pytest

from conftest import bird_db
from t2sql.equivalence import mining_reader, realism_mining
from t2sql.equivalence.mining import mine
from t2sql.equivalence.refuting import LEAD_ROWS

GROUPS, PER_GROUP = 20, 10  # nodes in groups; edges join two nodes of a group, stored both ways


def _comparable(inv) -> dict:
    d = inv.to_dict()
    for key in ("path", "mine_s", "schema"):
        d.pop(key)
    return d


def _graph(path, *, broken: str = "", lonely: bool = False, a_type: str = "INTEGER",
           collate: str = "") -> None:
    """Nodes in groups, kinds (two a group), and edges between nodes of a group stored both ways, each
    naming its group's kind: node.grp is a path copy through a, through b and through the kind. `broken`
    ("a" or "b"): one more pair, past the leading rows, stored both ways, whose node on that side of its
    row with a < b is of another group than its kind (the other side agrees: on that row only the one
    reference shows the break, on its mirror only the other). `lonely`: one edge, past the leading rows,
    without its mirror."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE node (id INTEGER PRIMARY KEY, grp INTEGER)")
        db.execute("CREATE TABLE kind (id INTEGER PRIMARY KEY, grp INTEGER)")
        db.execute(f"CREATE TABLE edge (a {a_type} REFERENCES node(id), b INTEGER{collate} REFERENCES node(id), "
                   "k INTEGER REFERENCES kind(id), PRIMARY KEY (a, b))")
        nodes = [(i, i // PER_GROUP) for i in range(GROUPS * PER_GROUP)]
        db.executemany("INSERT INTO node VALUES (?, ?)", nodes)
        db.executemany("INSERT INTO kind VALUES (?, ?)", [(100 + k, k // 2) for k in range(2 * GROUPS)])
        edges = []
        for g in range(GROUPS):
            ids = [i for i, grp in nodes if grp == g]
            edges += [(x, y, 100 + 2 * g + y % 2) for n, x in enumerate(ids) for y in ids[n + 1:]]
        rows = [r for x, y, k in edges for r in ((y, x, k), (x, y, k))]  # each pair's larger end first
        if lonely:
            rows.pop()  # the last pair's second row: the first one's mirror
        rows += [(x, x, 100 + 2 * g) for x, g in nodes[::7]]  # a few loops: their own mirrors
        if broken:
            # Nodes 3 and 4 are of group 0, node 15 of group 1; kind 100 of group 0, kind 102 of group 1.
            x, y, k = (3, 15, 100) if broken == "b" else (4, 15, 102)
            rows += [(x, y, k), (y, x, k)]
        db.executemany("INSERT INTO edge VALUES (?, ?, ?)", rows)
    assert len(rows) > LEAD_ROWS + 2  # the leading rows do not reach the last ones


@pytest.fixture
def halvings(monkeypatch):
    """The answers of realism_mining._halving, by child table, in the order asked."""
    seen: list[tuple[str, object]] = []
    real = realism_mining._halving

    def spy(child, *args):
        got = real(child, *args)
        seen.append((child.name, got))
        return got
    monkeypatch.setattr(realism_mining, "_halving", spy)
    return seen


@pytest.fixture
def statements(monkeypatch):
    """Every statement mining ran."""
    ran: list[str] = []
    real = mining_reader.Reader.rows

    def spy(self, sql, *args, **kwargs):
        ran.append(sql)
        return real(self, sql, *args, **kwargs)
    monkeypatch.setattr(mining_reader.Reader, "rows", spy)
    return ran


def _unproved(path: str, workers: int, monkeypatch) -> dict:
    """The invariants mined with the statement over every row (the proof taken away)."""
    with monkeypatch.context() as m:
        m.setattr(realism_mining, "_halving", lambda *args: None)
        return _comparable(mine(path, workers=workers))


def _grp_copies(inv) -> set:
    return {frozenset([(p.first.parent, p.first.child_columns, p.first_column),
                       (p.second.parent, p.second.child_columns, p.second_column)])
            for p in inv.path_copies if p.first.child == "edge"}


THROUGH_ALL = {frozenset([("node", ("a",), "grp"), ("node", ("b",), "grp")]),
               frozenset([("node", ("a",), "grp"), ("kind", ("k",), "grp")]),
               frozenset([("node", ("b",), "grp"), ("kind", ("k",), "grp")])}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("broken", ["", "a", "b"])
def test_half_the_rows_find_what_every_row_finds(tmp_path, monkeypatch, halvings, statements, workers, broken):
    path = str(tmp_path / "graph.sqlite")
    _graph(path, broken=broken)
    inv = mine(path, workers=workers)
    assert not inv.unsupported
    assert dict(halvings)["edge"] is not None  # the proof held: the halved statement ran
    assert any("NOT (c.\"a\" > c.\"b\")" in s for s in statements)
    assert _comparable(inv) == _unproved(path, workers, monkeypatch)
    # What the data says: every path copy of the groups holds, or none does (the break shows on both
    # sides, through a on one row and through b on its mirror).
    assert _grp_copies(inv) == (set() if broken else THROUGH_ALL)


@pytest.mark.parametrize("made", [dict(lonely=True), dict(a_type="NUMERIC"), dict(collate=" COLLATE BINARY")],
                         ids=["a row without its mirror", "two declared types", "a collation"])
def test_a_table_the_proof_does_not_cover_takes_every_row(tmp_path, monkeypatch, halvings, statements, made):
    path = str(tmp_path / "graph.sqlite")
    _graph(path, **made)
    inv = mine(path, workers=1)
    assert not inv.unsupported
    assert dict(halvings).get("edge") is None
    assert not any("NOT (c." in s for s in statements)
    assert _comparable(inv) == _unproved(path, 1, monkeypatch)
    assert _grp_copies(inv) == THROUGH_ALL


@pytest.mark.parametrize("db_id", ["toxicology", "superhero", "student_club"])
def test_the_bird_databases_keep_their_invariants(monkeypatch, halvings, db_id):
    """The bundled BIRD databases: toxicology's connected holds every bond both ways (the halved statement
    runs), the others take the statement over every row; every invariant is the one it was."""
    path = bird_db(db_id)
    for workers in (1, 2):
        assert _comparable(mine(path, workers=workers)) == _unproved(path, workers, monkeypatch)
    halved = {child for child, got in halvings if got is not None}
    assert halved == ({"connected"} if db_id == "toxicology" else set())
