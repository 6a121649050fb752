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
