"""The compiled core and its fallbacks (disque/_native.py, setup.py).

Run against whatever this checkout's install built: with a compiled build
the tests check that it runs, and that DISQUE_INTERPRETED and a stale build
fall back to the source; without one, that the source runs and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import disque
from disque import _native
from tests.support.process import DisqueProcess

PACKAGE = Path(disque.__file__).resolve().parent
COMPILED = _native.activate() == "compiled"
needs_compiled = pytest.mark.skipif(
    not COMPILED, reason=f"this install runs {_native.describe()}: no compiled build to test")


def _probe(env_extra: dict[str, str], path: Path | None = None) -> tuple[str, str, str]:
    """(the core it chose, protocol module file, stderr) of a fresh interpreter."""
    env = {**os.environ, **env_extra}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if path is not None:
        env["PYTHONPATH"] = str(path)
    code = ("import disque, disque._native as n, disque.protocol as p; "
            "print(n.activate()); print(p.__file__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=path or PACKAGE.parent, timeout=60)
    assert result.returncode == 0, result.stderr
    mode, module_file = result.stdout.split()
    return mode, module_file, result.stderr


def test_version_and_info_say_which_core_runs(server: DisqueProcess) -> None:
    out = subprocess.run([sys.executable, "-m", "disque.server", "--version"],
                         capture_output=True, text=True, timeout=60).stdout
    assert f"core: {_native.describe()}" in out
    info = server.client().info("server")
    assert info["disque_core"] == _native.describe()


@needs_compiled
def test_the_compiled_modules_are_what_runs() -> None:
    mode, module_file, _ = _probe({})
    assert mode == "compiled" and not module_file.endswith(".py")


@needs_compiled
def test_compiled_jobs_and_replies_are_not_tracked_by_the_cyclic_collector() -> None:
    """Job, JobExt, Encoded and ReplyError are acyclic (disque/compiled.py):
    a node's stored jobs are never walked by a collection.  Connections and
    the commands' stand-in clients are native classes; the tests' own
    stand-ins may still subclass them."""
    code = ("import gc; from disque.job import Job; from disque.job_options import JobExt; "
            "from disque.protocol import Encoded, ReplyError; "
            "from disque.commands.registry import CommandClient; "
            "from disque.connection import ClientConnection; "
            "job = Job(b'D-1', b'q', b'body'); job.ext = JobExt(priority=3); "
            "print([gc.is_tracked(x) for x in (job, job.ext, Encoded(b'+x'), ReplyError('ERR'))]); "
            "print('__dict__' in ClientConnection.__dict__); "
            "Local = type('Local', (CommandClient,), {}); print(Local(None).last_command)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=PACKAGE.parent, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["[False, False, False, False]", "False", "NULL"]


@needs_compiled
def test_disque_interpreted_runs_the_source() -> None:
    mode, module_file, _ = _probe({_native.ENV_VAR: "1"})
    assert mode == "interpreted" and module_file.endswith("protocol.py")


@needs_compiled
def test_an_edited_source_is_never_shadowed_by_a_stale_build(tmp_path: Path) -> None:
    # A copy of the installed package (and the compiled group's shared library
    # from beside it), with one compiled module's source edited.
    shutil.copytree(PACKAGE, tmp_path / "disque",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for shared in PACKAGE.parent.glob("disque_core__mypyc*"):
        shutil.copy2(shared, tmp_path)
    queue_py = tmp_path / "disque" / "queue.py"
    queue_py.write_text(queue_py.read_text() + "\n# an edit after the build\n")
    mode, module_file, stderr = _probe({}, tmp_path)
    assert mode == "interpreted" and module_file == str(tmp_path / "disque" / "protocol.py")
    assert "older than their source (disque.queue)" in stderr


def test_stale_modules_compares_source_hashes(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "b.py").write_text("B = 1\n")
    modules = ("pkg.a", "pkg.b")
    assert _native.stale_modules(pkg, modules) is None  # no record: not a judgement
    record = {m: _native.source_hash(_native.source_path(m, pkg)) for m in modules}
    (pkg / _native.HASHES_FILE).write_text(json.dumps(record))
    assert _native.stale_modules(pkg, modules) == []
    (pkg / "b.py").write_text("B = 2\n")
    assert _native.stale_modules(pkg, modules) == ["pkg.b"]
    (pkg / "a.py").unlink()
    assert _native.stale_modules(pkg, modules) == ["pkg.a", "pkg.b"]
