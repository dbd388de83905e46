"""CI runs the whole suite against the installed core (compiled when the
build could compile it); this runs a representative part of it again
against the interpreted source, so both stay correct.

The part: every single-node server test (commands, bad input, the state
machine and its internals in process, the protocol parser, blocking,
memory) and real 3-node clusters for replication, pipelined ADDJOBs and
federation.  About two minutes.  Left out: persistence, the client, Spark,
the fault harness and the benchmarks' smoke tests, which exercise the core
through the same paths.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from disque import _native

ROOT = Path(__file__).resolve().parent.parent
SUBSET = [
    "tests/server",
    "tests/test_protocol_unit.py",
    "tests/cluster/test_replication.py",
    "tests/cluster/test_pipelined_addjob.py",
    "tests/cluster/test_federation.py",
    "tests/cluster/test_federation_push.py",
]


@pytest.mark.skipif(_native.activate() != "compiled",
                    reason="the suite already runs interpreted: no compiled build installed")
def test_the_interpreted_core_passes_the_subset() -> None:
    env = {**os.environ, _native.ENV_VAR: "1"}
    probe_code = "import disque._native as n; print(n.activate())"
    probe = subprocess.run([sys.executable, "-c", probe_code],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "interpreted", probe.stderr
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             *SUBSET], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=900)
    tail = "\n".join(result.stdout.splitlines()[-30:])
    assert result.returncode == 0, tail + result.stderr[-2000:]
