"""Curriculum: hints for tasks a whole group missed, and learnability-weighted draws from epoch 2. The policy is
plain Python (`Curriculum`, tested without miles); the miles glue is `CurriculumDataSource` (a subclass of miles'
data source, made on first access) and `record_rollout`, which feeds each group's results to the policy. The
rules, the flags and the saved state: docs/recipe_extras.md, "Curriculum"."""

from __future__ import annotations

import copy
import json
import logging
import os
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from t2sql.atomic import atomic_write
from t2sql.episode.presets import get_preset
from t2sql.errors import CurriculumError
from t2sql.miles.hints import apply_hint, build_hint

log = logging.getLogger(__name__)

STATE_FORMAT = "t2sql-curriculum/1"
UNSEEN_WEIGHT = 0.25  # the largest p(1-p): an unknown task is treated as the most learnable
# A bare numeric reward counts as correct from here: between incorrect (0) and correct (1), and
# above any correct answer's reward after the recipe's shaping penalties.
CORRECT_REWARD_THRESHOLD = 0.5
META_TASK_KEY = "t2sql_task_key"
META_HINT_LEVEL = "t2sql_hint_level"


# ---------------------------------------------------------------- the policy


@dataclass
class TaskState:
    level: int = 0  # the hint level the task is shown at next
    last_p: float | None = None  # share correct of its last group at this level; None = unknown
    groups: int = 0  # groups observed
    zero_groups: int = 0  # of which scored 0/N


@dataclass(frozen=True)
class CurriculumConfig:
    """The preset's curriculum numbers (no defaults here: the preset owns them; from_preset)."""

    max_hint_level: int
    release_share: float | None  # None: hints never fade
    weight_floor: float
    weighted_from_epoch: int  # 1-based

    def __post_init__(self) -> None:
        if not 0 <= self.max_hint_level <= 3:
            raise CurriculumError(f"max_hint_level must be 0..3 (3 hint levels exist), got {self.max_hint_level}")
        if self.release_share is not None and not 0.0 < self.release_share <= 1.0:
            raise CurriculumError(f"release_share must be in (0, 1] or None, got {self.release_share}")
        if not 0.0 < self.weight_floor <= UNSEEN_WEIGHT:
            raise CurriculumError(f"weight_floor must be in (0, 0.25] so no task vanishes, got {self.weight_floor}")
        if self.weighted_from_epoch < 1:
            raise CurriculumError(f"weighted_from_epoch is 1-based and must be >= 1, got {self.weighted_from_epoch}")

    @classmethod
    def from_preset(cls, preset: Any) -> CurriculumConfig:
        return cls(
            max_hint_level=preset.curriculum.max_hint_level,
            release_share=preset.curriculum.release_share or None,
            weight_floor=preset.curriculum.weight_floor,
            weighted_from_epoch=preset.curriculum.weighted_from_epoch,
        )


