"""The cluster bus's limits against whoever can reach its port (issue 49,
finding 7): a link that has not proved itself may send small messages only,
an inbound link that proves nothing is closed within seconds, and inbound
links are limited in number.  The cluster's own links, ours and the
original's, are not hurt.

A link is *proven* by a message signed with the cluster secret or, without
one, by a message from a node of the table (cluster/bus.py).
"""

from __future__ import annotations

import gc
import socket
import time
from pathlib import Path

import pytest

from disque.cluster import messages as m
from disque.cluster.auth import BusAuth
from disque.cluster.bus import UNPROVEN_LINK_MS, ClusterBus
from disque.cluster.link import BusLink
from disque.cluster.node import ClusterNode
from disque.cluster.state import ClusterState
from disque.job import Job, JobIdGenerator, serialize_job
from tests.support.cluster import (
    cluster_view,
    fully_joined,
    holders,
    node_id,
    reference_server,
    show,
    with_original,
)
from tests.support.process import DisqueProcess, closed_by_peer, raw_command, wait_for

SECRET = "correct horse battery staple"
STRANGER = "ab" * 20
#: Long enough that neither the stalled-message rule (one node timeout) nor
#: the silent-link rule (two) closes a test's links before the rules under
#: test do.
LONG_NODE_TIMEOUT_MS = 30_000


_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_sockets():
    yield
    while _opened:
        _opened.pop().close()


def bus(node: DisqueProcess) -> socket.socket:
    """A raw connection to the node's bus port (closed after the test)."""
    sock = socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
    _opened.append(sock)
    return sock


def bus_counters(node: DisqueProcess) -> dict[str, int]:
    text = raw_command(node.port, "INFO", "extensions")
    assert isinstance(text, bytes)
    return {key: int(value) for key, value in
            (line.split(":", 1) for line in text.decode().splitlines()
             if line.startswith("cluster_bus_"))}


def read_pong(sock: socket.socket) -> m.Message:
    reader = m.FrameReader()
    sock.settimeout(10)
    while True:
        data = sock.recv(65536)
        assert data, "the node closed the link"
        frames = reader.feed(data)
        if frames:
            msg = m.decode(frames[0])
            assert msg is not None and msg.type == m.PONG
            return msg


def ping_as(node: DisqueProcess) -> bytes:
    """A PING claiming to come from ``node`` (its ID and port: nothing moves)."""
    return m.gossip_message(m.PING, node_id(node), node.port, 0, [])


def repljob(sender: str, target: DisqueProcess, body: bytes) -> tuple[bytes, bytes]:
    """(job ID, a REPLJOB of one job from ``sender`` to ``target``)."""
    job_id = JobIdGenerator(sender).next_id(600, 60)
    job = Job(job_id, b"big", body, repl=2, etime=600_000, retry=60,
              delivered=frozenset((sender, node_id(target))))
    return job_id, m.jobs_message(m.REPLJOB, sender, 7000, 0,
                                  [serialize_job(job, bus_now_ms=0)])


def log_lines(node: DisqueProcess, text: str) -> list[str]:
    return [line for line in node.log_text().splitlines() if text in line]


@pytest.fixture
def pair(make_cluster):
    def make(*args: str) -> tuple[DisqueProcess, DisqueProcess]:
        a, b = make_cluster(2, *args, node_timeout=LONG_NODE_TIMEOUT_MS)
        return a, b
    return make


# -- the reader (sans-IO) ----------------------------------------------------------

def test_the_reader_asks_above_its_small_limit_and_says_why() -> None:
    asked: list[bytes] = []
    proven = False

    def large_ok(header: bytes) -> bool:
        asked.append(header)
        return proven

    reader = m.FrameReader(large_ok=large_ok, small_message=m.UNPROVEN_MESSAGE)
    small = m.queue_message(m.NEEDJOBS, STRANGER, 1, 0, b"q" * 1000, 1)
    assert reader.feed(small) == [small] and not asked
    big = m.queue_message(m.NEEDJOBS, STRANGER, 1, 0, b"q" * m.UNPROVEN_MESSAGE, 1)
    with pytest.raises(m.FrameError, match="for a link that has not proved itself"):
        reader.feed(big[:m.HEADER_SIZE])
    assert asked == [big[:m.HEADER_SIZE]]
    proven = True
    reader = m.FrameReader(large_ok=large_ok, small_message=m.UNPROVEN_MESSAGE)
    assert reader.feed(big) == [big]


