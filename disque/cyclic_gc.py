"""Keep CPython's cyclic garbage collector off the stored jobs.

Run interpreted, every stored job is a GC-tracked object (compiled, ``Job``
is declared acyclic and is not tracked, but what the node holds besides
jobs is).  The collector's full collections walk all tracked objects, and
by default one runs each time the long-lived ones grow by 25%: with a
million jobs that is a 0.3-0.5 s stall every few seconds of sustained
ADDJOB load, and about a fifth of the node's CPU (measured with perf under
a sustained ADDJOB load).  Jobs never form reference cycles, so walking
them is wasted work.

The policy: every ``FREEZE_PERIOD_S`` the cron calls :func:`gc.freeze`,
which moves every object that is alive at that moment into the permanent
generation (O(1), no traversal).  Collections then only look at what was
allocated since, which is what produces cyclic garbage in a server (a
closed connection, a finished task).  A cycle that was alive at a freeze
and dies later is not collected while frozen, so every
``UNFREEZE_PERIOD_S`` the permanent generation is handed back and one
full collection runs at once (it must run before the next freeze, or a
quiet node would freeze the same garbage again): one full collection an
hour, about 0.4 s per million stored jobs, instead of one every few seconds
under load, and no unbounded leak.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["CollectorPolicy"]

#: How often objects alive now are moved out of the collector's sight.
FREEZE_PERIOD_S: Final = 1.0
#: How often they are handed back, so that frozen cycles are eventually freed.
UNFREEZE_PERIOD_S: Final = 3600.0


#: Gen-1 collections between full ones (CPython's default is 10).  A full
#: collection walks everything allocated since the last freeze: with the
#: default, a node taking 25k jobs a second ran several a second, walking
#: the same new jobs again each time (7% of a cluster node's CPU).  At 1000
#: they practically never run between two freezes; garbage cycles still go
#: in gen-0/1 collections, or in the hourly full collection.
FULL_COLLECTION_THRESHOLD: Final = 1000


class CollectorPolicy:
    """Called from the cron with the monotonic time; see the module docstring."""

    __slots__ = ("_last_freeze", "_last_unfreeze", "freezes", "unfreezes")

    def __init__(self, now: float) -> None:
        self._last_freeze = now
        self._last_unfreeze = now
        self.freezes = 0
        self.unfreezes = 0

    @staticmethod
    def install() -> None:
        """The node's collector thresholds (process-wide: call once, at start)."""
        gen0, gen1, _gen2 = gc.get_threshold()
        gc.set_threshold(gen0, gen1, FULL_COLLECTION_THRESHOLD)

    def tick(self, now: float) -> None:
        if now - self._last_unfreeze >= UNFREEZE_PERIOD_S:
            self._last_unfreeze = self._last_freeze = now
            gc.unfreeze()
            gc.collect()
            self.unfreezes += 1
        elif now - self._last_freeze >= FREEZE_PERIOD_S:
            self._last_freeze = now
            gc.freeze()
            self.freezes += 1
