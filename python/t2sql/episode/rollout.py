"""The rollout seam every RL framework's adapter stands on: the settings a rollout process is configured with
(`RolloutSettings`), its per-process context (the preset, one Grader, the task reader), an episode off the event
loop and the regrade of a replayed sample. docs/episode.md, "An adapter for another RL framework"."""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Sequence

from t2sql._grader import DatabaseError
from t2sql.arguments import MAX_CONCURRENCY
from t2sql.episode.machine import VERDICT_OUTCOMES, Episode
from t2sql.episode.parsing import parse_solution, strip_think
from t2sql.episode.presets import DEFAULT_PRESET, Preset, get_preset
from t2sql.episode.prompt import build_prompt_async
from t2sql.errors import PresetError, SettingsError
from t2sql.serving.grader import Grader
from t2sql.serving.manifest import manifest_file_problem
from t2sql.serving.settings import GraderSettings
from t2sql.tasks import Task

log = logging.getLogger("t2sql.rollout")

# The ranges of the numbers a rollout process is configured with. Concurrency is SQL worker threads
# (t2sql.arguments.MAX_CONCURRENCY). A timeout is a limit: finite, positive, and at most an hour (the core
# treats anything near 1e9 s as no limit at all).
CONCURRENCY_RANGE = (1, MAX_CONCURRENCY)
MAX_TIMEOUT_S = 3600.0
_PATHS = ("db_root", "cache_dir", "manifest")
_TIMEOUTS = ("tool_timeout_s", "grade_timeout_s")


def check_setting(name: str, value: Any, label: str | None = None, text: str | None = None) -> Any:
    """`value` as RolloutSettings' field `name` holds it (paths as str, timeouts as float), or a one-line
    SettingsError naming the setting as the user gave it (`label`: a T2SQL_* variable, a config key;
    default the field's name; `text`: what the value was read from) and what it must be. None leaves an
    optional field to its default."""
    label = label or name
    shown = _shown(value) if text is None else _shown(text)

    def refuse(must: str) -> SettingsError:
        return SettingsError(f"{label}={shown} {must}")

    if name == "preset":
        if not isinstance(value, str) or not value.strip():
            raise refuse("must be a preset's name")
        try:
            get_preset(value)
        except PresetError as e:
            raise SettingsError(f"{label}={shown}: {e}") from None
        return value
    if value is None and name != "hash_databases":
        return None
    if name in _PATHS:
        path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        if not isinstance(path, str) or not path or "\0" in path:
            raise refuse("must be a path")
        if name == "manifest":
            try:
                problem = manifest_file_problem(os.stat(path))
            except OSError as e:
                raise refuse(f"cannot be read ({e.strerror}); give the manifest `t2sql-train prepare` wrote") from None
            if problem is not None:
                raise refuse(f"{problem}; give the manifest `t2sql-train prepare` wrote")
        return path
    if name == "hash_databases":
        if not isinstance(value, bool):
            raise refuse("must be true or false")
        return value
    if name == "concurrency":
        low, high = CONCURRENCY_RANGE
        if not isinstance(value, int) or isinstance(value, bool):
            raise refuse(f"must be a whole number from {low} to {high}, not a {type(value).__name__}")
        if not low <= value <= high:
            raise refuse(f"must be a whole number from {low} to {high}")
        return value
    if name in _TIMEOUTS:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise refuse(f"must be a number of seconds, not a {type(value).__name__}")
        if not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
            raise refuse(f"must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}")
        return float(value)
    raise SettingsError(f"unknown t2sql setting {name!r}; known: {', '.join(f.name for f in fields(RolloutSettings))}")


