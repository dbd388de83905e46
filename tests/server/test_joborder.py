"""JobOrder (a queue's jobs, highest priority then oldest first) against a
plain model.

The structure keeps in-order jobs in a deque with lazily deleted entries
and the rest in a sorted list, one such level per priority in use; these
runs mix in-order and late arrivals, priorities, removals from the middle,
jobs moved between two queues and back (a dead-letter move, a re-queue),
and check every answer against a list.
"""

from __future__ import annotations

import random

import pytest

from disque.job import FLAG_FIFO_STALE, FLAG_IN_FIFO, Job
from disque.job_options import JobExt
from disque.queue_order import COMPACT_MIN, JobOrder, priority_of


def make_job(n: int, ctime: int, priority: int = 0) -> Job:
    job = Job(b"D-%038d" % n, b"q", b"body", ctime=ctime)
    if priority:
        job.ext = JobExt(priority=priority)
    return job


def serve_key(job: Job) -> tuple[int, int]:
    """The order GETJOB hands jobs out in: priority (highest first), then ctime."""
    return (-priority_of(job), job.ctime)


def check_level(order: JobOrder) -> None:
    fifo = order._fifo
    # The ends are live, and dropped jobs are kept by a bounded number of entries.
    if fifo:
        assert fifo[0].flags & FLAG_IN_FIFO and fifo[-1].flags & FLAG_IN_FIFO
    assert order._stale == sum(1 for job in fifo if not job.flags & FLAG_IN_FIFO)
    assert order._stale < max(COMPACT_MIN, len(fifo) // 8 + 1)
    # At most one deque entry per job, live or stale.
    assert len({id(job) for job in fifo}) == len(fifo)
    # The deque's last entry, kept apart for ADDJOB's comparison.
    assert order._tail is (fifo[-1] if fifo else None)


def check_invariants(order: JobOrder, model: list[Job]) -> None:
    assert len(order) == len(model)
    assert bool(order) == bool(model)
    check_level(order)
    levels = order._levels
    if levels is not None:
        for priority, level in enumerate(levels.by_priority):
            if level is not None:
                check_level(level)
                assert bool(levels.mask >> priority & 1) == bool(level)
        assert levels.count == sum(1 for job in model if priority_of(job))
    assert order.top_priority() == max((priority_of(job) for job in model), default=0)
    # The k first have the k smallest serve keys, in order, and are members.
    k = len(model) // 2 + 1
    first = order.first(k)
    assert [serve_key(job) for job in first] == sorted(serve_key(job) for job in model)[:k]
    assert all(any(job is m for m in model) for job in first)
    last = order.last(k)
    assert [serve_key(job) for job in last] == sorted((serve_key(job) for job in model),
                                                      reverse=True)[:k]


@pytest.mark.parametrize("priorities", [(0,), (0, 0, 0, 1, 5, 31)], ids=["plain", "priorities"])
@pytest.mark.parametrize("seed", range(12))
def test_random_operations_match_a_model(seed: int, priorities: tuple[int, ...]) -> None:
    rng = random.Random(seed)
    orders = [JobOrder(), JobOrder()]
    models: list[list[Job]] = [[], []]
    loose: list[Job] = []  # jobs in no order (popped or removed), maybe added again
    clock = 1_000
    serial = 0
    for step in range(3000):
        which = rng.randrange(2)
        order, model = orders[which], models[which]
        op = rng.random()
        if op < 0.35:
            serial += 1
            clock += rng.choice((0, 0, 1, 3))  # equal ctimes happen under load
            job = make_job(serial, clock if rng.random() < 0.8 else rng.randrange(clock + 1),
                           rng.choice(priorities))
            order.add(job)
            model.append(job)
        elif op < 0.45 and loose:
            job = loose.pop(rng.randrange(len(loose)))  # re-queued, maybe in the other queue
            order.add(job)
            model.append(job)
        elif op < 0.7 and model:
            job = model.pop(rng.randrange(len(model)))
            assert order.remove(job)
            assert not order.remove(job)  # not there any more
            loose.append(job)
        elif op < 0.72 and loose:
            assert not order.remove(rng.choice(loose))
        elif model:
            job = order.pop_first()
            assert job is not None
            assert serve_key(job) == min(serve_key(m) for m in model)
            model.remove(job)
            loose.append(job)
            assert not job.flags & FLAG_IN_FIFO
        else:
            assert order.pop_first() is None
        if step % 50 == 0:
            for o, m in zip(orders, models, strict=True):
                check_invariants(o, m)
    for order, model in zip(orders, models, strict=True):
        check_invariants(order, model)
        # QPEEK shows what GETJOB hands out, in the same order.
        expected = order.first(len(model))
        assert order.last(len(model)) == expected[::-1]
        drained = [order.pop_first() for _ in range(len(model))]
        assert drained == expected
        assert order.pop_first() is None and not order and len(order) == 0


def test_many_removals_from_the_middle_do_not_keep_dropped_jobs() -> None:
    order = JobOrder()
    jobs = [make_job(i, 1000 + i) for i in range(10_000)]
    for job in jobs:
        order.add(job)
    for job in jobs[1:-1]:  # everything but the ends: no trimming helps
        assert order.remove(job)
        assert order._stale < max(COMPACT_MIN, len(order._fifo) // 8 + 1)
    assert len(order) == 2
    assert len(order._fifo) <= COMPACT_MIN + 2
    assert order.pop_first() is jobs[0]
    assert order.pop_first() is jobs[-1]
    # Every dropped job's flags are clean once its entry is gone.
    assert not any(job.flags & (FLAG_IN_FIFO | FLAG_FIFO_STALE) for job in jobs)


def test_a_job_with_a_stale_entry_queued_again_is_delivered_once() -> None:
    """The case lazy deletion gets wrong if done naively: a job removed from
    the deque (stale entry left behind) and queued again in the same queue
    must come out once, not twice."""
    order = JobOrder()
    # Equal ctimes (one millisecond under load): queued again, the job is
    # not older than the tail, and could be appended to the deque again.
    first, middle, last = make_job(1, 10), make_job(2, 20), make_job(3, 20)
    for job in (first, middle, last):
        order.add(job)
    assert order.remove(middle)          # stale entry between two live ones
    order.add(middle)
    assert len(order) == 3
    assert [order.pop_first() for _ in range(4)] == [first, last, middle, None]
    assert not order


def test_late_jobs_come_out_in_ctime_order_with_in_order_ones() -> None:
    order = JobOrder()
    jobs = {c: make_job(c, c) for c in (5, 10, 20, 7, 15, 1, 30)}
    for job in jobs.values():
        order.add(job)
    assert [j.ctime for j in order.first(10)] == [1, 5, 7, 10, 15, 20, 30]
    assert [j.ctime for j in order.last(3)] == [30, 20, 15]
    assert [order.pop_first().ctime for _ in range(7)] == [1, 5, 7, 10, 15, 20, 30]


def test_clear_leaves_no_flags_behind() -> None:
    order = JobOrder()
    jobs = [make_job(i, i) for i in range(1, 5)]
    for job in jobs:
        order.add(job)
    order.remove(jobs[1])
    order.clear()
    assert not order and order.pop_first() is None
    assert not any(job.flags & (FLAG_IN_FIFO | FLAG_FIFO_STALE) for job in jobs)


def test_fifo_flags_are_never_serialized_nor_loaded() -> None:
    """They describe this node's deque: a copy sent to a peer or written to
    the AOF must not carry them, and a blob that has them (a buggy or
    future peer) must not make a job look queued."""
    from disque.job import SERIALIZED_FLAGS, deserialize_job, serialize_job

    order = JobOrder()
    job = Job(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", b"q", b"body", ctime=10)
    order.add(job)
    assert job.flags & FLAG_IN_FIFO
    blob = serialize_job(job)
    copy, _ = deserialize_job(blob)
    assert copy.flags == job.flags & SERIALIZED_FLAGS
    assert not copy.flags & (FLAG_IN_FIFO | FLAG_FIFO_STALE)
    flags_at = 4 + 40 + 1  # length, ID, state/gc byte
    forged = bytearray(blob)
    forged[flags_at] |= FLAG_IN_FIFO | FLAG_FIFO_STALE
    loaded, _ = deserialize_job(bytes(forged))
    assert not loaded.flags & (FLAG_IN_FIFO | FLAG_FIFO_STALE)


def test_priorities_first_then_ctime_and_peeks_in_both_directions() -> None:
    order = JobOrder()
    jobs = [make_job(1, 10), make_job(2, 20, 3), make_job(3, 5), make_job(4, 30, 31),
            make_job(5, 15, 3), make_job(6, 1, 1)]
    for job in jobs:
        order.add(job)
    expected = [(31, 30), (3, 15), (3, 20), (1, 1), (0, 5), (0, 10)]
    assert [(priority_of(j), j.ctime) for j in order.first(10)] == expected
    assert [(priority_of(j), j.ctime) for j in order.last(4)] == expected[::-1][:4]
    assert order.priorities() == [(31, 1), (3, 2), (1, 1)]
    assert order.top_priority() == 31
    assert order.remove(jobs[3]) and not order.remove(jobs[3])
    assert order.top_priority() == 3
    assert [(priority_of(j), j.ctime) for j in
            iter(order.pop_first, None)] == expected[1:]
    assert not order and len(order) == 0 and order.priorities() == []


def test_a_queue_without_priorities_makes_no_levels() -> None:
    order = JobOrder()
    for i in range(100):
        order.add(make_job(i, i))
    assert order._levels is None
    order.add(make_job(1000, 1, 2))
    assert order._levels is not None
    order.clear()
    assert order._levels is None
