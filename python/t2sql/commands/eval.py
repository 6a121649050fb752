"""`t2sql eval`: the command line of the eval runner (t2sql.eval.runner)."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from t2sql import jsonl
from t2sql.arguments import add_temp_disk_argument, method_arg, positive_arg, seconds_arg, wait_arg
from t2sql.episode.presets import get_preset
from t2sql.errors import EvalError, cap_lines
from t2sql.eval.endpoint import RetryPolicy
from t2sql.eval.policies import build_policy
from t2sql.eval.results import data_sha256, format_summary
from t2sql.eval.runner import DEFAULT_CONCURRENCY, EvalRun, evaluate, load_tasks
from t2sql.grading import describe_methods, method_counts
from t2sql.home import default_dir, describe_default_dir, made_default_dir
from t2sql.tasks import sample_dir, sample_questions

if TYPE_CHECKING:
    from t2sql.episode.presets import Preset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to evaluate")
    what.add_argument("--policy", choices=("model", "oracle"), default="model",
                      help="model: an endpoint writes the turns; oracle: scripted gold answers, no endpoint")
    what.add_argument("--data", default=None,
                      help="BIRD question json (list) or converted miles jsonl "
                           "(default: the embedded superhero sample)")
    what.add_argument("--db-root", default=None,
                      help="directory holding <db_id>/<db_id>.sqlite (default: beside --data, or the embedded sample)")
    what.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    what.add_argument("--samples", type=int, default=1,
                      help="episodes per task (with --temperature > 0): accuracy is then avg@k, plus pass@k "
                           "and maj@k (majority vote of the k answers by result; each task's vote is a line "
                           "of the results file)")
    what.add_argument("--preset", default=None,
                      help="recipe preset, e.g. qwen3.6-35b-a3b (default) or bare; named at the start, every field "
                           "with --verbose")
    add_temp_disk_argument(what, from_preset=True)
    what.add_argument("--grading-method-fallback", default=None, metavar="METHOD", type=method_arg,
                      help="the method for tasks whose grading_method cannot be read (e.g. 'subset,<,3'); "
                           "without it such a task is skipped with a line saying why")

    model = parser.add_argument_group("model endpoint")
    model.add_argument("--endpoint", default=None, help="server URL, e.g. http://127.0.0.1:30000")
    model.add_argument("--model", default=None, help="model name the server serves (--api openai)")
    model.add_argument("--api", choices=("openai", "sglang"), default="openai",
                       help="openai: /v1/chat/completions; sglang: token-level /generate as in training")
    model.add_argument("--tokenizer", default=None, help="tokenizer path or hub name for --api sglang")
    model.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                       help='chat template kwargs, e.g. \'{"enable_thinking": true}\' (sglang: every render; '
                            "openai: sent as chat_template_kwargs)")
    model.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the server's)")
    model.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: the server's)")
    model.add_argument("--api-key-env", default="OPENAI_API_KEY",
                       help="environment variable holding a bearer token for --api openai, if set")
    http = RetryPolicy()  # the endpoint's own defaults: the flags show them, they do not restate them
    model.add_argument("--timeout-s", type=seconds_arg, default=http.timeout_s, metavar="S",
                       help="seconds one whole request may take, the reply's last byte included")
    model.add_argument("--max-response-mb", type=positive_arg, default=http.max_body_bytes / (1024 * 1024),
                       help="a reply larger than this is refused unread (an endpoint_error), never held whole")
    model.add_argument("--retries", type=int, default=http.retries, help="retries of a failed request, with backoff")
    model.add_argument("--retry-backoff", type=wait_arg, default=http.backoff_s,
                       help="first backoff in seconds (doubles)")

    run_group = parser.add_argument_group("run")
    run_group.add_argument("--out", default=None,
                           help="results jsonl, appended; rerun to resume (default: "
                                "eval-<model or policy>-<preset>-<data>.jsonl under "
                                f"{describe_default_dir('eval')}). Only a t2sql results file of the same run (policy, "
                                "model, preset, sampling, the data's content) is resumed; any other existing file "
                                "is refused")
    run_group.add_argument("--fresh", action="store_true",
                           help="start the results file over instead of resuming it (a file that is not a t2sql "
                                "results file is refused all the same)")
    run_group.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY, help="episodes in flight")
    run_group.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    run_group.add_argument("--verbose", action="store_true", help="print the preset in full (every field) at the start")


def default_out(who: str | None, preset_name: str, data: Path, data_sha256: str) -> str:
    """<t2sql.home's eval folder>/eval-<model or policy>-<preset>-<data>-<its sha256, 8 digits>.jsonl: a rerun of
    the same command finds its own file and resumes it; two data files of one name do not meet."""
    parts = [who or "model", preset_name, data.stem if data.stem != "dev" else f"{data.parent.name}-dev",
             data_sha256[:8]]
    name = "eval-" + "-".join(re.sub(r"[^A-Za-z0-9._]+", "_", p).strip("_") for p in parts) + ".jsonl"
    return str(default_dir("eval") / name)  # never the current directory (nor a checkout's root)


def describe_preset(preset: Preset, *, verbose: bool = False, width: int = 100) -> str:
    """The preset in one line (its name and the episode's shape), or in full with `verbose`: a few readable
    lines, every field, wrapped."""
    import textwrap

    if not verbose:
        grading, budgets = preset.grading, preset.budgets
        methods = (f"the task's method, else {grading.method}" if grading.honor_task_methods else grading.method)
        return (f"preset {preset.name}: {budgets.max_tool_calls} tool calls, {budgets.max_turns} turns, graded by "
                f"{methods} (every field: --verbose)")
    fields = preset.to_dict()
    name = fields.pop("name")
    flat = {}  # each part's fields as part.field
    for part, values in fields.items():
        flat.update({f"{part}.{k}": v for k, v in values.items()} if isinstance(values, dict) else {part: values})
    body = " ".join(f"{k}={v}" for k, v in sorted(flat.items()))
    return f"preset {name}:\n" + textwrap.fill(body, width, initial_indent="  ", subsequent_indent="  ")


def run(args: argparse.Namespace, *, tokenizer: Any = None) -> int:
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    try:
        if args.limit is not None and args.limit < 1:
            raise EvalError(f"--limit must be >= 1, got {args.limit}")
        if args.samples < 1:
            raise EvalError(f"--samples must be >= 1, got {args.samples}")
        if args.samples > 1 and args.policy == "model" and not args.temperature:
            log(f"note: --samples {args.samples} without --temperature > 0: samples differ only if the "
                "server's default sampling is random")
        if args.data is None and args.db_root is not None:
            raise EvalError("--db-root needs --data (the embedded sample brings its own database)")
        data, db_root = (args.data, args.db_root) if args.data else (sample_questions(), sample_dir())
        try:
            preset = get_preset(args.preset)  # None: the recipe's default
            if args.max_temp_mb is not None:
                preset = preset.replace(grading={"max_temp_mb": args.max_temp_mb})
        except ValueError as e:
            raise EvalError(str(e)) from None
        loaded = load_tasks(data, db_root, limit=args.limit, method_fallback=args.grading_method_fallback,
                            preset=preset)
        for line in cap_lines([f"skipped: {message}" for message in loaded.skipped], indent="skipped: "):
            log(line)
        for note in loaded.notes:
            log(f"note: {note}")
        policy = build_policy(args, preset, tokenizer=tokenizer)
    except EvalError as e:
        log(f"t2sql eval: {e}")
        return 2

    preset_name = getattr(preset, "name", args.preset)
    run_info = {
        "policy": policy.name,
        "model": args.model if args.policy == "model" else None,
        "preset": preset_name,
    }
    try:
        digest = data_sha256(data)
    except OSError as e:
        log(f"t2sql eval: cannot read --data {data}: {e.strerror}")
        return 2
    # What makes this run this run: a results file of any other is refused, never resumed.
    identity = {**run_info, "sampling": {"temperature": args.temperature, "top_p": args.top_p,
                                         "chat_template_kwargs": args.chat_template_kwargs},
                "data_sha256": digest}
    if args.out is None:
        args.out = default_out(args.model if args.policy == "model" else args.policy, preset_name, Path(data),
                               digest)
        made_default_dir("eval")  # t2sql's own folder; --out's must exist
    log(f"t2sql eval: {len(loaded.tasks)} tasks from {data}"
        + (f" ({len(loaded.skipped)} rows skipped, listed above)" if loaded.skipped else "")
        + f" | policy {policy.name}"
        + (f" | model {args.model} at {args.endpoint}" if args.policy == "model" else ""))
    methods = method_counts(preset.method_for(t.grading_method) for t in loaded.tasks)
    log("grading methods: " + describe_methods(methods))
    log(describe_preset(preset, verbose=args.verbose))
    log(f"results: {args.out}" + (" (starting over: --fresh)" if args.fresh and Path(args.out).exists() else
                                  " (resuming: it exists)" if Path(args.out).exists() else ""))

    if preset.reward.equivalence_penalty:  # its checks find every database mined (a check never mines: not_ready)
        from t2sql.equivalence.mine_ahead import mine_ahead

        mined = mine_ahead([t.db_path for t in loaded.tasks if t.db_path], label="invariants")
        log(f"equivalence check's invariants: {mined.line()}")

    async def main() -> EvalRun:
        try:
            return await evaluate(
                loaded.tasks, policy, preset, args.out, concurrency=args.concurrency, run_info=run_info, log=log,
                samples=args.samples, identity=identity, inputs=(data,), fresh=args.fresh,
            )
        finally:
            await policy.aclose()

    try:
        outcome = asyncio.run(main())
    except EvalError as e:
        log(f"t2sql eval: {e}")
        return 2
    summary = {**outcome.summary, "ran": outcome.ran, "rows_skipped": len(loaded.skipped),
               "skipped_rows": loaded.skipped,  # every one (stderr lists the first 50)
               "resumed_skipped": outcome.skipped_finished,
               "aborted": outcome.aborted, "out": str(args.out), "run": run_info}
    if args.json:
        print(jsonl.dumps(summary, indent=2))
    else:
        print(format_summary(outcome.summary))
        if loaded.skipped:
            print(f"rows skipped: {len(loaded.skipped)} (not tasks: each is named on stderr above)")
        print(f"results: {args.out}")
    return 1 if (outcome.aborted or outcome.summary["unfinished"]) else 0
