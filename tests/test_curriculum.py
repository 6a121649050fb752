"""Curriculum: the hint texts, the policy (plain Python), and the miles glue over stand-ins shaped
like miles' data source and Sample (miles is not installable here)."""

from __future__ import annotations

import json
import sys
import textwrap
from collections import Counter
from dataclasses import MISSING, fields, replace
from types import SimpleNamespace

import pytest

from t2sql.commands import curriculum as curriculum_command
from t2sql.episode.presets import get_preset
from t2sql.errors import CurriculumError
from t2sql.miles import curriculum as cur
from t2sql.miles import hints
from t2sql.miles.curriculum import Curriculum, CurriculumConfig, record_rollout, sample_correct
from t2sql.miles.hints import apply_hint, build_hint, gold_parts

RECIPE_CONFIG = CurriculumConfig.from_preset(get_preset())

JOIN_SQL = (
    "SELECT COUNT(T1.id) FROM superhero AS T1 INNER JOIN colour AS T2 "
    "ON T1.eye_colour_id = T2.id WHERE T2.colour = 'Blue'"
)
EVIDENCE = "blue eyes refers to colour = 'Blue'"


# ------------------------------------------------------------------ the gold query's parts and hints


@pytest.mark.parametrize(
    "sql, skeleton, select_list",
    [
        (JOIN_SQL, "FROM superhero AS T1 INNER JOIN colour AS T2", "COUNT(T1.id)"),
        ("SELECT DISTINCT T1.name, T2.x FROM a T1, b T2 WHERE T1.id = T2.id", "FROM a T1, b T2", "T1.name, T2.x"),
        ("SELECT x FROM (SELECT y AS x FROM t WHERE z) AS s JOIN u USING (x) ORDER BY x",
         "FROM (subquery) AS s JOIN u", "x"),
        ("WITH c AS (SELECT 1 FROM q) SELECT `a b`, \"c\" FROM c LEFT OUTER JOIN [d] ON c.k = [d].k GROUP BY 1",
         "FROM c LEFT OUTER JOIN [d]", '`a b`, "c"'),
        ("select T2.a\n from t as T1\n  inner   join s T2 on T1.id=T2.id;", "from t as T1 inner join s T2", "T2.a"),
        # An ON condition holding a subquery and a string with SQL words in it is skipped whole.
        ("SELECT a FROM t1 JOIN t2 ON t1.x = 'FROM x WHERE' JOIN t3 ON t3.y IN (SELECT 1 FROM z) LIMIT 1",
         "FROM t1 JOIN t2 JOIN t3", "a"),
        ("SELECT 1", "", "1"),
        ("not sql at all", "", ""),
    ],
)
def test_gold_parts(sql, skeleton, select_list):
    parts = gold_parts(sql)
    assert parts.from_skeleton == skeleton
    assert parts.select_list == select_list


def test_gold_parts_lists_tables_read_by_scalar_subqueries():
    sql = "SELECT (SELECT w FROM superhero WHERE n = 'a') - (SELECT w FROM hero_power JOIN superhero ON 1)"
    parts = gold_parts(sql)
    assert parts.from_skeleton == ""
    assert parts.tables == ("superhero", "hero_power")
    assert "- The answer reads the tables: superhero, hero_power" in build_hint("", sql, 2)


def test_hint_levels_add_evidence_then_skeleton_then_select_list():
    assert build_hint(EVIDENCE, JOIN_SQL, 0) == ""
    one = build_hint(EVIDENCE, JOIN_SQL, 1)
    two = build_hint(EVIDENCE, JOIN_SQL, 2)
    three = build_hint(EVIDENCE, JOIN_SQL, 3)
    assert one == f"{hints.HINT_HEADER}\n- Evidence, restated: {EVIDENCE}"
    assert two == one + "\n- The answer's FROM/JOIN skeleton: FROM superhero AS T1 INNER JOIN colour AS T2"
    assert three == two + "\n- The answer's SELECT list: COUNT(T1.id)"
    # The hint never gives away the WHERE clause or the join conditions.
    assert "eye_colour_id" not in three and "WHERE" not in three


