"""Helpers for the persistence tests: real nodes, SHOW/INFO shortcuts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.process import DisqueProcess, wait_for


def show(r: redis.Redis, job_id: bytes) -> dict[bytes, Any] | None:
    """SHOW as a dict (None for an unknown job)."""
    reply = r.execute_command("SHOW", job_id)
    if reply is None:
        return None
    return dict(zip(reply[::2], reply[1::2], strict=True))


def present(r: redis.Redis, ids: list[bytes]) -> set[bytes]:
    """The IDs among ``ids`` that the node knows (pipelined SHOW)."""
    found: set[bytes] = set()
    for start in range(0, len(ids), 1000):
        chunk = ids[start:start + 1000]
        pipe = r.pipeline(transaction=False)
        for job_id in chunk:
            pipe.execute_command("SHOW", job_id)
        found.update(job_id for job_id, reply in zip(chunk, pipe.execute(), strict=True)
                     if reply is not None)
    return found


def persistence(r: redis.Redis) -> dict[str, Any]:
    return r.info("persistence")


def wait_rewrite_done(r: redis.Redis, timeout: float = 60.0) -> dict[str, Any]:
    wait_for(lambda: persistence(r)["aof_rewrite_in_progress"] == 0, timeout,
             interval=0.02, message="the AOF rewrite to finish")
    return persistence(r)


def crash_and_restart(node: DisqueProcess) -> redis.Redis:
    """SIGKILL, then start again on the same port and directory."""
    node.kill()
    node.start(port=node.port)
    return node.client()


def start_refused(node: DisqueProcess, *extra: str) -> str:
    """Start ``node`` expecting it to refuse (exit 1); return its output.

    (``DisqueProcess.start`` only notices an exit once a new "Ready" line
    appears, so it would wait for its whole timeout here.)
    """
    cmd = [sys.executable, "-m", "disque.server", "--port", "0", "--dir", str(node.workdir),
           *node.args, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout + done.stderr


def aof_file(node: DisqueProcess) -> Path:
    return node.workdir / "appendonly.aof"


@pytest.fixture
def aof_node(server_factory):
    """A node with appendonly yes and appendfsync always."""
    return server_factory("--appendonly", "yes", "--appendfsync", "always")
