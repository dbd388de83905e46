"""The jobs of one queue in the order GETJOB hands them out.

Without priorities (every job of the original's kind, and every job added
without ``PRIORITY``) that order is creation time (``ctime``), oldest first.
Nearly all jobs arrive in that order (ADDJOB makes them with increasing
ctimes), so they go to a plain deque: appending and taking the oldest are
O(1) and an entry costs one pointer.  A job older than the deque's newest (a
re-queued job, a copy queued after a NACK, a job imported from another
node, a delayed job) goes to a sorted list (``late``) instead, and taking
the oldest compares the two heads.

Removing a job from the middle (ACKJOB or DELJOB of a queued job, a copy
queued elsewhere, TTL expiry, DEQUEUE) does not search the deque: the job's
``FLAG_IN_FIFO`` is cleared and its entry becomes *stale*, skipped when it
reaches either end and dropped by a compaction once stale entries are more
than an eighth of the deque (so dropped jobs are kept alive by at most
that many entries; O(1) amortized per removal).  A job with a stale entry
somewhere (``FLAG_FIFO_STALE``) goes to the sorted list if queued again, so
a job never has more than one entry in any deque: an entry is live exactly
when its job has ``FLAG_IN_FIFO``.  Both flags are this node's memory
only; a job's serialized flags keep the low 8 bits (see ``job.py``).

Priorities (``ADDJOB ... PRIORITY p``, 1 to 31; 0 is the default): a job
with a priority above 0 goes to a level of its own, one more such deque and
sorted list per priority, made when the queue first holds a job of that
priority.  The levels in use are bits of one integer, so the highest is
found in O(1) (``int.bit_length``), and the queue hands out the highest
level's oldest job before anything of a lower one.  A queue that never had
a prioritized job pays one ``None`` test per operation: the levels do not
exist.  A job's priority never changes, so it is always in the same level.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from operator import attrgetter
from typing import Final

from sortedcontainers import SortedKeyList

from .job import FLAG_FIFO_STALE, FLAG_IN_FIFO, Job
from .job_options import MAX_PRIORITY

__all__ = ["JobOrder", "priority_of"]

_by_ctime = attrgetter("ctime")
#: The deque's methods, taken from the class once: compiled code would call
#: ``fifo.append(job)`` by name, a method lookup on every ADDJOB and GETJOB
#: (~130 instructions each); bound per queue they would cost ~160 bytes a queue.
_append: Final = deque.append
_popleft: Final = deque.popleft

#: Compaction waits for at least this many stale entries (a short deque is
#: cheap to keep as it is).
COMPACT_MIN: Final = 64

def priority_of(job: Job) -> int:
    """The job's priority (0 without the option)."""
    ext = job.ext
    return 0 if ext is None else ext.priority


