"""Which nodes a query talks to: the ``nodes`` seeds plus the rest of the cluster.

The ``nodes`` option lists *seeds*. Every Disque node answers ``HELLO``
with the whole node table and a priority per node (1 reachable, 10 failing
``fail?``, 100 failed or leaving), so one reachable seed is enough to find
the others: the source fetches from all of them and the sink spreads its
partitions over all of them.

A node is known by its ID, not its address: a seed given as a host name
(``disque1:7711``) and the IP the node table lists for it are one node, and
must be fetched from (and counted) once.

:class:`NodeSet` is the driver's long-lived view (one pinned client per
node, refreshed now and then); :func:`discover` is a one-shot look for the
sink's driver.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from disque.exceptions import AuthError, ConnectionFailed, DisqueError

from .options import OptionError

if TYPE_CHECKING:
    from disque.client import Client

    from .options import ConnectionConfig, SourceConfig

__all__ = ["NodeView", "NodeSet", "check_any_reachable", "check_reachable", "discover",
           "USABLE_PRIORITY"]

log = logging.getLogger("spark_connector.topology")

#: HELLO priorities below this are nodes to use; 100 is failed or leaving.
#: 10 (``fail?``) is kept: the flag may be a false alarm on a busy machine,
#: and a node that really is down fails fast on its own.
USABLE_PRIORITY = 100
#: A seed that does not answer while others do: HELLO's "failing" priority.
SILENT_PRIORITY = 10


@dataclass(frozen=True)
class NodeView:
    """One node as the connector sees it."""

    address: str            # host:port to connect to (the seed's form when it is a seed)
    node_id: str | None     # None: a seed that never answered
    priority: int           # HELLO priority (1 best); a seed never reached counts as 1


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def discover(connection: ConnectionConfig) -> list[NodeView]:
    """The usable nodes, from the first seed that answers HELLO; best first.

    Seeds are kept under their own address; HELLO adds the nodes the seeds
    do not cover. Failed and leaving nodes (priority 100) are left out. When
    no seed answers, the seeds alone (the caller decides what that means).
    """
    if not connection.discover_nodes:
        return [NodeView(seed, None, 1) for seed in connection.nodes]
    client = connection.client(client_name="spark-disque-discover", reconnect_timeout_s=0)
    try:
        hello = client.connect()
        connected = client.address
    except (ConnectionFailed, DisqueError) as exc:
        log.info("node discovery: no seed answered HELLO (%s); using the seeds", exc)
        return [NodeView(seed, None, 1) for seed in connection.nodes]
    finally:
        client.close()
    views: dict[str, NodeView] = {}
    by_address = {_address(n.host, n.port): n for n in hello.nodes}
    unmatched = []
    for seed in connection.nodes:
        info = by_address.get(seed)
        if seed == connected:
            views[hello.node_id] = NodeView(seed, hello.node_id, _priority(hello, hello.node_id))
        elif info is not None:
            views.setdefault(info.id, NodeView(seed, info.id, info.priority))
        else:
            unmatched.append(seed)
    # A seed HELLO does not list under that address: a host name for a node
    # listed by IP, or a node outside this cluster. Ask it who it is.
    extra: list[NodeView] = []
    for seed in unmatched:
        view = _probe(connection, seed)
        if view.node_id is None or view.node_id not in {i.id for i in hello.nodes}:
            extra.append(view)  # not in the cluster (or silent): still the user's seed
        else:
            views.setdefault(view.node_id, view)
    for info in hello.nodes:
        if info.id not in views and info.host and info.port > 0:
            views[info.id] = NodeView(_address(info.host, info.port), info.id, info.priority)
    for view in extra:
        if view.node_id is None or view.node_id not in views:
            views[view.node_id or view.address] = view
    usable = [v for v in views.values() if v.priority < USABLE_PRIORITY]
    return sorted(usable, key=lambda v: (v.priority, v.node_id or ""))


def _probe(connection: ConnectionConfig, seed: str) -> NodeView:
    """One seed's own view of itself (node ID None: it did not answer)."""
    client = connection.client(node=seed, client_name="spark-disque-discover",
                               reconnect_timeout_s=0)
    try:
        hello = client.connect()
    except (ConnectionFailed, DisqueError):
        # Kept, as a fallback only (the priority of a failing node): the
        # node may be restarting, and the tasks retry their nodes anyway.
        return NodeView(seed, None, SILENT_PRIORITY)
    finally:
        client.close()
    return NodeView(seed, hello.node_id, _priority(hello, hello.node_id))


def _priority(hello: object, node_id: str) -> int:
    for info in getattr(hello, "nodes", ()):
        if info.id == node_id:
            return int(info.priority)
    return 1


