"""Ordered groups (``ADDJOB ... GROUP key``, an extension; docs/EXTENSIONS.md,
"Ordered groups"): the jobs of one queue that share a group key are handed
out in the order they were added, and never two at once.

A group's jobs on this node are, at any time:

* **out**: taken out of the queue and not settled yet: delivered by GETJOB
  (and not acknowledged, NACKed, dead-lettered, expired or deleted),
  dequeued (DEQUEUE, WORKING of a queued job), or waiting for a NACK ...
  DELAY to end.  Such a job has ``FLAG_GROUP_OUT`` and counts in
  ``Group.out``: while any is out the group is **held**;
* **copies**: active here without being queued or out: copies of jobs
  another node serves (REPLJOB, a job handed to another node by
  federation, a queued copy another node outranks us for), and jobs read
  back from the AOF until they are queued again.  Such a job has
  ``FLAG_GROUP_COPY`` and is in ``Group.copies``: no job of the group
  younger than a copy goes out here (age: ``ctime``, then the ID, a total
  order across nodes), so that a group served elsewhere, or not queued
  again yet after a failure or a restart, does not get overtaken here;
* **queued**: in the queue, by creation time (``ctime``: the order ADDJOB
  made them; a NACKed or re-queued job keeps its own, so it is the group's
  next job again, ahead of the ones added after it).  Only the oldest of
  them, and only while the group is not held and no copy is older, is in
  the queue's order structure (``Queue.jobs``, ``queue_order.JobOrder``,
  at its own priority): the group's **head**.  The others wait in
  ``Group.waiting``.

So GETJOB sees at most one job of a group, and none while the group is
held; a group-free queue never gets here (``Queue.groups`` is None, one
test on its paths).  A GETJOB that takes a group's head may take the jobs
after it in the same reply (:func:`follower`, GETJOB ... COUNT): the group
is then held by all of them, as SQS FIFO does for a batch.  Every change is
followed by :func:`_settle`, the one place that restores the rule above
(the head is the oldest queued job of a group not held, if no copy is
older), makes the head take its place in the queue's order, and drops a
group left with nothing (memory is bounded by the jobs).

In a cluster (docs/EXTENSIONS.md, "In a cluster"): a group's copies are on
the first nodes of its key's rendezvous ranking (replication.py); the
timer that queues a copy again queues all of the group's copies here with
it, oldest first (:func:`take_copies`, ``queue.requeue_group``): after a
failure one node takes the whole group, in order.  Which one: the copies
wait their RETRY plus :data:`RANK_WAIT_MS` per node that ranks before us
among the job's nodes (:func:`rank_wait_ms`), and a node that has the job
queued or out answers WILLQUEUE with QUEUED (requeue.py): the best ranked
survivor queues the group first, and the others, told with QUEUED, wait.

This module keeps the books; ``queue.py`` calls it at one place per
procedure (ENQUEUE, DEQUEUE, the fetch) and serves the GETJOB clients
waiting on a queue when a group is released (``queue.release_group``,
called by ACK-JOB, UNREGISTER and the dead-letter moves).

What a group costs is counted in ``used_memory``: :data:`GROUP_BYTES` and
the key per group with something queued, out or copied,
:data:`TABLE_BYTES` per queue with groups, :data:`COPIES_BYTES` per group
with copies and :data:`COPY_ENTRY_BYTES` per copy; the job's own key is
part of the job's share (``job_table.job_memory``), its entry among the
waiting jobs the queued entry every queued job has (``QUEUE_ENTRY_BYTES``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from .job import FLAG_GROUP_COPY, FLAG_GROUP_OUT, Job
from .rendezvous import score

if TYPE_CHECKING:
    from .queue_table import Queue
    from .state import ServerState

__all__ = ["ByAge", "Group", "QueueGroups", "GROUP_BYTES", "TABLE_BYTES", "COPIES_BYTES",
           "COPY_ENTRY_BYTES", "RANK_WAIT_MS", "place", "taken", "follower", "has_follower",
           "dequeued", "withdrawn", "release", "to_copy", "copy_in", "take_copies",
           "queued_jobs", "rank_wait_ms", "oldest_waiting_age_ms"]

#: Memory of one group's state besides its key: the object, its list of
#: waiting jobs and its entry in the queue's table (measured with
#: tracemalloc, tests/server/test_groups_state.py).
GROUP_BYTES: Final = 250
#: Memory of a queue's table of groups (made with its first group).
TABLE_BYTES: Final = 200
#: Memory of a group's list of copies (made with its first copy), and of
#: one copy's entry in it.
COPIES_BYTES: Final = 120
COPY_ENTRY_BYTES: Final = 8
#: A copy of a group's job waits this much longer than RETRY per node that
#: ranks before this one for the key among the job's nodes: more than the
#: requeue jitter (+-250 ms on each side) and a message's way, so that the
#: best ranked survivor queues the group again first and its QUEUEDs reach
#: the others before they would.
RANK_WAIT_MS: Final = 2000
#: Entries of a line already taken stay until this many and half of it,
#: then the list is compacted (amortized O(1) per job).
_COMPACT_MIN: Final = 32


def _older(a: Job, b: Job) -> bool:
    """``a`` was made before ``b``: ctime, then the ID (jobs of one node
    never share a ctime, jobs of two nodes may: the ID makes it a total
    order, which every node sees alike)."""
    return a.ctime < b.ctime or (a.ctime == b.ctime and a.id < b.id)


class ByAge:
    """Jobs by ctime, oldest first (equal ctimes in arrival order); the
    entries before ``first`` were taken and are dropped by compaction.

    New jobs are the newest (appended) and NACKed, re-queued or acknowledged
    ones nearly always the oldest (they were handed out first): both ends
    are O(1).
    """

    __slots__ = ("first", "jobs")

    def __init__(self) -> None:
        self.jobs: list[Job] = []
        self.first = 0

    def count(self) -> int:
        return len(self.jobs) - self.first

    def oldest(self) -> Job | None:
        jobs = self.jobs
        return jobs[self.first] if self.first < len(jobs) else None

    def add(self, job: Job) -> None:
        """Put ``job`` in its place (after the ones of equal ctime)."""
        jobs = self.jobs
        first = self.first
        ctime = job.ctime
        if len(jobs) == first or jobs[-1].ctime <= ctime:
            jobs.append(job)
        elif ctime < jobs[first].ctime:
            if first:
                self.first = first - 1
                jobs[first - 1] = job
            else:
                jobs.insert(0, job)
        else:
            jobs.insert(_after(jobs, first, ctime), job)

    def pop_oldest(self) -> Job:
        jobs = self.jobs
        first = self.first
        job = jobs[first]
        first += 1
        if first == len(jobs):
            jobs.clear()
            first = 0
        elif first >= _COMPACT_MIN and 2 * first >= len(jobs):
            del jobs[:first]
            first = 0
        self.first = first
        return job

    def remove(self, job: Job) -> bool:
        """Take ``job`` out (found by its ctime); False if absent."""
        jobs = self.jobs
        first = self.first
        if first == len(jobs):
            return False
        if jobs[first] is job:
            self.pop_oldest()
            return True
        ctime = job.ctime
        lo, hi = first, len(jobs)
        while lo < hi:  # the first one not older than the job
            mid = (lo + hi) // 2
            if jobs[mid].ctime < ctime:
                lo = mid + 1
            else:
                hi = mid
        while lo < len(jobs) and jobs[lo].ctime == ctime:
            if jobs[lo] is job:
                del jobs[lo]
                if first == len(jobs):
                    jobs.clear()
                    self.first = 0
                return True
            lo += 1
        return False

    def take_all(self) -> list[Job]:
        jobs = self.jobs[self.first:]
        self.jobs = []
        self.first = 0
        return jobs


def _after(jobs: list[Job], lo: int, ctime: int) -> int:
    """The first index from ``lo`` whose job is newer than ``ctime``."""
    hi = len(jobs)
    while lo < hi:
        mid = (lo + hi) // 2
        if jobs[mid].ctime <= ctime:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Group:
    """One group of one queue: its head, its waiting jobs, how many are out,
    its copies."""

    __slots__ = ("blocked_since", "copies", "head", "key", "out", "waiting")

    def __init__(self, key: bytes) -> None:
        self.key = key
        #: The group's next job, in the queue's order; None while held or empty.
        self.head: Job | None = None
        #: Queued jobs other than the head, by ctime.
        self.waiting = ByAge()
        #: Jobs out (FLAG_GROUP_OUT): the group is held while this is > 0.
        self.out = 0
        #: Copies (FLAG_GROUP_COPY), by ctime; None while there is none.
        self.copies: ByAge | None = None
        #: When the group last became unable to hand out its waiting jobs
        #: (held, or behind an older copy) (ms; 0: it is not).
        self.blocked_since = 0

    def waiting_count(self) -> int:
        return self.waiting.count()

    def copies_count(self) -> int:
        copies = self.copies
        return copies.count() if copies is not None else 0

    def __repr__(self) -> str:
        return (f"<Group {self.key!r} out={self.out} head={self.head!r} "
                f"waiting={self.waiting_count()} copies={self.copies_count()}>")


class QueueGroups:
    """The groups of one queue (``Queue.groups``), made with the first."""

    __slots__ = ("blocked", "by_key", "held", "waiting")

    def __init__(self) -> None:
        self.by_key: dict[bytes, Group] = {}
        #: Groups with queued jobs none of which can go out (held, or
        #: behind an older copy), in the order they became so.
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
    imported, a copy queued).  True if a job joined the queue's order (the
    caller serves the clients waiting on ``q``)."""
    table, group = _group(state, q, key)
    flags = job.flags
    if flags & FLAG_GROUP_OUT:  # back from out (a NACK, a re-queue)
        _back(table, group, job)
    elif flags & FLAG_GROUP_COPY:  # a copy queued (a re-queue, ENQUEUE, an import)
        _uncopy(state, group, job)
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
    (now out too); None if ``job`` has no group or nothing may follow it.

    Only for the GETJOB that took ``job``: the group is then held by that
    GETJOB's jobs alone (nothing else runs in between).
    """
    group = _run_group(q, job)
    if group is None:
        return None
    table = q.groups
    assert table is not None
    table.waiting -= 1
    nxt = group.waiting.pop_oldest()
    _out(table, group, nxt)
    _settle(state, q, table, group)
    return nxt


def has_follower(q: Queue, job: Job) -> bool:
    """Whether :func:`follower` would give a job."""
    return _run_group(q, job) is not None


def dequeued(state: ServerState, q: Queue, job: Job, key: bytes) -> bool:
    """DEQUEUE of a queued job of group ``key`` (DEQUEUE, WORKING, an ACK or
    a deletion of a queued job): it leaves the queue and holds its group
    until it is settled.  False if it was not in the queue."""
    table = q.groups
    group = table.by_key.get(key) if table is not None else None
    if table is None or group is None or not _unqueue(q, table, group, job):
        return False
    _out(table, group, job)
    _settle(state, q, table, group)
    return True


def withdrawn(state: ServerState, q: Queue, job: Job, key: bytes) -> bool:
    """A queued job of group ``key`` leaves the queue because another node
    serves it (federation handed it over, a node that outranks us has it
    queued, a consumer works on it there): it becomes one of the group's
    copies here.  False if it was not in the queue."""
    table = q.groups
    group = table.by_key.get(key) if table is not None else None
    if table is None or group is None or not _unqueue(q, table, group, job):
        return False
    _copy(state, group, job)
    _settle(state, q, table, group)
    return True


def release(state: ServerState, job: Job) -> Queue | None:
    """``job`` (out, or a copy) leaves its group's books: acknowledged,
    deleted, expired, or moved to another queue.  Returns its queue if a
    job of the group joined the queue's order (its clients to be served)."""
    located = _locate(state, job)
    if located is None:
        job.flags &= ~(FLAG_GROUP_OUT | FLAG_GROUP_COPY)  # nothing left to hold
        return None
    q, table, group = located
    if job.flags & FLAG_GROUP_OUT:
        _back(table, group, job)
    else:
        _uncopy(state, group, job)
    return q if _settle(state, q, table, group) else None


