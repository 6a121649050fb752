"""One flag name per idea across every command (issue 27): `--preset`, `--concurrency`, `--timeout-s`,
`--method`. The old spellings (`--recipe`, `--workers`, `--timeout`, `--gold-timeout`, `--semantics`) still
parse, to the same value, so every command line that worked keeps working; --help shows only the new one."""

import argparse
import subprocess
import sys

import pytest

from conftest import child_env
from t2sql.cli import build_parser
from t2sql.miles import train

# (command line before the flag, new spelling, old spelling, a value, the parsed attribute, what it parses to)
RENAMED = [
    (["convert", "--questions", "q", "--db-root", "d", "--out-dir", "o"], "--preset", "--recipe", "bare",
     "recipe", "bare"),
    (["convert", "--questions", "q", "--db-root", "d", "--out-dir", "o"], "--timeout-s", "--gold-timeout", "7.5",
     "gold_timeout", 7.5),
    (["gold", "--data", "x.jsonl"], "--concurrency", "--workers", "3", "workers", 3),
    (["gold", "--data", "x.jsonl"], "--preset", "--recipe", "bare", "recipe", "bare"),
    (["gold", "--data", "x.jsonl"], "--timeout-s", "--timeout", "4", "timeout", 4.0),
    (["eval"], "--timeout-s", "--timeout", "90", "timeout", 90.0),
    (["bench", "pairs"], "--concurrency", "--workers", "3", "workers", 3),
    (["bench", "serving"], "--concurrency", "--workers", "5", "workers", 5),
    (["grade"], "--method", "--semantics", "set", "method", "set"),
    (["gold", "--data", "x.jsonl"], "--method", "--semantics", "list", "method", "ordered"),
    (["equivalence", "--measure"], "--method", "--semantics", "set", "method", "set"),
]
TRAIN_RENAMED = [
    (["prepare"], "--preset", "--recipe", "bare", "recipe", "bare"),
    (["prepare"], "--timeout-s", "--gold-timeout", "12", "gold_timeout", 12.0),
    (["train"], "--preset", "--recipe", "bare", "recipe", "bare"),
]


def _t2sql(argv: list[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def _help(parser: argparse.ArgumentParser, path: list[str]) -> str:
    for name in path:  # down the subcommands to the one named
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser.format_help()


@pytest.mark.parametrize("before, new, old, value, attr, parsed", RENAMED,
                         ids=[f"{' '.join(r[0][:2])} {r[2]}" for r in RENAMED])
def test_t2sql_old_and_new_spellings_parse_alike(before, new, old, value, attr, parsed):
    assert getattr(_t2sql([*before, new, value]), attr) == parsed
    assert getattr(_t2sql([*before, old, value]), attr) == parsed
    default = getattr(_t2sql(before), attr)
    assert default != parsed  # the value given is not the default: the flag did it
    path = [a for a in before if not a.startswith("-")][:2 if before[0] == "bench" else 1]
    shown = _help(build_parser(before), path)
    assert new in shown and old + " " not in shown and old + "\n" not in shown and f"{old}," not in shown


@pytest.mark.parametrize("before, new, old, value, attr, parsed", TRAIN_RENAMED,
                         ids=[f"{r[0][0]} {r[2]}" for r in TRAIN_RENAMED])
def test_t2sql_train_old_and_new_spellings_parse_alike(before, new, old, value, attr, parsed):
    parser = train.build_parser()
    assert getattr(parser.parse_args([*before, new, value]), attr) == parsed
    assert getattr(parser.parse_args([*before, old, value]), attr) == parsed
    assert getattr(parser.parse_args(before), attr) != parsed
    shown = _help(parser, before[:1])
    assert new in shown and old + " " not in shown and f"{old}," not in shown


def test_an_old_spelling_is_checked_as_the_new_one_is():
    """A hidden alias takes the same type: a bad value is the same usage error (exit 2) by either name."""
    for flag in ("--timeout-s", "--timeout"):
        proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "gold", "--data", "x.jsonl", flag, "nan"],
                              capture_output=True, text=True, timeout=120, env=child_env())
        assert proc.returncode == 2 and "positive, finite" in proc.stderr and flag in proc.stderr, proc.stderr


def test_the_usage_line_shows_only_the_new_spellings():
    usage = train.build_parser()._subparsers._group_actions[0].choices["prepare"].format_usage()
    assert "--preset" in usage and "--timeout-s" in usage and "--recipe" not in usage and "--gold-timeout" not in usage
