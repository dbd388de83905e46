"""The drain on SIGTERM (disque/drain.py), with real nodes.

A node stopped by its orchestrator leaves the cluster for the time of its
restart: its queued jobs go to the other nodes, its blocked consumers are
told -LEAVING, it exits 0 once done (or at shutdown-timeout, or at a second
signal) with its AOF on disk, and it comes back not leaving.  The rolling
restart at the end runs all of it under load.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from dataclasses import dataclass, field

import pytest
import redis

from disque.client import Client
from disque.exceptions import DisqueError
from tests.support.cluster import (
    flags_of,
    hello_priorities,
    node_id,
    wait_joined,
)
from tests.support.process import DisqueProcess, wait_for


def qlen(node: DisqueProcess, queue: str) -> int:
    return node.client().execute_command("QLEN", queue)


def terminate(node: DisqueProcess, timeout: float = 30) -> tuple[int, float]:
    """SIGTERM and wait: (exit status, seconds it took)."""
    assert node.proc is not None
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    status = node.proc.wait(timeout)
    return status, time.monotonic() - started


def test_a_lone_node_persists_and_exits(server_factory) -> None:
    node = server_factory("--appendonly", "yes")
    r = node.client()
    ids = [r.execute_command("ADDJOB", "q", f"job{i}", 0) for i in range(50)]
    status, _ = terminate(node)
    assert status == 0
    assert "Drain: drained in" in node.log_text() and "0 jobs handed over" in node.log_text()
    node.start(port=node.port)
    r = node.client()
    assert all(r.execute_command("SHOW", i) is not None for i in ids)


def test_queued_jobs_move_to_the_other_nodes(make_cluster) -> None:
    a, b, c = make_cluster(3, "--appendonly", "yes")
    ra = a.client()
    # REPLICATE 1: the only copy is on a; 300 jobs to spread.
    ids = [ra.execute_command("ADDJOB", "work", f"j{i}", 0, "REPLICATE", 1, "RETRY", 300)
           for i in range(300)]
    assert qlen(a, "work") == 300
    a_id = node_id(a)
    status, _ = terminate(a)
    assert status == 0
    assert "300 jobs handed over" in a.log_text()
    # Queued on b and c now, long before RETRY (300 s) would bring them back.
    assert qlen(b, "work") + qlen(c, "work") == 300
    assert qlen(b, "work") > 0 and qlen(c, "work") > 0  # spread over both
    got = set()
    for node in (b, c):
        r = node.client()
        while True:
            reply = r.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "work")
            if not reply:
                break
            for _queue, job_id, _body in reply:
                got.add(job_id)
                r.execute_command("ACKJOB", job_id)
    assert got == set(ids)
    # The others know a left (for the time of its restart)...
    for node in (b, c):
        assert hello_priorities(node)[a_id] == 100
    # ... and it comes back by itself, not leaving, and they see it so.
    assert "leaving" not in (a.workdir / "nodes.conf").read_text()
    a.start(port=a.port)
    assert a.client().execute_command("CLUSTER", "LEAVING") == b"no"
    for node in (b, c):
        wait_for(lambda node=node: "leaving" not in flags_of(node, a_id), timeout=10,
                 message="the others to see a back, not leaving")
    wait_joined([a, b, c])


def test_blocked_consumers_get_leaving_and_writes_go_elsewhere(make_cluster) -> None:
    a, b = make_cluster(2, "--appendonly", "yes")
    blocked = a.client(socket_timeout=30)
    outcome: list[object] = []

    def consume() -> None:
        try:
            outcome.append(blocked.execute_command("GETJOB", "TIMEOUT", 20000, "FROM", "idle"))
        except redis.ResponseError as err:
            outcome.append(err)

    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: a.client().info()["blocked_clients"] == 1, message="GETJOB to block")
    status, _ = terminate(a)
    thread.join(10)
    assert status == 0
    assert len(outcome) == 1 and isinstance(outcome[0], redis.ResponseError)
    assert str(outcome[0]).startswith("LEAVING")
    # The client moves on: b takes its writes.
    with Client([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"]) as client:
        job = client.add_job("after", b"x", replicate=1)
        assert client.show(job) is not None
    assert qlen(b, "after") == 1


def test_a_queue_paused_for_output_stays(make_cluster) -> None:
    a, b = make_cluster(2, "--appendonly", "yes")
    ra = a.client()
    ids = [ra.execute_command("ADDJOB", "held", f"j{i}", 0, "REPLICATE", 1, "RETRY", 300)
           for i in range(20)]
    assert ra.execute_command("PAUSE", "held", "out") is not None
    status, _ = terminate(a)
    assert status == 0
    assert qlen(b, "held") == 0  # the pause says its jobs must not leave
    a.start(port=a.port)
    assert all(a.client().execute_command("SHOW", job_id) is not None for job_id in ids)


def test_an_operators_leaving_survives_the_restart(make_cluster) -> None:
    a, _ = make_cluster(2)
    assert a.client().execute_command("CLUSTER", "LEAVING", "yes") == b"OK"
    status, _ = terminate(a)
    assert status == 0
    a.start(port=a.port)
    assert a.client().execute_command("CLUSTER", "LEAVING") == b"yes"


def _addjob_waiting_for_a_copy(a: DisqueProcess, b: DisqueProcess) -> threading.Thread:
    """An ADDJOB on a that cannot get its second copy: b is stopped (SIGSTOP);
    the long node timeout keeps it from being flagged, so the ADDJOB waits."""
    assert b.proc is not None
    b.proc.send_signal(signal.SIGSTOP)
    waiting = a.client(socket_timeout=60)
    thread = threading.Thread(target=lambda: _swallow(lambda: waiting.execute_command(
        "ADDJOB", "q", "x", 50000, "REPLICATE", 2)))
    thread.start()
    wait_for(lambda: a.client().info()["blocked_clients"] == 1, message="ADDJOB to wait")
    return thread


def test_the_drain_stops_at_shutdown_timeout(make_cluster) -> None:
    a, b = make_cluster(2, "--appendonly", "yes", "--shutdown-timeout", "2",
                        node_timeout=60_000)
    thread = _addjob_waiting_for_a_copy(a, b)
    try:
        status, took = terminate(a)
    finally:
        b.proc.send_signal(signal.SIGCONT)
    thread.join(10)
    assert status == 0
    assert 1.5 < took < 10, took  # the drain waited for the ADDJOB, up to its timeout
    assert "shutdown-timeout (2 s) reached with 0 queued jobs not handed over and 1 " \
           "ADDJOBs waiting" in a.log_text()


def test_a_second_signal_stops_the_drain_at_once(make_cluster) -> None:
    a, b = make_cluster(2, "--appendonly", "yes", "--shutdown-timeout", "60",
                        node_timeout=60_000)
    thread = _addjob_waiting_for_a_copy(a, b)
    assert a.proc is not None
    try:
        a.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "Draining before shutdown" in a.log_text(), message="the drain")
        started = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        status = a.proc.wait(20)
        took = time.monotonic() - started
    finally:
        b.proc.send_signal(signal.SIGCONT)
    thread.join(10)
    assert status == 0
    assert took < 5, took
    assert "stopping now, as asked again" in a.log_text()


def test_shutdown_timeout_zero_stops_at_once(make_cluster) -> None:
    a, b = make_cluster(2, "--shutdown-timeout", "0")
    a.client().execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 1)
    status, _ = terminate(a)
    assert status == 0
    assert "Draining" not in a.log_text()
    assert qlen(b, "q") == 0  # not handed over: no drain


def _swallow(call) -> None:
    try:
        call()
    except (redis.RedisError, OSError):
        pass


# --------------------------------------------------------------------------
# A rolling restart under load
# --------------------------------------------------------------------------

#: Jobs added and not yet acked, at most (the producers wait above it).
MAX_BACKLOG = 1000


@dataclass
class Ledger:
    """What producers and consumers saw, for the checks at the end."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    added: dict[str, float] = field(default_factory=dict)  # ID -> when ADDJOB returned
    added_by: dict[int, int] = field(default_factory=dict)  # REPLICATE -> jobs added
    acked: dict[str, float] = field(default_factory=dict)  # ID -> when ACKJOB returned
    #: (ID, when the GETJOB that delivered it was sent)
    deliveries: list[tuple[str, float]] = field(default_factory=list)
    producer_errors: list[str] = field(default_factory=list)
    #: Errors of the REPLICATE 3 producer: reported, expected while a node is down.
    replicate3_errors: list[str] = field(default_factory=list)
    consumer_errors: list[str] = field(default_factory=list)


