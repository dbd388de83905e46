"""Dead letters: a job that reached its MAXDELIVERIES moves to its
dead-letter queue instead of being queued again.

The move happens once, on the node that re-queues the job (from
``queue.enqueue_job``), and it is the *same* job that moves: same ID, body,
counters and TTL, now in the dead-letter queue (``DEADLETTER name``, or
``<queue>:dead``) and marked with the queue it came from.  A consumer of
the dead-letter queue acks it by that ID, and the ACK's GC removes every
copy as for any job.

The other copies learn the move from a REPLJOB with NOREPLY carrying the
moved job (queue and mark in the extension trailer, :mod:`disque.job_options`),
sent before the QUEUED of the re-queue (``state.events.job_dead_lettered``):
they drop theirs from the old queue (the mover has it queued now) and take
the new queue (``copies.merge_copy``), so none of them re-queues it in the
old one.  Were that message lost, a copy would still decide the same way at
its own re-queue, since the counters the limit is checked against travel
with every QUEUED.  An original node ignores the
trailer and keeps a plain job in the first queue.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .job import Job
from .job_options import dead_letter_queue

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["dead_letter"]

log: Final = logging.getLogger("disque.deadletter")


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
    # The AOF keeps the new queue, and the other copies learn the move.
    state.events.job_dead_lettered(state, job)
