"""Membership with real nodes: discovery, FORGET, RESET, LEAVING, failures,
nodes.conf.  Each node is a real ``disque-server`` process on loopback."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.cluster import (
    TEST_NODE_TIMEOUT_MS,
    bus_free_port,
    cluster_info,
    cluster_view,
    flags_of,
    hello_priorities,
    meet,
    node_id,
    wait_joined,
)
from tests.support.process import DisqueProcess, wait_for


def info_field(node: DisqueProcess, field: str) -> int:
    return int(cluster_info(node)[field])


def test_five_nodes_joined_in_a_chain_discover_each_other(make_cluster) -> None:
    nodes = make_cluster(5, chain=True)  # A-B, B-C, C-D, D-E: the rest is gossip
    ids = {node_id(n) for n in nodes}
    for node in nodes:
        hello = node.client().execute_command("HELLO")
        assert hello[0] == 1 and hello[1].decode() == node_id(node)
        entries = {e[0].decode(): (e[1], int(e[2]), int(e[3])) for e in hello[2:]}
        assert set(entries) == ids
        assert {prio for _ip, _port, prio in entries.values()} == {1}
        assert {port for _ip, port, _prio in entries.values()} == {n.port for n in nodes}
        assert info_field(node, "cluster_known_nodes") == 5
        assert info_field(node, "cluster_size") == 5
        assert info_field(node, "cluster_reachable_nodes") == 4
        assert node.client().info()["cluster_reachable_nodes"] == 4
        assert info_field(node, "cluster_stats_messages_received") > 0


def test_nodes_conf_lists_the_peers_and_survives_sigkill(make_cluster) -> None:
    a, b, c = make_cluster(3)
    ids = {node_id(n) for n in (a, b, c)}
    saved = {line.split()[0] for line in (a.workdir / "nodes.conf").read_text().splitlines()}
    assert saved == ids
    my_id = node_id(c)
    c.kill()
    c.start(port=c.port)
    # Same ID, same peers, links back without any CLUSTER MEET.
    assert node_id(c) == my_id
    wait_joined([a, b, c])


def test_killed_node_is_flagged_failing_then_cleared_on_restart(make_cluster) -> None:
    a, b, c = make_cluster(3)
    dead = node_id(c)
    c.kill()
    killed = time.monotonic()
    seen: dict[str, float] = {}

    def failing_everywhere() -> bool:
        # One read per node serves both the record and the answer: a second
        # read could see FAIL that the first one (and so `seen`) missed.
        views = [flags_of(node, dead) or set() for node in (a, b)]
        for flags in views:
            for flag in flags & {"fail?", "fail"}:
                seen.setdefault(flag, time.monotonic() - killed)
        return all("fail" in flags for flags in views)

    wait_for(failing_everywhere, timeout=10 * TEST_NODE_TIMEOUT_MS / 1000, interval=0.05,
             message=lambda: f"FAIL everywhere, seen {seen}")
    # PFAIL comes after the node timeout, FAIL once the two survivors agree.
    assert seen["fail"] >= TEST_NODE_TIMEOUT_MS / 1000 * 0.9
    for node in (a, b):
        assert hello_priorities(node)[dead] == 100
        assert info_field(node, "cluster_reachable_nodes") == 1
    c.start(port=c.port)
    assert node_id(c) == dead
    wait_joined([a, b, c])


def test_forget_bans_gossip_from_re_adding_the_node(make_cluster) -> None:
    a, b, c = make_cluster(3)
    forgotten = node_id(c)
    assert a.client().execute_command("CLUSTER", "FORGET", forgotten) == b"OK"
    assert forgotten not in cluster_view(a)
    # b keeps gossiping about c to a; wait for plenty of that traffic.
    start = info_field(a, "cluster_stats_messages_received")
    wait_for(lambda: info_field(a, "cluster_stats_messages_received") >= start + 25,
             timeout=30, message="gossip traffic to a")
    assert forgotten not in cluster_view(a)
    assert forgotten in cluster_view(b)  # FORGET is local
    # The ban is on gossip only: MEET brings it back.
    meet(a, c)
    wait_joined([a, b, c])


def test_reset_hard_forgets_peers_and_takes_a_new_id(make_cluster) -> None:
    a, b = make_cluster(2)
    old_id = node_id(b)
    assert b.client().execute_command("CLUSTER", "RESET", "HARD") == b"OK"
    assert node_id(b) != old_id
    assert set(cluster_view(b)) == {node_id(b)}
    a_id = node_id(a)
    assert b.client().execute_command("CLUSTER", "RESET", "SOFT") == b"OK"
    assert set(cluster_view(b)) == {node_id(b)}
    assert a_id not in (b.workdir / "nodes.conf").read_text()


def test_leaving_propagates_to_every_node_and_back(make_cluster) -> None:
    a, b, c = make_cluster(3)
    leaving = node_id(a)
    assert a.client().execute_command("CLUSTER", "LEAVING", "yes") == b"OK"
    for node in (b, c):
        wait_for(lambda node=node: "leaving" in flags_of(node, leaving), timeout=5,
                 message="the leaving flag to spread")
        assert hello_priorities(node)[leaving] == 100
        assert info_field(node, "cluster_reachable_nodes") == 1
    assert "myself,leaving" in (a.workdir / "nodes.conf").read_text()
    assert a.client().execute_command("CLUSTER", "LEAVING", "no") == b"OK"
    for node in (b, c):
        wait_for(lambda node=node: "leaving" not in flags_of(node, leaving), timeout=5,
                 message="the leaving flag to clear")


def test_meet_of_an_address_nobody_answers_times_out(make_cluster, unused_port) -> None:
    (a,) = make_cluster(1, node_timeout=1000)
    assert a.client().execute_command("CLUSTER", "MEET", "127.0.0.1", unused_port) == b"OK"
    # The same pending handshake again: a silent OK, no second placeholder.
    assert a.client().execute_command("CLUSTER", "MEET", "127.0.0.1", unused_port) == b"OK"
    handshakes = [v for v in cluster_view(a).values() if "handshake" in v["flags"]]
    assert len(handshakes) == 1
    wait_for(lambda: len(cluster_view(a)) == 1, timeout=10,
             message="the handshake to time out")


@pytest.mark.parametrize("content, why", [
    ("garbage\n", "corrupted cluster config"),
    ("{id} 127.0.0.1:7711 myself 0 0\n", "corrupted cluster config"),           # 5 fields
    ("{id} 127.0.0.1:7711 noflags 0 0 connected\n", "exactly one 'myself'"),
    ("{id} 127.0.0.1:7711 myself,bogus 0 0 connected\n", "corrupted cluster config"),
    ("{id} 127.0.0.1:7711 myself 0 0 connected\n{id} 127.0.0.1:7712 noflags 0 0 connected\n",
     "unique IDs"),
])
def test_corrupt_nodes_conf_stops_the_node_with_a_clear_error(server_factory, content: str,
                                                              why: str) -> None:
    node = server_factory()
    nodes_conf = node.workdir / "nodes.conf"
    my_id = node_id(node)
    node.stop()
    nodes_conf.write_text(content.format(id=my_id))
    with pytest.raises(AssertionError, match=why):
        node.start(port=node.port, timeout=10)
    assert not node.alive()
    assert nodes_conf.read_text() == content.format(id=my_id)  # never silently replaced


def test_a_node_back_on_another_port_is_followed(make_cluster) -> None:
    a, b = make_cluster(2)
    moved = node_id(b)
    b.kill()
    b.start(port=bus_free_port())  # same nodes.conf (same ID), new address
    assert node_id(b) == moved
    wait_for(lambda: cluster_view(a)[moved]["addr"] == f"127.0.0.1:{b.port}", timeout=15,
             message="a to learn b's new address")
    wait_joined([a, b])


def test_another_node_at_a_known_address_makes_it_noaddr(make_cluster, server_factory) -> None:
    a, b = make_cluster(2)
    replaced = node_id(b)
    port = b.port
    b.kill()
    # A stranger (new ID) now answers at b's address: a stops using that address.
    stranger = server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS),
                              name="stranger", port=port)
    assert node_id(stranger) != replaced
    wait_for(lambda: "noaddr" in flags_of(a, replaced), timeout=15,
             message=lambda: f"noaddr on {replaced}: {cluster_view(a)}")
    assert replaced in (a.workdir / "nodes.conf").read_text()
    assert hello_priorities(a)[replaced] == 5  # no link, and never linked again


def test_a_busy_bus_port_is_a_clear_start_up_error(server_factory) -> None:
    port = bus_free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 10000))
        taken.listen()
        with pytest.raises(AssertionError, match="Could not create the cluster bus TCP "
                                                 f"listening socket 127.0.0.1:{port + 10000}"):
            server_factory(port=port, timeout=10)