class JobOrder:
    """Queued jobs, highest priority first and by ascending ``ctime`` within
    a priority; equal ctimes in arrival order within the deque and within
    the sorted list."""

    __slots__ = ("_fifo", "_late", "_late_count", "_levels", "_stale", "_tail")

    def __init__(self) -> None:
        # Non-decreasing ctimes, stale entries included.
        self._fifo: deque[Job] = deque()
        # The deque's last entry (None when it is empty), kept here: every
        # ADDJOB compares its job with it, and compiled ``fifo[-1]`` and
        # ``not fifo`` on a deque are Python-level calls (~180 instructions).
        self._tail: Job | None = None
        self._late: SortedKeyList = SortedKeyList(key=_by_ctime)
        # len(self._late), kept here: the sorted list's own len() is Python
        # code (~600 instructions), asked on every add and pop of the queue.
        self._late_count = 0
        self._stale = 0
        # The jobs of priorities above 0, once the queue had one.
        self._levels: _Levels | None = None

    def __len__(self) -> int:
        size = len(self._fifo) - self._stale + self._late_count
        levels = self._levels
        return size if levels is None else size + levels.count

    def __bool__(self) -> bool:
        if len(self._fifo) > self._stale or self._late_count:
            return True
        levels = self._levels
        return levels is not None and levels.count > 0

    def add(self, job: Job) -> None:
        ext = job.ext
        if ext is not None and ext.priority:
            levels = self._levels
            if levels is None:
                levels = self._levels = _Levels()
            levels.add(job, ext.priority)
        else:
            self._add_here(job)

    def remove(self, job: Job) -> bool:
        """Take ``job`` out; False if it is not here."""
        ext = job.ext
        if ext is not None and ext.priority:
            levels = self._levels
            return levels is not None and levels.remove(job, ext.priority)
        return self._remove_here(job)

    def pop_first(self) -> Job | None:
        """Take the job GETJOB hands out next (None when empty)."""
        levels = self._levels
        if levels is not None and levels.mask:
            return levels.pop_first()
        return self._pop_here()

    def first(self, count: int) -> list[Job]:
        """The ``count`` jobs :meth:`pop_first` would take next, in that
        order, left in place."""
        out: list[Job] = []
        levels = self._levels
        if levels is not None and levels.mask:
            out = levels.first(count)
        if len(out) < count:
            out += self._first_here(count - len(out))
        return out

    def last(self, count: int) -> list[Job]:
        """The ``count`` jobs :meth:`pop_first` would take last, the very
        last first, left in place."""
        out = self._last_here(count)
        levels = self._levels
        if len(out) < count and levels is not None and levels.mask:
            out += levels.last(count - len(out))
        return out

    def priorities(self) -> list[tuple[int, int]]:
        """``(priority, jobs)`` for each priority above 0 holding jobs, highest first."""
        levels = self._levels
        return [] if levels is None else levels.sizes()

    def top_priority(self) -> int:
        """The highest priority of a queued job (0 when none has one)."""
        levels = self._levels
        if levels is None or not levels.mask:
            return 0
        return levels.mask.bit_length() - 1

    def clear(self) -> None:
        for job in self._fifo:
            job.flags &= ~(FLAG_IN_FIFO | FLAG_FIFO_STALE)
        self._fifo.clear()
        self._tail = None
        self._late.clear()
        self._late_count = 0
        self._stale = 0
        levels = self._levels
        if levels is not None:
            levels.clear()
            self._levels = None

    # -- one level: the deque and the sorted list ------------------------------

    def _add_here(self, job: Job) -> None:
        flags = job.flags
        tail = self._tail
        if not flags & FLAG_FIFO_STALE and (tail is None or tail.ctime <= job.ctime):
            _append(self._fifo, job)
            self._tail = job
            job.flags = flags | FLAG_IN_FIFO
        else:
            self._late.add(job)
            self._late_count += 1

    def _remove_here(self, job: Job) -> bool:
        flags = job.flags
        if flags & FLAG_IN_FIFO:
            job.flags = (flags & ~FLAG_IN_FIFO) | FLAG_FIFO_STALE
            self._stale += 1
            self._trim()
            stale = self._stale
            if stale >= COMPACT_MIN and stale * 8 > len(self._fifo):
                self._compact()
            return True
        try:
            self._late.remove(job)
        except ValueError:
            return False
        self._late_count -= 1
        return True

    def _pop_here(self) -> Job | None:
        fifo = self._fifo
        if self._late_count:
            late = self._late
            if not fifo or late[0].ctime < fifo[0].ctime:
                job: Job = late.pop(0)
                self._late_count -= 1
                return job
        if not fifo:
            return None
        job = _popleft(fifo)
        job.flags &= ~FLAG_IN_FIFO
        if job is self._tail:  # a job has one entry at most: the deque is empty
            self._tail = None
        if self._stale:
            self._trim()
        return job

    def _first_here(self, count: int) -> list[Job]:
        return _merged(iter(self._fifo), iter(self._late), count, newest_first=False)

    def _last_here(self, count: int) -> list[Job]:
        return _merged(reversed(self._fifo), reversed(self._late), count, newest_first=True)

    def _trim(self) -> None:
        """Drop stale entries at both ends, so the heads are live."""
        fifo = self._fifo
        while fifo and not fifo[0].flags & FLAG_IN_FIFO:
            fifo.popleft().flags &= ~FLAG_FIFO_STALE
            self._stale -= 1
        while fifo and not fifo[-1].flags & FLAG_IN_FIFO:
            fifo.pop().flags &= ~FLAG_FIFO_STALE
            self._stale -= 1
        self._tail = fifo[-1] if fifo else None

    def _compact(self) -> None:
        live: deque[Job] = deque()
        for job in self._fifo:
            if job.flags & FLAG_IN_FIFO:
                live.append(job)
            else:
                job.flags &= ~FLAG_FIFO_STALE
        self._fifo = live
        self._tail = live[-1] if live else None
        self._stale = 0


