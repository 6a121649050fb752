"""The core's value classes: ToolLimits (what a tool call may show), GradeSpec (how a prediction is
graded, its method resolved once by the core) and ToolResult. Each is checked when it is built, with the
messages the per-argument calls give; each is frozen, compares and hashes by value, and pickles (they
cross process boundaries, so the tests send them through a real spawned interpreter too). METHODS and
COLUMN_ORDERS are the core's one list of the names its parsers read."""

from __future__ import annotations

import copy
import multiprocessing
import pickle

import pytest

import t2sql
from conftest import tool_limits
from t2sql import Database, GradeSpec, InvalidArgument, ToolLimits, ToolResult
from t2sql._grader import COLUMN_ORDERS, GRADE_DEFAULTS, MAX_FLOAT_DIGITS, METHODS
from t2sql.tasks import sample_dir

SUPERHERO = str(sample_dir() / "superhero" / "superhero.sqlite")
U64 = "from 0 to 18446744073709551615"
LIMIT_NAMES = ("max_rows", "max_cell_chars", "max_chars", "count_cap")


def refused(call) -> str:
    with pytest.raises(InvalidArgument) as info:
        call()
    assert isinstance(info.value, ValueError) and isinstance(info.value, t2sql.T2sqlError)
    return str(info.value)


def round_trips(value) -> None:
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(value, protocol))
        assert back == value and type(back) is type(value) and repr(back) == repr(value), protocol
    assert copy.copy(value) == value and copy.deepcopy(value) == value


# ---------------------------------------------------------------------------------------------- ToolLimits


def test_tool_limits_take_the_whole_preview_from_the_caller():
    # The core owns no preview (the preset does, issue 38): each of its numbers is the caller's, and only the
    # temporary-disk cap defaults, to the core's own.
    given = ToolLimits(timeout_s=2, max_rows=3, max_cell_chars=4, max_chars=5, count_cap=6, max_temp_mb=7)
    assert [getattr(given, k) for k in ("timeout_s", *LIMIT_NAMES, "max_temp_mb")] == [2.0, 3, 4, 5, 6, 7]
    assert isinstance(given.timeout_s, float) and all(isinstance(getattr(given, k), int) for k in LIMIT_NAMES)
    preview = {"timeout_s": 2.0, "max_rows": 3, "max_cell_chars": 4, "max_chars": 5, "count_cap": 6}
    assert ToolLimits(**preview).max_temp_mb == GRADE_DEFAULTS["max_temp_mb"]
    for name in preview:
        with pytest.raises(TypeError, match=name):
            ToolLimits(**{k: v for k, v in preview.items() if k != name})
    assert not hasattr(t2sql._grader, "TOOL_DEFAULTS")
    with pytest.raises(TypeError):
        ToolLimits(10.0)  # keyword-only: a positional number says nothing about which limit it is
    with pytest.raises(TypeError):
        ToolLimits(max_row=3)


@pytest.mark.parametrize("name", LIMIT_NAMES)
def test_tool_limits_refuse_what_a_tool_call_refuses(name):
    assert refused(lambda: tool_limits(**{name: -1})) == f"{name} must be an integer {U64}, got -1"
    assert refused(lambda: tool_limits(**{name: 2**64})) == f"{name} must be an integer {U64}, got {2**64}"
    assert refused(lambda: tool_limits(**{name: 10**5000})).endswith("got an integer of 16610 bits")
    assert getattr(tool_limits(**{name: 0}), name) == 0  # in range: taken as given (floors apply when it runs)


@pytest.mark.parametrize("make", [lambda mb: tool_limits(max_temp_mb=mb), lambda mb: GradeSpec(max_temp_mb=mb)],
                         ids=["ToolLimits", "GradeSpec"])
