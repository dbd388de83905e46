"""docs/SERVER.md's map of the node is the rule: every module of ``disque/``
is in its table with a layer, and every import goes to the module's own
layer or one it may use (function-level imports count: they run on every
call; imports under ``if TYPE_CHECKING:`` do not, they are annotations)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "disque"
MAP = ROOT / "docs" / "SERVER.md"

#: The layers each layer may import, besides its own.  The node's layers
#: form one stack; the cluster bus is a column between the values and the
#: tables; the client and the CLI are tools built on the values only.
MAY_USE: dict[str, set[str]] = {
    "values": set(),
    "cluster": {"values"},
    "tables": {"values", "cluster"},
    "procedures": {"values", "cluster", "tables"},
    "commands": {"values", "cluster", "tables", "procedures"},
    "edges": {"values", "cluster", "tables", "procedures", "commands"},
    "tools": {"values"},
    "package": {"values", "tools"},
}

_ROW = re.compile(r"^\| `(disque/[^`]+)` \| (\w+) \| .+\|$")


def map_rows() -> dict[str, str]:
    """The map's table: ``disque/x.py`` or ``disque/pkg/`` -> layer."""
    text = MAP.read_text()
    section = text[text.index("## A map of the node"):text.index("## The compiled core")]
    return {m.group(1): m.group(2) for line in section.splitlines()
            if (m := _ROW.match(line))}


def modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def layer_of(path: Path, rows: dict[str, str]) -> str | None:
    """A module's layer: its own row, else the row of its package directory."""
    rel = path.relative_to(ROOT).as_posix()
    if rel in rows:
        return rows[rel]
    for parent in path.relative_to(ROOT).parents:
        row = parent.as_posix() + "/"
        if row in rows:
            return rows[row]
    return None


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", "")
            if name == "TYPE_CHECKING":
                for statement in node.body:
                    for sub in ast.walk(statement):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def imports_at_run_time(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports when it runs."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_lines(tree)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".")
                if not is_package:
                    parts = parts[:-1]
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            targets = [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target != "disque":
                found.add(target)
    return found


def test_the_map_lists_every_module_and_nothing_else() -> None:
    rows = map_rows()
    assert set(rows.values()) <= set(MAY_USE), rows
    unlisted = [name for name, path in modules().items() if layer_of(path, rows) is None]
    assert unlisted == [], f"modules missing from the map in docs/SERVER.md: {unlisted}"
    gone = [row for row in rows if not (ROOT / row).exists()]
    assert gone == [], f"the map lists files that do not exist: {gone}"


def test_every_import_goes_down_the_layers() -> None:
    rows = map_rows()
    found = modules()
    known = set(found)
    upward = []
    for name, path in found.items():
        layer = layer_of(path, rows)
        assert layer is not None, name
        allowed = MAY_USE[layer] | {layer}
        for target in sorted(imports_at_run_time(name, path, known)):
            target_layer = layer_of(found[target], rows)
            if target_layer not in allowed:
                upward.append(f"{name} ({layer}) imports {target} ({target_layer})")
    assert upward == [], "imports against the map's layers:\n" + "\n".join(upward)


def test_the_check_sees_function_level_imports_and_skips_annotations(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import low\n"
        "if TYPE_CHECKING:\n"
        "    from .high import Thing\n"
        "def f():\n"
        "    from .upper import g\n")
    known = {"pkg.mod", "pkg.low", "pkg.high", "pkg.upper"}
    assert imports_at_run_time("pkg.mod", source, known) == {"pkg.low", "pkg.upper"}


def test_the_docs_cite_only_files_that_exist() -> None:
    """``disque/...`` paths named in the README and docs/ (the map's and any
    other) are files or packages of the tree: renames must carry the docs."""
    cited = re.compile(r"`((?:disque|spark_connector)/[\w/]+(?:\.py|/))`")
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for path in cited.findall(doc.read_text()):
            if not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
    assert missing == [], missing
