"""The job registry, the one "awake-me" schedule, and ``process_job``.

There is no timer per job.  Every job has one ``awakeme`` time: the earliest
of its expiry, its next (re)queue time (500 ms early when the other copies
must be warned with WILLQUEUE) and, once acked, its next garbage-collection
attempt.  All jobs sit in one heap ordered by that time; the server arms a
single timer for the head of the heap and :func:`process_due_jobs` runs
:func:`process_job` on whatever is due.  That function is the only place
where time moves a job from one state to another (job.c:processJob).

The heap uses lazy deletion: when a job's ``awakeme`` changes a new entry is
pushed and the old one is skipped when it surfaces.  The heap is compacted
when stale entries outnumber live ones, so it stays O(live jobs).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .job import FLAG_BCAST_WILLQUEUE, FLAG_DELIVERED, Job, JobState
from .keyspace import SlicedDict, job_id_slice

if TYPE_CHECKING:
    from .state import ServerState

__all__ = [
    "JobRegistry",
    "AwakeSchedule",
    "register_job",
    "unregister_job",
    "update_awake_time",
    "process_job",
    "process_due_jobs",
    "JOB_OVERHEAD_BYTES",
]

#: WILLQUEUE is sent this long before a job is requeued.
WILLQUEUE_ADVANCE_MS = 500
#: At most this many due jobs are processed per timer run, so a burst of
#: expiries cannot stall the event loop; the rest run on the next turn.
MAX_JOBS_PER_RUN = 10_000

#: Bytes attributed to one job besides its body (object, ID, registry and
#: schedule entries); checked against tracemalloc in the tests.
JOB_OVERHEAD_BYTES = 430


class AwakeSchedule:
    """Min-heap of ``(awakeme, seq, job)`` with lazy deletion."""

    __slots__ = ("_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Job]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, job: Job) -> None:
        heapq.heappush(self._heap, (job.awakeme, next(self._seq), job))

    def next_time(self, registry: JobRegistry) -> int | None:
        """Awake time of the earliest live entry (stale heads are dropped)."""
        heap = self._heap
        while heap:
            when, _, job = heap[0]
            if job.awakeme == when and registry.get(job.id) is job:
                return when
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ms: int, registry: JobRegistry, limit: int) -> list[Job]:
        """Remove and return up to ``limit`` live jobs whose time has come."""
        heap = self._heap
        due: list[Job] = []
        while heap and heap[0][0] <= now_ms and len(due) < limit:
            when, _, job = heapq.heappop(heap)
            if job.awakeme == when and registry.get(job.id) is job:
                job.awakeme = 0  # no live entry any more: update_awake_time pushes a new one
                due.append(job)
        return due

    def compact(self, registry: JobRegistry) -> None:
        """Drop stale entries when they make up most of the heap."""
        if len(self._heap) > 2 * len(registry) + 1024:
            self._heap = [e for e in self._heap
                          if e[2].awakeme == e[0] and registry.get(e[2].id) is e[2]]
            heapq.heapify(self._heap)

    def clear(self) -> None:
        self._heap.clear()


class JobRegistry:
    """All jobs this node holds, by ID, scannable with JSCAN.

    ``evictable`` keeps, oldest first, the jobs that memory eviction may drop
    without breaking a guarantee: acked jobs and delivered RETRY-0 jobs.
    """

    __slots__ = ("_evictable", "_jobs", "schedule")

    def __init__(self) -> None:
        self._jobs: SlicedDict[bytes, Job] = SlicedDict(job_id_slice)
        self.schedule = AwakeSchedule()
        self._evictable: dict[Job, None] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: bytes) -> Job | None:
        return self._jobs.get(job_id)

    def all(self) -> Iterator[Job]:
        return self._jobs.values()

    def scan(self, cursor: int, count: int, accept=None):
        return self._jobs.scan(cursor, count, accept)

    def evictable_add(self, job: Job) -> None:
        self._evictable[job] = None

    def evictable_discard(self, job: Job) -> None:
        self._evictable.pop(job, None)

    def oldest_evictable(self) -> Job | None:
        return next(iter(self._evictable), None)

    def clear(self) -> None:
        self._jobs.clear()
        self.schedule.clear()
        self._evictable.clear()

    # Used by register_job/unregister_job only.
    def _add(self, job: Job) -> bool:
        return self._jobs.add(job.id, job)

    def _remove(self, job: Job) -> bool:
        self._evictable.pop(job, None)
        return self._jobs.pop(job.id) is not None


def job_memory(job: Job) -> int:
    return JOB_OVERHEAD_BYTES + len(job.body)


def register_job(state: ServerState, job: Job) -> bool:
    """Add a job to the registry and the schedule; False if the ID exists."""
    if not state.jobs._add(job):
        return False
    state.memory.add(job_memory(job))
    if job.state == JobState.ACKED or (job.retry == 0 and job.flags & FLAG_DELIVERED
                                       and job.state != JobState.QUEUED):
        state.jobs.evictable_add(job)
    update_awake_time(state, job)
    return True


def unregister_job(state: ServerState, job: Job) -> None:
    """UNREGISTER(job): delete the job from memory and, if queued, its queue."""
    from .queue import dequeue_job

    if job.state == JobState.QUEUED:
        dequeue_job(state, job)
    if state.jobs._remove(job):
        state.memory.sub(job_memory(job))
        state.on_job_unregistered(job)


# --------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------

def update_awake_time(state: ServerState, job: Job) -> None:
    """Recompute when ``process_job`` must next look at ``job`` (updateJobAwakeTime)."""
    when = job.etime
    if job.state == JobState.ACKED:
        gc_at = job.qtime  # for acked jobs qtime holds the next GC attempt
        if gc_at and gc_at < when:
            when = gc_at
    elif job.state in (JobState.ACTIVE, JobState.QUEUED) and job.qtime:
        qtime = job.qtime
        if job.flags & FLAG_BCAST_WILLQUEUE:
            qtime -= WILLQUEUE_ADVANCE_MS
        if qtime < when:
            when = qtime
    if when != job.awakeme:
        job.awakeme = when
        state.jobs.schedule.push(job)
        state.schedule_changed(when)


def process_job(state: ServerState, job: Job, now: int) -> None:
    """Everything time does to a job, in the original's order (job.c:processJob)."""
    from . import ack
    from .queue import enqueue_job

    # 1. Expired: the job goes away whatever its state.
    if now >= job.etime:
        unregister_job(state, job)
        state.stats.expired_jobs += 1
        return
    state_ = job.state
    # 2. 500 ms before requeueing, warn the other copies so that one that has
    #    it queued can answer QUEUED and we don't queue it twice.
    if (state_ in (JobState.ACTIVE, JobState.QUEUED) and job.flags & FLAG_BCAST_WILLQUEUE
            and job.qtime - WILLQUEUE_ADVANCE_MS <= now):
        if state_ == JobState.ACTIVE:
            state.cluster.broadcast_willqueue(job)
        job.flags &= ~FLAG_BCAST_WILLQUEUE
    # 3. Active and its queue time came: (re)queue it.  A queue paused for
    #    input does not take it; try again a RETRY later.
    if state_ == JobState.ACTIVE and job.qtime and job.qtime <= now:
        q = state.queues.lookup(job.queue) if job.queue is not None else None
        if q is not None and q.paused_in and job.retry > 0:
            from .clock import random_time_error
            job.qtime = now + job.retry * 1000 + random_time_error()
            job.flags |= FLAG_BCAST_WILLQUEUE
        elif not enqueue_job(state, job):
            # Nothing will ever queue it again (RETRY 0 after delivery).
            job.qtime = 0
    # 4. Still queued at its retry time (nobody fetched it): just postpone.
    elif state_ == JobState.QUEUED and job.qtime and job.qtime <= now and job.retry > 0:
        from .clock import random_time_error
        job.qtime = now + job.retry * 1000 + random_time_error()
        job.flags |= FLAG_BCAST_WILLQUEUE
    # 5. Acked: time for another garbage-collection attempt.
    elif state_ == JobState.ACKED and job.qtime and job.qtime <= now:
        ack.try_job_gc(state, job)
        if state.jobs.get(job.id) is not job:
            return
    update_awake_time(state, job)


def process_due_jobs(state: ServerState, now: int) -> int:
    """Run :func:`process_job` on every due job (bounded per call)."""
    due = state.jobs.schedule.pop_due(now, state.jobs, MAX_JOBS_PER_RUN)
    for job in due:
        if state.jobs.get(job.id) is job:
            process_job(state, job, now)
    state.jobs.schedule.compact(state.jobs)
    return len(due)
