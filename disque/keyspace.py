"""A dictionary that can be scanned with a stateless integer cursor.

QSCAN and JSCAN promise (like Redis SCAN) that a full iteration returns every
element that was present for the whole iteration, possibly with duplicates,
without the server keeping any per-iteration state.  A Python ``dict`` cannot
resume an iteration after it changed, so the entries live in a fixed number
of *slices* chosen by a stable function of the key.  A cursor is a slice
number: a call returns whole slices, so an element can never be skipped, and
the cursor simply moves to the next slice.  Keys never move between slices.

Job IDs already carry 144 random bits, so their slice is two base64
characters of the random part (4096 slices); queue names are hashed with
CRC32.  Lookups cost one extra list index compared to a plain dict.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from itertools import compress, islice
from typing import Final, Generic, TypeVar

from .job import B64_VALUE

__all__ = ["SlicedDict", "SLICES", "job_id_slice", "name_slice"]

K = TypeVar("K")
V = TypeVar("V")

SLICE_BITS: Final = 12
SLICES: Final = 1 << SLICE_BITS


def job_id_slice(job_id: bytes) -> int:
    """Slice of a (valid) job ID: the first two characters of its random part."""
    return (B64_VALUE[job_id[11]] << 6) | B64_VALUE[job_id[12]]


def name_slice(name: bytes) -> int:
    return zlib.crc32(name) & (SLICES - 1)


class SlicedDict(Generic[K, V]):
    """A mapping split into ``SLICES`` dicts by ``slice_of(key)``."""

    __slots__ = ("_len", "_slice_of", "_slices")

    def __init__(self, slice_of: Callable[[K], int]) -> None:
        self._slices: list[dict[K, V]] = [{} for _ in range(SLICES)]
        self._slice_of = slice_of
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def slices(self) -> list[dict[K, V]]:
        """The slice dicts, for owners that compute ``slice_of`` inline on a hot path.

        Read-only use: inserting or removing through them would skew ``len``.
        """
        return self._slices

    def get(self, key: K) -> V | None:
        return self._slices[self._slice_of(key)].get(key)

    def __contains__(self, key: K) -> bool:
        return key in self._slices[self._slice_of(key)]

    def add(self, key: K, value: V) -> bool:
        """Insert ``key`` if absent; return False if it was already there."""
        return self.add_at(self._slice_of(key), key, value)

    def add_at(self, index: int, key: K, value: V) -> bool:
        """:meth:`add` into slice ``index``, which must be ``slice_of(key)``.

        For owners that compute the slice inline on a hot path: compiled,
        calling ``slice_of`` through the attribute is a Python-level call.
        """
        part = self._slices[index]
        # One lookup (a test then an insert was two): the slice grew or not.
        size = len(part)
        part.setdefault(key, value)
        if len(part) == size:
            return False
        self._len += 1
        return True

    def pop(self, key: K) -> V | None:
        return self.pop_at(self._slice_of(key), key)

    def pop_at(self, index: int, key: K) -> V | None:
        """:meth:`pop` from slice ``index``, which must be ``slice_of(key)``."""
        part = self._slices[index]
        # get and del rather than pop(key, None), which compiled is a
        # Python-level method call (this runs for every job forgotten).
        value = part.get(key)
        if value is not None:
            del part[key]
            self._len -= 1
        return value

    def clear(self) -> None:
        for part in self._slices:
            part.clear()
        self._len = 0

    def values(self) -> Iterator[V]:
        """Iterate all values (a snapshot per slice, so changes are safe)."""
        for part in self._slices:
            if part:
                yield from list(part.values())

    def scan(self, cursor: int, count: int,
             accept: Callable[[V], bool] | None = None) -> tuple[int, list[V]]:
        """Return ``(next_cursor, values)`` starting at slice ``cursor``.

        Visits whole slices until at least ``count`` values were looked at;
        ``next_cursor`` is 0 when the iteration is complete.  Empty slices
        are skipped without limit: Redis bounds empty buckets per call
        (``count * 10``) because its table can have millions of them, but
        there are only ``SLICES`` here, so a small keyspace comes back whole
        in one call with cursor 0, as SCAN users expect.  (With that bound a
        node with 3 queues answered QSCAN with empty pages and needed 5
        calls to reach cursor 0.)
        """
        found: list[V] = []
        seen = 0
        slices = self._slices
        # The C-level scan for the next non-empty slice keeps a call over an
        # almost empty table cheap (~0.1 ms for all 4096 slices on a slow core).
        for slice_no in compress(range(cursor, SLICES), islice(slices, cursor, None)):
            part = slices[slice_no]
            seen += len(part)
            if accept is None:
                found.extend(part.values())
            else:
                found.extend(v for v in part.values() if accept(v))
            if seen >= count:
                return (slice_no + 1 if slice_no + 1 < SLICES else 0), found
        return 0, found
