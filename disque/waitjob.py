"""Waiting for a job's completion: WAITJOB (an extension, docs/EXTENSIONS.md).

``WAITJOB id ms-timeout`` blocks its client until the job is acknowledged:
ACKJOB or FASTACK on this node, or, in a cluster, the SETACK / DELJOB of
the GC started by an ACK on another node (this node holds a copy, so the
GC must tell it).  Replies:

* ``+ACKED``: acknowledged (now, earlier and still held as acked, or
  acked and already forgotten within the last ``acked_ids.RECENT_ACK_MS``);
* a null reply: ``ms-timeout`` passed first (0 waits forever);
* ``-NOJOB ...``: the node does not know the job, or the job went away
  without an ACK (expired, evicted, DELJOB).

The waiters use the GETJOB machinery (``waiters.park`` / ``unblock``):
one timer per waiting client (as GETJOB's TIMEOUT), none per job.

A job acked here and collected at once (always the case on a single node)
leaves no trace, but a producer's WAITJOB may arrive just after a fast
worker's ACKJOB: the IDs of jobs acked here are remembered for a while in
a bounded table (``acked_ids.RecentAcks``) so that such a WAITJOB still
answers ``+ACKED``.  ACKs that reach this node through the GC of another
node are in ``acked_ids.CollectedAcks`` already.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .job import ACKED
from .protocol import ReplyError, Status
from .waiters import Blocked, Waiter, park, unblock

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["BlockedWait", "ACKED_REPLY", "NOJOB_UNKNOWN", "NOJOB_REMOVED", "job_completed",
           "job_removed", "completion_of", "wait_for"]

NOJOB_UNKNOWN: Final = "NOJOB Job not known in the context of this node."
NOJOB_REMOVED: Final = ("NOJOB Job removed from this node before it was acknowledged "
                        "(expired, evicted or deleted).")


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
        if state.recent_acks.acked(job_id, now) or state.collected_acks.acked(job_id, now):
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
