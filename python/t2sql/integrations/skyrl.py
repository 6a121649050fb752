"""SkyRL: t2sql's episode as a SkyRL-Gym text environment, `SQLEnv`, registered as "t2sql": one assistant turn per
`step`, on the process's one episode loop, with the T2SQL_* settings (`env_config`'s keys winning). `python -m
t2sql.integrations.skyrl KEY=VALUE ...` is SkyRL's main_base with it registered. What SkyRL tells the environment
and what it cannot: docs/skyrl.md."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping

from t2sql.integrations import (
    SETTINGS_ENV,
    config_items,
    entry_point,
    episode_record,
    on_episode_loop,
    print_help,
    require,
    settings_from_env,
    wants_help,
)

# The release this was checked against (skyrl-gym and skyrl alike), and the next minor.
SKYRL_MINIMUM, SKYRL_BELOW = "0.4", "0.5"
with entry_point(__name__):
    require("skyrl_gym.envs.base_text_env", framework="skyrl-gym", extra="skyrl", minimum=SKYRL_MINIMUM,
            below=SKYRL_BELOW, distribution="skyrl-gym")

from skyrl_gym.envs import register  # noqa: E402 - after the version check
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput  # noqa: E402
from skyrl_gym.envs.registration import registry  # noqa: E402
from skyrl_gym.metrics import default_aggregate_metrics  # noqa: E402

from t2sql.episode import prompt as prompts  # noqa: E402
from t2sql.episode import rollout  # noqa: E402
from t2sql.episode.metrics import record_metrics  # noqa: E402
from t2sql.errors import AdapterError  # noqa: E402
from t2sql.integrations.rows import ENV_CLASS, t2sql_row  # noqa: E402

log = logging.getLogger("t2sql.integrations.skyrl")

ENTRY_POINT = "t2sql.integrations.skyrl:SQLEnv"
ENV_CONFIG = f"environment.skyrl_gym.{ENV_CLASS}."  # where SkyRL's config keeps env_config: named in errors


# ------------------------------------------------------------------------------------ settings


def settings_of(env_config: Any) -> rollout.RolloutSettings:
    """The rollout settings: T2SQL_* variables, `env_config`'s keys winning. SkyRL passes
    `environment.skyrl_gym.<env_class>` when its config has such a field, else an empty dict; the keys
    are settings_from_env's keyword names (a RolloutSettings field each; an unknown one is a SettingsError)."""
    overrides = config_items(env_config)
    if overrides is None:
        raise AdapterError(f"SQLEnv's env_config must be a mapping of t2sql settings, got {type(env_config).__name__}")
    return settings_from_env(config=ENV_CONFIG, **overrides)


def tool_chat_template_kwargs(**kwargs: Any) -> dict[str, Any]:
    """`generator.chat_template_kwargs` that give the chat template t2sql's tool (SkyRL renders every
    prompt and observation with `tokenizer.apply_chat_template(..., **chat_template_kwargs)` and no tools
    of its own), plus `kwargs` (e.g. enable_thinking)."""
    return {**kwargs, "tools": prompts.tool_specs()}


# ------------------------------------------------------------------------------- the environment


class SQLEnv(BaseTextEnv):
    """One text-to-SQL episode as a SkyRL-Gym text environment (see the module's doc)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None):
        super().__init__()
        extras = dict(extras or {})
        self.context = rollout.context(settings_of(env_config))
        self.task = self.context.task(t2sql_row(extras))
        preset_turns = self.context.preset.budgets.max_turns
        # SkyRL's convention: the generator puts generator.max_turns in the extras, the env ends the episode.
        self.max_turns = int(extras.get("max_turns") or preset_turns)
        if self.max_turns < preset_turns:
            _warn_short_turns(self.max_turns, preset_turns)
        self.episode = None
        self.reward_given = 0.0  # what step() handed SkyRL: the recipe's reward, or 0 if SkyRL stopped first

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Start the episode on the row's prompt (built from the task if the row has none)."""
        messages = [dict(m) for m in prompt] if prompt else None
        self.episode = on_episode_loop(self.context.episode_async(self.task, prompt=messages))
        return [dict(m) for m in self.episode.messages], {"question_id": self.task.question_id}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """One assistant turn: its tool messages while the episode goes on (reward 0), the recipe's reward
        and the episode record when it ends."""
        if self.episode is None:
            raise AdapterError("SQLEnv.step before init: SkyRL's generator calls init(prompt) first")
        self.turns += 1
        if self.turns >= self.max_turns and self.max_turns < self.context.preset.budgets.max_turns:
            on_episode_loop(self.episode.finish(action))  # SkyRL's last turn comes before the preset's: the answer turn
            observations: list[dict[str, Any]] = []
        else:
            observations = on_episode_loop(self.episode.on_turn(action)).tool_messages
        if not self.episode.done:
            return BaseTextEnvStepOutput(observations=[dict(m) for m in observations], reward=0.0, done=False,
                                         metadata={})
        record = self.record()
        self.reward_given = record["reward"]
        return BaseTextEnvStepOutput(observations=[], reward=record["reward"], done=True, metadata=record)

    def get_metrics(self) -> dict[str, Any]:
        """The episode record. SkyRL's generator asks once, after its loop: an episode still open then was
        stopped by SkyRL's context limit (generator.max_input_length) and is recorded as context_cut."""
        if self.episode is None:
            return {}
        if not self.episode.done:
            on_episode_loop(self.episode.on_turn("", cut="context"))
        return {**self.record(), "reward_given": self.reward_given}

    def record(self) -> dict[str, Any]:
        """The ended episode's record: EpisodeResult.to_dict() and the preset's name."""
        assert self.episode is not None and self.episode.result is not None
        return episode_record(self.episode.result, self.context.preset.name)

    @staticmethod
    def aggregate_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
        """A batch of episode records as the means SkyRL logs (`environment/<name>`): reward, the reward
        SkyRL trained on, correct, turns, tool calls, each outcome's share, each reward term, and the
        evidence rates over the episodes whose task has evidence."""
        return default_aggregate_metrics([_numbers(m) for m in metrics if "outcome" in m])


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numbers (record_metrics) and the reward SkyRL was handed."""
    given = {"reward_given": float(record["reward_given"])} if "reward_given" in record else {}
    return {**record_metrics(record), **given}


_warned_turns: set[tuple[int, int]] = set()


def _warn_short_turns(skyrl_turns: int, preset_turns: int) -> None:
    if (skyrl_turns, preset_turns) in _warned_turns:
        return
    _warned_turns.add((skyrl_turns, preset_turns))
    log.warning("generator.max_turns=%d is below the preset's max_turns=%d: every episode ends at SkyRL's turn "
                "%d, taken as the answer turn (its tool calls are not run); set generator.max_turns=%d for the "
                "recipe's episodes", skyrl_turns, preset_turns, skyrl_turns, preset_turns)


def _register() -> None:
    """Register SQLEnv as "t2sql" in skyrl_gym's registry (importing this module again is a no-op)."""
    spec = registry.get(ENV_CLASS)
    if spec is None:
        register(id=ENV_CLASS, entry_point=ENTRY_POINT)
    elif spec.entry_point != ENTRY_POINT:
        raise AdapterError(f"skyrl_gym already has an environment {ENV_CLASS!r} from {spec.entry_point!r}; "
                           f"t2sql's is {ENTRY_POINT!r}: deregister the other one first")


