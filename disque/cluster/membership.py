"""Membership: who is in the cluster and who is reachable.

The rules of the original's cluster.c, apart from sockets (``bus.py`` owns
those and calls in here):

* **Handshake** (CLUSTER MEET, gossip about unknown nodes): a placeholder
  node with a random ID and the HANDSHAKE flag; our cron connects and sends
  MEET (or PING); the PONG tells us the real ID.  A handshake not finished
  within max(node timeout, 1 s) is dropped.
* **Gossip**: every PING/PONG/MEET carries a few entries about other
  nodes; unknown ones are met, failure reports are collected.
* **Failure detection**: a PING unanswered for the node timeout makes the
  node PFAIL (``fail?``); PFAIL plus a majority's recent reports makes it
  FAIL, broadcast to everyone; any PONG clears both.

Everything here works on :class:`ClusterState` and a clock, so it is tested
with messages and a hand-moved clock, no sockets.
"""

from __future__ import annotations

import ipaddress
import logging
import random
from collections.abc import Callable
from typing import Protocol

from . import messages
from .messages import GossipEntry, Message
from .node import (
    FLAG_FAIL,
    FLAG_HANDSHAKE,
    FLAG_LEAVING,
    FLAG_MYSELF,
    FLAG_NOADDR,
    FLAG_PFAIL,
    ClusterNode,
    new_node_id,
)
from .state import ClusterState

__all__ = ["BusLinkLike", "Membership"]

log = logging.getLogger("disque.cluster")

#: FORGET keeps a node from being re-added by gossip for this long.
FORGET_BAN_MS = 60_000
#: Handshakes get at least this long, whatever the node timeout.
MIN_HANDSHAKE_MS = 1000
#: Handshakes in progress at most (each is a connection attempt).
MAX_HANDSHAKES = 1024
#: The highest client port a node can have (its bus port is + 10000).
MAX_NODE_PORT = 55535
#: Failure reports older than this many node timeouts no longer count.
FAIL_REPORT_VALIDITY_MULT = 2


class BusLinkLike(Protocol):
    """What membership needs of a link (``link.BusLink``)."""

    node: ClusterNode | None   # the node of an outbound link, None inbound
    ctime: int
    peer_ip: str
    local_ip: str

    def send(self, message: bytes) -> None: ...

    def close(self) -> None: ...


