"""`t2sql convert`: a BIRD-layout data release into t2sql's rows (t2sql.data.convert), or those rows
(given, or converted here) as verl's or SkyRL's dataset rows (t2sql.integrations.rows)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from t2sql import jsonl
from t2sql.arguments import method_arg, seconds_arg
from t2sql.atomic import OutputFile, first_line, output_folder
from t2sql.data.convert import (
    DEFAULT_GOLD_TIMEOUT_S,
    SplitReport,
    convert_split,
    converted_output,
    summary_table,
    write_jsonl_atomic,
)
from t2sql.episode.presets import DEFAULT_PRESET
from t2sql.errors import DataError
from t2sql.grading import describe_methods, method_counts
from t2sql.integrations import rows as framework_rows
from t2sql.tasks import BIRD_FIELDS, open_input, parse_field_map

FILE_TYPES = ("jsonl", "parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--questions", help="BIRD-layout question file (.json array or .jsonl)")
    source.add_argument("--rows", metavar="JSONL",
                        help="a split t2sql already converted (`t2sql-train prepare` writes data/<split>.jsonl): "
                             "reshaped for --format as it is, with no second validation")
    parser.add_argument("--db-root", help="directory holding <db_id>/<db_id>.sqlite (needed with --questions)")
    parser.add_argument("--format", choices=framework_rows.FORMATS, default="miles",
                        help="whose dataset rows to write: miles (t2sql's own rows, <split-name>.jsonl), verl "
                             "(<split-name>.verl.parquet: agent_name t2sql) or skyrl (<split-name>.skyrl.parquet: "
                             "env_class t2sql)")
    parser.add_argument("--file-type", choices=FILE_TYPES, default=None,
                        help="jsonl or parquet (default: jsonl for miles, parquet for verl and skyrl; parquet needs "
                             "pyarrow)")
    parser.add_argument("--out-dir", required=True,
                        help="where the split's file is written (made if missing, when its parent exists); an "
                             "existing one is replaced only when t2sql converted it, or with --force")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing output file even when it is not a split t2sql converted")
    parser.add_argument("--split-name", default=None, type=split_name_arg,
                        help="output name and split label: one file name, written inside --out-dir (default: the "
                             "file's stem)")
    parser.add_argument(
        "--field-map", nargs="*", default=[], metavar="FIELD=KEY",
        help=f"source keys for the canonical fields {', '.join(BIRD_FIELDS)} (default BIRD's: gold_sql=SQL)",
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET,
                        help="preset the prompt is built for")
    parser.add_argument("--no-check-gold", action="store_true", help="skip executing every gold query")
    parser.add_argument("--timeout-s", type=seconds_arg, default=DEFAULT_GOLD_TIMEOUT_S,
                        metavar="S", help="seconds per gold query")
    parser.add_argument("--concurrency", type=int, default=None, help="threads running gold queries")
    parser.add_argument("--drop-invalid", action="store_true", help="write the valid rows, report the dropped ones")
    parser.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                        help="the method for rows whose grading_method cannot be read (e.g. 'subset,<,3'); "
                             "without it such a row fails the conversion")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def split_name_arg(text: str) -> str:
    """argparse type of --split-name: the name of one file inside --out-dir (no folder, no "." or "..": a
    name such as /dev/null or ../x would put the output outside it), or a usage error."""
    if not text or text in (".", "..") or any(c in text for c in ("/", "\\", "\0")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a split name: give one file name (e.g. train), written "
                                         "inside --out-dir; no folders, '.' or '..'")
    return text


def output_name(split: str, framework: str, file_type: str) -> str:
    """<split>.jsonl for t2sql's own rows; <split>.<framework>.<file type> for another framework's."""
    return f"{split}.{file_type}" if framework == "miles" else f"{split}.{framework}.{file_type}"


def split_of(path: Path) -> str:
    """The split a file holds, by its name: train.jsonl, train.verl.parquet and train.skyrl.jsonl are all train."""
    stem = path.stem
    for framework in framework_rows.FORMATS:
        stem = stem.removesuffix(f".{framework}")
    return stem


def split_output(path: Path, framework: str, file_type: str, *, force: bool, inputs: list) -> OutputFile:
    """The output under t2sql.atomic's rule: a file t2sql converted is replaced, any other only with --force."""
    if file_type == "jsonl" and framework == "miles":
        return converted_output(path, flag="--out-dir", force=force, inputs=inputs)
    if file_type == "jsonl":
        return OutputFile(path, flag="--out-dir", kind="a split t2sql converted", force=force, inputs=inputs,
                          own=lambda head: framework_rows.is_framework_jsonl(first_line(head)))
    return OutputFile(path, flag="--out-dir", kind="a split t2sql converted", force=force, inputs=inputs,
                      own=lambda head: head.startswith(b"PAR1") and framework_rows.parquet_metadata_says_t2sql(path))


def run(args: argparse.Namespace) -> int:
    framework = args.format
    file_type = args.file_type or ("jsonl" if framework == "miles" else "parquet")
    if framework == "miles" and file_type != "jsonl":
        print("t2sql convert: miles reads t2sql's rows as jsonl; --file-type parquet is for --format verl or skyrl",
              file=sys.stderr)
        return 2
    if args.questions and not args.db_root:
        print("t2sql convert: --questions needs --db-root (the directory holding <db_id>/<db_id>.sqlite)",
              file=sys.stderr)
        return 2
    source = args.questions or args.rows
    if args.rows:  # a FIFO or a device is refused by its stat, never read (the read would hang or never end)
        try:
            open_input(args.rows, "--rows file").close()
        except DataError as e:
            print(f"t2sql convert: {e}", file=sys.stderr)
            return 2
    split = args.split_name or split_of(Path(source))
    # The output under t2sql.atomic's rule, checked before the validation and the gold queries run.
    output = split_output(Path(args.out_dir) / output_name(split, framework, file_type), framework, file_type,
                          force=args.force,
                          inputs=[("the --questions file" if args.questions else "the --rows file", source)])
    if output_folder(args.out_dir, flag="--out-dir", create=False).is_dir():
        output.check()
    try:
        if args.rows:
            built = framework_rows.read_rows(args.rows)
            report = SplitReport(split=split, questions=Path(args.rows), out_path=None, rows_in=len(built),
                                 methods=method_counts(r["label"].get("grading_method") or "(preset's)" for r in built))
        else:
            fields = parse_field_map(args.field_map)
            report, built = convert_split(
                args.questions, args.db_root, None,
                split=split, fields=fields, preset=args.preset, check_gold_sql=not args.no_check_gold,
                gold_timeout_s=args.timeout_s, concurrency=args.concurrency, drop_invalid=args.drop_invalid,
                method_fallback=args.grading_method_fallback,
            )
        shaped = list(framework_rows.framework_rows(built, framework, split=split))
        if file_type == "parquet":
            output_folder(args.out_dir, flag="--out-dir")
            report.rows_written = framework_rows.write_parquet(output, shaped, framework)
    except DataError as e:
        if getattr(args, "json", False):
            print(jsonl.dumps({"error": str(e).splitlines()[0], "problems": [p._asdict() for p in e.problems]}))
        else:
            print(f"t2sql convert: {e}", file=sys.stderr)
        return 1
    if file_type == "jsonl":
        output_folder(args.out_dir, flag="--out-dir")  # one level, once there is something to write
        report.rows_written = write_jsonl_atomic(output, shaped)
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
