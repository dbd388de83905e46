"""One TCP connection of the cluster bus.

Each pair of nodes uses two: our *outbound* link to a node carries every
message we send it; its outbound link to us arrives here as an *inbound*
link, on which we only answer PING/MEET with PONG (as the original).

Reads are parsed in bulk (every whole message of a read, by
``messages.FrameReader``); writes wait until the end of the event-loop turn
and leave in one ``write`` per link (the bus's flush), like client replies;
to a peer that takes batched messages (``messages.CAP_BATCH``, only our
nodes) neighbouring GOTJOBs, QUEUEDs, REPLJOBs ... are merged first.
A link that breaks the framing, stalls in the middle of a message or piles
up more unread output than :data:`OUTPUT_LIMIT` is closed; the cron
reconnects outbound links.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from .messages import CAP_BATCH, FrameError, FrameReader, coalesce

if TYPE_CHECKING:
    from .bus import ClusterBus
    from .state import ClusterNode

__all__ = ["OUTPUT_LIMIT", "BusLink"]

log = logging.getLogger("disque.cluster")

#: Bytes written to a peer and not yet taken by it, beyond which the link is
#: dropped rather than buffered without limit (a peer that stopped reading).
OUTPUT_LIMIT = 256 * 1024 * 1024


class BusLink(asyncio.Protocol):
    __slots__ = ("_out", "bus", "closed", "ctime", "last_read", "local_ip", "node",
                 "partial_since", "peer_ip", "reader", "target", "transport")

    def __init__(self, bus: ClusterBus, node: ClusterNode | None = None,
                 target: tuple[str, int] | None = None) -> None:
        self.bus = bus
        #: The node this outbound link reaches (None for inbound links), and
        #: the address it was dialled at.
        self.node = node
        self.target = target
        self.ctime = bus.now_ms()
        self.reader = FrameReader(bus.max_message, bus.large_message_allowed)
        self.transport: asyncio.Transport | None = None
        self.peer_ip = ""
        self.local_ip = ""
        self.closed = False
        self.last_read = self.ctime
        #: When the incomplete message now buffered started (0: none).
        self.partial_since = 0
        self._out: list[bytes] = []

    # -- asyncio callbacks ----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.peer_ip = peer[0] if peer else ""
        self.local_ip = local[0] if local else ""
        self.bus.link_made(self)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.reader.feed(data)
        except FrameError as err:
            log.warning("Closing cluster bus link from %s: %s", self.peer_ip, err)
            self.bus.stats_bad_links += 1
            self.close()
            return
        now = self.bus.now_ms()
        self.last_read = now
        if self.reader.pending:
            if frames or not self.partial_since:
                self.partial_since = now
        else:
            self.partial_since = 0
        for frame in frames:
            if self.closed:
                return
            self.bus.receive(self, frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        self.bus.link_lost(self)

    # -- sending --------------------------------------------------------------

    def send(self, message: bytes) -> None:
        if self.closed:
            return
        self.bus.stats_sent += 1
        out = self._out
        out.append(message)
        if len(out) == 1:
            self.bus.want_flush(self)

    def flush(self) -> None:
        """Write what this turn queued, in one write (the bus calls this)."""
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

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()
        else:
            self.bus.link_lost(self)
