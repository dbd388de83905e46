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
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .job import ACKED, ACTIVE, B64_VALUE, FLAG_BCAST_WILLQUEUE, FLAG_DELIVERED, QUEUED, Job
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
JOB_OVERHEAD_BYTES = 470


class AwakeSchedule:
    """Jobs by awake time, in buckets of ``2**BUCKET_SHIFT`` ms, with lazy deletion.

    A bucket is a plain list of jobs and a heap orders the bucket numbers.
    Compared with a heap of ``(awakeme, seq, job)`` tuples this costs one
    list slot per job instead of a tuple and a sequence number (~100 bytes),
    and leaves the cyclic GC one object fewer per job to walk.  Precision is
    not affected: a bucket is opened when its first millisecond is due and
    only its jobs whose own ``awakeme`` has come are taken.

    An entry is live while the job is registered and its ``awakeme`` still
    falls in the bucket; stale entries are skipped when their bucket is
    opened, and dropped by :meth:`compact` when they outnumber live ones.
    """

    __slots__ = ("_buckets", "_entries", "_keys")

    #: Bucket width: 16 ms.
    BUCKET_SHIFT = 4

    def __init__(self) -> None:
        self._buckets: dict[int, list[Job]] = {}
        self._keys: list[int] = []   # heap of the bucket numbers in _buckets
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, stale ones included."""
        return self._entries

    def push(self, job: Job) -> None:
        key = job.awakeme >> self.BUCKET_SHIFT
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [job]
            heapq.heappush(self._keys, key)
        else:
            bucket.append(job)
        self._entries += 1

    def _live(self, key: int, bucket: list[Job], registry: JobRegistry) -> list[Job]:
        shift = self.BUCKET_SHIFT
        get = registry.get
        return [job for job in bucket if job.awakeme >> shift == key and get(job.id) is job]

    def next_time(self, registry: JobRegistry) -> int | None:
        """Awake time of the earliest live entry (stale entries are dropped)."""
        keys, buckets = self._keys, self._buckets
        while keys:
            key = keys[0]
            bucket = buckets[key]
            live = self._live(key, bucket, registry)
            self._entries -= len(bucket) - len(live)
            if live:
                buckets[key] = live
                return min(job.awakeme for job in live)
            heapq.heappop(keys)
            del buckets[key]
        return None

    def pop_due(self, now_ms: int, registry: JobRegistry, limit: int) -> list[Job]:
        """Remove and return up to ``limit`` live jobs whose time has come."""
        keys, buckets = self._keys, self._buckets
        shift = self.BUCKET_SHIFT
        get = registry.get
        due: list[Job] = []
        while keys and keys[0] << shift <= now_ms and len(due) < limit:
            key = heapq.heappop(keys)
            bucket = buckets.pop(key)
            self._entries -= len(bucket)
            later: list[Job] = []
            for job in bucket:
                when = job.awakeme
                if when >> shift != key or get(job.id) is not job:
                    continue  # stale
                if when <= now_ms and len(due) < limit:
                    job.awakeme = 0  # no live entry any more: update_awake_time pushes one
                    due.append(job)
                else:
                    later.append(job)
            if later:
                # Not due yet (or over the limit): nothing after this bucket is due either.
                buckets[key] = later
                heapq.heappush(keys, key)
                self._entries += len(later)
                break
        return due

    def compact(self, registry: JobRegistry) -> None:
        """Drop stale entries when they make up most of the schedule."""
        if self._entries <= 2 * len(registry) + 1024:
            return
        buckets: dict[int, list[Job]] = {}
        for key, bucket in self._buckets.items():
            live = list(dict.fromkeys(self._live(key, bucket, registry)))
            if live:
                buckets[key] = live
        self._buckets = buckets
        self._keys = list(buckets)
        heapq.heapify(self._keys)
        self._entries = sum(len(bucket) for bucket in buckets.values())

    def clear(self) -> None:
        self._buckets.clear()
        self._keys.clear()
        self._entries = 0


class JobRegistry:
    """All jobs this node holds, by ID, scannable with JSCAN.

    ``evictable`` keeps, oldest first, the jobs that memory eviction may drop
    without breaking a guarantee: acked jobs and delivered RETRY-0 jobs.
    """

    __slots__ = ("_evictable", "_jobs", "_slices", "schedule")

    def __init__(self) -> None:
        self._jobs: SlicedDict[bytes, Job] = SlicedDict(job_id_slice)
        self._slices = self._jobs.slices
        self.schedule = AwakeSchedule()
        self._evictable: dict[Job, None] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def get(self, job_id: bytes) -> Job | None:
        # job_id_slice inlined: this runs several times per command.
        return self._slices[(B64_VALUE[job_id[11]] << 6) | B64_VALUE[job_id[12]]].get(job_id)

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
    state.memory.accounted += JOB_OVERHEAD_BYTES + len(job.body)
    job_state = job.state
    if job_state == ACKED or (job.retry == 0 and job.flags & FLAG_DELIVERED
                              and job_state != QUEUED):
        state.jobs.evictable_add(job)
    if not job.awakeme:  # else already scheduled (ADDJOB enqueues before registering)
        update_awake_time(state, job)
    return True


def unregister_job(state: ServerState, job: Job) -> None:
    """UNREGISTER(job): delete the job from memory and, if queued, its queue."""
    if job.state == QUEUED:
        from .queue import dequeue_job
        dequeue_job(state, job)
    if state.jobs._remove(job):
        state.memory.accounted -= JOB_OVERHEAD_BYTES + len(job.body)
        if state.job_removed_hooks:
            state.on_job_unregistered(job)


# --------------------------------------------------------------------------
# The schedule
# --------------------------------------------------------------------------

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
    if (state_ in (ACTIVE, QUEUED) and job.flags & FLAG_BCAST_WILLQUEUE
            and job.qtime - WILLQUEUE_ADVANCE_MS <= now):
        if state_ == ACTIVE:
            state.cluster.broadcast_willqueue(job)
        job.flags &= ~FLAG_BCAST_WILLQUEUE
    # 3. Active and its queue time came: (re)queue it.  A queue paused for
    #    input does not take it; try again a RETRY later.
    if state_ == ACTIVE and job.qtime and job.qtime <= now:
        q = state.queues.lookup(job.queue) if job.queue is not None else None
        if q is not None and q.paused_in and job.retry > 0:
            from .clock import random_time_error
            job.qtime = now + job.retry * 1000 + random_time_error()
            job.flags |= FLAG_BCAST_WILLQUEUE
        elif not enqueue_job(state, job):
            # Nothing will ever queue it again (RETRY 0 after delivery).
            job.qtime = 0
    # 4. Still queued at its retry time (nobody fetched it): just postpone.
    elif state_ == QUEUED and job.qtime and job.qtime <= now and job.retry > 0:
        from .clock import random_time_error
        job.qtime = now + job.retry * 1000 + random_time_error()
        job.flags |= FLAG_BCAST_WILLQUEUE
    # 5. Acked: time for another garbage-collection attempt.
    elif state_ == ACKED and job.qtime and job.qtime <= now:
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
