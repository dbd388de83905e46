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


def test_tiny_limits_are_taken_with_a_warning_that_names_the_figures(server_factory) -> None:
    # The original's tools set 1 or 3mb on purpose to reach the memory
    # levels: every such limit is taken, and the node says what it means.
    node = server_factory("--maxmemory", "1mb")
    r = node.client()
    memory = r.info("memory")
    warning = next((line for line in node.log_text().splitlines()
                    if "WARNING: maxmemory 1048576 (1.00mb)" in line), None)
    assert warning is not None, node.log_text()
    # 1mb is above the start-up share, below the process: the warning says
    # the limit counts the data and names the resident size.
    assert "limits the node's data (used_memory, now 614400), not the process, whose " \
        "resident size is " in warning and "docs/SERVER.md" in warning
    assert memory["used_memory"] == memory["used_memory_startup"] == 614400
    assert r.execute_command("ADDJOB", "q", "x", 0)

    log_lines = len(node.log_text().splitlines())
    assert r.execute_command("CONFIG", "SET", "maxmemory", "1") == b"OK"
    assert r.execute_command("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"1"]
    used = r.info("memory")["used_memory"]
    new_lines = node.log_text().splitlines()[log_lines:]
    assert any(f"WARNING: maxmemory 1 (0.0kb) is below 95% of what the node holds now "
               f"(used_memory {used} = start-up 614400 + data and buffers {used - 614400}): "
               "acked and delivered at-most-once jobs are evicted before every command and "
               "commands that add data get -OOM" in line for line in new_lines), new_lines
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("QLEN", "q") == 1  # reads still work

    assert r.execute_command("CONFIG", "SET", "maxmemory", "0") == b"OK"
    assert "WARNING: maxmemory is 0: as in the original Disque" in node.log_text()
    assert r.info("memory")["memory_warning_level"] == 2
    # A lone node keeps the copy itself (nobody else can take it), and 0 is
    # never -OOM.
    assert r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("QLEN", "q") == 2

    assert r.execute_command("CONFIG", "SET", "maxmemory", "3mb") == b"OK"
    assert r.info("memory")["memory_warning_level"] == 0


def test_default_maxmemory_logs_no_warning(server) -> None:
    assert "WARNING: maxmemory" not in server.log_text()


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
    # The pid file goes just before the last log line: wait for both.
    wait_for(lambda: not pidfile.exists() and "bye bye" in logfile.read_text(), 15,
             message="pid file removed and the last log line written on exit")
