"""Memory accounting and the out-of-memory rules (the original README's FAQ).

Python's RSS is a poor signal for decisions: freed objects go back to the
allocator, not to the OS, so RSS stays high after a burst and would keep
the node "out of memory" forever.  Instead the node keeps an account of the
bytes it holds for users: each job costs its body plus a fixed overhead
measured for this implementation (``JOB_OVERHEAD_BYTES``, checked against
tracemalloc in the tests), each queue and queued entry likewise.  The
process's resident size at start-up is added as a base, so ``used_memory``
approximates what the process uses.  Updating the account is an integer
addition, so checking the level before every command costs nothing.

Levels, as a fraction of ``maxmemory``:

* ≥ 75%: new jobs are replicated to other nodes without a local copy (when
  other nodes can take them), idle queues are evicted after 10 s;
* ≥ 95%: before commands run, acked jobs and delivered at-most-once jobs
  are evicted (oldest first) and idle queues after 2 s;
* ≥ 100%: commands that would use more memory get ``-OOM``.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["MemoryTracker", "rss_bytes", "free_memory_if_needed"]

#: Eviction stops after this long, so one command never stalls the loop.
EVICTION_BUDGET_S = 0.001


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemoryTracker:
    __slots__ = ("accounted", "base", "maxmemory", "peak")

    def __init__(self, maxmemory: int, base: int | None = None) -> None:
        self.base = rss_bytes() if base is None else base
        self.accounted = 0
        self.peak = self.base
        self.maxmemory = maxmemory

    def add(self, nbytes: int) -> None:
        self.accounted += nbytes

    def sub(self, nbytes: int) -> None:
        self.accounted -= nbytes

    @property
    def used(self) -> int:
        used = self.base + self.accounted
        if used > self.peak:
            self.peak = used
        return used

    def level(self) -> int:
        """0 normal, 1 above 75%, 2 above 95%, 3 at or above 100% of maxmemory."""
        used = self.base + self.accounted
        limit = self.maxmemory
        if used * 20 <= limit * 15:
            return 0
        if used * 20 <= limit * 19:
            return 1
        if used < limit:
            return 2
        return 3


def free_memory_if_needed(state: ServerState) -> int:
    """Evict what may be evicted until under 95%; return the level after it."""
    from .jobs import unregister_job

    memory = state.memory
    level = memory.level()
    if level < 2 or state.config.maxmemory_policy == "noeviction":
        return level
    deadline = time.perf_counter() + EVICTION_BUDGET_S
    evicted = 0
    while memory.level() >= 2:
        job = state.jobs.oldest_evictable()
        if job is None:
            break
        unregister_job(state, job)
        evicted += 1
        state.stats.evicted_jobs += 1
        if evicted % 32 == 0 and time.perf_counter() > deadline:
            break
    if memory.level() >= 2:
        state.evict_idle_queues(idle_ms=2000, budget_s=EVICTION_BUDGET_S)
    return memory.level()
