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

import logging
import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["MemoryTracker", "rss_bytes", "free_memory_if_needed", "smallest_limit"]

log = logging.getLogger("disque.memory")

#: Eviction stops after this long, so one command never stalls the loop.
EVICTION_BUDGET_S = 0.001


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1024 ** 2:.1f}mb"


def smallest_limit(base: int) -> int:
    """The least ``maxmemory`` under which one small job in a new queue fits.

    ``base`` (the process's size at start-up) counts in ``used_memory``, so
    a limit at or below it refuses every ADDJOB with -OOM.
    """
    from .jobs import JOB_OVERHEAD_BYTES
    from .queue import QUEUE_ENTRY_BYTES, QUEUE_OVERHEAD_BYTES

    return base + JOB_OVERHEAD_BYTES + QUEUE_OVERHEAD_BYTES + QUEUE_ENTRY_BYTES + 1


def limit_problem(maxmemory: int, base: int) -> str | None:
    """Why ``maxmemory`` cannot hold a single job on top of ``base``, or None."""
    least = smallest_limit(base)
    if maxmemory >= least:
        return None
    return (f"maxmemory {maxmemory} ({_mb(maxmemory)}) cannot hold a single job: the node "
            f"itself uses {base} bytes ({_mb(base)}, its size at start-up, counted in "
            f"used_memory), so every ADDJOB would get -OOM; the least that holds one job "
            f"is {least}, and real work needs much more")


class MemoryTracker:
    __slots__ = ("_maxmemory", "accounted", "base", "peak")

    def __init__(self, maxmemory: int, base: int | None = None) -> None:
        self.base = rss_bytes() if base is None else base
        self.accounted = 0
        self.peak = self.base
        # At start-up a limit that is too small is logged, not refused: the
        # baseline is only known once the process runs, and the node still
        # answers reads and admin commands (CONFIG SET can fix the limit).
        self._maxmemory = maxmemory
        problem = limit_problem(maxmemory, self.base)
        if problem is not None:
            log.warning("WARNING: %s. Raise it with CONFIG SET maxmemory or --maxmemory.",
                        problem)

    @property
    def maxmemory(self) -> int:
        return self._maxmemory

    @maxmemory.setter
    def maxmemory(self, value: int) -> None:
        """Refuses (ValueError) a limit that cannot hold one job (CONFIG SET)."""
        problem = limit_problem(value, self.base)
        if problem is not None:
            raise ValueError(problem)
        self._maxmemory = value

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
        limit = self._maxmemory
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
