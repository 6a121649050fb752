"""`t2sql-train`: prepare and launch the recipe's miles run (Qwen3.6-35B-A3B, one 8xH200 node); docs/training.md.
Exit status: 0 done; 1 something outside the command failed or is missing (network, disk, GPUs, miles, a download
or conversion not complete, bad data): the message says what to do; 2 the command line is wrong, or prepare would
write over a file that is not its own output (pass --force, or choose another --output-dir); 130 / 143
interrupted (SIGINT / SIGTERM), temporary files removed: rerun to continue."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import fields
from typing import Callable, NoReturn

from t2sql.arguments import WholeNamesParser, method_arg, seconds_arg
from t2sql.data.convert import DEFAULT_GOLD_TIMEOUT_S
from t2sql.download.bird import BIRD_URL
from t2sql.episode.presets import get_preset
from t2sql.errors import DataError, LaunchError, OutputPathError, PresetError, T2sqlError
from t2sql.home import describe_default_dir
from t2sql.interrupts import interrupt_exit, interrupt_word, sigterm_unwinds
from t2sql.miles.flags import (
    HF_REPO,
    LOSS_BLOCKS,
    MEGATRON_MODEL_TYPE,
    MODEL_NAME,
    SPLITS,
    TrainConfig,
    default_run_id,
    read_number,
    render_dry_run,
    runtime_env,
    train_argv,
)
from t2sql.miles.prepare import check_prepare_args, import_miles_command_utils, missing_for_train, prepare
from t2sql.progress import closed_stdout_exit

# -------------------------------------------------------------------------------------------- train


def train(c: TrainConfig, args: argparse.Namespace) -> int:
    if args.dry_run:
        sys.stdout.write(render_dry_run(c))
        return 0
    missing = missing_for_train(c)
    if missing:
        raise LaunchError("cannot start training; missing:\n" + "\n".join(f"  - {m}" for m in missing)
                          + "\n(`t2sql-train train --dry-run` prints the command without starting anything)")
    command_utils = import_miles_command_utils(c)

    print(json.dumps({"preset": get_preset(c.preset).to_dict()}, indent=1))
    command_utils.execute_train(
        train_args=shlex.join(train_argv(c)),
        num_gpus_per_node=c.num_gpus_per_node,
        megatron_model_type=MEGATRON_MODEL_TYPE,
        extra_env_vars=runtime_env(c),
        megatron_path=c.megatron_path,
    )
    return 0


# ---------------------------------------------------------------------------------------------- CLI


class _Parser(WholeNamesParser):
    """A usage error is one line (what is wrong, where the help is) and exit 2, not argparse's usage block.
    Flags are taken by their whole name only, as `t2sql`'s are."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _number(name: str) -> Callable[[str], int | float]:
    """argparse type of TrainConfig field `name`'s flag, checked as flags.NUMBERS says."""

    def parse(text: str) -> int | float:
        try:
            return read_number(name, text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def _add_common(p: argparse.ArgumentParser) -> None:
    d = TrainConfig(run_id="x")
    p.add_argument("--output-dir", default=None,
                   help="models, data, gold cache and checkpoints live here (default: "
                        f"{describe_default_dir('train')})")
    p.add_argument("--preset", default=d.preset, help="t2sql preset (budgets and reward)")
    p.add_argument("--num-gpus-per-node", type=_number("num_gpus_per_node"), default=d.num_gpus_per_node)
    p.add_argument("--miles-path", default=d.miles_path, help="miles source checkout (as in miles' image)")
    p.add_argument("--megatron-path", default=d.megatron_path)
    p.add_argument("--hf-checkpoint", default="",
                   help=f"your own local copy of {HF_REPO}, used as is (prepare neither downloads nor writes "
                        f"into it); default: prepare downloads it to <output-dir>/models/{MODEL_NAME}")


def bird_url_arg(text: str) -> str:
    """--bird-url: an http(s) base URL (BASE/train.zip and BASE/dev.zip are fetched from it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL (e.g. https://mirror.example/bird)")
    return text.rstrip("/")


def build_parser() -> argparse.ArgumentParser:
    epilog = __doc__[__doc__.index("Exit status:"):]
    parser = _Parser(prog="t2sql-train", description=__doc__.splitlines()[0], epilog=epilog)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    d = TrainConfig(run_id="x")

    p = sub.add_parser("prepare", help="download and convert the checkpoint and the data release", epilog=epilog)
    _add_common(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--bird-url", default=None, metavar="BASE", type=bird_url_arg,
                        help="where BIRD's archives come from: a mirror serving BASE/train.zip and BASE/dev.zip in "
                             f"BIRD's official layout (default: BIRD's own server, {BIRD_URL}). Without "
                             "--data-release/--data-repo, prepare converts the task files t2sql ships "
                             "(BIRD-Verified, Arcwise-Plat-SQL) on BIRD's databases, which it downloads, verifies "
                             "and lays out under <output-dir>/data/bird")
    source.add_argument("--data-release", default=None,
                        help="your own data instead: a local directory with the split files beside their databases")
    source.add_argument("--data-repo", default=None,
                        help="Hugging Face dataset id of a data release (downloaded to <output-dir>/data/release)")
    p.add_argument("--keep-archives", action="store_true",
                   help="keep BIRD's downloaded zips (<output-dir>/data/bird/.downloads) after laying them out")
    p.add_argument("--field-map", nargs="*", default=[], metavar="FIELD=KEY", help="see `t2sql convert --help`")
    p.add_argument("--splits", nargs="+", default=list(SPLITS), help="splits of the release to convert")
    p.add_argument("--timeout-s", type=seconds_arg, default=DEFAULT_GOLD_TIMEOUT_S,
                   metavar="S", help="seconds per gold query while validating")
    p.add_argument("--drop-invalid", action="store_true", help="write the valid rows, report the dropped ones")
    p.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                   help="the method for tasks whose grading_method cannot be read (e.g. 'subset,<,3', in data "
                        "of your own; the shipped task files need none); without it they fail the conversion")
    p.add_argument("--skip-model", action="store_true", help="prepare the data only")
    p.add_argument("--skip-data", action="store_true", help="prepare the checkpoint only")
    p.add_argument("--skip-disk-check", action="store_true")
    p.add_argument("--force", action="store_true",
                   help="replace data/<split>.jsonl and data/<split>.manifest.json under --output-dir even when "
                        "they are not t2sql's own output (what an earlier prepare wrote is replaced without it)")

    t = sub.add_parser("train", help="launch the miles run (or print it with --dry-run)", epilog=epilog)
    _add_common(t)
    t.add_argument("--run-id", default="",
                   help="names the checkpoint directory <output-dir>/checkpoints/<run-id> and the wandb group: a "
                        "plain name (letters, digits, '.', '_', '-'). Default: <preset>-<loss> (e.g. "
                        f"{default_run_id(d.preset, d.loss)}), so rerunning the same command resumes from its "
                        "last checkpoint; a new --run-id starts a fresh run")
    t.add_argument("--loss", choices=sorted(LOSS_BLOCKS), default="",
                   help="default: the preset's loss (cispo in qwen3.6-35b-a3b, grpo in bare)")
    t.add_argument("--num-nodes", type=_number("num_nodes"), default=d.num_nodes,
                   help="nodes of an already started Ray cluster")
    for name in ("num_rollout", "rollout_batch_size", "n_samples_per_prompt", "global_batch_size", "eval_interval",
                 "lr", "max_tokens_per_gpu", "grader_concurrency"):
        t.add_argument("--" + name.replace("_", "-"), type=_number(name), default=getattr(d, name))
    t.add_argument("--wandb-project", default="")
    t.add_argument("--wandb-team", default="")
    t.add_argument("--extra-args", default="", help="more miles flags, appended last (later flags win)")
    t.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="more Ray runtime env vars")
    t.add_argument("--dry-run", action="store_true", help="print the command and environment, start nothing")
    return parser


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    names = {f.name for f in fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names and not (k == "output_dir" and v is None)}
    if "env" in vars(args):
        values["extra_env"] = args.env
    return TrainConfig(**values)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    prog = f"t2sql-train {args.command}"
    try:  # the command line itself: a wrong value is a usage error, exit 2
        config = config_from_args(args)
        field_map = check_prepare_args(config, args) if args.command == "prepare" else {}
    except (LaunchError, DataError, PresetError) as e:
        print(f"{prog}: {e} (see `{prog} --help`)", file=sys.stderr)
        return 2
    try:
        with sigterm_unwinds():  # `kill` cleans up as Ctrl-C does: no temporary file stays behind
            if args.command == "prepare":
                return prepare(config, args, field_map)
            return train(config, args)
    except OutputPathError as e:  # an output in the way: --force, or another --output-dir
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except T2sqlError as e:  # each carries its own instructions (a download, an archive, the data, the launch)
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `t2sql-train train --dry-run | head -1`: not a success a script may trust
        return closed_stdout_exit()
    except OSError as e:  # a file that cannot be read or written after the checks (disk full, permissions)
        text = f"{e.strerror}: {e.filename}" if e.filename and e.strerror else f"{type(e).__name__}: {e}"
        print(f"{prog}: {text}; fix that and rerun (completed steps are kept)", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (t2sql.interrupts)
        print(f"{prog}: {interrupt_word(e)}; rerun to continue (completed steps are kept)", file=sys.stderr)
        return interrupt_exit(e)