def test_the_reader_holds_a_large_message_until_the_ones_before_it_are_handled() -> None:
    """The PING that proves a link and the first big copy may share a read:
    the reader stops before the copy (``held``) so that the PING is handled
    first, and goes on with ``feed(b"")``."""
    proven: list[bool] = [False]
    reader = m.FrameReader(large_ok=lambda header: proven[0],
                           small_message=m.UNPROVEN_MESSAGE)
    ping = m.gossip_message(m.PING, STRANGER, 1, 0, [])
    copy = m.jobs_message(m.REPLJOB, STRANGER, 1, 0, [b"x" * 100_000])
    assert reader.feed(ping + copy) == [ping] and reader.held
    proven[0] = True  # what handling the PING did
    assert reader.feed(b"") == [copy] and not reader.held and reader.pending == 0


def test_a_lost_link_is_not_kept_alive_by_its_reader() -> None:
    """The reader's callback is the link's method: the cycle is broken when
    the link goes, or a gc.freeze (disque/cyclic_gc.py) taken while it lived
    would keep it, and its partial message, for up to an hour."""
    cluster = ClusterState(ClusterNode("0123456789abcdef0123456789abcdef01234567",
                                       "127.0.0.1", 7711), None)
    bus = ClusterBus(cluster, lambda: 0, lambda: 15000)
    link = BusLink(bus)
    assert link in gc.get_referents(link.reader.large_ok)
    link.connection_lost(None)
    assert link.reader.large_ok is None
    closed = BusLink(bus)
    closed.close()  # never connected: no transport to report the loss
    assert closed.reader.large_ok is None


# -- small messages until proven ------------------------------------------------

@pytest.mark.parametrize("secret", [True, False], ids=["secret", "no-secret"])
@pytest.mark.parametrize("size", [200 * 1024, 100 * 1024 * 1024], ids=["200KB", "100MB"])
def test_a_large_first_message_is_refused_at_its_header(pair, secret: bool, size: int) -> None:
    """The probe's case: a REPLJOB claiming a known peer's ID (HELLO lists
    them) as the first message of a link.  Before, 200 KB was buffered from
    anybody and up to 513 MB from a known ID, before the secret was checked."""
    a, b = pair(*(("--cluster-secret", SECRET) if secret else ()))
    header = m.header(m.REPLJOB, node_id(b), b.port, 0, size - m.HEADER_SIZE)
    with bus(a) as sock:
        sock.sendall(header + b"x" * 60_000)  # and more would follow
        # Closed at once, not after a node timeout of waiting for the rest.
        assert closed_by_peer(sock, timeout=5)
    wait_for(lambda: log_lines(a, "not proved itself"), message="the refusal in the log")
    assert bus_counters(a)["cluster_bus_bad_links"] >= 1
    # The peer's own link is untouched: jobs still replicate.
    job = a.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    assert {n.port for n in holders([a, b], job)} == {a.port, b.port}


def test_a_stranger_may_send_small_messages(pair) -> None:
    """Up to UNPROVEN_MESSAGE a stranger is answered as before (a PING with
    gossip of a large cluster fits)."""
    a, _b = pair()
    entries = (m.UNPROVEN_MESSAGE - m.HEADER_SIZE) // 104
    gossip = [m.GossipEntry(f"{i:040x}", 0, 0, "", 0, m.WIRE_FLAGS["noaddr"])
              for i in range(entries)]
    ping = m.gossip_message(m.PING, STRANGER, 7000, 0, gossip)
    assert m.UNPROVEN_MESSAGE - 104 < len(ping) <= m.UNPROVEN_MESSAGE
    with bus(a) as sock:
        sock.sendall(ping)
        read_pong(sock)
        sock.sendall(m.gossip_message(m.PING, STRANGER, 7000, 0, gossip + gossip[:1]))
        assert closed_by_peer(sock, timeout=5)  # one entry more: refused


