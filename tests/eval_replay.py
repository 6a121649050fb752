"""The rule "the same task and preset give the same reward record in every framework as in `t2sql eval`",
made checkable: `eval_records` replays assistant turns through the real `t2sql eval` command.

A framework's test records the assistant turns its run produced (or scripted) per task, then

    records = eval_records(rows, {question_id: [turn, ...]}, preset="...", tmp_path=tmp_path)
    assert comparable(its_record) == comparable(records[question_id])

`t2sql eval` runs as a child process (`python -m t2sql.cli eval --api openai`) against a loopback
OpenAI-compatible server (tests/loopback_model.py) that answers each task's turns in order, so the
records come from eval's own code end to end: its loader, its policy, its episode, its results file.
A turn is its text, or (text, finish) to force the server's finish reason ("length": a cut turn).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from loopback_model import LoopbackModel, Reply, TaskScript

Turn = Union[str, "tuple[str, str]"]

# What two runs of the same turns may differ in: wall-clock times, whether the gold came from a cache,
# digests (keyed by a secret each process draws), and token counts (each framework counts with its own
# tokenizer; `t2sql eval --api openai` counts words).
# Reward terms never read them: a term that did would show in reward_terms, which is compared.
VOLATILE = ("elapsed", "gold_cached", "digest", "think_tokens", "visible_tokens")
EPISODE_FIELDS = ("outcome", "reward", "correct", "solution", "turns", "tool_calls", "invalid_tool_calls",
                  "has_evidence", "evidence_restated", "evidence_checked", "detail", "reward_terms", "grade",
                  "metrics")


def comparable(record: Mapping[str, Any]) -> dict[str, Any]:
    """The episode record's fields (t2sql.episode.machine.EpisodeResult) without the volatile ones, as
    `t2sql eval` writes them: without has_evidence, the evidence rules None for a task without evidence."""
    record = dict(record)
    if not record.pop("has_evidence", True):
        record.update(evidence_restated=None, evidence_checked=None)
    def strip(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: strip(v) for k, v in value.items() if not any(word in k for word in VOLATILE)}
        return value

    return strip({k: record[k] for k in EPISODE_FIELDS if k in record})


@dataclass(frozen=True)
class _Task:
    question_id: str
    question: str


def eval_records(rows: Sequence[Mapping[str, Any]], turns: Mapping[str, Sequence[Turn]], *, preset: str,
                 tmp_path: Path, db_root: str | Path | None = None, timeout_s: float = 300) -> dict[str, dict]:
    """`t2sql eval`'s records of `rows` (t2sql's converted rows) when the model answers each task's
    `turns` in order: {question_id: record}. Rows without turns are not run."""
    picked = [dict(r) for r in rows if str(r["metadata"]["question_id"]) in turns]
    data = tmp_path / "replayed-tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in picked))
    tasks = [_Task(str(r["metadata"]["question_id"]), r["metadata"]["question"]) for r in picked]

    def plan(task: _Task, conversation) -> Reply:
        script = turns[task.question_id]
        if conversation.turn > len(script):
            raise AssertionError(f"eval asked for turn {conversation.turn} of {task.question_id}, "
                                 f"but the framework's run had {len(script)}")
        turn = script[conversation.turn - 1]
        text, finish = (turn, None) if isinstance(turn, str) else turn
        return Reply(text=text, finish=finish)

    out = tmp_path / "replayed-eval.jsonl"
    with LoopbackModel(TaskScript(tasks, plan)) as model:
        command = [sys.executable, "-m", "t2sql.cli", "eval", "--data", str(data), "--api", "openai",
                   "--endpoint", model.url, "--model", "loopback", "--preset", preset, "--out", str(out),
                   "--fresh", "--concurrency", "1", "--retries", "0", "--json"]
        if db_root is not None:
            command += ["--db-root", str(db_root)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=_child_env())
    if done.returncode != 0:
        raise AssertionError(f"t2sql eval exited {done.returncode}:\n{done.stderr[-4000:]}")
    lines = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    records = {str(r["question_id"]): r for r in lines[1:]}  # the first line is the results file's header
    missing = sorted(set(t.question_id for t in tasks) - set(records))
    if missing:
        raise AssertionError(f"t2sql eval wrote no record for {missing}")
    return records


def _child_env() -> dict[str, str]:
    from conftest import child_env

    return child_env()
