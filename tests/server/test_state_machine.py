"""Unit tests of the time-driven state machine (process_job) with a manual clock."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from disque.ack import gc_retry_delay_ms
from disque.cluster import ClusterNode
from disque.commands import execute
from disque.commands.registry import BLOCKED
from disque.job import JobState, ttl_minutes_from_id
from disque.job_table import JOB_OVERHEAD_BYTES
from disque.memory import STARTUP_BYTES
from disque.protocol import NULL_ARRAY, ReplyError
from disque.queue_table import QUEUE_ENTRY_BYTES

from .statekit import LocalClient, Node


def test_delay_then_queue_without_counting_a_delivery() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "body", 0, "DELAY", 5).encode()
    assert node("QLEN", "q") == 0
    assert node.job(job_id).state == JobState.ACTIVE
    node.advance(4_999)
    assert node("QLEN", "q") == 0
    node.advance(1)
    assert node("QLEN", "q") == 1
    assert node.job(job_id).additional_deliveries == 0


def test_requeue_after_retry_counts_additional_delivery() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "body", 0, "RETRY", 10).encode()
    [[_, got, _]] = node("GETJOB", "FROM", "q")
    assert got == job_id
    assert node("QLEN", "q") == 0
    node.advance(9_000)  # jitter is at most 250 ms either way
    assert node("QLEN", "q") == 0
    node.advance(1_300)
    assert node("QLEN", "q") == 1
    job = node.job(job_id)
    assert job.state == JobState.QUEUED
    assert job.additional_deliveries == 1
    [[_, again, _, _, nacks, _, deliveries]] = node("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert (again, nacks, deliveries) == (job_id, 0, 1)


def test_job_left_in_queue_is_not_counted_twice() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "body", 0, "RETRY", 10).encode()
    node.advance(31_000)  # three retry periods while nobody fetches it
    job = node.job(job_id)
    assert job.state == JobState.QUEUED
    assert job.additional_deliveries == 0
    assert node("QLEN", "q") == 1


def test_a_job_left_queued_tells_its_copies_at_each_retry() -> None:
    # The spec's requeue timer sends QUEUED whatever the job's state.  Two
    # nodes that both hold a job queued (a QUEUED lost on a link that was
    # down) only go back to one when a QUEUED from the higher-ranked copy
    # arrives; with no active copy left, nothing but this timer sends one.
    node = Node()
    peer = "b" * 40
    node.state.cluster.nodes[peer] = ClusterNode(peer, "127.0.0.1", 7712)
    job_id = node("ADDJOB", "q", "body", 0, "RETRY", 10, "REPLICATE", 1).encode()
    job = node.job(job_id)
    job.delivered = job.delivered | {peer}  # a copy on the peer (no link: sends are counted)
    dropped = node.state.cluster.messages_dropped
    node.advance(9_000)  # jitter is at most 250 ms either way
    assert node.state.cluster.messages_dropped == dropped
    node.advance(1_300)
    for period in range(1, 4):
        if period > 1:
            node.advance(10_300)  # each RETRY ± 250 ms: one timer per step
        assert job.state == JobState.QUEUED and node("QLEN", "q") == 1
        assert node.state.cluster.messages_dropped == dropped + period  # one QUEUED each
    assert job.additional_deliveries == 0  # not counted as a delivery


def test_ttl_expiry_removes_job_in_any_state() -> None:
    node = Node()
    queued = node("ADDJOB", "q", "a", 0, "TTL", 20).encode()
    delayed = node("ADDJOB", "q", "b", 0, "TTL", 20, "DELAY", 10).encode()
    node.advance(19_999)
    assert node.job(queued) is not None and node.job(delayed) is not None
    node.advance(1)
    assert node.job(queued) is None and node.job(delayed) is None
    assert node("QLEN", "q") == 0


def test_retry_zero_is_delivered_at_most_once() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "once", 0, "RETRY", 0).encode()
    assert int(job_id[36:], 16) % 2 == 0  # even TTL field: at-most-once
    node("GETJOB", "FROM", "q")
    node.advance(3_600_000)
    assert node("QLEN", "q") == 0
    assert node.job(job_id).state == JobState.ACTIVE
    assert node("ENQUEUE", job_id) == 0
    assert node("NACK", job_id) == 0
    assert node.state.jobs.oldest_evictable() is node.job(job_id)


def test_default_retry_and_ttl() -> None:
    node = Node()
    job = node.job(node("ADDJOB", "q", "x", 0).encode())
    assert (job.retry, job.ttl_seconds, job.repl) == (300, 86400, 1)
    short = node.job(node("ADDJOB", "q", "x", 0, "TTL", 100).encode())
    assert short.retry == 10
    tiny = node.job(node("ADDJOB", "q", "x", 0, "TTL", 5).encode())
    assert tiny.retry == 1
    assert ttl_minutes_from_id(job.id) == 1440 | 1


def test_working_postpones_and_toolate_after_half_ttl() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 10, "TTL", 100).encode()
    node("GETJOB", "FROM", "q")
    node.advance(8_000)
    assert node("WORKING", job_id) == 10
    node.advance(8_000)  # 16 s after delivery, but only 8 s after WORKING
    assert node("QLEN", "q") == 0
    node.advance(35_000)  # 51 s: more than half of the TTL
    assert node.error("WORKING", job_id).startswith("TOOLATE ")


def test_working_on_acked_job_is_an_error() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    peer = "b" * 40
    node.state.cluster.nodes[peer] = ClusterNode(peer, "127.0.0.1", 7712)
    node.job(job_id).delivered |= {peer}  # a copy elsewhere keeps the ACK alive
    node("ACKJOB", job_id)
    assert node.job(job_id).state == JobState.ACKED
    assert node.error("WORKING", job_id).startswith("ACKED ")


def test_nack_requeues_now_and_counts() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    node("GETJOB", "FROM", "q")
    assert node("NACK", job_id) == 1
    assert node("NACK", job_id) == 0  # already queued
    assert node.job(job_id).nacks == 1
    assert node("QLEN", "q") == 1


def test_ack_on_single_node_forgets_job_at_once() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    assert node("ACKJOB", job_id) == 1
    assert node.job(job_id) is None
    assert node("ACKJOB", job_id) == 0  # unknown now; no dummy ACK on one node
    assert len(node.state.jobs) == 0


def test_dummy_ack_in_a_cluster_retries_gc_with_backoff_then_expires() -> None:
    node = Node()
    peer = "b" * 40
    node.state.cluster.nodes[peer] = ClusterNode(peer, "127.0.0.1", 7712)
    unknown = b"D-bbbbbbbb-AAAAAAAAAAAAAAAAAAAAAAAA-0001"  # odd TTL field: 1 minute
    at_most_once = b"D-bbbbbbbb-AAAAAAAAAAAAAAAAAAAAAAAB-0002"
    assert node("ACKJOB", unknown, at_most_once) == 0
    dummy = node.job(unknown)
    assert dummy is not None and dummy.state == JobState.ACKED and dummy.is_dummy_ack
    assert node.job(at_most_once) is None
    dropped = node.state.cluster.messages_dropped
    assert dropped == 1  # SETACK to the peer: no link yet, dropped
    node.advance(2_300)  # first retry ~2 s later
    assert node.state.cluster.messages_dropped == dropped + 1
    node.advance(60_000)
    assert node.job(unknown) is None  # the ID's TTL (1 minute) ended


def test_gc_backoff_grows_and_caps() -> None:
    delays = [gc_retry_delay_ms(n) for n in range(1, 11)]
    assert 1750 <= delays[0] <= 2250
    assert all(abs(d - min(1000 * 2 ** n, 180_000)) <= 250 for n, d in enumerate(delays, 1))


def test_leaving_node_refuses_to_block_and_to_store() -> None:
    node = Node()
    node("CLUSTER", "LEAVING", "yes")
    assert node.error("GETJOB", "FROM", "q").startswith("LEAVING ")
    assert node("GETJOB", "NOHANG", "FROM", "q") is NULL_ARRAY
    err = node.error("ADDJOB", "q", "x", 0)
    assert err.startswith("NOREPL ") and "I'm leaving the cluster" in err


def test_schedule_never_spins_and_stays_compact() -> None:
    node = Node()
    ids = [node("ADDJOB", "q", "x", 0, "RETRY", 30).encode() for _ in range(200)]
    node("GETJOB", "COUNT", 200, "FROM", "q")
    for _ in range(50):
        for job_id in ids:
            node("WORKING", job_id)
        node.advance(100)
    schedule = node.state.jobs.schedule
    assert len(schedule) == len(ids)  # one entry per job, however often it moved
    next_time = schedule.next_time()
    assert next_time > node.clock.now_ms()
    assert node.advance(0) == 0


def test_idle_queue_eviction_spares_paused_and_waited_on_queues() -> None:
    node = Node()
    node("ADDJOB", "idle", "x", 0)
    node("GETJOB", "FROM", "idle")
    node("PAUSE", "paused", "in")
    node.clock.advance(300_000)
    node.state.evict_idle_queues(max_visits=5000)
    assert node.state.queues.lookup(b"idle") is None
    assert node.state.queues.lookup(b"paused") is not None


def test_memory_accounting_matches_tracemalloc() -> None:
    """JOB_OVERHEAD_BYTES must describe what a job really costs here (±20%)."""
    node = Node()
    node("ADDJOB", "q", "warm-up", 0)
    tracemalloc.start()
    try:
        before_traced = tracemalloc.get_traced_memory()[0]
        before_accounted = node.state.memory.accounted
        for i in range(20_000):
            # A body object per job, made while traced: every request brings its own.
            node("ADDJOB", "q", b"%0100d" % i, 0)
            if i % 20 == 0:
                node.clock.advance(1)  # a loaded node: 20 jobs per ms
        traced = tracemalloc.get_traced_memory()[0] - before_traced
    finally:
        tracemalloc.stop()
    accounted = node.state.memory.accounted - before_accounted
    assert accounted == pytest.approx(traced, rel=0.2), (accounted / 20_000, traced / 20_000)


def test_startup_share_matches_tracemalloc() -> None:
    """STARTUP_BYTES must describe what a new node's state really costs (±20%)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        node = Node()
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert node.state.memory.used == STARTUP_BYTES
    assert traced == pytest.approx(STARTUP_BYTES, rel=0.2), traced


