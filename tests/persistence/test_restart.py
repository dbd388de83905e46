"""Reloading at start-up: jobs come back without queues, except the controlled restart."""

from __future__ import annotations

import redis

from tests.persistence.conftest import aof_file, crash_and_restart, persistence, show
from tests.support.process import wait_for


def test_reload_after_crash_brings_jobs_back_active(aof_node) -> None:
    r = aof_node.client()
    soon = [r.execute_command("ADDJOB", "q", f"soon{i}", 0, "RETRY", 1) for i in range(5)]
    late = r.execute_command("ADDJOB", "q", "late", 0, "RETRY", 30)
    delayed = r.execute_command("ADDJOB", "q", "delayed", 0, "RETRY", 30, "DELAY", 20)
    once = r.execute_command("ADDJOB", "q", "once", 0, "RETRY", 0, "REPLICATE", 1)
    acked = [r.execute_command("ADDJOB", "q", f"acked{i}", 0) for i in range(3)]
    assert r.execute_command("ACKJOB", *acked) == 3
    deleted = r.execute_command("ADDJOB", "q", "deleted", 0)
    assert r.execute_command("DELJOB", deleted) == 1
    fast = r.execute_command("ADDJOB", "q", "fast", 0)
    assert r.execute_command("FASTACK", fast) == 1

    r = crash_and_restart(aof_node)
    assert "DB loaded from append only file" in aof_node.log_text()
    for job_id in [*acked, deleted, fast]:
        assert show(r, job_id) is None, job_id
    # Not queued by the reload: requeued by the retry timer, after DELAY + RETRY.
    for job_id, minimum in ((late, 29_000), (delayed, 49_000)):
        info = show(r, job_id)
        assert info[b"state"] == b"active"
        assert minimum <= info[b"next-requeue-within"] <= minimum + 1_500
    info = show(r, once)
    assert info[b"state"] == b"active" and info[b"next-requeue-within"] is None
    # The RETRY 1 jobs get queued by their timers...
    wait_for(lambda: r.execute_command("QLEN", "q") == 5, timeout=10,
             message="the RETRY 1 jobs to be requeued")
    queued = {entry[1] for entry in r.execute_command("QPEEK", "q", 10)}
    assert queued == set(soon)
    # ... the RETRY 0 job never (it is still active, with no requeue time), and
    # requeueing a job that was never delivered is not an additional delivery
    # (the original counted one).
    assert show(r, once)[b"state"] == b"active"
    for job_id in soon:
        assert show(r, job_id)[b"additional-deliveries"] == 0


def test_known_delivery_counts_after_reload(aof_node) -> None:
    """A job the AOF knows was delivered (rewrite after GETJOB) counts its redelivery."""
    r = aof_node.client()
    job_id = r.execute_command("ADDJOB", "q", "x", 0, "RETRY", 1)
    assert r.execute_command("GETJOB", "FROM", "q")[0][1] == job_id
    assert r.execute_command("BGREWRITEAOF")
    wait_for(lambda: persistence(r)["aof_rewrite_in_progress"] == 0)
    r = crash_and_restart(aof_node)
    wait_for(lambda: r.execute_command("QLEN", "q") == 1, timeout=10)
    assert show(r, job_id)[b"additional-deliveries"] == 1


def controlled_restart(node, r: redis.Redis) -> None:
    """The spec's recipe: CONFIG SET, CONFIG REWRITE, SHUTDOWN REWRITE-AOF, start."""
    assert r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") == b"OK"
    assert r.execute_command("CONFIG", "REWRITE") == b"OK"
    try:
        r.execute_command("SHUTDOWN", "REWRITE-AOF")
    except redis.ConnectionError:
        pass
    wait_for(lambda: not node.alive(), message="the node to exit")
    assert node.proc.returncode == 0
    node.start(port=node.port)


def snapshot(r: redis.Redis, ids: list[bytes]) -> dict:
    keys = (b"state", b"queue", b"nacks", b"additional-deliveries", b"body", b"retry")
    return {job_id: {k: show(r, job_id)[k] for k in keys} for job_id in ids}


