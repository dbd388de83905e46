"""NACK ... DELAY and dead letters across real nodes (docs/EXTENSIONS.md): the
options travel with the copies, the move happens once cluster-wide, and a
delayed NACK holds every copy."""

from __future__ import annotations

import time

import pytest

from tests.support.cluster import (
    TEST_NODE_TIMEOUT_MS,
    ReferenceProcess,
    meet,
    reference_server,
    show,
    wait_joined,
)
from tests.support.process import DisqueProcess, wait_for


def total(nodes: list[DisqueProcess], *args: object) -> int:
    return sum(node.client().execute_command(*args) for node in nodes)


def info_stat(node: DisqueProcess, field: str) -> int:
    return int(node.client().info("stats")[field])


def take(nodes: list[DisqueProcess], queue: str, job_id: bytes,
         timeout: float = 15) -> DisqueProcess:
    """GETJOB the job from whichever node has it queued (NOHANG polls, every
    node); the node that delivered it."""
    def got() -> DisqueProcess | None:
        for node in nodes:
            jobs = node.client().execute_command("GETJOB", "NOHANG", "FROM", queue)
            if jobs:
                assert jobs[0][1] == job_id
                return node
        return None
    return wait_for(got, timeout=timeout, interval=0.05, message=f"the job queued in {queue}")


def test_dead_letter_moves_every_copy_once(make_cluster) -> None:
    nodes = make_cluster(3)
    job_id = nodes[0].client().execute_command("ADDJOB", "q", "poison", 5000, "REPLICATE", 3,
                                               "RETRY", 1, "MAXDELIVERIES", 2)
    for node in nodes:  # the options travelled with every copy
        info = show(node, job_id)
        assert (info[b"max-deliveries"], info[b"dead-letter-queue"]) == (2, b"q:dead")
    take(nodes, "q", job_id)
    take(nodes, "q", job_id)  # requeued by some copy after RETRY: the 2nd delivery
    # Not acked again: the next re-queue moves it, on one node, for every copy.
    wait_for(lambda: all(show(n, job_id)[b"queue"] == b"q:dead" for n in nodes), timeout=15,
             message="every copy to learn the move")
    assert all(show(n, job_id)[b"dead-lettered-from"] == b"q" for n in nodes)
    assert sum(info_stat(n, "dead_lettered_jobs") for n in nodes) == 1
    wait_for(lambda: total(nodes, "QLEN", "q:dead") == 1, timeout=10,
             message="the dead letter queued on one node")
    assert total(nodes, "QLEN", "q") == 0
    started = time.monotonic()

    def three_retry_periods_without_a_requeue_in_q() -> bool:
        assert total(nodes, "QLEN", "q") == 0
        assert total(nodes, "QLEN", "q:dead") <= 1
        return time.monotonic() - started > 3.5

    # No copy re-queues it in q, none moves it again, whatever RETRY does.
    wait_for(three_retry_periods_without_a_requeue_in_q, timeout=30, interval=0.2,
             message="three RETRY periods")
    assert sum(info_stat(n, "dead_lettered_jobs") for n in nodes) == 1
    take(nodes, "q:dead", job_id)
    assert nodes[2].client().execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: not any(show(n, job_id) for n in nodes), timeout=15,
             message="the ACK to remove every copy")


def test_nack_delay_holds_every_copy(make_cluster) -> None:
    nodes = make_cluster(2)
    job_id = nodes[0].client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 2,
                                               "RETRY", 2)
    consumer = take(nodes, "q", job_id)
    nacked_at = time.monotonic()
    assert consumer.client().execute_command("NACK", job_id, "DELAY", 6) == 1
    # The other copy was told (WORKING with the delay): it waits delay + RETRY.
    wait_for(lambda: all((show(n, job_id)[b"next-requeue-within"] or 0) > 5000 for n in nodes),
             timeout=5, message="both copies to hold the job for the delay")
    wait_for(lambda: total(nodes, "QLEN", "q") == 1, timeout=15, message="the delayed requeue")
    assert time.monotonic() - nacked_at >= 5.5  # nobody queued it before the delay (+-0.25)
    wait_for(lambda: [show(n, job_id)[b"nacks"] for n in nodes] == [1, 1], timeout=5,
             message="both copies to count the NACK once")
    assert [show(n, job_id)[b"additional-deliveries"] for n in nodes] == [0, 0]


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_an_original_node_keeps_a_plain_copy(server_factory, tmp_path) -> None:
    ours = server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
    original = ReferenceProcess(tmp_path / "ref", "--cluster-node-timeout",
                                str(TEST_NODE_TIMEOUT_MS)).start()
    try:
        meet(ours, original)
        wait_joined([ours, original])
        # Synchronous replication completes: the original stores the job
        # and answers GOTJOB although the REPLJOB carries the trailer.
        job_id = ours.client().execute_command("ADDJOB", "q", "x", 5000, "REPLICATE", 2,
                                               "RETRY", 1, "MAXDELIVERIES", 1)
        copy = show(original, job_id)
        assert (copy[b"queue"], copy[b"body"], copy[b"retry"]) == (b"q", b"x", 1)
        assert b"max-deliveries" not in copy  # a plain job there
        assert ours.client().execute_command("GETJOB", "FROM", "q")[0][1] == job_id
        assert ours.client().execute_command("NACK", job_id) == 1  # the limit: moved here
        assert show(ours, job_id)[b"queue"] == b"q:dead"
        # The original ignored the move, counted the NACK (QUEUED) and postponed.
        wait_for(lambda: show(original, job_id)[b"nacks"] == 1, timeout=5,
                 message="the original to count the NACK")
        assert show(original, job_id)[b"queue"] == b"q"
        assert ours.client().execute_command("ACKJOB", job_id) == 1
        wait_for(lambda: show(original, job_id) is None and show(ours, job_id) is None,
                 timeout=20, message="the ACK to reach the original")
    finally:
        original.kill()