def test_level_one_without_evidence_gives_the_skeleton():
    assert "FROM/JOIN skeleton" in build_hint("  ", JOIN_SQL, 1)
    assert build_hint("", "not sql", 1) == ""  # nothing to say: no hint at all


def test_apply_hint_appends_to_the_last_user_message_without_mutating():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Question: q"}]
    out = apply_hint(messages, "Hint: h")
    assert out[1]["content"] == "Question: q\n\nHint: h"
    assert messages[1]["content"] == "Question: q"
    assert apply_hint(messages, "") == messages
    with pytest.raises(CurriculumError, match="no user message"):
        apply_hint([{"role": "system", "content": "s"}], "Hint: h")


# ------------------------------------------------------------------ the policy


def _ids(n):
    return [f"q{i}" for i in range(n)]


def test_zero_groups_raise_the_hint_level_up_to_the_cap():
    c = Curriculum(_ids(3), seed=1)
    for expected in (1, 2, 3, 3):
        c.observe("q0", [False] * 16)
        assert c.hint_level("q0") == expected
    assert c.tasks["q0"].zero_groups == 4
    assert c.tasks["q0"].last_p == 0.0  # at the cap, the 0/16 is kept as its learnability
    assert c.weight("q0") == c.config.weight_floor
    assert c.hint_level("q1") == 0


def test_a_successful_hinted_group_gives_a_level_back_and_a_middling_one_keeps_it():
    c = Curriculum(_ids(2), seed=1)
    c.observe("q0", [False] * 16)
    c.observe("q0", [False] * 16)
    assert c.hint_level("q0") == 2
    c.observe("q0", [True] * 4 + [False] * 12)  # 0.25 < release share 0.5: stays
    assert c.hint_level("q0") == 2 and c.tasks["q0"].last_p == 0.25
    c.observe("q0", [True] * 8 + [False] * 8)  # 0.5: one level back, learnability unknown again
    assert c.hint_level("q0") == 1 and c.tasks["q0"].last_p is None
    never = Curriculum(_ids(1), config=replace(RECIPE_CONFIG, release_share=None))
    never.observe("q0", [False] * 4)
    never.observe("q0", [True] * 4)
    assert never.hint_level("q0") == 1


def test_groups_drawn_at_an_old_level_are_ignored():
    c = Curriculum(_ids(1))
    c.observe("q0", [False] * 4, level=0)
    c.observe("q0", [False] * 4, level=0)  # drawn before the first result raised the level
    assert c.hint_level("q0") == 1 and c.stale_groups == 1


def test_weights_are_learnability_with_a_floor():
    c = Curriculum(_ids(4), config=replace(RECIPE_CONFIG, weight_floor=0.02))
    assert c.weight("q0") == cur.UNSEEN_WEIGHT
    c.observe("q1", [True] * 8 + [False] * 8)
    c.observe("q2", [True] * 16)
    c.observe("q3", [True] * 4 + [False] * 12)
    assert c.weight("q1") == pytest.approx(0.25)
    assert c.weight("q2") == pytest.approx(0.02)
    assert c.weight("q3") == pytest.approx(0.1875)
    with pytest.raises(CurriculumError, match="unknown task"):
        c.weight("nope")


def test_epoch_one_is_a_seeded_permutation_and_deterministic():
    ids = _ids(50)
    first = [t for t, _ in Curriculum(ids, seed=3).next_tasks(50)]
    assert sorted(first) == sorted(ids) and first != ids
    assert first == [t for t, _ in Curriculum(ids, seed=3).next_tasks(50)]
    assert first != [t for t, _ in Curriculum(ids, seed=4).next_tasks(50)]


