"""Property test: on random small tables, the core's verdict equals a plain Python reference
over fetchall (list, Counter, set) with the same value rules, for every grading method (multiset,
ordered / list, set, and each subset comparison the core has: t2sql._grader.METHODS) and both column
orders."""

from __future__ import annotations

import math
import operator
import sqlite3
from collections import Counter
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from t2sql import Database, GradeSpec
from t2sql._grader import METHODS, Method

I64 = 2**63

# Each subset comparison, written independently of the core: the prompt's words for it, and whether a
# prediction with `rows` distinct gold rows meets a need of `need` (N capped at the gold's distinct rows).
# A comparison the core gains fails here until it is modelled (test_the_reference_models_...).
SUBSET_COMPARISONS = {
    "=": ("exactly", operator.eq),
    ">=": ("at least", operator.ge),
}
# The core's subset forms ("subset,=,N", ...), each once per comparison it reads.
SUBSET_FORMS = tuple(form for form in METHODS if Method(form.replace("N", "1")).kind == "subset")


def canon(v, digits: int | None):
    """The value rules (docs/grader.md, "How results are compared"), written independently of the Rust code."""
    if v is None:
        return ("null",)
    if isinstance(v, bytes):
        return ("blob", v)
    if isinstance(v, str):
        return ("text", v)
    if isinstance(v, int):
        return ("num", v)
    if math.isnan(v):
        return ("nan",)
    if math.isinf(v):
        return ("inf", v > 0)
    if v.is_integer() and -I64 <= v < I64:
        return ("num", int(v))
    if digits is None:
        return ("real", v)
    rounded = Decimal(f"{v:.{digits - 1}e}")
    if rounded == rounded.to_integral_value() and -I64 <= int(rounded) < I64:
        return ("num", int(rounded))
    return ("dec", rounded.normalize())


def reference(pred_rows, gold_rows, method: str, digits: int | None, column_order: str = "strict") -> bool:
    def row(r):
        cells = tuple(canon(v, digits) for v in r)
        if column_order == "ignore":  # the row as the multiset of its cells
            return tuple(sorted(Counter(cells).items(), key=repr))
        return cells

    p = [row(r) for r in pred_rows]
    g = [row(r) for r in gold_rows]
    if p and g and len(pred_rows[0]) != len(gold_rows[0]):
        return False
    if method in ("ordered", "list"):
        return p == g
    if method == "multiset":
        return Counter(p) == Counter(g)
    if method.startswith("subset"):
        _, op, n = method.split(",")
        if op not in SUBSET_COMPARISONS:
            raise AssertionError(f"the reference does not model {method!r}: add it to SUBSET_COMPARISONS")
        need = min(int(n), len(set(g)))  # a gold with fewer distinct rows than N: all of them
        distinct = set(p)
        if not distinct <= set(g):
            return False
        return SUBSET_COMPARISONS[op][1](len(distinct), need)
    return set(p) == set(g)


floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.integers(-1000, 1000).map(float),  # integral REALs, equal to INTEGERs
    st.integers(-10**6, 10**6).map(lambda i: i / 1000),  # decimal fractions
    st.sampled_from([0.1 + 0.2, 0.3, -0.0, 1e-300, 2.0**63, -(2.0**63), 1e20 + 1.5e5]),
)
cells = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-5, 5),
    floats,
    st.text(max_size=6),
    st.sampled_from(["1", "1.0", "", "a", "A"]),
    st.binary(max_size=4),
)


@st.composite
def pair(draw):
    ncols = draw(st.integers(1, 3))
    row = st.lists(cells, min_size=ncols, max_size=ncols).map(tuple)
    gold = draw(st.lists(row, max_size=8))
    # The prediction is a mutation of the gold, so that matches are common.
    pred = list(gold)
    for op in draw(st.lists(st.sampled_from(["shuffle", "dup", "drop", "change", "int_float", "new", "take",
                                             "swap_columns"]), max_size=3)):
        if op == "shuffle":
            pred = draw(st.permutations(pred))
        elif op == "dup" and pred:
            pred.append(pred[draw(st.integers(0, len(pred) - 1))])
        elif op == "drop" and pred:
            pred.pop(draw(st.integers(0, len(pred) - 1)))
        elif op == "change" and pred:
            i = draw(st.integers(0, len(pred) - 1))
            r = list(pred[i])
            r[draw(st.integers(0, ncols - 1))] = draw(cells)
            pred[i] = tuple(r)
        elif op == "int_float" and pred:
            i = draw(st.integers(0, len(pred) - 1))
            pred[i] = tuple(float(v) if isinstance(v, int) and abs(v) < 2**53 else v for v in pred[i])
        elif op == "new":
            pred.append(draw(row))
        elif op == "take":  # a few gold rows: what a "name any N" answer returns
            pred = draw(st.lists(st.sampled_from(gold), max_size=4)) if gold else pred
        elif op == "swap_columns" and ncols > 1:
            pred = [tuple(reversed(r)) for r in pred]
    pred_ncols = draw(st.sampled_from([ncols, ncols, ncols, ncols + 1]))
    if pred_ncols != ncols:
        pred = [r + (None,) for r in pred]
    return ncols, pred_ncols, gold, pred