def to_copy(state: ServerState, job: Job) -> Queue | None:
    """A job out here (FLAG_GROUP_OUT) that another node serves (it outranks
    us for the key and has it queued or out too): it stops holding the
    group and becomes a copy.  Returns the queue if a job joined its order."""
    located = _locate(state, job)
    if located is None or not job.flags & FLAG_GROUP_OUT:
        return None
    q, table, group = located
    _back(table, group, job)
    _copy(state, group, job)
    return q if _settle(state, q, table, group) else None


def copy_in(state: ServerState, job: Job) -> None:
    """``job``, registered and active here, neither queued nor out, becomes
    one of its group's copies: a copy another node sent (REPLJOB), a job
    read back from the AOF that comes back active, a copy moved to its
    dead-letter queue by another node."""
    ext = job.ext
    if (ext is None or ext.group is None or job.queue is None
            or job.flags & (FLAG_GROUP_OUT | FLAG_GROUP_COPY)):
        return
    q = state.queue_for_write(job.queue)
    table, group = _group(state, q, ext.group)
    _copy(state, group, job)
    _settle(state, q, table, group)


def take_copies(state: ServerState, q: Queue, key: bytes) -> list[Job]:
    """Every copy of group ``key`` in ``q``, oldest first, taken out of the
    books (active jobs of no list): the caller queues them all at once,
    oldest first (``queue.requeue_group``), or puts back with
    :func:`copy_in` any it does not queue."""
    table = q.groups
    group = table.by_key.get(key) if table is not None else None
    if table is None or group is None or group.copies is None:
        return []
    jobs = group.copies.take_all()
    for job in jobs:
        job.flags &= ~FLAG_GROUP_COPY
    state.memory.sub(COPY_ENTRY_BYTES * len(jobs))
    _settle(state, q, table, group)
    return jobs