def test_a_proven_link_takes_a_large_copy_in_the_same_read(pair) -> None:
    """A peer's first PING and its first big job copy often share one read:
    the copy's size is checked once the PING has proved the link."""
    a, b = pair("--cluster-secret", SECRET)
    auth = BusAuth(SECRET.encode())
    job_id, message = repljob(node_id(b), a, b"x" * (2 * 1024 * 1024))
    with bus(a) as sock:
        sock.sendall(auth.sign(ping_as(b)) + auth.sign(message))
        read_pong(sock)
        wait_for(lambda: show(a, job_id) is not None, message="the copy to be stored")
        assert not closed_by_peer(sock, timeout=0.2)


def test_large_jobs_replicate_both_ways_with_the_secret(pair) -> None:
    a, b = pair("--cluster-secret", SECRET)
    for source in (a, b):
        job = source.client().execute_command("ADDJOB", "q", b"y" * (3 * 1024 * 1024), 0,
                                              "REPLICATE", 2)
        assert {n.port for n in holders([a, b], job)} == {a.port, b.port}
    assert bus_counters(a)["cluster_bus_bad_links"] == 0


# -- unproven links are closed early ------------------------------------------------

@pytest.mark.parametrize("secret", [True, False], ids=["secret", "no-secret"])
def test_links_that_prove_nothing_are_closed_within_seconds(server_factory,
                                                             secret: bool) -> None:
    """Silent links, and (without a secret, where a stranger's PING is
    answered) links of a stranger, are closed after UNPROVEN_LINK_MS, long
    before the silent-link rule's two node timeouts."""
    args = ("--cluster-secret", SECRET) if secret else ()
    node = server_factory("--cluster-node-timeout", str(LONG_NODE_TIMEOUT_MS), *args)
    socks = [bus(node) for _ in range(10)]
    if not secret:
        for sock in socks[5:]:
            sock.sendall(m.gossip_message(m.PING, STRANGER, 7000, 0, []))
            read_pong(sock)
    started = time.monotonic()
    for sock in socks:
        assert closed_by_peer(sock, timeout=started + 4 * UNPROVEN_LINK_MS / 1000
                              - time.monotonic()), "an unproven link was kept"
        sock.close()
    assert time.monotonic() - started >= UNPROVEN_LINK_MS / 1000 * 0.8
    assert bus_counters(node)["cluster_bus_unproven_links_closed"] == 10
    assert log_lines(node, "no message")  # logged (rate-limited)
    assert node.client().ping()


@pytest.mark.parametrize("secret", [True, False], ids=["secret", "no-secret"])
def test_the_clusters_own_links_prove_themselves(make_cluster, secret: bool) -> None:
    """Nodes joined in a chain (the last ones meet by gossip, their first
    PINGs reach nodes that do not know them yet): every inbound link ends
    up proven, and none is closed for it."""
    args = ("--cluster-secret", SECRET) if secret else ()
    nodes = make_cluster(4, *args, chain=True)

    def all_proven() -> bool:
        counters = [bus_counters(n) for n in nodes]
        return all(c["cluster_bus_inbound_links"] == 3 and c["cluster_bus_unproven_links"] == 0
                   for c in counters)

    wait_for(all_proven, timeout=20, message=lambda: str([bus_counters(n) for n in nodes]))
    assert [bus_counters(n)["cluster_bus_unproven_links_closed"] for n in nodes] == [0] * 4
    assert fully_joined(nodes)


# -- the number of inbound links ------------------------------------------------------

