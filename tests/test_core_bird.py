"""The grading core on real BIRD dev data (tests/data/bird: 432 questions, 3 databases)."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict

import pytest

from conftest import bird_root, tool_limits
from t2sql import Database, GradeSpec, resolve_method

BIRD = bird_root()


@pytest.fixture(scope="module")
def questions() -> list[dict]:
    return json.loads((BIRD / "dev.json").read_text())


@pytest.fixture(scope="module")
def databases(questions) -> dict[str, Database]:
    return {db_id: Database(str(BIRD / db_id / f"{db_id}.sqlite")) for db_id in {q["db_id"] for q in questions}}


def test_all_432_golds_run_hardened_and_match_themselves(questions, databases):
    assert len(questions) == 432
    failures = []
    for q in questions:
        db = databases[q["db_id"]]
        for method in ("multiset", "set", "ordered"):
            v = db.grade(q["SQL"], q["SQL"], GradeSpec(method, gold_sql=q["SQL"], timeout_s=30))
            if v.outcome != "match":
                failures.append((q["question_id"], method, v.outcome, v.detail))
        # The tool path runs every gold too, and counts its rows the same way.
        assert db.run_tool(q["SQL"], tool_limits(timeout_s=30, count_cap=10**9)).row_count == db.count_rows(q["SQL"])
    assert failures == []


def _plain(sql: str) -> str:
    return sql.strip().rstrip(";").strip()


def _columns(con: sqlite3.Connection, sql: str) -> int:
    return len(con.execute(f"SELECT * FROM ({sql}) LIMIT 0").description)


def derived_pairs(gold: str, ncols: int) -> dict[str, str]:
    """Predictions derived from a gold query: some equal under the set method, some not."""
    g = _plain(gold)
    names = [f"c{i}" for i in range(ncols)]
    cte = f"WITH g({', '.join(names)}) AS ({g})"
    pairs = {
        "distinct": f"SELECT DISTINCT * FROM ({g})",
        "duplicated": f"SELECT * FROM ({g}) UNION ALL SELECT * FROM ({g})",
        "dropped_row": f"SELECT * FROM ({g}) LIMIT (SELECT count(*) FROM ({g})) - 1",
        "ordered_desc": f"SELECT * FROM ({g}) ORDER BY 1 DESC",
        "cast_text": f"{cte} SELECT CAST(c0 AS TEXT){''.join(', ' + n for n in names[1:])} FROM g",
        "cast_real": f"{cte} SELECT CAST(c0 AS REAL){''.join(', ' + n for n in names[1:])} FROM g",
        "extra_column": f"{cte} SELECT *, 1 FROM g",
    }
    if ncols >= 2:
        swapped = [names[1], names[0], *names[2:]]
        pairs["swapped"] = f"{cte} SELECT {', '.join(swapped)} FROM g"
    return pairs


def test_set_method_with_exact_floats_agrees_with_birds_rule(questions, databases):
    """BIRD's own metric is set(pred) == set(gold) over fetchall; ours must agree on every pair."""
    agreements = defaultdict(int)
    disagreements = []
    by_kind_equal = defaultdict(int)
    for q in questions:
        con = sqlite3.connect(f"file:{BIRD / q['db_id'] / (q['db_id'] + '.sqlite')}?mode=ro", uri=True)
        gold_rows = set(con.execute(q["SQL"]).fetchall())
        for kind, pred in derived_pairs(q["SQL"], _columns(con, _plain(q["SQL"]))).items():
            expected = set(con.execute(pred).fetchall()) == gold_rows
            v = databases[q["db_id"]].grade(pred, q["SQL"], GradeSpec("set", gold_sql=q["SQL"], float_digits=None))
            assert v.outcome in ("match", "mismatch"), (q["question_id"], kind, v)
            if v.matched == expected:
                agreements[kind] += 1
                by_kind_equal[kind] += expected
            else:
                disagreements.append((q["question_id"], kind, expected, v.outcome, v.detail))
        con.close()
    assert disagreements == []
    # The derivations exercise both answers: set-equal ones and set-different ones.
    assert by_kind_equal["distinct"] == agreements["distinct"]  # DISTINCT never changes a set
    assert by_kind_equal["duplicated"] == agreements["duplicated"]
    assert by_kind_equal["extra_column"] == 0
    # Dropping a row keeps the set only where that row had a duplicate.
    assert 0 < by_kind_equal["dropped_row"] < agreements["dropped_row"]
    assert 0 < by_kind_equal["cast_text"] < agreements["cast_text"]


