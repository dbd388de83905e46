"""REGISTER and UNREGISTER: a job enters and leaves this node's job table.

Unregistering tells the layers above through ``state.events``: a client
waiting for the job's copies gets -NOREPL, WAITJOB clients -NOJOB, and the
AOF logs the deletion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .job import ACKED, FLAG_DELIVERED, QUEUED, Job
from .job_table import job_memory
from .queue import dequeue_job, release_group
from .schedule import update_awake_time

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["register_job", "unregister_job"]


def register_job(state: ServerState, job: Job, schedule: bool = True) -> bool:
    """Add a job to the registry and the schedule; False if the ID exists.

    ``schedule=False``: not in the schedule (a job waiting for its copies,
    whose expiry the replication timer watches: it is scheduled once
    queued, rather than scheduled at its expiry and moved a moment later).
    """
    if not state.jobs.add(job):
        if state.jobs.get(job.id) is not job:
            state.jobs.schedule.discard(job)  # ADDJOB scheduled it before registering
        return False
    state.memory.add(job_memory(job))
    job_state = job.state
    if job_state == ACKED or (job.retry == 0 and job.flags & FLAG_DELIVERED
                              and job_state != QUEUED):
        state.jobs.evictable_add(job)
    if schedule and not job.awakeme:  # else already scheduled (ADDJOB enqueues first)
        update_awake_time(state, job)
    return True


def unregister_job(state: ServerState, job: Job) -> None:
    """UNREGISTER(job): delete the job from memory and, if queued, its queue."""
    if job.state == QUEUED:
        dequeue_job(state, job)
    ext = job.ext
    if ext is not None and ext.group is not None:
        release_group(state, job)  # expired, deleted or evicted: its group goes on
    removed = state.jobs.remove(job)
    if removed:
        state.memory.sub(job_memory(job))
    state.events.job_unregistered(state, job, removed)
