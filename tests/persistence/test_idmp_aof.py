"""IDMP keys (idempotent ADDJOB, extension) survive restarts with the AOF."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import redis

from tests.persistence.conftest import aof_file, crash_and_restart, wait_rewrite_done
from tests.support.process import wait_for


def idmp_keys(r) -> int:
    return r.info("extensions")["idmp_keys"]


def test_keys_survive_a_crash(aof_node) -> None:
    r = aof_node.client()
    kept = r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k1")
    acked = r.execute_command("ADDJOB", "q", "acked", 0, "IDMP", "k2")
    assert r.execute_command("ACKJOB", acked) == 1
    short = r.execute_command("ADDJOB", "q", "short", 0, "IDMP", "k3", "IDMP-WINDOW", 1)
    plain = r.execute_command("ADDJOB", "q", "plain", 0)

    r = crash_and_restart(aof_node)
    assert "IDMP keys)" in aof_node.log_text()
    # k1 and k2 come back (the acked job itself is gone: its retry still
    # gets its ID); k3's window ends a second after it was made.
    assert r.execute_command("ADDJOB", "q", "body", 0, "IDMP", "k1") == kept
    assert r.execute_command("ADDJOB", "q", "acked", 0, "IDMP", "k2") == acked
    assert r.execute_command("SHOW", acked) is None
    wait_for(lambda: r.execute_command("ADDJOB", "q", "short", 0, "IDMP", "k3") != short, 5,
             message="k3's window to end")
    assert r.execute_command("SHOW", plain) is not None
    assert r.execute_command("SHOW", kept) is not None


def test_keys_survive_rewrites(aof_node) -> None:
    r = aof_node.client()
    ids = {f"k{i}": r.execute_command("ADDJOB", "q", f"b{i}", 0, "IDMP", f"k{i}")
           for i in range(300)}
    r.execute_command("BGREWRITEAOF")
    wait_rewrite_done(r)
    after = r.execute_command("ADDJOB", "q", "late", 0, "IDMP", "late")
    r = crash_and_restart(aof_node)
    assert idmp_keys(r) == 301
    for i in (0, 150, 299):
        assert r.execute_command("ADDJOB", "q", f"b{i}", 0, "IDMP", f"k{i}") == ids[f"k{i}"]
    assert r.execute_command("ADDJOB", "q", "late", 0, "IDMP", "late") == after

    # SHUTDOWN REWRITE-AOF writes them too.
    with contextlib.suppress(redis.ConnectionError):  # the node exits as it answers
        r.execute_command("SHUTDOWN", "REWRITE-AOF")
    wait_for(lambda: not aof_node.alive(), 10, message="the node to exit")
    aof_node.start(port=aof_node.port)
    r = aof_node.client()
    assert idmp_keys(r) == 301
    assert r.execute_command("ADDJOB", "q", "b7", 0, "IDMP", "k7") == ids["k7"]
    # The checker knows the record.
    done = subprocess.run([sys.executable, "-m", "disque.aof.check", str(aof_file(aof_node))],
                          capture_output=True, text=True, timeout=60)
    assert "301 IDMP key records" in done.stdout, done.stdout + done.stderr