def test_multiset_counts_what_set_ignores(questions, databases):
    seen_dup_mismatch = 0
    for q in questions[:150]:
        db = databases[q["db_id"]]
        g = _plain(q["SQL"])
        dup = f"SELECT * FROM ({g}) UNION ALL SELECT * FROM ({g})"
        assert db.grade(dup, q["SQL"], GradeSpec("set", gold_sql=q["SQL"])).outcome == "match"
        v = db.grade(dup, q["SQL"], GradeSpec("multiset", gold_sql=q["SQL"]))
        assert v.outcome == "mismatch"
        seen_dup_mismatch += 1
    assert seen_dup_mismatch == 150


def test_auto_method_follows_the_golds_outer_order_by(questions, databases):
    ordered = [q for q in questions if "ORDER BY" in q["SQL"].upper() and "LIMIT" not in q["SQL"].upper()]
    checked = 0
    for q in ordered:
        db = databases[q["db_id"]]
        g = _plain(q["SQL"])
        if resolve_method(g, "auto") != "ordered" or db.count_rows(g) < 2:
            continue
        # The gold's own rows as literals in reverse: same multiset, other order.
        rows = db.run_tool(g, tool_limits(timeout_s=30, max_rows=10**6, count_cap=10**9)).rows
        if len(set(rows)) < 2:
            continue
        values = " UNION ALL ".join(
            "SELECT " + ", ".join(_literal(v) for v in row) for row in reversed(rows)
        )
        assert db.grade(values, g, GradeSpec("auto", gold_sql=g)).outcome == "mismatch"
        assert db.grade(values, g, GradeSpec("multiset", gold_sql=g)).outcome == "match"
        checked += 1
        if checked >= 5:
            break
    assert checked >= 1


def _literal(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


def _reference(pred_rows, gold_rows, method: str, column_order: str) -> bool:
    """Plain Python over fetchall (exact floats; Python's 1 == 1.0 is the core's too)."""
    def row(r):
        return tuple(sorted(r, key=repr)) if column_order == "ignore" else tuple(r)

    p, g = [row(r) for r in pred_rows], [row(r) for r in gold_rows]
    if pred_rows and gold_rows and len(pred_rows[0]) != len(gold_rows[0]):
        return False
    if method == "list":
        return p == g
    if method == "multiset":
        return Counter(p) == Counter(g)
    _, op, n = method.split(",")
    need = min(int(n), len(set(g)))
    distinct = set(p)
    return distinct <= set(g) and (len(distinct) == need if op == "=" else len(distinct) >= need)


METHOD_PAIRS = {
    # kind of derived prediction -> the methods it is graded under
    "list": ["self", "ordered_desc", "duplicated", "dropped_row"],
    "subset,=,3": ["take_3", "take_2", "take_4", "distinct", "extra_column", "cast_text"],
    "subset,>=,2": ["take_3", "take_2", "take_1", "duplicated", "cast_real"],
}


def test_bird_dev_pairs_under_each_grading_method_agree_with_python(questions, databases):
    disagreements = []
    matched = defaultdict(int)
    every_other = questions[::2]  # 216 questions of the three databases: enough, and half the time
    for q in every_other:
        con = sqlite3.connect(f"file:{BIRD / q['db_id'] / (q['db_id'] + '.sqlite')}?mode=ro", uri=True)
        g = _plain(q["SQL"])
        pairs = derived_pairs(q["SQL"], _columns(con, g))
        pairs["self"] = g
        for n in (1, 2, 3, 4):
            pairs[f"take_{n}"] = f"SELECT DISTINCT * FROM ({g}) LIMIT {n}"
        gold_rows = con.execute(g).fetchall()
        graded = [(m, kind) for m, kinds in METHOD_PAIRS.items() for kind in kinds]
        if "swapped" in pairs:
            graded += [("multiset-ignore", "swapped")]
        for method, kind in graded:
            column_order = "ignore" if method.endswith("-ignore") else "strict"
            method = method.removesuffix("-ignore")
            pred = pairs[kind]
            expected = _reference(con.execute(pred).fetchall(), gold_rows, method, column_order)
            spec = GradeSpec(method, gold_sql=q["SQL"], float_digits=None, column_order=column_order)
            v = databases[q["db_id"]].grade(pred, q["SQL"], spec)
            assert v.outcome in ("match", "mismatch"), (q["question_id"], method, kind, v)
            if v.matched != expected:
                disagreements.append((q["question_id"], method, kind, expected, v.detail))
            matched[(method, kind)] += v.matched
        con.close()
    assert disagreements == []
    # Both answers occur: the derivations make matches and mismatches under each method.
    assert matched[("list", "self")] == len(every_other)
    assert 0 < matched[("list", "ordered_desc")] < len(every_other)
    assert 0 < matched[("subset,=,3", "take_3")] and matched[("subset,=,3", "extra_column")] == 0
    assert 0 < matched[("subset,>=,2", "take_1")] < matched[("subset,>=,2", "take_3")]
    assert matched[("multiset", "swapped")] > 0
