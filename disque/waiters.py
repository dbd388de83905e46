"""Blocked clients: what a client waits for, its timer, and how it is
released (blocked.c).

A blocked command is a :class:`Blocked`: a GETJOB waiting for jobs
(:class:`BlockedGet`, here), an ADDJOB waiting for its copies
(``replication.BlockedAdd``), a WAITJOB (``waitjob.BlockedWait``), an
ADDJOBS batch.  Each is unblocked exactly once: by its answer, by its
timeout, by ``-LEAVING``, or because its client disconnected (then nothing
is sent and the command's half-done work is undone).

A GETJOB client waits on one or more queues.  Each queue keeps its waiters
in arrival order; when a job is queued the first waiter gets it
(``queue.serve_blocked_clients``) and is removed from every queue it was
waiting on.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final, Protocol

from .job import Job
from .protocol import CRLF, NULL_ARRAY, Encoded, array_header, bulk_header
from .queue_table import Queue

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["Blocked", "BlockedGet", "ReplicationWait", "Waiter", "block_for_jobs", "park",
           "unblock", "unblock_all", "getjob_entry", "plain_entries_reply", "NO_REPLY",
           "WITH_COUNTERS", "WITH_LEASE"]

#: Timeouts are capped: a wait this long is "forever" for every practical purpose
#: and larger values would overflow the event loop's timer.
MAX_BLOCK_MS = 10 * 365 * 86400 * 1000

NO_REPLY = object()

_NACKS = b"nacks"
_DELIVERIES = b"additional-deliveries"
_REQUEUE_WITHIN = b"next-requeue-within"

#: GETJOB's optional entry fields (a bit set): WITHCOUNTERS adds the NACK and
#: delivery counters, WITHLEASE (an extension) the milliseconds left before
#: this node queues the job again.
WITH_COUNTERS: Final = 1
WITH_LEASE: Final = 2


class Waiter(Protocol):
    blocked: Blocked | None

    def resume(self, reply: Any) -> None: ...


class Blocked:
    """A blocked command: its client, its timer, and what :func:`unblock`
    asks of it (release it, answer a timeout, undo it for a client gone).

    A base class rather than a Protocol: compiled, :func:`unblock` then reads
    the fields and calls the methods natively, where a Protocol made each one
    a Python-level lookup (a fifth of answering a replicated ADDJOB).
    """

    __slots__ = ("client", "timer")

    def __init__(self, client: Waiter) -> None:
        self.client = client
        self.timer: asyncio.TimerHandle | None = None

    def release(self, state: ServerState) -> None:
        """Unblocking, whatever the cause: leave what the wait joined."""
        raise NotImplementedError

    def timeout_reply(self, state: ServerState) -> Any:
        raise NotImplementedError

    def abandoned(self, state: ServerState) -> None:
        """The client went away: undo what the command left half done."""
        raise NotImplementedError

    def overlappable(self) -> bool:
        """Whether the connection may run the ADDJOBs pipelined after this
        command while it waits (connection.ReplySlot)."""
        return False


class ReplicationWait(Blocked):
    """An ADDJOB waiting for its job's copies: what the replication timer
    and the confirmations read (the behaviour is ``replication.BlockedAdd``)."""

    __slots__ = ("extrepl", "job", "last_added", "last_sent", "needed", "started")

    def __init__(self, client: Waiter, job: Job, needed: int, extrepl: bool, now: int,
                 started: float) -> None:
        super().__init__(client)
        self.job = job
        self.needed = needed
        self.extrepl = extrepl
        #: When a node was last added to the job's list (ms).
        self.last_added = now
        #: When REPLJOB last went to the unconfirmed nodes (ms).
        self.last_sent = now
        #: For the replication latency histogram (finer than the ms clock).
        self.started = started

    def overlappable(self) -> bool:
        # Replicating pipelined ADDJOBs one at a time would cost a bus
        # round trip per job.
        return True


class BlockedGet(Blocked):
    """A client waiting in GETJOB for a job on one of ``queues``."""

    __slots__ = ("fields", "queues")

    def __init__(self, client: Waiter, queues: list[Queue], fields: int) -> None:
        super().__init__(client)
        self.queues = queues
        self.fields = fields

    def release(self, state: ServerState) -> None:
        """Unblocking, whatever the cause: leave every queue's waiters."""
        now = state.clock.now_ms()
        for q in self.queues:
            q.waiters.pop(self, None)
            q.atime = now

    def timeout_reply(self, state: ServerState) -> Any:
        return NULL_ARRAY

    def abandoned(self, state: ServerState) -> None:
        """The client went away: nothing of a GETJOB is left to undo."""