def test_inbound_links_are_limited(pair) -> None:
    """At cluster-max-inbound-links an unproven link gives way to a new one;
    when every link is proven the new one is refused.  The peers' links,
    proven, are never the ones closed."""
    a, b = pair("--cluster-max-inbound-links", "4")
    wait_for(lambda: bus_counters(a)["cluster_bus_inbound_links"] == 1,
             message="b's link to a")
    # Two links proven the way a peer proves one (without a secret, a PING
    # from a node of the table), and one stranger's, silent.
    proven = [bus(a), bus(a)]
    for sock in proven:
        sock.sendall(ping_as(b))
        read_pong(sock)
    stranger = bus(a)
    wait_for(lambda: bus_counters(a)["cluster_bus_inbound_links"] == 4,
             message="four inbound links")
    # A fifth: the stranger's link makes room for it.
    newcomer = bus(a)
    assert closed_by_peer(stranger, timeout=5)
    newcomer.sendall(ping_as(b))
    read_pong(newcomer)
    wait_for(lambda: bus_counters(a)["cluster_bus_inbound_links"] == 4,
             message="four inbound links, the newcomer's among them")
    # Every link proven now: a sixth is refused at once, and logged.
    refused = bus(a)
    assert closed_by_peer(refused, timeout=5)
    counters = bus_counters(a)
    assert counters["cluster_bus_links_refused"] == 1, counters
    assert counters["cluster_bus_unproven_links_closed"] == 1, counters
    assert log_lines(a, "Refused a cluster bus link from 127.0.0.1")
    for sock in (*proven, newcomer):
        assert not closed_by_peer(sock, timeout=0.05)
        sock.close()
    # b's link was never touched: replication works, b is connected.
    job = b.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    assert {n.port for n in holders([a, b], job)} == {a.port, b.port}
    assert cluster_view(a)[node_id(b)]["link"] == "connected"


def test_a_flood_of_connections_keeps_the_cluster_linked(pair) -> None:
    """The probe opened 3,000 idle links; with the limit at 50, 300 at once
    leave at most 50 open, and the cluster's links stay."""
    a, b = pair("--cluster-max-inbound-links", "50")
    wait_for(lambda: bus_counters(a)["cluster_bus_inbound_links"] == 1,
             message="b's link to a")
    socks = [bus(a) for _ in range(300)]
    try:
        wait_for(lambda: bus_counters(a)["cluster_bus_unproven_links_closed"] >= 250,
                 message=lambda: str(bus_counters(a)))
        assert bus_counters(a)["cluster_bus_inbound_links"] <= 50
        assert sum(not closed_by_peer(s, timeout=0.01) for s in socks) <= 49
        job = a.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
        assert {n.port for n in holders([a, b], job)} == {a.port, b.port}
    finally:
        for sock in socks:
            sock.close()


def test_the_limit_directive(server_factory) -> None:
    node = server_factory()
    client = node.client()
    assert client.execute_command("CONFIG", "GET", "cluster-max-inbound-links") == [
        b"cluster-max-inbound-links", b"1024"]
    client.execute_command("CONFIG", "SET", "cluster-max-inbound-links", "2")
    with pytest.raises(Exception, match="between 1 and"):
        client.execute_command("CONFIG", "SET", "cluster-max-inbound-links", "0")
    socks = [bus(node) for _ in range(2)]
    for sock in socks:
        sock.sendall(m.gossip_message(m.PING, STRANGER, 7000, 0, []))
        read_pong(sock)
    bus(node)  # a stranger's link gives way (the oldest: both may be of one ms)
    wait_for(lambda: bus_counters(node)["cluster_bus_unproven_links_closed"] == 1,
             message="a link to give way")
    assert sorted(closed_by_peer(sock, timeout=0.5) for sock in socks) == [False, True]


# -- mixed clusters ---------------------------------------------------------------------

@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server (DISQUE_REFERENCE_SERVER)")
def test_an_original_node_sends_large_jobs_over_its_proven_links(server_factory,
                                                                 tmp_path: Path) -> None:
    """The original's first message on a link is PING or MEET: its links
    prove themselves, and its copies of large jobs are taken."""
    with with_original(server_factory, tmp_path, ours=1) as (mine, original):
        (ours,) = mine
        for source in (original, ours):
            job = source.client().execute_command("ADDJOB", "q", b"z" * (2 * 1024 * 1024), 0,
                                                  "REPLICATE", 2)
            assert {n.port for n in holders([ours, original], job)} == {ours.port,
                                                                         original.port}
        counters = bus_counters(ours)
        assert counters["cluster_bus_unproven_links"] == 0, counters
        assert counters["cluster_bus_bad_links"] == 0, counters