def test_from_epoch_two_draws_follow_learnability():
    ids = _ids(100)
    c = Curriculum(ids, seed=5, config=replace(RECIPE_CONFIG, weight_floor=0.01))
    c.next_tasks(100)  # epoch 1
    for i, t in enumerate(ids):  # even tasks: p = 0.5 (weight 0.25); odd: solved (floor 0.01)
        c.observe(t, [True, False] if i % 2 == 0 else [True, True])
    draws = Counter()
    for _ in range(10):
        draws.update(t for t, _ in c.next_tasks(100))
    learnable = sum(n for t, n in draws.items() if int(t[1:]) % 2 == 0)
    solved = sum(n for t, n in draws.items() if int(t[1:]) % 2 == 1)
    assert learnable + solved == 1000
    # Expected share 0.25 / 0.26 = 96%; the floor keeps solved tasks alive (about 38 draws).
    assert learnable > 900
    assert solved > 0
    assert c.epoch == 10  # 0-based: epochs 2..11 were drawn


def test_next_tasks_crosses_epochs_and_reports_levels():
    c = Curriculum(_ids(3), seed=0)
    c.observe("q1", [False] * 16)
    draws = c.next_tasks(7)
    assert len(draws) == 7 and c.epoch == 2
    assert all(level == (1 if t == "q1" else 0) for t, level in draws)


def test_state_round_trip_continues_the_same_plan(tmp_path):
    ids = _ids(20)
    a = Curriculum(ids, seed=9)
    a.next_tasks(25)  # into epoch 2
    a.observe("q3", [False] * 16)
    a.observe("q4", [True, False, False, False])
    path = tmp_path / "ckpt" / "curriculum.json"
    a.save(path)
    assert [p.name for p in path.parent.iterdir()] == ["curriculum.json"]  # no temp file left
    b = Curriculum(ids, seed=0)  # the saved seed wins
    b.load(path)
    assert b.state_dict() == a.state_dict()
    assert b.next_tasks(30) == a.next_tasks(30)


def test_loading_a_state_from_a_changed_dataset(tmp_path):
    a = Curriculum(["x", "y", "z"], seed=1)
    a.next_tasks(2)
    a.observe("x", [False] * 4)
    b = Curriculum(["x", "w"], seed=1)
    b.load_state_dict(a.state_dict())
    assert b.hint_level("x") == 1 and b.hint_level("w") == 0
    assert sorted(t for t, _ in b.next_tasks(2)) == ["w", "x"]  # the old plan named y, z: rebuilt


def test_bad_states_and_configs_are_rejected(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CurriculumError, match="not valid JSON"):
        Curriculum(["a"]).load(bad)
    with pytest.raises(CurriculumError, match="format"):
        Curriculum(["a"]).load_state_dict({"format": "other"})
    with pytest.raises(CurriculumError, match="unique"):
        Curriculum(["a", "a"])
    with pytest.raises(CurriculumError, match="at least one"):
        Curriculum([])
    with pytest.raises(CurriculumError, match="weight_floor"):
        replace(RECIPE_CONFIG, weight_floor=0.0)
    with pytest.raises(CurriculumError, match="max_hint_level"):
        replace(RECIPE_CONFIG, max_hint_level=4)


def test_config_from_presets():
    recipe = get_preset("qwen3.6-35b-a3b")
    assert recipe.curriculum.enabled is True
    assert CurriculumConfig.from_preset(recipe).max_hint_level == recipe.curriculum.max_hint_level
    assert get_preset("bare").curriculum.enabled is False
    # One owner of the numbers, the preset: the config has no defaults of its own, and a policy given none
    # takes the recipe preset's.
    assert [f.name for f in fields(CurriculumConfig) if f.default is not MISSING] == []
    assert Curriculum(["a"]).config == RECIPE_CONFIG


def test_sample_correct_reads_the_adapter_reward_then_metadata_then_numbers():
    assert sample_correct(SimpleNamespace(reward={"reward": 0.8, "correct": 1.0}, metadata={}))
    assert not sample_correct(SimpleNamespace(reward={"reward": 0.0, "correct": 0.0}, metadata={}))
    assert sample_correct(SimpleNamespace(reward=None, metadata={"t2sql": {"outcome": "correct"}}))
    assert not sample_correct(SimpleNamespace(reward=None, metadata={"t2sql": {"correct": False}}))
    assert sample_correct(SimpleNamespace(reward=0.9, metadata={}))
    assert not sample_correct(SimpleNamespace(reward=0.0, metadata={}))
    assert not sample_correct(SimpleNamespace(reward=None, metadata=None))


