"""SQL text as tokens, for the scans that read a query without parsing it (repeated tool queries, curriculum hints,
the equivalence check's rewrites): the core's scanner (`t2sql._grader.sql_tokens`), with each token's text and
its parenthesis depth."""

from __future__ import annotations

from typing import NamedTuple

from t2sql._grader import sql_tokens

# The keywords that end a clause of a SELECT: a FROM list, a SELECT list or a WHERE stops at one.
CLAUSE_KEYWORDS = frozenset({"WHERE", "GROUP", "ORDER", "LIMIT", "HAVING", "UNION", "INTERSECT", "EXCEPT", "WINDOW"})


class Token(NamedTuple):
    kind: str  # word | quoted | semicolon | open | close | other
    text: str
    start: int  # character offsets in the query
    end: int
    depth: int  # parentheses open around the token (a parenthesis itself sits at the outer depth)

    @property
    def upper(self) -> str:
        return self.text.upper()


def tokens(sql: str) -> list[Token]:
    out: list[Token] = []
    depth = 0
    for kind, start, end in sql_tokens(sql):
        if kind == "close":
            depth -= 1
        out.append(Token(kind, sql[start:end], start, end, depth))
        if kind == "open":
            depth += 1
    return out
