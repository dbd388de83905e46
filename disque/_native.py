"""Which core runs: the mypyc-compiled modules or the plain Python source.

The node's hot modules (:data:`COMPILED_MODULES`) are compiled with mypyc
when the package is built where a C compiler exists (``setup.py``); the
same ``.py`` files ship beside the compiled ones.  This module decides
which of the two runs, when the first of them is imported (a finder that
``disque/__init__.py`` places on ``sys.meta_path``), so processes that only
use the client (the CLI, Spark's executors) never look at the core:

* no compiled module found: the source (``interpreted``);
* ``DISQUE_INTERPRETED=1`` in the environment: the source, on request;
* a compiled module older than its edited source (a developer's checkout
  after ``pip install -e .``): the source, with a loud warning on stderr,
  so an edit is never silently shadowed by a stale build;
* otherwise the compiled modules (``compiled``).

It is all or nothing: compiled modules call one another directly in C, so
mixing a compiled ``connection`` with an edited ``protocol.py`` would run
the old protocol anyway.  The choice is made by a finder placed first on
``sys.meta_path`` that loads the ``.py`` of every compiled module.

The build records each compiled module's source hash in
:data:`HASHES_FILE`, which is how staleness is told (an mtime would call a
``git checkout`` of the same content stale).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED_MODULES", "ENV_VAR", "HASHES_FILE", "activate",
           "activate_before_core", "describe"]

#: The modules mypyc compiles: the node's per-command path.  The build
#: (setup.py) reads this tuple from this file.
COMPILED_MODULES: tuple[str, ...] = (
    # Values: the wire, the job and its options, the users.
    "disque.protocol",
    "disque.acl",
    "disque.clock",
    "disque.job",
    "disque.job_options",
    "disque.headers",
    "disque.keyspace",
    "disque.latency",
    "disque.cluster.messages",
    # The tables and the state.
    "disque.queue_order",
    "disque.queue_limit",
    "disque.queue_table",
    "disque.time_buckets",
    "disque.job_table",
    "disque.memory",
    "disque.acked_ids",
    "disque.waiters",
    "disque.events",
    "disque.state",
    "disque.cluster.node",
    "disque.cluster.link",
    "disque.cluster.state",
    "disque.cluster.bus",
    # The spec's procedures: every command and bus message runs through them.
    "disque.schedule",
    "disque.deadletter",
    "disque.groups",
    "disque.queue",
    "disque.jobs",
    "disque.ack",
    "disque.eviction",
    "disque.waitjob",
    "disque.replication",
    "disque.copies",
    "disque.requeue",
    "disque.federation",
    "disque.timers",
    "disque.node_events",
    "disque.cyclic_gc",
    # The command table, the job commands, the bus's dispatch, the connection.
    "disque.commands.registry",
    "disque.commands.jobs",
    "disque.commands.bulk",
    "disque.bus_handlers",
    "disque.connection",
)

#: Set to 1 (or yes/true) to build without compiling, or to run the source
#: of an installed compiled build.
ENV_VAR = "DISQUE_INTERPRETED"

#: Written by the build next to the package: module -> sha256 of its source.
HASHES_FILE = "_compiled_sources.json"

_PACKAGE_DIR = Path(__file__).resolve().parent

#: "compiled" or "interpreted", decided by :func:`activate` (which returns
#: it) at the first import of a core module, and why the compiled modules,
#: although present, do not run ("" otherwise; :func:`describe` says both).
#: Private: code that may run before that decision (a tool, a test, the
#: client) would read the defaults.
_mode = "interpreted"
_reason = ""


def source_path(module: str, package_dir: Path = _PACKAGE_DIR) -> Path:
    """``disque.commands.jobs`` -> ``<package>/commands/jobs.py``."""
    parts = module.split(".")[1:]
    return package_dir.joinpath(*parts).with_suffix(".py")


def source_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _compiled_file(module: str) -> Path | None:
    source = source_path(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_suffix(suffix)
        if candidate.exists():
            return candidate
    return None


def stale_modules(package_dir: Path = _PACKAGE_DIR,
                  modules: Sequence[str] = COMPILED_MODULES) -> list[str] | None:
    """Compiled modules whose source changed since the build (None: no record)."""
    try:
        recorded = json.loads((package_dir / HASHES_FILE).read_text())
    except (OSError, ValueError):
        return None
    stale = []
    for module in modules:
        path = source_path(module, package_dir)
        try:
            if recorded.get(module) != source_hash(path):
                stale.append(module)
        except OSError:
            stale.append(module)
    return stale


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads the ``.py`` of the compiled modules, never their extension."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


class _ActivateFirst(importlib.abc.MetaPathFinder):
    """Runs :func:`activate` when the first compiled module is looked up.

    It finds nothing itself unless :func:`activate` chose the source: then
    it answers as :class:`_SourceFirst` for that first module, which was
    already being looked up when the choice was made.
    """

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in COMPILED_MODULES:
            return None
        activate()
        if _mode == "interpreted" and _reason:
            return _SourceFirst().find_spec(fullname, path, target)
        return None


def activate_before_core() -> None:
    """Defer :func:`activate` to the first import of a compiled module.

    Importing ``disque`` for its client (``disque.client``,
    ``spark_connector``) then never reads the build's record nor hashes the
    core's sources, and never warns about a stale build it does not use.
    """
    if not any(isinstance(f, _ActivateFirst | _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _ActivateFirst())


_decided = False


def _wanted_interpreted() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() in ("1", "yes", "true", "on")


def activate() -> str:
    """Choose compiled or interpreted (once, before any core module loads)."""
    global _mode, _reason, _decided
    if _decided:
        return _mode
    _decided = True
    compiled = [m for m in COMPILED_MODULES if _compiled_file(m) is not None]
    if not compiled:
        _mode = "interpreted"
        return _mode
    reason = ""
    if len(compiled) != len(COMPILED_MODULES):
        reason = "only some modules are compiled (an interrupted build?)"
    elif _wanted_interpreted():
        reason = f"{ENV_VAR} is set"
    else:
        stale = stale_modules()
        if stale is None:
            reason = f"the build left no {HASHES_FILE}"
        elif stale:
            reason = "the source changed after the build: " + ", ".join(stale)
            sys.stderr.write(
                "*** disque: the compiled modules are older than their source "
                f"({', '.join(stale)}).\n*** Running the source instead, interpreted "
                "(slower). Rebuild with `pip install -e .` to compile your changes.\n")
    if reason:
        sys.meta_path.insert(0, _SourceFirst())
        _mode, _reason = "interpreted", reason
    else:
        _mode = "compiled"
    return _mode


def describe() -> str:
    """``compiled (mypyc)``, ``interpreted``, or ``interpreted (why)`` when a
    compiled build is there but does not run; for ``--version`` and INFO."""
    activate()
    if _mode == "compiled":
        return "compiled (mypyc)"
    return f"interpreted ({_reason})" if _reason else "interpreted"
