"""Clients blocked in GETJOB, served in arrival order (blocked.c).

A blocked client waits on one or more queues.  Each queue keeps its waiters
in arrival order; when a job is queued the first waiter gets it, and is
removed from every queue it was waiting on.  A blocked client is unblocked
exactly once: by a job, by its timeout, by ``-LEAVING``, or because it
disconnected (then nothing is sent and nothing is left behind).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from .job import Job
from .queue import Queue, fetch_job

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["BlockedGet", "block_for_jobs", "unblock", "serve_blocked_clients",
           "unblock_all", "getjob_entry", "NO_REPLY"]

#: Timeouts are capped: a wait this long is "forever" for every practical purpose
#: and larger values would overflow the event loop's timer.
MAX_BLOCK_MS = 10 * 365 * 86400 * 1000

NO_REPLY = object()

_NACKS = b"nacks"
_DELIVERIES = b"additional-deliveries"


class Waiter(Protocol):
    blocked: BlockedGet | None

    def resume(self, reply: Any) -> None: ...


class BlockedGet:
    __slots__ = ("client", "queues", "timer", "withcounters")

    def __init__(self, client: Waiter, queues: list[Queue], withcounters: bool) -> None:
        self.client = client
        self.queues = queues
        self.withcounters = withcounters
        self.timer: asyncio.TimerHandle | None = None


def getjob_entry(job: Job, withcounters: bool) -> list[Any]:
    """One job in GETJOB's reply: ``[queue, id, body]`` (+ counters)."""
    if withcounters:
        return [job.queue, job.id, job.body, _NACKS, job.nacks, _DELIVERIES,
                job.additional_deliveries]
    return [job.queue, job.id, job.body]


def block_for_jobs(state: ServerState, client: Waiter, names: list[bytes], timeout_ms: int,
                   withcounters: bool) -> BlockedGet:
    """Park ``client`` on the queues ``names`` (left to right, duplicates once)."""
    queues: list[Queue] = []
    for name in dict.fromkeys(names):
        queues.append(state.queue_for_write(name))
    blocked = BlockedGet(client, queues, withcounters)
    for q in queues:
        q.waiters[blocked] = None
    if timeout_ms > 0:
        delay = min(timeout_ms, MAX_BLOCK_MS) / 1000
        blocked.timer = asyncio.get_running_loop().call_later(
            delay, unblock, state, blocked, None, True)
    client.blocked = blocked
    state.blocked_clients += 1
    return blocked


def unblock(state: ServerState, blocked: BlockedGet, reply: Any, timed_out: bool = False) -> None:
    """Take the client off every queue and send it ``reply`` (unless NO_REPLY)."""
    client = blocked.client
    if client.blocked is not blocked:
        return  # already unblocked
    now = state.clock.now_ms()
    for q in blocked.queues:
        q.waiters.pop(blocked, None)
        q.atime = now
    if blocked.timer is not None and not timed_out:
        blocked.timer.cancel()
    blocked.timer = None
    client.blocked = None
    state.blocked_clients -= 1
    if reply is NO_REPLY:
        return
    if timed_out:
        from .protocol import NULL_ARRAY
        reply = NULL_ARRAY
    client.resume(reply)


def serve_blocked_clients(state: ServerState, q: Queue) -> int:
    """Give one job each to the clients waiting on ``q``, first come first served."""
    served = 0
    while q.waiters and q.jobs and not q.paused_out:
        blocked = next(iter(q.waiters))
        job = fetch_job(state, q)
        if job is None:
            break
        unblock(state, blocked, [getjob_entry(job, blocked.withcounters)])
        served += 1
    return served


def unblock_all(state: ServerState, reply: Any) -> int:
    """Unblock every blocked client with ``reply`` (e.g. ``-LEAVING``)."""
    clients = {b: None for q in state.queues.all() for b in q.waiters}
    for blocked in clients:
        unblock(state, blocked, reply)
    return len(clients)
