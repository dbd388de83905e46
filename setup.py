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
import contextlib
import hashlib
import io
import json
import logging
import os
import sys
import time
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


_STARTED = time.monotonic()
#: setup.py commands that build the extensions; the others (egg_info and
#: dist_info for metadata, sdist) do not need them translated.
BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "develop", "install"}
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
        if not self.extensions:
            return
        # The compiler's command lines (logged at INFO, ~2 kB each) are noise
        # for a user; the build's one line says what happens.  -v keeps them.
        root = logging.getLogger()
        level = root.level
        if self.verbose <= 1:
            root.setLevel(logging.WARNING)
        try:
            super().run()
        except Exception as exc:  # CompileError, LinkError, missing headers ...
            self._remove_outputs()
            _notice(f"the C build failed: {exc}")
            return
        finally:
            root.setLevel(level)
        print(f"disque: compiled the node's core in {time.monotonic() - _STARTED:.0f} s",
              file=sys.stderr)
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
    if not set(sys.argv[1:]) & BUILDS:
        return []  # metadata or an sdist: nothing to compile (and no 20 s translation)
    print(f"disque: compiling the node's core ({len(MODULES)} modules) with mypyc and the C "
          "compiler: a minute or two", file=sys.stderr)
    # mypyc's notes on the code ("Treating generator comprehension as list")
    # are for whoever optimizes it, not for an install: shown only on failure.
    notes = io.StringIO()
    try:
        with contextlib.redirect_stdout(notes):
            extensions = list(mypycify([str(_source(m).relative_to(ROOT)) for m in MODULES],
                                       opt_level="3", group_name="disque_core"))
    except BaseException as exc:  # mypy's errors end in SystemExit
        sys.stderr.write(notes.getvalue())
        _notice(f"mypyc could not translate the modules: {exc!r}")
        return []
    # mypyc's generated C draws compiler warnings (unused labels and
    # variables) that say nothing about this code.
    for extension in extensions:
        extension.extra_compile_args = [*extension.extra_compile_args, "-w"]
    return extensions


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