def test_the_temporary_disk_cap_is_a_whole_number_of_mib_from_1(make):
    top = 2**64 // 2**20 - 1  # the largest cap whose bytes fit in 64 bits
    assert make(1).max_temp_mb == 1 and make(top).max_temp_mb == top
    for bad in (0, -1, top + 1):
        assert refused(lambda: make(bad)) == f"max_temp_mb must be an integer from 1 to {top}, got {bad}"
    assert make(8) != make(9) and hash(make(8)) == hash(make(8))
    round_trips(make(8))


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), 10**400],
                         ids=["0", "-1", "nan", "inf", "10**400"])
def test_tool_limits_timeouts_are_positive_seconds(value):
    message = refused(lambda: tool_limits(timeout_s=value))
    assert message.startswith("timeout_s must be a positive"), message
    assert refused(lambda: tool_limits(timeout_s=0)) == "timeout_s must be a positive number of seconds, got 0"


def test_tool_limits_are_frozen_values():
    a, b = tool_limits(max_rows=7), tool_limits(max_rows=7)
    assert a == b and hash(a) == hash(b) and len({a, b, tool_limits()}) == 2
    assert a != tool_limits(max_rows=8) and a != tool_limits(max_rows=7, timeout_s=9.5)
    assert a != (7,) and (a == "ToolLimits") is False
    with pytest.raises(AttributeError):
        a.max_rows = 9
    assert repr(ToolLimits(timeout_s=0.25, max_rows=1, max_cell_chars=2, max_chars=3, count_cap=4, max_temp_mb=5)) == (
        "ToolLimits(timeout_s=0.25, max_rows=1, max_cell_chars=2, max_chars=3, count_cap=4, max_temp_mb=5)")
    assert eval(repr(a), {"ToolLimits": ToolLimits}) == a
    round_trips(a)
    round_trips(tool_limits(timeout_s=1e-7, count_cap=2**64 - 1))


