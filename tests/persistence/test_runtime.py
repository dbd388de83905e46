"""Turning the AOF on and off at run time, INFO, LOADJOB, and write failures (-MISCONF)."""

from __future__ import annotations

import resource
import socket

import pytest
import redis

from tests.persistence.conftest import aof_file, crash_and_restart, persistence, present
from tests.persistence.test_rewrite import add_many
from tests.support.process import wait_for

INFO_FIELDS = ("loading", "aof_enabled", "aof_state", "aof_rewrite_in_progress",
               "aof_rewrite_scheduled", "aof_last_rewrite_time_sec",
               "aof_current_rewrite_time_sec", "aof_last_bgrewrite_status",
               "aof_last_write_status", "aof_current_size", "aof_base_size")


def test_config_set_appendonly_yes_writes_a_fresh_file(server_factory) -> None:
    node = server_factory()
    r = node.client()
    assert persistence(r)["aof_state"] == "off"
    before = add_many(r, 3000)
    assert not aof_file(node).exists()
    assert r.execute_command("CONFIG", "SET", "appendonly", "yes") == b"OK"
    during = add_many(r, 50)           # while the initial file is being written
    wait_for(lambda: persistence(r)["aof_state"] == "on", timeout=20,
             message="aof_state to become on")
    after = add_many(r, 50)
    info = persistence(r)
    assert all(name in info for name in INFO_FIELDS)
    assert info["aof_enabled"] == 1 and info["aof_last_write_status"] == "ok"
    assert info["aof_current_size"] == aof_file(node).stat().st_size > 0
    node.kill()
    node.args += ["--appendonly", "yes"]
    node.start()
    everything = [*before, *during, *after]
    assert present(node.client(), everything) == set(everything)


def test_config_set_appendonly_no_stops_logging(aof_node) -> None:
    r = aof_node.client()
    kept = r.execute_command("ADDJOB", "q", "kept", 0)
    assert r.execute_command("CONFIG", "SET", "appendonly", "no") == b"OK"
    assert persistence(r)["aof_state"] == "off"
    size = aof_file(aof_node).stat().st_size
    r.execute_command("ADDJOB", "q", "not logged", 0)
    assert aof_file(aof_node).stat().st_size == size
    r = crash_and_restart(aof_node)      # still started with --appendonly yes
    assert r.info("jobs")["registered_jobs"] == 1 and present(r, [kept]) == {kept}


def test_appendonly_off_then_on_logs_new_jobs_and_acks_again(aof_node) -> None:
    # The job hooks leave the state's lists while nothing is logged and come
    # back with the AOF: what happens after the second "yes" must be logged.
    r = aof_node.client()
    acked_later = r.execute_command("ADDJOB", "q", "acked later", 0)
    assert r.execute_command("CONFIG", "SET", "appendonly", "no") == b"OK"
    assert r.execute_command("CONFIG", "SET", "appendonly", "yes") == b"OK"
    wait_for(lambda: persistence(r)["aof_state"] == "on", timeout=20,
             message="aof_state to become on again")
    added_later = r.execute_command("ADDJOB", "q", "added later", 0)
    assert r.execute_command("ACKJOB", acked_later) == 1
    r = crash_and_restart(aof_node)
    assert present(r, [acked_later, added_later]) == {added_later}


def test_appendfsync_can_change_at_run_time(aof_node) -> None:
    r = aof_node.client()
    for policy in ("everysec", "no", "always"):
        assert r.execute_command("CONFIG", "SET", "appendfsync", policy) == b"OK"
        job_id = r.execute_command("ADDJOB", "q", policy, 0)
        assert present(r, [job_id]) == {job_id}


def test_loadjob_is_refused_to_clients(aof_node) -> None:
    r = aof_node.client()
    with pytest.raises(redis.ResponseError, match="reserved for loading the append only file"):
        r.execute_command("LOADJOB", b"\x00" * 80)


def raw_call(port: int, inline: bytes) -> bytes:
    """One inline command on a fresh socket; the raw reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(inline + b"\r\n")
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    return data


@pytest.mark.parametrize("policy", ["always", "everysec"])
def test_write_failure_gives_misconf_and_loses_nothing(server_factory, policy: str) -> None:
    """A full disk, simulated with RLIMIT_FSIZE on the node (root ignores chmod).

    Writes past the limit fail with EFBIG (Python ignores SIGXFSZ), exactly
    like a disk that is full at the current end of the AOF.
    """
    node = server_factory("--appendonly", "yes", "--appendfsync", policy)
    r = node.client()
    # Make the AOF much larger than the log and nodes.conf, which the limit
    # must not hit.
    big = r.execute_command("ADDJOB", "q", b"B" * 300_000, 0)
    acked = [r.execute_command("ADDJOB", "q", f"ok{i}", 0) for i in range(10)]
    size = aof_file(node).stat().st_size
    resource.prlimit(node.pid, resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
    try:
        # The write that fails answers -MISCONF (the job stays in memory and
        # its record is written once the disk accepts it), and so does every
        # later write command while writing fails.
        assert raw_call(node.port, b"ADDJOB q refused 0").startswith(
            b"-MISCONF Errors writing to the AOF file: File too large")
        assert raw_call(node.port, b"ADDJOB q refused-too 0").startswith(b"-MISCONF ")
        with pytest.raises(redis.ResponseError, match="Errors writing to the AOF file"):
            r.execute_command("GETJOB", "NOHANG", "FROM", "q")
        # Reads still work, and INFO says what is wrong.
        assert r.execute_command("QLEN", "q") >= 11
        info = persistence(r)
        assert info["aof_last_write_status"] == "err"
        assert "too large" in info["aof_last_write_error"].lower()
        assert aof_file(node).stat().st_size == size       # no partial record left
    finally:
        resource.prlimit(node.pid, resource.RLIMIT_FSIZE,
                         (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    # The disk has room again: the next write command succeeds.
    recovered = r.execute_command("ADDJOB", "q", "recovered", 0)
    assert persistence(r)["aof_last_write_status"] == "ok"
    r = crash_and_restart(node)
    everything = [big, *acked, recovered]
    assert present(r, everything) == set(everything)
