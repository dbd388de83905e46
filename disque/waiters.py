"""Blocked clients: what a client waits for, its timeout, and how it is
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

Timeouts share one event-loop timer (:class:`BlockDeadlines`): a GETJOB
that blocks is usually answered long before its TIMEOUT, and a timer of
its own (``call_later``, then its cancellation) was a twelfth of the
node's work per job handed to a blocked consumer.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any, Final

from .compiled import mypyc_attr
from .job import JOB_ID_LEN, Job
from .protocol import CRLF, NULL_ARRAY, Encoded, array_header, bulk_header, integer_reply
from .queue_table import Queue
from .time_buckets import TimeBuckets

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["Blocked", "BlockDeadlines", "BlockedGet", "ReplicationWait", "Waiter",
           "block_for_jobs", "park",
           "unblock", "unblock_all", "entries_reply", "getjob_entry", "plain_entries_reply",
           "NO_REPLY",
           "WITH_COUNTERS", "WITH_GROUP", "WITH_HEADERS", "WITH_LEASE"]

#: Timeouts are capped: a wait this long is "forever" for every practical purpose
#: and larger values would overflow the event loop's timer.
MAX_BLOCK_MS: Final = 10 * 365 * 86400 * 1000

NO_REPLY: Final = object()

log: Final = logging.getLogger("disque.waiters")

_NACKS: Final = b"nacks"
_DELIVERIES: Final = b"additional-deliveries"
_REQUEUE_WITHIN: Final = b"next-requeue-within"
_HEADERS: Final = b"headers"
_GROUP: Final = b"group"
_GROUP_POSITION: Final = b"group-position"

#: GETJOB's optional entry fields (a bit set): WITHCOUNTERS adds the NACK and
#: delivery counters, WITHLEASE (an extension) the milliseconds left before
#: this node queues the job again, WITHHEADERS (an extension) the job's
#: headers, WITHGROUP (an extension) its place in its group and its group key.
WITH_COUNTERS: Final = 1
WITH_LEASE: Final = 2
WITH_HEADERS: Final = 4
WITH_GROUP: Final = 8


@mypyc_attr(allow_interpreted_subclasses=True)
class Waiter:
    """Who gets a blocked command's reply: :func:`unblock` calls :meth:`resume`.

    The connection that sent the command, or a stand-in for it (the place of
    a reply among others, one body of an ADDJOBS, a test's client).  A base
    class rather than a Protocol: compiled, the core then reads ``blocked``
    and calls ``resume`` natively, where a Protocol made each a Python-level
    lookup.  Interpreted subclasses are allowed for the tests' stand-ins.
    """

    def __init__(self) -> None:
        #: The command this client waits for (None: not blocked).
        self.blocked: Blocked | None = None

    def resume(self, reply: Any) -> None:
        """The blocked command completed with ``reply``."""
        raise NotImplementedError


class Blocked:
    """A blocked command: its client, its deadline, and what :func:`unblock`
    asks of it (release it, answer a timeout, undo it for a client gone).

    A base class rather than a Protocol: compiled, :func:`unblock` then reads
    the fields and calls the methods natively, where a Protocol made each one
    a Python-level lookup (a fifth of answering a replicated ADDJOB).
    """

    __slots__ = ("client", "deadline")

    def __init__(self, client: Waiter) -> None:
        self.client = client
        #: When it times out, in ms of the event loop's clock (0: never).
        self.deadline = 0

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
            waiters = q.waiters
            if self in waiters:  # not pop(self, None): compiled, a Python-level call
                del waiters[self]
            q.atime = now
            if not waiters:
                if q.jobs_in == 0:
                    state.forget_if_unused(q)  # made by this read, for nothing
                fed = q.fed
                if fed is not None and fed.asked:
                    state.events.waiters_gone(state, q)  # federation: withdraw our asks

    def timeout_reply(self, state: ServerState) -> Any:
        return NULL_ARRAY

    def abandoned(self, state: ServerState) -> None:
        """The client went away: nothing of a GETJOB is left to undo."""


def getjob_entry(job: Job, fields: int, now: int = 0) -> list[Any]:
    """One job in GETJOB's reply: ``[queue, id, body]``, then the ``fields``
    asked for (:data:`WITH_COUNTERS`, :data:`WITH_LEASE` as of ``now``,
    :data:`WITH_HEADERS`, :data:`WITH_GROUP`: ``group-position`` then
    ``group``), each a name and its value, in that order."""
    entry: list[Any] = [job.queue, job.id, job.body]
    if fields:
        if fields & WITH_COUNTERS:
            entry.extend((_NACKS, job.nacks, _DELIVERIES, job.additional_deliveries))
        if fields & WITH_LEASE:
            entry.extend((_REQUEUE_WITHIN, requeue_within_ms(job, now)))
        if fields & WITH_HEADERS:
            ext = job.ext
            entry.extend((_HEADERS, list(ext.headers) if ext is not None else []))
        if fields & WITH_GROUP:
            ext = job.ext
            group = ext.group if ext is not None else None
            # The position is the ctime the group is ordered by (groups.py:
            # ctime, then the ID): the same on every copy and every
            # delivery, so a consumer can sort what it received.
            entry.extend((_GROUP_POSITION, job.ctime if group is not None else None,
                          _GROUP, group))
    return entry


_ENTRY_HEADER: Final = array_header(3)
_ONE_ENTRY: Final = array_header(1)
_ID_HEADER: Final = bulk_header(JOB_ID_LEN)
#: What follows a job's ID in an entry: its CRLF and the body's header, made
#: ahead for bodies below 1 KiB.
_BODY_HEADERS: Final = [CRLF + bulk_header(size) for size in range(1024)]


def _body_header(size: int) -> bytes:
    return _BODY_HEADERS[size] if size < 1024 else CRLF + bulk_header(size)


def _entry_prefix(q: Queue) -> bytes:
    """How each of ``q``'s GETJOB entries starts: ``*3``, the queue's name
    and the ID's header, encoded once per queue."""
    prefix = q.entry_prefix
    if not prefix:
        name = q.name
        prefix = _ENTRY_HEADER + bulk_header(len(name)) + name + CRLF + _ID_HEADER
        q.entry_prefix = prefix
    return prefix


def plain_entries_reply(q: Queue, jobs: list[Job]) -> Encoded:
    """GETJOB's reply for ``jobs`` taken from ``q`` without extra fields
    (``[[queue, id, body], ...]``), already encoded: arrays of bulk strings
    read the same in RESP2 and RESP3, and this costs half of building the
    lists for the generic encoder (the usual GETJOB, and every wake-up)."""
    prefix = _entry_prefix(q)
    if len(jobs) == 1:  # a woken GETJOB, or COUNT 1: one join of a tuple, no list
        job = jobs[0]
        job_id = job.id
        body = job.body
        if len(job_id) == JOB_ID_LEN:
            return Encoded(b"".join((_ONE_ENTRY, prefix, job_id, _body_header(len(body)),
                                     body, CRLF)))
    out = [array_header(len(jobs))]
    for job in jobs:
        job_id = job.id
        body = job.body
        if len(job_id) == JOB_ID_LEN:
            out.append(prefix)
        else:  # not an ID this node makes or accepts: its own length's header
            out.append(prefix[:-len(_ID_HEADER)])
            out.append(bulk_header(len(job_id)))
        out.append(job_id)
        out.append(_body_header(len(body)))
        out.append(body)
        out.append(CRLF)
    return Encoded(b"".join(out))


_NACKS_FIELD: Final = bulk_header(len(_NACKS)) + _NACKS + CRLF
_DELIVERIES_FIELD: Final = bulk_header(len(_DELIVERIES)) + _DELIVERIES + CRLF
_HEADERS_FIELD: Final = bulk_header(len(_HEADERS)) + _HEADERS + CRLF
_NO_HEADERS: Final = array_header(0)


def fielded_entries_reply(q: Queue, jobs: list[Job], fields: int) -> Encoded:
    """GETJOB's reply for ``jobs`` taken from ``q`` with WITHCOUNTERS and/or
    WITHHEADERS (not WITHLEASE nor WITHGROUP: their nil differs between RESP2
    and RESP3),
    already encoded, as :func:`plain_entries_reply`: the entries of
    :func:`getjob_entry` without building their lists (a traced consumer
    asks WITHHEADERS on every GETJOB)."""
    width = 3
    if fields & WITH_COUNTERS:
        width += 4
    if fields & WITH_HEADERS:
        width += 2
    name_and_id = _entry_prefix(q)[len(_ENTRY_HEADER):]
    prefix = array_header(width) + name_and_id
    out = [array_header(len(jobs))]
    for job in jobs:
        job_id = job.id
        body = job.body
        if len(job_id) == JOB_ID_LEN:
            out.append(prefix)
        else:  # not an ID this node makes or accepts: its own length's header
            out.append(prefix[:-len(_ID_HEADER)])
            out.append(bulk_header(len(job_id)))
        out.append(job_id)
        out.append(_body_header(len(body)))
        out.append(body)
        out.append(CRLF)
        if fields & WITH_COUNTERS:
            out.append(_NACKS_FIELD)
            out.append(integer_reply(job.nacks))
            out.append(_DELIVERIES_FIELD)
            out.append(integer_reply(job.additional_deliveries))
        if fields & WITH_HEADERS:
            out.append(_HEADERS_FIELD)
            ext = job.ext
            headers = ext.headers if ext is not None else ()
            if not headers:
                out.append(_NO_HEADERS)
            else:
                out.append(array_header(len(headers)))
                for item in headers:
                    out.append(bulk_header(len(item)))
                    out.append(item)
                    out.append(CRLF)
    return Encoded(b"".join(out))


def entries_reply(state: ServerState, q: Queue, jobs: list[Job],
                  fields: int) -> list[list[Any]] | Encoded:
    """GETJOB's reply for ``jobs`` taken from ``q``, with the ``fields``
    asked for (encoded at once but with WITHLEASE or WITHGROUP)."""
    if not fields:
        return plain_entries_reply(q, jobs)
    if not fields & (WITH_LEASE | WITH_GROUP):
        return fielded_entries_reply(q, jobs, fields)
    now = state.clock.now_ms()
    return [getjob_entry(job, fields, now) for job in jobs]


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


class BlockDeadlines:
    """The blocked commands that time out, by deadline, and the one timer.

    Buckets of ``2**BUCKET_SHIFT`` ms (time_buckets.py), as the job
    schedule: a command answered before its timeout leaves in O(1) and
    leaves the timer alone.  The timer is armed for the earliest deadline
    and moved only for an earlier one; when it fires with nothing due (the
    command it was armed for was answered) it is armed for the next.
    """

    __slots__ = ("_times", "timer", "timer_at")

    BUCKET_SHIFT: Final = 4

    def __init__(self) -> None:
        self._times: TimeBuckets[Blocked] = TimeBuckets()
        #: The loop's timer handle and the deadline it is armed for.
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0

    def __len__(self) -> int:
        return len(self._times)

    @property
    def numbers_held(self) -> int:
        """Bucket numbers held, emptied ones included (bounded: time_buckets.py)."""
        return self._times.numbers_held

    def add(self, blocked: Blocked, deadline: int) -> None:
        blocked.deadline = deadline
        self._times.add(deadline >> self.BUCKET_SHIFT, blocked)

    def discard(self, blocked: Blocked) -> None:
        self._times.remove(blocked.deadline >> self.BUCKET_SHIFT, blocked)
        blocked.deadline = 0

    def next_deadline(self) -> int:
        """The earliest deadline (0: none)."""
        earliest = self._times.earliest()
        if earliest is None:
            return 0
        return min(blocked.deadline for blocked in earliest[1])

    def pop_due(self, now: int) -> list[Blocked]:
        """Remove and return the commands whose deadline is ``now`` or earlier."""
        times = self._times
        due: list[Blocked] = []
        while True:
            earliest = times.earliest()
            if earliest is None or earliest[0] << self.BUCKET_SHIFT > now:
                break
            number, bucket = earliest
            taken = [blocked for blocked in bucket if blocked.deadline <= now]
            for blocked in taken:
                del bucket[blocked]
                blocked.deadline = 0
            due.extend(taken)
            if bucket:
                break  # the rest of it is not due yet
            times.drop(number)
        return due


def _loop_ms(state: ServerState) -> float:
    """The event loop's clock in ms (what its timers follow)."""
    return state.event_loop().time() * 1000


def _arm_block_timer(state: ServerState, deadline: int) -> None:
    deadlines = state.block_deadlines
    if deadlines.timer is not None:
        deadlines.timer.cancel()
    deadlines.timer_at = deadline
    deadlines.timer = state.event_loop().call_at(deadline / 1000, _block_timer_fired, state)


def _block_timer_fired(state: ServerState) -> None:
    deadlines = state.block_deadlines
    deadlines.timer = None
    try:
        for blocked in deadlines.pop_due(math.floor(_loop_ms(state))):
            try:
                unblock(state, blocked, None, True)
            except Exception:  # a bug: say it loudly, and time the others out all the same
                log.exception("Error timing out a blocked command")
    finally:
        upcoming = deadlines.next_deadline()
        if upcoming:
            _arm_block_timer(state, upcoming)


def block_for_jobs(state: ServerState, client: Waiter, names: list[bytes], timeout_ms: int,
                   fields: int) -> BlockedGet:
    """Park ``client`` on the queues ``names`` (left to right, duplicates once)."""
    if len(names) == 1:
        queues = [state.queue_for_write(names[0])]
    else:
        queues = [state.queue_for_write(name) for name in dict.fromkeys(names)]
    blocked = BlockedGet(client, queues, fields)
    for q in queues:
        q.waiters[blocked] = None
    park(state, blocked, timeout_ms)
    return blocked


def park(state: ServerState, blocked: Blocked, timeout_ms: int) -> None:
    """Block ``blocked.client`` until :func:`unblock`, or ``timeout_ms`` (0: forever)."""
    if timeout_ms > 0:
        # Rounded up, so that no command times out early.
        deadline = math.ceil(_loop_ms(state)) + min(timeout_ms, MAX_BLOCK_MS)
        deadlines = state.block_deadlines
        deadlines.add(blocked, deadline)
        if deadlines.timer is None or deadline < deadlines.timer_at:
            _arm_block_timer(state, deadline)
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
    client.blocked = None
    state.blocked_clients -= 1
    if reply is NO_REPLY:
        blocked.release(state)
        blocked.abandoned(state)
    elif timed_out:
        blocked.release(state)
        client.resume(blocked.timeout_reply(state))
    else:
        # The answer first: releasing changes nothing it says, and the
        # client's wait ends with its write (a woken GETJOB's latency).
        client.resume(reply)
        blocked.release(state)
    if blocked.deadline:  # after the answer, which waits for nothing here
        state.block_deadlines.discard(blocked)


def unblock_all(state: ServerState, reply: Any) -> int:
    """Unblock every blocked client with ``reply`` (e.g. ``-LEAVING``)."""
    clients = {b: None for q in state.queues.all() for b in q.waiters}
    for blocked in clients:
        unblock(state, blocked, reply)
    return len(clients)
