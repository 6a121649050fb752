"""Stand-ins for BIRD's databases that are not in this repository: for each db_id the shipped task files name, a
small SQLite database with a schema on which every gold query of that db_id prepares and runs (its tables
empty), built from the golds themselves.

How: SQLite is asked to compile each gold (`EXPLAIN`, nothing runs), and what it says is missing is added until
every gold compiles. A column a gold qualifies with one table's alias (`T1.name`) goes on that table up front;
one SQLite names unqualified, or through an alias of a subquery or a CTE, is tried on the tables the gold names
(first the one named with it in most golds) until SQLite's complaint moves on; a guess that makes a gold
ambiguous is taken back (the one whose loss leaves the fewest golds failing) and not made again. Deterministic
(the golds in file order) and fast: about a second for BIRD's 80 databases. Needs SQLite 3.35 (DROP COLUMN).
Used by the end-to-end prepare test (tests/test_prepare_bird.py); BIRD's data is never needed here."""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Iterable

_IDENT = r'(?:`[^`]+`|"[^"]+"|\[[^\]]+\]|[A-Za-z_][A-Za-z0-9_]*)'
# A table a FROM or JOIN names, with its alias when it has one.
_TABLE_REF = re.compile(rf"\b(?:FROM|JOIN)\s+({_IDENT})(?:\s+(?:AS\s+)?({_IDENT}))?", re.I)
_QUALIFIED = re.compile(rf"({_IDENT})\s*\.\s*({_IDENT})")
_USING = re.compile(rf"\bJOIN\s+({_IDENT})(?:\s+(?:AS\s+)?{_IDENT})?\s+USING\s*\(([^)]*)\)", re.I)
_SELECT_STAR = re.compile(rf"\bSELECT\s+\*\s+FROM\s+({_IDENT})", re.I)
# Words the alias pattern would otherwise take for an alias (FROM t WHERE ...).
_NOT_ALIASES = {"on", "where", "join", "inner", "left", "right", "outer", "cross", "natural", "full", "group",
                "order", "limit", "union", "except", "intersect", "using", "having", "window", "as", "select"}
_STEPS_PER_GOLD = 500
_PASSES = 10


def _bare(name: str) -> str:
    return name[1:-1] if name[0] in '`"[' else name


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _references(sql: str) -> tuple[list[str], dict[str, list[str]]]:
    """The table names a gold's FROM and JOIN clauses give, in order, and alias (lower case) -> those names."""
    names: list[str] = []
    aliases: dict[str, list[str]] = defaultdict(list)
    for table, alias in _TABLE_REF.findall(sql):
        names.append(_bare(table))
        if alias and alias.lower() not in _NOT_ALIASES:
            aliases[_bare(alias).lower()].append(_bare(table))
    return names, aliases


