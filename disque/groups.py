"""Ordered groups (``ADDJOB ... GROUP key``, an extension; docs/EXTENSIONS.md,
"Ordered groups"): the jobs of one queue that share a group key are handed
out in the order they were added, and never two at once.

A group's jobs on this node are, at any time:

* **out**: taken out of the queue and not settled yet: delivered by GETJOB
  (and not acknowledged, NACKed, dead-lettered, expired or deleted),
  dequeued (DEQUEUE, WORKING of a queued job, handed to another node),
  waiting for a NACK ... DELAY to end, or, after a restart, active again
  until RETRY queues it.  Such a job has ``FLAG_GROUP_OUT`` and counts in
  ``Group.out``: while any is out the group is **held**;
* **queued**: in the queue, by creation time (``ctime``: the order ADDJOB
  made them on this node; a NACKed or re-queued job keeps its own, so it
  is the group's next job again, ahead of the ones added after it).  Only
  the oldest of them, and only while the group is not held, is in the
  queue's order structure (``Queue.jobs``, ``queue_order.JobOrder``, at
  its own priority): the group's **head**.  The others wait in
  ``Group.waiting``.

So GETJOB sees at most one job of a group, and none while the group is
held; a group-free queue never gets here (``Queue.groups`` is None, one
test on its paths).  A GETJOB that takes a group's head may take the jobs
after it in the same reply (:func:`follower`, GETJOB ... COUNT): the group
is then held by all of them, as SQS FIFO does for a batch.  Every change is
followed by :func:`_settle`, the one place that restores the rule above
(the head is the oldest queued job of a group not held), makes the head
take its place in the queue's order, and drops a group left with nothing
(memory is bounded by the jobs).

This module keeps the books; ``queue.py`` calls it at one place per
procedure (ENQUEUE, DEQUEUE, the fetch) and serves the GETJOB clients
waiting on a queue when a group is released (``queue.release_group``,
called by ACK-JOB, UNREGISTER and the dead-letter moves).

What a group costs is counted in ``used_memory``: :data:`GROUP_BYTES` and
the key per group with something queued or out, :data:`TABLE_BYTES` per
queue with groups; the job's own key is part of the job's share
(``job_table.job_memory``), its entry among the waiting jobs the queued
entry every queued job has (``QUEUE_ENTRY_BYTES``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .job import FLAG_GROUP_OUT, Job

if TYPE_CHECKING:
    from .queue_table import Queue
    from .state import ServerState

__all__ = ["Group", "QueueGroups", "GROUP_BYTES", "TABLE_BYTES", "place", "taken", "follower",
           "has_follower", "dequeued", "release", "hold", "oldest_waiting_age_ms"]

#: Memory of one group's state besides its key: the object, its list of
#: waiting jobs and its entry in the queue's table (measured with
#: tracemalloc, tests/server/test_groups.py).
GROUP_BYTES: Final = 210
#: Memory of a queue's table of groups (made with its first group).
TABLE_BYTES: Final = 200
#: Waiting jobs already handed out stay in the list until this many and
#: half of it, then the list is compacted (amortized O(1) per job).
_COMPACT_MIN: Final = 32


class Group:
    """One group of one queue: its head, its waiting jobs, how many are out."""

    __slots__ = ("blocked_since", "first", "head", "key", "out", "waiting")

    def __init__(self, key: bytes) -> None:
        self.key = key
        #: The group's next job, in the queue's order; None while held or empty.
        self.head: Job | None = None
        #: Queued jobs other than the head, by ctime from ``first`` on (the
        #: entries before ``first`` were taken; dropped by compaction).
        self.waiting: list[Job] = []
        self.first = 0
        #: Jobs out (FLAG_GROUP_OUT): the group is held while this is > 0.
        self.out = 0
        #: When the group last became held with jobs waiting behind (ms; 0: it is not).
        self.blocked_since = 0

    def waiting_count(self) -> int:
        return len(self.waiting) - self.first

    def __repr__(self) -> str:
        return (f"<Group {self.key!r} out={self.out} head={self.head!r} "
                f"waiting={self.waiting_count()}>")


class QueueGroups:
    """The groups of one queue (``Queue.groups``), made with the first."""

    __slots__ = ("blocked", "by_key", "held", "waiting")

    def __init__(self) -> None:
        self.by_key: dict[bytes, Group] = {}
        #: Held groups with jobs waiting behind them, in the order they became so.
        self.blocked: dict[bytes, Group] = {}
        #: Groups with a job out.
        self.held = 0
        #: Queued jobs not in the queue's order (waiting behind their group's head
        #: or behind a job out): QLEN counts them with the rest.
        self.waiting = 0


# --------------------------------------------------------------------------
# The procedures' entry points
# --------------------------------------------------------------------------

def place(state: ServerState, q: Queue, job: Job, key: bytes) -> bool:
    """ENQUEUE of a job of group ``key`` in ``q`` (new, NACKed, re-queued,
    imported).  True if a job joined the queue's order (the caller serves
    the clients waiting on ``q``)."""
    table, group = _group(state, q, key)
    if job.flags & FLAG_GROUP_OUT:  # back from out (a NACK, a re-queue)
        _back(table, group, job)
    _wait(table, group, job)
    return _settle(state, q, table, group)


def taken(state: ServerState, q: Queue, job: Job, key: bytes) -> None:
    """GETJOB took ``job``, its group's head, out of the queue's order."""
    table = q.groups
    assert table is not None
    group = table.by_key[key]
    group.head = None
    _out(table, group, job)
    _settle(state, q, table, group)


def follower(state: ServerState, q: Queue, job: Job) -> Job | None:
    """The job after ``job`` in its group, taken for the same GETJOB reply
    (now out too); None if ``job`` has no group or nothing waits behind it.

    Only for the GETJOB that took ``job``: the group is then held by that
    GETJOB's jobs alone (nothing else runs in between).
    """
    group = _run_group(q, job)
    if group is None:
        return None
    table = q.groups
    assert table is not None
    nxt = _pop_oldest(table, group)
    _out(table, group, nxt)
    _settle(state, q, table, group)
    return nxt


def has_follower(q: Queue, job: Job) -> bool:
    """Whether :func:`follower` would give a job."""
    return _run_group(q, job) is not None


def dequeued(state: ServerState, q: Queue, job: Job, key: bytes) -> bool:
    """DEQUEUE of a queued job of group ``key`` (DEQUEUE, WORKING, handed to
    another node, an ACK or a deletion of a queued job): it leaves the
    queue and holds its group until it is settled.  False if it was not
    in the queue."""
    table = q.groups
    group = table.by_key.get(key) if table is not None else None
    if table is None or group is None:
        return False
    if group.head is job:
        q.jobs.remove(job)
        group.head = None
    elif not _remove_waiting(table, group, job):
        return False
    _out(table, group, job)
    _settle(state, q, table, group)
    return True


def release(state: ServerState, job: Job) -> Queue | None:
    """``job`` (FLAG_GROUP_OUT) stops holding its group: acknowledged,
    deleted, expired, or moved to another queue.  Returns its queue if a
    job of the group joined the queue's order (its clients to be served)."""
    ext = job.ext
    q = state.queues.lookup(job.queue) if job.queue is not None else None
    table = q.groups if q is not None else None
    group = (table.by_key.get(ext.group) if table is not None and ext is not None
             and ext.group is not None else None)
    if q is None or table is None or group is None:
        job.flags &= ~FLAG_GROUP_OUT  # nothing left to hold
        return None
    _back(table, group, job)
    return q if _settle(state, q, table, group) else None