def test_memory_eviction_and_oom() -> None:
    node = Node(maxmemory="1mb")
    delivered = []
    while node.state.memory.level() < 2:
        delivered.append(node("ADDJOB", "q", b"y" * 1000, 0, "RETRY", 0))
        node("GETJOB", "FROM", "q")  # delivered RETRY-0 jobs may be evicted
    assert node.state.memory.level() >= 2
    node("ADDJOB", "q", b"z", 0)  # runs eviction first
    assert node.state.stats.evicted_jobs > 0
    # Eviction brought the node under 95% before the new job was stored.
    memory = node.state.memory
    new_job = JOB_OVERHEAD_BYTES + len(b"z") + QUEUE_ENTRY_BYTES
    assert (memory.used - new_job) * 20 <= memory.maxmemory * 19
    assert len(node.state.jobs) < len(delivered) + 1
    # Jobs that must not be evicted fill memory until -OOM.
    errors = []
    for _ in range(5000):
        reply = node.raw("ADDJOB", "q", b"w" * 1000, 0)
        if isinstance(reply, ReplyError):
            errors.append(reply.message)
            break
    assert errors and errors[0].startswith("OOM ")
    assert node("GETJOB", "NOHANG", "FROM", "q")  # reads still work


# --------------------------------------------------------------------------
# A job queued where a client waits: handed over, or queued
# --------------------------------------------------------------------------