# ------------------------------------------------------------------ the miles glue, over stand-ins

MILES_STANDIN = {
    "miles/__init__.py": "",
    "miles/rollout/__init__.py": "",
    "miles/utils/__init__.py": "",
    "miles/utils/types.py": """
        from dataclasses import dataclass, field
        from enum import Enum
        from typing import Any

        @dataclass
        class Sample:
            class Status(Enum):
                PENDING = "pending"
                COMPLETED = "completed"
                TRUNCATED = "truncated"
                ABORTED = "aborted"

            prompt: Any = ""
            label: Any = None
            metadata: dict = field(default_factory=dict)
            group_index: int | None = None
            index: int | None = None
            reward: Any = None
            status: Status = Status.PENDING
    """,
    # Shaped like miles/rollout/data_source.py: a sequential dataset walk, a buffer served first,
    # and its own checkpoint file (JSON here, torch.save in miles).
    "miles/rollout/data_source.py": """
        import copy, json, os
        from miles.utils.types import Sample

        class Dataset:
            def __init__(self, path, label_key, metadata_key, prompt_key):
                self.origin_samples = []
                with open(path) as f:
                    for line in f:
                        row = json.loads(line)
                        self.origin_samples.append(Sample(prompt=row[prompt_key], label=row[label_key],
                                                          metadata=row.get(metadata_key) or {}))
                self.samples = self.origin_samples

            def shuffle(self, epoch_id):  # like miles: a new permutation of the same objects
                order = sorted(range(len(self.origin_samples)), key=lambda i: hash((epoch_id, i)) % 9973)
                self.samples = [self.origin_samples[i] for i in reversed(order)]

        class RolloutDataSource:
            def __init__(self, args):
                self.args = args
                self.epoch_id = 0
                self.sample_group_index = 0
                self.sample_index = 0
                self.sample_offset = 0
                self.metadata = {}
                self.dataset = (Dataset(args.prompt_data, args.label_key, args.metadata_key, args.input_key)
                                if args.rollout_global_dataset else None)
                if self.dataset is not None and args.rollout_shuffle:
                    self.dataset.shuffle(self.epoch_id)

            def get_samples(self, num_samples):
                out = []
                for _ in range(num_samples):
                    if self.sample_offset >= len(self.dataset.samples):
                        self.sample_offset = 0
                        self.epoch_id += 1
                    prompt_sample = self.dataset.samples[self.sample_offset]
                    self.sample_offset += 1
                    group = []
                    for _ in range(self.args.n_samples_per_prompt):
                        s = copy.deepcopy(prompt_sample)
                        s.group_index, s.index = self.sample_group_index, self.sample_index
                        self.sample_index += 1
                        group.append(s)
                    self.sample_group_index += 1
                    out.append(group)
                return out

            def save(self, rollout_id):
                path = os.path.join(self.args.save, f"rollout/global_dataset_state_dict_{rollout_id}.json")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    json.dump({"sample_offset": self.sample_offset, "epoch_id": self.epoch_id,
                               "sample_group_index": self.sample_group_index,
                               "sample_index": self.sample_index}, f)

            def load(self, rollout_id=None):
                if self.args.load is None:
                    return
                path = os.path.join(self.args.load, f"rollout/global_dataset_state_dict_{rollout_id}.json")
                if os.path.exists(path):
                    with open(path) as f:
                        state = json.load(f)
                    for k, v in state.items():
                        setattr(self, k, v)
                    if self.args.rollout_shuffle:
                        self.dataset.shuffle(self.epoch_id)

        class RolloutDataSourceWithBuffer(RolloutDataSource):
            def __init__(self, args):
                super().__init__(args)
                self.buffer = []

            def get_samples(self, num_samples):
                samples = self._get_samples_from_buffer(num_samples)
                num_samples -= len(samples)
                if num_samples == 0:
                    return samples
                return samples + super().get_samples(num_samples)

            def _get_samples_from_buffer(self, num_samples):
                taken = self.buffer[:num_samples]
                del self.buffer[:num_samples]
                return taken

            def add_samples(self, samples):
                for group in samples:
                    assert len(group) == self.args.n_samples_per_prompt
                    self.buffer.append(group)
    """,
}