def hold(state: ServerState, job: Job) -> None:
    """A job read back from the AOF that comes back active holds its group
    until it is queued again (restore.py), as it would after a delivery."""
    ext = job.ext
    if ext is None or ext.group is None or job.queue is None or job.flags & FLAG_GROUP_OUT:
        return
    q = state.queue_for_write(job.queue)
    table, group = _group(state, q, ext.group)
    _out(table, group, job)
    _settle(state, q, table, group)


def oldest_waiting_age_ms(q: Queue, now: int) -> int:
    """How long the group held longest with jobs waiting behind it has been
    so (QSTAT's ``oldest-waiting-group-age``); 0 when none is."""
    table = q.groups
    if table is None:
        return 0
    for group in table.blocked.values():  # the first is the oldest
        return max(0, now - group.blocked_since)
    return 0


# --------------------------------------------------------------------------
# The books
# --------------------------------------------------------------------------

def _group(state: ServerState, q: Queue, key: bytes) -> tuple[QueueGroups, Group]:
    table = q.groups
    if table is None:
        table = q.groups = QueueGroups()
        state.memory.add(TABLE_BYTES)
    group = table.by_key.get(key)
    if group is None:
        group = table.by_key[key] = Group(key)
        state.memory.add(GROUP_BYTES + len(key))
    return table, group


