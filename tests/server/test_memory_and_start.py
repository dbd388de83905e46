"""Memory limits on a real node, and start-up variants (daemonize, wildcard bind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.support.process import DisqueProcess, wait_for


def test_oom_refuses_growth_but_keeps_serving(server: DisqueProcess) -> None:
    r = server.client()
    kept = r.execute_command("ADDJOB", "q", "kept", 0)
    used = r.info("memory")["used_memory"]
    r.execute_command("CONFIG", "SET", "maxmemory", str(used + 2_000_000))
    body = b"x" * 50_000
    added = 0
    # redis-py maps the -OOM prefix to its OutOfMemoryError and strips the code.
    with pytest.raises(redis.exceptions.OutOfMemoryError, match=r"^command not allowed"):
        for _ in range(1000):
            r.execute_command("ADDJOB", "q", body, 0)
            added += 1
    assert 10 < added < 1000
    assert r.info("memory")["memory_warning_level"] == 3
    # Reads and ACKs still work, and ACKing frees memory for new jobs.
    jobs = r.execute_command("GETJOB", "COUNT", 1000, "FROM", "q")
    assert jobs[0][1] == kept and len(jobs) == added + 1
    assert r.execute_command("ACKJOB", *[j[1] for j in jobs]) == added + 1
    assert r.execute_command("ADDJOB", "q", body, 0)


def test_eviction_of_delivered_at_most_once_jobs(server: DisqueProcess) -> None:
    r = server.client()
    used = r.info("memory")["used_memory"]
    r.execute_command("CONFIG", "SET", "maxmemory", str(used + 4_000_000))
    body = b"y" * 20_000
    for _ in range(400):  # far more than fits: each delivered at once
        r.execute_command("ADDJOB", "q", body, 0, "RETRY", 0)
        r.execute_command("GETJOB", "FROM", "q")
    info = r.info()
    assert info["evicted_jobs"] > 0
    assert info["memory_warning_level"] < 3


def test_bind_wildcard_hello_reports_usable_ip(server_factory) -> None:
    node = server_factory("--bind", "0.0.0.0")
    hello = node.client().execute_command("HELLO")
    assert hello[2][1] == b"127.0.0.1"


def test_daemonize_and_pidfile(tmp_path: Path) -> None:
    pidfile = tmp_path / "disque.pid"
    logfile = tmp_path / "disque.log"
    result = subprocess.run(
        [sys.executable, "-m", "disque.server", "--port", "0", "--dir", str(tmp_path),
         "--daemonize", "yes", "--pidfile", str(pidfile), "--logfile", str(logfile)],
        timeout=30)
    assert result.returncode == 0  # the parent returns at once
    wait_for(lambda: pidfile.exists() and b"Ready to accept" in logfile.read_bytes(), 15,
             message="daemon ready")
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pidfile.exists(), 15, message="pid file removed on exit")
    assert "bye bye" in logfile.read_text()