def _produce(addresses: list[str], queue: str, replicate: int, ledger: Ledger,
             stop: threading.Event, name: str) -> None:
    with Client(addresses, client_name=name, reconnect_timeout=20) as client:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                job_id = client.add_job(queue, f"{name}-{n}".encode(), replicate=replicate,
                                        retry=10, timeout_ms=10_000)
            except (DisqueError, redis.RedisError, OSError) as err:
                errors = ledger.producer_errors if replicate < 3 else ledger.replicate3_errors
                with ledger.lock:
                    errors.append(f"{type(err).__name__}: {err}")
            else:
                with ledger.lock:
                    ledger.added[job_id] = time.monotonic()
                    ledger.added_by[replicate] = ledger.added_by.get(replicate, 0) + 1
            time.sleep(0.002)  # a steady rate rather than a saturating one
            # A bounded backlog: a job waits well under its RETRY in a queue,
            # so no copy queues it a second time (at least once, but not here).
            while len(ledger.added) - len(ledger.acked) > MAX_BACKLOG and not stop.is_set():
                time.sleep(0.01)


def _consume(addresses: list[str], queue: str, ledger: Ledger, stop: threading.Event,
             name: str, pace: list[float]) -> None:
    with Client(addresses, client_name=name, reconnect_timeout=20) as client:
        while not stop.is_set():
            asked = time.monotonic()
            try:
                jobs = client.get_jobs(queue, count=10, timeout_ms=200)
                for job in jobs:
                    with ledger.lock:
                        ledger.deliveries.append((job.id, asked))
                    client.ack(job.id)
                    with ledger.lock:
                        ledger.acked.setdefault(job.id, time.monotonic())
                # Slower than the producers while they run, so that the nodes
                # have queued jobs to hand over when they drain.
                time.sleep(pace[0])
            except (DisqueError, redis.RedisError, OSError) as err:
                with ledger.lock:
                    ledger.consumer_errors.append(f"{type(err).__name__}: {err}")