class _Schema:
    """One stand-in database's schema as it grows, in memory."""

    def __init__(self, golds: list[str]) -> None:
        self.con = sqlite3.connect(":memory:", cached_statements=0)  # each check compiles afresh
        self.golds = golds
        self.named_by: list[set[str]] = [{n.lower() for n in _references(g)[0]} for g in golds]
        self.guessed: set[tuple[str, str]] = set()  # (table, column), lower case: placed by trial
        self.refused: set[tuple[str, str]] = set()  # guesses taken back: never made again

    def tables(self) -> dict[str, str]:
        return {r[0].lower(): r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def columns(self, table: str) -> list[str]:
        return [r[1] for r in self.con.execute(f"PRAGMA table_info({_quote(table)})")]

    def has(self, table: str, column: str) -> bool:
        return column.lower() in {c.lower() for c in self.columns(table)}

    def add_table(self, table: str) -> None:
        if table.lower() not in self.tables():
            self.con.execute(f"CREATE TABLE {_quote(table)} (stand_in_id INTEGER PRIMARY KEY)")

    def add_column(self, table: str, column: str) -> None:
        if not self.has(table, column):
            self.con.execute(f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(column)}")

    def drop_column(self, table: str, column: str) -> None:
        self.con.execute(f"ALTER TABLE {_quote(table)} DROP COLUMN {_quote(column)}")

    def error(self, sql: str) -> str | None:
        try:
            self.con.execute("EXPLAIN " + sql)
        except sqlite3.Error as e:
            return str(e)
        return None

    def named(self, names: Iterable[str]) -> list[str]:
        tables = self.tables()
        return list(dict.fromkeys(tables[n.lower()] for n in names if n.lower() in tables))

    def seed(self, sql: str) -> None:
        """The tables a gold names and the columns it qualifies with one table's alias (or its name)."""
        names, aliases = _references(sql)
        for name in names:
            self.add_table(name)
        for qualifier, column in _QUALIFIED.findall(sql):
            owners = set(aliases.get(_bare(qualifier).lower(), [])) or {_bare(qualifier)}
            owner = self.named(owners)
            if len(owners) == 1 and len(owner) == 1:
                self.add_column(owner[0], _bare(column))

    def together(self, table: str, column: str) -> int:
        """How many golds name `table` and mention `column`: the likelier home of an unqualified column."""
        word = re.compile(rf"(?<![A-Za-z0-9_]){re.escape(column)}(?![A-Za-z0-9_])", re.I)
        return sum(1 for gold, named in zip(self.golds, self.named_by) if table.lower() in named and word.search(gold))

    def failing(self) -> int:
        return sum(1 for gold in self.golds if self.error(gold) is not None)

    def try_column(self, sql: str, error: str, column: str, candidates: list[str], firm: list[str]) -> bool:
        """Add `column` to the first candidate on which SQLite's complaint about `sql` moves on (to no complaint,
        or another missing name); True when one did."""
        for table in candidates:
            if self.has(table, column) or (table.lower(), column.lower()) in self.refused:
                continue
            self.add_column(table, column)
            after = self.error(sql)
            if after is None or (after != error and after.startswith(("no such", "cannot join using"))):
                if table not in firm:
                    self.guessed.add((table.lower(), column.lower()))
                return True
            self.drop_column(table, column)
        return False

    def join_using(self, sql: str, column: str) -> bool:
        """`JOIN t USING (column)`: the column on t and, when no table named before t has it, on the one just
        before; True when that added something."""
        for m in _USING.finditer(sql):
            if column.lower() not in {_bare(c.strip()).lower() for c in m.group(2).split(",")}:
                continue
            before = self.named(_references(sql[:m.start()])[0])
            right = self.named([_bare(m.group(1))])
            if not (before and right):
                return False
            added = not self.has(right[0], column)
            self.add_column(right[0], column)
            if not any(self.has(t, column) for t in before):
                self.add_column(before[-1], column)
                added = True
            return added
        return False

    def repair(self, sql: str) -> str | None:
        """One step toward `sql` compiling: None when it compiles or a change was made, else SQLite's
        complaint that no step here answers."""
        error = self.error(sql)
        if error is None:
            return None
        names, aliases = _references(sql)
        named = self.named(names)
        if m := re.fullmatch(r"no such table: (?:main\.)?(.+)", error):
            self.add_table(m.group(1))
            return None
        if m := re.fullmatch(r"no such column: (.+)", error):
            qualifier, dot, column = m.group(1).partition(".")
            if not dot:
                qualifier, column = "", qualifier
            firm = self.named(aliases.get(qualifier.lower(), []) + [qualifier]) if qualifier else []
            # Else the table named with it in most golds; on a tie the last one named (the innermost FROM).
            guesses = sorted(named[::-1], key=lambda t: -self.together(t, column))
            order = firm + guesses
            return None if self.try_column(sql, error, column, list(dict.fromkeys(order)), firm) else error
        if m := re.fullmatch(r"cannot join using column (.+) - column not present in both tables", error):
            return None if self.join_using(sql, m.group(1)) else error
        if m := re.fullmatch(r"ambiguous column name: (.+)", error):
            # Take back the guess whose loss leaves the fewest golds failing.
            column = m.group(1).rpartition(".")[2]
            costs = []
            for table in named:
                if (table.lower(), column.lower()) in self.guessed:
                    self.drop_column(table, column)
                    costs.append((self.failing(), -self.together(table, column), table))
                    self.add_column(table, column)
            if costs:
                table = min(costs)[2]
                self.drop_column(table, column)
                self.guessed.discard((table.lower(), column.lower()))
                self.refused.add((table.lower(), column.lower()))
                return None
        if "do not have the same number of result columns" in error:
            # SELECT * of tables a UNION puts together: each takes the others' columns (BIRD's are alike).
            starred = self.named(_bare(t) for t in _SELECT_STAR.findall(sql))
            everyone = list(dict.fromkeys(c for t in starred for c in self.columns(t)))
            if any(len(self.columns(t)) < len(everyone) for t in starred):
                for table in starred:
                    for column in everyone:
                        self.add_column(table, column)
                return None
        return error


def stand_in_schema(golds: list[str]) -> tuple[sqlite3.Connection, dict[str, str]]:
    """An in-memory database on which every gold compiles, and the golds that still do not (gold -> SQLite's
    complaint: none for the shipped task files)."""
    golds = [g.strip().rstrip(";").strip() for g in golds]
    schema = _Schema(golds)
    for gold in golds:
        schema.seed(gold)
    for _ in range(_PASSES):
        before = [(t, tuple(schema.columns(t))) for t in sorted(schema.tables().values())]
        for gold in golds:
            for _ in range(_STEPS_PER_GOLD):
                if schema.error(gold) is None or schema.repair(gold) is not None:
                    break
        if before == [(t, tuple(schema.columns(t))) for t in sorted(schema.tables().values())]:
            break
    left = {gold: error for gold in golds if (error := schema.error(gold))}
    return schema.con, left


def write_stand_in(path: Path, golds: list[str]) -> dict[str, str]:
    """`path` (<db_id>/<db_id>.sqlite in BIRD's layout): a stand-in on which `golds` compile, its tables empty.
    Returns the golds that do not compile, as stand_in_schema."""
    con, left = stand_in_schema(golds)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        disk = sqlite3.connect(path)
        try:
            con.backup(disk)
        finally:
            disk.close()
    finally:
        con.close()
    return left


def write_stand_ins(folder: Path, golds_by_db: dict[str, list[str]]) -> dict[str, Path]:
    """A stand-in for each db_id under `folder` in BIRD's layout: db_id -> its folder. A gold that does not compile
    on its stand-in is an AssertionError naming it (the builder must grow with the task files)."""
    out, left = {}, {}
    for db_id, golds in sorted(golds_by_db.items()):
        left.update({f"{db_id}: {gold[:120]!r}": error
                     for gold, error in write_stand_in(folder / db_id / f"{db_id}.sqlite", golds).items()})
        out[db_id] = folder / db_id
    assert not left, f"golds that do not compile on their stand-in: {left}"
    return out
