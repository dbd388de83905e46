"""The shape of the code, read from the source: layers, package lines and what the docs cite.

Three rules, each checked on the abstract syntax trees and texts of the
files in this repository (nothing is imported or run):

* **No import cycle inside** ``disque/``.  Every import counts, those made
  inside functions included: a function-level import that calls upward is
  still a dependency, and in the compiled core it runs the import machinery
  on every call.  Imports under ``if TYPE_CHECKING:`` do not count (they
  never run), nor does a module's import of its own parent packages (Python
  imports those first whatever the module says).
* **No private module of another top-level package**: ``from redis._parsers
  import ...`` or ``from disque.client._wire import ...`` in
  ``spark_connector`` break when the other package changes what it never
  promised.  Private names (``from x import _name``) count too.  Tests are
  left out: a test of a private module imports it.
* **Docs cite only what ships**: every relative link in a Markdown file
  leads to a file of the repository and, with ``#anchor``, to one of its
  headings; no doc, docstring or comment cites the project's working notes,
  which are not part of the repository.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "disque"
#: Directories that are not source: build output, caches, virtualenvs.
NOT_SOURCE = {".git", "build", "dist", ".venv", "node_modules", ".mypy_cache", ".ruff_cache",
              "__pycache__"}



def source_files(suffix: str) -> Iterator[Path]:
    for path in sorted(ROOT.rglob(f"*{suffix}")):
        rel = path.relative_to(ROOT)
        if not NOT_SOURCE & set(rel.parts) and not rel.parts[0].endswith(".egg-info"):
            yield path


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --------------------------------------------------------------------------
# Imports
# --------------------------------------------------------------------------

def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def type_checking_blocks(tree: ast.AST) -> set[int]:
    """ids of the statements under ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for statement in node.body:
                    inside.update(id(n) for n in ast.walk(statement))
    return inside


def imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of every import of the file that runs (see :func:`imports_in`)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    return imports_in(path.read_text(encoding="utf-8"), package)


def imports_in(source: str, package: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(module, names) of every import in ``source``, anywhere but under TYPE_CHECKING.

    Relative imports are resolved against ``package`` (the file's own);
    ``import a.b`` gives ``("a.b", [])``.
    """
    tree = ast.parse(source)
    skip = type_checking_blocks(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            yield module, [alias.name for alias in node.names]


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module of ``disque/`` -> the modules of ``disque/`` it imports."""
    modules = {module_name(p): p for p in source_files(".py")
               if p.relative_to(ROOT).parts[0] == PACKAGE}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        if path.name == "__init__.py":
            ancestors.discard(name)
        targets = set()
        for module, names in imports(path):
            # "from pkg import mod" names the submodule pkg.mod when there is one.
            candidates = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            if not candidates:
                candidates = [module]
            for candidate in candidates:
                while candidate and candidate not in modules:
                    candidate = candidate.rpartition(".")[0]
                if candidate and candidate != name and candidate not in ancestors:
                    targets.add(candidate)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def describe(component: set[str]) -> str:
    return f"{len(component)} modules: {', '.join(sorted(component))}"


def test_the_import_reader_counts_what_runs() -> None:
    """The reader of imports itself: what it must count and what it must not."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from ..up import thing\n"
        "if TYPE_CHECKING:\n"
        "    from .state import State\n"
        "def later():\n"
        "    import pkg.deep.mod\n"
    )
    assert list(imports_in(source, ["pkg", "sub"])) == [
        ("typing", ["TYPE_CHECKING"]), ("pkg.sub", ["sibling"]), ("pkg.up", ["thing"]),
        ("pkg.deep.mod", [])]
    graph = import_graph()
    # disque/__init__ imports the client inside a function (its lazy __getattr__).
    assert "disque.client" in graph["disque"]
    assert "disque.cli.prompt" in graph["disque.cli.main"]
    # A module never depends on its own parent packages.
    assert not any(m.startswith(f"{t}.") for m, ts in graph.items() for t in ts)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_cycle_in_disque() -> None:
    found = [describe(c) for c in cycles(import_graph())]
    assert not found, "import cycles in disque/:\n" + "\n".join(found)


@functools.cache
def private_imports() -> dict[str, list[str]]:
    """File -> the private modules and names of other top-level packages it imports."""
    found: dict[str, list[str]] = {}
    for path in source_files(".py"):
        parts = path.relative_to(ROOT).parts
        if parts[0] == "tests":
            continue
        own = parts[0].removesuffix(".py")
        for module, names in imports(path):
            words = module.split(".")
            if words[0] == own:
                continue
            private = [w for w in words[1:] if w.startswith("_") and not w.startswith("__")]
            private_names = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private or private_names:
                found.setdefault(rel(path), []).append(
                    module + "".join(f" ({n})" for n in private_names))
    return found


def test_no_private_import_across_packages() -> None:
    found = private_imports()
    assert not found, f"private modules of other packages imported: {found}"


# --------------------------------------------------------------------------
# What the docs cite
# --------------------------------------------------------------------------

#: Files that are not in the repository: the project's working notes.  Each
#: name is written in two pieces so that this file does not cite them itself.
WORKING_NOTES = ("COMPAT" ".md", "C-" "BEHAVIOUR", "../" "shared")
NOT_SHIPPED = re.compile("|".join(map(re.escape, WORKING_NOTES)))
LINK = re.compile(r"\]\(([^)\s]*)\)")


def anchors(markdown: str) -> set[str]:
    """The ``#anchor`` of every heading, as GitHub makes them (``-1`` for repeats)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        repeats = seen.get(slug, 0)
        seen[slug] = repeats + 1
        found.add(f"{slug}-{repeats}" if repeats else slug)
    return found


def broken_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    broken = []
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):
            continue  # http:, https:, mailto:
        target_name, _, anchor = link.partition("#")
        target = (path.parent / target_name) if target_name else path
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(
                target.read_text(encoding="utf-8")):
            broken.append(f"{link}: no such heading")
    return broken


def prose(path: Path) -> str:
    """What a reader reads: a Markdown file whole, a Python file's docstrings and comments."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return text
    parts = [token.string for token in tokenize.generate_tokens(io.StringIO(text).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            parts.append(ast.get_docstring(node, clean=False) or "")
    return "\n".join(parts)


def citations(path: Path) -> list[str]:
    return sorted(set(NOT_SHIPPED.findall(prose(path))))


def test_the_doc_readers_find_what_they_look_for(tmp_path: Path) -> None:
    """The readers themselves, on made-up files."""
    assert anchors("# A `b` c!\n## A b c\n```\n# not a heading\n```\n") == {"a-b-c", "a-b-c-1"}
    (tmp_path / "a.md").write_text("# Here\n[ok](b.md) [ok](#here) [no](c.md) [no](b.md#gone)\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "a.md") == ["c.md: no such file", "b.md#gone: no such heading"]
    module = tmp_path / "m.py"
    compat, behaviour, shared = WORKING_NOTES
    module.write_text(f'"""See {compat}."""\nX = "{behaviour}"  # and {shared}\n')
    assert citations(module) == sorted([compat, shared])  # not the string literal


@pytest.mark.parametrize("path", list(source_files(".md")), ids=rel)
def test_markdown_links_resolve(path: Path) -> None:
    assert not broken_links(path)


def test_docs_and_docstrings_cite_only_what_ships() -> None:
    found = {rel(p): citations(p) for s in (".md", ".py") for p in source_files(s)}
    assert not {f: c for f, c in found.items() if c}
