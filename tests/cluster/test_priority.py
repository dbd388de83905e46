"""Priorities across real nodes (docs/EXTENSIONS.md, "Priorities"): the
priority travels with every copy, a copy re-queued elsewhere keeps it,
federation hands the highest priorities over first, and an original node
in the cluster keeps a plain copy that it serves in creation order."""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import reference_server, show, with_original
from tests.support.process import DisqueProcess, wait_for


def bodies(entries: list | None) -> list[bytes]:
    return [entry[2] for entry in entries or []]


def test_copies_keep_the_priority_where_they_are_queued_again(make_cluster) -> None:
    nodes = make_cluster(3)
    a = nodes[0].client()
    job_id = a.execute_command("ADDJOB", "q", "urgent", 5000, "REPLICATE", 3, "RETRY", 1,
                               "PRIORITY", 9)
    for node in nodes:
        assert show(node, job_id)[b"priority"] == 9
    assert a.execute_command("GETJOB", "FROM", "q")[0][1] == job_id  # delivered, not acked
    # Older plain jobs wait on every node; whichever node queues the job
    # again after RETRY must hand it out before them.
    for i, node in enumerate(nodes):
        node.client().execute_command("ADDJOB", "q", f"plain-{i}", 0, "REPLICATE", 1)

    def requeued_at() -> DisqueProcess | None:
        for node in nodes:
            if job_id in [e[1] for e in node.client().execute_command("QPEEK", "q", 10)]:
                return node
        return None

    node = wait_for(requeued_at, timeout=15, message="a copy to be queued again")
    assert node.client().execute_command("GETJOB", "FROM", "q")[0][1] == job_id
    assert node.client().execute_command("ACKJOB", job_id) == 1


def test_federation_moves_the_highest_priorities_first(make_cluster) -> None:
    producer, consumer, _ = make_cluster(3)
    p = producer.client()
    for i in range(6):  # older, plain: without priorities these would travel first
        p.execute_command("ADDJOB", "fq", f"plain-{i}", 0, "REPLICATE", 1)
    for i in range(2):
        p.execute_command("ADDJOB", "fq", f"urgent-{i}", 0, "REPLICATE", 1, "PRIORITY", 20)
    # A consumer on a node without jobs: it asks the others (NEEDJOBS); the
    # producer answers with the jobs it would hand out first.
    c = consumer.client()
    got = bodies(c.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", "fq"))
    assert got == [b"urgent-0"]
    imported = wait_for(lambda: bodies(c.execute_command("GETJOB", "TIMEOUT", 10_000,
                                                          "FROM", "fq")),
                        timeout=15, message="a second imported job")
    assert imported == [b"urgent-1"]
    # The urgent job left the producer's queue; the plain ones are still there,
    # or imported after the urgent ones.
    assert b"urgent" not in b" ".join(bodies(p.execute_command("QPEEK", "fq", 10)))


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_an_original_node_keeps_a_plain_copy_in_creation_order(server_factory,
                                                               tmp_path) -> None:
    with with_original(server_factory, tmp_path) as ((ours, other), original):
        o = original.client()
        older = o.execute_command("ADDJOB", "q", "older", 0, "REPLICATE", 1)
        # Both nodes make ctime = ms x 10**6 (+ a per-node counter): a job
        # made in the same millisecond on another node may sort either way.
        older_ms = int(show(original, older)[b"ctime"]) // 10**6
        wait_for(lambda: time.time_ns() // 10**6 > older_ms + 1, timeout=5,
                 message="a millisecond after the older job's")
        # Synchronous replication completes: the original stores the job from
        # a REPLJOB that carries the priority in its trailer.
        urgent = ours.client().execute_command("ADDJOB", "q", "urgent", 5000, "REPLICATE", 3,
                                               "RETRY", 60, "PRIORITY", 7)
        assert show(ours, urgent)[b"priority"] == 7
        assert show(other, urgent)[b"priority"] == 7
        copy = show(original, urgent)
        assert (copy[b"queue"], copy[b"body"]) == (b"q", b"urgent")
        assert b"priority" not in copy  # a plain job there
        # Ours serves it first; the original, once it queues its copy, in
        # creation order, after its older job.
        assert [e[1] for e in ours.client().execute_command("QPEEK", "q", 5)] == [urgent]
        # Taken off our queue first: a copy that holds the job queued and
        # outranks the original would answer its QUEUED, and the original
        # would step aside (one queued copy is what the cluster keeps).
        assert ours.client().execute_command("DEQUEUE", urgent) == 1
        assert o.execute_command("ENQUEUE", urgent) == 1
        assert [e[1] for e in o.execute_command("QPEEK", "q", 5)] == [older, urgent]
        assert ours.client().execute_command("ACKJOB", urgent) == 1
        wait_for(lambda: show(original, urgent) is None and show(other, urgent) is None,
                 timeout=20, message="the ACK to reach every copy")