def test_a_tool_call_runs_under_one_limits_value():
    db = Database(SUPERHERO)
    wide = "SELECT id, superhero_name FROM superhero ORDER BY id"
    recipe = db.run_tool(wide, t2sql.get_preset().tool_limits)
    assert len(recipe.rows) == t2sql.get_preset().tool.max_rows  # the preset's preview, whole
    for no_limits in ((), (None,)):
        with pytest.raises(TypeError):
            db.run_tool(wide, *no_limits)  # the core has no preview of its own
    few = db.run_tool(wide, tool_limits(max_rows=3, count_cap=10))
    assert len(few.rows) == 3 and few.row_count == 10 and few.row_count_capped
    with pytest.raises(t2sql.QueryTimeout, match="after 0.2s"):
        db.run_tool("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                    tool_limits(timeout_s=0.2))
    with pytest.raises(TypeError):
        db.run_tool(wide, 10)  # a bare number is not limits
    # The floors apply when a call runs, as they always did: a preview of at least 16 characters, a count of 1.
    assert db.run_tool(wide, tool_limits(max_chars=0)).text == db.run_tool(wide, tool_limits(max_chars=16)).text
    assert db.run_tool(wide, tool_limits(count_cap=0)).text == db.run_tool(wide, tool_limits(count_cap=1)).text


# ---------------------------------------------------------------------------------------------- GradeSpec


def test_grade_spec_defaults_are_the_cores():
    spec = GradeSpec()
    d = GRADE_DEFAULTS
    assert (spec.method, spec.float_digits, spec.column_order, spec.timeout_s, spec.max_temp_mb) == (
        "multiset", d["float_digits"], "strict", d["timeout_s"], d["max_temp_mb"])
    assert GRADE_DEFAULTS["max_temp_mb"] == 1024
    exact = GradeSpec("set", float_digits=None, column_order="ignore", timeout_s=2)
    assert (exact.method, exact.float_digits, exact.column_order, exact.timeout_s) == ("set", None, "ignore", 2.0)
    with pytest.raises(TypeError):
        GradeSpec("set", None)  # everything after the method is keyword-only


@pytest.mark.parametrize(("given", "canonical"), [
    ("multiset", "multiset"), (" MultiSet ", "multiset"), ("list", "ordered"), ("ORDERED", "ordered"),
    ("set", "set"), ("subset, = ,5", "subset,=,5"), ("subset,==,2", "subset,=,2"), ("Subset,>=,10", "subset,>=,10"),
])
def test_grade_spec_reads_a_method_once_into_its_canonical_name(given, canonical):
    spec = GradeSpec(given)
    assert spec.method == canonical == t2sql.resolve_method("SELECT 1", given)
    assert GradeSpec(canonical) == spec


def test_auto_is_resolved_against_the_gold_at_construction():
    assert GradeSpec("auto", gold_sql="SELECT id FROM superhero ORDER BY id").method == "ordered"
    assert GradeSpec(" AUTO ", gold_sql="SELECT id FROM (SELECT id FROM superhero ORDER BY id)").method == "multiset"
    assert GradeSpec("auto", gold_sql=b"SELECT 1 ORDER BY 1").method == "ordered"
    message = refused(lambda: GradeSpec("auto"))
    assert "auto" in message and "needs the gold SQL" in message and "gold_sql" in message
    # The gold only resolves auto: a named method does not look at it.
    assert GradeSpec("set", gold_sql="SELECT 1 ORDER BY 1").method == "set"
    with pytest.raises(TypeError, match="SQL must be str"):
        GradeSpec("auto", gold_sql=3)


@pytest.mark.parametrize("name", ["bag", "subset,", "subset,<,3", "subset,=,0", ""])
def test_an_unreadable_method_says_what_resolve_method_says(name):
    with pytest.raises(InvalidArgument) as today:
        t2sql.resolve_method("SELECT 1", name)
    assert refused(lambda: GradeSpec(name)) == str(today.value)
    assert refused(lambda: GradeSpec(name, gold_sql="SELECT 1")) == str(today.value)


def test_grade_spec_refuses_what_a_grade_refuses():
    """t2sql.grade takes the spec's parts as arguments and says what GradeSpec says."""
    db = Database(SUPERHERO)
    gold = "SELECT id FROM superhero LIMIT 1"
    for digits in (-1, 0, MAX_FLOAT_DIGITS + 1, 2**70):
        message = refused(lambda: GradeSpec(float_digits=digits))
        assert message == (f"float_digits must be an integer from 1 to {MAX_FLOAT_DIGITS}, or None (exact), "
                           f"got {digits}")
        assert message == refused(lambda: t2sql.grade(db, gold, gold, float_digits=digits))
    message = refused(lambda: GradeSpec(column_order="sideways"))
    assert message == 'column_order must be "strict" or "ignore", got "sideways"'
    assert message == refused(lambda: t2sql.grade(db, gold, gold, column_order="sideways"))
    for timeout in (0, -1.5, float("nan"), 10**400):
        message = refused(lambda: GradeSpec(timeout_s=timeout))
        assert message.startswith("timeout_s must be a positive") and message == refused(
            lambda: t2sql.grade(db, gold, gold, timeout_s=timeout))
    # The method is checked first, as a grade checks it.
    assert "unknown grading method" in refused(lambda: GradeSpec("bag", float_digits=0, timeout_s=0))


def test_grade_specs_are_frozen_values():
    a = GradeSpec("subset,>=,3", float_digits=None, column_order="ignore", timeout_s=7.5)
    b = GradeSpec(" subset , >= , 3 ", float_digits=None, column_order="IGNORE", timeout_s=7.5)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, GradeSpec(), GradeSpec("multiset")}) == 2
    assert a != GradeSpec("subset,>=,3", column_order="ignore", timeout_s=7.5)  # digits differ
    assert GradeSpec("list") == GradeSpec("auto", gold_sql="SELECT 1 ORDER BY 1")  # both resolved to ordered
    assert (GradeSpec() == "multiset") is False
    with pytest.raises(AttributeError):
        a.method = "set"
    assert repr(a) == ("GradeSpec(\"subset,>=,3\", float_digits=None, column_order=\"ignore\", timeout_s=7.5, "
                       "max_temp_mb=1024)")
    assert eval(repr(a), {"GradeSpec": GradeSpec}) == a
    for spec in (a, GradeSpec(), GradeSpec("auto", gold_sql="SELECT 1 ORDER BY 1"), GradeSpec("subset,=,5")):
        round_trips(spec)