def queued_jobs(q: Queue, head: Job) -> list[Job]:
    """``head``, a group's head, and the group's jobs waiting behind it, in
    their order: what federation hands over together (the whole group, none
    out, no copy older).  ``[head]`` for a job without a group."""
    ext = head.ext
    table = q.groups
    if ext is None or ext.group is None or table is None:
        return [head]
    group = table.by_key.get(ext.group)
    if group is None or group.head is not head:
        return [head]
    waiting = group.waiting
    return [head, *waiting.jobs[waiting.first:]]


def rank_wait_ms(state: ServerState, job: Job) -> int:
    """How much longer than RETRY this node's copy of ``job`` waits before
    it queues it (and its group) again: :data:`RANK_WAIT_MS` per node of
    the job's node list that ranks before us for its key (0 without a
    group).  Every copy computes its own, the same way, from the same list:
    the best ranked survivor comes first."""
    ext = job.ext
    if ext is None or ext.group is None:
        return 0
    key = ext.group
    me = state.cluster.myself_id
    mine = score(key, me)
    before = 0
    for node_id in job.delivered:
        if node_id != me:
            theirs = score(key, node_id)
            if theirs > mine or (theirs == mine and node_id > me):
                before += 1
    return before * RANK_WAIT_MS


def oldest_waiting_age_ms(q: Queue, now: int) -> int:
    """How long the group blocked longest (queued jobs, none of which may go
    out) has been so (QSTAT's ``oldest-waiting-group-age``); 0 when none is."""
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


