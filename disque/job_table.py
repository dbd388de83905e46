"""The job table: every job this node holds, by ID, and the one "awake-me"
schedule.

There is no timer per job.  Every job has one ``awakeme`` time: the earliest
of its expiry, its next (re)queue time (500 ms early when the other copies
must be warned with WILLQUEUE) and, once acked, its next garbage-collection
attempt.  All jobs sit in one schedule ordered by that time
(:class:`AwakeSchedule`); the server arms a single timer for its earliest
job and ``timers.process_due_jobs`` runs ``process_job`` on whatever is due
(job.c:processJob).  A job is in the schedule exactly once while registered:
rescheduling moves it and forgetting it takes it out, both in O(1).

This module holds the data; the procedures that change it are
``jobs.register_job`` / ``unregister_job`` and ``schedule.update_awake_time``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Final

from . import _native
from .job import Job
from .keyspace import SlicedDict, job_id_slice
from .time_buckets import TimeBuckets

__all__ = ["AwakeSchedule", "JobRegistry", "JOB_OVERHEAD_BYTES", "HEADER_OVERHEAD_BYTES",
           "HEADERS_OVERHEAD_BYTES", "GROUP_KEY_BYTES", "EXT_BYTES", "job_memory",
           "headers_memory"]

#: Bytes attributed to one job besides its body (object, ID, times, registry
#: and schedule entries); checked against tracemalloc in the tests, and
#: matching the RSS per job of ``benchmarks.run memory`` (1 M jobs of 100
#: bytes: 517 B each compiled).  The compiled Job keeps its fields unboxed
#: and is smaller; interpreted, jobs share time objects under load
#: (ServerState.shared_int): ~400 bytes at tens of jobs per ms and ~470 at
#: one per ms.
JOB_OVERHEAD_BYTES: Final = 410 if _native.activate() == "compiled" else 450
#: Bytes attributed to a job's headers besides their names and values: per
#: header (two bytes objects and their slots in the tuple), and once per job
#: with headers (its extension object and the tuple); checked against
#: tracemalloc in the tests.
HEADER_OVERHEAD_BYTES: Final = 88
HEADERS_OVERHEAD_BYTES: Final = 136
#: Bytes attributed to a job's group key besides its length (the bytes
#: object), and to the extension object of a job that has a group and no
#: headers (with headers, HEADERS_OVERHEAD_BYTES counts it); checked
#: against tracemalloc in the tests.
GROUP_KEY_BYTES: Final = 33
EXT_BYTES: Final = 96


class AwakeSchedule:
    """Jobs by awake time, in buckets of ``2**BUCKET_SHIFT`` ms (time_buckets.py).

    A job is in exactly one bucket while it has an awake time
    (``job.awakeme``): moving or forgetting a job takes it out of its bucket
    in O(1), so the schedule never holds a job the node dropped.  Precision
    is per job: a bucket is opened when its first millisecond is due and
    only its jobs whose own ``awakeme`` has come are taken.
    """

    __slots__ = ("_times",)

    #: Bucket width: 16 ms.
    BUCKET_SHIFT: Final = 4

    def __init__(self) -> None:
        self._times: TimeBuckets[Job] = TimeBuckets()

    def __len__(self) -> int:
        """Jobs scheduled."""
        return len(self._times)

    @property
    def numbers_held(self) -> int:
        """Bucket numbers held, emptied ones included (bounded: time_buckets.py)."""
        return self._times.numbers_held

    def move(self, job: Job, when: int) -> None:
        """Schedule ``job`` at ``when`` (ms), wherever it was before."""
        if job.awakeme:
            self.discard(job)
        job.awakeme = when
        self._times.add(when >> self.BUCKET_SHIFT, job)

    def discard(self, job: Job) -> None:
        """Take ``job`` out of the schedule (its awake time becomes 0)."""
        when = job.awakeme
        if when:
            self._times.remove(when >> self.BUCKET_SHIFT, job)
            job.awakeme = 0

    def next_time(self) -> int | None:
        """Awake time of the earliest scheduled job."""
        earliest = self._times.earliest()
        if earliest is None:
            return None
        return min(job.awakeme for job in earliest[1])

    def pop_due(self, now_ms: int, limit: int) -> list[Job]:
        """Remove and return up to ``limit`` jobs whose time has come, earliest buckets first."""
        times = self._times
        due: list[Job] = []
        while len(due) < limit:
            earliest = times.earliest()
            if earliest is None or earliest[0] << self.BUCKET_SHIFT > now_ms:
                break
            number, bucket = earliest
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
            times.drop(number)
        return due

    def clear(self) -> None:
        self._times.clear()


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

    def evictable_jobs(self) -> list[Job]:
        """The evictable jobs, oldest first (a copy: the caller may change them)."""
        return list(self._evictable)

    def oldest_evictable(self) -> Job | None:
        return next(iter(self._evictable), None)

    def clear(self) -> None:
        self._jobs.clear()
        self.schedule.clear()
        self._evictable.clear()

    # Used by jobs.register_job / unregister_job only.
    def add(self, job: Job) -> bool:
        job_id = job.id
        return self._jobs.add_at(job_id_slice(job_id), job_id, job)

    def remove(self, job: Job) -> bool:
        self.evictable_discard(job)
        self.schedule.discard(job)
        job_id = job.id
        return self._jobs.pop_at(job_id_slice(job_id), job_id) is not None


def job_memory(job: Job) -> int:
    """What a job counts in ``used_memory`` (memory.py).

    The same at registration and removal: a job's body, headers and group
    key never change while it is registered.
    """
    size = JOB_OVERHEAD_BYTES + len(job.body)
    ext = job.ext
    if ext is not None:
        headers = ext.headers
        if headers:
            size += headers_memory(headers)
        group = ext.group
        if group is not None:
            size += GROUP_KEY_BYTES + len(group) + (0 if headers else EXT_BYTES)
    return size


def headers_memory(headers: tuple[bytes, ...]) -> int:
    """What a job's headers (flat: name, value, ...) count in ``used_memory``."""
    size = HEADERS_OVERHEAD_BYTES + HEADER_OVERHEAD_BYTES * (len(headers) // 2)
    for item in headers:
        size += len(item)
    return size
