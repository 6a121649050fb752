"""The README's Python examples run as written, in a fresh interpreter, on what ships in the wheel."""

from __future__ import annotations

import re
import subprocess
import sys

from conftest import REPO

BLOCKS = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)


def test_every_python_example_in_the_readme_runs(tmp_path):
    assert BLOCKS, "the README has no Python example"
    for block in BLOCKS:
        # Echo each bare expression the example comments on, so its claims can be checked below.
        # (v.outcome, v.detail, and a call's .outcome such as the subset,=,5 line's).
        echoed = r"(v\.\w+|db\.grade\(.*\)\.outcome)\s*(#.*)?"
        lines = [f"print(repr({line.split('  #')[0].strip()}))" if re.fullmatch(echoed, line.strip())
                 else line for line in block.splitlines()]
        proc = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True,
                              cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, f"{block}\n{proc.stderr}"
        if "v.detail" in block:
            # The multiset grade's outcome and detail, then the subset,=,5 grade that the comment says matches.
            assert proc.stdout.splitlines()[:3] == ["'mismatch'", "'row count 5 vs 7 (multiset)'", "'match'"]


def _readme_commands() -> list[str]:
    first = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    return [line for line in first.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_first_command_verbatim():
    # .ci/run calls pip through python3 -m, as for the second; otherwise the same line.
    first = _readme_commands()[0].replace("pip install", "python3 -m pip install")
    assert first in [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]


def test_ci_runs_the_readmes_test_command_verbatim():
    # .ci/run calls pip and pytest through python3 -m (the interpreter that installed them); otherwise the same line.
    test_command = _readme_commands()[1]
    as_ci_runs_it = test_command.replace("pip install", "python3 -m pip install").replace("(pytest;",
                                                                                         "(python3 -m pytest -q;")
    assert as_ci_runs_it in (REPO / ".ci" / "run").read_text().splitlines()


def _run_with(tmp_path, command: str, pytest_status: int, cargo_status: int):
    # The README's command in a real shell, with pip, pytest and cargo on PATH as recorders of their own.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "calls.log"
    for name, status in (("pip", 0), ("pytest", pytest_status), ("cargo", cargo_status)):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} >> '{log}'\nexit {status}\n")
        script.chmod(0o755)
    log.write_text("")
    proc = subprocess.run(["bash", "-c", command], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, cwd=tmp_path)
    return proc.returncode, log.read_text().split()


def test_the_readmes_test_command_runs_the_rust_tests_when_pytest_fails(tmp_path):
    command = _readme_commands()[1]
    assert _run_with(tmp_path, command, 0, 0) == (0, ["pip", "pytest", "cargo"])
    status, calls = _run_with(tmp_path, command, 1, 0)
    assert status != 0 and calls == ["pip", "pytest", "cargo"]  # the Rust tests still ran
    status, calls = _run_with(tmp_path, command, 0, 101)
    assert status != 0 and calls == ["pip", "pytest", "cargo"]
    status, calls = _run_with(tmp_path, command, 1, 101)
    assert status != 0 and calls == ["pip", "pytest", "cargo"]
