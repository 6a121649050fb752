"""The shape of the package (issue 12): one exception family, the public API at the top, no module
over 500 lines, and no import cycle among t2sql's modules (lazy, type-only and string imports count)."""

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import t2sql
from t2sql.integrations import FrameworkMissing

PACKAGE = Path(t2sql.__file__).parent
MODULES = sorted(m.name for m in pkgutil.walk_packages(t2sql.__path__, "t2sql.") if not m.name.endswith("_grader"))


def test_every_t2sql_exception_is_a_t2sql_error():
    strays = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except FrameworkMissing:  # an integration whose framework is not installed here: its own env checks it
            continue
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


DOCSTRING_LINES = 5  # what the module is; the docs hold the rest (issue 38)
# A module docstring that is also a command's --help: `python -m t2sql.integrations.trl --help` prints the
# module's usage in a training script (module_help), so it keeps its code example.
LONG_DOCSTRING_IS_HELP = {"integrations/trl.py"}


def _long_docstrings(root: Path) -> dict[str, int]:
    """Each module under root whose docstring is over DOCSTRING_LINES lines, with its line count."""
    return {str(p.relative_to(root)): n for p in sorted(root.rglob("*.py"))
            if (n := len((ast.get_docstring(ast.parse(p.read_text()), clean=False) or "").splitlines()))
            > DOCSTRING_LINES}


def test_no_module_docstring_is_over_five_lines():
    long = _long_docstrings(PACKAGE)
    assert not {name: n for name, n in long.items() if name not in LONG_DOCSTRING_IS_HELP}
    assert set(long) == LONG_DOCSTRING_IS_HELP  # an allowance no longer needed goes


