"""t2sql.sqltext: the core's SQL scanner as Python tokens, the one split every SQL scan uses."""

from t2sql import sqltext
from t2sql.episode.guards import normalize_sql


def test_tokens_carry_text_character_offsets_and_depth():
    sql = "SELECT 'café; -- no', \"ü\" FROM (SELECT x FROM t) -- a comment\nWHERE a=1;"
    toks = sqltext.tokens(sql)
    assert [t.text for t in toks] == ["SELECT", "'café; -- no'", ",", '"ü"', "FROM", "(", "SELECT", "x", "FROM",
                                      "t", ")", "WHERE", "a", "=", "1", ";"]
    assert all(sql[t.start:t.end] == t.text for t in toks)  # offsets are characters, not bytes
    assert [t.depth for t in toks if t.upper in ("SELECT", "FROM")] == [0, 0, 1, 1]
    assert [t.depth for t in toks if t.kind in ("open", "close")] == [0, 0]
    assert [t.kind for t in toks][-1] == "semicolon"


def test_repeated_queries_compare_without_comments_or_spacing_but_keep_string_case():
    assert normalize_sql("SELECT  a\nFROM t -- first try\n;") == normalize_sql("select a from t")
    assert normalize_sql("SELECT a FROM t WHERE n = 'Bob'") != normalize_sql("SELECT a FROM t WHERE n = 'bob'")
