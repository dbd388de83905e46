"""Items by time: buckets of milliseconds and a heap of their numbers.

The job schedule (``job_table.AwakeSchedule``) and the blocked commands'
deadlines (``waiters.BlockDeadlines``) keep their items this way.  A bucket
is a dict used as an ordered set, so an item leaves in O(1) wherever it is;
a heap orders the bucket numbers.  The owner knows each item's own time and
the bucket width: it passes the bucket number in, and checks the items of
the earliest bucket against their times (a bucket opens when its first
millisecond is due, not all of its items are).

Compared with a heap of ``(time, seq, item)`` tuples this costs one dict
slot per item instead of a tuple and a sequence number, and a lazily
deleted heap would keep every item that left (an acked job and its body, a
client that went away) alive until its time came.
"""

from __future__ import annotations

import heapq
from typing import Final, Generic, TypeVar

__all__ = ["TimeBuckets"]

T = TypeVar("T")

#: Numbers of emptied buckets the heap may hold beyond twice the live ones
#: before it is rebuilt.
STALE_NUMBERS: Final = 1024
#: Buckets found last, by number modulo RECENT (a direct-mapped cache).
#: Items mostly go to a few dozen buckets at a time (a pipeline of ADDJOBs:
#: their RETRY times spread over the 500 ms of requeue jitter, 32 buckets of
#: 16 ms), and comparing a number costs less than a dict lookup (compiled:
#: boxing the number, hashing it, looking it up; ~400 instructions).
RECENT: Final = 64


class TimeBuckets(Generic[T]):
    __slots__ = ("_buckets", "_heaped", "_keys", "_recent", "_recent_numbers")

    def __init__(self) -> None:
        # Emptied buckets are deleted at once: a dict keeps its table after
        # its entries go, and a bucket may have held thousands of items.
        self._buckets: dict[int, dict[T, None]] = {}
        self._keys: list[int] = []    # heap of bucket numbers (some maybe emptied since)
        self._heaped: set[int] = set()  # the numbers in _keys, so each is pushed once
        # Slot number % RECENT: a bucket found last and its number (None: none).
        self._recent: list[dict[T, None] | None] = [None] * RECENT
        self._recent_numbers: list[int] = [0] * RECENT

    def __len__(self) -> int:
        """Items held."""
        return sum(map(len, self._buckets.values()))

    @property
    def numbers_held(self) -> int:
        """Bucket numbers in the heap, emptied ones included (they are bounded)."""
        return len(self._keys)

    def add(self, number: int, item: T) -> None:
        slot = number & (RECENT - 1)
        bucket = self._recent[slot]
        if bucket is None or self._recent_numbers[slot] != number:
            bucket = self._buckets.get(number)
            if bucket is None:
                bucket = self._buckets[number] = {}
                if number not in self._heaped:
                    self._heaped.add(number)
                    heapq.heappush(self._keys, number)
            self._recent[slot] = bucket
            self._recent_numbers[slot] = number
        bucket[item] = None

    def _bucket(self, number: int) -> dict[T, None] | None:
        """Bucket ``number``, if it exists."""
        slot = number & (RECENT - 1)
        bucket = self._recent[slot]
        if bucket is not None and self._recent_numbers[slot] == number:
            return bucket
        return self._buckets.get(number)

    def _forget(self, number: int) -> None:
        """Bucket ``number`` was deleted: add() must not fill it any more."""
        slot = number & (RECENT - 1)
        if self._recent_numbers[slot] == number:
            self._recent[slot] = None

    def remove(self, number: int, item: T) -> None:
        """Take ``item`` out of bucket ``number`` (nothing if it is not there)."""
        bucket = self._bucket(number)
        if bucket is not None:
            if item in bucket:  # not pop(item, None): compiled, a Python-level call
                del bucket[item]
            if not bucket:
                del self._buckets[number]
                self._forget(number)
                if len(self._keys) > 2 * len(self._buckets) + STALE_NUMBERS:
                    self._rebuild_keys()

    def _rebuild_keys(self) -> None:
        """Drop the heap's numbers of emptied buckets.

        They would otherwise stay until their time comes: an item that left
        long before its time (a job acked days before its expiry, a GETJOB
        with a long TIMEOUT answered at once) leaves one behind.
        """
        self._keys = list(self._buckets)
        heapq.heapify(self._keys)
        self._heaped = set(self._keys)

    def earliest(self) -> tuple[int, dict[T, None]] | None:
        """The earliest bucket holding items and its number (emptied numbers are dropped)."""
        keys, buckets = self._keys, self._buckets
        while keys:
            number = keys[0]
            bucket = buckets.get(number)
            if bucket:
                return number, bucket
            self.drop(number)
        return None

    def drop(self, number: int) -> None:
        """Forget the earliest bucket, ``number`` (emptied by the caller)."""
        heapq.heappop(self._keys)
        self._heaped.discard(number)
        self._buckets.pop(number, None)
        self._forget(number)

    def clear(self) -> None:
        self._buckets.clear()
        self._keys.clear()
        self._heaped.clear()
        self._recent = [None] * RECENT
