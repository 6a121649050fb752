"""`t2sql convert`: a BIRD-layout data release into miles jsonl (t2sql.data.convert)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from t2sql import jsonl
from t2sql.arguments import method_arg, seconds_arg
from t2sql.atomic import output_folder
from t2sql.data.convert import (
    DEFAULT_GOLD_TIMEOUT_S,
    convert_split,
    converted_output,
    summary_table,
    write_jsonl_atomic,
)
from t2sql.episode.presets import DEFAULT_PRESET
from t2sql.errors import DataError
from t2sql.flagnames import accept_old_spelling
from t2sql.grading import describe_methods
from t2sql.tasks import BIRD_FIELDS, parse_field_map


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", required=True, help="BIRD-layout question file (.json array or .jsonl)")
    parser.add_argument("--db-root", required=True, help="directory holding <db_id>/<db_id>.sqlite")
    parser.add_argument("--out-dir", required=True,
                        help="where <split-name>.jsonl is written (made if missing, when its parent exists); an "
                             "existing <split-name>.jsonl is replaced only when t2sql converted it, or with --force")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing <split-name>.jsonl even when it is not a split t2sql converted")
    parser.add_argument("--split-name", default=None, help="output name and split label (default: the file's stem)")
    parser.add_argument(
        "--field-map", nargs="*", default=[], metavar="FIELD=KEY",
        help=f"source keys for the canonical fields {', '.join(BIRD_FIELDS)} (default BIRD's: gold_sql=SQL)",
    )
    preset = parser.add_argument("--preset", dest="recipe", default=DEFAULT_PRESET,
                                 help="preset the prompt is built for")
    accept_old_spelling(parser, preset, "--recipe")
    parser.add_argument("--no-check-gold", action="store_true", help="skip executing every gold query")
    timeout = parser.add_argument("--timeout-s", dest="gold_timeout", type=seconds_arg, default=DEFAULT_GOLD_TIMEOUT_S,
                                  metavar="S", help="seconds per gold query")
    accept_old_spelling(parser, timeout, "--gold-timeout")
    parser.add_argument("--concurrency", type=int, default=None, help="threads running gold queries")
    parser.add_argument("--drop-invalid", action="store_true", help="write the valid rows, report the dropped ones")
    parser.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                        help="the method for rows whose grading_method cannot be read (a bare 'subset'); "
                             "without it such a row fails the conversion")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    split = args.split_name or Path(args.questions).stem
    # The output under t2sql.atomic's rule, checked before the validation and the gold queries run.
    output = converted_output(Path(args.out_dir) / f"{split}.jsonl", flag="--out-dir", force=args.force,
                              inputs=[("the --questions file", args.questions)])
    if output_folder(args.out_dir, flag="--out-dir", create=False).is_dir():
        output.check()
    try:
        fields = parse_field_map(args.field_map)
        report, built = convert_split(
            args.questions, args.db_root, None,
            split=split, fields=fields, recipe=args.recipe, check_gold_sql=not args.no_check_gold,
            gold_timeout_s=args.gold_timeout, concurrency=args.concurrency, drop_invalid=args.drop_invalid,
            method_fallback=args.grading_method_fallback,
        )
    except DataError as e:
        if getattr(args, "json", False):
            print(jsonl.dumps({"error": str(e).splitlines()[0], "problems": [p._asdict() for p in e.problems]}))
        else:
            print(f"t2sql convert: {e}", file=sys.stderr)
        return 1
    output_folder(args.out_dir, flag="--out-dir")  # one level, once there is something to write
    report.rows_written = write_jsonl_atomic(output, built)
    report.out_path = output.path
    if args.json:
        print(jsonl.dumps(report.to_dict(), indent=2))
    else:
        for p in report.problems:
            print(f"skipped: {p}", file=sys.stderr)
        print(summary_table([report]))
        print("grading methods: " + describe_methods(report.methods))
        for note in report.fallbacks:
            print(f"note: {note}", file=sys.stderr)
        print(f"wrote {report.out_path}")
    return 0