# ---------------------------------------------------------------------------------------------- the names


def test_methods_and_column_orders_are_what_the_parsers_read():
    # The forms as they have always been listed; a subset comparison the core gains comes after them.
    assert METHODS[:5] == ("multiset", "ordered", "set", "subset,=,N", "subset,>=,N") and METHODS[-1] == "auto"
    assert all(form.startswith("subset,") and form.endswith(",N") for form in METHODS[3:-1])
    assert len(set(METHODS)) == len(METHODS)
    assert COLUMN_ORDERS == ("strict", "ignore")
    for form in METHODS:
        named = form.replace("N", "4")
        spec = GradeSpec(named, gold_sql="SELECT 1")
        if form != "auto":
            assert spec.method == named  # each form is its own canonical name
        assert spec.method.replace("4", "N") in METHODS
    # Every name the method parser reads lands on one of the forms.
    for alias in ("list", "LIST", "subset,==,4", " set "):
        assert GradeSpec(alias).method.replace("4", "N") in METHODS
    db = Database(SUPERHERO)
    for order in COLUMN_ORDERS:
        assert GradeSpec(column_order=order).column_order == order
        assert db.grade("SELECT 1", "SELECT 1", GradeSpec(column_order=order)).matched
    assert all(name in refused(lambda: GradeSpec(column_order="both")) for name in COLUMN_ORDERS)


def test_a_methods_name_is_read_by_the_core_before_any_gold():
    """What a task file or a flag names (check_method, task_method) is read by the core, "auto" kept
    for the spec to resolve against the gold; an unreadable one says what GradeSpec says."""
    from t2sql._grader import method_name
    from t2sql.grading import check_method

    names = [method_name(m) for m in (" List ", " Subset, =,5", "AUTO", "set", " multiset", "subset")]
    assert names == ["ordered", "subset,=,5", "auto", "set", "multiset", "subset,>=,1"]
    assert check_method(" List ") == "ordered" and check_method("Auto") == "auto"
    # A bare subset (BIRD-Verified's 1104 and 1105) is subset,>=,1: on a one-row gold, set's verdict.
    assert GradeSpec("subset") == GradeSpec("subset,>=,1") and GradeSpec(" multiset") == GradeSpec()
    db = Database(SUPERHERO)
    gold = "SELECT MIN(height_cm) FROM superhero"
    for pred in (gold, "SELECT MIN(height_cm) FROM superhero WHERE id > 1",
                 "SELECT height_cm FROM superhero WHERE height_cm IS NOT NULL",
                 "SELECT MIN(height_cm), 1 FROM superhero"):
        bare, as_set = (db.grade(pred, gold, GradeSpec(m, gold_sql=gold)) for m in ("subset", "set"))
        assert (bare.outcome, bare.method) == (as_set.outcome, "subset,>=,1"), pred
    for bad in ("subset,<,3", "bag"):
        assert refused(lambda: method_name(bad)) == refused(lambda: GradeSpec(bad))


def test_grade_takes_the_method_as_method_only():
    db = Database(SUPERHERO)
    gold, pred = "SELECT id FROM superhero ORDER BY id LIMIT 3", "SELECT id FROM superhero ORDER BY id DESC LIMIT 3"
    assert t2sql.grade(db, pred, pred, "list").outcome == "match"
    for call in (lambda: t2sql.grade(db, pred, gold, "list"), lambda: t2sql.grade(db, pred, gold, method="list")):
        verdict = call()
        assert (verdict.outcome, verdict.method) == ("mismatch", "ordered")
    with pytest.raises(TypeError, match="semantics"):  # the pre-release name is gone, not an alias
        t2sql.grade(db, pred, gold, semantics="list")


