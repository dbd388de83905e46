"""TLS for clients (tls-port, an extension): a real node with certificates made
at test time, spoken to with the ssl module; handshakes that must fail do,
are logged and counted, and the node goes on serving."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.metrics import scrape, value
from tests.support.process import DisqueProcess, free_port, free_ports, wait_for
from tests.support.tls import Certificates, make_certificates, tls_args


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def start(server_factory, certs: Certificates, auth_clients: str = "yes") -> DisqueProcess:
    tls_port, metrics_port = free_ports(2)
    node = server_factory(*tls_args(certs, tls_port, auth_clients),
                          "--metrics-port", str(metrics_port))
    node.tls_port = tls_port  # type: ignore[attr-defined]
    node.metrics_port = metrics_port  # type: ignore[attr-defined]
    return node


def context(ca: Path | None, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
    if cert is not None:
        ctx.load_cert_chain(str(cert.cert), str(cert.key))
    return ctx


def tls_call(node: DisqueProcess, ctx: ssl.SSLContext, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="localhost") as sock:
        sock.sendall(payload)
        data = b""
        while not data.endswith(b"\r\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def failures(node: DisqueProcess) -> float:
    return value(scrape(node.metrics_port), "disque_tls_handshake_failures_total")


def refused(node: DisqueProcess, ctx: ssl.SSLContext) -> None:
    """The handshake, or the first read after it (TLS 1.3 checks the client's
    certificate after the client thinks it is done), fails."""
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        reply = tls_call(node, ctx, b"PING\r\n")
        if not reply:
            raise ConnectionResetError("closed")


def test_a_client_with_a_good_certificate_is_an_ordinary_client(server_factory, certs) -> None:
    node = start(server_factory, certs)
    ctx = context(certs.ca, certs.client)
    assert tls_call(node, ctx, b"PING\r\n") == b"+PONG\r\n"
    job_id = tls_call(node, ctx, b"ADDJOB q body 0\r\n")
    assert job_id.startswith(b"+D-")
    # The same node: the job is there on the plain port.
    assert node.client().execute_command("QLEN", "q") == 1
    assert failures(node) == 0
    assert "TLS: accepting connections on 127.0.0.1:" in node.log_text()


def test_client_certificate_required_but_missing(server_factory, certs) -> None:
    node = start(server_factory, certs)
    refused(node, context(certs.ca))
    wait_for(lambda: failures(node) == 1, message="the failure to be counted")
    assert "TLS handshake with 127.0.0.1:" in node.log_text()
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in node.log_text()
    assert node.client().ping()


def test_client_certificate_from_another_ca(server_factory, certs) -> None:
    node = start(server_factory, certs)
    refused(node, context(certs.ca, certs.other_client))
    wait_for(lambda: failures(node) == 1, message="the failure to be counted")
    assert "CERTIFICATE_VERIFY_FAILED" in node.log_text()
    assert node.client().ping()


def test_the_client_does_not_trust_the_nodes_ca(server_factory, certs) -> None:
    node = start(server_factory, certs)
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_call(node, context(certs.other_ca, certs.client), b"PING\r\n")
    wait_for(lambda: failures(node) == 1, message="the failure to be counted")
    assert node.client().ping()


@pytest.mark.parametrize("payload", [b"PING\r\n", b"*1\r\n$4\r\nPING\r\n", b"\x00" * 4096,
                                     b"GET / HTTP/1.1\r\n\r\n"])
def test_plain_text_on_the_tls_port(server_factory, certs, payload: bytes) -> None:
    node = start(server_factory, certs)
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=10) as sock:
        sock.sendall(payload)
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            data = b""
        assert b"PONG" not in data
    wait_for(lambda: failures(node) == 1, message="the failure to be counted")
    assert "TLS handshake with 127.0.0.1:" in node.log_text()
    assert node.alive() and node.client().ping()


def test_a_silent_connection_does_not_hold_up_the_others(server_factory, certs) -> None:
    node = start(server_factory, certs)
    with socket.create_connection(("127.0.0.1", node.tls_port), timeout=10):
        assert tls_call(node, context(certs.ca, certs.client), b"PING\r\n") == b"+PONG\r\n"


def test_optional_client_certificates(server_factory, certs) -> None:
    node = start(server_factory, certs, auth_clients="optional")
    assert tls_call(node, context(certs.ca), b"PING\r\n") == b"+PONG\r\n"
    assert tls_call(node, context(certs.ca, certs.client), b"PING\r\n") == b"+PONG\r\n"
    refused(node, context(certs.ca, certs.other_client))  # sent, so checked


def test_no_client_certificates(server_factory, certs) -> None:
    node = start(server_factory, certs, auth_clients="no")
    assert tls_call(node, context(certs.ca), b"PING\r\n") == b"+PONG\r\n"


def test_requirepass_applies_over_tls(server_factory, certs) -> None:
    node = server_factory(*tls_args(certs, port := free_port()), "--requirepass", "pw")
    node.tls_port = port  # type: ignore[attr-defined]
    ctx = context(certs.ca, certs.client)
    assert tls_call(node, ctx, b"QLEN q\r\n").startswith(b"-NOAUTH")
    assert tls_call(node, ctx, b"AUTH wrong\r\n") == b"-ERR invalid password\r\n"


def run_server(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                           str(tmp_path), *args], capture_output=True, text=True, timeout=30)


def test_bad_tls_directives_stop_the_node_with_a_clear_error(tmp_path, certs) -> None:
    port = str(free_port())
    server, client = certs.server, certs.client
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        (["--tls-port", port], "TLS: tls-port needs tls-cert-file and tls-key-file"),
        (["--tls-port", port, "--tls-cert-file", str(server.cert)],
         "tls-port needs tls-cert-file and tls-key-file"),
        (["--tls-port", port, "--tls-cert-file", str(tmp_path / "nope.crt"),
          "--tls-key-file", str(server.key)], "No such file or directory"),
        (["--tls-port", port, "--tls-cert-file", str(server.cert),
          "--tls-key-file", str(client.key)], "KEY_VALUES_MISMATCH"),
        (["--tls-port", port, "--tls-cert-file", str(garbage),
          "--tls-key-file", str(server.key)], "Failed to load the certificate"),
        (["--tls-port", port, "--tls-cert-file", str(server.cert),
          "--tls-key-file", str(server.key)], "tls-auth-clients yes needs tls-ca-cert-file"),
        ([*tls_args(certs, int(port))[:6], "--tls-ca-cert-file", str(garbage)],
         "Failed to load the CA certificates"),
    ]
    for args, expected in cases:
        result = run_server(tmp_path, *args)
        assert result.returncode == 1, (args, result.stdout)
        assert expected in result.stdout + result.stderr, (args, result.stdout)
    for args, expected in [
        (["--tls-port", "70000"], "argument must be between 0 and 65535"),
        (["--tls-port", "x"], "argument must be an integer"),
        (["--tls-auth-clients", "maybe"], "argument must be one of yes, no, optional"),
    ]:
        result = run_server(tmp_path, *args)
        assert result.returncode == 1
        assert "FATAL CONFIG FILE ERROR" in result.stderr and expected in result.stderr


def test_a_taken_tls_port_stops_the_node(tmp_path, certs) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_server(tmp_path, *tls_args(certs, port))
    assert result.returncode == 1
    assert f"Could not create the TLS TCP listening socket 127.0.0.1:{port}" in result.stdout


def test_tls_directives_cannot_be_changed_at_run_time(server) -> None:
    client = server.client()
    for name in ("tls-port", "tls-cert-file", "tls-key-file", "tls-ca-cert-file",
                 "tls-auth-clients"):
        with pytest.raises(Exception, match="Unsupported CONFIG parameter"):
            client.execute_command("CONFIG", "SET", name, "x")
    assert client.execute_command("CONFIG", "GET", "tls-port") == [b"tls-port", b"0"]
