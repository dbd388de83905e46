"""Federation with real nodes: consumers on one node get the jobs queued
on others (NEEDJOBS / YOURJOBS), import statistics, a leaving node's jobs
handed out; and the import rule that no acked job is ever queued again."""

from __future__ import annotations

import time

from disque.cluster import messages
from disque.cluster.node import ClusterNode
from disque.federation import receive_yourjobs
from disque.job import serialize_job
from tests.server.statekit import Node
from tests.support.cluster import holders, node_id, show
from tests.support.process import wait_for


def test_a_blocked_consumer_gets_a_job_queued_on_another_node(make_cluster) -> None:
    a, b, c = make_cluster(3)
    job_id = b.client().execute_command("ADDJOB", "fq", "far away", 0, "REPLICATE", 1)
    started = time.monotonic()
    job = a.client().execute_command("GETJOB", "TIMEOUT", 5000, "FROM", "fq")
    latency_ms = (time.monotonic() - started) * 1000
    assert job == [[b"fq", job_id, b"far away"]]
    assert latency_ms < 2000, latency_ms  # the first broadcast goes out at once
    # The importer joined the job's node list, so the ACK's GC reaches it.
    assert set(show(a, job_id)[b"nodes-delivered"]) == {node_id(a).encode(),
                                                       node_id(b).encode()}
    assert a.client().execute_command("ACKJOB", job_id) == 1
    wait_for(lambda: not holders([a, b, c], job_id), timeout=10,
             message="the ACK to remove both copies")


def test_a_consumer_drains_another_nodes_queue_once_each(make_cluster) -> None:
    a, b = make_cluster(2)
    ids = {b.client().execute_command("ADDJOB", "fq", f"j{i}", 0, "REPLICATE", 1)
           for i in range(100)}
    delivered: list[bytes] = []
    consumer = a.client()
    while len(delivered) < len(ids):
        jobs = consumer.execute_command("GETJOB", "TIMEOUT", 5000, "COUNT", 20, "FROM", "fq")
        assert jobs, f"nothing more after {len(delivered)} jobs"
        delivered += [job[1] for job in jobs]
        consumer.execute_command("ACKJOB", *[job[1] for job in jobs])
    assert sorted(delivered) == sorted(ids)
    stats = consumer.execute_command("QSTAT", "fq")
    stats = dict(zip(stats[::2], stats[1::2], strict=True))
    assert stats[b"import-from"] == [node_id(b).encode()]
    assert stats[b"import-rate"] > 0 and stats[b"jobs-in"] == 100
    assert consumer.execute_command("QSCAN", "IMPORTRATE", 1)[1] == [b"fq"]
    wait_for(lambda: all(n.client().info("jobs")["registered_jobs"] == 0 for n in (a, b)),
             timeout=10, message="every acked job gone from both nodes")


def test_a_leaving_node_hands_its_jobs_out(make_cluster) -> None:
    a, b = make_cluster(2)
    ids = {a.client().execute_command("ADDJOB", "lq", f"j{i}", 0, "REPLICATE", 1)
           for i in range(20)}
    a.client().execute_command("CLUSTER", "LEAVING", "yes")
    delivered: set[bytes] = set()
    while len(delivered) < len(ids):
        jobs = b.client().execute_command("GETJOB", "TIMEOUT", 5000, "COUNT", 10, "FROM", "lq")
        assert jobs, f"nothing more after {len(delivered)} jobs"
        delivered.update(job[1] for job in jobs)
        b.client().execute_command("ACKJOB", *[job[1] for job in jobs])
    assert delivered == ids
    wait_for(lambda: a.client().info("jobs")["registered_jobs"] == 0, timeout=10,
             message="the leaving node to be empty")


def test_an_import_never_queues_an_acked_job_again() -> None:
    """The original's YOURJOBS queued a job this node had already acked
    (a bug of the original)."""
    node = Node()
    peer = ClusterNode("b" * 40, "127.0.0.1", 7712)
    node.state.cluster.nodes[peer.id] = peer
    job_id = str(node("ADDJOB", "q", "x", 0, "REPLICATE", 1)).encode()
    job = node.job(job_id)
    blob = serialize_job(job, bus_now_ms=node.clock.now_ms())
    node.state.jobs.get(job_id).delivered = frozenset((node.state.cluster.myself_id, peer.id))
    node("ACKJOB", job_id)  # held: the peer has not confirmed
    assert node.job(job_id).state.label == "acked"
    yourjobs = messages.decode(messages.jobs_message(messages.YOURJOBS, peer.id, 7712, 0,
                                                     [blob]))
    receive_yourjobs(node.state, peer, yourjobs)
    assert node.job(job_id).state.label == "acked"
    assert node("QLEN", "q") == 0


def test_big_jobs_travel_in_several_yourjobs(make_cluster) -> None:
    """YOURJOBS carries at most 16 MB of jobs: six 5 MB jobs take several."""
    a, b = make_cluster(2)
    body = b"x" * (5 * 1024 * 1024)
    ids = {b.client().execute_command("ADDJOB", "big", body, 0, "REPLICATE", 1)
           for _ in range(6)}
    got: set[bytes] = set()
    while len(got) < len(ids):
        jobs = a.client().execute_command("GETJOB", "TIMEOUT", 10000, "COUNT", 10, "FROM", "big")
        assert jobs, f"nothing more after {len(got)} jobs"
        assert all(job[2] == body for job in jobs)
        got.update(job[1] for job in jobs)
    assert got == ids


def test_an_import_restarts_the_senders_requeue_clock(make_cluster) -> None:
    """The node that sends a job away (YOURJOBS) keeps its copy, due again at
    the time it had; the importer queues the job with a fresh RETRY.  Unless
    the importer tells it (a QUEUED that counts nothing), the sender queues
    the job again while a consumer of the importer still holds it, as soon
    as the time the job waited on the sender has passed."""
    a, b = make_cluster(2)
    job_id = b.client().execute_command("ADDJOB", "fq", "x", 0, "RETRY", 30, "REPLICATE", 1)
    wait_for(lambda: show(b, job_id)[b"next-requeue-within"] < 27_500, timeout=10,
             message="the job to wait 2.5 s on the node that has it")
    [entry] = a.client().execute_command("GETJOB", "TIMEOUT", 5000, "WITHLEASE", "FROM", "fq")
    assert entry[1] == job_id and entry[4] > 29_000  # the importer's own fresh RETRY
    wait_for(lambda: show(b, job_id)[b"next-requeue-within"] > 28_000, timeout=5,
             message="the sender's requeue time to restart with the import")
    shown = show(b, job_id)
    assert shown[b"state"] == b"active" and shown[b"additional-deliveries"] == 0
    assert show(a, job_id)[b"additional-deliveries"] == 0
