"""Dead letters: a job that reached its MAXDELIVERIES moves to its
dead-letter queue instead of being queued again.

The move happens once, on the node that re-queues the job (from
``queue.enqueue_job``), and it is the *same* job that moves: same ID, body,
counters and TTL, now in the dead-letter queue (``DEADLETTER name``, or
``<queue>:dead``) and marked with the queue it came from.  A consumer of
the dead-letter queue acks it by that ID, and the ACK's GC removes every
copy as for any job.

The other copies learn the move from a REPLJOB with NOREPLY carrying the
moved job (queue and mark in the extension trailer, :mod:`disque.jobext`),
sent before the QUEUED of the re-queue: they drop theirs from the old queue
(the mover has it queued now) and take the new queue, so none of them
re-queues it in the old one.  Were that message lost, a copy would still
decide the same way at its own re-queue, since the counters the limit is
checked against travel with every QUEUED.  An original node ignores the
trailer and keeps a plain job in the first queue.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .job import ACKED, QUEUED, Job
from .jobext import JobExt, dead_letter_queue

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["dead_letter", "merge_copy"]

log = logging.getLogger("disque.deadletter")


def dead_letter(state: ServerState, job: Job) -> None:
    """Move ``job`` (being re-queued by ``enqueue_job``) to its dead-letter queue."""
    ext = job.ext
    assert ext is not None and job.queue is not None
    source = job.queue
    ext.dead_from = source
    job.queue = state.queue_for_write(dead_letter_queue(job)).name
    q = state.queues.lookup(source)
    if q is not None:
        q.dead_lettered += 1
    state.stats.dead_lettered_jobs += 1
    log.info("Job %s dead-lettered from %r to %r after %d deliveries", job.id.decode(),
             source, job.queue, ext.max_deliveries)
    state.on_job_moved(job)  # the AOF keeps the new queue
    if len(job.delivered) > 1:
        from .replication import broadcast_repljob_noreply
        broadcast_repljob_noreply(state, job)


def merge_copy(state: ServerState, job: Job, copy: Job) -> None:
    """A copy of a job we hold arrived (REPLJOB, YOURJOBS): if it was
    dead-lettered elsewhere and ours not yet, move ours the same way."""
    theirs = copy.ext
    if theirs is None or not theirs.dead_from or copy.queue is None or job.state == ACKED:
        return
    ours = job.ext
    if ours is not None and ours.dead_from:
        return
    if job.state == QUEUED:
        from .queue import dequeue_job
        dequeue_job(state, job)  # queued by the mover in the dead-letter queue now
    moved = JobExt(theirs.backoff, theirs.max_deliveries, theirs.dead_letter, theirs.dead_from)
    moved.nack_pending = ours.nack_pending if ours is not None else False
    job.ext = moved
    job.queue = state.queue_for_write(copy.queue).name
    state.on_job_moved(job)