@pytest.mark.parametrize(("given", "kind", "operator", "count"), [
    (" List ", "ordered", None, None), ("MULTISET", "multiset", None, None), ("set", "set", None, None),
    (" Auto ", "auto", None, None), ("subset,==,2", "subset", "=", 2), (" Subset , = , 5", "subset", "=", 5),
    ("subset,>=,10", "subset", ">=", 10),
])
def test_a_method_is_parsed_once_into_its_parts(given, kind, operator, count):
    """t2sql._grader.Method: the parser every grade uses, its parts for the layers above (the prompt)."""
    from t2sql._grader import Method, method_name

    method = Method(given)
    assert (method.kind, method.operator, method.count) == (kind, operator, count)
    assert method.operator_words == {None: None, "=": "exactly", ">=": "at least"}[operator]
    assert method.name == str(method) == method_name(given)
    if kind != "auto":
        assert GradeSpec(given).method == method.name  # graded as the parts say
    assert method == Method(method.name) and hash(method) == hash(Method(method.name))
    round_trips(method)
    with pytest.raises(AttributeError):
        method.kind = "set"


@pytest.mark.parametrize("name", ["bag", "subset,", "subset,<,3", "subset,=,0", ""])
def test_an_unreadable_method_is_refused_as_a_grade_refuses_it(name):
    from t2sql._grader import Method

    assert refused(lambda: Method(name)) == refused(lambda: GradeSpec(name))


def test_a_refusal_lists_what_the_core_reads():
    """The messages are written from the core's table: every subset comparison, every form."""
    from t2sql._grader import Method

    subsets = [form for form in METHODS if form.startswith("subset,")]
    unknown = refused(lambda: Method("bag"))
    assert unknown.endswith("use multiset, set, ordered (list), " + ", ".join(subsets[:-1]) + f" or {subsets[-1]}")
    symbols = [form.split(",")[1] for form in subsets]
    assert refused(lambda: Method("subset,<,3")).endswith(
        "the comparison must be " + ", ".join(symbols[:-1]) + f" or {symbols[-1]}")


# ---------------------------------------------------------------------------------------------- ToolResult


def test_a_tool_result_pickles_as_itself():
    db = Database(SUPERHERO)
    result = db.run_tool("SELECT id, superhero_name, NULL, x'00ff', 1.5 FROM superhero ORDER BY id LIMIT 3",
                         tool_limits())
    round_trips(result)
    back = pickle.loads(pickle.dumps(result))
    assert isinstance(back, ToolResult) and back.rows == result.rows and back.text == result.text
    assert back.rows[0][3] == b"\x00\xff" and back.columns == result.columns
    other = db.run_tool("SELECT 1", tool_limits())
    assert result != other and (result == "text") is False


def _in_a_child(values, db_path: str, sql: str):
    """Runs in a spawned interpreter: the values arrived by pickle; they go back with a fresh tool result."""
    return values, [repr(v) for v in values], Database(db_path).run_tool(sql, tool_limits())


def test_the_values_cross_a_real_process_boundary():
    values = [tool_limits(timeout_s=3.5, max_rows=2), GradeSpec("auto", gold_sql="SELECT 1 ORDER BY 1"),
              GradeSpec("subset,=,2", float_digits=None, column_order="ignore")]
    sql = "SELECT superhero_name FROM superhero ORDER BY id LIMIT 4"
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        back, reprs, result = pool.apply(_in_a_child, (values, SUPERHERO, sql))
    assert back == values and reprs == [repr(v) for v in values]
    here = Database(SUPERHERO).run_tool(sql, tool_limits())
    assert isinstance(result, ToolResult)
    assert (result.columns, result.rows, result.row_count, result.text) == (here.columns, here.rows, here.row_count,
                                                                            here.text)
