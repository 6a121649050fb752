"""Each RL framework's test, run inside that framework's own environment.

TRL, verl and SkyRL pin different transformers versions, so each gets its own environment, built from
PyPI by tests/envs/NAME.sh (.ci/run builds all three). When `.venv-NAME` exists in the checkout root (or
under $T2SQL_FRAMEWORK_ENVS), this runs tests/frameworks/test_NAME.py with its interpreter and fails
unless every test there passed: a skip inside the framework's own environment is a failure here.
Without the environment it skips, naming the script that builds it.
"""

from __future__ import annotations

import os
import pkgutil
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

# The frameworks: one environment script each, tests/envs/NAME.sh (common.sh is their shared part). .ci/run
# builds the environments from the same scripts.
FRAMEWORKS = tuple(sorted(p.stem for p in (REPO / "tests" / "envs").glob("*.sh") if p.stem != "common"))


def environment(name: str) -> Path:
    base = Path(os.environ.get("T2SQL_FRAMEWORK_ENVS") or REPO)
    return base / f".venv-{name}" / "bin" / "python"


def child_env() -> dict[str, str]:
    """The framework's environment has t2sql installed from this checkout. Only when this suite imports
    t2sql from the checkout's source tree (a developer's PYTHONPATH) is that tree put first, so both
    sides run the same code; an installed t2sql's site-packages never leaks into the other environment."""
    import t2sql

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    source = Path(t2sql.__file__).resolve().parent.parent
    if source == REPO / "python":
        env["PYTHONPATH"] = str(source)
    return env


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_framework_suite_passes_inside_its_own_environment(name):
    python = environment(name)
    if not python.exists():
        pytest.skip(f"no {name} environment: build it with tests/envs/{name}.sh (.ci/run does)")
    test_file = REPO / "tests" / "frameworks" / f"test_{name}.py"
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(test_file)],
                          cwd=REPO, capture_output=True, text=True, timeout=1200, env=child_env())
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, f"tests/frameworks/test_{name}.py failed in its environment:\n{tail}"
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert re.search(r"\d+ passed", summary), tail
    assert "skipped" not in summary, f"a test skipped inside the {name} environment:\n{tail}"


def documented_installs(name: str) -> list[list[str]]:
    """The install commands docs/NAME.md gives (its code lines that begin with `pip install`), as words."""
    lines = (REPO / "docs" / f"{name}.md").read_text().splitlines()
    return [shlex.split(line, comments=True) for line in lines if line.strip().startswith("pip install")]


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_each_environment_script_installs_exactly_the_documented_command(name):
    """tests/envs/NAME.sh runs docs/NAME.md's install commands as written (`documented pip install ...`,
    from the checkout's root), then checks the entrypoint's --help with nothing else installed, and only
    then adds the test extra: what a user pastes is what the framework's tests run on."""
    from t2sql.integrations import install_command

    script = (REPO / "tests" / "envs" / f"{name}.sh").read_text().splitlines()
    run = [shlex.split(line, comments=True)[1:] for line in script if line.startswith("documented ")]
    assert run and run == documented_installs(name)
    steps = [line.split()[0] for line in script if line.split() and line.split()[0] in
             ("make_env", "pin", "documented", "check_entrypoint", "install_test_extra")]
    assert steps == ["make_env", "pin", "documented", "check_entrypoint", "install_test_extra"], steps
    assert f"check_entrypoint {name}" in script and f"install_test_extra {name}" in script
    # The missing-framework message gives the same command.
    assert install_command(name).endswith(shlex.join(["pip", "install", f".[{name}]"]).replace("'", '"'))
    assert ["pip", "install", f".[{name}]"] in run


def test_each_framework_has_its_module_extra_test_page_and_readme_row():
    """What docs/development.md's "Adding a framework adapter" lists, present for each framework, and no
    integration module without its environment."""
    from t2sql import integrations

    modules = {m.name for m in pkgutil.iter_modules(integrations.__path__)} - {"rows"}
    assert FRAMEWORKS and set(FRAMEWORKS) == modules
    pyproject = (REPO / "pyproject.toml").read_text()
    readme = (REPO / "README.md").read_text()
    for name in FRAMEWORKS:
        assert re.search(rf"^{name} = \[", pyproject, re.MULTILINE), f"pyproject.toml has no [{name}] extra"
        assert (REPO / "tests" / "frameworks" / f"test_{name}.py").is_file()
        assert (REPO / "docs" / f"{name}.md").is_file()
        assert re.search(rf"^\|.*\(docs/{name}\.md\) \|$", readme, re.MULTILINE), f"README's table has no {name} row"


def test_no_doc_installs_t2sql_from_pypi():
    """t2sql is not on PyPI: every install command in docs/ installs it from the checkout (`.[extra]`)."""
    for page in sorted((REPO / "docs").glob("*.md")):
        for line in page.read_text().splitlines():
            assert not re.search(r"""pip install ["']?t2sql\b""", line), f"{page.name}: {line.strip()}"