TASKS = [
    {"question_id": "1", "evidence": EVIDENCE, "gold_sql": JOIN_SQL},
    {"question_id": "2", "evidence": "", "gold_sql": "SELECT name FROM publisher"},
    {"question_id": "3", "evidence": "tall refers to height_cm > 200", "gold_sql": "SELECT COUNT(*) FROM superhero"},
]


@pytest.fixture
def miles_standin(tmp_path, monkeypatch):
    root = tmp_path / "standin"
    for rel, text in MILES_STANDIN.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "miles" or m.startswith("miles.")]:
        monkeypatch.delitem(sys.modules, name)
    # The class is built on first access and cached in the module: start from scratch, leave no trace.
    monkeypatch.delitem(cur.__dict__, "CurriculumDataSource", raising=False)
    yield
    cur.__dict__.pop("CurriculumDataSource", None)


def _args(tmp_path, preset="qwen3.6-35b-a3b", **over):
    data = tmp_path / "train.jsonl"
    with data.open("w") as f:
        for t in TASKS:
            row = {
                "prompt": [{"role": "system", "content": "sys"},
                           {"role": "user", "content": f"Question {t['question_id']}"}],
                "label": {"gold_sql": t["gold_sql"], "db_id": "superhero", "question_id": t["question_id"]},
                "metadata": {"question_id": t["question_id"], "db_id": "superhero", "evidence": t["evidence"]},
            }
            f.write(json.dumps(row) + "\n")
    args = SimpleNamespace(
        prompt_data=str(data), input_key="prompt", label_key="label", metadata_key="metadata",
        rollout_global_dataset=True, n_samples_per_prompt=4, rollout_seed=11, text_to_sql_preset=preset,
        save=str(tmp_path / "ckpt"), load=None, buffer_filter_path=None, rollout_shuffle=True,
    )
    for k, v in over.items():
        setattr(args, k, v)
    return args


def _finish(groups, correct_by_task):
    """Give every sample a reward dict the way t2sql.miles.adapter does."""
    from miles.utils.types import Sample

    for group in groups:
        for i, s in enumerate(group):
            ok = correct_by_task[s.metadata["question_id"]](i)
            s.reward = {"reward": 1.0 if ok else 0.0, "category": "correct" if ok else "incorrect",
                        "correct": 1.0 if ok else 0.0}
            s.status = Sample.Status.COMPLETED


def test_data_source_is_loaded_by_path_and_subclasses_miles(miles_standin):
    import importlib

    module_path, _, attr = "t2sql.curriculum.CurriculumDataSource".rpartition(".")
    cls = getattr(importlib.import_module(module_path), attr)  # what miles' load_function does
    from miles.rollout.data_source import RolloutDataSourceWithBuffer

    assert issubclass(cls, RolloutDataSourceWithBuffer)
    assert cls.__module__ == "t2sql.miles.curriculum"


def test_curriculum_hints_a_task_its_group_missed(miles_standin, tmp_path):
    args = _args(tmp_path)
    ds = cur.CurriculumDataSource(args)
    groups = ds.get_samples(3)  # epoch 1: each task once
    assert sorted(g[0].metadata["question_id"] for g in groups) == ["1", "2", "3"]
    assert [len(g) for g in groups] == [4, 4, 4]
    assert [s.index for g in groups for s in g] == list(range(12))
    assert [g[0].group_index for g in groups] == [0, 1, 2]
    assert all(g[0].metadata[cur.META_HINT_LEVEL] == 0 for g in groups)
    assert all("Hint" not in g[0].prompt[-1]["content"] for g in groups)

    _finish(groups, {"1": lambda i: False, "2": lambda i: i < 2, "3": lambda i: True})
    # Exactly what miles passes as `data_source`: the bound method (inference_rollout_train.py:176).
    record_rollout(args, groups, ds.get_samples)
    assert ds.curriculum.hint_level("1") == 1
    assert ds.curriculum.tasks["2"].last_p == 0.5

    later = ds.get_samples(9)  # epoch 2: weighted draws with replacement
    assert ds.epoch_id >= 1
    by_task = {g[0].metadata["question_id"]: g for g in later}
    assert "1" in by_task  # weight 0.25 (new level, unseen) vs task 3 at the floor; seeded, so stable
    hinted = by_task["1"][0]
    assert hinted.metadata[cur.META_HINT_LEVEL] == 1
    assert hinted.prompt[-1]["content"] == "Question 1\n\n" + build_hint(EVIDENCE, JOIN_SQL, 1)
    assert ds.dataset.origin_samples[0].prompt[-1]["content"] == "Question 1"  # the dataset row is untouched


