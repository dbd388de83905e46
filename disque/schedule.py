"""When ``process_job`` must next look at a job: its awake time, and the
time of its next (re)queue.

A job's ``awakeme`` is the earliest of its expiry, its next (re)queue time
(500 ms early while the other copies must be warned with WILLQUEUE) and,
once acked, its next garbage-collection attempt (job.c:updateJobAwakeTime).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .clock import random_time_error
from .job import ACKED, ACTIVE, FLAG_BCAST_WILLQUEUE, QUEUED, Job

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["update_awake_time", "requeue_time", "WILLQUEUE_ADVANCE_MS"]

#: WILLQUEUE is sent this long before a job is requeued.
WILLQUEUE_ADVANCE_MS: Final = 500


def update_awake_time(state: ServerState, job: Job) -> None:
    """Recompute when ``process_job`` must next look at ``job`` (updateJobAwakeTime)."""
    when = job.etime
    job_state = job.state
    if job_state == ACKED:
        gc_at = job.qtime  # for acked jobs qtime holds the next GC attempt
        if gc_at and gc_at < when:
            when = gc_at
    elif job_state in (ACTIVE, QUEUED) and job.qtime:
        qtime = job.qtime
        if job.flags & FLAG_BCAST_WILLQUEUE:
            qtime -= WILLQUEUE_ADVANCE_MS
        if qtime < when:
            when = qtime
    if when != job.awakeme:
        state.jobs.schedule.move(job, state.shared_int(when))
        if when < state.job_timer_at:
            state.schedule_changed(when)


def requeue_time(state: ServerState, retry_s: int, now: int) -> int:
    """When a job delivered (or queued) at ``now`` is queued again: RETRY later.

    With the original's jitter (randomTimeError), so that the copies on
    several nodes do not all requeue at once; as a time object shared with
    the jobs that got the same value.
    """
    return state.shared_int(now + retry_s * 1000 + random_time_error())
