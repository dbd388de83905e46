"""Idempotent ADDJOB: the IDMP key index (an extension, docs/EXTENSIONS.md).

``ADDJOB queue body ms-timeout ... IDMP key [IDMP-WINDOW seconds]`` records
``(queue, key) -> job ID`` for the window; a retried ADDJOB with the same
key in the same queue within the window gets the first job's ID back
instead of adding a second job, whatever became of the first job (queued,
delivered, acked, even expired or collected): the retry must not re-add.
A retry with a different body is refused (``-IDMPCONFLICT``): reusing a key
for other content is a producer bug, and silently dropping the new content
(as SQS does) would lose it.

Memory: each entry is counted in the node's memory account
(:data:`ENTRY_OVERHEAD_BYTES` + the key) and the index holds at most
``idmp-max-keys`` entries; beyond that the entry closest to its expiry
goes first (counted in INFO ``idmp_evicted_keys``): the guarantee is "within
the window, unless the index overflowed".

Expiry: entries sit in one heap ordered by expiry, trimmed by the server's
cron (a bounded slice per call) and checked on lookup; no timer per key.

Replication: an entry made by an ADDJOB that waits for its copies is
*pending* until the ADDJOB answers.  If it answers -NOREPL the job does not
exist for the producer, so the entry goes and a retry adds the job; while
pending, a retry gets ``-IDMPBUSY`` rather than an ID that may yet fail.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterator
from typing import Final

from .memory import MemoryTracker

__all__ = ["DedupEntry", "DedupIndex", "body_digest", "DEFAULT_WINDOW_S", "MAX_WINDOW_S",
           "MAX_KEY_BYTES", "ENTRY_OVERHEAD_BYTES"]

#: SQS FIFO's deduplication interval.
DEFAULT_WINDOW_S: Final = 300
#: A day (Redis's IDMP-DURATION maximum): longer is the job of a database.
MAX_WINDOW_S: Final = 86400
#: SQS allows 128 characters; twice that leaves room for composite keys.
MAX_KEY_BYTES: Final = 256
#: Measured for an entry (object, dict slot, key tuple, heap item), without the key bytes.
ENTRY_OVERHEAD_BYTES: Final = 360
#: The cron removes at most this many expired entries per run.
EXPIRE_PER_RUN: Final = 2000


def body_digest(body: bytes) -> bytes:
    """What the index keeps of a body to tell a retry from a conflicting reuse."""
    return hashlib.blake2b(body, digest_size=16).digest()


class DedupEntry:
    """One key: the job it names, its body's digest, and until when (unix ms)."""

    __slots__ = ("digest", "job_id", "key", "pending", "queue", "until")

    def __init__(self, queue: bytes, key: bytes, job_id: bytes, digest: bytes, until: int,
                 pending: bool = False) -> None:
        self.queue = queue
        self.key = key
        self.job_id = job_id
        self.digest = digest
        self.until = until
        self.pending = pending

    @property
    def size(self) -> int:
        return ENTRY_OVERHEAD_BYTES + len(self.key)


class DedupIndex:
    """The node's IDMP keys, scoped per queue."""

    def __init__(self, memory: MemoryTracker, max_keys: int) -> None:
        self.memory = memory
        self.max_keys = max_keys
        self._entries: dict[tuple[bytes, bytes], DedupEntry] = {}
        # (until, seq, entry); stale items (replaced or removed entries) are
        # skipped when they surface.
        self._heap: list[tuple[int, int, DedupEntry]] = []
        self._seq = 0
        #: Entries waiting for their ADDJOB's replication, by job ID.
        self.pending: dict[bytes, DedupEntry] = {}
        self.hits = 0
        self.conflicts = 0
        self.expired = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> Iterator[DedupEntry]:
        return iter(self._entries.values())

    def is_current(self, entry: DedupEntry) -> bool:
        return self._entries.get((entry.queue, entry.key)) is entry

    def lookup(self, queue: bytes, key: bytes, now: int) -> DedupEntry | None:
        """The live entry for ``key`` in ``queue``, or None."""
        entry = self._entries.get((queue, key))
        if entry is None:
            return None
        if entry.until <= now and not entry.pending:
            self._remove(entry)
            self.expired += 1
            return None
        return entry

    def add(self, entry: DedupEntry) -> bool:
        """Record ``entry`` (replacing an older one for the same key); True
        if it is final already (not waiting for its ADDJOB's copies)."""
        k = (entry.queue, entry.key)
        old = self._entries.get(k)
        if old is not None:
            self._remove(old)
        while len(self._entries) >= self.max_keys and self._evict_one():
            pass
        self._entries[k] = entry
        self.memory.add(entry.size)
        self._seq += 1
        heapq.heappush(self._heap, (entry.until, self._seq, entry))
        if entry.pending:
            self.pending[entry.job_id] = entry
            return False
        return True

    def settle(self, job_id: bytes, achieved: bool) -> DedupEntry | None:
        """The ADDJOB of a pending entry answered: keep the entry (the job was
        added; it is returned, final now) or drop it (-NOREPL: a retry must
        add the job)."""
        entry = self.pending.pop(job_id, None)
        if entry is None:
            return None
        entry.pending = False
        if not self.is_current(entry):
            return None
        if not achieved:
            self._remove(entry)
            return None
        return entry

    def restore(self, entry: DedupEntry, now: int) -> bool:
        """An entry read back from the AOF; False if it expired meanwhile."""
        if entry.until <= now:
            return False
        self.add(entry)
        return True

    def expire(self, now: int, limit: int = EXPIRE_PER_RUN) -> int:
        """Drop up to ``limit`` expired entries (the cron)."""
        heap = self._heap
        removed = 0
        waiting: list[tuple[int, int, DedupEntry]] = []
        while heap and heap[0][0] <= now and removed < limit:
            item = heapq.heappop(heap)
            entry = item[2]
            if self.is_current(entry):
                if entry.pending:
                    waiting.append(item)  # its ADDJOB still waits: settle() decides
                    continue
                self._drop(entry)
                self.expired += 1
                removed += 1
        for item in waiting:
            heapq.heappush(heap, item)
        return removed

    def clear(self) -> None:
        for entry in self._entries.values():
            self.memory.sub(entry.size)
        self._entries.clear()
        self._heap.clear()
        self.pending.clear()

    # -- internals ------------------------------------------------------------

    def _remove(self, entry: DedupEntry) -> None:
        """Forget ``entry``; its heap item is skipped when it surfaces."""
        self._drop(entry)
        if len(self._heap) > 2 * len(self._entries) + 64:
            # Many stale items (keys replaced or released): rebuild.
            self._heap = [item for item in self._heap if self.is_current(item[2])]
            heapq.heapify(self._heap)

    def _drop(self, entry: DedupEntry) -> None:
        del self._entries[(entry.queue, entry.key)]
        self.memory.sub(entry.size)
        if entry.pending:
            self.pending.pop(entry.job_id, None)

    def _evict_one(self) -> bool:
        """The index is full: drop the entry that expires first."""
        heap = self._heap
        waiting: list[tuple[int, int, DedupEntry]] = []
        found = False
        while heap:
            item = heapq.heappop(heap)
            entry = item[2]
            if self.is_current(entry):
                if entry.pending:
                    waiting.append(item)
                    continue
                self._drop(entry)
                self.evicted += 1
                found = True
                break
        for item in waiting:
            heapq.heappush(heap, item)
        return found
