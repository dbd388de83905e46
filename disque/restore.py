"""What a restart makes of the jobs read back from the AOF (the spec's
"Disque and disk persistence").

Jobs come back in memory but are not queued: a job that was queued or
active is active again and is requeued by its retry timer at
``now + DELAY + RETRY ± 250 ms``; RETRY-0 jobs get no queue time at all, so
a reload never queues them.  Acked jobs resume their garbage collection.
With ``aof-enqueue-jobs-once`` (``restore_queues``) queued jobs are queued
again, counters untouched, delayed jobs that were never queued are queued
when their delay ends, and delivered ones wait RETRY as after a delivery.

A job of an ordered group (GROUP, groups.py) that comes back active is
one of its group's copies until it is queued again: no younger job of the
group goes out before it.  The first of them whose RETRY comes queues all
of them (``queue.requeue_group``), so the group goes out again in its order
(RETRY-0 jobs, never queued again, hold nothing).  In a cluster, a node
that took the group over meanwhile answers the WILLQUEUE and keeps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .ack import gc_retry_delay_ms
from .groups import copy_in
from .job import FLAG_BCAST_QUEUED, FLAG_BCAST_WILLQUEUE, FLAG_DELIVERED, Job, JobState
from .job_options import retry_seconds
from .jobs import register_job
from .queue import enqueue_job
from .schedule import requeue_time

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["apply_loaded_jobs"]


def apply_loaded_jobs(state: ServerState, jobs: Iterable[Job],
                      restore_queues: bool) -> dict[str, int]:
    """Register replayed jobs: active (requeued later by RETRY) or, once, queued."""
    now = state.clock.now_ms()
    counts = {"loaded": 0, "queued": 0, "expired": 0}
    to_enqueue: list[Job] = []
    node_sets: dict[frozenset[str], frozenset[str]] = {}
    names: dict[bytes, bytes] = {}
    for job in jobs:
        if job.etime <= now:
            counts["expired"] += 1
            continue
        queued_again = False
        job.delivered = node_sets.setdefault(job.delivered, job.delivered)
        if job.queue is not None:
            job.queue = names.setdefault(job.queue, job.queue)
        if job.state == JobState.ACKED:
            job.confirmed = frozenset()
            job.qtime = now + gc_retry_delay_ms(0)
        elif job.queue is None:
            continue  # a job without a queue is meaningless
        else:
            was_queued = job.state == JobState.QUEUED
            job.state = JobState.ACTIVE
            job.flags &= ~FLAG_BCAST_WILLQUEUE
            if restore_queues:
                if was_queued:
                    job.qtime = now  # enqueue_job needs a queue time
                    to_enqueue.append(job)
                    queued_again = True
                elif not job.flags & FLAG_BCAST_QUEUED:
                    # Delayed and never queued: queue it when its delay ends.
                    job.qtime = max(now, job.ctime // 1_000_000 + job.delay * 1000)
                elif job.retry:
                    # Delivered: requeue RETRY after now, as after a delivery.
                    job.qtime = requeue_time(state, retry_seconds(job), now)
                    job.flags |= FLAG_BCAST_WILLQUEUE
                else:
                    job.qtime = 0   # a delivered RETRY-0 job is never queued again
            elif job.retry:
                job.qtime = requeue_time(state, job.delay + retry_seconds(job), now)
                job.flags |= FLAG_BCAST_WILLQUEUE
                if not job.flags & FLAG_DELIVERED:
                    # Not known to have been delivered: requeueing it is not
                    # an additional delivery (the original counted one).
                    job.flags &= ~FLAG_BCAST_QUEUED
            else:
                job.qtime = 0   # RETRY 0: a reload never queues it
        if register_job(state, job):
            counts["loaded"] += 1
            ext = job.ext
            if (ext is not None and ext.group is not None and job.qtime
                    and job.state == JobState.ACTIVE and not queued_again):
                copy_in(state, job)
    # In creation order: a queue's (and a group's) jobs then go in at its end.
    to_enqueue.sort(key=_ctime)
    for job in to_enqueue:
        # Restore the queued state exactly: with BCAST_QUEUED clear the
        # enqueue is the silent kind (no additional delivery counted, no
        # QUEUED broadcast) and sets the flag back.
        had_bcast = job.flags & FLAG_BCAST_QUEUED
        job.flags &= ~FLAG_BCAST_QUEUED
        if enqueue_job(state, job):
            counts["queued"] += 1
        else:
            job.flags |= had_bcast
    return counts


def _ctime(job: Job) -> int:
    return job.ctime
