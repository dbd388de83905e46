"""The spec's procedures on queues: ENQUEUE, DEQUEUE, NACK, the fetch of
GETJOB, pausing, rate limits (QLIMIT, an extension); and serving the GETJOB
clients waiting on a queue.

The queues themselves (and the table of them) are in ``queue_table.py``,
a rate limit's window in ``queue_limit.py``, the books of ordered groups
(GROUP, an extension) in ``groups.py``: a job of a group is placed, taken
and dequeued through it (one test of ``job.ext`` or ``q.groups`` on a
group-free path), and :func:`release_group` serves the clients a released
group can now feed.  In a cluster, :func:`withdraw_job` makes a job another
node serves a copy again, and :func:`requeue_group` queues a group's copies
all at once (groups.py, "In a cluster").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import groups
from .deadletter import dead_letter
from .job import (
    ACKED,
    ACTIVE,
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELIVERED,
    FLAG_GROUP_COPY,
    FLAG_GROUP_OUT,
    QUEUED,
    Job,
)
from .job_options import JobExt, limit_reached, retry_seconds
from .queue_limit import MAX_LIMIT_PERIOD_MS, QueueLimit
from .queue_table import PAUSED_IN, PAUSED_OUT, QUEUE_ENTRY_BYTES, Queue
from .schedule import requeue_time, update_awake_time
from .waiters import BlockedGet, entries_reply, unblock

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
    "release_group",
    "requeue_group",
    "withdraw_job",
    "set_pause",
    "receive_pause",
    "set_rate_limit",
    "receive_qlimit",
    "wake_when_window_opens",
    "serve_blocked_clients",
]


# --------------------------------------------------------------------------
# ENQUEUE / DEQUEUE (spec "Generic functions"; queue.c:enqueueJob, dequeueJob)
# --------------------------------------------------------------------------

def enqueue_job(state: ServerState, job: Job, nack: bool = False, *,
                q: Queue | None = None, now: int = -1) -> bool:
    """ENQUEUE(job): put the job in its queue and schedule the next retry.

    Refuses (returns False) jobs already queued, jobs without a queue time
    (RETRY 0 already queued once), RETRY-0 jobs already delivered and acked
    jobs.  The first enqueue of a job is silent; later ones count as an
    additional delivery (or a NACK) and tell the other copies with QUEUED.
    A caller that already holds the job's queue and the time (ADDJOB) passes
    them in rather than have them looked up again (``now`` -1: not given;
    an int rather than None, which compiled would be boxed).
    """
    job_state = job.state
    if job_state in (QUEUED, ACKED) or job.qtime == 0 or job.queue is None:
        return False
    flags = job.flags
    retry = job.retry
    if retry == 0 and flags & FLAG_DELIVERED:
        return False
    if now < 0:
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
            if job.flags & (FLAG_GROUP_OUT | FLAG_GROUP_COPY):
                release_group(state, job)  # it leaves its group's queue
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
    if q is None:
        q = state.queue_for_write(job.queue)
    job.queue = q.name  # share one bytes object per queue name
    q.jobs_in += 1
    q.atime = now
    # No evictable_discard: the evictable (acked, or RETRY 0 and delivered)
    # were refused above, and neither state is ever left.
    serve = bool(q.waiters) and not q.flags & PAUSED_OUT
    if ext is not None and ext.group is not None:
        # Ordered groups: the job waits behind its group unless it is the
        # group's next job now (groups.py).
        update_awake_time(state, job)
        state.memory.add(QUEUE_ENTRY_BYTES)
        if groups.place(state, q, job, ext.group) and serve:
            serve_blocked_clients(state, q)
        return True
    if serve and not q.jobs and q.limit is None:
        # A client waits on an empty queue (a consumer blocked in GETJOB): it
        # gets the job at once, which would otherwise enter the queue only
        # to be taken out again on the way to the client.
        _hand_over(state, q, first_waiter(q), job)
        # The schedule after the answer, which does not depend on it: the
        # consumer's wait ends with the write, and nothing else runs between.
        update_awake_time(state, job)
        return True
    update_awake_time(state, job)
    q.jobs.add(job)
    state.memory.add(QUEUE_ENTRY_BYTES)
    if serve:
        serve_blocked_clients(state, q)
    elif state.queues.asks and not q.waiters:
        # Nobody here waits for it, other nodes' consumers may: federation
        # offers it to them at the end of the turn (local consumers first:
        # one that waits takes it above, and a paused queue keeps it).
        state.events.jobs_unclaimed(state, q)
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
    if q is not None:
        ext = job.ext
        # A job of a group holds it from now on (groups.py).
        if (q.jobs.remove(job) if ext is None or ext.group is None
                else groups.dequeued(state, q, job, ext.group)):
            q.jobs_out += 1
            state.memory.sub(QUEUE_ENTRY_BYTES)
    # Queued and active jobs wake at the same time (see update_awake_time),
    # so the schedule needs no update here.
    job.state = ACTIVE
    return True


def fetch_job(state: ServerState, q: Queue, after: Job | None = None) -> Job | None:
    """Pop the next job of ``q`` for delivery to a client (GETJOB); with
    ``after``, the job this GETJOB took from ``q`` last (see :func:`fetch_jobs`)."""
    jobs = fetch_jobs(state, q, 1, after)
    return jobs[0] if jobs else None


def fetch_jobs(state: ServerState, q: Queue, count: int,
               after: Job | None = None) -> list[Job]:
    """Pop up to ``count`` of the next jobs of ``q`` for delivery (GETJOB
    COUNT), as many as its rate limit's window still lets through.

    In a queue with ordered groups, a job of a group is followed by the
    jobs after it in its group, up to ``count``; ``after`` (the job the
    same GETJOB took from ``q`` last, GETJOB ... FROM with several queues)
    continues such a run.
    """
    if q.groups is not None:
        return _fetch_grouped(state, q, count, after)
    queued = q.jobs
    count = min(count, len(queued))
    if not count:
        return []
    limit = q.limit
    if limit is not None:
        count = limit.take(state.clock.now_ms(), count)
        if not count:
            return []
    taken: list[Job] = []
    while len(taken) < count:  # not ``for _ in range``: compiled, ``_`` is boxed
        job = queued.pop_first()
        assert job is not None  # count <= len(queued)
        taken.append(job)
    q.jobs_out += count
    state.stats.delivered_jobs += count
    q.atime = state.clock.now_ms()
    state.memory.sub(QUEUE_ENTRY_BYTES * count)
    for job in taken:
        _delivered(state, job)
    return taken


def _fetch_grouped(state: ServerState, q: Queue, count: int, after: Job | None) -> list[Job]:
    """:func:`fetch_jobs` for a queue with ordered groups (groups.py): its
    order holds each group's next job; taking one holds the group, and the
    jobs waiting behind it come next in the reply (SQS FIFO's batches)."""
    now = state.clock.now_ms()
    limit = q.limit
    allowed = count if limit is None else min(count, limit.left(now))
    queued = q.jobs
    taken: list[Job] = []
    last = after
    while len(taken) < allowed:
        job = groups.follower(state, q, last) if last is not None else None
        if job is None:
            job = queued.pop_first()
            if job is None:
                break
            ext = job.ext
            if ext is not None and ext.group is not None:
                groups.taken(state, q, job, ext.group)
        taken.append(job)
        last = job
    if limit is not None:
        limit.take(now, len(taken))  # within what the window had left
        if len(taken) == allowed < count and (
                queued or (last is not None and groups.has_follower(q, last))):
            limit.limited += 1
    n = len(taken)
    if not n:
        return taken
    q.jobs_out += n
    state.stats.delivered_jobs += n
    q.atime = now
    state.memory.sub(QUEUE_ENTRY_BYTES * n)
    for job in taken:
        _delivered(state, job)
    return taken


def release_group(state: ServerState, job: Job) -> None:
    """``job`` (out, or a copy) stops holding its group (it was
    acknowledged, deleted, expired or moved to another queue; groups.py):
    the group's next job joins its queue's order, and the clients waiting
    on the queue get it."""
    if not job.flags & (FLAG_GROUP_OUT | FLAG_GROUP_COPY):
        return
    _serve_joined(state, groups.release(state, job))


def _serve_joined(state: ServerState, q: Queue | None) -> None:
    """A job joined ``q``'s order (a group moved on): serve its clients."""
    if q is not None and q.waiters and not q.flags & PAUSED_OUT:
        serve_blocked_clients(state, q)


def withdraw_job(state: ServerState, job: Job) -> bool:
    """Another node serves ``job``: a node that outranks us has it queued
    or out (QUEUED), a consumer works on it there (WORKING).  A job without
    a group is dequeued (DEQUEUE); a job of a group leaves its queue, or
    stops being out here, and stays as one of its group's copies, which
    holds the group's younger jobs here without holding the group
    (groups.py): the jobs are served where the other node serves them, in
    their order.  False if the job was neither queued nor out."""
    ext = job.ext
    if ext is None or ext.group is None:
        return dequeue_job(state, job)
    if job.state == QUEUED:
        q = state.queues.lookup(job.queue) if job.queue is not None else None
        if q is not None and groups.withdrawn(state, q, job, ext.group):
            q.jobs_out += 1
            state.memory.sub(QUEUE_ENTRY_BYTES)
        job.state = ACTIVE
        return True
    if job.flags & FLAG_GROUP_OUT:
        _serve_joined(state, groups.to_copy(state, job))
        return True
    return False


def requeue_group(state: ServerState, job: Job, now: int) -> bool:
    """The time came to queue ``job``, one of its group's copies here
    (FLAG_GROUP_COPY), again, and no node that has it queued or out said so
    (requeue.py): this node serves the group from now on.  Every copy of the
    group in the queue is queued with it, oldest first, so that none goes
    out before an older one (after a failure: the whole group, on one node,
    in order; after a restart: the node's jobs of the group, at the first
    RETRY).  False if ``job`` itself was not queued."""
    ext = job.ext
    assert ext is not None and ext.group is not None and job.queue is not None
    q = state.queue_for_write(job.queue)
    copies = groups.take_copies(state, q, ext.group)
    if not copies:  # not in the books after all: alone
        copies = [job]
    queued = False
    for copy in copies:
        if enqueue_job(state, copy, q=q, now=now):
            queued = queued or copy is job
        elif copy.state == ACTIVE and copy.retry and copy.qtime:
            groups.copy_in(state, copy)  # not queued (its queue, its state): a copy still
    return queued


def _delivered(state: ServerState, job: Job) -> None:
    """A job goes to a client (GETJOB): it is active, and delivered."""
    job.state = ACTIVE
    job.flags |= FLAG_DELIVERED
    if job.retry == 0:
        # At-most-once and delivered: may now be evicted under memory pressure.
        state.jobs.evictable_add(job)
    # The awake time is the same for queued and active jobs: no schedule update.


def set_pause(state: ServerState, q: Queue, flags: int) -> None:
    """Pause ``q`` in ``flags`` (PAUSED_IN, PAUSED_OUT); serve its waiting
    clients if it stopped being paused for output."""
    was_paused_out = q.paused_out
    q.flags = flags
    q.atime = state.clock.now_ms()
    if was_paused_out and not q.paused_out:
        if q.waiters:
            serve_blocked_clients(state, q)
        elif q.jobs and state.queues.asks:
            state.events.jobs_unclaimed(state, q)  # held back while paused


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
    """Give one job each to the clients waiting on ``q``, first come first
    served; if its rate limit stops that, wake them when the window opens."""
    served = 0
    while q.waiters and q.jobs and not q.paused_out:
        blocked = first_waiter(q)
        job = fetch_job(state, q)
        if job is None:
            if q.limit is not None:
                wake_when_window_opens(state, q)
            break
        _answer(state, q, blocked, job)
        served += 1
    return served


def _hand_over(state: ServerState, q: Queue, blocked: BlockedGet, job: Job) -> None:
    """Deliver ``job``, never queued, to ``blocked`` (counted as :func:`fetch_jobs` counts).

    The answer goes first: it reads none of what follows, and a consumer
    blocked in GETJOB waits for this write (the pickup latency).
    """
    _answer(state, q, blocked, job)
    q.jobs_out += 1
    state.stats.delivered_jobs += 1
    _delivered(state, job)


def first_waiter(q: Queue) -> BlockedGet:
    """The client that has waited longest on ``q`` (which has some).

    A loop rather than ``next(iter(...))``: compiled, it walks the dict in
    place where ``iter`` makes an iterator object.
    """
    for blocked in q.waiters:
        return blocked
    raise LookupError("no client waits on this queue")


def _answer(state: ServerState, q: Queue, blocked: BlockedGet, job: Job) -> None:
    """Unblock a GETJOB with ``job``, its one entry."""
    unblock(state, blocked, entries_reply(state, q, [job], blocked.fields))


# --------------------------------------------------------------------------
# Rate limits (QLIMIT, an extension: queue_limit.py, docs/EXTENSIONS.md)
# --------------------------------------------------------------------------

def set_rate_limit(state: ServerState, q: Queue, max_jobs: int, period_ms: int) -> None:
    """Limit ``q`` to ``max_jobs`` deliveries per ``period_ms`` (0 jobs: no
    limit).  A changed limit applies to the window under way; waiting
    clients are served at once if it lets more through."""
    limit = q.limit
    if max_jobs:
        if limit is None:
            limit = q.limit = QueueLimit(max_jobs, period_ms)
            state.queues.limited[q.name] = q
        else:
            limit.max_jobs = max_jobs
            limit.period_ms = period_ms
    elif limit is not None:
        limit.cancel_wake()
        q.limit = None
        state.queues.limited.pop(q.name, None)
    q.atime = state.clock.now_ms()
    state.events.queue_limit_changed(state, q)
    if q.waiters and not q.paused_out:
        if q.limit is not None:
            q.limit.cancel_wake()  # the window's end may have changed
        serve_blocked_clients(state, q)


def receive_qlimit(state: ServerState, sender: ClusterNode, msg: Message) -> None:
    """QLIMIT from another node (QLIMIT ... BCAST there): set the same limit
    (a period out of QLIMIT's range is not one: ignored)."""
    if msg.aux and not 0 < msg.period <= MAX_LIMIT_PERIOD_MS:
        return
    q = state.queues.lookup(msg.queue)
    if q is None:
        if not msg.aux:
            return
        q = state.queue_for_write(msg.queue)
    set_rate_limit(state, q, msg.aux, msg.period if msg.aux else 0)


def wake_when_window_opens(state: ServerState, q: Queue) -> None:
    """Arm ``q``'s one timer for the end of its full window (clients wait on
    it with jobs queued); nothing if it is armed or the window has room."""
    limit = q.limit
    if limit is None or limit.wake is not None:
        return
    now = state.clock.now_ms()
    if limit.left(now):
        return
    # One millisecond late rather than early: the window is over by then
    # on the node's clock, which the loop's timer does not follow exactly.
    delay = (limit.window_end - now + 1) / 1000
    limit.wake = state.event_loop().call_later(delay, _window_opened, state, q)


def _window_opened(state: ServerState, q: Queue) -> None:
    limit = q.limit
    if limit is None:
        return
    limit.wake = None
    if q.waiters and not q.paused_out:
        serve_blocked_clients(state, q)
