"""The shape of the package (issue 12): one exception family, the public API at the top, no module
over 500 lines, and no import cycle among t2sql's modules at import time."""

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
    assert set(t2sql.__all__) <= set(dir(t2sql)) | set(t2sql._LAZY)


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long


def _top_level_imports(path: Path, name: str) -> set[str]:
    """t2sql modules a module imports when it is imported (not inside functions or TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in MODULES and m != name}


def test_no_import_cycle():
    graph = {}
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        graph[name] = _top_level_imports(Path(spec.origin), name)
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join(path[path.index(nxt):] + [nxt]) if nxt in path else nxt)
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for name in MODULES:
        if name not in state:
            visit(name, [name])