def getjob_entry(job: Job, fields: int, now: int = 0) -> list[Any]:
    """One job in GETJOB's reply: ``[queue, id, body]``, then the ``fields``
    asked for (:data:`WITH_COUNTERS`, :data:`WITH_LEASE` as of ``now``)."""
    entry: list[Any] = [job.queue, job.id, job.body]
    if fields:
        if fields & WITH_COUNTERS:
            entry.extend((_NACKS, job.nacks, _DELIVERIES, job.additional_deliveries))
        if fields & WITH_LEASE:
            entry.extend((_REQUEUE_WITHIN, requeue_within_ms(job, now)))
    return entry


_ENTRY_HEADER: Final = array_header(3)


def plain_entries_reply(queue: bytes, jobs: list[Job]) -> Encoded:
    """GETJOB's reply for ``jobs`` taken from ``queue`` without extra fields
    (``[[queue, id, body], ...]``), already encoded: arrays of bulk strings
    read the same in RESP2 and RESP3, and this costs half of building the
    lists for the generic encoder (the usual GETJOB, and every wake-up)."""
    queue_bulk = bulk_header(len(queue)) + queue + CRLF
    out = [array_header(len(jobs))]
    for job in jobs:
        job_id = job.id
        body = job.body
        out.append(_ENTRY_HEADER)
        out.append(queue_bulk)
        out.append(bulk_header(len(job_id)))
        out.append(job_id)
        out.append(CRLF)
        out.append(bulk_header(len(body)))
        out.append(body)
        out.append(CRLF)
    return Encoded(b"".join(out))


def requeue_within_ms(job: Job, now: int) -> int | None:
    """Milliseconds before this node queues ``job`` again unless told otherwise
    (ACKJOB, WORKING, NACK); None if it never will (RETRY 0).

    Delivery does not restart the count: a job that waited in its queue
    longer than its RETRY is due again soon after it is handed out, which
    is why a consumer holding jobs long asks for this rather than assume RETRY.
    """
    qtime = job.qtime
    if not qtime or job.retry == 0:
        return None
    return qtime - now if qtime > now else 0


def block_for_jobs(state: ServerState, client: Waiter, names: list[bytes], timeout_ms: int,
                   fields: int) -> BlockedGet:
    """Park ``client`` on the queues ``names`` (left to right, duplicates once)."""
    queues: list[Queue] = []
    for name in dict.fromkeys(names):
        queues.append(state.queue_for_write(name))
    blocked = BlockedGet(client, queues, fields)
    for q in queues:
        q.waiters[blocked] = None
    park(state, blocked, timeout_ms)
    return blocked


def park(state: ServerState, blocked: Blocked, timeout_ms: int) -> None:
    """Block ``blocked.client`` until :func:`unblock`, or ``timeout_ms`` (0: forever)."""
    if timeout_ms > 0:
        delay = min(timeout_ms, MAX_BLOCK_MS) / 1000
        blocked.timer = state.event_loop().call_later(
            delay, unblock, state, blocked, None, True)
    blocked.client.blocked = blocked
    state.blocked_clients += 1


def unblock(state: ServerState, blocked: Blocked, reply: Any, timed_out: bool = False) -> None:
    """Release the client and send it ``reply`` (unless NO_REPLY: it went away).

    Each kind of :class:`Blocked` knows what to release, what to answer on
    timeout and what to undo when its client is gone.
    """
    client = blocked.client
    if client.blocked is not blocked:
        return  # already unblocked
    blocked.release(state)
    if blocked.timer is not None and not timed_out:
        blocked.timer.cancel()
    blocked.timer = None
    client.blocked = None
    state.blocked_clients -= 1
    if reply is NO_REPLY:
        blocked.abandoned(state)
        return
    if timed_out:
        reply = blocked.timeout_reply(state)
    client.resume(reply)


def unblock_all(state: ServerState, reply: Any) -> int:
    """Unblock every blocked client with ``reply`` (e.g. ``-LEAVING``)."""
    clients = {b: None for q in state.queues.all() for b in q.waiters}
    for blocked in clients:
        unblock(state, blocked, reply)
    return len(clients)