def test_the_docstring_check_sees_a_long_one(tmp_path):
    (tmp_path / "short.py").write_text('"""One line.\n\nAnd four more:\n2\n3\n"""\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text('"""First.\n\n' + "more\n" * 5 + '"""\nx = 1\n')
    (tmp_path / "none.py").write_text("x = 1\n'''not a docstring\n\n\n\n\n\n'''\n")
    assert _long_docstrings(tmp_path) == {"pkg/long.py": 7}


_DOTTED = re.compile(r"t2sql(?:\.\w+)+(?::\w+)?")


def _imports(path: Path, name: str) -> set[str]:
    """Every t2sql module a module imports: at import time, inside functions (a lazy import still ties
    the two modules together), under TYPE_CHECKING (a type-only import is a dependency too), and by
    string: `importlib.import_module("t2sql.x")`, a dotted path handed on ("t2sql.x.f", "t2sql.x:F")
    and the imports of a `python -c` program. A logger's name is not an import, nor is the module a
    child process starts with `-m` (a process boundary: a bench times the real CLI)."""
    return {m for m in _imported(ast.parse(path.read_text())) if m in MODULES and m != name}


def _imported(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    not_imports: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "getLogger":
            not_imports |= {id(a) for a in node.args}
        elif isinstance(node, (ast.List, ast.Tuple)):
            not_imports |= {id(b) for a, b in zip(node.elts, node.elts[1:])
                            if isinstance(a, ast.Constant) and a.value == "-m"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in not_imports:
            if _DOTTED.fullmatch(node.value):
                dotted = node.value.split(":")[0]
                found |= {dotted, dotted.rsplit(".", 1)[0]}
            elif "t2sql" in node.value and "import" in node.value:
                try:
                    found |= _imported(ast.parse(node.value))
                except SyntaxError:
                    pass  # prose that mentions an import, not a program
    return found


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


def test_the_cycle_check_sees_type_only_lazy_and_string_imports(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from t2sql.tasks import Task\n")
    b.write_text("def f():\n    from t2sql.episode import machine\n")
    c.write_text("import json\n")
    assert _imports(a, "x") == {"t2sql.tasks"}
    assert _imports(b, "x") == {"t2sql.episode", "t2sql.episode.machine"}
    assert _imports(c, "x") == set()
    d = tmp_path / "d.py"
    d.write_text("import importlib, logging, subprocess, sys\n"
                 "log = logging.getLogger('t2sql.tasks')\n"
                 "def f():\n    return importlib.import_module('t2sql.errors')\n"
                 "HANDED = {'generate': 't2sql.sql_episode.generate', 'env': 't2sql.atomic:write'}\n"
                 "CHILD = 'from t2sql.episode.presets import get_preset; print(1)'\n"
                 "subprocess.run([sys.executable, '-m', 't2sql.cli'])\n")
    assert _imports(d, "x") == {"t2sql.errors", "t2sql.sql_episode", "t2sql.atomic",
                                "t2sql.episode.presets"}
    assert _cycle({"p": {"q"}, "q": {"r"}, "r": {"p"}}) == ["p", "q", "r", "p"]
    assert _cycle({"p": {"q"}, "q": set()}) is None


def test_the_cores_names_and_defaults_are_the_ones_python_uses():
    from t2sql import _grader, grading
    from t2sql.episode.machine import VERDICT_OUTCOMES
    from t2sql.serving.grader import Grader
    from t2sql.serving.settings import GraderSettings

    assert grading.OUTCOMES == _grader.OUTCOMES and set(VERDICT_OUTCOMES) == set(_grader.OUTCOMES)
    # A tool call's preview is the preset's alone (test_the_recipe_preset_hands_the_core_its_own_tool_numbers).
    assert inspect.signature(Grader.run_tool).parameters["limits"].default is inspect.Parameter.empty
    settings = GraderSettings()
    assert settings.grade_timeout_s is _grader.GRADE_DEFAULTS["timeout_s"]
    assert settings.max_temp_mb is _grader.GRADE_DEFAULTS["max_temp_mb"]
    assert inspect.signature(grading.grade).parameters["float_digits"].default == _grader.GRADE_DEFAULTS["float_digits"]
    widest = t2sql.get_preset("bare").replace(grading={"float_digits": _grader.MAX_FLOAT_DIGITS})
    assert widest.grading.float_digits == 17


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


def test_the_recipe_preset_hands_the_core_its_own_tool_numbers():
    """The preset owns its preview: its tool part is written in presets.py and reach the core whole on
    each call, and the core has no preview of its own to fall back on (ToolLimits and run_tool take one from
    the caller), so another preview is a change in presets.py alone."""
    from t2sql import Database, _grader
    from t2sql.episode import presets
    from t2sql.tasks import sample_dir

    preview = ["timeout_s", "max_rows", "max_cell_chars", "max_chars", "count_cap"]
    for preset in presets.PRESETS.values():
        assert {k: getattr(preset.tool_limits, k) for k in preview} == {k: getattr(preset.tool, k) for k in preview}
        assert preset.tool_limits.max_temp_mb == preset.grading.max_temp_mb
    db = Database(sample_dir() / "superhero" / "superhero.sqlite")
    seven = t2sql.get_preset().replace(tool={"max_rows": 7}).tool_limits
    assert len(db.run_tool("SELECT id FROM superhero", seven).rows) == 7
    # The temporary-disk cap is the core's (GRADE_DEFAULTS); the preview has no default there.
    required = inspect.Parameter.empty
    assert [k for k in preview if inspect.signature(_grader.ToolLimits).parameters[k].default is not required] == []
    assert not hasattr(_grader, "TOOL_DEFAULTS")
    with pytest.raises(TypeError):
        db.run_tool("SELECT 1")  # no limits: no preview the core would choose


def _constants(value) -> list[str]:
    """Where `value` is written as a literal in t2sql's Python (module:line)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_each_default_is_written_once():
    """The recipe's name, the grade timeout, float digits, the gold-check timeout, the curriculum's numbers, the
    worker ceiling, eval's concurrency and HTTP numbers: one owner each, and every other default is that owner's
    value (issues 27, 38), so changing one is a one-line change."""
    import argparse
    import dataclasses

    from t2sql import _grader, arguments
    from t2sql.bench import pairs
    from t2sql.commands import convert, grade
    from t2sql.commands import eval as eval_command
    from t2sql.data import convert as data_convert
    from t2sql.episode import presets, rollout
    from t2sql.episode.rollout import RolloutSettings
    from t2sql.eval import runner
    from t2sql.eval.endpoint import RetryPolicy
    from t2sql.miles import adapter, train
    from t2sql.miles.curriculum import CurriculumConfig
    from t2sql.miles.flags import TrainConfig

    assert [where.split(":")[0] for where in _constants(presets.DEFAULT_PRESET)] == ["episode/presets.py"]

    def defaults(add_arguments, *argv) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        return parser.parse_args(list(argv))

    preset = presets.DEFAULT_PRESET
    assert defaults(convert.add_arguments, "--questions", "q", "--db-root", "d", "--out-dir", "o").preset is preset
    assert defaults(adapter.add_arguments).text_to_sql_preset is preset
    assert TrainConfig(run_id="x").preset is preset and RolloutSettings().preset is preset
    assert inspect.signature(data_convert.convert_split).parameters["preset"].default is preset
    prepare = train.build_parser().parse_args(["prepare"])
    assert prepare.preset is preset

    core = _grader.GRADE_DEFAULTS
    graded = defaults(grade.add_arguments)
    assert graded.timeout_s is core["timeout_s"] and graded.float_digits is core["float_digits"]
    assert pairs.TIMEOUT_S is core["timeout_s"]
    for preset in presets.PRESETS.values():  # the presets grade as the core does unless one says otherwise
        assert preset.grading.timeout_s is core["timeout_s"] and preset.grading.float_digits is core["float_digits"]
        assert preset.grading.max_temp_mb is core["max_temp_mb"]

    # The schema's example values: the preset's prompt part alone (load_schema takes them from its caller).
    from t2sql.episode.schema import load_schema
    given = inspect.signature(load_schema).parameters
    assert all(given[n].default is inspect.Parameter.empty for n in ("example_values", "example_value_chars"))
    # The curriculum's numbers: the preset's alone (CurriculumConfig has no defaults of its own).
    assert [f.name for f in dataclasses.fields(CurriculumConfig) if f.default is not dataclasses.MISSING] == []
    # SQL worker threads: one ceiling, t2sql.arguments'.
    ceiling = arguments.MAX_CONCURRENCY
    assert grade.MAX_CONCURRENCY is ceiling and rollout.CONCURRENCY_RANGE[1] is ceiling
    # `t2sql eval`: episodes in flight are the runner's, the HTTP numbers the endpoint's RetryPolicy's.
    evaluated = defaults(eval_command.add_arguments)
    http = RetryPolicy()
    assert evaluated.concurrency is runner.DEFAULT_CONCURRENCY
    assert inspect.signature(runner.evaluate).parameters["concurrency"].default is runner.DEFAULT_CONCURRENCY
    assert (evaluated.timeout_s, evaluated.retries, evaluated.retry_backoff) == (http.timeout_s, http.retries,
                                                                            http.backoff_s)
    assert evaluated.max_response_mb * 1024 * 1024 == http.max_body_bytes

    gold_check = data_convert.DEFAULT_GOLD_TIMEOUT_S
    assert defaults(convert.add_arguments, "--questions", "q", "--db-root", "d", "--out-dir", "o").timeout_s \
        is gold_check
    assert prepare.timeout_s is gold_check
    assert inspect.signature(data_convert.convert_split).parameters["gold_timeout_s"].default is gold_check


CORE = "t2sql._grader"  # the compiled core: its module name is private by convention, its names are the API


def _private_names_taken(path: Path, name: str) -> list[str]:
    """The private names (one leading underscore) module `name` takes from another t2sql module: `from x import
    _y` and `x._y` where x names a t2sql module (imported whole or as a name of a package)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    modules: dict[str, str] = {}  # local name -> the t2sql module it is
    taken = []

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # a relative import
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([source] if source else []))
            if not source.startswith("t2sql") or source == name:
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full == CORE:
                    modules[alias.asname or alias.name] = full
                elif private(alias.name) and source != CORE:
                    taken.append(f"{name} takes {full}")
                elif full in MODULES or full == "t2sql":
                    modules[alias.asname or alias.name] = full
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("t2sql"):
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else "t2sql"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name):
            module = modules.get(node.value.id)
            if module and module not in (name, CORE):
                taken.append(f"{name} takes {module}.{node.attr}")
    return taken


def test_no_module_takes_another_modules_private_names():
    """Modules split by concept (issue 27): what one module needs of another is that module's public API, never
    a private name reached across; a name two modules share is public where it lives."""
    taken = [t for name in MODULES for t in _private_names_taken(Path(importlib.util.find_spec(name).origin), name)]
    assert taken == []


def test_the_private_name_check_sees_each_way_of_reaching_one(tmp_path):
    a = tmp_path / "a.py"
    a.write_text("from t2sql.serving.gold_cache import _key, public\nfrom t2sql.download import archive\n"
                 "import t2sql.download.archive as ar\nfrom t2sql import _grader\n"
                 "def f():\n    archive._open_output()\n    ar._x\n    _grader.GRADE_DEFAULTS\n    archive.__name__\n")
    assert sorted(_private_names_taken(a, "t2sql.x")) == ["t2sql.x takes t2sql.download.archive._open_output",
                                                          "t2sql.x takes t2sql.download.archive._x",
                                                          "t2sql.x takes t2sql.serving.gold_cache._key"]
    b = tmp_path / "b.py"
    b.write_text("from ._own import _thing\nfrom t2sql.x import _mine\n")
    assert _private_names_taken(b, "t2sql.x") == ["t2sql.x takes t2sql._own._thing"]
