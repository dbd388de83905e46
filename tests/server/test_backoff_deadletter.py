"""NACK ... DELAY, BACKOFF, MAXDELIVERIES and DEADLETTER: the timing rules,
in-process on a manual clock (``statekit``).  The grammar, the errors and
the end-to-end behaviour on a real server: test_backoff_deadletter_server.py.
"""

from __future__ import annotations

import pytest

from disque.job import JobState, serialize_job
from disque.job_options import JobExt, decode_stored, retry_seconds, stored_form

from .statekit import Node


def _fetch(node: Node, queue: str = "q") -> bytes:
    [[_, job_id, _]] = node("GETJOB", "NOHANG", "FROM", queue)
    return job_id


def _requeued_after(node: Node, queue: str = "q", limit_ms: int = 10_000_000) -> int:
    """Advance the clock 10 ms at a time until the queue has a job; the ms waited."""
    waited = 0
    while node("QLEN", queue) == 0:
        assert waited < limit_ms, "never requeued"
        node.advance(10)
        waited += 10
    return waited


def test_backoff_doubles_the_requeue_delay_up_to_the_cap() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 2, "BACKOFF", 10).encode()
    waits = []
    for _ in range(5):
        assert _fetch(node) == job_id
        waits.append(_requeued_after(node))
    # 2, 4, 8, then the 10 s cap; the original's jitter is +-250 ms.
    for waited, expected in zip(waits, (2000, 4000, 8000, 10_000, 10_000), strict=True):
        assert abs(waited - expected) <= 260, waits
    job = node.job(job_id)
    assert (job.nacks, job.additional_deliveries) == (0, 5)
    assert len(node.state.jobs.schedule) == 1  # one schedule entry, no timer per job


def test_without_backoff_the_requeue_delay_stays_retry() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 2).encode()
    for _ in range(3):
        assert _fetch(node) == job_id
        assert abs(_requeued_after(node) - 2000) <= 260


def test_nack_of_a_backoff_job_waits_its_backoff_and_counts_when_queued() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 1, "BACKOFF", 60).encode()
    expected = (1000, 2000, 4000, 8000)
    for want in expected:
        assert _fetch(node) == job_id
        nacks = node.job(job_id).nacks
        assert node("NACK", job_id) == 1
        assert node.job(job_id).nacks == nacks  # counted when queued again
        assert abs(_requeued_after(node) - want) <= 260
        assert node.job(job_id).nacks == nacks + 1
    assert node.job(job_id).additional_deliveries == 0


def test_nack_delay_queues_later_and_counts_one_nack() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 100).encode()
    _fetch(node)
    assert node("NACK", job_id, "DELAY", 5) == 1
    assert node("NACK", job_id, "DELAY", 5) == 1  # still active: a new delay replaces it
    job = node.job(job_id)
    assert job.state == JobState.ACTIVE and job.nacks == 0
    assert node("SHOW", job_id)[-1] == b"x"  # a plain job: SHOW is the original's
    node.advance(4_990)
    assert node("QLEN", "q") == 0
    node.advance(20)
    assert node("QLEN", "q") == 1
    assert (job.nacks, job.additional_deliveries) == (1, 0)
    # The next requeue is a RETRY after this queueing, as for any queueing.
    assert abs(job.qtime - node.clock.now_ms() - 100_000) <= 260
    assert node("NACK", job_id, "DELAY", 5) == 0  # queued: nothing to NACK


def test_nack_delay_zero_is_a_plain_nack() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0).encode()
    _fetch(node)
    assert node("NACK", job_id, "DELAY", 0) == 1
    assert node("QLEN", "q") == 1 and node.job(job_id).nacks == 1


def test_nack_delay_refuses_what_nack_refuses() -> None:
    node = Node()
    once = node("ADDJOB", "q", "x", 0, "RETRY", 0, "REPLICATE", 1).encode()
    _fetch(node)
    assert node("NACK", once, "DELAY", 3) == 0  # at most once, delivered: never again
    node.advance(10_000)
    assert node("QLEN", "q") == 0


def test_working_postpones_by_the_current_backoff() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "x", 0, "RETRY", 3, "BACKOFF", 100).encode()
    _fetch(node)
    _requeued_after(node)
    _fetch(node)
    assert node("WORKING", job_id) == 6  # RETRY * 2 after one requeue
    assert node("WORKING", node("ADDJOB", "p", "x", 0, "RETRY", 3)) == 3


@pytest.mark.parametrize("via", ["timeout", "nack"])
def test_dead_letter_at_the_requeue_after_max_deliveries(via: str) -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "body", 0, "RETRY", 1, "MAXDELIVERIES", 3).encode()
    for delivery in range(1, 4):
        assert _fetch(node) == job_id
        if via == "nack":
            node("NACK", job_id)
        else:
            _requeued_after(node, "q" if delivery < 3 else "q:dead")
    assert node("QLEN", "q") == 0 and node("QLEN", "q:dead") == 1
    job = node.job(job_id)
    assert job.queue == b"q:dead" and job.body == b"body"
    counted = (3, 0) if via == "nack" else (0, 3)
    assert (job.nacks, job.additional_deliveries) == counted  # the move is the 3rd requeue
    show = dict(zip(*[iter(node("SHOW", job_id))] * 2, strict=True))
    assert show[b"dead-lettered-from"] == b"q" and show[b"dead-letter-queue"] == b"q:dead"
    assert show[b"max-deliveries"] == 3
    qstat = dict(zip(*[iter(node("QSTAT", "q"))] * 2, strict=True))
    assert qstat[b"dead-lettered"] == 1
    assert node.state.stats.dead_lettered_jobs == 1
    # In the dead-letter queue it is an ordinary job: delivered, requeued, never moved again.
    [[queue, got, body]] = node("GETJOB", "FROM", "q:dead")
    assert (queue, got, body) == (b"q:dead", job_id, b"body")
    _requeued_after(node, "q:dead")
    assert node.state.stats.dead_lettered_jobs == 1
    assert node("ACKJOB", job_id) == 1
    assert node.job(job_id) is None


def test_named_dead_letter_queue_and_limit_one() -> None:
    node = Node()
    job_id = node("ADDJOB", "q", "b", 0, "RETRY", 1, "MAXDELIVERIES", 1,
                  "DEADLETTER", "poison").encode()
    _fetch(node)
    node("NACK", job_id)
    assert node("QLEN", "poison") == 1 and node("QLEN", "q") == 0
    assert node.job(job_id).ext.dead_from == b"q"


def test_plain_queue_stat_has_no_dead_letter_field() -> None:
    node = Node()
    node("ADDJOB", "q", "b", 0)
    qstat = node("QSTAT", "q")
    assert b"dead-lettered" not in qstat[::2]
    assert len(qstat) == 20  # the original's ten fields


def test_stored_form_round_trip_and_plain_jobs_keep_the_original_blob() -> None:
    node = Node()
    plain = node.job(node("ADDJOB", "q", "b", 0).encode())
    assert stored_form(plain) == serialize_job(plain)
    job = node.job(node("ADDJOB", "q", "b", 0, "BACKOFF", 900, "MAXDELIVERIES", 7,
                        "DEADLETTER", "d\x00q").encode())
    job.ext.dead_from = b"from"
    back = decode_stored(stored_form(job))
    assert back.ext == JobExt(900, 7, b"d\x00q", b"from")
    assert (back.id, back.body, back.queue) == (job.id, job.body, job.queue)
    assert retry_seconds(back) == back.retry