def _shown(value: Any) -> str:
    """A value as a one-line message shows it: its repr, cut at 80 characters (an int too long for
    repr by its size)."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit
        return f"<a {value.bit_length()}-bit number>"
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class RolloutSettings:
    preset: str = DEFAULT_PRESET  # the preset's name
    db_root: str | None = None  # databases as <root>/<db_id>/<db_id>.sqlite (None: each row's db_path)
    cache_dir: str | None = None  # the on-disk gold cache
    manifest: str | None = None  # refuse databases that differ from this manifest
    hash_databases: bool = False  # with a manifest: hash each database at first use
    concurrency: int | None = None  # SQL queries at once in this process (None: the CPU count)
    tool_timeout_s: float | None = None  # None: the preset's
    grade_timeout_s: float | None = None  # None: the preset's

    def __post_init__(self) -> None:
        for field in fields(self):
            object.__setattr__(self, field.name, check_setting(field.name, getattr(self, field.name)))

    def resolved_preset(self) -> Preset:
        """The preset named, with the timeouts given here in place of its own."""
        preset = get_preset(self.preset)
        if self.tool_timeout_s is not None or self.grade_timeout_s is not None:
            tool, grade = self.tool_timeout_s, self.grade_timeout_s
            preset = preset.replace(tool={"timeout_s": preset.tool.timeout_s if tool is None else tool},
                                    grading={"timeout_s": preset.grading.timeout_s if grade is None else grade})
        return preset


def open_grader(preset: Preset, **options: Any) -> Grader:
    """The Grader a preset's episodes run on: its grading part's timeout and temporary-disk cap, and `options`
    (other GraderSettings fields, e.g. concurrency, cache_dir)."""
    return Grader(GraderSettings(grade_timeout_s=preset.grading.timeout_s, max_temp_mb=preset.grading.max_temp_mb,
                                 **options))


class RolloutContext:
    """A preset, the Grader its episodes share, and where their databases are."""

    def __init__(self, preset: Preset, grader: Grader, *, db_root: str | None = None):
        self.preset = preset
        self.grader = grader
        self.db_root = db_root

    @classmethod
    def open(cls, settings: RolloutSettings) -> RolloutContext:
        preset = settings.resolved_preset()
        grader = open_grader(preset, concurrency=settings.concurrency, cache_dir=settings.cache_dir,
                             manifest=settings.manifest, hash_databases=settings.hash_databases)
        log.info("t2sql preset %s: %s", preset.name, preset.to_dict())
        return cls(preset, grader, db_root=settings.db_root)

    def task(self, row: Mapping[str, Any]) -> Task:
        """A data row (a BIRD question or a converted row) as a Task, its database under db_root if set."""
        return Task.from_row(row, self.db_root)

    def episode(self, task: Task, *, prompt: Sequence[Mapping[str, Any]] | None = None,
                count_tokens: Callable[[str], int] | None = None) -> Episode:
        """An episode of `task`. Without `prompt` its prompt is built here, which reads the schema (and
        runs SQL for example values on a database's first episode): from async code use
        `episode_async`, which does that off the event loop."""
        return Episode(task, self.preset, self.grader, prompt=prompt, count_tokens=count_tokens)

    async def episode_async(self, task: Task, *, prompt: Sequence[Mapping[str, Any]] | None = None,
                            count_tokens: Callable[[str], int] | None = None) -> Episode:
        """`episode` for async code: the prompt, when not given, is built on a worker thread."""
        if prompt is None:
            prompt = await build_prompt_async(task, self.preset)
        return Episode(task, self.preset, self.grader, prompt=prompt, count_tokens=count_tokens)

    async def regrade(self, task: Task, response: str) -> str:
        """The outcome of a finished response with no episode record: its last <solution> (after the
        last </think>) graded as the episode would; no_solution without one; gold_error when the
        database fails."""
        solution = parse_solution(strip_think((response or "").rsplit("</think>", 1)[-1]))
        if solution is None:
            return "no_solution"
        try:
            graded = await self.grader.grade(task.db_path, solution, task.gold_sql, self.preset.grade_spec(task))
        except DatabaseError:
            return "gold_error"
        return VERDICT_OUTCOMES[graded.outcome]

    def close(self) -> None:
        self.grader.close()


_contexts: dict[RolloutSettings, RolloutContext] = {}
_contexts_lock = threading.Lock()


def context(settings: RolloutSettings) -> RolloutContext:
    """This process's context for `settings`, made on first use (frameworks call rollouts on one
    event loop, or a few threads)."""
    with _contexts_lock:
        ctx = _contexts.get(settings)
        if ctx is None:
            ctx = _contexts[settings] = RolloutContext.open(settings)
        return ctx


def close_contexts() -> None:
    """Close the Graders this process's contexts made (tests; a framework's process simply exits)."""
    with _contexts_lock:
        for ctx in _contexts.values():
            ctx.close()
        _contexts.clear()