def test_buffer_is_served_first_and_aborted_samples_are_not_counted(miles_standin, tmp_path):
    from miles.utils.types import Sample

    args = _args(tmp_path)
    ds = cur.CurriculumDataSource(args)
    first = ds.get_samples(1)
    ds.add_samples(first)
    again = ds.get_samples(2)
    assert again[0] is first[0]
    for s in again[0]:
        s.status = Sample.Status.ABORTED
        s.reward = {"correct": 0.0}
    assert ds.record_groups([again[0]]) == 0
    assert ds.curriculum.hint_level(again[0][0].metadata["question_id"]) == 0


def test_checkpoint_save_and_resume_continue_the_same_draws(miles_standin, tmp_path):
    args = _args(tmp_path)
    ds = cur.CurriculumDataSource(args)
    groups = ds.get_samples(3)
    _finish(groups, {"1": lambda i: False, "2": lambda i: i == 0, "3": lambda i: True})
    record_rollout(args, groups, ds.get_samples)
    ds.get_samples(2)  # into epoch 2, so miles' resume re-permutes dataset.samples differently
    assert ds.epoch_id == 1
    ds.save(5)
    saved = cur.curriculum_state_path(args.save, 5)
    assert saved.exists()
    assert json.loads(saved.read_text())["tasks"]["1"]["level"] == 1

    resumed = cur.CurriculumDataSource(_args(tmp_path, load=args.save))
    resumed.load(5)
    assert resumed.curriculum.state_dict() == ds.curriculum.state_dict()
    assert resumed.sample_index == ds.sample_index  # miles' own state came back too
    a = [(g[0].metadata["question_id"], g[0].prompt[-1]["content"]) for g in ds.get_samples(6)]
    b = [(g[0].metadata["question_id"], g[0].prompt[-1]["content"]) for g in resumed.get_samples(6)]
    assert a == b
    missing = cur.CurriculumDataSource(_args(tmp_path, load=str(tmp_path / "nowhere")))
    missing.load(5)  # no checkpoint: starts fresh, no error
    assert missing.curriculum.epoch == 0


def test_record_rollout_takes_the_source_or_its_bound_method(miles_standin, tmp_path):
    args = _args(tmp_path)
    ds = cur.CurriculumDataSource(args)
    groups = ds.get_samples(3)
    _finish(groups, {"1": lambda i: False, "2": lambda i: True, "3": lambda i: True})
    record_rollout(args, groups, ds)  # the object itself (a caller other than miles)
    assert ds.curriculum.hint_level("1") == 1


def test_record_rollout_without_the_curriculum_source_says_which_flag(miles_standin, tmp_path):
    from miles.rollout.data_source import RolloutDataSourceWithBuffer

    plain = RolloutDataSourceWithBuffer(_args(tmp_path))
    with pytest.raises(cur.CurriculumError, match="--data-source-path t2sql.curriculum.CurriculumDataSource"):
        record_rollout(plain.args, [], plain.get_samples)


def test_bare_preset_leaves_miles_drawing(miles_standin, tmp_path):
    args = _args(tmp_path, preset="bare", rollout_shuffle=False)
    ds = cur.CurriculumDataSource(args)
    assert ds.curriculum is None
    groups = ds.get_samples(4)
    assert [g[0].metadata["question_id"] for g in groups] == ["1", "2", "3", "1"]  # miles' sequential walk
    assert ds.record_groups(groups) == 0