class NodeSet:
    """The driver's nodes: one client per node, pinned to it, refreshed from HELLO.

    A client of the library moves to another node when its own stops
    answering (what a producer wants); the driver must not, or it would
    count another node's queue twice. So every reply is checked against the
    ID of the node it was meant for, and a client that moved is closed and
    its node counted as down until the next refresh.
    """

    def __init__(self, connection: ConnectionConfig, *, refresh_s: float = 5.0,
                 client_name: str = "spark-disque-driver") -> None:
        self.connection = connection
        self.discover_nodes = connection.discover_nodes
        self.refresh_s = refresh_s
        self.client_name = client_name
        #: address -> node ID (None until the node answered).
        self.ids: dict[str, str | None] = {seed: None for seed in connection.nodes}
        self.clients: dict[str, Client] = {}
        #: address -> False while the node does not answer.
        self.up: dict[str, bool] = {}
        self._refreshed_at = float("-inf")

    # ------------------------------------------------------------- clients

    def client(self, address: str) -> Client:
        client = self.clients.get(address)
        if client is None:
            # reconnect_timeout 0: one try. A node that is down costs one
            # refused connect per refresh, not reconnectTimeout per batch.
            client = self.clients[address] = self.connection.client(
                node=address, client_name=self.client_name, reconnect_timeout_s=0)
        return client

    def check(self, address: str, client: Client) -> bool:
        """Did ``client`` answer from the node at ``address``? Learn its ID if new."""
        node_id = client.node_id
        known = self.ids.get(address)
        if known is None and node_id is not None:
            if node_id in {i for a, i in self.ids.items() if a != address}:
                # Another address of a node already in the set: drop this one.
                self._forget(address)
                return False
            self.ids[address] = known = node_id
        if node_id is None or node_id != known:
            self.mark_down(address)
            return False
        self.up[address] = True
        return True

    def mark_down(self, address: str) -> None:
        if self.up.get(address, True):
            log.warning("node %s does not answer; reading from the other nodes", address)
        self.up[address] = False
        client = self.clients.pop(address, None)
        if client is not None:
            client.close()

    def _forget(self, address: str) -> None:
        self.ids.pop(address, None)
        self.up.pop(address, None)
        client = self.clients.pop(address, None)
        if client is not None:
            client.close()

    # -------------------------------------------------------------- refresh

    def live(self) -> list[str]:
        """Addresses to use now: every known node that answered, refreshed if due."""
        if time.monotonic() - self._refreshed_at >= self.refresh_s:
            self.refresh()
        return [a for a in self.ids if self.up.get(a, False)]

    def refresh(self) -> None:
        """Ping every known node and add the nodes HELLO lists."""
        self._refreshed_at = time.monotonic()
        for address in list(self.ids):
            client = self.client(address)
            try:
                hello = client.hello()
            except (ConnectionFailed, DisqueError):
                self.mark_down(address)
                continue
            if not self.check(address, client) or not self.discover_nodes:
                continue
            known_ids = set(self.ids.values())
            for info in hello.nodes:
                if info.priority >= USABLE_PRIORITY:
                    if info.id in known_ids:
                        for addr, nid in self.ids.items():
                            if nid == info.id and self.up.get(addr):
                                log.warning("node %s is failing or leaving", addr)
                                self.mark_down(addr)
                    continue
                if info.id not in known_ids and info.host and info.port > 0:
                    new = _address(info.host, info.port)
                    log.info("discovered node %s (%s) through HELLO", new, info.id[:8])
                    self.ids[new] = None
                    known_ids.add(info.id)
        # Nodes just discovered: connect now, so live() includes them.
        for address, node_id in list(self.ids.items()):
            if node_id is None and address not in self.up:
                client = self.client(address)
                try:
                    client.ping()
                except (ConnectionFailed, DisqueError):
                    self.mark_down(address)
                    continue
                self.check(address, client)

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.clients.clear()


def check_reachable(config: SourceConfig) -> None:
    """Fail the query at its start, naming the option, if a node does not answer.

    Each node is tried for ``reconnectTimeout``, the rule the sink follows
    too: a node that is restarting is waited for, a wrong address fails the
    query once that time has passed.
    """
    connection = config.connection
    for node in connection.nodes:
        _ping(connection, node, f"lists {node}, which cannot be reached")


def check_any_reachable(connection: ConnectionConfig) -> None:
    """The sink's check on the driver: some node of ``nodes`` answers.

    One is enough (the others are fallbacks, and HELLO finds the rest),
    tried for ``reconnectTimeout`` like every node; without it the write
    fails here, with one line naming the option, rather than in every
    task after the same wait.
    """
    nodes = ", ".join(connection.nodes)
    _ping(connection, None, f"lists no node that can be reached ({nodes})")


def _ping(connection: ConnectionConfig, node: str | None, unreachable: str) -> None:
    client = connection.client(node=node, client_name="spark-disque-check")
    where = node or "every node"
    try:
        client.ping()
    except AuthError as exc:
        raise OptionError("user" if connection.user is not None else "password",
                          f"was refused by {client.address or where}: {exc}") from None
    except ConnectionFailed as exc:
        raise OptionError("nodes", f"{unreachable} (tried for "
                          f"{connection.reconnect_timeout_s:g} s, reconnectTimeout): "
                          f"{exc}") from None
    finally:
        client.close()