def _waiting_client(node: Node, *getjob: str) -> LocalClient:
    """Another client of ``node``, blocked in ``GETJOB`` (no TIMEOUT: no loop timer)."""
    waiter = LocalClient(node.state.acl.default)
    argv = [b"GETJOB", *(arg.encode() for arg in getjob)]
    assert execute(node.state, waiter, argv) is BLOCKED
    return waiter


def test_a_nacked_job_handed_to_a_waiting_client_carries_its_counters() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    node("GETJOB", "FROM", "q")
    waiter = _waiting_client(node, "WITHCOUNTERS", "FROM", "q")
    assert node("NACK", job_id) == 1
    assert waiter.replies == [[[b"q", job_id, b"x", b"nacks", 1, b"additional-deliveries", 0]]]
    assert node("QLEN", "q") == 0
    stat = node("QSTAT", "q")
    assert dict(zip(stat[::2], stat[1::2], strict=True))[b"jobs-out"] == 2
    assert node.job(job_id).state == JobState.ACTIVE


def test_a_job_added_while_a_client_waits_on_a_queue_paused_for_output_stays_queued() -> None:
    node = Node()
    node("PAUSE", "q", "out")
    waiter = _waiting_client(node, "FROM", "q")
    job_id = node("ADDJOB", "q", "x", 0).encode()
    assert waiter.replies == [] and node("QLEN", "q") == 1
    assert node.job(job_id).state == JobState.QUEUED
    node("PAUSE", "q", "none")
    assert waiter.replies == [[[b"q", job_id, b"x"]]] and node("QLEN", "q") == 0


def test_an_acked_job_kept_for_its_copies_is_evictable() -> None:
    """ACKJOB leaves making the job evictable to its GC, which keeps it
    while a copy elsewhere has not confirmed the ACK."""
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    peer = "b" * 40
    node.state.cluster.nodes[peer] = ClusterNode(peer, "127.0.0.1", 7712)
    node.job(job_id).delivered |= {peer}
    node("ACKJOB", job_id)
    job = node.job(job_id)
    assert job is not None and job.state == JobState.ACKED
    assert job in node.state.jobs.evictable_jobs()


def test_an_ack_does_not_wait_for_a_copy_on_a_forgotten_node() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    peer = "b" * 40
    node.job(job_id).delivered |= {peer}
    node.state.cluster.forgotten.add(peer)  # CLUSTER FORGET: it will never answer
    assert node("ACKJOB", job_id) == 1
    assert node.job(job_id) is None and node.state.jobs.evictable_jobs() == []
