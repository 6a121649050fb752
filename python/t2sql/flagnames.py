"""One flag name per idea across every command (`--preset`, `--concurrency`, `--timeout-s`): a renamed
flag's old spellings stay accepted, as hidden aliases, so every command line that worked keeps working
while --help shows the one name."""

from __future__ import annotations

import argparse


def accept_old_spelling(parser, action: argparse.Action, *old: str) -> None:
    """Let `old` option strings set what `action` (a store flag just added to `parser` or one of its
    groups) sets: same dest, type and choices, hidden from --help and the usage line, and no default of
    their own (the new flag's default stands when neither is given)."""
    parser.add_argument(*old, dest=action.dest, type=action.type, choices=action.choices, metavar=action.metavar,
                        default=argparse.SUPPRESS, help=argparse.SUPPRESS)
