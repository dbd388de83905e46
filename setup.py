"""Build hook: compile the node's hot modules with mypyc (everything else is
in pyproject.toml).

``pip install .``, ``pip install -e .``, the Docker image and wheels compile
the modules listed in ``disque/_native.py`` (COMPILED_MODULES) into C
extensions that sit beside their ``.py`` files.  Where that cannot be done
(no C compiler or Python headers, mypyc missing, or ``DISQUE_INTERPRETED=1``
asks not to) the build prints one line and the package installs as plain
Python: an install never fails for want of the compiled core.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
NATIVE = ROOT / "disque" / "_native.py"


def _constant(name: str) -> object:
    """A literal assigned in disque/_native.py, read without importing the package."""
    tree = ast.parse(NATIVE.read_text())
    for node in tree.body:
        targets = ([node.target] if isinstance(node, ast.AnnAssign)
                   else node.targets if isinstance(node, ast.Assign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)  # type: ignore[union-attr,arg-type]
    raise RuntimeError(f"{name} not found in {NATIVE}")


MODULES: tuple[str, ...] = _constant("COMPILED_MODULES")  # type: ignore[assignment]
ENV_VAR: str = _constant("ENV_VAR")  # type: ignore[assignment]
HASHES_FILE: str = _constant("HASHES_FILE")  # type: ignore[assignment]


def _notice(why: str) -> None:
    print(f"disque: building without the compiled core ({why}); the node runs "
          "interpreted, correct but slower", file=sys.stderr)


def _source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


class OptionalBuildExt(build_ext):
    """Compile the extensions; on any failure, drop them all and go on.

    All or nothing: the modules call one another in C through one shared
    library, so a partial build is worse than none.  On success, record the
    sources' hashes (disque/_native.py compares them at start-up so that a
    stale build never shadows an edited source silently).
    """

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, missing headers ...
            self._remove_outputs()
            _notice(f"the C build failed: {exc}")
            return
        hashes = {m: hashlib.sha256(_source(m).read_bytes()).hexdigest() for m in MODULES}
        package_dir = ROOT / "disque" if self.inplace else Path(self.build_lib) / "disque"
        package_dir.mkdir(parents=True, exist_ok=True)
        (package_dir / HASHES_FILE).write_text(json.dumps(hashes, indent=1) + "\n")

    def _remove_outputs(self) -> None:
        for ext in self.extensions:
            path = Path(self.get_ext_fullpath(ext.name))
            path.unlink(missing_ok=True)


def _extensions() -> list[object]:
    if os.environ.get(ENV_VAR, "").strip().lower() in ("1", "yes", "true", "on"):
        _notice(f"{ENV_VAR} is set")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _notice("mypyc is not installed")
        return []
    try:
        return list(mypycify([str(_source(m).relative_to(ROOT)) for m in MODULES],
                             opt_level="3", group_name="disque_core"))
    except BaseException as exc:  # mypy's errors end in SystemExit
        _notice(f"mypyc could not translate the modules: {exc!r}")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
