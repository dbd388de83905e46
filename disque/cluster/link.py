"""One TCP connection of the cluster bus.

Each pair of nodes uses two: our *outbound* link to a node carries every
message we send it; its outbound link to us arrives here as an *inbound*
link, on which we only answer PING/MEET with PONG (as the original).

Reads are parsed in bulk (every whole message of a read, by
``messages.FrameReader``); writes wait until the end of the event-loop turn
and leave in one ``write`` per link (the bus's flush), like client replies.

The per-job messages (GOTJOB, QUEUED, REPLJOB of one job ...) are handed to
the link as *entries* (:meth:`BusLink.send_entry`: the header from byte 8,
shared by thousands of them, and the job ID + aux or the job's blob).  To a
peer that takes batched messages (``messages.CAP_BATCH``, only our nodes)
neighbouring entries with the same header are kept in a run that becomes one
message when something else is sent or the turn ends; any other peer gets
each as the message of its own that the original expects.  (Whole messages
that could merge are still merged at flush time, ``messages.coalesce``.)
A link that breaks the framing, stalls in the middle of a message or piles
up more unread output than :data:`OUTPUT_LIMIT` is closed; the cron
reconnects outbound links.

A link starts *unproven*: until its peer proves itself (``bus.py``: a
message signed with the cluster secret, or without one a message from a
node of the table) it may send messages of up to
``messages.UNPROVEN_MESSAGE`` bytes only, and an inbound one that proves
nothing in time is closed by the bus's cron.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final, cast

from .messages import (
    CAP_BATCH,
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_BATCHED_ENTRY,
    SMALL_MESSAGE,
    UNPROVEN_MESSAGE,
    FrameError,
    FrameReader,
    batch_frame,
    coalesce,
    is_repljob_key,
    single_frame,
)

if TYPE_CHECKING:
    from .bus import ClusterBus
    from .node import ClusterNode

__all__ = ["EARLY_WRITE_ENTRIES", "OUTPUT_LIMIT", "BusLink"]

log: Final = logging.getLogger("disque.cluster")

#: Bytes written to a peer and not yet taken by it, beyond which the link is
#: dropped rather than buffered without limit (a peer that stopped reading).
OUTPUT_LIMIT: Final = 256 * 1024 * 1024

#: A run this long is written at once rather than at the end of the turn
#: (ClusterBus.write_early).  Under a pipelined load (50 clients x -P 16)
#: this node parses bursts of a few hundred ADDJOBs per turn; written only
#: at a turn's end, the peers idle until then and this node idles while
#: they copy the jobs.  Written every 64 entries, the peers copy and confirm
#: the first jobs while this node parses the rest, and on two cores the
#: nodes' work overlaps: +12% REPLICATE 3 -P 16 on 3 nodes (median of 5
#: alternating rounds, better in each).  Much smaller runs
#: cost the peers more per job than the overlap saves (every 4 or 16
#: entries halved the unpipelined rate in an earlier trial), and 50
#: unpipelined clients never make a run this long: that case is unchanged.
EARLY_WRITE_ENTRIES: Final = 64


class BusLink(asyncio.Protocol):
    __slots__ = ("_out", "_queued", "_run", "_run_bytes", "_run_key", "bus", "claimed", "closed",
                 "ctime", "last_read", "local_ip", "node", "partial_since", "peer_ip", "proven",
                 "reader", "target", "transport")

    def __init__(self, bus: ClusterBus, node: ClusterNode | None = None,
                 target: tuple[str, int] | None = None) -> None:
        self.bus = bus
        #: The node this outbound link reaches (None for inbound links), and
        #: the address it was dialled at.
        self.node = node
        self.target = target
        self.ctime = bus.now_ms()
        self.reader = FrameReader(bus.max_message, self._large_ok, UNPROVEN_MESSAGE)
        #: The peer proved itself on this link (ClusterBus.receive): it may
        #: send messages over UNPROVEN_MESSAGE bytes.
        self.proven = False
        #: The sender ID of the last message read while unproven: the proof
        #: comes later when that node enters the table (a handshake).
        self.claimed = ""
        self.transport: asyncio.Transport | None = None
        self.peer_ip = ""
        self.local_ip = ""
        self.closed = False
        self.last_read = self.ctime
        #: When the incomplete message now buffered started (0: none).
        self.partial_since = 0
        self._out: list[bytes] = []
        #: The open run of entries (send_entry) and the header they share.
        self._run: list[bytes] = []
        self._run_key = b""
        self._run_bytes = 0
        #: Something waits for the bus's flush (it was asked to call ours).
        self._queued = False

    # -- asyncio callbacks ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.peer_ip = peer[0] if peer else ""
        self.local_ip = local[0] if local else ""
        self.bus.link_made(self)

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        bus = self.bus
        try:
            frames = reader.feed(data)
        except FrameError as err:
            bus.bad_link(self, str(err))
            return
        now = bus.now_ms()
        self.last_read = now
        if reader.pending:
            if frames or not self.partial_since:
                self.partial_since = now
        else:
            self.partial_since = 0
        while True:
            for frame in frames:
                if self.closed:
                    return
                bus.receive(self, frame)
            if not reader.held or self.closed:
                return
            # The reader stopped before a message over its small limit,
            # whose check must see what the ones before it did (proved the
            # link): go on now that they are handled.
            try:
                frames = reader.feed(b"")
            except FrameError as err:
                bus.bad_link(self, str(err))
                return
            if frames:
                self.partial_since = now if reader.pending else 0

    def _large_ok(self, header: bytes) -> bool:
        """The reader asks (header of a message over its small limit): only
        a proven link, and over SMALL_MESSAGE only jobs from known nodes."""
        if not self.proven and not self.bus.proves(self):
            return False
        totlen = int.from_bytes(header[4:8], "big")
        return totlen <= SMALL_MESSAGE or self.bus.large_message_allowed(header)

    def prove(self) -> None:
        """The peer proved itself: messages up to SMALL_MESSAGE from now on."""
        self.proven = True
        self.reader.small_message = SMALL_MESSAGE

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        self._run = []
        # The reader's callback is a method of this link: a cycle, which
        # after a gc.freeze (cyclic_gc.py) would keep a closed link and its
        # partial message until the hourly hand-back.  Broken here, the link
        # goes when the transport lets it go.
        self.reader.large_ok = None
        self.bus.link_lost(self)

    # -- sending --------------------------------------------------------------

    def send(self, message: bytes) -> None:
        """A whole message, after everything sent before it."""
        if self.closed:
            return
        self.bus.stats_sent += 1
        if self._run:
            self._close_run()
        self._out.append(message)
        if not self._queued:
            self._queued = True
            self.bus.want_flush(self)

    def send_entry(self, key: bytes, entry: bytes) -> None:
        """A message of one entry: ``key`` is its header from byte 8
        (``messages.header_rest``), ``entry`` the job ID + aux of a job-ID
        message or the blob of a REPLJOB's one job.

        To a CAP_BATCH peer it joins the open run when that has the same
        header (one message at the end, ``messages.batch_frame``); to any
        other peer it leaves as the original's message of one entry.
        """
        if self.closed:
            return
        self.bus.stats_sent += 1
        node = self.node
        run = self._run
        if node is None or not node.caps & CAP_BATCH or len(entry) > MAX_BATCHED_ENTRY:
            if run:
                self._close_run()
            self._out.append(single_frame(key, entry))
        elif run:
            if ((key is self._run_key or key == self._run_key) and len(run) < MAX_BATCH
                    and self._run_bytes < MAX_BATCH_BYTES):
                run.append(entry)
                self._run_bytes += len(entry)
                if len(run) >= EARLY_WRITE_ENTRIES:
                    self.bus.write_early()
                return  # the flush is already asked for (or just done)
            self._close_run()
            self._run = [entry]
            self._run_key = key
            self._run_bytes = len(entry)
        else:
            run.append(entry)
            self._run_key = key
            self._run_bytes = len(entry)
        if not self._queued:
            self._queued = True
            self.bus.want_flush(self)

    def queued_copies(self) -> int:
        """Copies of new jobs (REPLJOB entries) waiting for the flush, when
        they are all the link has to send (0 otherwise)."""
        run = self._run
        if run and not self._out and is_repljob_key(self._run_key):
            return len(run)
        return 0

    def _close_run(self) -> None:
        """The open run as one message, queued after what was sent before it."""
        run = self._run
        self._out.append(batch_frame(self._run_key, run))
        self.bus.stats_merged += len(run) - 1
        self._run = []

    def flush(self) -> None:
        """Write what this turn queued, in one write (the bus calls this)."""
        self._queued = False
        if self._run:
            self._close_run()
        if self.closed or not self._out or self.transport is None:
            self._out.clear()
            return
        out, self._out = self._out, []
        node = self.node
        if len(out) > 1 and node is not None and node.caps & CAP_BATCH:
            sent = len(out)
            out = coalesce(out)
            self.bus.stats_merged += sent - len(out)
        auth = self.bus.auth
        if auth is not None:  # the cluster secret (auth.py): signed as they leave
            out = [auth.sign(message) for message in out]
        data = b"".join(out) if len(out) > 1 else out[0]
        self.bus.stats_sent_bytes += len(data)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > OUTPUT_LIMIT:
            log.warning("Closing cluster bus link to %s: the peer is not reading",
                        self.peer_ip)
            self.close()

    def unsent_bytes(self) -> int:
        """Output the kernel has not taken yet (INFO mem_cluster_links)."""
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        self._run = []
        if self.transport is not None:
            self.transport.abort()
        else:
            self.reader.large_ok = None  # see connection_lost
            self.bus.link_lost(self)