def test_misconfiguration_is_reported(miles_standin, tmp_path):
    with pytest.raises(CurriculumError, match="--data-source-path"):
        record_rollout(None, [], object())
    args = _args(tmp_path)
    lines = [json.loads(x) for x in open(args.prompt_data)]
    for row in lines:
        row["prompt"] = "<|im_start|>user ..."  # a rendered string: --apply-chat-template was on
    with open(args.prompt_data, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in lines)
    with pytest.raises(CurriculumError, match="--apply-chat-template"):
        cur.CurriculumDataSource(args)
    with pytest.raises(CurriculumError, match="--disable-rollout-global-dataset"):
        cur.CurriculumDataSource(_args(tmp_path, rollout_global_dataset=False))


def test_import_does_not_load_miles():
    import subprocess

    code = "import sys, t2sql.miles.curriculum; assert not any(m.startswith('miles') for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ `t2sql curriculum` (inspect a state)


def _cli(argv):
    import argparse

    parser = argparse.ArgumentParser()
    curriculum_command.add_arguments(parser)
    return curriculum_command.run(parser.parse_args(argv))


def test_inspect_command_reports_hinted_tasks_with_their_hint(tmp_path, capsys):
    policy = Curriculum(["1", "2", "3"], seed=2)
    policy.next_tasks(3)
    policy.observe("1", [False] * 16)
    policy.observe("1", [False] * 16)
    policy.observe("2", [True, False])
    state = tmp_path / "t2sql_curriculum_7.json"
    policy.save(state)
    data = tmp_path / "train.jsonl"
    row = {"prompt": [], "label": {"gold_sql": JOIN_SQL, "question_id": "1"},
           "metadata": {"question_id": "1", "evidence": EVIDENCE}}
    data.write_text(json.dumps(row) + "\n{broken line\n")

    assert _cli([str(state), "--data", str(data), "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["summary"]["hinted"] == 1 and report["summary"]["hint_level_2"] == 1
    assert [r["task"] for r in report["hinted"]] == ["1"]
    assert report["hinted"][0]["hint"] == build_hint(EVIDENCE, JOIN_SQL, 2)
    assert "train.jsonl:2: skipped" in err

    assert _cli([str(state)]) == 0
    table = capsys.readouterr().out
    assert "hint_level_2  1" in table and "task" in table


def test_inspect_command_rejects_a_file_that_is_not_a_state(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"format": "something else"}')
    assert _cli([str(bad)]) == 2
    assert "not a curriculum state" in capsys.readouterr().err
    bad.write_text("{nope")
    assert _cli([str(bad)]) == 2
    assert "x.json: not JSON" in capsys.readouterr().err
    assert _cli([str(tmp_path / "missing.json")]) == 2


def test_a_hinted_prompt_reaches_the_episode_the_model_sees():
    import asyncio
    from pathlib import Path

    import t2sql
    from t2sql.episode.machine import Episode
    from t2sql.episode.presets import get_preset
    from t2sql.episode.prompt import build_prompt
    from t2sql.serving.grader import Grader
    from t2sql.tasks import Task

    sample = Path(t2sql.__file__).parent / "sample"
    row = json.loads((sample / "dev.json").read_text())[0]
    task = Task.from_row(row, sample)
    preset = get_preset("qwen3.6-35b-a3b")
    hint = build_hint(task.evidence, task.gold_sql, 3)
    messages = apply_hint(build_prompt(task, preset), hint)

    async def first_turn():
        async with Grader(concurrency=1) as grader:
            episode = Episode(task, preset, grader, prompt=messages)
            user = [m for m in episode.messages if m["role"] == "user"][-1]["content"]
            await episode.on_turn(f"<solution>{task.gold_sql}</solution>")
            return user, episode.result

    user, result = asyncio.run(first_turn())
    assert user.endswith(hint)
    assert "The answer's SELECT list: T3.power_name" in user
    assert result.outcome == "correct"
