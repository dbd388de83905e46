"""A queue's rate limit (QLIMIT, an extension): at most ``max_jobs``
delivered per ``period_ms`` on this node.

Fixed windows: the first delivery after a window has ended opens the next
one, ``[now, now + period_ms)``, and a window delivers at most
``max_jobs``.  Deliveries are the jobs GETJOB hands out (to a client that
asked, or to one that was blocked); jobs that leave the queue another way
(YOURJOBS to another node, DEQUEUE, an ACK) do not count.  Like every
fixed-window limiter (BullMQ's), two windows back to back may deliver up to
``2 * max_jobs`` within a span of ``period_ms`` across their boundary; over
many periods the rate is ``max_jobs / period_ms``.

The limit holds the one timer of its queue (``wake``): armed while clients
wait on a queue that has jobs but no room left in its window, it fires when
the window ends (``queue.serve_blocked_clients``).  No timer per client and
no polling.  Here are the data and the arithmetic; the procedures are in
``queue.py``.
"""

from __future__ import annotations

import asyncio
from typing import Final

__all__ = ["QueueLimit", "MAX_LIMIT_JOBS", "MAX_LIMIT_PERIOD_MS"]

#: ``max_jobs`` is a u32 on the bus and in the AOF.
MAX_LIMIT_JOBS: Final = 2 ** 32 - 1
#: The longest period: a day.
MAX_LIMIT_PERIOD_MS: Final = 86_400_000


class QueueLimit:
    """The limit of one queue and the state of its current window."""

    __slots__ = ("delivered", "limited", "max_jobs", "period_ms", "wake", "window_end")

    def __init__(self, max_jobs: int, period_ms: int) -> None:
        self.max_jobs = max_jobs
        self.period_ms = period_ms
        #: When the current window ends (ms; 0: no window open yet).
        self.window_end = 0
        #: Jobs delivered in the current window.
        self.delivered = 0
        #: Fetches that got fewer jobs than asked (or none) because the
        #: window was full (QSTAT ``rate-limited``, the metrics).
        self.limited = 0
        #: The timer that serves the queue's waiting clients when the window ends.
        self.wake: asyncio.TimerHandle | None = None

    def left(self, now: int) -> int:
        """Jobs the window still lets through at ``now`` (a new window: all)."""
        if now >= self.window_end:
            return self.max_jobs
        return self.max_jobs - self.delivered

    def take(self, now: int, wanted: int) -> int:
        """Count up to ``wanted`` deliveries in the window of ``now`` (opening
        a new one if the last has ended); how many are allowed."""
        if now >= self.window_end:
            self.window_end = now + self.period_ms
            self.delivered = 0
        allowed = self.max_jobs - self.delivered
        if wanted > allowed:
            self.limited += 1
            wanted = allowed
        self.delivered += wanted
        return wanted

    def cancel_wake(self) -> None:
        if self.wake is not None:
            self.wake.cancel()
            self.wake = None
