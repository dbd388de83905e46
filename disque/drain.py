"""The graceful drain: what SIGTERM (and SIGINT) does to a node.

Orchestrators stop a node with SIGTERM (Kubernetes, systemd, ``podman
stop``), nearly always to start it again (a rolling restart, an upgrade, a
move).  Its queued jobs should not wait for it meanwhile, and its clients
should move to other nodes without losing anything.  The drain, in order:

1. stops listening for clients and closes their connections as soon as
   they wait for nothing (an ADDJOB waiting for its copies is answered
   first): clients reconnect to other nodes (ours fail over on a refused or
   closed connection, as on ``-LEAVING``);
2. sets the node LEAVING and tells every peer at once, as ``CLUSTER
   LEAVING yes`` does, but without writing it to nodes.conf (a restarted
   node is not leaving): an ADDJOB replicates to other nodes and keeps no
   copy here, a GETJOB that would block and the ones blocked get
   ``-LEAVING``, no dummy ACK is made;
3. hands its queued jobs to reachable peers with YOURJOBS, the message
   federation answers NEEDJOBS with (``federation.send_jobs``): the peer
   queues them and joins their node list.  A peer that already holds a copy
   is chosen first.  An at-least-once job keeps its copy here (in the AOF),
   as after any YOURJOBS, until its ACK's garbage collection reaches it: a
   message lost on the way costs a redelivery after RETRY, never the job;
4. waits for the ADDJOBs still waiting for their copies, and for the bus
   links to hand what they hold to the kernel;
5. stops as ``SHUTDOWN`` does: clients closed, the AOF written and fsynced,
   nodes.conf saved.

Queues paused for output (``PAUSE queue out``) are not handed over: the pause
says their jobs must not leave.  A node with no reachable peer has nobody to
give jobs to: it stops at once, its jobs in its AOF.

The wait is bounded by ``shutdown-timeout`` (seconds, 0: stop at once,
without a drain), and a second signal stops the node at once; either way the
stop is the ordinary one, so nothing acknowledged is lost: an ADDJOB's
record is written before its reply.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .cluster.messages import CAP_BATCH
from .commands.jobs import LEAVING_ERROR
from .federation import MAX_COUNT, send_jobs
from .protocol import ReplyError
from .queue_table import PAUSED_OUT
from .rendezvous import ranking
from .waiters import unblock_all

if TYPE_CHECKING:
    from .cluster.node import ClusterNode
    from .job import Job
    from .state import ServerState

__all__ = ["Drain", "hand_over_queued"]

log = logging.getLogger("disque.drain")

#: How often the drain looks at what is left (and hands over jobs queued since).
PERIOD_S = 0.05
#: Jobs handed over per queue and per round, so the event loop keeps serving
#: the open connections and the bus between rounds (20 rounds a second).
ROUND_JOBS = 5000


def _peers(state: ServerState) -> list[ClusterNode]:
    """Linked peers that are not failing, leaving or handshaking."""
    myself = state.cluster.myself
    return [n for n in state.cluster.reachable_nodes() if n is not myself and n.link is not None]


def hand_over_queued(state: ServerState) -> int:
    """Give queued jobs to peers (YOURJOBS); the number of jobs sent.

    Each job goes to a peer holding a copy if there is one, else to the
    peers in turn, so a large queue spreads over the cluster.  An ordered
    group goes whole (federation.send_jobs) to one of our peers: the best
    ranked for its key among those holding its copies, else the best
    ranked (an original node would hand its jobs out in any order).
    """
    peers = _peers(state)
    if not peers:
        return 0
    ids = [n.id for n in peers]
    ours = [n.id for n in peers if n.caps & CAP_BATCH]
    sent = 0
    turn = 0
    for q in list(state.queues.all()):
        if not q.jobs or q.flags & PAUSED_OUT:
            continue
        batches: dict[str, list[Job]] = {}
        for job in q.jobs.first(ROUND_JOBS):
            ext = job.ext
            if ext is not None and ext.group is not None and ours:
                # A group (whole: federation.send_jobs) goes to one of our
                # nodes, which knows groups: the best ranked holding copies.
                ranked = ranking(ext.group, ours)
                home = next((i for i in ranked if i in job.delivered), ranked[0])
                batches.setdefault(home, []).append(job)
                continue
            target = next((i for i in ids if i in job.delivered), None)
            if target is None:
                target = ids[turn % len(ids)]
                turn += 1
            batches.setdefault(target, []).append(job)
        for node_id, jobs in batches.items():
            for start in range(0, len(jobs), MAX_COUNT):
                sent += send_jobs(state, node_id, jobs[start:start + MAX_COUNT])
    return sent


def _queued_for_peers(state: ServerState) -> int:
    """Jobs a peer could still take: queued, in queues not paused for output."""
    return sum(len(q.jobs) for q in state.queues.all() if q.jobs and not q.flags & PAUSED_OUT)


def _bus_flushed(state: ServerState) -> bool:
    """Every link has handed its messages to the kernel (closing one discards
    what its transport still buffers)."""
    for node in state.cluster.nodes.values():
        link = node.link
        transport = getattr(link, "transport", None) if link is not None else None
        if transport is not None and transport.get_write_buffer_size():
            return False
    return True


class Drain:
    """One drain of a node, from the first signal to the stop."""

    def __init__(self, state: ServerState, close_listeners: Callable[[], None],
                 stop: Callable[[], None], timeout_s: float) -> None:
        self.state = state
        self._close_listeners = close_listeners
        self._stop = stop
        self._timeout_s = timeout_s
        self._deadline = 0.0
        self._started = 0.0
        self._handed_over = 0
        self._handle: asyncio.Handle | None = None
        self.finished = False

    def start(self) -> None:
        state = self.state
        loop = asyncio.get_running_loop()
        self._started = time.monotonic()
        self._deadline = loop.time() + self._timeout_s
        self._close_listeners()
        cluster = state.cluster
        if not cluster.leaving:  # an operator's CLUSTER LEAVING stays as it was
            cluster.set_leaving(True, persist=False)
            if state.bus is not None:
                state.bus.membership.ping_all()
        unblock_all(state, ReplyError(LEAVING_ERROR))
        queued = _queued_for_peers(state)
        log.warning("Draining before shutdown: leaving the cluster, %d queued jobs to hand "
                    "over to %d nodes, %d ADDJOBs waiting for copies (at most %g s; "
                    "signal again to stop now)", queued, len(_peers(state)),
                    len(state.replicating), self._timeout_s)
        # The first round after this turn: the -LEAVING replies leave before
        # the connections close.
        self._handle = loop.call_soon(self._step)

    def _step(self) -> None:
        self._handle = None
        if self.finished:
            return
        state = self.state
        for client in list(state.clients.values()):
            if not client.is_blocked:
                client.kill()
        self._handed_over += hand_over_queued(state)
        left = _queued_for_peers(state) if _peers(state) else 0
        waiting = len(state.replicating)
        if not left and not waiting and _bus_flushed(state):
            self._finish(f"drained in {time.monotonic() - self._started:.2f} s: "
                         f"{self._handed_over} jobs handed over")
            return
        loop = asyncio.get_running_loop()
        if loop.time() >= self._deadline:
            self._finish(f"shutdown-timeout ({self._timeout_s:g} s) reached with {left} "
                         f"queued jobs not handed over and {waiting} ADDJOBs waiting for "
                         f"copies; {self._handed_over} jobs handed over")
            return
        self._handle = loop.call_later(PERIOD_S, self._step)

    def interrupt(self) -> None:
        """A second signal: stop now."""
        self._finish(f"stopping now, as asked again; {self._handed_over} jobs handed over")

    def _finish(self, how: str) -> None:
        if self.finished:
            return
        self.finished = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        log.warning("Drain: %s", how)
        self._stop()
