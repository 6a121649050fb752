"""t2sql's episode inside TRL's GRPOTrainer (TRL >= 1.16): an environment, a reward function, a dataset.

    from trl import GRPOConfig, GRPOTrainer
    from t2sql.integrations.trl import SQLEnvironment, sql_reward, train_dataset

    args = GRPOConfig(..., chat_template_kwargs={"enable_thinking": True})
    environment = SQLEnvironment.configured(db_root=..., tokenizer=tokenizer,
                                            chat_template_kwargs=args.chat_template_kwargs)
    trainer = GRPOTrainer(model=..., processing_class=tokenizer, reward_funcs=[sql_reward],
                          environment_factory=environment, train_dataset=train_dataset("out/data/train.jsonl"),
                          args=args)

How an episode meets TRL (the tool, the turns read from the token ids, cut rollouts, metrics): docs/trl.md."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from t2sql.atomic import first_line, read_head
from t2sql.chat_template import ChatTemplate
from t2sql.data import convert
from t2sql.databases import database_path
from t2sql.episode import parsing, prompt
from t2sql.episode.machine import Episode, EpisodeResult
from t2sql.episode.metrics import ROLLOUT_LOG_NAMES, record_metrics
from t2sql.episode.rollout import RolloutSettings
from t2sql.errors import AdapterError, DataError
from t2sql.integrations import (
    entry_point,
    module_help,
    on_episode_loop,
    open_episode,
    require,
    rows,
    settings_from_env,
)
from t2sql.tasks import release_dir

with entry_point(__name__):
    require("trl", framework="TRL", extra="trl", minimum="1.16", below="2")
    datasets = require("datasets", framework="Hugging Face datasets", extra="trl", minimum="4.7")

TOOL_NAME = prompt.TOOL_NAME
ROW_COLUMN = rows.ROW_KEY  # the dataset column holding the t2sql row's JSON


# ------------------------------------------------------------------------------- the environment


def _tool_docstring() -> str:
    """The tool method's docstring, written from t2sql's tool spec: transformers builds TRL's schema from
    it, so the model is shown exactly t2sql's tool (the test checks the two agree)."""
    function = prompt.TOOL_SPEC["function"]
    (name, about), = function["parameters"]["properties"].items()
    return f"{function['description']}\n\nArgs:\n    {name}: {about['description']}"


