"""IDs of jobs acknowledged lately, kept after the jobs themselves are gone.

* :class:`RecentAcks`: jobs acked on this node, so that a WAITJOB arriving
  just after a fast worker's ACKJOB still answers ``+ACKED``.
* :class:`CollectedAcks`: jobs whose ACK reached this node from another one
  (SETACK of a job we do not hold, DELJOB): a copy still travelling towards
  us (a REPLJOB or YOURJOBS held back on a slow link) must not be taken in
  when it lands, or a job whose ACK completed would be queued again.

Both are bounded in count and age.
"""

from __future__ import annotations

from collections import deque
from typing import Final

__all__ = ["RecentAcks", "CollectedAcks", "RECENT_ACK_MS", "RECENT_ACK_MAX",
           "COLLECTED_ACK_MS", "COLLECTED_ACK_MAX"]

#: How long the ID of a job acked here is remembered for WAITJOB.
RECENT_ACK_MS: Final = 300_000
#: At most this many are remembered (~8 MB); the oldest go first.
RECENT_ACK_MAX: Final = 65_536

#: How long a collected job is refused if a copy of it arrives after all:
#: longer than TCP keeps retransmitting one segment on a lossy link that our
#: link checks do not close.
COLLECTED_ACK_MS: Final = 300_000
#: At most this many IDs are remembered (the oldest go first): ~12 MB.  At
#: tens of thousands of ACKs a second the window is shorter than the above.
COLLECTED_ACK_MAX: Final = 65_536


class RecentAcks:
    """Job IDs acked on this node lately (bounded: count and age).

    A ring of (ID, until) slots in two lists, oldest at ``_head``, beside
    the table: compiled, list slots are native reads and writes, where a
    deque of tuples cost a tuple and two Python-level method calls per ACK
    (a fifth of ACKJOB's time with 1,000 IDs per call).  An ID acked again
    takes a second slot; its first one is skipped when it falls out (its
    ``until`` no longer matches the table's).
    """

    __slots__ = ("_count", "_head", "_ids", "_table", "_untils")

    def __init__(self) -> None:
        self._table: dict[bytes, int] = {}
        # Allocated on the first ACK: most nodes of a test suite never ack.
        self._ids: list[bytes] = []
        self._untils: list[int] = []
        self._head = 0
        self._count = 0

    def add(self, job_id: bytes, now: int) -> None:
        table, ids, untils = self._table, self._ids, self._untils
        if not ids:
            ids.extend([b""] * RECENT_ACK_MAX)
            untils.extend([0] * RECENT_ACK_MAX)
        head, count = self._head, self._count
        # Expired ones go, and the oldest while the ring is full.  Every ID
        # in the table has a slot (its latest ack's), so a full table means
        # a full ring; re-acked IDs take slots the table does not count.
        while count and (untils[head] <= now or count == RECENT_ACK_MAX):
            old = ids[head]
            if table.get(old) == untils[head]:
                del table[old]
            # Both slots let go of their objects: a stale ``until`` would
            # keep its int alive until the ring comes round to the slot
            # again, RECENT_ACK_MAX ACKs later.
            ids[head] = b""
            untils[head] = 0
            head = head + 1 if head + 1 < RECENT_ACK_MAX else 0
            count -= 1
        until = now + RECENT_ACK_MS
        table[job_id] = until
        tail = head + count
        if tail >= RECENT_ACK_MAX:
            tail -= RECENT_ACK_MAX
        ids[tail] = job_id
        untils[tail] = until
        self._head = head
        self._count = count + 1

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._table

    def acked(self, job_id: bytes, now: int) -> bool:
        until = self._table.get(job_id)
        return until is not None and until > now

    def __len__(self) -> int:
        return len(self._table)


class CollectedAcks:
    """Jobs whose ACK reached this node from elsewhere: ID -> until when (ms)
    a copy arriving late is refused, and the same entries in expiry order."""

    __slots__ = ("_order", "_table")

    def __init__(self) -> None:
        self._table: dict[bytes, int] = {}
        self._order: deque[tuple[int, bytes]] = deque()

    def remember(self, job_id: bytes, now: int) -> None:
        table = self._table
        order = self._order
        while order and (order[0][0] <= now or len(table) >= COLLECTED_ACK_MAX):
            until, old = order.popleft()
            if table.get(old) == until:
                del table[old]
        key = bytes(job_id)
        until = now + COLLECTED_ACK_MS
        table[key] = until
        order.append((until, key))

    def acked(self, job_id: bytes, now: int) -> bool:
        until = self._table.get(job_id)
        return until is not None and until > now

    def __len__(self) -> int:
        return len(self._table)

    def clear(self) -> None:
        self._table.clear()
        self._order.clear()