def _table(con, name, ncols, rows):
    cols = ", ".join(f"c{i}" for i in range(ncols))  # no declared type: values keep their type
    con.execute(f"CREATE TABLE {name} ({cols})")
    con.executemany(f"INSERT INTO {name} VALUES ({', '.join('?' * ncols)})", rows)


def _stored(tmp_path_factory, case):
    """The case's two tables in a fresh SQLite file: (path, gold SQL, prediction SQL, and the rows as
    SQLite stores them, which is what the reference reads: NaN becomes NULL there, for instance)."""
    ncols, pred_ncols, gold, pred = case
    path = tmp_path_factory.mktemp("prop") / "t.sqlite"
    con = sqlite3.connect(path)
    _table(con, "g", ncols, gold)
    _table(con, "p", pred_ncols, pred)
    con.commit()
    gold_sql = f"SELECT {', '.join(f'c{i}' for i in range(ncols))} FROM g ORDER BY rowid"
    pred_sql = f"SELECT {', '.join(f'c{i}' for i in range(pred_ncols))} FROM p ORDER BY rowid"
    gold_rows = con.execute(gold_sql).fetchall()
    pred_rows = con.execute(pred_sql).fetchall()
    con.close()
    return path, gold_sql, pred_sql, gold_rows, pred_rows


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=pair(), method=st.sampled_from(["multiset", "ordered", "set"]),
       digits=st.sampled_from([None, 12, 6, 15]))
def test_core_agrees_with_python_reference(tmp_path_factory, case, method, digits):
    ncols, pred_ncols, _, _ = case
    path, gold_sql, pred_sql, gold_rows, pred_rows = _stored(tmp_path_factory, case)
    expected = reference(pred_rows, gold_rows, method, digits) and pred_ncols == ncols
    verdict = Database(str(path)).grade(pred_sql, gold_sql,
                                        GradeSpec(method, gold_sql=gold_sql, float_digits=digits))
    assert verdict.outcome in ("match", "mismatch"), verdict
    assert verdict.matched == expected, (verdict, pred_rows, gold_rows)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=pair(),
       method=st.sampled_from(["list", "set", "multiset",
                               *(form.replace("N", str(n)) for form in SUBSET_FORMS for n in (1, 2, 3, 5))]),
       column_order=st.sampled_from(["strict", "ignore"]),
       digits=st.sampled_from([None, 12]))
def test_grading_methods_and_column_order_agree_with_python_reference(tmp_path_factory, case, method,
                                                                     column_order, digits):
    ncols, pred_ncols, _, _ = case
    path, gold_sql, pred_sql, gold_rows, pred_rows = _stored(tmp_path_factory, case)
    expected = reference(pred_rows, gold_rows, method, digits, column_order) and pred_ncols == ncols
    spec = GradeSpec(method, gold_sql=gold_sql, float_digits=digits, column_order=column_order)
    verdict = Database(str(path)).grade(pred_sql, gold_sql, spec)
    assert verdict.outcome in ("match", "mismatch"), verdict
    assert verdict.matched == expected, (verdict, pred_rows, gold_rows)


def test_the_reference_models_every_subset_comparison_of_the_core():
    """The property tests sample every subset form the core lists; each must be modelled above, with the
    words the prompt tells the model (the core's, Method.operator_words) saying what it means."""
    assert SUBSET_FORMS[:2] == ("subset,=,N", "subset,>=,N")
    core = {Method(form.replace("N", "3")).operator: Method(form.replace("N", "3")).operator_words
            for form in SUBSET_FORMS}
    assert core == {op: words for op, (words, _) in SUBSET_COMPARISONS.items()}


def test_ignoring_column_order_keeps_each_cells_count(tmp_path):
    # A row is the multiset of its cells, not the set: (1, 1, 2) is not (1, 2, 2).
    path = tmp_path / "t.sqlite"
    sqlite3.connect(path).close()
    db = Database(str(path))
    gold = "SELECT 1, 1, 2"
    assert db.grade("SELECT 2, 1, 1", gold, GradeSpec(column_order="ignore")).matched
    assert not db.grade("SELECT 1, 2, 2", gold, GradeSpec(column_order="ignore")).matched
    assert not db.grade("SELECT 2, 1, 1", gold).matched  # strict by default
    # Cells stay in their row: the rows {(1,'a'), (2,'b')} are not {(1,'b'), (2,'a')}.
    two = "SELECT 1, 'a' UNION ALL SELECT 2, 'b'"
    assert db.grade("SELECT 'b', 2 UNION ALL SELECT 'a', 1", two, GradeSpec(column_order="ignore")).matched
    assert not db.grade("SELECT 1, 'b' UNION ALL SELECT 2, 'a'", two, GradeSpec(column_order="ignore")).matched
