"""Raw sockets on a real node's bus port: broken or hostile peers are
dropped, and the node keeps serving clients and its cluster."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from disque.cluster import messages as m
from tests.support.process import DisqueProcess, closed_by_peer, wait_for

STRANGER = "ab" * 20
JOB_ID = b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
NODE_TIMEOUT_MS = 1000


@pytest.fixture
def node(server_factory) -> DisqueProcess:
    return server_factory("--cluster-node-timeout", str(NODE_TIMEOUT_MS))


def bus(node: DisqueProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
    return sock



def read_messages(sock: socket.socket, count: int) -> list[m.Message]:
    reader = m.FrameReader()
    frames: list[bytes] = []
    sock.settimeout(10)
    while len(frames) < count:
        data = sock.recv(65536)
        assert data, "the node closed the link"
        frames += reader.feed(data)
    decoded = [m.decode(f) for f in frames]
    assert all(d is not None for d in decoded)
    return decoded  # type: ignore[return-value]


def still_serving(node: DisqueProcess) -> None:
    client = node.client()
    assert client.ping()
    job = client.execute_command("ADDJOB", "q", "body", 0)
    assert client.execute_command("SHOW", job) is not None


def ping() -> bytes:
    return m.gossip_message(m.PING, STRANGER, 7000, 0, [])


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",                     # another protocol
    b"DbuX" + struct.pack(">I", 144) + bytes(136),            # bad signature
    b"DbuZ" + struct.pack(">I", 100) + bytes(92),             # totlen below the header
    b"DbuZ" + struct.pack(">I", 0xFFFFFFFF),                  # huge totlen, nothing after it
    ping() + b"garbage!" * 20,                                # a good message, then garbage
], ids=["http", "signature", "short-totlen", "huge-totlen", "garbage-after-ping"])
def test_links_that_break_the_framing_are_closed(node: DisqueProcess, data: bytes) -> None:
    with bus(node) as sock:
        sock.sendall(data)
        assert closed_by_peer(sock, timeout=5)
    still_serving(node)


def test_wrong_lengths_and_unknown_types_are_dropped_and_the_link_kept(node) -> None:
    with bus(node) as sock:
        bad = [
            ping()[:14] + struct.pack(">H", 3) + ping()[16:],           # count 3, no entries
            m.header(m.FAIL, STRANGER, 7000, 0, 39) + b"x" * 39,         # FAIL body too short
            m.header(99, STRANGER, 7000, 0, 0),                          # unknown type
            ping()[:8] + struct.pack(">H", 7) + ping()[10:],             # another version
            m.job_id_message(m.DELJOB, STRANGER, 7000, 0, JOB_ID, 0),    # unknown sender
        ]
        sock.sendall(b"".join(bad) + ping())
        (pong,) = read_messages(sock, 1)  # only the good PING is answered
        assert pong.type == m.PONG
        assert not closed_by_peer(sock, timeout=0.2)
    still_serving(node)
    assert node.client().execute_command("CLUSTER", "INFO").decode().count("known_nodes:1")


def test_many_messages_in_one_read_get_their_answers(node: DisqueProcess) -> None:
    with bus(node) as sock:
        sock.sendall(ping() * 200)
        pongs = read_messages(sock, 200)
        assert {p.type for p in pongs} == {m.PONG}
        my_id = node.client().execute_command("CLUSTER", "MYID").decode()
        assert {p.sender for p in pongs} == {my_id}


def test_a_peer_stalled_inside_a_message_is_dropped(node: DisqueProcess) -> None:
    with bus(node) as sock:
        sock.sendall(ping()[:100])  # a header, cut short, and then nothing
        started = time.monotonic()
        assert closed_by_peer(sock, timeout=10 * NODE_TIMEOUT_MS / 1000)
        assert time.monotonic() - started >= NODE_TIMEOUT_MS / 1000 * 0.5
    still_serving(node)


def test_a_silent_connection_is_dropped(node: DisqueProcess) -> None:
    with bus(node) as sock:
        assert closed_by_peer(sock, timeout=10 * NODE_TIMEOUT_MS / 1000)
    still_serving(node)


def test_a_stranger_ping_is_answered_but_does_not_join(node: DisqueProcess) -> None:
    with bus(node) as sock:
        sock.sendall(ping())
        (pong,) = read_messages(sock, 1)
        assert pong.type == m.PONG and pong.port == node.port
    view = node.client().execute_command("CLUSTER", "NODES").decode()
    assert STRANGER not in view and len(view.strip().splitlines()) == 1


def test_many_connections_at_once_do_not_harm_the_node(node: DisqueProcess) -> None:
    socks = [bus(node) for _ in range(200)]
    try:
        for sock in socks:
            sock.sendall(b"DbuZ" + struct.pack(">I", 1 << 20))  # each claims 1 MiB to come
        still_serving(node)
    finally:
        for sock in socks:
            sock.close()
    wait_for(lambda: node.client().ping(), timeout=5, message="the node to answer")


def test_a_strangers_meet_cannot_make_us_connect_anywhere(node: DisqueProcess) -> None:
    # 600 entries: as many as a stranger's first message may hold (an
    # unproven link takes at most m.UNPROVEN_MESSAGE bytes: test_bus_limits.py).
    gossip = [m.GossipEntry(f"{i:040x}", 0, 0, f"127.1.{i // 250}.{i % 250 + 1}", 7711, 0)
              for i in range(600)]
    with bus(node) as sock:
        meet = m.gossip_message(m.MEET, STRANGER, 7000, 0, gossip)
        sock.sendall(meet + m.gossip_message(m.MEET, STRANGER, 7000, 0, []) * 50)
        pongs = read_messages(sock, 51)
        assert {p.type for p in pongs} == {m.PONG}
    lines = node.client().execute_command("CLUSTER", "NODES").decode().strip().splitlines()
    # Only the stranger itself is a handshake (once, for all its MEETs); none
    # of the 600 addresses it gossiped about is met.
    assert len(lines) == 2 and "handshake" in lines[1] and ":7000 " in lines[1], lines
    still_serving(node)


def test_messages_with_our_own_id_change_nothing(node: DisqueProcess) -> None:
    my_id = node.client().execute_command("CLUSTER", "MYID").decode()
    leaving = m.flags_to_wire({"leaving"})
    with bus(node) as sock:
        sock.sendall(m.gossip_message(m.PING, my_id, node.port, leaving, []))
        (pong,) = read_messages(sock, 1)
        assert pong.type == m.PONG
    assert node.client().execute_command("CLUSTER", "LEAVING") == b"no"
    assert len(node.client().execute_command("CLUSTER", "NODES").decode().splitlines()) == 1
