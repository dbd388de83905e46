"""TLS on the cluster bus (``tls-cluster yes``, an extension): nodes with
certificates of one CA form a cluster and replicate over TLS; a plain-text
peer, a certificate of another CA or none at all is refused and logged, and
the node keeps serving; start-up refuses an incomplete setup."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from disque.cluster import messages as m
from tests.support.cluster import cluster_view, holders, meet, node_id
from tests.support.process import DisqueProcess, closed_by_peer, raw_command, wait_for
from tests.support.tls import Certificates, make_certificates

STRANGER = "ab" * 20


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_cluster_args(cert: Path, key: Path, ca: Path) -> list[str]:
    return ["--tls-cluster", "yes", "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca)]


def ours(certs: Certificates) -> list[str]:
    """Every node of the cluster presents the one certificate the CA signed
    (a node's certificate is its client certificate too, as in Redis)."""
    return tls_cluster_args(certs.server.cert, certs.server.key, certs.ca)


def bus_counters(node: DisqueProcess) -> dict[str, int]:
    text = raw_command(node.port, "INFO", "extensions")
    assert isinstance(text, bytes)
    return {key: int(value) for key, value in
            (line.split(":", 1) for line in text.decode().splitlines()
             if line.startswith("cluster_bus_"))}


def tls_failures(node: DisqueProcess) -> list[str]:
    return [line for line in node.log_text().splitlines()
            if "TLS handshake on the cluster bus" in line]


def still_serving(node: DisqueProcess) -> None:
    client = node.client()
    job = client.execute_command("ADDJOB", "q", "body", 0)
    assert client.execute_command("SHOW", job) is not None


def client_context(certs: Certificates, cert: Path | None, key: Path | None,
                   ca: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(cafile=ca)
    if cert is not None and key is not None:
        context.load_cert_chain(cert, key)
    return context


def refused(context: ssl.SSLContext, raw: socket.socket) -> bool:
    """Whether the node refuses the TLS client ``context`` on ``raw``: the
    handshake fails or (TLS 1.3: the client's part of the handshake ends
    before the server has checked its certificate) the first read does,
    or finds the connection closed; a PONG means it was let in."""
    try:
        with context.wrap_socket(raw) as sock:
            sock.sendall(m.gossip_message(m.MEET, STRANGER, 7000, 0, []))
            return sock.recv(65536) == b""
    except (ssl.SSLError, ConnectionError):
        return True


def test_nodes_with_tls_form_a_cluster_and_replicate(make_cluster, certs) -> None:
    nodes = make_cluster(3, *ours(certs))
    a, b, c = nodes
    job = a.client().execute_command("ADDJOB", "q", b"x" * (2 * 1024 * 1024), 0,
                                     "REPLICATE", 3)
    assert {n.port for n in holders(nodes, job)} == {n.port for n in nodes}
    got = b.client().execute_command("GETJOB", "FROM", "q")
    assert got[0][1] == job
    c.client().execute_command("ACKJOB", job)
    wait_for(lambda: not holders(nodes, job), message="the ACK to reach every copy")
    for node in nodes:
        assert tls_failures(node) == [], node.log_text()
        assert "TLS on the cluster bus" in node.log_text()


def test_tls_and_the_secret_together(make_cluster, certs) -> None:
    """With both, the messages inside the TLS links are signed and checked."""
    a, b = make_cluster(2, *ours(certs), "--cluster-secret", "correct horse battery staple")
    job = b.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    assert {n.port for n in holders([a, b], job)} == {a.port, b.port}
    a.client().execute_command("ACKJOB", job)
    wait_for(lambda: not holders([a, b], job), message="the ACK to reach both copies")
    for node in (a, b):
        counters = bus_counters(node)
        assert counters["cluster_bus_messages_refused"] == 0, counters
        assert counters["cluster_bus_tls_handshake_failures"] == 0, counters


def test_the_bus_port_speaks_tls_with_a_certificate_of_the_ca(server_factory, certs) -> None:
    node = server_factory(*ours(certs))
    context = client_context(certs, certs.client.cert, certs.client.key, certs.ca)
    with socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10) as raw, \
            context.wrap_socket(raw) as sock:
        sock.sendall(m.gossip_message(m.PING, STRANGER, 7000, 0, []))
        reader = m.FrameReader()
        frames: list[bytes] = []
        while not frames:
            data = sock.recv(65536)
            assert data
            frames = reader.feed(data)
        pong = m.decode(frames[0])
        assert pong is not None and pong.type == m.PONG and pong.sender == node_id(node)
    # The control of refused() below: this certificate is let in.
    raw = socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
    assert not refused(context, raw)


@pytest.mark.parametrize("who", ["plain-text", "no-certificate", "other-ca"])
def test_a_peer_without_a_certificate_of_the_ca_is_refused(server_factory, certs,
                                                           who: str) -> None:
    node = server_factory(*ours(certs))
    raw = socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
    with raw:
        if who == "plain-text":
            raw.sendall(m.gossip_message(m.MEET, STRANGER, 7000, 0, []))
            assert closed_by_peer(raw, timeout=5)
        else:
            cert, key = ((None, None) if who == "no-certificate"
                         else (certs.other_client.cert, certs.other_client.key))
            context = client_context(certs, cert, key, certs.ca)
            assert refused(context, raw)
    wait_for(lambda: tls_failures(node), message="the refusal in the log")
    assert bus_counters(node)["cluster_bus_tls_handshake_failures"] >= 1
    assert list(cluster_view(node)) == [node_id(node)]
    still_serving(node)


def test_a_node_of_another_ca_or_without_tls_cannot_join(server_factory, certs) -> None:
    a = server_factory(*ours(certs), "--cluster-node-timeout", "2000")
    other = server_factory(*tls_cluster_args(certs.other_client.cert, certs.other_client.key,
                                             certs.other_ca), "--cluster-node-timeout", "2000")
    plain = server_factory("--cluster-node-timeout", "2000")
    for stranger in (other, plain):
        meet(a, stranger)       # a's handshake with it fails
        meet(stranger, a)       # and its handshake with a
    # Both refusals are logged on a: the other CA's certificate (a dials
    # it, and it dials a) and the plain-text MEET; the plain node sees a's
    # TLS ClientHello as a broken frame.
    wait_for(lambda: len(tls_failures(a)) >= 1, message="a to log a refused handshake")
    wait_for(lambda: tls_failures(other), message="the other CA's node to log its refusal")
    wait_for(lambda: "Closing cluster bus link" in plain.log_text(),
             message="the plain node to refuse a's TLS")

    def alone() -> bool:
        return all(len(cluster_view(n)) == 1 for n in (a, other, plain))

    wait_for(alone, timeout=30, interval=0.1, message="the handshakes to be dropped")
    for node in (a, other, plain):
        assert node.alive()
        still_serving(node)
    assert bus_counters(a)["cluster_bus_tls_handshake_failures"] >= 2


def test_unfinished_handshakes_count_against_the_limit(server_factory, certs) -> None:
    """TCP connections that never start their TLS handshake hold a place
    among the inbound links until they give way or time out."""
    node = server_factory(*ours(certs), "--cluster-max-inbound-links", "2")
    socks = [socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)
             for _ in range(5)]
    try:
        # Each newcomer makes the oldest unfinished handshake give way.
        wait_for(lambda: bus_counters(node)["cluster_bus_unproven_links_closed"] == 3,
                 message=lambda: str(bus_counters(node)))
        assert [closed_by_peer(s, timeout=0.5) for s in socks[:3]] == [True] * 3
        # The last two time out (the handshake timeout), and are counted.
        for sock in socks[3:]:
            assert closed_by_peer(sock, timeout=15)
        wait_for(lambda: bus_counters(node)["cluster_bus_tls_handshake_failures"] == 2,
                 message=lambda: str(bus_counters(node)))
        assert bus_counters(node)["cluster_bus_unproven_links"] == 0
    finally:
        for sock in socks:
            sock.close()
    still_serving(node)


@pytest.mark.parametrize("drop, missing", [
    ("--tls-ca-cert-file", "tls-ca-cert-file"),
    ("--tls-cert-file", "tls-cert-file"),
    ("--tls-key-file", "tls-key-file"),
])
def test_tls_cluster_needs_a_certificate_a_key_and_a_ca(tmp_path, certs, drop: str,
                                                        missing: str) -> None:
    args = ours(certs)
    at = args.index(drop)
    del args[at:at + 2]
    result = subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                             str(tmp_path), *args], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1
    lines = [line for line in (result.stdout + result.stderr).splitlines()
             if "tls-cluster" in line]
    assert len(lines) == 1 and missing in lines[0], result.stdout + result.stderr
    assert not (tmp_path / "nodes.conf").exists()


def test_a_bad_ca_file_is_refused_at_start(tmp_path, certs) -> None:
    bad = tmp_path / "bad-ca.pem"
    bad.write_text("not a certificate\n")
    args = tls_cluster_args(certs.server.cert, certs.server.key, bad)
    result = subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                             str(tmp_path), *args], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 1
    assert "Failed to load the CA certificates" in result.stdout, result.stdout
