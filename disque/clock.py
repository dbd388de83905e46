"""Time sources.  Everything time-driven reads the clock through one object
so that unit tests of the schedule can move time by hand."""

from __future__ import annotations

import time
from random import random
from typing import Final

__all__ = ["Clock", "ManualClock", "random_time_error"]

#: Final: compiled, a C static rather than two lookups (module, attribute)
#: in a method every command calls.
_time_ns: Final = time.time_ns


class Clock:
    """Wall-clock milliseconds: job times are persisted and must survive restarts."""

    def now_ms(self) -> int:
        return _time_ns() // 1_000_000


class ManualClock(Clock):
    """A clock that only moves when told to (tests)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.ms = start_ms

    def now_ms(self) -> int:
        return self.ms

    def advance(self, ms: int) -> None:
        self.ms += ms


def random_time_error(span_ms: int = 500) -> int:
    """Jitter in [-span/2, span/2), like the original's randomTimeError.

    Copies of a job on different nodes must not all requeue at the same
    instant; the jitter spreads them so WILLQUEUE/QUEUED can de-duplicate.
    """
    # random() rather than randrange(): the same distribution at half the cost.
    return int(random() * span_ms) - span_ms // 2
