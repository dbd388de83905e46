"""DEBUG FLUSHALL and CLUSTER RESET: drop every job and every queue."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .queue_table import QUEUE_OVERHEAD_BYTES
from .replication import abort_all
from .waitjob import job_removed

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["flush_all"]


def flush_all(state: ServerState) -> None:
    """Drop every job and every queue.

    ADDJOBs waiting for copies get -NOREPL (their partial copies are
    deleted), WAITJOB clients -NOJOB, and the AOF logs every deletion.
    Queues with blocked clients are kept (empty) so those clients stay
    blocked and are served by the next job, as if the queue was new.
    """
    if state.replicating:
        abort_all(state)
    for job_id in list(state.job_waiters):
        job_removed(state, job_id)
    for job in list(state.jobs.all()):
        state.events.job_unregistered(state, job, True)
    state.jobs.clear()
    state.idmp.clear()
    kept = []
    for q in list(state.queues.all()):
        if q.waiters:
            q.jobs.clear()
            q.groups = None  # their jobs are gone (groups.py)
            kept.append(q)
    state.queues.clear()
    state.memory.accounted = 0
    for q in kept:
        state.queues.add(q)
        state.memory.add(QUEUE_OVERHEAD_BYTES + len(q.name))
