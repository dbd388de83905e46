"""Membership rules without sockets: a node table, a hand-moved clock and
links that record what would be sent (the rules are sans-IO; the process
tests in test_membership.py run them over real sockets)."""

from __future__ import annotations

from disque.cluster import messages as m
from disque.cluster.membership import Membership
from disque.cluster.node import ClusterNode
from disque.cluster.state import ClusterState

NODE_TIMEOUT = 2000


class RecordingLink:
    def __init__(self, node: ClusterNode | None = None) -> None:
        self.node = node
        self.ctime = 0
        self.peer_ip = "127.0.0.1"
        self.local_ip = "127.0.0.1"
        self.sent: list[bytes] = []
        self.closed = False

    def send(self, message: bytes) -> None:
        self.sent.append(message)

    def close(self) -> None:
        self.closed = True


def table(n: int) -> tuple[Membership, list[ClusterNode], list[int]]:
    """Myself plus n-1 linked peers; the clock is a one-element list."""
    clock = [1_000_000]
    me = ClusterNode("0" * 40, "127.0.0.1", 7000)
    cluster = ClusterState(me, None)
    peers = []
    for i in range(1, n):
        node = ClusterNode(f"{i:040x}", "127.0.0.1", 7000 + i)
        node.link = RecordingLink(node)
        cluster.nodes[node.id] = node
        peers.append(node)
    return Membership(cluster, lambda: clock[0], lambda: NODE_TIMEOUT), peers, clock


def gossip_from(sender: ClusterNode, about: ClusterNode, failing: bool) -> tuple:
    flags = m.WIRE_FLAGS["fail?"] if failing else 0
    return (m.GossipEntry(about.id, 0, 0, about.ip, about.port, flags),)


def test_pfail_becomes_fail_with_a_majority_of_reports() -> None:
    membership, peers, _clock = table(5)
    dead = peers[0]
    dead.flags.add("fail?")
    membership.process_gossip(peers[1], gossip_from(peers[1], dead, True))
    assert "fail" not in dead.flags            # us + 1 report: 2 of the 3 needed
    membership.process_gossip(peers[2], gossip_from(peers[2], dead, True))
    assert dead.flags >= {"fail"} and "fail?" not in dead.flags
    for peer in peers:  # FAIL went to every linked node
        assert any(m.decode(msg).type == m.FAIL for msg in peer.link.sent)


def test_old_reports_expire_and_a_healthy_report_withdraws_one() -> None:
    membership, peers, clock = table(5)
    dead = peers[0]
    dead.flags.add("fail?")
    membership.process_gossip(peers[1], gossip_from(peers[1], dead, True))
    clock[0] += 2 * NODE_TIMEOUT + 1
    membership.process_gossip(peers[2], gossip_from(peers[2], dead, True))
    assert "fail" not in dead.flags            # the first report expired
    membership.process_gossip(peers[2], gossip_from(peers[2], dead, False))
    assert dead.fail_reports == {}


def test_pong_clears_failure_flags() -> None:
    membership, peers, _clock = table(3)
    node = peers[0]
    node.flags.update({"fail"})
    pong = m.decode(m.gossip_message(m.PONG, node.id, node.port, 0, []))
    membership.process(node.link, pong)
    assert not node.flags & {"fail", "fail?"}


def test_unanswered_ping_sets_pfail_after_the_node_timeout() -> None:
    membership, peers, clock = table(3)
    node = peers[0]
    membership.send_ping(node)
    clock[0] += NODE_TIMEOUT
    membership.cron()
    assert "fail?" not in node.flags
    clock[0] += 1
    membership.cron()
    assert "fail?" in node.flags


def test_gossip_sections_are_sized_like_the_originals_and_failing_nodes_go_first() -> None:
    for n, wanted in ((2, 0), (3, 1), (5, 3), (40, 4)):
        membership, peers, _clock = table(n)
        assert len(membership.gossip_entries()) == wanted, n
    membership, peers, _clock = table(40)
    peers[7].flags.add("fail?")
    peers[7].link = None  # a dead node has no link: still reported (the original skipped it)
    entries = membership.gossip_entries()
    assert entries[0].node_id == peers[7].id and entries[0].flags & m.WIRE_FLAGS["fail?"]


def test_gossip_about_unknown_nodes_starts_handshakes_except_banned_ones() -> None:
    membership, peers, clock = table(2)
    stranger = ClusterNode("f" * 40, "127.0.0.9", 7009)
    banned = ClusterNode("e" * 40, "127.0.0.8", 7008)
    membership.cluster.banned[banned.id] = clock[0] + 60_000
    membership.process_gossip(peers[0], (
        m.GossipEntry(stranger.id, 0, 0, stranger.ip, stranger.port, 0),
        m.GossipEntry(banned.id, 0, 0, banned.ip, banned.port, 0)))
    handshakes = [n for n in membership.cluster.nodes.values() if "handshake" in n.flags]
    assert [(n.ip, n.port) for n in handshakes] == [("127.0.0.9", 7009)]
