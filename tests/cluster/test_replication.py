"""Jobs across real nodes: copies, survival of node losses, ACK GC,
re-queue without duplicates, -NOREPL."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from tests.support.cluster import holders, node_id, show
from tests.support.process import DisqueProcess, wait_for


def test_copies_land_on_exactly_n_nodes(make_cluster) -> None:
    nodes = make_cluster(5)
    for replicate in (2, 3, 5):
        job_id = nodes[0].client().execute_command("ADDJOB", "q", "x", 5000,
                                                   "REPLICATE", replicate)
        have = holders(nodes, job_id)
        # Replication is synchronous: every copy exists when the ID is returned.
        assert len(have) == replicate and nodes[0] in have
        listed = {n.decode() for n in show(nodes[0], job_id)[b"nodes-delivered"]}
        assert listed == {node_id(n) for n in have}
        states = {show(n, job_id)[b"state"] for n in have}
        assert states == {b"queued", b"active"}  # queued where it was added only
        assert show(nodes[0], job_id)[b"state"] == b"queued"


def test_default_replication_is_min_3_and_cluster_size(make_cluster) -> None:
    a, b = make_cluster(2)
    job_id = a.client().execute_command("ADDJOB", "q", "x", 5000)
    assert show(a, job_id)[b"repl"] == 2 and len(holders([a, b], job_id)) == 2


def test_job_survives_the_loss_of_replicate_minus_one_nodes(make_cluster) -> None:
    nodes = make_cluster(4)
    creator = nodes[0]
    job_id = creator.client().execute_command("ADDJOB", "q", "survivor", 5000,
                                              "REPLICATE", 3, "RETRY", 1)
    have = holders(nodes, job_id)
    survivor = next(n for n in have if n is not creator)
    for node in have:
        if node is not survivor:
            node.kill()  # the creator and one more copy: REPLICATE - 1 nodes
    # The last copy is queued at its RETRY time and delivered.
    job = wait_for(lambda: survivor.client().execute_command(
        "GETJOB", "NOHANG", "FROM", "q"), timeout=15, message="the surviving copy")
    assert job[0][1] == job_id and job[0][2] == b"survivor"


def test_ack_on_any_copy_removes_the_job_from_every_node(make_cluster) -> None:
    nodes = make_cluster(3)
    job_id = nodes[0].client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 3)
    assert len(holders(nodes, job_id)) == 3
    assert nodes[2].client().execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: not holders(nodes, job_id), timeout=10,
             message="the GC to delete every copy")


def test_gc_waits_for_a_dead_copy_and_completes_when_it_returns(make_cluster) -> None:
    nodes = make_cluster(3, "--appendonly", "yes", "--appendfsync", "always")
    a, b, c = nodes
    job_id = a.client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 3)
    c.kill()
    assert a.client().execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: show(b, job_id) is None or show(b, job_id)[b"state"] == b"acked",
             timeout=10, message="b to learn of the ACK")
    # c may still hold a copy: the ACK is held, not forgotten.
    assert show(a, job_id)[b"state"] == b"acked"
    c.start(port=c.port)
    assert show(c, job_id) is not None  # its copy came back from the AOF
    wait_for(lambda: not holders(nodes, job_id), timeout=60,
             message="the held GC to finish once c is back")


def test_no_job_is_queued_on_two_nodes_at_once(make_cluster) -> None:
    nodes = make_cluster(3)
    ids = [nodes[i % 3].client().execute_command("ADDJOB", "q", f"j{i}", 5000,
                                                 "REPLICATE", 3, "RETRY", 1)
           for i in range(30)]
    started = time.monotonic()
    polls = 0

    def three_retry_periods_without_a_double() -> bool:
        nonlocal polls
        polls += 1
        queued: dict[bytes, int] = {}
        for node in nodes:
            for job_id in ids:
                info = show(node, job_id)
                if info is not None and info[b"state"] == b"queued":
                    queued[job_id] = queued.get(job_id, 0) + 1
        assert all(count == 1 for count in queued.values()), queued
        assert len(queued) == len(ids)  # and none lost from every queue
        # The copies' RETRY came 3 times, and the cluster was looked at more
        # than 5 times meanwhile (a poll of 90 SHOWs takes long on a loaded
        # machine: then it looks on past the 3.5 s).
        return time.monotonic() - started > 3.5 and polls > 5

    # Nobody consumes: at every RETRY each copy would queue the job again,
    # unless WILLQUEUE/QUEUED tell it the job is queued elsewhere.
    wait_for(three_retry_periods_without_a_double, timeout=30, interval=0.2,
             message="three RETRY periods, looked at more than 5 times")
    delivered: list[bytes] = []

    def drained() -> bool:
        # Polling an empty queue asks the other nodes for jobs (federation):
        # keep visiting every node until all are in.
        for node in nodes:
            jobs = node.client().execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "q")
            delivered.extend(job[1] for job in jobs or [])
        return len(delivered) >= len(ids)

    wait_for(drained, timeout=20, message=lambda: f"{len(delivered)} of {len(ids)} jobs")
    assert sorted(delivered) == sorted(ids)  # each exactly once


def test_noreply_timeout_leaves_no_copies(make_cluster) -> None:
    a, b, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)  # linked, but it never answers GOTJOB
    try:
        with pytest.raises(redis.ResponseError, match="NOREPL Timeout reached before "
                                                      "replicating"):
            a.client().execute_command("ADDJOB", "q", "x", 300, "REPLICATE", 3, "RETRY", 1)
    finally:
        os.kill(c.pid, signal.SIGCONT)
    ids = [j for n in (a, b, c)
           for j in n.client().execute_command("JSCAN", 0, "COUNT", 1000)[1]]
    wait_for(lambda: not any(n.client().execute_command("JSCAN", 0, "COUNT", 1000)[1]
                             for n in (a, b, c)), timeout=10,
             message=lambda: f"the partial copies to go (had {ids})")


def test_the_timeout_applies_without_any_option(make_cluster) -> None:
    """``ADDJOB q body 300`` alone: the fast path for option-less ADDJOBs once
    dropped the timeout, and such a job waited for its copies forever."""
    a, _, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)
    try:
        client = a.client(socket_timeout=10)
        with pytest.raises(redis.ResponseError, match="NOREPL Timeout reached"):
            client.execute_command("ADDJOB", "q", "x", 300)
    finally:
        os.kill(c.pid, signal.SIGCONT)


def test_async_replies_at_once_and_copies_follow(make_cluster) -> None:
    nodes = make_cluster(3)
    job_id = nodes[1].client().execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 3, "ASYNC")
    wait_for(lambda: len(holders(nodes, job_id)) == 3, timeout=5, message="3 copies")


def test_retry_zero_copies_are_queued_when_leaving(make_cluster) -> None:
    """The original never queued a RETRY-0 copy: a job
    added on a leaving node, replicated externally, was lost."""
    a, b = make_cluster(2)
    a.client().execute_command("CLUSTER", "LEAVING", "yes")
    job_id = a.client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 1, "RETRY", 0)
    assert show(a, job_id) is None  # no local copy while leaving
    job = wait_for(lambda: b.client().execute_command("GETJOB", "NOHANG", "FROM", "q"),
                   timeout=5, message="the copy to be queued on b")
    assert job[0][1] == job_id


def test_a_forgotten_node_does_not_hold_the_ack(make_cluster) -> None:
    """The original waited for the GOTACK of a node removed by CLUSTER FORGET,
    so the ACK (and the job) lived until its TTL."""
    a, b, c = make_cluster(3)
    job_id = a.client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 3)
    gone = node_id(c)
    c.kill()
    for node in (a, b):
        node.client().execute_command("CLUSTER", "FORGET", gone)
    assert a.client().execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: not holders([a, b], job_id), timeout=10,
             message="the GC to finish without the forgotten node")


def test_a_silent_target_is_replaced_by_another_node(make_cluster) -> None:
    """A node picked for a copy that never answers (paused, but still linked
    and not yet suspected) costs 50 ms: another node is asked then."""
    a, b, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)
    try:
        ids = [a.client().execute_command("ADDJOB", "q", f"j{i}", 5000, "REPLICATE", 2)
               for i in range(8)]
        for job_id in ids:
            assert show(b, job_id) is not None  # the copy the ADDJOB waited for
    finally:
        os.kill(c.pid, signal.SIGCONT)


def test_a_copy_lost_with_its_link_is_sent_again(make_cluster) -> None:
    """REPLICATE 3 on 3 nodes: no node left to add, so the REPLJOB lost when
    c died unread is re-sent (once a second) after c restarts."""
    a, b, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)
    results: list = []
    thread = _blocked_addjob(a, results)
    wait_for(lambda: a.client().execute_command("JSCAN", 0, "STATE", "wait-repl")[1],
             timeout=10, message="the job waiting for its copies")
    c.kill()  # the REPLJOB waiting in c's socket is gone with it
    c.restart()  # same node ID (nodes.conf): a rejoins it without a MEET
    thread.join(10)  # the re-send comes within a second of the new link
    assert not thread.is_alive() and len(results) == 1
    job_id = results[0]
    assert isinstance(job_id, bytes), job_id
    assert holders([a, b, c], job_id) == [a, b, c]


def _blocked_addjob(node: DisqueProcess, results: list) -> threading.Thread:
    def run() -> None:
        try:
            results.append(node.client().execute_command(
                "ADDJOB", "q", "x", 0, "REPLICATE", 3, "RETRY", 1))
        except redis.ResponseError as err:
            results.append(err)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_waiting_addjobs_are_answered_by_flushall_and_by_an_ack(make_cluster) -> None:
    a, b, c = make_cluster(3)
    for other in (b, c):
        os.kill(other.pid, signal.SIGSTOP)  # nobody confirms: the ADDJOBs wait
    try:
        results: list = []
        thread = _blocked_addjob(a, results)
        waiting = wait_for(lambda: a.client().execute_command("JSCAN", 0, "STATE", "wait-repl")[1],
                           timeout=10, message="the job waiting for its copies")
        # An ACK of the waiting job answers its ADDJOB with the ID.
        assert a.client().execute_command("ACKJOB", waiting[0]) == 1
        thread.join(10)
        assert results == [waiting[0]]
        # DEBUG FLUSHALL answers a waiting ADDJOB (it used to hang forever).
        thread = _blocked_addjob(a, results)
        wait_for(lambda: a.client().execute_command("JSCAN", 0, "STATE", "wait-repl")[1],
                 timeout=10, message="the second job waiting")
        assert a.client().execute_command("DEBUG", "FLUSHALL") == b"OK"
        thread.join(10)
        assert "NOREPL job removed" in str(results[1])
    finally:
        for other in (b, c):
            os.kill(other.pid, signal.SIGCONT)


def test_a_waiting_job_whose_ttl_passes_is_removed(make_cluster) -> None:
    """A job waiting for its copies is not in the awake schedule (the
    replication timer watches its expiry): with no ms-timeout (0, forever)
    and a TTL of 1 s, its ADDJOB still gets -NOREPL when the TTL passes, and
    the job is gone."""
    a, b, c = make_cluster(3)
    for other in (b, c):
        os.kill(other.pid, signal.SIGSTOP)  # nobody confirms
    try:
        started = time.monotonic()
        with pytest.raises(redis.ResponseError, match="NOREPL job removed"):
            a.client(socket_timeout=10).execute_command("ADDJOB", "q", "x", 0, "TTL", 1)
        assert 0.9 <= time.monotonic() - started < 5
        assert a.client().execute_command("JSCAN", 0, "COUNT", 1000)[1] == []
        assert a.client().info("stats")["expired_jobs"] == 1
    finally:
        for other in (b, c):
            os.kill(other.pid, signal.SIGCONT)


def test_a_leaving_node_only_passes_jobs_on(make_cluster) -> None:
    """The spec's graceful removal: ADDJOB replicates without a local copy,
    a GETJOB that would block gets -LEAVING, no dummy ACKs are made."""
    a, b, c = make_cluster(3)
    a.client().execute_command("CLUSTER", "LEAVING", "yes")
    job_id = a.client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 2)
    assert show(a, job_id) is None
    assert len(holders([b, c], job_id)) == 2
    queued = [n for n in (b, c) if show(n, job_id)[b"state"] == b"queued"]
    assert len(queued) == 1  # ENQUEUE went to exactly one of the copies
    with pytest.raises(redis.ResponseError, match="LEAVING"):
        a.client().execute_command("GETJOB", "TIMEOUT", 100, "FROM", "q")
    unknown = job_id[:-4] + (b"05a1" if not job_id.endswith(b"05a1") else b"05b1")
    assert a.client().execute_command("ACKJOB", unknown) == 0
    assert a.client().info("jobs")["registered_jobs"] == 0  # no dummy ACK kept
