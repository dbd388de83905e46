"""Federation's push with real nodes (disque/federation.py): a node that
asked for jobs (NEEDJOBS) and was not answered is remembered, and the jobs
queued later on the other nodes come to its consumers at once (YOURJOBS);
an asker whose consumers left is forgotten; local consumers come first; a
paused queue pushes nothing; and a backlog still moves in batches.

The timing asserted is generous (a cron-tick-sized delay would fail it, the
machine's load would not): the benchmark carries the real figure
(``python3 -m benchmarks.run latency --case "3 nodes"``).
"""

from __future__ import annotations

import random
import statistics
import threading
import time

from tests.server.test_protocol_raw import Resp, pack
from tests.support.cluster import cluster_info
from tests.support.process import DisqueProcess, wait_for

FEDERATION = ("cluster_stats_needjobs_sent", "cluster_stats_yourjobs_sent",
              "cluster_stats_yourjobs_pushed", "cluster_stats_jobs_exported",
              "cluster_federation_asks")


def federation(node: DisqueProcess) -> dict[str, int]:
    """The node's federation counters (CLUSTER INFO)."""
    info = cluster_info(node)
    return {name: int(info[name]) for name in FEDERATION}


def blocked(node: DisqueProcess) -> int:
    return int(node.client().info("clients")["blocked_clients"])


def test_a_consumer_blocked_on_one_node_gets_jobs_added_on_the_others_at_once(
        make_cluster) -> None:
    a, b, c = make_cluster(3)
    producers = {a.port: a.client(), c.port: c.client()}
    choose = random.Random(54)
    pickups_ms: list[float] = []
    with Resp(b.port) as consumer:
        for number in range(21):
            consumer.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "pushed"))
            wait_for(lambda: blocked(b) == 1, timeout=10, message="the consumer to block")
            producer = producers[choose.choice(list(producers))]
            started = time.perf_counter()
            job_id = producer.execute_command("ADDJOB", "pushed", f"j{number}", 0,
                                              "REPLICATE", 1)
            reply = consumer.read()
            elapsed_ms = (time.perf_counter() - started) * 1000
            assert reply and reply[0][1] == job_id, reply
            if number:  # the first one may meet the consumer's first NEEDJOBS on its way
                pickups_ms.append(elapsed_ms)
    # A cron tick is 100 ms: polling would make the median about half of it.
    assert statistics.median(pickups_ms) < 50, sorted(pickups_ms)
    pushed = federation(a)["cluster_stats_yourjobs_pushed"] + \
        federation(c)["cluster_stats_yourjobs_pushed"]
    assert pushed >= 10, (federation(a), federation(c))


def test_nodes_whose_consumers_wait_take_turns(make_cluster) -> None:
    a, b, c = make_cluster(3)
    producer = a.client()
    got = {b.port: 0, c.port: 0}
    with Resp(b.port) as on_b, Resp(c.port) as on_c:
        consumers = {b.port: on_b, c.port: on_c}
        for consumer in consumers.values():
            consumer.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "turns"))
        for number in range(10):
            wait_for(lambda: blocked(b) == 1 and blocked(c) == 1 and
                     federation(a)["cluster_federation_asks"] == 2, timeout=10,
                     message="both consumers to block and ask")
            producer.execute_command("ADDJOB", "turns", f"j{number}", 0, "REPLICATE", 1)
            # Whichever took it answers; the other still waits.
            port = wait_for(lambda: next((p for p, n in ((b.port, b), (c.port, c))
                                          if blocked(n) == 0), None),
                            timeout=10, message="a consumer to get the job")
            assert consumers[port].read()[0][2] == f"j{number}".encode()
            got[port] += 1
            consumers[port].send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "turns"))
    assert got == {b.port: 5, c.port: 5}, got


