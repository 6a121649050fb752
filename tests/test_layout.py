"""The shape of the package (issue 12): one exception family, the public API at the top, no module
over 500 lines, and no import cycle among t2sql's modules (issue 18: lazy and type-only imports count)."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import t2sql

PACKAGE = Path(t2sql.__file__).parent
MODULES = sorted(m.name for m in pkgutil.walk_packages(t2sql.__path__, "t2sql.") if not m.name.endswith("_grader"))


def test_every_t2sql_exception_is_a_t2sql_error():
    strays = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, BaseException) and value.__module__.startswith("t2sql")
                    and not attr.startswith("_") and not issubclass(value, t2sql.T2sqlError)):
                strays.append(f"{value.__module__}.{attr}")
    assert not strays


def test_the_public_api_imports_from_the_top():
    from t2sql import Database, Episode, Grader, Preset, T2sqlError, Task, Verdict, get_preset, grade  # noqa: F401

    assert get_preset().name and Episode.__module__ == "t2sql.episode.machine"
    from t2sql import errors

    family = {n for n, v in vars(errors).items() if inspect.isclass(v) and issubclass(v, t2sql.T2sqlError)}
    assert set(errors.__all__) == family  # `from t2sql.errors import *` gives every error
    assert set(t2sql.__all__) <= set(dir(t2sql)) | set(t2sql._LAZY)


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long


def _imports(path: Path, name: str) -> set[str]:
    """Every t2sql module a module imports: at import time, inside functions (a lazy import still ties
    the two modules together) and under TYPE_CHECKING (a type-only import is a dependency too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = 2
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name, [name])):
            return found
    return None


def test_no_import_cycle_not_even_a_lazy_or_type_only_one():
    graph = {name: _imports(Path(importlib.util.find_spec(name).origin), name) for name in MODULES}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_check_sees_type_only_and_lazy_imports(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from t2sql.tasks import Task\n")
    b.write_text("def f():\n    from t2sql.episode import machine\n")
    c.write_text("import json\n")
    assert _imports(a, "x") == {"t2sql.tasks"}
    assert _imports(b, "x") == {"t2sql.episode", "t2sql.episode.machine"}
    assert _imports(c, "x") == set()
    assert _cycle({"p": {"q"}, "q": {"r"}, "r": {"p"}}) == ["p", "q", "r", "p"]
    assert _cycle({"p": {"q"}, "q": set()}) is None


def test_the_cores_names_and_defaults_are_the_ones_python_uses():
    from t2sql import _grader, grading
    from t2sql.episode.machine import VERDICT_OUTCOMES
    from t2sql.serving.grader import Grader

    assert grading.OUTCOMES == _grader.OUTCOMES and set(VERDICT_OUTCOMES) == set(_grader.OUTCOMES)
    limits = _grader.ToolLimits()
    assert {k: getattr(limits, k) for k in _grader.TOOL_DEFAULTS} == _grader.TOOL_DEFAULTS
    assert inspect.signature(Grader.run_tool).parameters["limits"].default is None  # None: ToolLimits()
    assert t2sql.get_preset().tool_limits == limits  # the recipe's preview is the core's default
    init = inspect.signature(Grader).parameters
    assert init["tool_timeout_s"].default == _grader.TOOL_DEFAULTS["timeout_s"]
    assert init["grade_timeout_s"].default == _grader.GRADE_DEFAULTS["timeout_s"]
    assert inspect.signature(grading.grade).parameters["float_digits"].default == _grader.GRADE_DEFAULTS["float_digits"]
    assert t2sql.get_preset("bare").replace(float_digits=_grader.MAX_FLOAT_DIGITS).float_digits == 17


def test_a_gold_digest_from_another_secret_is_its_own_error():
    # In a fresh process: the hash secret is process-wide, and other tests' gold caches rely on it.
    import subprocess
    import sys

    code = (
        "import os, t2sql\n"
        "db = t2sql.Database(t2sql.__file__.replace('__init__.py', 'sample/superhero/superhero.sqlite'))\n"
        "gold = db.digest('SELECT id FROM superhero')\n"
        "t2sql.set_hash_secret(os.urandom(32))\n"
        "try:\n"
        "    db.grade_against('SELECT id FROM superhero', gold)\n"
        "except t2sql.HashSecretMismatch as e:\n"
        "    print(isinstance(e, t2sql.T2sqlError), 'another hash secret' in str(e))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_the_core_stub_names_every_parameter_the_core_takes():
    """_grader.pyi is what editors and type checkers see: every function and method of the compiled
    core is in it, with the same parameter names (a keyword the core takes but the stub lacks, like
    column_order once, is invisible to users)."""
    from t2sql import _grader

    stub = ast.parse((PACKAGE / "_grader.pyi").read_text())

    def params(node: ast.FunctionDef) -> list[str]:
        a = node.args
        return [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs] if p.arg != "self"]

    stubbed: dict[str, list[str]] = {}
    for node in stub.body:
        if isinstance(node, ast.FunctionDef):
            stubbed[node.name] = params(node)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name != "__init__":
                    stubbed[f"{node.name}.{item.name}"] = params(item)
    mismatched, checked = [], 0
    for name, value in vars(_grader).items():
        members = [(name, value)]
        if inspect.isclass(value) and not issubclass(value, BaseException):
            members = [(f"{name}.{m}", f) for m, f in vars(value).items()
                       if not m.startswith("_") and callable(f) and getattr(f, "__text_signature__", None)]
        for qualified, function in members:
            if not callable(function) or inspect.isclass(function) or name.startswith("_"):
                continue
            runtime = [p for p in inspect.signature(function).parameters if p != "self"]
            checked += 1
            if stubbed.get(qualified) != runtime:
                mismatched.append(f"{qualified}: core {runtime}, stub {stubbed.get(qualified)}")
    assert checked > 20 and not mismatched, mismatched


def test_import_t2sql_stays_light():
    """`import t2sql` loads the core and its two small Python modules, nothing heavy: not the
    episode, the Grader, asyncio, or dataclasses (which alone pulls in inspect, ast and dis)."""
    import subprocess
    import sys

    from conftest import child_env

    code = "import sys, t2sql; print(' '.join(sorted(sys.modules)))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env=child_env()).stdout.split())
    assert {m for m in loaded if m.startswith("t2sql")} == {"t2sql", "t2sql._grader", "t2sql.errors", "t2sql.grading"}
    assert not loaded & {"dataclasses", "inspect", "asyncio", "torch", "miles", "httpx"}