def _locate(state: ServerState, job: Job) -> tuple[Queue, QueueGroups, Group] | None:
    """``job``'s queue, its table and its group, if they exist."""
    ext = job.ext
    if ext is None or ext.group is None or job.queue is None:
        return None
    q = state.queues.lookup(job.queue)
    table = q.groups if q is not None else None
    group = table.by_key.get(ext.group) if table is not None else None
    if q is None or table is None or group is None:
        return None
    return q, table, group


def _run_group(q: Queue, job: Job) -> Group | None:
    """``job``'s group in ``q`` if its oldest waiting job may follow it (no
    older copy)."""
    ext = job.ext
    table = q.groups
    if ext is None or ext.group is None or table is None:
        return None
    group = table.by_key.get(ext.group)
    if group is None:
        return None
    nxt = group.waiting.oldest()
    if nxt is None:
        return None
    copies = group.copies
    barrier = copies.oldest() if copies is not None else None
    if barrier is not None and not _older(nxt, barrier):
        return None
    return group


def _unqueue(q: Queue, table: QueueGroups, group: Group, job: Job) -> bool:
    """Take a queued ``job`` out of its group's head or waiting jobs."""
    if group.head is job:
        q.jobs.remove(job)
        group.head = None
        return True
    if group.waiting.remove(job):
        table.waiting -= 1
        return True
    return False


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


