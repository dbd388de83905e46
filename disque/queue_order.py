"""The jobs of one queue, oldest first: a FIFO with a sorted side list.

A queue hands out its jobs in creation-time (``ctime``) order.  Nearly all
jobs arrive in that order (ADDJOB makes them with increasing ctimes), so
they go to a plain deque: appending and taking the oldest are O(1) and an
entry costs one pointer.  A job older than the deque's newest (a re-queued
job, a copy queued after a NACK, a job imported from another node, a
delayed job) goes to a sorted list (``late``) instead, and taking the
oldest compares the two heads.

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

Compared with one ``SortedKeyList`` for everything, as before, this saves
the sorted list's key (a boxed ctime, ~40 bytes) and its interpreted code
on every ADDJOB and GETJOB.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from operator import attrgetter
from typing import Final

from sortedcontainers import SortedKeyList

from .job import FLAG_FIFO_STALE, FLAG_IN_FIFO, Job

__all__ = ["JobOrder"]

_by_ctime = attrgetter("ctime")

#: Compaction waits for at least this many stale entries (a short deque is
#: cheap to keep as it is).
COMPACT_MIN: Final = 64


class JobOrder:
    """Queued jobs by ascending ``ctime``; equal ctimes in arrival order
    within the deque and within the sorted list."""

    __slots__ = ("_fifo", "_late", "_stale")

    def __init__(self) -> None:
        # Non-decreasing ctimes, stale entries included.
        self._fifo: deque[Job] = deque()
        self._late: SortedKeyList = SortedKeyList(key=_by_ctime)
        self._stale = 0

    def __len__(self) -> int:
        return len(self._fifo) - self._stale + len(self._late)

    def __bool__(self) -> bool:
        return len(self._fifo) > self._stale or bool(self._late)

    def add(self, job: Job) -> None:
        fifo = self._fifo
        flags = job.flags
        if not flags & FLAG_FIFO_STALE and (not fifo or fifo[-1].ctime <= job.ctime):
            fifo.append(job)
            job.flags = flags | FLAG_IN_FIFO
        else:
            self._late.add(job)

    def remove(self, job: Job) -> bool:
        """Take ``job`` out; False if it is not here."""
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
        return True

    def pop_oldest(self) -> Job | None:
        fifo = self._fifo
        late = self._late
        if late and (not fifo or late[0].ctime < fifo[0].ctime):
            job: Job = late.pop(0)
            return job
        if not fifo:
            return None
        job = fifo.popleft()
        job.flags &= ~FLAG_IN_FIFO
        if self._stale:
            self._trim()
        return job

    def oldest(self, count: int) -> list[Job]:
        """The ``count`` oldest jobs, oldest first (the order of
        :meth:`pop_oldest`), left in place."""
        return _merged(iter(self._fifo), iter(self._late), count, newest_first=False)

    def newest(self, count: int) -> list[Job]:
        """The ``count`` newest jobs, newest first, left in place."""
        return _merged(reversed(self._fifo), reversed(self._late), count, newest_first=True)

    def clear(self) -> None:
        for job in self._fifo:
            job.flags &= ~(FLAG_IN_FIFO | FLAG_FIFO_STALE)
        self._fifo.clear()
        self._late.clear()
        self._stale = 0

    def _trim(self) -> None:
        """Drop stale entries at both ends, so the heads are live."""
        fifo = self._fifo
        while fifo and not fifo[0].flags & FLAG_IN_FIFO:
            fifo.popleft().flags &= ~FLAG_FIFO_STALE
            self._stale -= 1
        while fifo and not fifo[-1].flags & FLAG_IN_FIFO:
            fifo.pop().flags &= ~FLAG_FIFO_STALE
            self._stale -= 1

    def _compact(self) -> None:
        live: deque[Job] = deque()
        for job in self._fifo:
            if job.flags & FLAG_IN_FIFO:
                live.append(job)
            else:
                job.flags &= ~FLAG_FIFO_STALE
        self._fifo = live
        self._stale = 0


def _merged(fifo: Iterator[Job], late: Iterator[Job], count: int,
            newest_first: bool) -> list[Job]:
    """Up to ``count`` jobs of a deque (skipping its stale entries) and a
    sorted list, merged by ctime; on equal ctimes the deque's job comes
    first oldest-first (as :meth:`JobOrder.pop_oldest` takes them) and last
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
