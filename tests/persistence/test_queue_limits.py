"""QLIMIT in the AOF: a queue's rate limit survives a crash, a rewrite and
SHUTDOWN REWRITE-AOF; OFF is remembered too (docs/EXTENSIONS.md, "Rate limits")."""

from __future__ import annotations

import subprocess
import sys

import redis

from tests.persistence.conftest import aof_file, crash_and_restart, wait_rewrite_done
from tests.support.process import wait_for


def test_limits_survive_crash_rewrite_and_shutdown(aof_node) -> None:
    r = aof_node.client()
    assert r.execute_command("QLIMIT", "kept", 7, 2500) == b"OK"
    assert r.execute_command("QLIMIT", "changed", 1, 100) == b"OK"
    assert r.execute_command("QLIMIT", "changed", 3, 900) == b"OK"
    assert r.execute_command("QLIMIT", "gone", 5, 1000) == b"OK"
    assert r.execute_command("QLIMIT", "gone", "OFF") == b"OK"
    expected = {b"kept": [7, 2500], b"changed": [3, 900], b"gone": None}

    def limits(r: redis.Redis) -> dict[bytes, list[int] | None]:
        return {name: r.execute_command("QLIMIT", name) for name in expected}

    r = crash_and_restart(aof_node)
    assert limits(r) == expected
    r.execute_command("BGREWRITEAOF")
    wait_rewrite_done(r)
    r = crash_and_restart(aof_node)
    assert limits(r) == expected
    try:
        r.execute_command("SHUTDOWN", "REWRITE-AOF")
    except redis.ConnectionError:
        pass
    wait_for(lambda: not aof_node.alive(), message="the node to exit")
    aof_node.start(port=aof_node.port)
    r = aof_node.client()
    assert limits(r) == expected
    # The reloaded limit works: 7 per window.
    for i in range(10):
        r.execute_command("ADDJOB", "kept", f"j{i}", 0)
    assert len(r.execute_command("GETJOB", "NOHANG", "COUNT", 10, "FROM", "kept")) == 7
    report = subprocess.run([sys.executable, "-m", "disque.aof.check", str(aof_file(aof_node))],
                            capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stdout + report.stderr
    assert "QLIMIT records (queue rate limits)" in report.stdout
