"""One flag name per idea across every command (issue 27, issue 38): `--preset`, `--concurrency`, `--timeout-s`,
`--method`. The pre-release spellings (`--recipe`, `--workers`, `--timeout`, `--gold-timeout`, `--semantics`) are
gone: 0.1.0 was never released, so they are refused as any unknown flag is (exit 2, naming the flag), and no
prefix of a flag is taken for it (`--timeout` is not `--timeout-s`). The code reads each flag by its own name
too: a flag's attribute is the flag (`--concurrency` -> args.concurrency)."""

import argparse
import subprocess
import sys

import pytest

from conftest import child_env
from t2sql.cli import COMMANDS, build_parser
from t2sql.miles import train

# (command line before the flag, the one spelling, the old spelling, a value)
CONVERT = ["convert", "--questions", "q", "--db-root", "d", "--out-dir", "o"]
RENAMED = [
    (CONVERT, "--preset", "--recipe", "bare"),
    (CONVERT, "--timeout-s", "--gold-timeout", "7.5"),
    (["gold", "--data", "x.jsonl"], "--concurrency", "--workers", "3"),
    (["gold", "--data", "x.jsonl"], "--preset", "--recipe", "bare"),
    (["gold", "--data", "x.jsonl"], "--timeout-s", "--timeout", "4"),
    (["eval"], "--timeout-s", "--timeout", "90"),
    (["bench", "pairs"], "--concurrency", "--workers", "3"),
    (["bench", "serving"], "--concurrency", "--workers", "5"),
    (["grade"], "--method", "--semantics", "set"),
    (["gold", "--data", "x.jsonl"], "--method", "--semantics", "list"),
    (["equivalence", "--measure"], "--method", "--semantics", "set"),
]
TRAIN_RENAMED = [
    (["prepare"], "--preset", "--recipe", "bare"),
    (["prepare"], "--timeout-s", "--gold-timeout", "12"),
    (["train"], "--preset", "--recipe", "bare"),
]
OLD_SPELLINGS = frozenset(r[2] for r in RENAMED + TRAIN_RENAMED)


def _refused(parse, argv: list[str], capsys) -> str:
    """parse(argv)'s usage error (exit 2), as printed."""
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2, argv
    return capsys.readouterr().err


@pytest.mark.parametrize("before, new, old, value", RENAMED, ids=[f"{' '.join(r[0][:2])} {r[2]}" for r in RENAMED])
def test_t2sql_refuses_an_old_spelling(before, new, old, value, capsys):
    build_parser([*before, new, value]).parse_args([*before, new, value])  # the one spelling parses
    message = _refused(lambda argv: build_parser(argv).parse_args(argv), [*before, old, value], capsys)
    assert f"unrecognized arguments: {old} {value}" in message, message


@pytest.mark.parametrize("before, new, old, value", TRAIN_RENAMED,
                         ids=[f"{r[0][0]} {r[2]}" for r in TRAIN_RENAMED])
def test_t2sql_train_refuses_an_old_spelling(before, new, old, value, capsys):
    parser = train.build_parser()
    parser.parse_args([*before, new, value])
    message = _refused(parser.parse_args, [*before, old, value], capsys)
    assert f"unrecognized arguments: {old} {value}" in message, message


def test_an_old_spelling_is_a_usage_error_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "t2sql.cli", "gold", "--data", "x.jsonl", "--timeout", "4"],
                          capture_output=True, text=True, timeout=120, env=child_env())
    assert proc.returncode == 2 and "unrecognized arguments: --timeout 4" in proc.stderr, proc.stderr


def _renamed_dests(parser: argparse.ArgumentParser, path: list[str]):
    """(command path, option strings, dest) of every flag whose dest is not its long name, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _renamed_dests(sub, [*path, name])
        elif action.option_strings and action.dest != argparse.SUPPRESS:
            long = next((o for o in action.option_strings if o.startswith("--")), None)
            if long is not None and action.dest != long[2:].replace("-", "_"):
                yield path, action.option_strings, action.dest


def test_every_flag_is_read_by_its_own_name():
    renamed = [found for name in COMMANDS for found in _renamed_dests(build_parser([name]), ["t2sql"])]
    renamed += list(_renamed_dests(train.build_parser(), ["t2sql-train"]))
    assert not renamed, renamed
    # The check sees every subcommand's flags (they are added only when that subcommand is asked for).
    assert {"--concurrency", "--timeout-s", "--preset", "--format"} <= {
        o for name in COMMANDS for sub in [build_parser([name])._subparsers._group_actions[0].choices[name]]
        for a in sub._actions for o in a.option_strings}
