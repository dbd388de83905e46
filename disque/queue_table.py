"""Queues and the queue table: the data.

A queue holds its jobs in delivery order (``queue_order.JobOrder``: by
priority, then creation time), its pause flags, statistics, the GETJOB
clients waiting on it and, once it federates, what it remembers of asking
for and importing jobs.  A queue
exists only while something needs it: empty, unpaused queues without
waiting clients are evicted after a while (``ServerState.evict_idle_queues``).

The spec's procedures on queues (ENQUEUE, DEQUEUE, NACK, the fetch of
GETJOB) are in ``queue.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from .job import Job
from .keyspace import SlicedDict, name_slice
from .queue_limit import QueueLimit
from .queue_order import JobOrder

if TYPE_CHECKING:
    from .groups import QueueGroups
    from .waiters import BlockedGet

__all__ = ["Queue", "QueueRegistry", "QueueFederation", "Ask", "PAUSED_IN", "PAUSED_OUT",
           "pause_label", "QUEUE_OVERHEAD_BYTES", "QUEUE_ENTRY_BYTES"]


class QueueFederation:
    """What one queue remembers about asking for and importing jobs."""

    __slots__ = ("adhoc_attempt", "adhoc_time", "asked", "bcast_time", "cur_count",
                 "cur_start", "prev_count", "prev_start", "responders", "withdraw_time",
                 "withdrawn")

    def __init__(self) -> None:
        #: When NEEDJOBS last went to every node (ms).
        self.bcast_time = 0
        #: Our nodes asked for jobs and not answered since: they keep the ask.
        self.asked: dict[str, None] = {}
        #: When the asks were last withdrawn (ms), and whether the next need
        #: must ask every node again at once.
        self.withdraw_time = 0
        self.withdrawn = False
        self.adhoc_time = 0
        self.adhoc_attempt = 0
        #: node ID -> when it last sent us jobs for this queue (ms).
        self.responders: dict[str, int] = {}
        # Jobs imported in the current and the previous second.
        self.cur_start = 0
        self.cur_count = 0
        self.prev_start = 0
        self.prev_count = 0


class Ask:
    """Another node's NEEDJOBS for a queue (federation.py): how many jobs it
    asked for, whether it waits for them, when it was last sent some."""

    __slots__ = ("busy_until", "count", "sent", "until", "waiting")

    def __init__(self, until: int, count: int) -> None:
        #: Forgotten after this (ms), unless the node asks again.
        self.until = until
        #: How many jobs it asked for.
        self.count = count
        #: Asked and not answered yet.
        self.waiting = True
        #: When it was last sent jobs of the queue (ms; 0: never).
        self.sent = 0
        #: Until when its YOURJOBS are paced (ms): jobs came faster than it
        #: asked for them (federation.py).
        self.busy_until = 0


PAUSED_IN: Final = 1
PAUSED_OUT: Final = 2
_PAUSE_LABELS: Final = {0: "none", PAUSED_IN: "in", PAUSED_OUT: "out",
                         PAUSED_IN | PAUSED_OUT: "all"}

#: Memory attributed to one queue besides its jobs (measured, see tests).
QUEUE_OVERHEAD_BYTES: Final = 1200
#: Memory attributed to one queued entry (a deque slot; a re-queued job's
#: sorted-list entry costs more, but such jobs are few).
QUEUE_ENTRY_BYTES: Final = 8


def pause_label(flags: int) -> str:
    return _PAUSE_LABELS[flags & (PAUSED_IN | PAUSED_OUT)]


class Queue:
    """A named queue of jobs ordered by priority, then creation time (``ctime``)."""

    __slots__ = (
        "atime",
        "ctime",
        "dead_lettered",
        "entry_prefix",
        "fed",
        "flags",
        "groups",
        "jobs",
        "jobs_in",
        "jobs_out",
        "limit",
        "name",
        "waiters",
    )

    def __init__(self, name: bytes, now_ms: int) -> None:
        self.name = name
        # The jobs themselves, in delivery order (priority, then oldest ctime).
        self.jobs = JobOrder()
        self.ctime = now_ms
        self.atime = now_ms
        self.flags = 0
        self.jobs_in = 0
        self.jobs_out = 0
        #: Jobs this node moved out of this queue to a dead-letter queue (MAXDELIVERIES).
        self.dead_lettered = 0
        # Blocked GETJOB clients in arrival order (a dict keeps order and removes in O(1)).
        self.waiters: dict[BlockedGet, None] = {}
        # Federation state, made when the queue first asks for or imports
        # jobs (federation.py); None on a lone node.
        self.fed: QueueFederation | None = None
        #: The rate limit (QLIMIT, an extension; queue_limit.py), or None.
        self.limit: QueueLimit | None = None
        #: Its ordered groups (GROUP, an extension; groups.py), or None
        #: while it has no job of a group queued or out.
        self.groups: QueueGroups | None = None
        #: How GETJOB's reply starts each entry of this queue, encoded on
        #: first use (waiters.py); b"" until then.
        self.entry_prefix = b""

    def __len__(self) -> int:
        """Queued jobs, those waiting behind their group's next job included."""
        groups = self.groups
        if groups is None:
            return len(self.jobs)
        return len(self.jobs) + groups.waiting

    @property
    def paused_in(self) -> bool:
        return bool(self.flags & PAUSED_IN)

    @property
    def paused_out(self) -> bool:
        return bool(self.flags & PAUSED_OUT)

    def is_evictable(self, now_ms: int, idle_ms: int) -> bool:
        """Empty, not paused nor rate-limited, nobody waiting, no group
        holding jobs, untouched for ``idle_ms``."""
        return (not self.jobs and not self.flags and not self.waiters and self.limit is None
                and self.groups is None and now_ms - self.atime >= idle_ms)

    def peek(self, count: int) -> list[Job]:
        """The ``count`` jobs GETJOB hands out next, or the ``-count`` it
        hands out last (the last first)."""
        if count >= 0:
            return self.jobs.first(count)
        return self.jobs.last(-count)