class SQLEnvironment:
    """One rollout's text-to-SQL episode, for `GRPOTrainer(environment_factory=...)`.

    Build it with `SQLEnvironment.configured(tokenizer=..., chat_template_kwargs=..., **settings)`: the
    reward reads the model's tokens with the tokenizer (settings the factory leaves out come from the T2SQL_*
    environment variables, t2sql.integrations.settings_from_env). After `sql_reward` has scored a rollout,
    `result` holds its EpisodeResult and `turns` the assistant turns as recorded."""

    def __init__(self, *, settings: RolloutSettings | None = None, tokenizer: Any = None,
                 chat_template_kwargs: Mapping[str, Any] | None = None):
        self.settings = settings if settings is not None else settings_from_env()
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.episode: Episode | None = None
        self.task_row: dict[str, Any] | None = None
        self.result: EpisodeResult | None = None
        self.turns: list[str] = []  # the assistant turns as recorded (sql_reward fills them)
        self.cut: str | None = None  # "turn" when TRL stopped the rollout before the model was done
        self._prompt: list[dict[str, Any]] = []
        self._live_calls: list[parsing.ToolCall] = []  # the calls TRL made on this environment, in order

    @classmethod
    def configured(cls, *, tokenizer: Any = None, chat_template_kwargs: Mapping[str, Any] | None = None,
                   **settings: Any) -> Callable[[], SQLEnvironment]:
        """A factory for `environment_factory` with these settings (preset=..., db_root=..., cache_dir=...,
        manifest=..., concurrency=..., tool_timeout_s=..., grade_timeout_s=...: RolloutSettings' fields,
        T2SQL_* variables filling the rest). `tokenizer` (the trainer's processing class) and
        `chat_template_kwargs` (GRPOConfig's) are how the reward reads the model's own tokens: each turn
        decoded from the completion's ids, the tool results between them rendered as TRL renders them."""
        resolved = settings_from_env(**settings)
        return functools.partial(cls, settings=resolved, tokenizer=tokenizer,
                                 chat_template_kwargs=dict(chat_template_kwargs or {}))

    # TRL: every public method but reset (and get_reward) is a tool, so helpers here are private.

    def reset(self, **row: Any) -> None:
        """Start the episode of the dataset row's task (TRL passes the whole row; its prompt is the episode's)."""
        self.task_row = rows.t2sql_row(row)
        self.result, self.turns, self.cut, self._live_calls = None, [], None, []
        messages = self.task_row.get("prompt")
        self.episode = on_episode_loop(open_episode(
            self.settings, self.task_row, prompt=messages if isinstance(messages, list) else None,
            tokenizer=self.tokenizer))
        self._prompt = [dict(m) for m in self.episode.messages]
        return None

    def execute_sql_query(self, query: Any = None, **others: Any) -> str:
        episode = self._open_episode()
        if episode.done:  # an unsafe query ended it earlier in this rollout; nothing more runs
            assert episode.result is not None
            return f"Error: the episode has ended ({episode.result.outcome}); this call was not run."
        arguments = dict(others)
        if query is not None:
            arguments["query"] = query
        call = parsing.tool_call_from_arguments(arguments)
        self._live_calls.append(call)
        return on_episode_loop(episode.call_tool(call))

    # The schema TRL shows the model: t2sql's tool, `query` required; the method itself takes whatever
    # the model sent (missing or extra arguments), so the episode judges the call.
    execute_sql_query.__doc__ = _tool_docstring()
    execute_sql_query.__annotations__ = {"query": str}  # no return type: t2sql's spec has none
    execute_sql_query.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
         inspect.Parameter("query", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)])

    # -- private: what sql_reward calls

    def _open_episode(self) -> Episode:
        if self.episode is None:
            raise AdapterError("SQLEnvironment has no episode: TRL calls reset(**row) before a rollout; "
                               "call it yourself when using the environment outside TRL")
        return self.episode

    async def _score(self, completion: Sequence[Mapping[str, Any]] | str,
                     completion_ids: Sequence[int] | None) -> EpisodeResult:
        """End the episode on the completion TRL generated and return its result (once per reset)."""
        if self.result is not None:  # a second reward function over the same rollout
            return self.result
        episode = self._open_episode()
        messages = ([{"role": "assistant", "content": completion}] if isinstance(completion, str)
                    else [dict(m) for m in completion])
        turns = self._model_turns(messages, completion_ids)
        assistant = [m for m in messages if m.get("role") == "assistant"]
        cut = None
        if not assistant or messages[-1].get("role") == "tool":  # no room was left for the model's next turn
            cut = "turn"
        elif assistant[-1].get("tool_calls") or self._cut_at_max_length(completion_ids):
            cut = "turn"  # TRL stopped calling tools (iterations, room) or cut the completion
        if self._rules_ended_earlier(episode, turns):
            episode = await self._fresh_episode()
            live = False
        else:
            live = True
        self.turns, self.cut = turns, cut
        self.result = await self._end(episode, live)
        return self.result

    def _model_turns(self, messages: Sequence[Mapping[str, Any]], completion_ids: Sequence[int] | None) -> list[str]:
        """The model's own turns, decoded from the completion's ids. TRL's completion_ids are each sampled
        turn (ending in its end-of-turn token) followed by the tool results TRL appended for it (the chat
        template's rendering of that round's tool messages and the next generation prompt, mask 0 in
        TRL's loss), then the next sampled turn. The tool rounds are read from TRL's messages; every
        round's ids are checked against the template's rendering, so a turn is never cut in the wrong place.
        TRL's parsed messages are never graded: its parser keeps one content span a turn and drops the
        text before a tool call."""
        tokenizer = self.tokenizer
        if tokenizer is None or completion_ids is None:
            raise AdapterError("sql_reward grades the tokens the model sampled: build the environments with "
                               "SQLEnvironment.configured(tokenizer=<the trainer's processing class>, "
                               "chat_template_kwargs=<GRPOConfig's chat_template_kwargs>, ...)")
        ids = [int(i) for i in completion_ids]
        template = ChatTemplate(tokenizer, prompt.tool_specs(), self.chat_template_kwargs)
        ends = {tokenizer.convert_tokens_to_ids(template.end_of_turn()), tokenizer.eos_token_id} - {None}
        turns, start, before = [], 0, list(self._prompt)
        for tool_messages in _tool_rounds(messages):
            end = next((i for i in range(start, len(ids)) if ids[i] in ends), None)
            if end is None:
                raise AdapterError(f"the completion's turn {len(turns) + 1} called a tool but has no end-of-turn "
                                   f"token ({template.end_of_turn()}); these ids are not TRL's tool loop's")
            text = tokenizer.decode(ids[start:end + 1], skip_special_tokens=True)
            turns.append(text)
            before = [*before, {"role": "assistant", "content": text}]
            segment = template.encode(template.tool_segment(before, tool_messages, closed=True))
            if ids[end + 1:end + 1 + len(segment)] != segment:
                raise AdapterError(
                    f"the tool results after turn {len(turns)} are not what the chat template renders with "
                    f"chat_template_kwargs={self.chat_template_kwargs}: pass SQLEnvironment.configured the "
                    "tokenizer and chat_template_kwargs GRPOTrainer runs with")
            before = [*before, *tool_messages]
            start = end + 1 + len(segment)
        if start < len(ids) or not turns or messages[-1].get("role") != "tool":
            turns.append(tokenizer.decode(ids[start:], skip_special_tokens=True))
        else:
            turns.append("")  # TRL had no room for the model's next turn
        return turns

    def _cut_at_max_length(self, completion_ids: Sequence[int] | None) -> bool:
        """Whether the completion stops short of an end-of-turn token (TRL cut it at max_completion_length,
        as its own clipped_ratio counts)."""
        tokenizer = self.tokenizer
        if tokenizer is None or not completion_ids:
            return False
        return int(completion_ids[-1]) not in {tokenizer.eos_token_id, tokenizer.pad_token_id}

    def _rules_ended_earlier(self, episode: Episode, turns: Sequence[str]) -> bool:
        """Whether the live episode (the calls TRL made) is not the one the episode's rules give these turns:
        TRL went on past a point where the rules end it (an unsafe query, a solution in a turn that also
        called the tool, more turns than the preset's max_turns), or the calls TRL made differ from the
        calls the episode reads in the turns' text (another tool's name, which TRL answers itself; a call
        TRL's parser saw differently or not at all)."""
        if episode.done or len(turns) > episode.preset.budgets.max_turns:
            return True
        visible = [parsing.split_think(text)[1] for text in turns[:-1]]
        if any(parsing.parse_solution(text) is not None for text in visible):
            return True
        read = [call for text in visible for call in parsing.parse_tool_calls(text)]
        return [_call_key(c) for c in read] != [_call_key(c) for c in self._live_calls]

    async def _fresh_episode(self) -> Episode:
        assert self.task_row is not None
        self.episode = await open_episode(self.settings, self.task_row, prompt=self._prompt, tokenizer=self.tokenizer)
        return self.episode

    async def _end(self, episode: Episode, live: bool) -> EpisodeResult:
        """Take the recorded turns in order and end the episode. Live: the earlier turns' tool calls already
        ran (TRL called the tool), so their text is only recorded. Otherwise each goes through `on_turn`
        (its calls run again) until the rules end the episode. The last turn is taken as `t2sql eval` takes a
        last turn: graded, cut, or, when it holds tool calls TRL's parser did not see, those calls judged and
        the model's next turn (which TRL never asked for) cut."""
        for number, text in enumerate(self.turns[:-1], 1):
            if live:
                episode.record_turn(text)
            else:
                await episode.on_turn(text)
                if episode.done:  # the turns TRL generated after this one are no part of the episode
                    self.turns, self.cut = self.turns[:number], None
                    break
        if not episode.done:
            if self.cut is not None:
                await episode.finish(self.turns[-1], cut=self.cut)
            else:
                await episode.on_turn(self.turns[-1])
                if not episode.done:
                    self.turns.append("")
                    self.cut = "turn"
                    await episode.finish("", cut="turn")
        assert episode.result is not None
        return episode.result


