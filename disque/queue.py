"""The spec's procedures on queues: ENQUEUE, DEQUEUE, NACK, the fetch of
GETJOB, pausing; and serving the GETJOB clients waiting on a queue.

The queues themselves (and the table of them) are in ``queue_table.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .deadletter import dead_letter
from .job import (
    ACKED,
    ACTIVE,
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELIVERED,
    QUEUED,
    Job,
)
from .job_options import JobExt, limit_reached, retry_seconds
from .queue_table import PAUSED_IN, PAUSED_OUT, QUEUE_ENTRY_BYTES, Queue
from .schedule import requeue_time, update_awake_time
from .waiters import WITH_LEASE, getjob_entry, unblock

if TYPE_CHECKING:
    from .cluster.messages import Message
    from .cluster.node import ClusterNode
    from .state import ServerState

__all__ = [
    "enqueue_job",
    "dequeue_job",
    "fetch_job",
    "fetch_jobs",
    "nack_job",
    "set_pause",
    "receive_pause",
    "serve_blocked_clients",
]


# --------------------------------------------------------------------------
# ENQUEUE / DEQUEUE (spec "Generic functions"; queue.c:enqueueJob, dequeueJob)
# --------------------------------------------------------------------------

def enqueue_job(state: ServerState, job: Job, nack: bool = False, *,
                q: Queue | None = None, now: int | None = None) -> bool:
    """ENQUEUE(job): put the job in its queue and schedule the next retry.

    Refuses (returns False) jobs already queued, jobs without a queue time
    (RETRY 0 already queued once), RETRY-0 jobs already delivered and acked
    jobs.  The first enqueue of a job is silent; later ones count as an
    additional delivery (or a NACK) and tell the other copies with QUEUED.
    A caller that already holds the job's queue and the time (ADDJOB) passes
    them in rather than have them looked up again.
    """
    job_state = job.state
    if job_state in (QUEUED, ACKED) or job.qtime == 0 or job.queue is None:
        return False
    flags = job.flags
    retry = job.retry
    if retry == 0 and flags & FLAG_DELIVERED:
        return False
    if now is None:
        now = state.clock.now_ms()
    job.state = QUEUED
    ext = job.ext
    if ext is not None and ext.nack_pending:
        ext.nack_pending = False  # the queueing a NACK ... DELAY waited for
        nack = True
    if flags & FLAG_BCAST_QUEUED or nack:
        # The re-queue that would exceed MAXDELIVERIES moves the job to its
        # dead-letter queue instead; it still counts as this re-queue.
        dead = ext is not None and limit_reached(job)
        job.flags = flags
        if nack:
            job.nacks += 1
        else:
            job.additional_deliveries += 1
        if dead:
            dead_letter(state, job)  # before QUEUED: the copies learn the move first
            q = None
        state.cluster.broadcast_queued(job, nack)
    else:
        job.flags = flags | FLAG_BCAST_QUEUED
    if retry:
        job.flags |= FLAG_BCAST_WILLQUEUE
        # After the counters: a back-off grows with them.
        job.qtime = requeue_time(state, retry if ext is None else retry_seconds(job),
                                          now)
    else:
        job.qtime = 0
    update_awake_time(state, job)
    if q is None:
        q = state.queue_for_write(job.queue)
    job.queue = q.name  # share one bytes object per queue name
    q.jobs.add(job)
    q.jobs_in += 1
    q.atime = now
    state.memory.add(QUEUE_ENTRY_BYTES)
    # No evictable_discard: the evictable (acked, or RETRY 0 and delivered)
    # were refused above, and neither state is ever left.
    if q.waiters and not q.flags & PAUSED_OUT:
        serve_blocked_clients(state, q)
    return True


def nack_job(state: ServerState, job: Job, delay_s: int | None = None) -> bool:
    """NACK: queue the job again now, counting a NACK; or, after ``delay_s``
    seconds (NACK ... DELAY) or the job's back-off, later.

    A delayed NACK is counted when the job is queued again (like the
    immediate one), and the other copies are told with WORKING(aux = delay)
    to hold theirs at least that long.  Refused like :func:`enqueue_job`.
    """
    ext = job.ext
    if delay_s is None:
        delay_s = retry_seconds(job) if ext is not None and ext.backoff else 0
    if not delay_s:
        return enqueue_job(state, job, nack=True)
    if (job.state != ACTIVE or job.qtime == 0 or job.queue is None
            or (job.retry == 0 and job.flags & FLAG_DELIVERED)):
        return False
    if ext is None:
        ext = job.ext = JobExt()
    ext.nack_pending = True
    job.qtime = state.clock.now_ms() + delay_s * 1000
    job.flags |= FLAG_BCAST_WILLQUEUE
    update_awake_time(state, job)
    state.cluster.broadcast_working(job, delay_s)
    return True


def dequeue_job(state: ServerState, job: Job) -> bool:
    """DEQUEUE(job): take a queued job out of its queue; it becomes active."""
    if job.state != QUEUED:
        return False
    q = state.queues.lookup(job.queue) if job.queue is not None else None
    if q is not None and q.jobs.remove(job):
        q.jobs_out += 1
        state.memory.sub(QUEUE_ENTRY_BYTES)
    # Queued and active jobs wake at the same time (see update_awake_time),
    # so the schedule needs no update here.
    job.state = ACTIVE
    return True


def fetch_job(state: ServerState, q: Queue) -> Job | None:
    """Pop the next job of ``q`` for delivery to a client (GETJOB)."""
    jobs = fetch_jobs(state, q, 1)
    return jobs[0] if jobs else None


def fetch_jobs(state: ServerState, q: Queue, count: int) -> list[Job]:
    """Pop up to ``count`` of the next jobs of ``q`` for delivery (GETJOB COUNT)."""
    queued = q.jobs
    count = min(count, len(queued))
    if not count:
        return []
    taken: list[Job] = []
    for _ in range(count):
        job = queued.pop_first()
        assert job is not None  # count <= len(queued)
        taken.append(job)
    q.jobs_out += count
    state.stats.delivered_jobs += count
    q.atime = state.clock.now_ms()
    state.memory.sub(QUEUE_ENTRY_BYTES * count)
    evictable_add = state.jobs.evictable_add
    for job in taken:
        job.state = ACTIVE
        job.flags |= FLAG_DELIVERED
        if job.retry == 0:
            # At-most-once and delivered: may now be evicted under memory pressure.
            evictable_add(job)
    # The awake time is the same for queued and active jobs: no schedule update.
    return taken


def set_pause(state: ServerState, q: Queue, flags: int) -> None:
    """Pause ``q`` in ``flags`` (PAUSED_IN, PAUSED_OUT); serve its waiting
    clients if it stopped being paused for output."""
    was_paused_out = q.paused_out
    q.flags = flags
    q.atime = state.clock.now_ms()
    if was_paused_out and not q.paused_out and q.waiters:
        serve_blocked_clients(state, q)


def receive_pause(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """PAUSE from another node (PAUSE ... BCAST there): copy its pause flags."""
    flags = msg.aux & (PAUSED_IN | PAUSED_OUT)
    q = state.queues.lookup(msg.queue)
    if q is None:
        if not flags:
            return
        q = state.queue_for_write(msg.queue)
    set_pause(state, q, flags)


def serve_blocked_clients(state: ServerState, q: Queue) -> int:
    """Give one job each to the clients waiting on ``q``, first come first served."""
    served = 0
    while q.waiters and q.jobs and not q.paused_out:
        blocked = next(iter(q.waiters))
        job = fetch_job(state, q)
        if job is None:
            break
        fields = blocked.fields
        now = state.clock.now_ms() if fields & WITH_LEASE else 0
        unblock(state, blocked, [getjob_entry(job, fields, now)])
        served += 1
    return served