class _Levels:
    """The levels of priorities 1 to 31 of one queue, each a :class:`JobOrder`
    used through its single-level methods."""

    __slots__ = ("by_priority", "count", "mask")

    def __init__(self) -> None:
        self.by_priority: list[JobOrder | None] = [None] * (MAX_PRIORITY + 1)
        #: Bit p is set while level p holds jobs.
        self.mask = 0
        self.count = 0

    def add(self, job: Job, priority: int) -> None:
        level = self.by_priority[priority]
        if level is None:
            level = self.by_priority[priority] = JobOrder()
        level._add_here(job)
        self.count += 1
        self.mask |= 1 << priority

    def remove(self, job: Job, priority: int) -> bool:
        level = self.by_priority[priority]
        if level is None or not level._remove_here(job):
            return False
        self.count -= 1
        if not level:
            self.mask &= ~(1 << priority)
        return True

    def pop_first(self) -> Job | None:
        priority = self.mask.bit_length() - 1
        level = self.by_priority[priority]
        assert level is not None
        job = level._pop_here()
        self.count -= 1
        if not level:
            self.mask &= ~(1 << priority)
        return job

    def _used(self, highest_first: bool) -> Iterator[JobOrder]:
        order = range(MAX_PRIORITY, 0, -1) if highest_first else range(1, MAX_PRIORITY + 1)
        mask = self.mask
        for priority in order:
            level = self.by_priority[priority]
            if mask >> priority & 1 and level is not None:
                yield level

    def first(self, count: int) -> list[Job]:
        out: list[Job] = []
        for level in self._used(highest_first=True):
            out += level._first_here(count - len(out))
            if len(out) >= count:
                break
        return out

    def last(self, count: int) -> list[Job]:
        out: list[Job] = []
        for level in self._used(highest_first=False):
            out += level._last_here(count - len(out))
            if len(out) >= count:
                break
        return out

    def sizes(self) -> list[tuple[int, int]]:
        return [(priority, len(level)) for priority, level in enumerate(self.by_priority)
                if level is not None and self.mask >> priority & 1][::-1]

    def clear(self) -> None:
        for level in self.by_priority:
            if level is not None:
                level.clear()
        self.mask = 0
        self.count = 0


def _merged(fifo: Iterator[Job], late: Iterator[Job], count: int,
            newest_first: bool) -> list[Job]:
    """Up to ``count`` jobs of a deque (skipping its stale entries) and a
    sorted list, merged by ctime; on equal ctimes the deque's job comes
    first oldest-first (as :meth:`JobOrder.pop_first` takes them) and last
    newest-first."""
    out: list[Job] = []
    if count <= 0:
        return out
    pending: Job | None = next(late, None)
    for job in fifo:
        if not job.flags & FLAG_IN_FIFO:
            continue
        while pending is not None and (pending.ctime >= job.ctime if newest_first
                                       else pending.ctime < job.ctime):
            out.append(pending)
            if len(out) == count:
                return out
            pending = next(late, None)
        out.append(job)
        if len(out) == count:
            return out
    while pending is not None and len(out) < count:
        out.append(pending)
        pending = next(late, None)
    return out