class Membership:
    def __init__(self, cluster: ClusterState, now_ms: Callable[[], int],
                 node_timeout: Callable[[], int]) -> None:
        self.cluster = cluster
        self.now_ms = now_ms
        self.node_timeout = node_timeout
        self._cron_runs = 0
        #: Told the ID of a node flagged failing (PFAIL or FAIL) that answers
        #: again: the node's return event (the ACK GC resumes its retries).
        self.on_node_back: Callable[[str], None] | None = None
        #: Told (node ID, ip, port) when a handshake with ip:port finds a
        #: node: discovery learns which node an address it found is.
        self.on_found: Callable[[str, str, int], None] | None = None
        #: Told the ID of a node when a PONG from it arrives: readiness
        #: (the node reached the cluster once).
        self.on_pong: Callable[[str], None] | None = None

    # -- handshakes -----------------------------------------------------------

    def meet(self, ip: str, port: int, bus_port: int = 0) -> bool:
        """Start a handshake with ip:port (CLUSTER MEET, gossip, discovery);
        False if one is already under way, or the address is not an IP and a
        node port.  ``bus_port``: 0 for port + 10000."""
        return self.start_handshake(ip, port, meet=True, bus_port=bus_port)

    def start_handshake(self, ip: str, port: int, meet: bool, bus_port: int = 0) -> bool:
        """A placeholder node for ip:port, which our cron connects to.

        One per address, and at most :data:`MAX_HANDSHAKES` at a time: each
        costs a connection attempt, and gossip must not be able to make us
        open connections without limit.
        """
        cluster = self.cluster
        key = (ip, port)
        if key in cluster.handshakes or not 0 < port <= (65535 if bus_port else MAX_NODE_PORT):
            return False
        if len(cluster.handshakes) >= MAX_HANDSHAKES:
            log.warning("Too many handshakes in progress: not meeting %s:%d", ip, port)
            return False
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return False
        node = ClusterNode(new_node_id(), ip, port, {FLAG_HANDSHAKE}, ctime=self.now_ms(),
                           meet=meet, bus_port=bus_port)
        cluster.nodes[node.id] = node
        cluster.handshakes[key] = node
        return True

    def _handshake_timeout_ms(self) -> int:
        return max(self.node_timeout(), MIN_HANDSHAKE_MS)

    # -- messages ---------------------------------------------------------------

    def header_flags(self) -> int:
        return self.cluster.wire_flags

    def gossip_message(self, msg_type: int) -> bytes:
        cluster = self.cluster
        me = cluster.myself
        return messages.gossip_message(msg_type, me.id, me.port, self.header_flags(),
                                       self.gossip_entries(), cluster.announce_ip,
                                       me.bus_port)

    def gossip_entries(self) -> list[GossipEntry]:
        """A few other nodes, failing ones first (clusterSendPing).

        As many as the original: max(3, N/10), at most N - 2.  Unlike the
        original, a failing node is gossiped even when we have no link to it
        (a dead node has none): the reports that turn PFAIL into FAIL must
        spread (the original skipped link-less nodes, so FAIL came late).
        """
        nodes = self.cluster.nodes
        wanted = min(max(3, len(nodes) // 10), len(nodes) - 2)
        if wanted <= 0:
            return []
        failing, others = [], []
        for node in nodes.values():
            if node.flags & _NOT_GOSSIPED:
                continue
            if node.flags & _FAILING:
                failing.append(node)
            elif node.link is not None:
                others.append(node)
        random.shuffle(failing)
        random.shuffle(others)
        return [GossipEntry(n.id, n.ping_sent, n.pong_received, n.ip, n.port,
                            messages.flags_to_wire(n.flags), n.bus_port)
                for n in (failing + others)[:wanted]]

    def send_ping(self, node: ClusterNode, msg_type: int = messages.PING) -> None:
        """PING (or MEET) ``node`` over our link to it."""
        if node.link is None:
            return
        if msg_type == messages.PING and not node.ping_sent:
            node.ping_sent = self.now_ms()
        node.link.send(self.gossip_message(msg_type))

    def ping_all(self) -> None:
        """PING every linked node: our header flags changed (LEAVING)."""
        for node in list(self.cluster.nodes.values()):
            if node is not self.cluster.myself and FLAG_HANDSHAKE not in node.flags:
                self.send_ping(node)

    def process(self, link: BusLinkLike, msg: Message) -> ClusterNode | None:
        """PING, PONG, MEET or FAIL (clusterProcessPacket's membership part).

        Returns the sender's node when the sender is known (and out of its
        handshake), for the job messages' handlers; None otherwise.
        """
        cluster = self.cluster
        sender = cluster.nodes.get(msg.sender)
        if sender is not None and FLAG_HANDSHAKE in sender.flags:
            sender = None
        if msg.type == messages.FAIL:
            if sender is not None:
                self._fail_received(msg.node_id)
            return sender
        if msg.type not in messages.GOSSIP_TYPES:
            return sender
        now = self.now_ms()
        if msg.sender == cluster.myself.id:
            # Ourselves (a CLUSTER MEET of our own address, or a forgery):
            # answer, drop a placeholder that led here, believe nothing.
            if msg.type in (messages.PING, messages.MEET):
                link.send(self.gossip_message(messages.PONG))
            if link.node is not None and FLAG_HANDSHAKE in link.node.flags:
                self.found_at(cluster.myself.id, link.node.ip, link.node.port)
                cluster.remove_node(link.node)
            return None
        # The sender's address: the one it announces (cluster-announce-ip:
        # behind address translation the link's peer address is not one we
        # can reach it at), else where its link comes from.
        announced = _announced_ip(msg.ip)
        sender_ip = announced or link.peer_ip
        if msg.type in (messages.PING, messages.MEET):
            self._learn_own_ip(link, msg)
            if sender is None and msg.type == messages.MEET:
                # A new node met us: handshake with it (our cron connects).
                # Its gossip is not taken: a stranger does not tell us whom
                # to connect to (as the original).
                self.start_handshake(sender_ip, msg.port, meet=False, bus_port=msg.bus_port)
            link.send(self.gossip_message(messages.PONG))

        target = link.node
        if target is not None and target.link is link:
            if FLAG_HANDSHAKE in target.flags:
                if sender is not None:
                    # We met a node we already know under another address
                    # (a restart elsewhere; or its announced address, met
                    # by the address discovery found: see discovery.py).
                    self.found_at(sender.id, target.ip, target.port)
                    if announced:
                        self.update_address(sender, sender_ip, msg.port, msg.bus_port)
                    else:
                        self.update_address(sender, target.ip, target.port, target.bus_port)
                    cluster.remove_node(target)
                    return None
                if msg.sender in cluster.nodes:
                    cluster.remove_node(target)  # a duplicate
                    return None
                cluster.remove_node(target, keep_link=True)
                cluster.forgotten.discard(msg.sender)  # met again after a FORGET
                self.found_at(msg.sender, target.ip, target.port)
                target.id = msg.sender
                target.flags.discard(FLAG_HANDSHAKE)
                if announced and (sender_ip, msg.port, msg.bus_port) != (
                        target.ip, target.port, target.bus_port):
                    # It announces another address: peers reach it there
                    # (the next cron connects; this link is closed).
                    target.ip, target.port, target.bus_port = sender_ip, msg.port, msg.bus_port
                    target.link = None
                    link.close()
                cluster.nodes[target.id] = target
                sender = target
                log.info("Handshake with node %s (%s:%d) completed", target.id, target.ip,
                         target.port)
                cluster.save_later()
            elif target.id != msg.sender:
                # Somebody else answers at that address now: forget the address.
                log.warning("PONG from %s on the link to %s: marking it noaddr", msg.sender,
                            target.id)
                target.flags.add(FLAG_NOADDR)
                target.ip, target.port = "", 0
                target.link = None
                link.close()
                cluster.save_later()
                return None

        if sender is not None and msg.type == messages.PING:
            self.update_address(sender, sender_ip, msg.port, msg.bus_port, via=link)

        if target is not None and target is sender and msg.type == messages.PONG:
            target.pong_received = now
            target.ping_sent = 0
            self.clear_failure(target)
            if self.on_pong is not None:
                self.on_pong(target.id)

        if sender is not None:
            leaving = bool(msg.flags & messages.WIRE_FLAGS[FLAG_LEAVING])
            if leaving != (FLAG_LEAVING in sender.flags):
                if leaving:
                    sender.flags.add(FLAG_LEAVING)
                else:
                    sender.flags.discard(FLAG_LEAVING)
                cluster.save_later()
            self.process_gossip(sender, msg.gossip)
        return sender

    def found_at(self, node_id: str, ip: str, port: int) -> None:
        if self.on_found is not None:
            self.on_found(node_id, ip, port)

    def _learn_own_ip(self, link: BusLinkLike, msg: Message) -> None:
        me = self.cluster.myself
        if msg.type == messages.MEET and not me.ip and link.local_ip:
            me.ip = link.local_ip
            log.info("IP address for this node updated to %s", me.ip)
            self.cluster.save_later()

    def update_address(self, node: ClusterNode, ip: str, port: int, bus_port: int = 0,
                       via: BusLinkLike | None = None) -> bool:
        """nodeUpdateAddressIfNeeded: a node seen at a new ip:port (or
        announcing a new bus port) is reconnected there."""
        if node is self.cluster.myself or (via is not None and via is node.link):
            return False
        if not ip or (node.ip == ip and node.port == port and node.bus_port == bus_port):
            return False
        log.info("Address updated for node %s, now %s:%d", node.id, ip, port)
        node.ip, node.port, node.bus_port = ip, port, bus_port
        if node.link is not None:
            link, node.link = node.link, None
            link.close()
        node.flags.discard(FLAG_NOADDR)
        self.cluster.save_later()
        return True

    # -- gossip -------------------------------------------------------------------

    def process_gossip(self, sender: ClusterNode | None, entries: tuple[GossipEntry, ...]) -> None:
        """clusterProcessGossipSection."""
        cluster = self.cluster
        now = self.now_ms()
        for entry in entries:
            node = cluster.nodes.get(entry.node_id)
            if node is not None:
                if node is cluster.myself or FLAG_HANDSHAKE in node.flags:
                    continue
                if sender is not None:
                    if entry.flags & _FAILING_BITS:
                        node.fail_reports[sender.id] = now
                        self.mark_failing_if_needed(node)
                    elif node.fail_reports.pop(sender.id, None) is not None:
                        log.debug("Node %s reported %s as not failing", sender.id, node.id)
                if (node.flags & _FAILING and node.link is None and entry.ip
                        and not entry.flags & messages.WIRE_FLAGS[FLAG_NOADDR]
                        and (entry.ip != node.ip or entry.port != node.port)):
                    # it may live on at a new address
                    self.meet(entry.ip, entry.port, entry.bus_port)
                continue
            if (entry.flags & messages.WIRE_FLAGS[FLAG_NOADDR] or not entry.ip
                    or not messages.is_node_id(entry.node_id)
                    or self.is_banned(entry.node_id, now)):
                continue
            self.meet(entry.ip, entry.port, entry.bus_port)

    # -- failure detection ----------------------------------------------------------

    def mark_failing_if_needed(self, node: ClusterNode) -> None:
        """PFAIL -> FAIL once a majority agrees (markNodeAsFailingIfNeeded)."""
        if FLAG_PFAIL not in node.flags or FLAG_FAIL in node.flags:
            return
        needed = self.cluster.size // 2 + 1
        if self.valid_fail_reports(node) + 1 < needed:
            return
        log.warning("Marking node %s as failing (quorum reached)", node.id)
        self._set_fail(node)
        me = self.cluster.myself
        self.cluster.broadcast(messages.fail_message(me.id, me.port, self.header_flags(),
                                                     node.id))

    def valid_fail_reports(self, node: ClusterNode) -> int:
        """Reports younger than twice the node timeout (older ones are dropped)."""
        oldest = self.now_ms() - FAIL_REPORT_VALIDITY_MULT * self.node_timeout()
        reports = node.fail_reports
        for reporter in [r for r, when in reports.items() if when < oldest]:
            del reports[reporter]
        return len(reports)

    def _fail_received(self, node_id: str) -> None:
        node = self.cluster.nodes.get(node_id)
        if node is None or node is self.cluster.myself or FLAG_FAIL in node.flags:
            return
        log.info("FAIL message received about %s", node_id)
        self._set_fail(node)

    def _set_fail(self, node: ClusterNode) -> None:
        node.flags.discard(FLAG_PFAIL)
        node.flags.add(FLAG_FAIL)
        node.fail_time = self.now_ms()
        self.cluster.save_later()

    def clear_failure(self, node: ClusterNode) -> None:
        """A PONG from ``node``: it is reachable again, whatever we thought."""
        flagged = False
        if FLAG_PFAIL in node.flags:
            node.flags.discard(FLAG_PFAIL)
            self.cluster.save_later()
            flagged = True
        if FLAG_FAIL in node.flags:
            log.info("Clear FAIL state for node %s: it is reachable again", node.id)
            node.flags.discard(FLAG_FAIL)
            self.cluster.save_later()
            flagged = True
        if flagged and self.on_node_back is not None:
            self.on_node_back(node.id)

    # -- FORGET -------------------------------------------------------------------

    def forget(self, node: ClusterNode) -> None:
        self.cluster.banned[node.id] = self.now_ms() + FORGET_BAN_MS
        self.cluster.forgotten.add(node.id)
        self.cluster.remove_node(node)
        self.cluster.save()

    def is_banned(self, node_id: str, now: int) -> bool:
        banned = self.cluster.banned
        until = banned.get(node_id)
        if until is None:
            return False
        if until <= now:
            del banned[node_id]
            return False
        return True

    # -- the cron -------------------------------------------------------------------

    def cron(self) -> list[ClusterNode]:
        """Timeouts, pings and PFAIL (clusterCron, every 100 ms).

        Returns the nodes that need a link: the bus connects them.
        """
        cluster = self.cluster
        now = self.now_ms()
        timeout = self.node_timeout()
        handshake_timeout = self._handshake_timeout_ms()
        self._cron_runs += 1
        to_connect = []
        for node in list(cluster.nodes.values()):
            if node is cluster.myself or FLAG_NOADDR in node.flags:
                continue
            if FLAG_HANDSHAKE in node.flags and now - node.ctime > handshake_timeout:
                log.info("Handshake with %s:%d timed out", node.ip, node.port)
                cluster.remove_node(node)
                continue
            if node.link is None:
                to_connect.append(node)

        # Every 10th run, ping the node with the oldest PONG among 5 samples.
        if self._cron_runs % 10 == 0:
            candidates = [n for n in cluster.nodes.values()
                          if n.link is not None and not n.ping_sent
                          and not n.flags & (_NOT_GOSSIPED | {FLAG_MYSELF})]
            sample = random.sample(candidates, min(5, len(candidates)))
            if sample:
                self.send_ping(min(sample, key=lambda n: n.pong_received))

        for node in list(cluster.nodes.values()):
            if node.flags & _NOT_PINGED or node.id not in cluster.nodes:
                continue
            link = node.link
            if (link is not None and now - link.ctime > timeout and node.ping_sent
                    and now - node.ping_sent > timeout // 2):
                # The link may be stuck: drop it, the next run reconnects.
                node.link = None
                link.close()
                continue
            if link is not None and not node.ping_sent and now - node.pong_received > timeout // 2:
                self.send_ping(node)
                continue
            if node.ping_sent and now - node.ping_sent > timeout and not node.flags & _FAILING:
                log.info("*** NODE %s possibly failing", node.id)
                node.flags.add(FLAG_PFAIL)
        return to_connect


def _announced_ip(text: str) -> str:
    """A sender's announced IP (header ``myip``), or "" if none or not an IP."""
    if not text:
        return ""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return ""
    return text


_FAILING = frozenset((FLAG_PFAIL, FLAG_FAIL))
_FAILING_BITS = messages.WIRE_FLAGS[FLAG_PFAIL] | messages.WIRE_FLAGS[FLAG_FAIL]
_NOT_GOSSIPED = frozenset((FLAG_MYSELF, FLAG_HANDSHAKE, FLAG_NOADDR))
_NOT_PINGED = frozenset((FLAG_MYSELF, FLAG_HANDSHAKE, FLAG_NOADDR))
