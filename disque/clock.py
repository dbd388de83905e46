"""Time sources.  Everything time-driven reads the clock through one object
so that unit tests of the schedule can move time by hand.

The node's clock is wall-clock milliseconds (job times are persisted and
must mean the same after a restart, and IDs carry the creation time) that
*never jump*: it is read from the system clock once, then advanced by the
monotonic clock.  When the system clock is stepped (an operator, a VM
resumed, NTP correcting a bad boot time), RETRY, DELAY, TTL, the ACK GC's
backoff and the cluster's failure detection keep their pace; the node's
clock then catches up with the system clock by at most
:data:`FOLLOW_RATE` of the elapsed time (:meth:`Clock.follow_wall`, from the
cron), so a timer runs at most 1% fast or slow meanwhile.  NTP's own slewing
moves the monotonic clock too, so a well-kept clock is followed exactly.
"""

from __future__ import annotations

import random
import time
from typing import Final

__all__ = ["Clock", "FOLLOW_RATE", "ManualClock", "random_time_error"]

#: Final: compiled, a C static rather than two lookups (module, attribute)
#: in a method every command calls.
_time_ns: Final = time.time_ns
_monotonic_ns: Final = time.monotonic_ns
_monotonic: Final = time.monotonic

#: The node's clock moves toward a stepped system clock by at most this
#: fraction of the time elapsed (1%: a 30 s step is absorbed in 50 minutes).
FOLLOW_RATE: Final = 0.01


class Clock:
    """Wall-clock milliseconds on the monotonic clock's pace (see the module)."""

    def __init__(self) -> None:
        self._offset_ns = _time_ns() - _monotonic_ns()
        # The same offset in float milliseconds, for now_ms(): ns since 1970
        # are past what the compiled core keeps unboxed, a float's 53 bits
        # hold today's milliseconds to well under a microsecond.
        self._offset_ms = self._offset_ns / 1e6
        self._last_follow_ns = _monotonic_ns()

    def now_ms(self) -> int:
        return int(_monotonic() * 1000.0 + self._offset_ms)

    def skew_ms(self) -> int:
        """The system clock minus this clock, in ms (0 unless it was stepped)."""
        return (_time_ns() - _monotonic_ns() - self._offset_ns) // 1_000_000

    def follow_wall(self) -> int:
        """Move toward the system clock by at most FOLLOW_RATE of the time
        since the last call; the skew left, in ms."""
        mono = _monotonic_ns()
        budget = int((mono - self._last_follow_ns) * FOLLOW_RATE)
        self._last_follow_ns = mono
        skew = _time_ns() - mono - self._offset_ns
        step = max(-budget, min(budget, skew))
        self._offset_ns += step
        self._offset_ms = self._offset_ns / 1e6
        return (skew - step) // 1_000_000


class ManualClock(Clock):
    """A clock that only moves when told to (tests)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        super().__init__()
        self.ms = start_ms

    def now_ms(self) -> int:
        return self.ms

    def skew_ms(self) -> int:
        return 0

    def follow_wall(self) -> int:
        return 0

    def advance(self, ms: int) -> None:
        self.ms += ms


class _Jitter:
    """The state of :func:`random_time_error`'s generator."""

    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = random.getrandbits(30)


#: A linear congruential generator modulo 2**30: a multiplier = 1 (mod 4)
#: and an odd increment give it the full period (Hull-Dobell), and both
#: factors of each step stay below 2**30, where the compiled core multiplies
#: machine integers (random.random() is a call into Python per job).
#: Jitter needs no better randomness: it only has to spread copies apart.
_LCG_MULTIPLIER: Final = 29773421
_LCG_INCREMENT: Final = 1013904223 & 0x3FFFFFFF
_JITTER: Final = _Jitter()


def random_time_error(span_ms: int = 500) -> int:
    """Jitter in [-span/2, span/2), like the original's randomTimeError.

    Copies of a job on different nodes must not all requeue at the same
    instant; the jitter spreads them so WILLQUEUE/QUEUED can de-duplicate.
    Each process seeds its own generator, so nodes do not draw alike.
    """
    jitter = _JITTER
    state = (jitter.state * _LCG_MULTIPLIER + _LCG_INCREMENT) & 0x3FFFFFFF
    jitter.state = state
    # The high bits: an LCG's low bits repeat with short periods.
    return ((state * span_ms) >> 30) - span_ms // 2
