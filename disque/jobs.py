"""The job registry, the one "awake-me" schedule, and ``process_job``.

There is no timer per job.  Every job has one ``awakeme`` time: the earliest
of its expiry, its next (re)queue time (500 ms early when the other copies
must be warned with WILLQUEUE) and, once acked, its next garbage-collection
attempt.  All jobs sit in one schedule ordered by that time
(:class:`AwakeSchedule`); the server arms a single timer for its earliest
job and :func:`process_due_jobs` runs :func:`process_job` on whatever is
due.  That function is the only place where time moves a job from one state
to another (job.c:processJob).

A job is in the schedule exactly once while registered: rescheduling moves
it and forgetting it takes it out, both in O(1).
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Final

from . import _native
from .clock import random_time_error
from .job import (
    ACKED,
    ACTIVE,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELIVERED,
    QUEUED,
    Job,
)
from .jobext import retry_seconds
from .keyspace import SlicedDict, job_id_slice

if TYPE_CHECKING:
    from .state import ServerState

log = logging.getLogger("disque.jobs")

__all__ = [
    "JobRegistry",
    "AwakeSchedule",
    "register_job",
    "unregister_job",
    "update_awake_time",
    "requeue_time",
    "process_job",
    "process_due_jobs",
    "JOB_OVERHEAD_BYTES",
]

#: WILLQUEUE is sent this long before a job is requeued.
WILLQUEUE_ADVANCE_MS: Final = 500
#: At most this many due jobs are processed per timer run, so a burst of
#: expiries cannot stall the event loop; the rest run on the next turn.
MAX_JOBS_PER_RUN: Final = 10_000

#: Bytes attributed to one job besides its body (object, ID, times, registry
#: and schedule entries); checked against tracemalloc in the tests, and
#: matching the RSS per job of ``benchmarks.run memory`` (1 M jobs of 100
#: bytes: 517 B each compiled).  The compiled Job keeps its fields unboxed
#: and is smaller; interpreted, jobs share time objects under load
#: (ServerState.shared_int): ~400 bytes at tens of jobs per ms and ~470 at
#: one per ms.
JOB_OVERHEAD_BYTES: Final = 410 if _native.MODE == "compiled" else 450


class AwakeSchedule:
    """Jobs by awake time, in buckets of ``2**BUCKET_SHIFT`` ms.

    A bucket is a dict used as an ordered set of jobs; a heap orders the
    bucket numbers.  A job is in exactly one bucket while it has an awake
    time (``job.awakeme``): moving or forgetting a job takes it out of its
    bucket in O(1), so the schedule never holds a job the node dropped.
    (A lazily-deleted heap, as here before, kept every acked job and its
    body alive until its old awake time, up to RETRY later: hundreds of
    megabytes under a sustained ACK load.)  Precision is per job: a bucket
    is opened when its first millisecond is due and only its jobs whose own
    ``awakeme`` has come are taken.

    Compared with a heap of ``(awakeme, seq, job)`` tuples this costs one
    dict slot per job instead of a tuple and a sequence number, and leaves
    the cyclic GC one object fewer per job to walk.
    """

    __slots__ = ("_buckets", "_heaped", "_keys")

    #: Bucket width: 16 ms.
    BUCKET_SHIFT: Final = 4

    def __init__(self) -> None:
        # Emptied buckets are deleted at once: a dict keeps its table after
        # its entries go, and a bucket may have held thousands of jobs.
        self._buckets: dict[int, dict[Job, None]] = {}
        self._keys: list[int] = []    # heap of bucket numbers (some maybe emptied since)
        self._heaped: set[int] = set()  # the numbers in _keys, so each is pushed once

    def __len__(self) -> int:
        """Jobs scheduled."""
        return sum(map(len, self._buckets.values()))

    def move(self, job: Job, when: int) -> None:
        """Schedule ``job`` at ``when`` (ms), wherever it was before."""
        if job.awakeme:
            self.discard(job)
        job.awakeme = when
        key = when >> self.BUCKET_SHIFT
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = {}
            if key not in self._heaped:
                self._heaped.add(key)
                heapq.heappush(self._keys, key)
        bucket[job] = None

    def discard(self, job: Job) -> None:
        """Take ``job`` out of the schedule (its awake time becomes 0)."""
        when = job.awakeme
        if when:
            key = when >> self.BUCKET_SHIFT
            bucket = self._buckets.get(key)
            if bucket is not None:
                if job in bucket:  # not pop(job, None): compiled, a Python-level call
                    del bucket[job]
                if not bucket:
                    del self._buckets[key]
                    if len(self._keys) > 2 * len(self._buckets) + 1024:
                        self._rebuild_keys()
            job.awakeme = 0

    def _rebuild_keys(self) -> None:
        """Drop the heap's numbers of emptied buckets.

        They would otherwise stay until their time comes: a job acked long
        before its expiry (RETRY 0, a TTL of days) leaves one behind.
        """
        self._keys = list(self._buckets)
        heapq.heapify(self._keys)
        self._heaped = set(self._keys)

    def _pop_key(self) -> None:
        key = heapq.heappop(self._keys)
        self._heaped.discard(key)
        self._buckets.pop(key, None)

    def next_time(self) -> int | None:
        """Awake time of the earliest scheduled job (empty buckets are dropped)."""
        keys, buckets = self._keys, self._buckets
        while keys:
            bucket = buckets.get(keys[0])
            if bucket:
                return min(job.awakeme for job in bucket)
            self._pop_key()
        return None

    def pop_due(self, now_ms: int, limit: int) -> list[Job]:
        """Remove and return up to ``limit`` jobs whose time has come, earliest buckets first."""
        keys, buckets = self._keys, self._buckets
        shift = self.BUCKET_SHIFT
        due: list[Job] = []
        while keys and keys[0] << shift <= now_ms and len(due) < limit:
            bucket = buckets.get(keys[0])
            if bucket:
                # Stop scanning at the limit: a bucket may hold a million jobs
                # (e.g. loaded ones expiring in the same second).
                taken = list(islice((job for job in bucket if job.awakeme <= now_ms),
                                    limit - len(due)))
                for job in taken:
                    del bucket[job]
                    job.awakeme = 0  # unscheduled: update_awake_time schedules it again
                    due.append(job)
                if bucket:
                    break  # not due yet, or over the limit: nothing later is due either
            self._pop_key()
        return due

    def clear(self) -> None:
        self._buckets.clear()
        self._keys.clear()
        self._heaped.clear()


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
        return self._slices[job_id_slice(job_id)].get(job_id)

    def all(self) -> Iterator[Job]:
        return self._jobs.values()

    def scan(self, cursor: int, count: int,
             accept: Callable[[Job], bool] | None = None) -> tuple[int, list[Job]]:
        return self._jobs.scan(cursor, count, accept)

    def evictable_add(self, job: Job) -> None:
        self._evictable[job] = None

    def evictable_discard(self, job: Job) -> None:
        if job in self._evictable:  # not pop(job, None): compiled, a Python-level call
            del self._evictable[job]

    def oldest_evictable(self) -> Job | None:
        return next(iter(self._evictable), None)

    def clear(self) -> None:
        self._jobs.clear()
        self.schedule.clear()
        self._evictable.clear()

    # Used by register_job/unregister_job only.
    def _add(self, job: Job) -> bool:
        job_id = job.id
        return self._jobs.add_at(job_id_slice(job_id), job_id, job)

    def _remove(self, job: Job) -> bool:
        self.evictable_discard(job)
        self.schedule.discard(job)
        job_id = job.id
        return self._jobs.pop_at(job_id_slice(job_id), job_id) is not None


def job_memory(job: Job) -> int:
    return JOB_OVERHEAD_BYTES + len(job.body)


def register_job(state: ServerState, job: Job, schedule: bool = True) -> bool:
    """Add a job to the registry and the schedule; False if the ID exists.

    ``schedule=False``: not in the schedule (a job waiting for its copies,
    whose expiry the replication timer watches: it is scheduled once
    queued, rather than scheduled at its expiry and moved a moment later).
    """
    if not state.jobs._add(job):
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
        from .queue import dequeue_job
        dequeue_job(state, job)
    if state.replicating and job.id in state.replicating:
        from .replication import replication_removed
        replication_removed(state, job)  # its ADDJOB gets -NOREPL
    if state.job_waiters and job.state != ACKED and job.id in state.job_waiters:
        from .completion import job_removed
        job_removed(state, job.id)  # WAITJOB: gone without an ACK
    if state.jobs._remove(job):
        state.memory.sub(job_memory(job))
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
    #    input does not take it; try again a RETRY later.
    if state_ == ACTIVE and job.qtime and job.qtime <= now:
        q = state.queues.lookup(job.queue) if job.queue is not None else None
        if q is not None and q.paused_in and job.retry > 0:
            job.qtime = requeue_time(state, retry_seconds(job), now)
            job.flags |= FLAG_BCAST_WILLQUEUE
        elif not enqueue_job(state, job):
            # Nothing will ever queue it again (RETRY 0 after delivery).
            job.qtime = 0
    # 4. Still queued at its retry time (nobody fetched it): just postpone.
    elif state_ == QUEUED and job.qtime and job.qtime <= now and job.retry > 0:
        job.qtime = requeue_time(state, retry_seconds(job), now)
        job.flags |= FLAG_BCAST_WILLQUEUE
    # 5. Acked: time for another garbage-collection attempt.
    elif state_ == ACKED and job.qtime and job.qtime <= now:
        ack.try_job_gc(state, job)
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