def _tool_rounds(messages: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """The tool messages TRL appended after each assistant turn, one list per round, in order."""
    rounds: list[list[dict[str, Any]]] = []
    previous = None
    for message in messages:
        if message.get("role") == "tool":
            if previous != "tool":
                rounds.append([])
            rounds[-1].append(dict(message))
        previous = message.get("role")
    return rounds


def _call_key(call: parsing.ToolCall) -> tuple[str | None, bool]:
    """What makes two calls run the same: the query when the call is valid (its other arguments are not
    read), and whether it is."""
    return (call.query if call.valid else None, call.valid)


# ----------------------------------------------------------------------------------- the reward


def sql_reward(completions: Sequence[Any], environments: Sequence[SQLEnvironment] | None = None,
               completion_ids: Sequence[Sequence[int]] | None = None, log_metric: Callable | None = None,
               log_extra: Callable | None = None, **kwargs: Any) -> list[float]:
    """TRL reward function: ends each rollout's episode on the turns the model sampled (decoded from
    `completion_ids`, TRL's own ids of the completion) and returns the recipe's reward (EpisodeResult.reward);
    logs the episodes' metrics through TRL's log_metric/log_extra."""
    if environments is None:
        raise AdapterError("sql_reward scores SQLEnvironment rollouts: pass environment_factory="
                           "SQLEnvironment.configured(tokenizer=..., chat_template_kwargs=...) to GRPOTrainer")
    if len(environments) != len(completions):
        raise AdapterError(f"sql_reward got {len(completions)} completions for {len(environments)} environments")
    if not all(isinstance(env, SQLEnvironment) for env in environments):
        raise AdapterError("sql_reward scores SQLEnvironment rollouts only; with several environments, give each "
                           "its own reward function")
    ids = list(completion_ids) if completion_ids is not None else [None] * len(completions)

    async def score_all() -> list[EpisodeResult]:
        return list(await asyncio.gather(*(env._score(c, i) for env, c, i in zip(environments, completions, ids))))

    results = on_episode_loop(score_all())
    if log_metric is not None:
        for result in results:
            for name, value in episode_metrics(result).items():
                log_metric(name, value)
    if log_extra is not None:
        log_extra("t2sql/outcome", [r.outcome for r in results])
    return [float(r.reward) for r in results]


def episode_metrics(result: EpisodeResult) -> dict[str, float]:
    """One episode's numbers for TRL's log_metric (each averaged over a logging step's episodes): the
    record's (record_metrics) under the miles rollout log's names, and `t2sql/outcome/<outcome>`."""
    numbers = record_metrics(result.to_dict())
    return {f"t2sql/{ROLLOUT_LOG_NAMES.get(name, name)}": value for name, value in numbers.items()
            if name in ROLLOUT_LOG_NAMES or name.startswith("outcome/")}


# ---------------------------------------------------------------------------------- the dataset


def train_dataset(source: str | os.PathLike, *, db_root: str | os.PathLike | None = None,
                  preset: str | None = None, split: str | None = None) -> Any:
    """A split as the `datasets.Dataset` GRPOTrainer takes: columns `prompt` (the episode's messages),
    `t2sql` (the whole t2sql row, as JSON: what reset reads) and `question_id`.

    `source`: a converted split (`t2sql convert`, `t2sql-train prepare`: <output-dir>/data/<split>.jsonl), a
    verl/SkyRL file `t2sql convert --format` wrote (.jsonl or .parquet), a BIRD-layout question file (.json,
    or .jsonl of questions: converted here, as `t2sql convert` does, databases under `db_root`, default its
    folder), a data release directory (`split` picks the split), or the name of a task file t2sql ships
    (train, validation, arcwise: `db_root` is the BIRD database folder it runs on). `preset`: the preset the
    prompts are built for (default: T2SQL_PRESET, else the recipe's); converted rows built for another
    preset are refused. `split` keeps only that split's rows of a converted file."""
    name = settings_from_env(preset=preset).preset
    task_rows = _task_rows(Path(source), db_root, name, split, given_preset=preset is not None)
    return datasets.Dataset.from_list([
        {"prompt": [{"role": m["role"], "content": m["content"]} for m in row["prompt"]],
         ROW_COLUMN: rows.row_json(row),
         "question_id": str(row["metadata"]["question_id"])}
        for row in task_rows])


def _task_rows(source: Path, db_root: str | os.PathLike | None, preset: str, split: str | None,
               given_preset: bool) -> list[dict[str, Any]]:
    if source.is_dir():
        (name, questions, found_root), = convert.release_splits(source, [split or "train"])
        return _converted(questions, db_root or found_root, preset, name)
    if not source.exists():
        if str(source) in convert.RELEASE_SPLITS:
            (name, questions, _), = convert.release_splits(release_dir(), [str(source)])
            if db_root is None:
                raise DataError(f"the shipped {name} tasks need their databases: pass db_root=<BIRD's "
                                f"{convert.RELEASE_DB_DIRS[name]} folder> (`t2sql-train prepare --skip-model` "
                                "lays them out and writes the converted split)")
            return _converted(questions, db_root, preset, name)
        raise DataError(f"{source}: no such file or directory (give a converted split, a BIRD question file, a "
                        f"data release directory or one of {', '.join(convert.RELEASE_SPLITS)})")
    if source.suffix == ".parquet" or (source.suffix == ".jsonl" and _holds_task_rows(source)):
        return _read_converted(source, db_root, preset if given_preset else None, split)
    return _converted(source, db_root or source.parent, preset, split or source.stem)


def _holds_task_rows(path: Path) -> bool:
    head = read_head(path)
    return convert.is_converted(head) or rows.is_framework_jsonl(first_line(head))


def _converted(questions: Path, db_root: str | os.PathLike, preset: str, split: str) -> list[dict[str, Any]]:
    _, built = convert.convert_split(questions, db_root, None, split=split, preset=preset)
    return built


def _read_converted(path: Path, db_root: str | os.PathLike | None, preset: str | None,
                    split: str | None) -> list[dict[str, Any]]:
    found = rows.read_rows(path)
    if split is not None:
        found = [r for r in found if r["metadata"].get("split") == split]
        if not found:
            raise DataError(f"{path}: no rows of split {split!r}")
    if preset is not None:
        other = sorted({str(r["metadata"].get("preset")) for r in found} - {preset})
        if other:
            raise DataError(f"{path}: its prompts were built for preset {', '.join(other)}, not {preset}; convert "
                            f"it again with --preset {preset} (or leave preset out)")
    if db_root is not None:
        for row in found:
            row["metadata"] = {**row["metadata"], "db_path": str(database_path(db_root, str(row["metadata"]["db_id"])))}
    return found


if __name__ == "__main__":
    sys.exit(module_help(sys.argv[1:], __doc__, "trl"))
