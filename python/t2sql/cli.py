"""The `t2sql` command: grade, eval, gold, convert, bench, curriculum, equivalence, prompt.

Each subcommand lives in the module named after its domain; that module exposes
`add_arguments(parser)` and `run(args) -> int`. Modules are imported only when their
subcommand runs, so `t2sql grade` never pays for the eval client.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from t2sql.arguments import WholeNamesParser

# subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "grade": ("t2sql.commands.grade", "compare predicted SQL with gold SQL on a database"),
    "eval": ("t2sql.commands.eval", "run episodes against a model endpoint (or the oracle policy)"),
    "gold": ("t2sql.commands.gold", "run every gold query of a split, fill the gold cache, report"),
    "convert": ("t2sql.commands.convert", "convert a BIRD-layout data release into miles jsonl"),
    "bench": ("t2sql.commands.bench", "benchmarks of the grading core against its peers"),
    "curriculum": ("t2sql.commands.curriculum", "inspect a saved curriculum state (hint levels, weights, hints)"),
    "equivalence": ("t2sql.commands.equivalence", "the equivalence check: check pairs, list invariants, measure it"),
    "prompt": ("t2sql.commands.prompt", "print the rendered prompt of one task"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = WholeNamesParser(prog="t2sql", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = _wanted_command(argv)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only the chosen subcommand's module is imported (and `--help` of the bare command).
        if wanted == name:
            importlib.import_module(module).add_arguments(p)
    return parser


def _wanted_command(argv: list[str] | None) -> str | None:
    args = sys.argv[1:] if argv is None else argv
    for a in args:
        if a in COMMANDS:
            return a
    return None


def _version() -> str:
    from t2sql import __version__, sqlite_version

    return f"t2sql {__version__} (SQLite {sqlite_version()})"


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. A closed stdout (`t2sql ... | head -1`) is exit 141, never 0; a closed stderr
    (`2>&1 | head -1`) goes silent and never stops the command, and makes a successful one exit 141 too:
    a script must not take half-read output for success."""
    from t2sql.interrupts import sigterm_unwinds
    from t2sql.progress import StderrGuard, closed_stdout_exit

    guard = StderrGuard(sys.stderr)
    sys.stderr = guard
    try:
        try:
            with sigterm_unwinds():  # `kill` cleans up as Ctrl-C does: no temporary file stays behind
                code = _main(argv)
        finally:
            sys.stdout.flush()  # here, not at the interpreter's exit, so a closed stdout is seen and answered
    except BrokenPipeError:  # what the command wrote to files is written; its output was not all read
        return closed_stdout_exit()
    finally:
        sys.stderr = guard.stream
    return 141 if guard.broken and code == 0 else code


def _main(argv: list[str] | None) -> int:
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    module = importlib.import_module(COMMANDS[args.command][0])
    from t2sql import T2sqlError

    try:
        return int(module.run(args) or 0)
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (t2sql.interrupts)
        from t2sql.interrupts import interrupt_exit, interrupt_word, quiet_teardown

        quiet_teardown()
        print(interrupt_word(e), file=sys.stderr)
        return interrupt_exit(e)
    except (T2sqlError, OSError) as e:
        if isinstance(e, BrokenPipeError):
            raise  # main answers a closed stdout
        # Trouble a user can fix (a file that cannot be read or written, an output path refused by
        # t2sql.atomic's rule, a cache that cannot be used): one line that says what, exit 2; never a
        # traceback.
        text = f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.filename and e.strerror else str(e)
        print(f"t2sql {args.command}: {text}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
