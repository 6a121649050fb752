"""The eval's results file (one JSON line per episode, resumable) and its summary."""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from t2sql import jsonl
from t2sql.atomic import check_path, write_bytes_atomic
from t2sql.episode.presets import OUTCOMES
from t2sql.errors import EvalError
from t2sql.eval.endpoint import CallStats
from t2sql.serving.manifest import sha256_file
from t2sql.tasks import Task

if TYPE_CHECKING:
    from t2sql.episode.machine import Episode


ENDPOINT_ERROR = "endpoint_error"  # not an episode outcome: the model never finished the episode


EVAL_ERROR = "eval_error"  # not an episode outcome: this program failed (a bug); recorded, run goes on


UNFINISHED = frozenset({ENDPOINT_ERROR, EVAL_ERROR})  # lines a rerun retries


DIFFICULTY_ORDER = ("simple", "moderate", "challenging")


RESULTS_FORMAT = "t2sql-eval-results"  # the header line's "format": what says a file is t2sql's own
RESULTS_VERSION = 1
_HEADER_MAX_BYTES = 1 << 20  # a header is a few hundred bytes; a first line longer than this is not one


def data_sha256(path: str | os.PathLike) -> str:
    """The content hash of a task file: two files of one name with other questions or gold are other runs."""

    return sha256_file(path)


def header_record(identity: dict[str, Any]) -> dict[str, Any]:
    return {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "run": identity}


