"""Memory accounting and the out-of-memory rules (the original README's FAQ).

``used_memory`` counts what the original's allocator count counts: the
node's data, not the interpreter.  It is the sum of

* a fixed **start-up share** (:data:`STARTUP_BYTES`): the node's own tables
  before it holds anything (the job and queue tables' 4096 slices each),
  comparable to the original's ~0.75 MB at start;
* the **dataset**: each job costs its body plus a fixed overhead measured
  for this implementation (``jobs.JOB_OVERHEAD_BYTES``, checked against
  tracemalloc in the tests), each queue and queued entry likewise, each IDMP
  key; an acked job is a job until it is forgotten.  Updating it is an
  integer addition, so checking the level before every command costs nothing;
* the **buffers**: replies and bus messages waiting to be sent (a slow
  reader's), summed by the server's cron once a second.

The Python process itself (~30 MB resident before it holds a job) is not
counted: ``used_memory_rss`` reports it.  Python never gives freed memory
back to the OS promptly either, so RSS stays high after a burst and would
keep the node "full" forever; the account does not.

Levels, as a fraction of ``maxmemory``:

* ≥ 75%: new jobs are replicated to other nodes without a local copy (when
  other nodes can take them), copies from other nodes are refused, idle
  queues are evicted after 10 s;
* ≥ 95%: before commands run, acked jobs and delivered at-most-once jobs
  are evicted (oldest first; ``eviction.py``) and idle queues after 2 s;
* ≥ 100%: commands that would use more memory get ``-OOM``.

``maxmemory 0`` means what it means to the original: the node is always at
least at the 95% level (no local copies of new jobs where other nodes can
take them, copies refused, idle queues evicted after 2 s), but nothing is
evicted and nothing refused with ``-OOM``.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = ["MemoryTracker", "STARTUP_BYTES", "UNLIMITED_LEVEL", "rss_bytes", "limit_warning"]

#: The node's share of ``used_memory`` before it holds anything: its job and
#: queue tables (keyspace.SLICES dicts each, ~590 kB) and the rest of its
#: state; checked against tracemalloc in the tests.
STARTUP_BYTES: Final = 600 * 1024

#: The memory level when ``maxmemory`` is 0 (see the module's docstring).
UNLIMITED_LEVEL: Final = 2


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _human(nbytes: int) -> str:
    return f"{nbytes / 1024 ** 2:.2f}mb" if nbytes >= 1024 ** 2 else f"{nbytes / 1024:.1f}kb"


def limit_warning(maxmemory: int, used: int, startup: int, rss: int) -> str | None:
    """What an operator should know about ``maxmemory``, or None for a usual limit.

    Such limits are taken (the original's tools set 1 or 3mb on purpose to
    reach the memory levels), never refused; the node says what they mean.
    """
    if maxmemory == 0:
        return ("maxmemory is 0: as in the original Disque, the node is then always at "
                "its 95% memory level: new jobs get no local copy where other nodes can "
                "take them, copies from other nodes are refused and idle queues are "
                "evicted after 2 s (nothing is evicted or refused with -OOM). Set a "
                "limit in bytes to bound the node's data")
    if maxmemory * 20 <= used * 19:
        return (f"maxmemory {maxmemory} ({_human(maxmemory)}) is below 95% of what the "
                f"node holds now (used_memory {used} = start-up {startup} + data and "
                f"buffers {used - startup}): acked and delivered at-most-once jobs are "
                "evicted before every command and commands that add data get -OOM")
    if rss and maxmemory < rss:
        return (f"maxmemory {maxmemory} ({_human(maxmemory)}) limits the node's data "
                f"(used_memory, now {used}), not the process, whose resident size is "
                f"{rss} ({_human(rss)}) now; size it as described under Memory in "
                "docs/SERVER.md")
    return None


class MemoryTracker:
    """``used_memory`` = start-up share + dataset + buffers, and its levels."""

    __slots__ = ("_at_most_75", "_at_most_95", "accounted", "buffers", "client_buffers",
                 "maxmemory", "peak", "startup")

    def __init__(self, maxmemory: int, startup: int = STARTUP_BYTES) -> None:
        self.maxmemory = self._at_most_75 = self._at_most_95 = 0
        self.set_maxmemory(maxmemory)
        self.startup = startup
        #: The dataset: jobs, queues, queued entries, IDMP keys.
        self.accounted = 0
        #: Client and cluster link buffers, as last summed (set_buffers).
        self.buffers = 0
        self.client_buffers = 0
        self.peak = startup

    def set_maxmemory(self, maxmemory: int) -> None:
        """The limit, and the largest use at each level, worked out once:
        compiled, the products of a limit of gigabytes do not fit the
        machine-integer fast path, and :meth:`level` runs for every command."""
        self.maxmemory = maxmemory
        self._at_most_75 = maxmemory * 15 // 20
        self._at_most_95 = maxmemory * 19 // 20

    def set_buffers(self, clients: int, links: int) -> None:
        """The bytes now waiting in client buffers and in cluster bus links."""
        self.client_buffers = clients
        self.buffers = clients + links

    def add(self, nbytes: int) -> None:
        self.accounted += nbytes

    def sub(self, nbytes: int) -> None:
        self.accounted -= nbytes

    @property
    def used(self) -> int:
        used = self.startup + self.accounted + self.buffers
        if used > self.peak:
            self.peak = used
        return used

    def level(self) -> int:
        """0 normal, 1 above 75%, 2 above 95%, 3 at or above 100% of maxmemory."""
        limit = self.maxmemory
        if limit == 0:
            return UNLIMITED_LEVEL
        used = self.startup + self.accounted + self.buffers
        if used <= self._at_most_75:
            return 0
        if used <= self._at_most_95:
            return 1
        if used < limit:
            return 2
        return 3
