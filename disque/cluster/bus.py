"""The cluster bus: the listener on port + 10000, the links, the cron, dispatch.

* **Listener**: on every bind address, at the client port + 10000.
* **Links** (``link.py``): one outbound link per known node, made by the
  cron; inbound links come from the other nodes' crons.
* **Cron** (every 100 ms on a fixed grid, like the original's clusterCron):
  connect link-less nodes, the membership rules (``membership.py``: pings,
  timeouts, PFAIL), close stalled inbound links.
* **Dispatch**: PING, PONG, MEET and FAIL go to membership; every other type
  to the handler registered for it in :attr:`ClusterBus.handlers` (the job
  state machine registers REPLJOB, SETACK, ... beside the procedure each
  belongs to), with the sender's node.  Messages from unknown senders are
  ignored except PING and MEET, as in the original.
* **Flush**: messages sent during an event-loop turn leave at its end, one
  write per link, after the before-flush hooks (the AOF: a GOTJOB must not
  promise a copy that is not logged yet); nodes.conf is written there too,
  once per turn however many changes it had.  New jobs' copies (REPLJOB)
  may wait up to :data:`HOLD_TURNS` more turns while each brings more of
  them (:meth:`ClusterBus.flush`).
* **Proof and limits** (against whoever can reach the bus port): a link is
  *proven* once a message on it verified with the cluster secret, or,
  without a secret, once it carried a message from a node of the table.
  Until then it may send small messages only
  (``messages.UNPROVEN_MESSAGE``), and an inbound link that proves nothing
  within :data:`UNPROVEN_LINK_MS` is closed.  At most
  ``cluster-max-inbound-links`` inbound links are kept: at the limit the
  oldest unproven one gives way to a new one, and when all are proven the
  new one is refused.
* **TLS** (``tls-cluster``, an extension): the listener and the outbound
  links speak TLS with the node's certificate, peers verified against the
  CA both ways; sockets are accepted here so that a failed handshake is
  seen and logged.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import ssl
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, Final

from ..log import RateLimitedLog
from . import messages
from .auth import BusAuth
from .link import BusLink
from .membership import Membership
from .messages import Message
from .node import ClusterNode
from .state import ClusterState

__all__ = ["BUS_PORT_OFFSET", "ClusterBus", "Handler", "connect_within"]

log: Final = logging.getLogger("disque.cluster")

BUS_PORT_OFFSET: Final = 10000
#: The original's clusterCron period.
CRON_PERIOD_S: Final = 0.1

#: How many more event-loop turns the end-of-turn flush may wait while each
#: one adds copies of new jobs (REPLJOB) to send: see ClusterBus.flush.
HOLD_TURNS: Final = 2

#: An inbound link that has not proved itself this long after it was made
#: (or, with tls-cluster, accepted) is closed.  A peer's first message
#: (PING or MEET, sent as soon as it connects) proves the link when the
#: peer is in our table; when it is not yet (it just met us, or we heard
#: of it by gossip) the proof comes once our handshake with it completes,
#: which takes a round trip.  A peer whose link was closed anyway loses
#: nothing: its cron reconnects within 100 ms and its next PING proves the
#: new link.  Strangers hold a socket (and at most UNPROVEN_MESSAGE bytes)
#: for this long.
UNPROVEN_LINK_MS: Final = 5000

#: Default of cluster-max-inbound-links (config.py).
DEFAULT_MAX_INBOUND: Final = 1024

Handler = Callable[[ClusterNode, Message], None]


class ClusterBus:
    def __init__(self, cluster: ClusterState, now_ms: Callable[[], int],
                 node_timeout: Callable[[], int],
                 max_message: int = messages.DEFAULT_MAX_MESSAGE,
                 before_flush: list[Callable[[], None]] | None = None,
                 auth: BusAuth | None = None,
                 max_inbound: Callable[[], int] | None = None,
                 tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None) -> None:
        self.cluster = cluster
        #: The cluster secret (auth.py): signs what links send, checks what they read.
        self.auth = auth
        #: cluster-max-inbound-links, read at every accept (CONFIG SET changes it).
        self.max_inbound: Callable[[], int] = (
            max_inbound if max_inbound is not None else _default_max_inbound)
        #: tls-cluster: the listener's context and the outbound links' one.
        self.tls_server: ssl.SSLContext | None = tls[0] if tls is not None else None
        self.tls_client: ssl.SSLContext | None = tls[1] if tls is not None else None
        #: TLS handshakes of accepted sockets under way -> (when accepted,
        #: the peer's IP): they count as inbound links against the limit,
        #: as unproven ones.
        self._handshakes: dict[asyncio.Task[None], tuple[int, str]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._listeners: list[socket.socket] = []
        self.now_ms = now_ms
        self.node_timeout = node_timeout
        self.max_message = max_message
        self.membership = Membership(cluster, now_ms, node_timeout)
        self.handlers: dict[int, Handler] = {}
        #: Handlers of a whole batched job-ID message (CAP_BATCH) by type,
        #: that read its entries from the payload themselves; a type
        #: without one has each entry made a message for its handler.
        self.batch_handlers: dict[int, Handler] = {}
        self.before_flush = before_flush if before_flush is not None else []
        self.bind_ip = ""
        self.inbound: set[BusLink] = set()
        self._servers: list[asyncio.base_events.Server] = []
        self._connecting: set[ClusterNode] = set()
        self._dirty_links: list[BusLink] = []
        self._flush_scheduled = False
        #: The loop (asyncio.get_running_loop() reads the process ID, a
        #: system call, every time).
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Turns the pending flush has waited (HOLD_TURNS), and the new
        #: jobs' copies it had to send when it last did.
        self._held = 0
        self._held_copies = 0
        #: A run filled up this turn (write_early): no hold.
        self._burst = False
        self._save_pending = False
        self._cron_handle: asyncio.TimerHandle | None = None
        self._cron_deadline = 0.0
        self._stopping = False
        self.stats_sent = 0
        self.stats_received: Counter[int] = Counter()
        self.stats_dropped = 0
        self.stats_bad_links = 0
        self.stats_sent_bytes = 0
        #: Messages that left inside a batch rather than alone (merged by
        #: messages.coalesce), and batched job-ID messages received.
        self.stats_merged = 0
        self.stats_batches_received = 0
        #: Inbound links refused at the limit (cluster-max-inbound-links),
        #: unproven links closed (in time, or to make room), failed TLS
        #: handshakes (tls-cluster), both ways.
        self.stats_links_refused = 0
        self.stats_unproven_closed = 0
        self.stats_tls_failures = 0
        # What anybody who reaches the port can cause is logged at most
        # every 10 s per kind, with a count of the rest: never a full disk.
        self._log_bad_link = RateLimitedLog(log)
        self._log_refused = RateLimitedLog(log)
        self._log_unproven = RateLimitedLog(log)
        self._log_tls = RateLimitedLog(log)
        cluster.save_later = self._save_later

    # -- lifecycle ------------------------------------------------------------

    async def start(self, bind: list[str], port: int) -> None:
        """Listen on ``port`` + 10000 on every bind address, start the cron."""
        loop = asyncio.get_running_loop()
        self.bind_ip = next((a for a in bind if a not in ("0.0.0.0", "::", "*")), "")
        for address in bind:
            host = None if address == "*" else address
            try:
                if self.tls_server is not None:
                    self._listen_tls(host, port + BUS_PORT_OFFSET)
                    continue
                server = await loop.create_server(lambda: BusLink(self), host,
                                                  port + BUS_PORT_OFFSET, reuse_address=True)
            except OSError as err:
                self.stop()
                raise SystemExit(f"Could not create the cluster bus TCP listening socket "
                                 f"{address}:{port + BUS_PORT_OFFSET}: {err.strerror}") from None
            self._servers.append(server)
        # The first cron runs now, not a period later (as the original's,
        # whose first serverCron runs clusterCron 1 ms after the start): a
        # restarted node links to the nodes of its nodes.conf at once, so
        # it can answer the copies (GOTJOB) they send it as soon as they see
        # it back.
        self._cron_deadline = loop.time() - CRON_PERIOD_S
        self._schedule_cron()

    def _listen_tls(self, host: str | None, port: int) -> None:
        """A listening socket whose connections this bus accepts (tls-cluster)."""
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                  flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(info[4])
            sock.listen(511)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listeners.append(sock)
        self._spawn(self._accept_tls(sock))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
        return task

    def stop(self) -> None:
        # What is queued (a held flush's copies too) leaves before the links
        # close, persistence first, as at the end of a turn.
        try:
            self.write_links()
        except Exception:
            log.exception("Error writing the cluster bus links on shutdown")
        self._stopping = True
        if self._cron_handle is not None:
            self._cron_handle.cancel()
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for sock in self._listeners:
            sock.close()
        self._listeners.clear()
        for link in list(self.inbound):
            link.close()
        for node in self.cluster.nodes.values():
            if node.link is not None:
                node_link, node.link = node.link, None
                node_link.close()

    # -- links ----------------------------------------------------------------

    def link_made(self, link: BusLink) -> None:
        node = link.node
        if node is None:
            if len(self.inbound) >= self.max_inbound() and not self._make_room():
                self._refuse(link.peer_ip)
                link.close()
                return
            self.inbound.add(link)
            return
        self._connecting.discard(node)
        if (self.cluster.nodes.get(node.id) is not node or node.link is not None
                or link.target != (node.ip, node.port)):
            link.close()  # forgotten, linked or moved while we were connecting
            return
        node.link = link
        # The first message says who we are; a ping already outstanding
        # keeps its time, so a node that keeps accepting and dropping
        # connections still reaches PFAIL.
        old_ping_sent = node.ping_sent
        self.membership.send_ping(node, messages.MEET if node.meet else messages.PING)
        node.meet = False
        if old_ping_sent:
            node.ping_sent = old_ping_sent

    def _make_room(self) -> bool:
        """At the inbound limit: close the oldest unproven inbound link, or
        TLS handshake under way (a stranger's, or a peer's that will
        reconnect), if there is one.

        Refusing the new link instead would let a stranger who keeps the
        limit's worth of unproven links open shut the cluster's peers out;
        a peer's link proves itself with its first message, so only
        strangers' links stay unproven long enough to be picked.
        """
        oldest_link: BusLink | None = None
        oldest_ms = 0
        for link in self.inbound:
            if not link.closed and not self.proves(link) and (
                    oldest_link is None or link.ctime < oldest_ms):
                oldest_link, oldest_ms = link, link.ctime
        oldest_task: asyncio.Task[None] | None = None
        peer_ip = ""
        for task, (since, ip) in self._handshakes.items():
            if (oldest_link is None and oldest_task is None) or since < oldest_ms:
                oldest_task, oldest_ms, peer_ip = task, since, ip
        if oldest_task is not None:
            del self._handshakes[oldest_task]
            oldest_task.cancel()  # the handshake's socket is closed (_handshake_tls)
        elif oldest_link is not None:
            peer_ip = oldest_link.peer_ip
            self.inbound.discard(oldest_link)
            oldest_link.close()
        else:
            return False
        self.stats_unproven_closed += 1
        self._log_unproven.warning(f"Closing an unproven cluster bus link from {peer_ip} to "
                                   f"make room for a new one (cluster-max-inbound-links "
                                   f"{self.max_inbound()})")
        return True

    def _refuse(self, peer_ip: str) -> None:
        self.stats_links_refused += 1
        self._log_refused.warning(f"Refused a cluster bus link from {peer_ip}: "
                                  f"{len(self.inbound)} inbound links, all proven "
                                  f"(cluster-max-inbound-links {self.max_inbound()})")

    def bad_link(self, link: BusLink, reason: str) -> None:
        """A link that broke the framing (or sent too much before its proof): closed."""
        self.stats_bad_links += 1
        proof = "" if link.proven else " (not proven)"
        self._log_bad_link.warning(f"Closing cluster bus link from {link.peer_ip}{proof}: "
                                   f"{reason}")
        link.close()

    def proves(self, link: BusLink) -> bool:
        """Whether ``link`` is proven now: without the secret, the sender its
        messages claimed may have entered the table since (a handshake)."""
        if link.proven:
            return True
        if self.auth is not None or not link.claimed:
            return False  # with the secret only a signature proves (receive)
        node = self.cluster.nodes.get(link.claimed)
        if node is None or node.flags & _NO_JOB_MESSAGES:
            return False
        link.prove()
        return True

    def unproven_inbound(self) -> int:
        """Inbound links (TLS handshakes under way included) not proven yet."""
        count = len(self._handshakes)
        for link in self.inbound:
            if not link.closed and not self.proves(link):
                count += 1
        return count

    def unsent_bytes(self) -> int:
        """Output waiting in every link (BusLink.unsent_bytes)."""
        total = 0
        for link in self.inbound:
            total += link.unsent_bytes()
        for node in self.cluster.nodes.values():
            if node.link is not None:
                total += node.link.unsent_bytes()
        return total

    def link_lost(self, link: BusLink) -> None:
        self.inbound.discard(link)
        node = link.node
        if node is not None and node.link is link:
            node.link = None

    def _connect(self, node: ClusterNode) -> None:
        if node in self._connecting or self._stopping:
            return
        self._connecting.add(node)
        asyncio.get_running_loop().create_task(self._open_link(node))

    async def _open_link(self, node: ClusterNode) -> None:
        """Connect to ``node``'s bus port; give up after the node timeout.

        The connect is non-blocking on a socket made here, watched by one
        future that either the socket (writable: connected or refused) or
        the timer completes; on timeout the socket is closed.  Cancelling a
        pending connect instead (``wait_for`` around ``create_connection``
        or ``sock_connect``) waited for the cancellation to finish, and
        after a peer was killed or stopped some never did: each such fault
        left attempts behind for good.
        """
        loop = asyncio.get_running_loop()
        target = (node.ip, node.port)
        port = node.bus_port or node.port + BUS_PORT_OFFSET
        sock: socket.socket | None = None
        handshaking = False
        try:
            infos = await loop.getaddrinfo(node.ip, port, type=socket.SOCK_STREAM)
            family, _, proto, _, address = infos[0]
            sock = socket.socket(family, socket.SOCK_STREAM, proto)
            sock.setblocking(False)
            if self.bind_ip:
                sock.bind((self.bind_ip, 0))
            timeout_s = max(self.node_timeout(), 1000) / 1000
            await connect_within(loop, sock, address, timeout_s)
            if self.tls_client is None:
                await loop.create_connection(lambda: BusLink(self, node, target), sock=sock)
            else:
                handshaking = True
                # server_hostname only names the peer (an IP: no SNI); as
                # Redis's cluster bus, the certificate's chain to the CA is
                # checked, not its names (check_hostname is off).
                await loop.create_connection(lambda: BusLink(self, node, target), sock=sock,
                                             ssl=self.tls_client, server_hostname=node.ip,
                                             ssl_handshake_timeout=timeout_s)
            sock = None  # the transport's now
        except (OSError, TimeoutError, ValueError, OverflowError) as err:
            self._connecting.discard(node)
            if handshaking:
                self._tls_failed(f"{node.ip}:{port}", err)
            else:
                log.debug("Connecting to node %s at %s:%d failed: %s", node.id, node.ip,
                          port, err)
            if not node.ping_sent:
                node.ping_sent = self.now_ms()
        except Exception:  # a bug: log it, never kill the cron's reconnects
            self._connecting.discard(node)
            log.exception("Connecting to node %s failed", node.id)
        finally:
            if sock is not None:
                sock.close()

    async def _accept_tls(self, listener: socket.socket) -> None:
        """Accept bus connections (tls-cluster): the limit first, then the
        handshake, before any BusLink exists."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as err:  # out of file descriptors: wait, don't spin
                self._log_tls.warning(f"Cluster bus: accept failed: {_reason(err)}")
                await asyncio.sleep(0.1)
                continue
            peer_ip = peer[0] if isinstance(peer, tuple) else "?"
            if (len(self.inbound) + len(self._handshakes) >= self.max_inbound()
                    and not self._make_room()):
                self._refuse(peer_ip)
                sock.close()
                continue
            address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"
            task = self._spawn(self._handshake_tls(sock, address))
            self._handshakes[task] = (self.now_ms(), peer_ip)

    async def _handshake_tls(self, sock: socket.socket, address: str) -> None:
        # On failure or cancellation the loop closes the socket itself (it
        # is detached from ``sock``: closing that is a no-op).
        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                lambda: BusLink(self), sock, ssl=self.tls_server,
                ssl_handshake_timeout=UNPROVEN_LINK_MS / 1000)
        except (OSError, TimeoutError) as err:  # ssl.SSLError is an OSError
            sock.close()
            self._tls_failed(address, err)
        except asyncio.CancelledError:
            sock.close()  # _make_room, or the bus stopping
        except Exception:  # a bug: log it, never kill the listener
            sock.close()
            log.exception("TLS handshake on the cluster bus failed")
        finally:
            task = asyncio.current_task()
            if task is not None:
                self._handshakes.pop(task, None)

    def _tls_failed(self, address: str, err: BaseException) -> None:
        """A TLS handshake of the bus failed (a plain-text peer, a certificate
        of another CA, a peer that refused ours): counted and logged."""
        self.stats_tls_failures += 1
        self._log_tls.warning(f"TLS handshake on the cluster bus with {address} failed: "
                              f"{_reason(err)}")

    # -- receiving --------------------------------------------------------------

    def large_message_allowed(self, header: bytes) -> bool:
        """Only REPLJOB/YOURJOBS from a node of the table may be over 1 MB."""
        msg_type = int.from_bytes(header[12:14], "big")
        sender = header[16:56].decode("ascii", "replace")
        node = self.cluster.nodes.get(sender)
        return (msg_type in messages.JOBS_TYPES and node is not None
                and not node.flags & _NO_JOB_MESSAGES)

    def receive(self, link: BusLink, frame: bytes) -> None:
        auth = self.auth
        if auth is not None:
            if not auth.verify(frame):
                auth.refuse(frame, link.peer_ip, messages.type_name(frame))
                link.close()
                return
            if not link.proven:
                link.prove()  # signed with the secret: a member of the cluster
        msg = messages.decode(frame)
        if msg is None:
            self.stats_dropped += 1
            return
        self.stats_received[msg.type] += 1
        try:
            if msg.type in _MEMBERSHIP_TYPES:
                node = self.membership.process(link, msg)
                if node is not None and msg.type in messages.GOSSIP_TYPES:
                    node.caps = msg.caps
                    if node.link is None and link.node is None:
                        # A known node reached us and we have no link to it
                        # (it came back): link now, not at the next cron, or
                        # what we owe it (GOTJOB for the copies it sends
                        # once our PONG clears its failure flag) is dropped.
                        self._connect(node)
                if not link.proven:
                    # A node of the table, maybe since this message (the
                    # PONG that completes our handshake with it).
                    link.claimed = msg.sender
                    self.proves(link)
                return
            sender = self.cluster.nodes.get(msg.sender)
            if sender is None or sender.flags & _NO_JOB_MESSAGES:
                if not link.proven:
                    link.claimed = msg.sender
                return
            if not link.proven:
                link.prove()
            handler = self.handlers.get(msg.type)
            if handler is None:
                self.stats_dropped += 1
                return
            if msg.numjobs > 1 and msg.type in messages.JOB_ID_TYPES:
                batch_handler = self.batch_handlers.get(msg.type)
                if batch_handler is not None:
                    self.stats_received[msg.type] += msg.numjobs - 1
                    self.stats_batches_received += 1
                    batch_handler(sender, msg)
                else:
                    self._receive_batch(handler, sender, msg)
            else:
                handler(sender, msg)
        except Exception:  # a bug: drop this message, keep the link and the node
            log.exception("Error processing cluster bus message %s from %s",
                          messages.TYPE_NAMES[msg.type], msg.sender)

    def _receive_batch(self, handler: Handler,
                       sender: ClusterNode, msg: Message) -> None:
        """A batched job-ID message (CAP_BATCH): each entry as its own message,
        counted as such; a failing one does not drop the ones after it."""
        self.stats_received[msg.type] += msg.numjobs - 1
        self.stats_batches_received += 1
        for entry in messages.split_job_ids(msg):
            try:
                handler(sender, entry)
            except Exception:
                log.exception("Error processing cluster bus message %s from %s",
                              messages.TYPE_NAMES[msg.type], msg.sender)

    # -- sending ----------------------------------------------------------------

    def want_flush(self, link: BusLink) -> None:
        self._dirty_links.append(link)
        self._schedule_flush()

    def _save_later(self) -> None:
        self._save_pending = True
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._call_soon(self.flush)

    def _call_soon(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        loop.call_soon(callback)

    def flush(self) -> None:
        """End of the turn: persistence first, then one write per link.

        Unless the turn made copies of new jobs (REPLJOB): then the flush
        waits for the next turn (``call_soon``: the loop first polls its
        sockets without blocking), up to :data:`HOLD_TURNS` times while
        each turn adds more.  Under unpipelined clients a turn reads a
        dozen ADDJOBs, and while its replies are written the clients
        answered before send their next ones: held, a REPLJOB carries ~28
        jobs instead of ~14, so each peer wakes, reads and writes GOTJOB
        half as often per job (-20% CPU per job on the peers; the 3-node
        rate went from 0.43 to 0.49 of the one-node rate).
        The cost is a non-blocking poll: nothing waits on a timer, and a
        lone client's job leaves one poll later.  Only copies are held: a
        link with anything else to send (GOTJOB, PONG, a job too large for
        a run, every message to the original) is written at the end of the
        turn, and the others with it.  A pipelined burst fills its messages
        by itself (:meth:`write_early`) and is not held.
        """
        self._flush_scheduled = False
        if self._stopping:
            return  # stop() wrote the links and closed them
        if self._hold():
            return
        self._burst = False
        self.write_links()
        if self._save_pending:
            self._save_pending = False
            try:
                self.cluster.save()
            except OSError as err:
                log.warning("Could not save the cluster config: %s", err)

    def _hold(self) -> bool:
        """Whether the flush waits one more turn (see :meth:`flush`)."""
        if self._burst or self._held >= HOLD_TURNS:
            return False  # a pipelined burst fills its messages without waiting
        copies = 0
        for link in self._dirty_links:
            queued = link.queued_copies()
            if not queued:
                return False  # the link has other messages (GOTJOB, PONG ...)
            copies += queued
        if copies <= self._held_copies:
            return False  # this turn added none: no sign of more
        self._held += 1
        self._held_copies = copies
        self._flush_scheduled = True
        self._call_soon(self.flush)
        return True

    def write_early(self) -> None:
        """A link's run filled up in the middle of a turn: write now (see
        :meth:`write_links`), and hold nothing at the end of this turn."""
        self._burst = True
        self.write_links()

    def write_links(self) -> None:
        """Write every link's queued output now (persistence first).

        The end-of-turn flush does this; a link also calls it in the middle
        of a long turn (:data:`link.EARLY_WRITE_ENTRIES`), so that peers
        start on the first jobs of a big pipelined burst while this node is
        still parsing the rest, instead of every node waiting in turn.
        """
        self._held = 0
        self._held_copies = 0
        if self._dirty_links:
            try:
                for hook in self.before_flush:
                    hook()   # may call drop_output()
            finally:  # a failing hook must not strand the links' output
                links, self._dirty_links = self._dirty_links, []
                for link in links:
                    link.flush()
                if self.auth is not None:
                    self.auth.forget()

    def drop_output(self) -> None:
        """Close the links with output queued, unsent: the AOF could not
        write (or sync) records it may acknowledge (a GOTJOB for a copy).
        The peers see the link drop, as after a crash, and reconnect."""
        links, self._dirty_links = self._dirty_links, []
        for link in links:
            link.close()

    # -- the cron ---------------------------------------------------------------

    def _schedule_cron(self) -> None:
        loop = asyncio.get_running_loop()
        self._cron_deadline += CRON_PERIOD_S
        now = loop.time()
        if self._cron_deadline < now:  # fell behind: skip, don't burst
            self._cron_deadline = now + CRON_PERIOD_S
        self._cron_handle = loop.call_at(self._cron_deadline, self._cron)

    def _cron(self) -> None:
        try:
            for node in self.membership.cron():
                self._connect(node)
            self._close_stalled_links()
        except Exception:  # pragma: no cover - keep the cron alive, say it loudly
            log.exception("Error in the cluster cron")
        if not self._stopping:
            self._schedule_cron()

    def _close_stalled_links(self) -> None:
        """Inbound links silent, or stuck inside a message, for too long.

        A live peer pings every half node timeout, so silence for two node
        timeouts means a dead or hostile peer; a message that has not
        completed in one node timeout is a stalled sender.  Either way the
        socket (and its partial buffer) is freed.
        """
        now = self.now_ms()
        timeout = self.node_timeout()
        for link in list(self.inbound):
            if link.closed:
                continue
            if now - link.last_read > 2 * timeout or (
                    link.partial_since and now - link.partial_since > timeout):
                log.info("Closing a stalled cluster bus link from %s", link.peer_ip)
                link.close()
            elif now - link.ctime > UNPROVEN_LINK_MS and not self.proves(link):
                self.stats_unproven_closed += 1
                missing = ("no message signed with the cluster secret" if self.auth is not None
                           else "no message from a node of the table")
                self._log_unproven.warning(f"Closing a cluster bus link from {link.peer_ip}: "
                                           f"{missing} in {UNPROVEN_LINK_MS} ms")
                link.close()

    # -- figures ----------------------------------------------------------------

    @property
    def messages_received(self) -> int:
        return sum(self.stats_received.values())


_MEMBERSHIP_TYPES: Final = frozenset((messages.PING, messages.PONG, messages.MEET, messages.FAIL))
_NO_JOB_MESSAGES: Final = frozenset(("handshake", "myself"))


def _default_max_inbound() -> int:
    return DEFAULT_MAX_INBOUND


def _reason(err: BaseException) -> str:
    """An exception as one short line for the log."""
    if isinstance(err, ssl.SSLCertVerificationError) and err.verify_message:
        return f"certificate verify failed: {err.verify_message}"
    if isinstance(err, ssl.SSLError) and err.reason:
        return str(err.reason)
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__


async def connect_within(loop: asyncio.AbstractEventLoop, sock: socket.socket,
                          address: tuple[Any, ...], timeout_s: float) -> None:
    """Connect the non-blocking ``sock``, or raise (refused: OSError; no
    answer within ``timeout_s``: TimeoutError).  Nothing is cancelled: the
    writer callback and the timer each complete the one future, and both
    are removed whatever happens."""
    done: asyncio.Future[None] = loop.create_future()

    def finish(error: BaseException | None) -> None:
        if not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    code = sock.connect_ex(address)
    if code == 0:
        return
    if code not in (errno.EINPROGRESS, errno.EAGAIN):
        raise OSError(code, os.strerror(code))
    fd = sock.fileno()
    loop.add_writer(fd, finish, None)
    timer = loop.call_later(timeout_s, finish, TimeoutError(f"no answer in {timeout_s} s"))
    try:
        await done
    finally:
        loop.remove_writer(fd)
        timer.cancel()
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        raise OSError(code, os.strerror(code))