class QueueRegistry:
    """All queues of this node, scannable with QSCAN."""

    __slots__ = ("_by_name", "_queues", "asks", "asks_swept", "held", "limited",
                 "push_timer", "push_timer_at", "unclaimed")

    def __init__(self) -> None:
        self._queues: SlicedDict[bytes, Queue] = SlicedDict(name_slice)
        # A flat index too: every job command looks its queue up, and queues
        # are few, so a second dict is cheaper than hashing into a slice.
        self._by_name: dict[bytes, Queue] = {}
        #: The queues with a rate limit (an AOF rewrite writes them all).
        self.limited: dict[bytes, Queue] = {}
        #: The other nodes waiting for jobs (federation.py), by queue name,
        #: whether or not the queue exists here: node ID -> its ask, in the
        #: order they asked.  Empty unless other nodes' consumers wait.
        self.asks: dict[bytes, dict[str, Ask]] = {}
        #: When expired asks were last dropped (ms).
        self.asks_swept = 0
        #: Queues that got jobs no local consumer waited for while other
        #: nodes asked, to offer at the end of the loop turn (federation.py).
        self.unclaimed: dict[bytes, None] = {}
        #: Queues whose offer waits for the gap between two YOURJOBS to one
        #: node (federation.PUSH_GAP_MS), and the one timer for them.
        self.held: dict[bytes, None] = {}
        self.push_timer: asyncio.TimerHandle | None = None
        self.push_timer_at = 0

    def __len__(self) -> int:
        return len(self._queues)

    def lookup(self, name: bytes) -> Queue | None:
        return self._by_name.get(name)

    def get_or_create(self, name: bytes, now_ms: int) -> Queue:
        q = self._by_name.get(name)
        if q is None:
            q = Queue(bytes(name), now_ms)
            self.add(q)
        return q

    def add(self, q: Queue) -> None:
        self._queues.add(q.name, q)
        self._by_name[q.name] = q

    def remove(self, q: Queue) -> None:
        self._queues.pop(q.name)
        self._by_name.pop(q.name, None)

    def all(self) -> Iterator[Queue]:
        return self._queues.values()

    def scan(self, cursor: int, count: int,
             accept: Callable[[Queue], bool] | None = None) -> tuple[int, list[Queue]]:
        return self._queues.scan(cursor, count, accept)

    def clear(self) -> None:
        for q in self.limited.values():
            if q.limit is not None:
                q.limit.cancel_wake()
        self.limited.clear()
        self.asks.clear()
        self.unclaimed.clear()
        self.held.clear()
        if self.push_timer is not None:
            self.push_timer.cancel()
            self.push_timer = None
        self._queues.clear()
        self._by_name.clear()