@pytest.mark.slow
def test_rolling_restart_under_load_loses_nothing(make_cluster, record_property) -> None:
    """Each of three nodes in turn: SIGTERM (the drain), exit 0, start again,
    rejoin, 2 s of load; two REPLICATE 2 producers and one REPLICATE 3
    producer, two consumers slower than them (a backlog builds, the drains
    hand it over), then everything consumed."""
    nodes = make_cluster(3, "--appendonly", "yes")
    addresses = [f"127.0.0.1:{n.port}" for n in nodes]
    ledger = Ledger()
    pace = [0.05]
    stop_producers, stop_consumers = threading.Event(), threading.Event()
    producers = [threading.Thread(target=_produce, args=(addresses, "roll", replicate, ledger,
                                                         stop_producers, f"producer{i}"))
                 for i, replicate in enumerate((2, 2, 3))]
    consumers = [threading.Thread(target=_consume, args=(addresses, "roll", ledger,
                                                         stop_consumers, f"consumer{i}", pace))
                 for i in range(2)]
    for thread in producers + consumers:
        thread.start()
    drains: list[float] = []
    t0 = time.monotonic()
    try:
        wait_for(lambda: len(ledger.acked) > 200, timeout=30, message="steady load")
        for node in nodes:
            print(f"SIGTERM to {node.port} at {time.monotonic() - t0:.3f} s")
            status, took = terminate(node)
            assert status == 0, node.log_text()
            drains.append(took)
            node.start(port=node.port)
            wait_joined(nodes, timeout=30)
            time.sleep(2)  # the load goes on, on the whole cluster, before the next one
    finally:
        stop_producers.set()
        for thread in producers:
            thread.join(60)
    pace[0] = 0
    try:
        # Every job that got an ID is consumed and acked (RETRY is 10 s: a job
        # whose copy had to come back by itself takes that long).
        wait_for(lambda: set(ledger.added) <= set(ledger.acked), timeout=90,
                 message=lambda: f"{len(set(ledger.added) - set(ledger.acked))} jobs to be "
                                 "acked")
    finally:
        stop_consumers.set()
        for thread in consumers:
            thread.join(60)
    lost = set(ledger.added) - set(ledger.acked)
    after_ack = [(job_id, f"asked {asked - ledger.acked[job_id]:.3f} s after its ACK, "
                          f"added at {ledger.added.get(job_id, 0) - t0:.3f} s")
                 for job_id, asked in ledger.deliveries
                 if job_id in ledger.acked and asked > ledger.acked[job_id]]
    duplicates = len(ledger.deliveries) - len({job_id for job_id, _ in ledger.deliveries})
    handed = [re.findall(r"Drain: drained in [\d.]+ s: (\d+) jobs handed over", n.log_text())
              for n in nodes]
    summary = (f"{len(ledger.added)} jobs added, {len(ledger.acked)} acked, {len(lost)} lost, "
               f"{len(after_ack)} delivered after their ACK, {duplicates} delivered again "
               f"before their ACK (at least once); producer errors: REPLICATE 2 "
               f"{len(ledger.producer_errors)} (of {ledger.added_by.get(2, 0)} added), REPLICATE 3 "
               f"{len(ledger.replicate3_errors)} (of {ledger.added_by.get(3, 0)} added, "
               f"{sorted(set(e.split(':')[0] for e in ledger.replicate3_errors))}); "
               f"consumer errors {len(ledger.consumer_errors)}; drains "
               f"{', '.join(f'{d:.2f} s' for d in drains)}, jobs handed over "
               f"{', '.join(h[-1] if h else '?' for h in handed)}")
    print(summary)
    record_property("rolling_restart", summary)
    assert not lost, summary
    assert not after_ack, (summary, after_ack[:5])
    # REPLICATE 2 on three nodes: two are always up, the clients move on.
    assert not ledger.producer_errors, (summary, ledger.producer_errors[:5])
    assert all(h for h in handed), summary  # every node drained (not timed out)