def run_controlled_restart(server_factory, tmp_path, appendonly: str) -> None:
    conf = tmp_path / f"disque-{appendonly}.conf"
    conf.write_text(f"# test config\nappendonly {appendonly}\n")
    node = server_factory(config_file=conf, name=f"ctl-{appendonly}")
    r = node.client()
    ids = [r.execute_command("ADDJOB", f"q{i % 2}", f"job{i}", 0, "RETRY", 60)
           for i in range(10)]
    once = r.execute_command("ADDJOB", "q0", "once", 0, "RETRY", 0, "REPLICATE", 1)
    taken = r.execute_command("GETJOB", "FROM", "q1")[0][1]          # delivered: active
    nacked = r.execute_command("GETJOB", "FROM", "q1")[0][1]
    assert r.execute_command("NACK", nacked) == 1                    # nacks 1, queued
    delayed = r.execute_command("ADDJOB", "q0", "delayed", 0, "RETRY", 60, "DELAY", 3)
    all_ids = [*ids, once]
    before = snapshot(r, all_ids)
    order = {q: r.execute_command("QPEEK", q, 100) for q in ("q0", "q1")}

    controlled_restart(node, r)
    r = node.client()
    assert "aof-enqueue-jobs-once switched off" in node.log_text()
    assert snapshot(r, all_ids) == before
    # (The delayed job may have reached its queue time meanwhile.)
    assert {q: [e for e in r.execute_command("QPEEK", q, 100) if e[1] != delayed]
            for q in ("q0", "q1")} == order
    assert show(r, once)[b"state"] == b"queued"        # a queued RETRY-0 job is restored
    assert show(r, taken)[b"state"] == b"active"
    assert r.execute_command("CONFIG", "GET", "aof-enqueue-jobs-once") == [
        b"aof-enqueue-jobs-once", b"no"]
    assert "aof-enqueue-jobs-once no" in conf.read_text()
    # The delayed job was never queued: it is queued when its 3 s delay ends
    # (not DELAY + RETRY after the restart).
    info = show(r, delayed)
    assert info[b"state"] == b"queued" or info[b"next-requeue-within"] <= 3000
    wait_for(lambda: show(r, delayed)[b"state"] == b"queued", timeout=10)
    assert show(r, delayed)[b"additional-deliveries"] == 0

    # Exactly once: a crash now does not restore queues again.
    r = crash_and_restart(node)
    if appendonly == "yes":
        assert r.execute_command("QLEN", "q0") == 0
        assert show(r, ids[0])[b"state"] == b"active"
    else:
        # An in-memory node does not load anything without the option.
        assert r.info("jobs")["registered_jobs"] == 0


def test_controlled_restart_in_memory_node(server_factory, tmp_path) -> None:
    run_controlled_restart(server_factory, tmp_path, "no")


def test_controlled_restart_with_aof(server_factory, tmp_path) -> None:
    run_controlled_restart(server_factory, tmp_path, "yes")


def test_enqueue_once_is_ignored_after_a_crash(server_factory, tmp_path) -> None:
    """Without SHUTDOWN REWRITE-AOF the file is not a safe snapshot of the queues."""
    conf = tmp_path / "crash.conf"
    conf.write_text("appendonly yes\nappendfsync always\n")
    aof_node = server_factory(config_file=conf, name="crash")
    r = aof_node.client()
    once = r.execute_command("ADDJOB", "q", "once", 0, "RETRY", 0, "REPLICATE", 1)
    assert r.execute_command("GETJOB", "FROM", "q")[0][1] == once      # delivered
    other = r.execute_command("ADDJOB", "q", "other", 0, "RETRY", 60)
    r.execute_command("CONFIG", "SET", "aof-enqueue-jobs-once", "yes")
    r.execute_command("CONFIG", "REWRITE")
    r = crash_and_restart(aof_node)   # steps 1 and 2 of the recipe, then a crash
    assert "aof-enqueue-jobs-once ignored" in aof_node.log_text()
    assert r.execute_command("QLEN", "q") == 0
    assert show(r, once)[b"state"] == b"active"      # the delivered RETRY-0 job is not requeued
    assert show(r, other)[b"state"] == b"active"


def test_sigterm_with_everysec_keeps_everything(server_factory) -> None:
    node = server_factory("--appendonly", "yes", "--appendfsync", "everysec")
    r = node.client()
    ids = [r.execute_command("ADDJOB", "q", f"j{i}", 0) for i in range(50)]
    node.restart()
    r = node.client()
    assert all(show(r, job_id) is not None for job_id in ids)
    assert aof_file(node).stat().st_size > 0
