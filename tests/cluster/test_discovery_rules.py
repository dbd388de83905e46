"""Discovery's rules without sockets or DNS (disque/cluster/discovery.py):
answers as lists of addresses, a hand-moved clock; and the announced
address on the wire.  The DNS tests with real nodes are in
test_discovery_dns.py."""

from __future__ import annotations

from disque.cluster import messages as m
from disque.cluster.discovery import Discovery, parse_target
from disque.cluster.membership import Membership
from disque.cluster.node import ClusterNode
from disque.cluster.state import ClusterState

PORT = 7711
FORGET_S = 60


def setup(n: int) -> tuple[Discovery, list[ClusterNode], list[int]]:
    """Myself at 10.0.0.1 plus n-1 peers at 10.0.0.2..., all on PORT."""
    clock = [1_000_000]
    me = ClusterNode("0" * 40, "10.0.0.1", PORT)
    cluster = ClusterState(me, None)
    peers = []
    for i in range(2, n + 1):
        node = ClusterNode(f"{i:040x}", f"10.0.0.{i}", PORT)
        cluster.nodes[node.id] = node
        peers.append(node)
    membership = Membership(cluster, lambda: clock[0], lambda: 2000)
    return Discovery(membership, "disque", PORT, lambda: 5, lambda: FORGET_S), peers, clock


def handshakes(discovery: Discovery) -> set[tuple[str, int]]:
    return set(discovery.membership.cluster.handshakes)


