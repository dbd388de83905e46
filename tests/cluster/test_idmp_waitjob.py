"""The extensions across nodes: WAITJOB learns of ACKs made elsewhere; IDMP with replication."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import redis

from tests.support.cluster import holders
from tests.support.process import DisqueProcess, wait_for


def wait_in_thread(node: DisqueProcess, job_id: bytes, out: list[object]) -> threading.Thread:
    def run() -> None:
        out.append(node.client().execute_command("WAITJOB", job_id, 15_000))

    thread = threading.Thread(target=run)
    thread.start()
    wait_for(lambda: node.client().info("extensions")["waitjob_clients"] == 1, 5,
             message="WAITJOB blocked")
    return thread


@pytest.mark.parametrize("ack", ["ACKJOB", "FASTACK"])
def test_waitjob_on_the_creator_sees_an_ack_made_on_another_node(make_cluster,
                                                                  ack: str) -> None:
    nodes = make_cluster(3)
    creator = nodes[0]
    job_id = creator.client().execute_command("ADDJOB", "q", "request", 5000, "REPLICATE", 3)
    assert len(holders(nodes, job_id)) == 3
    results: list[object] = []
    thread = wait_in_thread(creator, job_id, results)
    # A worker on another node acks: the creator learns of it through the
    # GC (SETACK) or FASTACK's DELJOB.
    assert nodes[2].client().execute_command(ack, job_id) == 1
    thread.join(10)
    assert results == [b"ACKED"]
    # Later WAITJOBs on any node that knew the job answer at once.
    wait_for(lambda: not holders(nodes, job_id), 10, message="the job to be collected")
    for node in nodes:
        assert node.client().execute_command("WAITJOB", job_id, 100) == b"ACKED"


def test_idmp_key_is_per_node(make_cluster) -> None:
    """The guarantee docs/EXTENSIONS.md states: the node that took the first
    ADDJOB answers its retries; another node does not know the key."""
    a, b = make_cluster(2)
    first = a.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 2,
                                       "IDMP", "k")
    assert a.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 2,
                                      "IDMP", "k") == first
    other = b.client().execute_command("ADDJOB", "q", "body", 5000, "REPLICATE", 2,
                                       "IDMP", "k")
    assert other != first
    assert b.client().info("extensions")["idmp_keys"] == 1


def test_key_of_a_replicating_addjob_is_busy_then_freed_by_norepl(make_cluster) -> None:
    a, b = make_cluster(2)
    results: list[object] = []

    def add() -> None:
        try:
            results.append(a.client().execute_command("ADDJOB", "q", "body", 1500,
                                                      "REPLICATE", 2, "IDMP", "k"))
        except redis.ResponseError as err:
            results.append(err)

    os.kill(b.proc.pid, signal.SIGSTOP)  # its copy is never confirmed
    try:
        thread = threading.Thread(target=add)
        thread.start()
        wait_for(lambda: a.client().info("clients")["blocked_clients"] == 1, 5,
                 message="the ADDJOB waiting for its copy")
        with pytest.raises(redis.ResponseError, match=r"^IDMPBUSY"):
            a.client().execute_command("ADDJOB", "q", "body", 1500, "REPLICATE", 2,
                                       "IDMP", "k")
        thread.join(10)
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    assert len(results) == 1 and str(results[0]).startswith("NOREPL")
    assert a.client().info("extensions")["idmp_keys"] == 0
    # -NOREPL: the job does not exist for the producer, so its retry adds it.
    job_id = wait_for(lambda: _add_or_none(a), 20, message="the retry to be replicated")
    assert job_id.startswith(b"D-") and len(holders([a, b], job_id)) == 2
    assert a.client().execute_command("ADDJOB", "q", "body", 1500, "REPLICATE", 2,
                                      "IDMP", "k") == job_id


def _add_or_none(node: DisqueProcess) -> bytes | None:
    try:
        return node.client().execute_command("ADDJOB", "q", "body", 1500, "REPLICATE", 2,
                                             "IDMP", "k")
    except redis.ResponseError:
        return None  # the resumed node may need a moment to be reachable again
