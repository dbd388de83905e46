"""Discovery by DNS (``cluster-discovery NAME[:PORT]``): peers from a name.

Every ``cluster-discovery-interval`` seconds the node resolves NAME (the
system resolver, in the event loop's executor: the loop never waits on
DNS), and every address of the answer is a peer at PORT, its bus at
PORT + 10000.  docs/CLUSTER.md, "Discovery by DNS", is the guide; the rules:

* **Meet**: an address of the answer that no healthy node of the table is
  known at (its own address, or the address a handshake found it at) is
  met, unless a handshake with it is under way.  That joins new nodes (a
  scale-up), and finds nodes that came back at a new address (a restart
  elsewhere, every pod rescheduled at once): the handshake's PONG names a
  node we know, whose address is updated.
* **Forget** (a scale-down without CLUSTER FORGET): a node is forgotten by
  this node once, for ``cluster-discovery-forget-time`` seconds in a row,
  all of these held at every resolution:

  1. the answer was not empty (a failed or empty resolution decides
     nothing and stops every clock: a DNS outage forgets no one);
  2. every address of the answer is identified: myself, or a node of the
     table (failing or not) known at it.  An address nobody is known at
     may be a node restarting at a new address while it loads its AOF
     (its bus is not up yet): while one is there, nobody is forgotten;
  3. the node is failing (PFAIL or FAIL) here;
  4. none of its addresses is in the answer.

  A restart keeps the node's name in DNS (at its old address, or at a new
  one that is unidentified until it answers), so it is not forgotten; a
  node removed by a scale-down leaves the answer for good.

Sans-IO at its core: :meth:`Discovery.apply` takes one answer and a clock,
and is tested with lists of addresses; :meth:`Discovery.run` is the loop
around a resolver.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

from .membership import Membership
from .node import FLAG_FAIL, FLAG_HANDSHAKE, FLAG_PFAIL

__all__ = ["Discovery", "parse_target", "resolve"]

log = logging.getLogger("disque.cluster")

#: A resolution that has not answered by then counts as a failed one.
RESOLVE_TIMEOUT_S = 10.0

Address = tuple[str, int]


def parse_target(text: str, default_port: int) -> tuple[str, int]:
    """``NAME[:PORT]`` -> (name, port); an IPv6 literal needs brackets to
    carry a port (``[::1]:7711``)."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if text.count(":") == 1:
        name, _, port = text.partition(":")
        return name, int(port)
    return text, default_port


async def resolve(name: str) -> list[str]:
    """Every address ``name`` resolves to (A and AAAA), or [] on failure."""
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(
            loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S)
    except (OSError, TimeoutError, UnicodeError) as err:
        log.debug("cluster-discovery: resolving %s failed: %s", name, err)
        return []
    return sorted({str(info[4][0]) for info in infos})


class Discovery:
    def __init__(self, membership: Membership, name: str, port: int,
                 interval_s: Callable[[], int], forget_s: Callable[[], int],
                 resolver: Callable[[str], Awaitable[list[str]]] = resolve) -> None:
        self.membership = membership
        self.name = name
        self.port = port
        self.interval_s = interval_s
        self.forget_s = forget_s
        self.resolver = resolver
        #: Addresses a handshake found a node at (node ID), besides the
        #: node's own address: with cluster-announce-ip the answer holds
        #: addresses that are not the ones nodes announce.
        self.found: dict[Address, str] = {}
        #: Node ID -> since when (ms) it has been a candidate to forget.
        self.absent_since: dict[str, int] = {}
        #: Resolutions done, and the last answer.
        self.rounds = 0
        self.answer: list[Address] = []
        self.forgotten_count = 0
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        membership.on_found = self.found_at

    # -- what handshakes tell us ----------------------------------------------

    def found_at(self, node_id: str, ip: str, port: int) -> None:
        """A handshake with ip:port found ``node_id`` there (maybe us)."""
        self.found[(ip, port)] = node_id

    # -- one answer -------------------------------------------------------------

    def apply(self, ips: list[str]) -> None:
        """One resolution's answer (IP addresses): meet, and forget."""
        membership = self.membership
        cluster = membership.cluster
        now = membership.now_ms()
        self.rounds += 1
        answer = {(ip, self.port) for ip in ips}
        self.answer = sorted(answer)
        if not answer:
            if self.absent_since:
                log.info("cluster-discovery: %s resolved to nothing: no node is forgotten "
                         "while it does", self.name)
            self.absent_since.clear()
            return
        # Who is known at each address: failing nodes first, so that a
        # healthy node found at the same address (it took over a dead
        # node's IP) wins it.
        me = cluster.myself
        at: dict[Address, str] = {}
        healthy: set[Address] = set()
        for failing_pass in (True, False):
            for node in cluster.nodes.values():
                if FLAG_HANDSHAKE in node.flags or node is me:
                    continue
                if bool(node.flags & _FAILING) != failing_pass:
                    continue
                addresses = [(node.ip, node.port)]
                addresses += [a for a, nid in self.found.items() if nid == node.id]
                for address in addresses:
                    at[address] = node.id
                    if not failing_pass:
                        healthy.add(address)
        for address, node_id in self.found.items():
            if node_id == me.id:
                at[address] = node_id
                healthy.add(address)
        at[(me.ip, me.port)] = me.id
        healthy.add((me.ip, me.port))
        # Stale entries of found (nodes forgotten, addresses no longer in
        # DNS) go, so that the table cannot grow without end.
        for address in [a for a, nid in self.found.items()
                        if nid not in cluster.nodes or a not in answer]:
            del self.found[address]

        unidentified = False
        for address in sorted(answer):
            if address in cluster.handshakes:
                unidentified = unidentified or address not in at
                continue
            if address not in healthy:
                membership.meet(address[0], address[1])
            if address not in at:
                unidentified = True

        forget_ms = self.forget_s() * 1000
        if unidentified or not forget_ms:
            self.absent_since.clear()
            return
        present = {at[a] for a in answer}
        for node in list(cluster.nodes.values()):
            if node is me or FLAG_HANDSHAKE in node.flags:
                continue
            if not node.flags & _FAILING or node.id in present:
                self.absent_since.pop(node.id, None)
                continue
            since = self.absent_since.setdefault(node.id, now)
            if now - since >= forget_ms:
                log.warning("cluster-discovery: forgetting node %s (%s:%d): failing and out "
                            "of %s's answer for %d s", node.id, node.ip, node.port, self.name,
                            (now - since) // 1000)
                del self.absent_since[node.id]
                self.forgotten_count += 1
                membership.forget(node)
        for node_id in [n for n in self.absent_since if n not in cluster.nodes]:
            del self.absent_since[node_id]

    # -- the loop -----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def run(self) -> None:
        while True:
            try:
                ips = await self.resolver(self.name)
                self.apply(ips)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug: log it, keep discovering
                log.exception("cluster-discovery failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval_s())
            except TimeoutError:
                pass

    def wake(self) -> None:
        """Resolve now rather than at the next interval."""
        self._wake.set()


_FAILING = frozenset((FLAG_PFAIL, FLAG_FAIL))