@dataclass
class ResultsFile:
    """The --out jsonl: its first line says it is t2sql's and whose run it holds (`identity`: policy,
    model, preset, sampling, the data's sha256); then one line per episode. `open` resumes only a file of
    the same run, refuses any other existing file, and holds a lock until `close` so that one run at a
    time writes it."""

    path: Path
    identity: dict[str, Any] = field(default_factory=dict)
    # (question_id, sample) -> the last line that finished it / the last error line of an unfinished one
    finished: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    errored: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    votes: dict[str, dict[str, Any]] = field(default_factory=dict)  # question_id -> its latest vote line
    warnings: list[str] = field(default_factory=list)
    _lock: Any = None

    @classmethod
    def open(cls, path: str | os.PathLike, identity: dict[str, Any], *, inputs: Iterable[str | os.PathLike] = (),
             fresh: bool = False) -> ResultsFile:
        """inputs: files the run reads (the task file): never its results file. fresh: start a t2sql results
        file over (another run's included); a file that is not t2sql's is refused all the same."""
        results = cls(Path(path), dict(identity))
        results._check_target(inputs)
        results._lock = _RunLock.take(results.path)
        try:
            header = results._header(fresh)
            if header is None or fresh:
                results._rewrite((jsonl.dumps(header_record(results.identity), ensure_ascii=False) + "\n").encode())
            else:
                results._check_identity(header)
                results._read()
        except BaseException:
            results.close()
            raise
        return results

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _check_target(self, inputs: Iterable[str | os.PathLike]) -> None:
        """t2sql.atomic's rule for the path (what is there, its folder); the content is _header's business."""
        where = f"--out {self.path}"
        _, existing = check_path(self.path, where, "pass another --out (a file name such as results.jsonl)")
        if existing is None:
            return
        for source in inputs:
            try:
                same = os.path.samefile(self.path, source)
            except OSError:
                same = False
            if same:
                raise EvalError(f"{where} is the data file this run reads ({source}); pass another --out")

    def _header(self, fresh: bool = False) -> dict[str, Any] | None:
        """The existing file's header; None for no file or an empty one. A file that is not t2sql's is
        refused; with `fresh`, one of t2sql's (an older format's included) is not read further."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return None
        with f:
            first = f.readline(_HEADER_MAX_BYTES)
        if not first.strip():
            if first:  # a blank first line: not ours
                raise self._foreign()
            return None
        try:
            header = jsonl.loads(first)
        except jsonl.JsonProblem:
            header = None
        if not isinstance(header, dict) or header.get("format") != RESULTS_FORMAT:
            if isinstance(header, dict) and "question_id" in header and "outcome" in header:
                if fresh:
                    return None
                raise EvalError(f"--out {self.path} holds results of an older t2sql (no header line saying whose "
                                "run they are), so they cannot be resumed safely; pass another --out, or --fresh "
                                "to start it over")
            raise self._foreign()
        if header.get("version") != RESULTS_VERSION and not fresh:
            raise EvalError(f"--out {self.path} is a t2sql results file of format version {header.get('version')}, "
                            f"this t2sql writes {RESULTS_VERSION}; pass another --out, or --fresh to start it over")
        return header

    def _foreign(self) -> EvalError:
        return EvalError(f"--out {self.path} exists and is not a t2sql results file; t2sql never writes into a file "
                         "that is not its own: pass another --out (or move that file away)")

    def _check_identity(self, header: dict[str, Any]) -> None:
        old = header.get("run") if isinstance(header.get("run"), dict) else {}
        keys = sorted(set(old) | set(self.identity))
        clash = [k for k in keys if old.get(k) != self.identity.get(k)]
        if clash:
            what = ", ".join(f"{k} {old.get(k)!r} (file) vs {self.identity.get(k)!r} (now)" for k in clash)
            raise EvalError(f"--out {self.path} holds results of another run: {what}; pass another --out, the same "
                            "settings to resume, or --fresh to start it over")

    def _read(self) -> None:
        """Every line after the header, up to the size the file has now, each at most jsonl.MAX_LINE_BYTES
        held: a longer line is read past and ignored with a warning, a last line without its newline is cut
        off (a torn write)."""
        limit = jsonl.MAX_LINE_BYTES
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size  # read what the file holds now, never past it
            f.readline(_HEADER_MAX_BYTES)
            number, kept_end = 1, f.tell()
            while f.tell() < size:
                raw = f.readline(min(size - f.tell(), limit + 1))
                number += 1
                too_long = not raw.endswith(b"\n") and len(raw) > limit
                while too_long and f.tell() < size:  # skip the rest of the line, a chunk at a time
                    raw = f.readline(min(size - f.tell(), 1 << 16))
                    if raw.endswith(b"\n"):
                        break
                if not raw.endswith(b"\n"):
                    # A line without its newline is a write a crash cut short: drop it, keep the rest intact.
                    self.warnings.append(
                        f"{self.path}: the last line is truncated (from an interrupted run); it is dropped and "
                        "that episode runs again"
                    )
                    break
                kept_end = f.tell()
                if too_long:
                    self.warnings.append(f"{self.path}: line {number} is longer than {limit:,} bytes, not a result "
                                         "line; ignored")
                    continue
                self._take(number, raw)
        if kept_end < size:
            os.truncate(self.path, kept_end)  # our own file, locked: cut the torn tail in place

    def _take(self, number: int, raw: bytes) -> None:
        if not raw.strip():
            return
        try:
            record = jsonl.loads(raw)
            if isinstance(record, dict) and record.get("record") == VOTE_RECORD:
                self.votes[str(record["question_id"])] = record
                return
            key = episode_key(record)
            outcome = record["outcome"]
        except jsonl.JsonProblem as e:
            self.warnings.append(f"{self.path}: line {number} is not a result line ({e}); ignored")
            return
        except (KeyError, TypeError, ValueError):
            self.warnings.append(f"{self.path}: line {number} is not a result line; ignored")
            return
        self._note(key, outcome, record)

    def _note(self, key: tuple[str, int], outcome: str, record: dict[str, Any]) -> None:
        if outcome in UNFINISHED:
            if key not in self.finished:
                self.errored[key] = record
        else:
            self.finished[key] = record
            self.errored.pop(key, None)

    def _rewrite(self, content: bytes) -> None:
        write_bytes_atomic(self.path, content)

    def append(self, record: dict[str, Any]) -> None:
        line = jsonl.dumps(record, ensure_ascii=False, default=_json_default) + "\n"
        # One write of one whole line, flushed: a crash leaves at most a truncated last line.
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
        if record.get("record") == VOTE_RECORD:
            self.votes[str(record["question_id"])] = record
            return
        self._note(episode_key(record), record["outcome"], record)


class _RunLock:
    """`<results>.lock`, flock'ed for the whole run and holding the writer's pid: a second run on the same
    results file is refused at once, naming the first. Removed on release; a lock file a killed run left
    holds no lock and is simply taken over."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = path, fd

    @classmethod
    def take(cls, results: Path) -> _RunLock:
        path = results.with_name(results.name + ".lock")
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
                os.close(fd)
                raise EvalError(f"--out {results} is being written by another t2sql eval (pid {holder}); wait for it "
                                "to finish, or pass another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a lock file its last holder removed between our open and our flock
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return cls(path, fd)
            os.close(fd)

    def release(self) -> None:
        try:
            os.unlink(self.path)
        finally:
            os.close(self.fd)


VOTE_RECORD = "vote"  # the "record" field of a vote line in the results file


VOTING_OUTCOMES = ("correct", "incorrect")  # a solution that ran to a result; errors, timeouts, unsafe: no vote


def _maj_at_k(votes: list[dict[str, Any]], k: int) -> dict[str, Any]:
    correct = sum(1 for v in votes if v.get("correct"))
    return {"k": k, "questions": len(votes), "correct": correct,
            "accuracy": correct / len(votes) if votes else None}


def episode_key(record: dict[str, Any]) -> tuple[str, int]:
    """What a result line is the result of: its question and, with --samples, which sample."""
    return str(record["question_id"]), int(record.get("sample") or 0)


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


# The longest message text a results line keeps (a turn of 3k tokens is ~12k characters).
MAX_STORED_CHARS = 100_000


def stored_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The transcript as a results line keeps it: each text over MAX_STORED_CHARS cut there, with
    a marker saying how much was cut. Returns (messages, characters cut)."""
    kept: list[dict[str, Any]] = []
    cut_total = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and len(content) > MAX_STORED_CHARS:
            cut = len(content) - MAX_STORED_CHARS
            cut_total += cut
            m = {**m, "content": content[:MAX_STORED_CHARS] + f"\n[t2sql: {cut} more characters not stored]"}
        kept.append(m)
    return kept, cut_total


def episode_record(task: Task, episode: Episode, run_info: dict[str, Any], stats: CallStats,
                   elapsed_s: float) -> dict[str, Any]:
    result = episode.result.to_dict()
    # A task without evidence has no evidence rules: None, so rates count only tasks that have them.
    has_evidence = result.get("has_evidence", True)
    restated = result.get("evidence_restated") if has_evidence else None
    checked = result.get("evidence_checked") if has_evidence else None
    metrics = result.get("metrics") or {}
    record: dict[str, Any] = {
        "question_id": task.question_id,
        "db_id": task.db_id,
        "difficulty": task.difficulty,
        "outcome": result.get("outcome"),
        "reward": result.get("reward"),
        "correct": bool(result.get("correct")),
        "turns": result.get("turns"),
        "tool_calls": result.get("tool_calls"),
        "invalid_tool_calls": result.get("invalid_tool_calls"),
        "evidence_restated": restated,
        "evidence_checked": checked,
        "evidence_rules_met": metrics.get("evidence_rules_met", sum(1 for v in (restated, checked) if v is True)),
        "solution": result.get("solution"),
        "detail": result.get("detail"),
        "reward_terms": result.get("reward_terms"),
        "grade": result.get("grade"),
        "metrics": metrics,
        "endpoint": stats.to_dict(),
        "elapsed_s": round(elapsed_s, 3),
        "run": run_info,
    }
    record["messages"], cut = stored_messages(episode.messages)
    if cut:
        record["stored_chars_cut"] = cut
    return record


def error_record(
    task: Task, episode: Episode | None, run_info: dict[str, Any], stats: CallStats, elapsed_s: float, error: str,
    outcome: str = ENDPOINT_ERROR, retryable: bool = True, unreachable: bool = False,
) -> dict[str, Any]:
    return {
        "question_id": task.question_id,
        "db_id": task.db_id,
        "difficulty": task.difficulty,
        "outcome": outcome,
        "reward": None,
        "correct": False,
        "error": error,
        "retryable": retryable,  # False: the endpoint refused in a way a retry cannot fix
        "unreachable": unreachable,  # True: no try connected at all (nothing listening at the endpoint)
        "endpoint": stats.to_dict(),
        "elapsed_s": round(elapsed_s, 3),
        "run": run_info,
        "messages": stored_messages(episode.messages)[0] if episode is not None else [],
    }


def summarize(
    records: Iterable[dict[str, Any]],
    *,
    pending: Iterable[Any] = (),
    errored: Iterable[dict[str, Any]] = (),
    samples: int = 1,
    votes: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Accuracy (correct only), outcome breakdown, means, accuracy by difficulty, over finished episodes.

    With several samples per question, accuracy is the mean over every episode (avg@k), pass@k
    the share of questions, among those with all k samples finished, that any sample answered,
    and maj@k the share whose majority vote (see `vote`) is correct.
    """
    records = list(records)
    pending = list(pending)
    errored = list(errored)
    n = len(records)
    outcomes = Counter(str(r.get("outcome")) for r in records)
    by_difficulty: dict[str, dict[str, Any]] = {}
    for r in records:
        d = str(r.get("difficulty") or "unknown")
        slot = by_difficulty.setdefault(d, {"episodes": 0, "correct": 0})
        slot["episodes"] += 1
        slot["correct"] += bool(r.get("correct"))
    for slot in by_difficulty.values():
        slot["accuracy"] = slot["correct"] / slot["episodes"]
    order = {d: i for i, d in enumerate(DIFFICULTY_ORDER)}
    by_difficulty = dict(sorted(by_difficulty.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    def mean(key: str) -> float | None:
        values = [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]
        return sum(values) / len(values) if values else None

    def rate(key: str) -> float | None:
        values = [r.get(key) for r in records if isinstance(r.get(key), bool)]  # None: task has no evidence
        return sum(values) / len(values) if values else None

    breakdown = {k: outcomes.get(k, 0) for k in OUTCOMES}
    for k, v in outcomes.items():
        if k not in breakdown:
            breakdown[k] = v
    correct = sum(1 for r in records if r.get("correct"))
    return {
        "episodes": n,
        "correct": correct,
        "accuracy": correct / n if n else None,
        "mean_reward": mean("reward"),
        "outcomes": breakdown,
        "mean_turns": mean("turns"),
        "mean_tool_calls": mean("tool_calls"),
        "mean_invalid_tool_calls": mean("invalid_tool_calls"),
        "evidence_restated_rate": rate("evidence_restated"),
        "evidence_checked_rate": rate("evidence_checked"),
        "by_difficulty": by_difficulty,
        "unfinished": len(pending),
        "endpoint_errors": sum(1 for r in errored if r.get("outcome", ENDPOINT_ERROR) == ENDPOINT_ERROR),
        "eval_errors": sum(1 for r in errored if r.get("outcome") == EVAL_ERROR),
        "last_error": errored[-1].get("error") if errored else None,
        "samples": samples,
        "pass_at_k": _pass_at_k(records, samples) if samples > 1 else None,
        "maj_at_k": _maj_at_k(list(votes), samples) if samples > 1 else None,
        "completion_tokens": sum(int((r.get("endpoint") or {}).get("completion_tokens") or 0) for r in records),
    }


def _pass_at_k(records: list[dict[str, Any]], k: int) -> dict[str, Any]:
    by_question: dict[str, list[bool]] = {}
    for r in records:
        by_question.setdefault(str(r.get("question_id")), []).append(bool(r.get("correct")))
    complete = [hits for hits in by_question.values() if len(hits) >= k]
    passed = sum(1 for hits in complete if any(hits))
    return {"k": k, "questions": len(complete), "passed": passed,
            "pass": passed / len(complete) if complete else None}


def format_summary(summary: dict[str, Any]) -> str:
    def num(value: Any, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    n = summary["episodes"]
    lines = [
        f"{'episodes finished':<26}{n:>8}",
        f"{'accuracy (correct only)':<26}{num(summary['accuracy']):>8}   {summary['correct']}/{n}",
        f"{'mean reward':<26}{num(summary['mean_reward']):>8}",
    ]
    pass_k = summary.get("pass_at_k")
    if pass_k:
        lines.append(f"{'pass@' + str(pass_k['k']):<26}{num(pass_k['pass']):>8}   "
                     f"{pass_k['passed']}/{pass_k['questions']} questions")
    maj_k = summary.get("maj_at_k")
    if maj_k:
        lines.append(f"{'maj@' + str(maj_k['k']):<26}{num(maj_k['accuracy']):>8}   "
                     f"{maj_k['correct']}/{maj_k['questions']} questions")
    lines += [
        f"{'mean turns':<26}{num(summary['mean_turns'], 2):>8}",
        f"{'mean tool calls':<26}{num(summary['mean_tool_calls'], 2):>8}",
        f"{'mean invalid tool calls':<26}{num(summary['mean_invalid_tool_calls'], 2):>8}",
        f"{'evidence restated':<26}{num(summary['evidence_restated_rate']):>8}",
        f"{'evidence checked':<26}{num(summary['evidence_checked_rate']):>8}",
        "",
        f"{'outcome':<26}{'count':>8}{'share':>9}",
    ]
    for outcome, count in summary["outcomes"].items():
        share = count / n if n else 0.0
        lines.append(f"  {outcome:<24}{count:>8}{share:>9.3f}")
    lines += ["", f"{'difficulty':<26}{'episodes':>8}{'accuracy':>9}"]
    for difficulty, slot in summary["by_difficulty"].items():
        lines.append(f"  {difficulty:<24}{slot['episodes']:>8}{slot['accuracy']:>9.3f}")
    if summary["unfinished"]:
        lines += [
            "",
            f"unfinished: {summary['unfinished']} episode(s) ({summary['endpoint_errors']} endpoint errors, "
            f"{summary['eval_errors']} eval errors); "
            "rerun the same command to retry them",
        ]
        if summary["last_error"]:
            lines.append(f"last error: {summary['last_error']}")
    return "\n".join(lines)