class Curriculum:
    """Per-task hint levels and draw weights, and the deterministic plan of tasks per epoch."""

    def __init__(self, task_ids: Sequence[str], *, seed: int = 0, config: CurriculumConfig | None = None):
        ids = [str(t) for t in task_ids]
        if not ids:
            raise CurriculumError("the curriculum needs at least one task")
        dupes = [t for t, n in Counter(ids).items() if n > 1]
        if dupes:
            raise CurriculumError(f"task ids must be unique; repeated: {', '.join(dupes[:5])}")
        self.task_ids: list[str] = ids
        self.seed = int(seed)
        self.config = config or CurriculumConfig.from_preset(get_preset())
        self.tasks: dict[str, TaskState] = {t: TaskState() for t in ids}
        self.epoch = 0  # 0-based, like miles' epoch_id; epoch k is "epoch k+1" in the docs
        self.plan: list[str] = []
        self.offset = 0
        self.stale_groups = 0  # groups drawn at a hint level the task has left since (not used)

    # -- what the policy says about one task

    def hint_level(self, task_id: str) -> int:
        return self._task(task_id).level

    def weight(self, task_id: str) -> float:
        p = self._task(task_id).last_p
        if p is None:
            return UNSEEN_WEIGHT
        return max(p * (1.0 - p), self.config.weight_floor)

    def observe(self, task_id: str, correct: Sequence[bool], *, level: int | None = None) -> TaskState:
        """Record one group's results for a task. `level`: the hint level the group was drawn at;
        a group drawn at a level the task has since left is counted as stale and ignored."""
        state = self._task(task_id)
        results = [bool(c) for c in correct]
        if not results:
            return state
        if level is not None and level != state.level:
            self.stale_groups += 1
            return state
        p = sum(results) / len(results)
        state.groups += 1
        if p == 0.0:
            state.zero_groups += 1
            if state.level < self.config.max_hint_level:
                state.level += 1
                state.last_p = None  # a new prompt: its learnability is unknown
            else:
                state.last_p = 0.0
        elif self.config.release_share is not None and state.level > 0 and p >= self.config.release_share:
            state.level -= 1
            state.last_p = None
        else:
            state.last_p = p
        return state

    # -- the plan

    def next_tasks(self, n: int) -> list[tuple[str, int]]:
        """The next n (task_id, hint_level) draws, moving on to new epochs as plans run out."""
        out: list[tuple[str, int]] = []
        if not self.plan:
            self.plan, self.offset = self._plan(self.epoch), 0
        while len(out) < n:
            if self.offset >= len(self.plan):
                self.epoch += 1
                self.plan, self.offset = self._plan(self.epoch), 0
            take = self.plan[self.offset : self.offset + (n - len(out))]
            self.offset += len(take)
            out.extend((t, self.tasks[t].level) for t in take)
        return out

    def _plan(self, epoch: int) -> list[str]:
        rng = random.Random(f"t2sql-curriculum:{self.seed}:{epoch}")
        if epoch + 1 < self.config.weighted_from_epoch:
            order = list(self.task_ids)
            rng.shuffle(order)
            return order
        weights = [self.weight(t) for t in self.task_ids]
        return rng.choices(self.task_ids, weights=weights, k=len(self.task_ids))

    # -- reporting and state

    def summary(self) -> dict[str, Any]:
        levels = Counter(s.level for s in self.tasks.values())
        weights = [self.weight(t) for t in self.task_ids]
        return {
            "epoch": self.epoch + 1,
            "tasks": len(self.task_ids),
            "hinted": sum(n for lvl, n in levels.items() if lvl > 0),
            **{f"hint_level_{lvl}": levels.get(lvl, 0) for lvl in range(self.config.max_hint_level + 1)},
            "unseen": sum(1 for s in self.tasks.values() if s.last_p is None),
            "mean_weight": sum(weights) / len(weights),
            "stale_groups": self.stale_groups,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "seed": self.seed,
            "config": asdict(self.config),
            "epoch": self.epoch,
            "plan": list(self.plan),
            "offset": self.offset,
            "stale_groups": self.stale_groups,
            "tasks": {t: asdict(s) for t, s in self.tasks.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a saved state. Tasks unknown to this dataset are dropped (and counted in the log);
        tasks the state does not know start fresh; a plan naming a dropped task is rebuilt."""
        if state.get("format") != STATE_FORMAT:
            raise CurriculumError(f"not a curriculum state (format {state.get('format')!r}, expected {STATE_FORMAT!r})")
        saved = state.get("tasks") or {}
        dropped = [t for t in saved if t not in self.tasks]
        for t, s in saved.items():
            if t in self.tasks:
                self.tasks[t] = TaskState(**{k: s[k] for k in ("level", "last_p", "groups", "zero_groups") if k in s})
                self.tasks[t].level = min(self.tasks[t].level, self.config.max_hint_level)
        if dropped:
            log.warning("curriculum state names %d task(s) not in this dataset; dropped them", len(dropped))
        self.seed = int(state.get("seed", self.seed))
        self.epoch = int(state.get("epoch", 0))
        self.stale_groups = int(state.get("stale_groups", 0))
        plan = [str(t) for t in state.get("plan") or []]
        if all(t in self.tasks for t in plan):
            self.plan, self.offset = plan, int(state.get("offset", 0))
        else:
            self.plan, self.offset = self._plan(self.epoch), 0

    def save(self, path: str | os.PathLike) -> None:
        """Write the state as JSON, atomically (temp file + rename)."""
        # A training checkpoint's folder is the trainer's own: made here as miles makes its own (atomic_write
        # makes no folders).
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as f:
            json.dump(self.state_dict(), f)

    def load(self, path: str | os.PathLike) -> None:
        try:
            state = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise CurriculumError(f"{path}: not valid JSON ({e}); delete it to start the curriculum afresh") from e
        self.load_state_dict(state)

    def _task(self, task_id: str) -> TaskState:
        try:
            return self.tasks[str(task_id)]
        except KeyError:
            raise CurriculumError(f"unknown task {task_id!r}: not in the curriculum's dataset") from None


# ---------------------------------------------------------------- reading miles samples


def sample_correct(sample: Any) -> bool:
    """Whether a rolled-out sample answered correctly (the order of sources is in the module doc)."""
    reward = getattr(sample, "reward", None)
    meta = getattr(sample, "metadata", None)
    episode = meta.get("t2sql") if isinstance(meta, Mapping) else None  # t2sql.miles.adapter's record
    for source in (reward, episode, meta):
        if isinstance(source, Mapping):
            if "correct" in source:
                return bool(source["correct"])
            if "outcome" in source:
                return source["outcome"] == "correct"
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        return float(reward) >= CORRECT_REWARD_THRESHOLD
    return False


def _is_aborted(sample: Any) -> bool:
    status = getattr(sample, "status", None)
    return getattr(status, "name", str(status)).upper().endswith("ABORTED")


def _flatten(group: Any) -> list[Any]:
    if isinstance(group, (list, tuple)):
        return [s for item in group for s in _flatten(item)]
    return [group]


def task_key(sample: Any, fallback: str) -> str:
    meta = getattr(sample, "metadata", None) or {}
    label = getattr(sample, "label", None)
    for source in (meta, label if isinstance(label, Mapping) else {}):
        if source.get("question_id") not in (None, ""):
            return str(source["question_id"])
    return fallback


# ---------------------------------------------------------------- miles glue


def _preset_for(args: Any) -> Any:
    return get_preset(getattr(args, "text_to_sql_preset", None))


def curriculum_state_path(directory: str | os.PathLike, rollout_id: Any) -> Path:
    """Beside miles' own data-source state (rollout/global_dataset_state_dict_<id>.pt)."""
    return Path(directory) / "rollout" / f"t2sql_curriculum_{rollout_id}.json"


def make_data_source_class(base: type) -> type:
    """A curriculum data source over `base`, which must be shaped like miles'
    RolloutDataSourceWithBuffer (args, dataset.samples, buffer, _get_samples_from_buffer, epoch_id,
    sample_group_index, sample_index, save/load)."""

    class CurriculumDataSource(base):  # type: ignore[misc, valid-type]
        def __init__(self, args: Any):
            super().__init__(args)
            self.curriculum: Curriculum | None = None
            preset = _preset_for(args)
            if not preset.curriculum.enabled:
                log.info("curriculum: off in preset %s; drawing tasks as miles does", preset.name)
                return
            if getattr(self, "dataset", None) is None:
                raise CurriculumError("the curriculum needs miles' global dataset (it draws the tasks itself): "
                                      "drop --disable-rollout-global-dataset")
            samples = self.dataset.samples
            if samples and not isinstance(samples[0].prompt, list):
                raise CurriculumError(
                    "the curriculum adds hints to chat messages: run without --apply-chat-template "
                    "(t2sql's adapter renders the messages itself)"
                )
            keys = [task_key(s, f"row-{i}") for i, s in enumerate(samples)]
            # Keyed to the sample objects, not positions: miles re-permutes dataset.samples on
            # --rollout-shuffle (at every epoch and on load), the objects stay the same.
            self._by_key = dict(zip(keys, samples))
            if len(self._by_key) != len(keys):
                raise CurriculumError("two prompt rows share a question_id; make them unique (t2sql convert does)")
            self.curriculum = Curriculum(
                keys, seed=getattr(args, "rollout_seed", 0) or 0, config=CurriculumConfig.from_preset(preset)
            )
            log.info("curriculum: on, %d tasks, %s", len(keys), self.curriculum.config)

        def get_samples(self, num_samples: int) -> list[list[Any]]:
            if self.curriculum is None:
                return super().get_samples(num_samples)
            groups = self._get_samples_from_buffer(num_samples)
            for key, level in self.curriculum.next_tasks(num_samples - len(groups)):
                groups.append(self._group(key, level))
            self.epoch_id = self.curriculum.epoch
            return groups

        def _group(self, key: str, level: int) -> list[Any]:
            prompt_sample = copy.deepcopy(self._by_key[key])
            meta = dict(prompt_sample.metadata or {})
            meta[META_TASK_KEY] = key
            meta[META_HINT_LEVEL] = level
            if level > 0:
                label = prompt_sample.label if isinstance(prompt_sample.label, Mapping) else {}
                hint = build_hint(meta.get("evidence", ""), label.get("gold_sql", ""), level)
                prompt_sample.prompt = apply_hint(prompt_sample.prompt, hint)
            prompt_sample.metadata = meta
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                sample = copy.deepcopy(prompt_sample)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            return group

        def record_groups(self, all_samples: Iterable[Any]) -> int:
            """Feed finished groups to the policy; returns how many groups were recorded."""
            if self.curriculum is None:
                return 0
            recorded = 0
            for group in all_samples:
                samples = [s for s in _flatten(group) if not _is_aborted(s)]
                if not samples:
                    continue
                meta = samples[0].metadata or {}
                key = meta.get(META_TASK_KEY) or task_key(samples[0], "")
                if key not in self._by_key:
                    continue  # not one of ours (e.g. an eval sample)
                self.curriculum.observe(key, [sample_correct(s) for s in samples], level=meta.get(META_HINT_LEVEL))
                recorded += 1
            return recorded

        def save(self, rollout_id: Any) -> None:
            super().save(rollout_id)
            if self.curriculum is not None and getattr(self.args, "save", None):
                self.curriculum.save(curriculum_state_path(self.args.save, rollout_id))

        def load(self, rollout_id: Any = None) -> None:
            super().load(rollout_id)
            if self.curriculum is None or not getattr(self.args, "load", None):
                return
            path = curriculum_state_path(self.args.load, rollout_id)
            if path.exists():
                self.curriculum.load(path)
                log.info("curriculum: restored from %s: %s", path, self.curriculum.summary())
            else:
                log.info("curriculum: no state at %s; starting fresh", path)

    return CurriculumDataSource


def record_rollout(args: Any, all_samples: list[Any], data_source: Any) -> None:
    """miles --rollout-all-samples-process-path hook: every group of the rollout, filtered or not.

    miles calls it as `f(args, all_samples, data_source)` where `data_source` is the bound method
    `data_source.get_samples` (miles/rollout/inference_rollout/inference_rollout_train.py and the
    legacy sglang_rollout.py both pass it so), not the data source: the source is its `__self__`.
    The object itself is accepted too."""
    source = getattr(data_source, "__self__", data_source)
    record = getattr(source, "record_groups", None)
    if record is None:
        raise CurriculumError(
            "record_rollout needs the curriculum data source (got "
            f"{type(source).__name__}): add --data-source-path t2sql.curriculum.CurriculumDataSource"
        )
    n = record(all_samples)
    if source.curriculum is not None:
        log.info("curriculum: recorded %d groups; %s", n, source.curriculum.summary())


def __getattr__(name: str) -> Any:
    # `CurriculumDataSource` is built on first access so that importing this module never imports miles.
    if name == "CurriculumDataSource":
        from miles.rollout.data_source import RolloutDataSourceWithBuffer

        cls = make_data_source_class(RolloutDataSourceWithBuffer)
        cls.__module__ = __name__
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