def test_unknown_addresses_are_met_known_ones_and_myself_are_not() -> None:
    discovery, _peers, _clock = setup(3)
    discovery.apply(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"])
    assert handshakes(discovery) == {("10.0.0.4", PORT)}
    discovery.apply(["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"])
    assert handshakes(discovery) == {("10.0.0.4", PORT)}  # one handshake, not two


def test_a_node_gone_from_the_answer_and_failing_is_forgotten_after_the_forget_time() -> None:
    discovery, peers, clock = setup(4)
    gone = peers[-1]
    gone.flags.add("fail?")
    answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    discovery.apply(answer)
    clock[0] += FORGET_S * 1000 - 1
    discovery.apply(answer)
    assert gone.id in discovery.membership.cluster.nodes
    clock[0] += 1
    discovery.apply(answer)
    cluster = discovery.membership.cluster
    assert gone.id not in cluster.nodes
    assert gone.id in cluster.forgotten and gone.id in cluster.banned


def test_a_healthy_node_is_not_forgotten_when_its_address_is_missing() -> None:
    discovery, peers, clock = setup(3)
    discovery.apply(["10.0.0.1", "10.0.0.2"])
    clock[0] += 10 * FORGET_S * 1000
    discovery.apply(["10.0.0.1", "10.0.0.2"])
    assert peers[-1].id in discovery.membership.cluster.nodes


def test_a_restart_at_a_new_address_stops_the_clock_while_the_address_is_unidentified() -> None:
    """The restarting node's new address answers nothing (its AOF loads):
    nobody is forgotten while it is in the answer unidentified."""
    discovery, peers, clock = setup(3)
    restarting = peers[-1]
    restarting.flags.add("fail")
    answer = ["10.0.0.1", "10.0.0.2", "10.0.0.9"]
    for _ in range(20):
        discovery.apply(answer)
        clock[0] += FORGET_S * 1000
    assert restarting.id in discovery.membership.cluster.nodes
    assert ("10.0.0.9", PORT) in handshakes(discovery)
    # Once its handshake finds it, the address is identified: it is there.
    discovery.found_at(restarting.id, "10.0.0.9", PORT)
    discovery.apply(answer)
    clock[0] += 2 * FORGET_S * 1000
    discovery.apply(answer)
    assert restarting.id in discovery.membership.cluster.nodes


def test_a_restart_at_the_same_address_is_not_forgotten_and_is_met_again() -> None:
    discovery, peers, clock = setup(3)
    restarting = peers[-1]
    restarting.flags.add("fail")
    answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    for _ in range(5):
        discovery.apply(answer)
        clock[0] += FORGET_S * 1000
    assert restarting.id in discovery.membership.cluster.nodes
    assert ("10.0.0.3", PORT) in handshakes(discovery)  # it may be someone else now


def test_an_empty_or_failed_resolution_forgets_nobody_and_resets_the_clocks() -> None:
    discovery, peers, clock = setup(3)
    gone = peers[-1]
    gone.flags.add("fail")
    discovery.apply(["10.0.0.1", "10.0.0.2"])
    clock[0] += FORGET_S * 1000 - 1000
    discovery.apply([])
    clock[0] += 2000
    discovery.apply(["10.0.0.1", "10.0.0.2"])
    assert gone.id in discovery.membership.cluster.nodes  # the clock started again
    clock[0] += FORGET_S * 1000
    discovery.apply(["10.0.0.1", "10.0.0.2"])
    assert gone.id not in discovery.membership.cluster.nodes


def test_an_address_found_for_a_node_announcing_another_counts_as_its_own() -> None:
    """With cluster-announce-ip a node is in the table at its announced
    address; the discovered one is known by the handshake that found it."""
    discovery, peers, clock = setup(2)
    peer = peers[0]
    peer.ip = "192.0.2.10"  # announced
    discovery.found_at(peer.id, "10.0.0.2", PORT)
    answer = ["10.0.0.1", "10.0.0.2"]
    discovery.apply(answer)
    assert handshakes(discovery) == set()
    peer.flags.add("fail")
    clock[0] += 10 * FORGET_S * 1000
    discovery.apply(answer)
    assert peer.id in discovery.membership.cluster.nodes


def test_a_healthy_node_at_a_dead_nodes_old_address_wins_it() -> None:
    discovery, peers, clock = setup(3)
    dead, other = peers[-1], peers[0]
    dead.flags.add("fail")
    discovery.found_at(other.id, "10.0.0.3", PORT)  # the IP went to another pod
    answer = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    discovery.apply(answer)
    clock[0] += FORGET_S * 1000
    discovery.apply(answer)
    assert dead.id not in discovery.membership.cluster.nodes


def test_parse_target() -> None:
    assert parse_target("disque", 7711) == ("disque", 7711)
    assert parse_target("disque.ns.svc:7000", 7711) == ("disque.ns.svc", 7000)
    assert parse_target("[::1]:7000", 7711) == ("::1", 7000)
    assert parse_target("::1", 7711) == ("::1", 7711)


def test_announced_address_on_the_wire() -> None:
    entry = m.GossipEntry("1" * 40, 0, 0, "10.0.0.2", 7711, 0, 31000)
    frame = m.gossip_message(m.PING, "2" * 40, 30001, 0, [entry], "192.0.2.7", 31001)
    msg = m.decode(frame)
    assert (msg.ip, msg.port, msg.bus_port) == ("192.0.2.7", 30001, 31001)
    assert msg.gossip == (entry,)
    assert frame[102:136] == bytes(34)  # the cluster secret's bytes stay free
    plain = m.gossip_message(m.PING, "2" * 40, 7711, 0, [])
    assert plain[56:136] == bytes(80)  # as the original: myip and reserved zeroed
    msg = m.decode(plain)
    assert (msg.ip, msg.bus_port) == ("", 0)


def test_nodes_conf_keeps_an_announced_bus_port(tmp_path) -> None:
    from disque.cluster.nodes_file import load_nodes_file, node_line, save_nodes_file

    me = ClusterNode("a" * 40, "192.0.2.7", 30001, {"myself"}, bus_port=31001)
    peer = ClusterNode("b" * 40, "10.0.0.2", 7711)
    assert node_line(me).split()[1] == "192.0.2.7:30001@31001"
    assert node_line(peer).split()[1] == "10.0.0.2:7711"  # as the original writes it
    path = str(tmp_path / "nodes.conf")
    save_nodes_file(path, [me, peer])
    loaded = {n.id: (n.ip, n.port, n.bus_port) for n in load_nodes_file(path) or []}
    assert loaded == {me.id: ("192.0.2.7", 30001, 31001), peer.id: ("10.0.0.2", 7711, 0)}
