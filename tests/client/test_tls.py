"""The client library and the CLI over TLS (a node's tls-port, an extension)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from disque import AsyncClient, Client
from disque.exceptions import ConnectionFailed
from tests.support.cluster import join, wait_joined
from tests.support.process import DisqueProcess, free_port
from tests.support.tls import Certificates, make_certificates, tls_args


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def start(server_factory, certs: Certificates, *args: str) -> DisqueProcess:
    port = free_port()
    node = server_factory(*tls_args(certs, port), *args)
    node.tls_port = port  # type: ignore[attr-defined]
    return node


def tls_options(certs: Certificates) -> dict[str, str]:
    return {"tls_ca_file": str(certs.ca), "tls_cert_file": str(certs.client.cert),
            "tls_key_file": str(certs.client.key)}


def test_client_over_tls(server_factory, certs) -> None:
    node = start(server_factory, certs)
    with Client(f"127.0.0.1:{node.tls_port}", socket_timeout=10, **tls_options(certs)) as c:
        assert c.tls
        job_id = c.add_job("q", b"over tls")
        job = c.get_job("q", timeout_ms=1000)
        assert (job.id, job.body) == (job_id, b"over tls")
        assert c.ack(job.id) == 1
        # The node's own ID came back in HELLO, over TLS.
        assert c.node_id == node.client().execute_command("CLUSTER", "MYID").decode()


def test_async_client_over_tls(server_factory, certs) -> None:
    node = start(server_factory, certs)

    async def run() -> bytes:
        async with AsyncClient(f"127.0.0.1:{node.tls_port}", socket_timeout=10,
                               **tls_options(certs)) as c:
            await c.add_job("q", b"async tls")
            job = await c.get_job("q", timeout_ms=1000)
            return job.body

    assert asyncio.run(run()) == b"async tls"


def test_a_node_from_another_ca_is_refused(server_factory, certs) -> None:
    node = start(server_factory, certs)
    options = {**tls_options(certs), "tls_ca_file": str(certs.other_ca)}
    with Client(f"127.0.0.1:{node.tls_port}", reconnect_timeout=0, **options) as c, \
            pytest.raises(ConnectionFailed, match="certificate verify failed"):
        c.ping()


def test_plain_client_on_the_tls_port_and_tls_client_on_the_plain_port(server_factory,
                                                                       certs) -> None:
    node = start(server_factory, certs)
    with Client(f"127.0.0.1:{node.tls_port}", reconnect_timeout=0, socket_timeout=5,
                connect_timeout=5) as c, pytest.raises(ConnectionFailed):
        c.ping()
    with Client(f"127.0.0.1:{node.port}", reconnect_timeout=0, socket_timeout=5,
                **tls_options(certs)) as c, pytest.raises(ConnectionFailed):
        c.ping()
    assert node.client().ping()


def test_a_client_certificate_needs_its_key() -> None:
    with pytest.raises(ValueError, match="go together"):
        Client(tls_cert_file="client.crt")


def test_over_tls_only_the_given_addresses_are_dialled(make_cluster_tls) -> None:
    """HELLO lists the plain ports: a TLS client moves between the TLS
    addresses it was given, here after its node dies."""
    a, b, certs = make_cluster_tls
    seeds = [f"127.0.0.1:{a.tls_port}", f"127.0.0.1:{b.tls_port}"]
    with Client(seeds, randomize=False, socket_timeout=10, reconnect_timeout=10,
                **tls_options(certs)) as c:
        c.connect()
        assert c.address == seeds[0]
        assert len(c.nodes) == 2  # HELLO was read: both nodes known, with plain ports
        a.kill()
        assert c.ping()
        assert c.address == seeds[1]


@pytest.fixture
def make_cluster_tls(server_factory, certs):
    a = start(server_factory, certs, "--cluster-node-timeout", "2000")
    b = start(server_factory, certs, "--cluster-node-timeout", "2000")
    join([a, b])
    wait_joined([a, b])
    return a, b, certs


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque.cli", *args], capture_output=True,
                          text=True, timeout=30, env=dict(os.environ))


def test_cli_over_tls(server_factory, certs) -> None:
    node = start(server_factory, certs)
    port = str(node.tls_port)
    tls = ["--cacert", str(certs.ca), "--cert", str(certs.client.cert),
           "--key", str(certs.client.key)]
    assert cli("-p", port, *tls, "ping").stdout == "PONG\n"
    assert cli("-p", port, "--tls", *tls, "qlen", "q").stdout == "0\n"
    # Connecting by IP: the certificate names localhost and 127.0.0.1.
    assert cli("-h", "localhost", "-p", port, *tls, "ping").stdout == "PONG\n"
    wrong_ca = cli("-p", port, "--cacert", str(certs.other_ca), "--cert",
                   str(certs.client.cert), "--key", str(certs.client.key), "ping")
    assert wrong_ca.returncode == 1
    assert wrong_ca.stderr.startswith(f"Could not connect to Disque at 127.0.0.1:{port}: ")
    assert "certificate verify failed" in wrong_ca.stderr
    insecure = cli("-p", port, "--insecure", "--cacert", str(certs.other_ca), "--cert",
                   str(certs.client.cert), "--key", str(certs.client.key), "ping")
    assert insecure.stdout == "PONG\n"  # the node is not verified, the client still is
    plain = cli("-p", port, "ping")
    assert plain.returncode == 1 and "Could not connect" in plain.stderr
    half = cli("-p", port, "--cert", str(certs.client.cert), "ping")
    assert half.returncode == 2 and "--cert and --key go together" in half.stderr
    assert "--cacert" in cli("--help").stdout
