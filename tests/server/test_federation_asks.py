"""The asks a node remembers for federation's push (disque/federation.py),
on a manual clock: renewed in place, withdrawn by NEEDJOBS(0), expired
after ASK_TTL_MS, dropped for a node that leaves, and bounded in number."""

from __future__ import annotations

from disque import federation
from disque.cluster import messages
from disque.cluster.node import FLAG_LEAVING, ClusterNode
from tests.server.statekit import Node


def _needjobs(peer: ClusterNode, queue: bytes, count: int) -> messages.Message:
    return messages.decode(messages.queue_message(messages.NEEDJOBS, peer.id, peer.port, 0,
                                                  queue, count))


def _node_with_peers(*names: str) -> tuple[Node, list[ClusterNode]]:
    node = Node()
    peers = []
    for i, name in enumerate(names):
        peer = ClusterNode(name * 40, "127.0.0.1", 7712 + i)
        peer.link = object()  # type: ignore[assignment]  # linked: never written here
        node.state.cluster.nodes[peer.id] = peer
        peers.append(peer)
    return node, peers


def test_asks_are_remembered_in_order_renewed_in_place_and_withdrawn() -> None:
    node, (b, c) = _node_with_peers("b", "c")
    asks = node.state.queues.asks
    federation.receive_needjobs(node.state, b, _needjobs(b, b"q", 1))
    federation.receive_needjobs(node.state, c, _needjobs(c, b"q", 5))
    node.clock.advance(1000)
    federation.receive_needjobs(node.state, b, _needjobs(b, b"q", 20))
    assert list(asks[b"q"]) == [b.id, c.id]  # b renewed, still first
    assert asks[b"q"][b.id].count == 20
    assert asks[b"q"][b.id].until == node.clock.now_ms() + federation.ASK_TTL_MS
    # A renewal asking for fewer keeps the larger count while unanswered.
    federation.receive_needjobs(node.state, b, _needjobs(b, b"q", 1))
    assert asks[b"q"][b.id].count == 20
    assert federation.waiting_asks(node.state) == 2
    federation.receive_needjobs(node.state, b, _needjobs(b, b"q", 0))  # withdrawn
    assert list(asks[b"q"]) == [c.id]
    federation.receive_needjobs(node.state, c, _needjobs(c, b"q", 0))
    assert b"q" not in asks


def test_asks_expire_and_those_of_leaving_nodes_go() -> None:
    node, (b, c) = _node_with_peers("b", "c")
    federation.receive_needjobs(node.state, b, _needjobs(b, b"q", 1))
    federation.receive_needjobs(node.state, c, _needjobs(c, b"r", 1))
    node.clock.advance(federation.ASK_TTL_MS // 2)
    federation.receive_needjobs(node.state, c, _needjobs(c, b"r", 1))  # renewed
    c.flags.add(FLAG_LEAVING)
    node.clock.advance(federation.ASK_TTL_MS // 2 + 1)
    federation.expire_asks(node.state, node.clock.now_ms())
    # b's ask expired; c's was renewed but c is leaving: no node is sent jobs.
    assert node.state.queues.asks == {}


def test_the_asks_kept_are_bounded() -> None:
    # The real bound (a compiled module's constant cannot be patched).
    bound = federation.MAX_ASKED_QUEUES
    node, (b,) = _node_with_peers("b")
    for i in range(bound + 2):
        federation.receive_needjobs(node.state, b, _needjobs(b, b"q%d" % i, 1))
    asks = node.state.queues.asks
    assert len(asks) == bound
    assert b"q0" in asks and b"q%d" % (bound - 1) in asks
    assert b"q%d" % bound not in asks and b"q%d" % (bound + 1) not in asks
