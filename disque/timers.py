"""``process_job``: everything time does to a job (job.c:processJob).

The server arms one timer for the earliest job of the awake-me schedule
(``job_table.AwakeSchedule``) and runs :func:`process_due_jobs` when it
fires: this is the only place where time moves a job from one state to
another (expiry, WILLQUEUE, requeue, postponement, the next GC attempt).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from .ack import try_job_gc
from .job import ACKED, ACTIVE, FLAG_BCAST_WILLQUEUE, FLAG_GROUP_COPY, QUEUED, Job
from .job_options import retry_seconds
from .jobs import unregister_job
from .queue import enqueue_job, requeue_group
from .schedule import WILLQUEUE_ADVANCE_MS, requeue_time, update_awake_time

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["process_job", "process_due_jobs", "MAX_JOBS_PER_RUN"]

log: Final = logging.getLogger("disque.timers")

#: At most this many due jobs are processed per timer run, so a burst of
#: expiries cannot stall the event loop; the rest run on the next turn.
MAX_JOBS_PER_RUN: Final = 10_000


def process_job(state: ServerState, job: Job, now: int) -> None:
    """Everything time does to a job, in the original's order (job.c:processJob)."""
    # 1. Expired: the job goes away whatever its state.
    if now >= job.etime:
        unregister_job(state, job)
        state.stats.expired_jobs += 1
        return
    state_ = job.state
    # 2. 500 ms before requeueing, warn the other copies so that one that has
    #    it queued can answer QUEUED and we don't queue it twice.
    if (state_ in (ACTIVE, QUEUED) and job.flags & FLAG_BCAST_WILLQUEUE
            and job.qtime - WILLQUEUE_ADVANCE_MS <= now):
        if state_ == ACTIVE:
            state.cluster.broadcast_willqueue(job)
        if state_ == ACTIVE and job.qtime <= now and len(state.cluster.nodes) > 1:
            # The warning is late: the node was stopped (SIGSTOP, a VM
            # pause) or its loop blocked past the queue time.  Queueing in
            # the same breath would leave the others no time to answer
            # QUEUED, and after a stop our links are likely dead, so this
            # WILLQUEUE may be lost: warn again in 500 ms (on the links made
            # again by then), queue 500 ms after that.
            job.qtime = now + 2 * WILLQUEUE_ADVANCE_MS
        else:
            job.flags &= ~FLAG_BCAST_WILLQUEUE
    # 3. Active and its queue time came: (re)queue it.  A queue paused for
    #    input does not take it; try again a RETRY later.  One of an ordered
    #    group's copies here: no node that serves it answered the WILLQUEUE,
    #    so this node takes the whole group, its copies all queued at once
    #    (groups.py, "In a cluster").
    if state_ == ACTIVE and job.qtime and job.qtime <= now:
        q = state.queues.lookup(job.queue) if job.queue is not None else None
        if q is not None and q.paused_in and job.retry > 0:
            job.qtime = requeue_time(state, retry_seconds(job), now)
            job.flags |= FLAG_BCAST_WILLQUEUE
        elif not (requeue_group(state, job, now) if job.flags & FLAG_GROUP_COPY
                  else enqueue_job(state, job)):
            # Nothing will ever queue it again (RETRY 0 after delivery).
            job.qtime = 0
    # 4. Still queued at its retry time (nobody fetched it): postpone, and
    #    tell the other copies it is queued here (the spec's requeue timer
    #    sends QUEUED whatever the state).  If a QUEUED was lost while a link
    #    was down, two nodes may both hold the job queued, and only an
    #    active copy's WILLQUEUE would make them answer: with REPLICATE 2
    #    there is none, and the job would stay queued twice.  The copies
    #    that receive it postpone their own requeue; the one that ranks
    #    lower for this job drops its queued copy.
    elif state_ == QUEUED and job.qtime and job.qtime <= now and job.retry > 0:
        job.qtime = requeue_time(state, retry_seconds(job), now)
        job.flags |= FLAG_BCAST_WILLQUEUE
        state.cluster.broadcast_queued(job, nack=False, count=False)
    # 5. Acked: time for another garbage-collection attempt.
    elif state_ == ACKED and job.qtime and job.qtime <= now:
        try_job_gc(state, job)
        if state.jobs.get(job.id) is not job:
            return
    update_awake_time(state, job)


def process_due_jobs(state: ServerState, now: int) -> int:
    """Run :func:`process_job` on every due job (bounded per call)."""
    due = state.jobs.schedule.pop_due(now, MAX_JOBS_PER_RUN)
    for job in due:
        if state.jobs.get(job.id) is job:  # not forgotten by an earlier one of this run
            try:
                process_job(state, job, now)
            except Exception:  # a bug: say it loudly, keep the job scheduled and the node up
                log.exception("Error processing job %s", job.id.decode())
                if state.jobs.get(job.id) is job and not job.awakeme:
                    update_awake_time(state, job)
    return len(due)