def _run_group(q: Queue, job: Job) -> Group | None:
    """``job``'s group in ``q`` if a job waits behind it."""
    ext = job.ext
    table = q.groups
    if ext is None or ext.group is None or table is None:
        return None
    group = table.by_key.get(ext.group)
    if group is None or len(group.waiting) == group.first:
        return None
    return group


def _out(table: QueueGroups, group: Group, job: Job) -> None:
    job.flags |= FLAG_GROUP_OUT
    if not group.out:
        table.held += 1
    group.out += 1


def _back(table: QueueGroups, group: Group, job: Job) -> None:
    job.flags &= ~FLAG_GROUP_OUT
    group.out -= 1
    if not group.out:
        table.held -= 1


def _wait(table: QueueGroups, group: Group, job: Job) -> None:
    """Put ``job`` among the group's waiting jobs, by ctime (after equals).

    New jobs are the newest (appended) and NACKed or re-queued ones nearly
    always the oldest (they were handed out first): both ends are O(1).
    """
    waiting = group.waiting
    first = group.first
    ctime = job.ctime
    table.waiting += 1
    if len(waiting) == first or waiting[-1].ctime <= ctime:
        waiting.append(job)
    elif ctime < waiting[first].ctime:
        if first:
            group.first = first - 1
            waiting[first - 1] = job
        else:
            waiting.insert(0, job)
    else:
        waiting.insert(_after(waiting, first, ctime), job)


def _after(waiting: list[Job], lo: int, ctime: int) -> int:
    """The first index from ``lo`` whose job is newer than ``ctime``."""
    hi = len(waiting)
    while lo < hi:
        mid = (lo + hi) // 2
        if waiting[mid].ctime <= ctime:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _pop_oldest(table: QueueGroups, group: Group) -> Job:
    waiting = group.waiting
    first = group.first
    job = waiting[first]
    first += 1
    table.waiting -= 1
    if first == len(waiting):
        waiting.clear()
        first = 0
    elif first >= _COMPACT_MIN and 2 * first >= len(waiting):
        del waiting[:first]
        first = 0
    group.first = first
    return job


def _remove_waiting(table: QueueGroups, group: Group, job: Job) -> bool:
    """Take ``job`` out of the waiting jobs (found by its ctime); False if absent."""
    waiting = group.waiting
    first = group.first
    if first == len(waiting):
        return False
    if waiting[first] is job:
        _pop_oldest(table, group)
        return True
    ctime = job.ctime
    lo, hi = first, len(waiting)
    while lo < hi:  # the first one not older than the job
        mid = (lo + hi) // 2
        if waiting[mid].ctime < ctime:
            lo = mid + 1
        else:
            hi = mid
    while lo < len(waiting) and waiting[lo].ctime == ctime:
        if waiting[lo] is job:
            del waiting[lo]
            table.waiting -= 1
            if first == len(waiting):
                waiting.clear()
                group.first = 0
            return True
        lo += 1
    return False


def _settle(state: ServerState, q: Queue, table: QueueGroups, group: Group) -> bool:
    """Make the rule hold again for ``group``: held, no head; else the
    oldest queued job is the head, in the queue's order.  Keeps the books of
    blocked groups, drops a group with nothing left.  True if a job joined
    the queue's order."""
    joined = False
    head = group.head
    if group.out:
        if head is not None:  # held now: its head waits with the others
            q.jobs.remove(head)
            group.head = None
            _wait(table, group, head)
    elif len(group.waiting) > group.first:
        oldest = group.waiting[group.first]
        if head is None or oldest.ctime < head.ctime:
            _pop_oldest(table, group)
            if head is not None:  # an older job came back (a restart, a copy)
                q.jobs.remove(head)
                _wait(table, group, head)
            q.jobs.add(oldest)
            group.head = oldest
            joined = True
    waits = len(group.waiting) > group.first
    if group.out and waits:
        if not group.blocked_since:
            group.blocked_since = state.clock.now_ms() or 1
            table.blocked[group.key] = group
    elif group.blocked_since:
        group.blocked_since = 0
        del table.blocked[group.key]
    if not group.out and not waits and group.head is None:
        _drop(state, q, table, group)
    return joined


def _drop(state: ServerState, q: Queue, table: QueueGroups, group: Group) -> None:
    del table.by_key[group.key]
    state.memory.sub(GROUP_BYTES + len(group.key))
    if not table.by_key:
        q.groups = None
        state.memory.sub(TABLE_BYTES)
