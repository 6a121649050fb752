"""t2sql.jsonl: one bad line is one problem, memory stays bounded, what we write is JSON."""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest

from t2sql import jsonl


def lines(data: bytes, **kw) -> list[jsonl.JsonLine]:
    return list(jsonl.json_lines(io.BytesIO(data), **kw))


def test_good_lines_and_blank_lines():
    got = lines(b'{"a": 1}\n\n  \n[1, 2.5]\n"last"')
    assert [(x.number, x.value, x.problem) for x in got] == [(1, {"a": 1}, ""), (4, [1, 2.5], ""), (5, "last", "")]


@pytest.mark.parametrize("raw, says", [
    (b'{"id": NaN}', "NaN is not a JSON number"),
    (b'{"id": Infinity}', "Infinity is not a JSON number"),
    (b'{"id": -Infinity}', "-Infinity is not a JSON number"),
    (b'{"id": 1e999}', "too large for a float"),
    (b'{"id": ' + b"7" * 5000 + b"}", "an integer of 5,000 digits"),
    (b'{"db_id": "\\ud800"}', "lone surrogate"),
    (b'{"\\udfff": 1}', "lone surrogate"),
    (b"[" * 1500 + b"]" * 1500, "nested deeper"),
    (b"[" * 65 + b"]" * 65, "nested deeper than 64"),
    (b'{"a": \xff}', "not UTF-8"),
    (b'{"a": ', "not JSON"),
])
def test_each_bad_line_is_one_problem(raw, says):
    got = lines(b'{"ok": 1}\n' + raw + b'\n{"ok": 2}\n')
    assert [x.value for x in got] == [{"ok": 1}, None, {"ok": 2}]
    assert says in got[1].problem and got[1].number == 2


def test_valid_surrogate_pair_and_depth_at_the_limit_are_read():
    assert jsonl.loads('"\\ud83d\\ude00"') == "\U0001F600"
    assert jsonl.loads("[" * 64 + "]" * 64) is not None


def test_an_overlong_line_is_skipped_in_bounded_memory():
    big = b'{"x": "' + b"a" * (8 << 20) + b'"}'
    data = b'{"ok": 1}\n' + big + b'\n{"ok": 2}\n' + big  # the last one without a newline
    tracemalloc.start()
    got = lines(data, max_line_bytes=1 << 20)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [(x.number, x.value) for x in got] == [(1, {"ok": 1}), (2, None), (3, {"ok": 2}), (4, None)]
    assert "longer than 1,048,576 bytes" in got[1].problem
    assert peak < 4 << 20  # a couple of chunks, never the 8 MiB line


def test_load_file_refuses_an_oversized_file_unread(tmp_path):
    path = tmp_path / "q.json"
    path.write_text(json.dumps([{"a": 1}] * 100))
    assert jsonl.load_file(path, max_bytes=10_000) == [{"a": 1}] * 100
    with pytest.raises(jsonl.JsonProblem, match="above the 100 this reads"):
        jsonl.load_file(path, max_bytes=100)
    path.write_text('[{"a": NaN}]')
    with pytest.raises(jsonl.JsonProblem, match="q.json: NaN"):
        jsonl.load_file(path, max_bytes=100)


def test_dumps_never_writes_non_finite_numbers():
    text = jsonl.dumps({"a": float("nan"), "b": [float("inf"), 1.5], "c": "x"})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": "x"}
    assert jsonl.dumps({"a": 1}) == json.dumps({"a": 1})


def test_a_json_array_is_judged_item_by_item():
    text = (b'[{"ok": 1}, {"id": NaN}, {"id": 1e999}, {"id": ' + b"1" * 5000 + b'}, ' + b"[" * 70 + b"]" * 70
            + b', "\\ud800", {"ok": 2}]')
    got = jsonl.load_array(text)
    assert [x.value for x in got] == [{"ok": 1}, None, None, None, None, None, {"ok": 2}]
    problems = [x.problem for x in got[1:6]]
    for problem, says in zip(problems, ("NaN is not", "too large for a float", "5,000 digits", "nested deeper",
                                        "lone surrogate")):
        assert says in problem
    assert jsonl.load_array("[]") == []
    for whole, says in (("{}", "not a JSON array"), ("[1,", "not JSON"), ("[" * 1500 + "]" * 1500, "nested deeper")):
        with pytest.raises(jsonl.JsonProblem, match=says):
            jsonl.load_array(whole)


@pytest.mark.parametrize("row, says", [
    ([1], "not a JSON object"),
    ({"id": 1, "pred": "SELECT 1"}, "missing ['gold']"),
    ({"id": 1, "pred": None, "gold": "SELECT 1"}, "not strings: ['pred']"),
    ({"id": 1, "pred": "SELECT 1", "gold": "SELECT 1", "evidence": 3}, "not strings: ['evidence']"),
    ({"id": 1, "pred": "SELECT 1", "gold": "SELECT 1", "evidence": None}, ""),
])
def test_object_problem_names_what_keeps_a_line_from_being_a_record(row, says):
    # id may be any JSON value, SQL must be text, evidence may be null: the pairs file's rule.
    assert jsonl.object_problem(row, ("id", "pred", "gold"), ("pred", "gold", "evidence"), ("evidence",)) == says
