"""Waiting for a job's completion: WAITJOB (an extension, docs/EXTENSIONS.md).

``WAITJOB id ms-timeout`` blocks its client until the job is acknowledged:
ACKJOB or FASTACK on this node, or, in a cluster, the SETACK / DELJOB of
the GC started by an ACK on another node (this node holds a copy, so the
GC must tell it).  Replies:

* ``+ACKED``: acknowledged (now, earlier and still held as acked, or
  acked and already forgotten within the last :data:`RECENT_ACK_MS`);
* a null reply: ``ms-timeout`` passed first (0 waits forever);
* ``-NOJOB ...``: the node does not know the job, or the job went away
  without an ACK (expired, evicted, DELJOB).

The waiters use the GETJOB machinery (``blocking.park`` / ``unblock``):
one timer per waiting client (as GETJOB's TIMEOUT), none per job.

A job acked here and collected at once (always the case on a single node)
leaves no trace, but a producer's WAITJOB may arrive just after a fast
worker's ACKJOB: the IDs of jobs acked here are remembered for a while in
a bounded table so that such a WAITJOB still answers ``+ACKED``.  ACKs that
reach this node through the GC of another node are in ``acked_unknown``
already (ack.remember_collected).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .blocking import Blocked, Waiter, park, unblock
from .job import ACKED
from .protocol import ReplyError, Status

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["BlockedWait", "ACKED_REPLY", "NOJOB_UNKNOWN", "NOJOB_REMOVED", "job_completed",
           "job_removed", "completion_of", "RecentAcks", "wait_for"]

#: How long the ID of a job acked here is remembered for WAITJOB.
RECENT_ACK_MS: Final = 300_000
#: At most this many are remembered (~8 MB); the oldest go first.
RECENT_ACK_MAX: Final = 65_536

NOJOB_UNKNOWN: Final = "NOJOB Job not known in the context of this node."
NOJOB_REMOVED: Final = ("NOJOB Job removed from this node before it was acknowledged "
                        "(expired, evicted or deleted).")


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
            ids[head] = b""
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


class BlockedWait(Blocked):
    """A client in WAITJOB."""

    __slots__ = ("job_id",)

    def __init__(self, client: Waiter, job_id: bytes) -> None:
        super().__init__(client)
        self.job_id = job_id

    def release(self, state: ServerState) -> None:
        waiters = state.job_waiters.get(self.job_id)
        if waiters is not None:
            waiters.pop(self, None)
            if not waiters:
                del state.job_waiters[self.job_id]

    def timeout_reply(self, state: ServerState) -> Any:
        return None

    def abandoned(self, state: ServerState) -> None:
        """Nothing to undo: waiting changes nothing."""


ACKED_REPLY: Final = "ACKED"


def completion_of(state: ServerState, job_id: bytes) -> Any:
    """WAITJOB's answer without waiting, or None when the client must wait."""
    job = state.jobs.get(job_id)
    now = state.clock.now_ms()
    if job is None:
        from .ack import acked_elsewhere
        if state.recent_acks.acked(job_id, now) or acked_elsewhere(state, job_id):
            return Status(ACKED_REPLY)
        return ReplyError(NOJOB_UNKNOWN)
    if job.state == ACKED:
        return Status(ACKED_REPLY)
    return None


def wait_for(state: ServerState, client: Waiter, job_id: bytes, timeout_ms: int) -> None:
    blocked = BlockedWait(client, bytes(job_id))
    state.job_waiters.setdefault(blocked.job_id, {})[blocked] = None
    park(state, blocked, timeout_ms)


def job_completed(state: ServerState, job_id: bytes) -> None:
    """The job was acknowledged (ACK, FASTACK, or the GC of an ACK elsewhere)."""
    state.recent_acks.add(job_id, state.clock.now_ms())
    if state.job_waiters:
        _wake(state, job_id, Status(ACKED_REPLY))


def job_removed(state: ServerState, job_id: bytes) -> None:
    """The job went away without an ACK: its waiters get -NOJOB."""
    _wake(state, job_id, ReplyError(NOJOB_REMOVED))


def _wake(state: ServerState, job_id: bytes, reply: Any) -> None:
    waiters = state.job_waiters.get(job_id)
    if waiters:
        for blocked in list(waiters):
            unblock(state, blocked, reply)