def test_an_asker_whose_consumers_left_is_not_pushed_to(make_cluster) -> None:
    """A node whose consumers stop waiting withdraws its asks (NEEDJOBS(0)),
    at most once a second per queue; an ask not withdrawn is forgotten after
    3 s.  Either way a job added then stays where it is."""
    a, b = make_cluster(2)
    pa, cb = a.client(), b.client()
    # Withdrawn: the consumer times out, the producer forgets its ask at once.
    assert cb.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "gone") is None
    wait_for(lambda: federation(a)["cluster_federation_asks"] == 0, timeout=5,
             message="the withdrawn ask to be forgotten")
    pa.execute_command("ADDJOB", "gone", "stays", 0, "REPLICATE", 1)
    assert pa.execute_command("QLEN", "gone") == 1  # a push would have taken it already
    # Not withdrawn: a second wait on a queue ends within a second of the
    # first withdrawal.  The ask stays, then expires.
    assert cb.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "stale") is None
    assert cb.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "stale") is None
    assert federation(a)["cluster_federation_asks"] == 1, federation(a)
    wait_for(lambda: federation(a)["cluster_federation_asks"] == 0, timeout=10,
             message="the stale ask to expire")
    pushed = federation(a)["cluster_stats_yourjobs_pushed"]
    pa.execute_command("ADDJOB", "stale", "stays too", 0, "REPLICATE", 1)
    assert pa.execute_command("QLEN", "stale") == 1
    assert cb.execute_command("QLEN", "stale") == 0
    assert federation(a)["cluster_stats_yourjobs_pushed"] == pushed
    # A consumer that comes back asks again, and gets the jobs (pulled).
    got = cb.execute_command("GETJOB", "TIMEOUT", 10_000, "COUNT", 2, "FROM", "gone", "stale")
    assert got and got[0][2] in (b"stays", b"stays too"), got


def test_local_consumers_come_first_and_a_paused_queue_pushes_nothing(make_cluster) -> None:
    a, b = make_cluster(2)
    pa = a.client()
    with Resp(a.port) as local, Resp(b.port) as remote:
        remote.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "lq"))
        local.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "lq"))
        wait_for(lambda: blocked(a) == 1 and blocked(b) == 1 and
                 federation(a)["cluster_federation_asks"] == 1, timeout=10,
                 message="both consumers to block, the remote one's ask to arrive")
        job_id = pa.execute_command("ADDJOB", "lq", "mine", 0, "REPLICATE", 1)
        assert local.read()[0][1] == job_id
        # The remote consumer still waits; its queue paused for output here
        # keeps the next job until the pause is lifted.
        assert pa.execute_command("PAUSE", "lq", "out") == b"out"
        pa.execute_command("ADDJOB", "lq", "held", 0, "REPLICATE", 1)
        assert pa.execute_command("QLEN", "lq") == 1
        assert blocked(b) == 1
        assert pa.execute_command("PAUSE", "lq", "none") == b"none"
        assert remote.read()[0][2] == b"held"
    assert pa.execute_command("QLEN", "lq") == 0


def test_a_backlog_moves_in_batches(make_cluster) -> None:
    """Consumers on two nodes drain what a producer adds on a third in
    pipelines: a few NEEDJOBS and YOURJOBS carry every job."""
    a, b, c = make_cluster(3)
    jobs = 2000
    taken: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def consume(node: DisqueProcess) -> None:
        client = node.client()
        while not stop.is_set():
            got = client.execute_command("GETJOB", "TIMEOUT", 500, "COUNT", 10, "FROM", "bq")
            if got:
                client.execute_command("ACKJOB", *[job[1] for job in got])
                with lock:
                    taken.extend(job[1] for job in got)

    threads = [threading.Thread(target=consume, args=(node,)) for node in (b, c, b, c)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: blocked(b) + blocked(c) == 4, timeout=10,
                 message="every consumer to block")
        before = [federation(n) for n in (a, b, c)]
        producer = a.client()
        added = set()
        for start in range(0, jobs, 50):
            pipe = producer.pipeline(transaction=False)
            for number in range(start, start + 50):
                pipe.execute_command("ADDJOB", "bq", f"j{number}", 0, "REPLICATE", 1)
            added.update(pipe.execute())
        wait_for(lambda: len(taken) >= jobs, timeout=60,
                 message=lambda: f"every job taken ({len(taken)} of {jobs})")
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    after = [federation(n) for n in (a, b, c)]
    assert sorted(taken) == sorted(added)  # each once
    messages = sum(x[k] - y[k] for x, y in zip(after, before, strict=True)
                   for k in ("cluster_stats_needjobs_sent", "cluster_stats_yourjobs_sent"))
    assert messages / jobs < 0.5, (messages, after)
    assert after[0]["cluster_stats_jobs_exported"] - before[0]["cluster_stats_jobs_exported"] \
        == jobs