def _copy(state: ServerState, group: Group, job: Job) -> None:
    job.flags |= FLAG_GROUP_COPY
    copies = group.copies
    if copies is None:
        copies = group.copies = ByAge()
        state.memory.add(COPIES_BYTES)
    copies.add(job)
    state.memory.add(COPY_ENTRY_BYTES)


def _uncopy(state: ServerState, group: Group, job: Job) -> None:
    job.flags &= ~FLAG_GROUP_COPY
    copies = group.copies
    if copies is not None and copies.remove(job):
        state.memory.sub(COPY_ENTRY_BYTES)


def _wait(table: QueueGroups, group: Group, job: Job) -> None:
    table.waiting += 1
    group.waiting.add(job)


def _settle(state: ServerState, q: Queue, table: QueueGroups, group: Group) -> bool:
    """Make the rule hold again for ``group``: held, or a copy older than
    the oldest queued job, no head; else the oldest queued job is the head,
    in the queue's order.  Keeps the books of blocked groups, drops a group
    with nothing left.  True if a job joined the queue's order."""
    joined = False
    head = group.head
    copies = group.copies
    barrier = copies.oldest() if copies is not None else None
    if copies is not None and barrier is None:
        group.copies = None  # the last copy went
        state.memory.sub(COPIES_BYTES)
    waiting = group.waiting
    if group.out or (head is not None and barrier is not None and _older(barrier, head)):
        if head is not None:  # held now (or behind a copy): its head waits with the others
            q.jobs.remove(head)
            group.head = None
            _wait(table, group, head)
    else:
        oldest = waiting.oldest()
        if (oldest is not None and (head is None or oldest.ctime < head.ctime)
                and (barrier is None or _older(oldest, barrier))):
            waiting.pop_oldest()
            table.waiting -= 1
            if head is not None:  # an older job came back (a restart, a copy)
                q.jobs.remove(head)
                _wait(table, group, head)
            q.jobs.add(oldest)
            group.head = oldest
            joined = True
    waits = waiting.count() > 0
    if waits and group.head is None:  # none may go out: held, or behind a copy
        if not group.blocked_since:
            group.blocked_since = state.clock.now_ms() or 1
            table.blocked[group.key] = group
    elif group.blocked_since:
        group.blocked_since = 0
        del table.blocked[group.key]
    if not group.out and not waits and group.head is None and group.copies is None:
        _drop(state, q, table, group)
    return joined


def _drop(state: ServerState, q: Queue, table: QueueGroups, group: Group) -> None:
    del table.by_key[group.key]
    state.memory.sub(GROUP_BYTES + len(group.key))
    if not table.by_key:
        q.groups = None
        state.memory.sub(TABLE_BYTES)
