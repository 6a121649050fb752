"""Pointers that resolve (issue 27): every dotted `t2sql.*` name and every link to a heading (`docs/x.md#anchor`,
`#anchor`) that README.md, docs/*.md and t2sql's Python name leads somewhere: the module imports and the rest is
its attribute; the file exists and has a heading of that slug (GitHub's rule)."""

import ast
import functools
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from conftest import REPO
from t2sql.integrations import FrameworkMissing

ROOT = REPO  # the repository's own files: an installed t2sql has no README or docs beside it
PACKAGE = REPO / "python" / "t2sql"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted(p for p in PACKAGE.rglob("*.py*") if p.suffix in (".py", ".pyi"))

# Not after "+": `+t2sql.db_root=...` is a hydra override of a config key (docs/verl.md), no module.
DOTTED = re.compile(r"(?<![\w./+-])t2sql(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
MD_LINK = re.compile(r"\]\(([^)\s]*)\)")  # [text](target)
SOURCE_ANCHOR = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Za-z0-9_.-]+\.md)#([\w-]+)")
SECTION = re.compile(r"(?<![\w/.-])(docs/[A-Za-z0-9_.-]+\.md), \"([^\"]+)\"")  # docs/x.md, "A heading"
DOC_FILE = re.compile(r"(?<![\w/.-])docs/[A-Za-z0-9_-]+\.md")


@functools.cache
def loggers() -> set[str]:
    """The loggers t2sql logs to (`logging.getLogger("t2sql.schema")`): a name a user points at too."""
    return {node.args[0].value for p in SOURCES for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "getLogger"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)}


def top_level_names(module: str) -> set[str]:
    """The names a module's source defines at its top level (classes, functions, assignments)."""
    spec = importlib.util.find_spec(module)
    tree = ast.parse(Path(spec.origin).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def resolves(dotted: str) -> bool:
    """The longest prefix that imports as a module, then each further part an attribute of the last (a
    dataclass field without a default counts: it is in the class's fields); or a logger t2sql logs to."""
    if dotted in loggers():
        return True
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        except FrameworkMissing:  # an integration whose framework this environment lacks: read its source
            return all(name in top_level_names(".".join(parts[:cut])) for name in parts[cut:cut + 1])
        for attr in parts[cut:]:
            try:
                found = hasattr(value, attr)
            except ModuleNotFoundError as e:  # a lazy name built on an optional dependency that is absent
                return not (e.name or "t2sql").startswith("t2sql")
            if found:
                value = getattr(value, attr)
            elif attr in getattr(value, "__dataclass_fields__", {}) or attr in getattr(value, "__annotations__", {}):
                value = None  # a field: nothing further to follow
            else:
                return False
        return True
    return False


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, every character but letters, digits, spaces, '-' and '_'
    dropped, each space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[str]:
    """A Markdown file's headings, in order (not lines of fenced code that start with '#')."""
    found, fenced = [], False
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            found.append(m.group(1))
    return found


def anchors(path: Path) -> set[str]:
    """The slugs of a Markdown file's headings, repeats numbered as GitHub does."""
    found: set[str] = set()
    for heading in headings(path):
        base, n = slug(heading), 0
        name = base
        while name in found:
            n += 1
            name = f"{base}-{n}"
        found.add(name)
    return found


def _where(path: Path, text: str, index: int) -> str:
    return f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, index) + 1}"


def dotted_names() -> list[tuple[str, str]]:
    return [(_where(p, text, m.start()), m.group(0)) for p in DOCS + SOURCES
            for text in [p.read_text()] for m in DOTTED.finditer(text)]


def heading_links() -> list[tuple[str, Path, str]]:
    """(where, the file pointed at, its anchor) for every link to a heading."""
    links = []
    for p in DOCS:
        text = p.read_text()
        for m in MD_LINK.finditer(text):
            target = m.group(1)
            if "#" in target and not target.startswith(("http://", "https://")):
                file, _, anchor = target.partition("#")
                links.append((_where(p, text, m.start()), (p.parent / file) if file else p, anchor))
    for p in SOURCES:
        text = p.read_text()
        for m in SOURCE_ANCHOR.finditer(text):
            file = ROOT / m.group(1) if m.group(1).startswith("docs/") or m.group(1) == "README.md" else \
                ROOT / "docs" / m.group(1)
            links.append((_where(p, text, m.start()), file, m.group(2)))
    return links


def test_every_dotted_t2sql_name_resolves():
    names = dotted_names()
    assert len(names) > 100  # the scan reads what it should
    broken = [f"{where}: {name}" for where, name in names if not resolves(name)]
    assert not broken, "\n".join(broken)


def test_every_link_to_a_heading_resolves():
    links = heading_links()
    assert len(links) > 10
    broken = [f"{where}: {file.name}#{anchor}" for where, file, anchor in links
              if not file.is_file() or anchor not in anchors(file)]
    assert not broken, "\n".join(broken)


def test_every_section_named_by_its_title_exists():
    """`docs/x.md, "Title"`: a heading of that file begins with the title."""
    named = [(_where(p, text, m.start()), m.group(1), m.group(2)) for p in DOCS + SOURCES for text in [p.read_text()]
             for m in SECTION.finditer(text)]
    assert named
    assert not [f"{where}: {file}, {title!r}" for where, file, title in named
                if not any(h.startswith(title) for h in headings(ROOT / file))]


def test_every_docs_file_named_exists():
    named = [(_where(p, text, m.start()), m.group(0)) for p in DOCS + SOURCES for text in [p.read_text()]
             for m in DOC_FILE.finditer(text)]
    assert len(named) > 10
    assert not [f"{where}: {name}" for where, name in named if not (ROOT / name).is_file()]


def test_the_checks_can_fail(tmp_path):
    assert resolves("t2sql.sql_episode.generate") and resolves("t2sql.episode.prompt.build_prompt_async")
    assert resolves("t2sql.Preset.tool") and resolves("t2sql._grader.GRADE_DEFAULTS")
    assert not resolves("t2sql.manifest") and not resolves("t2sql.serving.backends")
    assert not resolves("t2sql.sql_episode.no_such_thing")
    assert resolves("t2sql.schema") and "t2sql.schema" in loggers()  # a logger's name, not a module
    doc = tmp_path / "d.md"
    doc.write_text("# Batch grading: `t2sql grade --pairs`\n```\n# not a heading\n```\n## Guarantees\n## Guarantees\n")
    assert anchors(doc) == {"batch-grading-t2sql-grade---pairs", "guarantees", "guarantees-1"}


@pytest.mark.parametrize("heading, anchor", [
    ("How an answer is compared: grading methods and column order",
     "how-an-answer-is-compared-grading-methods-and-column-order"),
    ("1. `t2sql-train prepare`", "1-t2sql-train-prepare"),
    ("Set and subset at the release's scale", "set-and-subset-at-the-releases-scale"),
])
def test_slugs_are_githubs(heading, anchor):
    assert slug(heading) == anchor