_register()


# ----------------------------------------------------------------------- SkyRL's training entrypoint


def _config_check() -> tuple[Any, Any]:
    """SkyRL's config module and its validate_cfg: what the entrypoint runs before it starts Ray. A package
    they import that is missing (skyrl 0.4.0 declares some only under its GPU extras) is one line naming the
    install command, at --help already."""
    config = require("skyrl.train.config", framework="SkyRL", extra="skyrl", minimum=SKYRL_MINIMUM,
                     below=SKYRL_BELOW, distribution="skyrl")
    utils = require("skyrl.train.utils", framework="SkyRL", extra="skyrl", minimum=SKYRL_MINIMUM,
                    below=SKYRL_BELOW, distribution="skyrl")
    return config, utils.validate_cfg


def training_config(argv: list[str]) -> Any:
    """SkyRL's typed config from `key=value` overrides (SkyRLTrainConfig.from_cli_overrides), validated by
    SkyRL's validate_cfg, with t2sql's tool added to generator.chat_template_kwargs (SkyRL's generator
    renders with them) unless the command gave tools of its own. `trainer.override_entrypoint=...` (how
    SkyRL's main_base dispatches here) is dropped first: it is not a config field."""
    skyrl_config, validate_cfg = _config_check()

    overrides = [a for a in argv if not a.startswith("trainer.override_entrypoint=")]
    cfg = skyrl_config.SkyRLTrainConfig.from_cli_overrides(overrides)
    if not cfg.generator.chat_template_kwargs.get("tools"):
        cfg.generator.chat_template_kwargs = tool_chat_template_kwargs(**cfg.generator.chat_template_kwargs)
    validate_cfg(cfg)
    return cfg


def t2sql_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The T2SQL_* variables the driver was started with: carried into the Ray task that runs SkyRL's
    trainer and generator (SkyRL forwards only its own variables to Ray workers)."""
    environ = os.environ if environ is None else environ
    return {name: environ[name] for name in SETTINGS_ENV if name in environ}


def run_experiment(cfg: Any, environ: Mapping[str, str]) -> None:
    """The Ray task: SkyRL's BasePPOExp with t2sql's settings. Ray ships this function by reference, so
    the worker imports this module, which registers the environment before the generator makes one."""
    os.environ.update(environ)
    from skyrl.train.entrypoints.main_base import BasePPOExp

    BasePPOExp(cfg).run()


def main(argv: list[str] | None = None) -> int | None:
    """`python -m t2sql.integrations.skyrl key=value ...`: SkyRL's main_base with the t2sql environment
    registered in the training task and the T2SQL_* settings carried there. Needs SkyRL's GPU stack
    (`skyrl[fsdp]` or `skyrl[megatron]`: Ray, vLLM, the trainer). With -h/--help (or nothing), the usage."""
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        _config_check()  # what the command needs before Ray imports: a missing package says so here
        return print_help("usage: python -m t2sql.integrations.skyrl KEY=VALUE ...  (SkyRL's config overrides, as "
                          "its main_base takes them; docs/skyrl.md has the recipe's command)", __doc__)
    cfg = training_config(argv)
    require("skyrl.train.entrypoints.main_base", framework="SkyRL's trainer (skyrl[fsdp] or skyrl[megatron])",
            extra="skyrl", minimum=SKYRL_MINIMUM, below=SKYRL_BELOW, distribution="skyrl")
    import ray
    from skyrl.train.utils.utils import initialize_ray

    initialize_ray(cfg)
    ray.get(ray.remote(num_cpus=1)(run_experiment).remote(cfg, t2sql_environment()))


if __name__ == "__main__":
    with entry_point(__name__):  # SkyRL's trainer missing: one line, not a traceback
        # Imported under its own name, so that Ray pickles run_experiment by reference (not __main__'s copy).
        from t2sql.integrations.skyrl import main as _main

        sys.exit(_main())
