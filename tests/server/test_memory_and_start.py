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


def test_maxmemory_below_the_baseline_is_warned_at_start_and_refused_by_config_set(
        server_factory) -> None:
    # A Python node weighs tens of MB before it holds any job: that baseline
    # counts in used_memory, so a smaller limit refuses every ADDJOB.
    node = server_factory("--maxmemory", "1mb")
    warning = next((line for line in node.log_text().splitlines()
                    if "cannot hold a single job" in line), None)
    assert warning is not None, node.log_text()
    r = node.client()
    base = r.info("memory")["used_memory"]
    assert f"maxmemory 1048576 (1.0mb) cannot hold a single job: the node itself uses {base} " \
        "bytes" in warning
    assert "CONFIG SET maxmemory" in warning
    # CONFIG SET refuses such a limit and keeps the old one.
    with pytest.raises(redis.ResponseError) as err:
        r.execute_command("CONFIG", "SET", "maxmemory", "2mb")
    assert str(err.value).startswith(
        "Invalid argument '2mb' for CONFIG SET 'maxmemory': maxmemory 2097152 (2.0mb) cannot "
        f"hold a single job: the node itself uses {base} bytes")
    assert r.execute_command("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"1mb"]
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.execute_command("ADDJOB", "q", "x", 0)
    # A limit above the baseline is taken, and jobs fit again.
    assert r.execute_command("CONFIG", "SET", "maxmemory", str(base + 1_000_000)) == b"OK"
    assert r.execute_command("ADDJOB", "q", "x", 0)


def test_default_maxmemory_logs_no_warning(server) -> None:
    assert "cannot hold a single job" not in server.log_text()


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
