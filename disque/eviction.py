"""Eviction at the 95% memory level (freeMemoryIfNeeded): before a command
that may use more memory runs, acked jobs and delivered at-most-once jobs are
dropped, oldest first, until the node is back under 95% (see memory.py for
the levels)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

from .jobs import unregister_job

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["free_memory_if_needed", "EVICTION_BUDGET_S"]

#: Eviction stops after this long, so one command never stalls the loop.
EVICTION_BUDGET_S: Final = 0.001


def free_memory_if_needed(state: ServerState) -> int:
    """Evict what may be evicted until under 95%; return the level after it.

    With ``maxmemory 0`` nothing is evicted (the original skips this step
    without a limit), so the level stays below the -OOM one.
    """
    memory = state.memory
    level = memory.level()
    if level < 2 or memory.maxmemory == 0 or state.config.maxmemory_policy == "noeviction":
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
