"""Certificates made at test time: a CA, a server and a client certificate
signed by it, and a second, unrelated CA with its own client certificate
(the "wrong CA" cases).  Needs the ``cryptography`` package (dev extra)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.process import DisqueProcess, free_ports

x509 = pytest.importorskip("cryptography.x509", reason="making test certificates needs "
                           "the cryptography package (dev extra)")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    ca: Path            # the CA that signed server and client
    server: Pair        # CN/SAN localhost and 127.0.0.1
    client: Pair
    other_ca: Path      # an unrelated CA
    other_client: Pair  # signed by other_ca


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, cert: x509.Certificate,
           key: ec.EllipticCurvePrivateKey) -> Pair:
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return pair


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
                 issuer_key: ec.EllipticCurvePrivateKey, ca: bool,
                 san: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(_name(subject)).issuer_name(_name(issuer))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                          content_commitment=False, key_encipherment=False,
                          data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False), critical=True)
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            issuer_key.public_key()), critical=False)
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    keys = {name: ec.generate_private_key(ec.SECP256R1())
            for name in ("ca", "server", "client", "other_ca", "other_client")}
    ca = _certificate("Test CA", keys["ca"], "Test CA", keys["ca"], ca=True)
    other_ca = _certificate("Other CA", keys["other_ca"], "Other CA", keys["other_ca"], ca=True)
    server = _certificate("localhost", keys["server"], "Test CA", keys["ca"], ca=False,
                          san=True)
    client = _certificate("client", keys["client"], "Test CA", keys["ca"], ca=False)
    other_client = _certificate("intruder", keys["other_client"], "Other CA",
                                keys["other_ca"], ca=False)
    return Certificates(
        ca=_write(directory, "ca", ca, keys["ca"]).cert,
        server=_write(directory, "server", server, keys["server"]),
        client=_write(directory, "client", client, keys["client"]),
        other_ca=_write(directory, "other_ca", other_ca, keys["other_ca"]).cert,
        other_client=_write(directory, "other_client", other_client, keys["other_client"]),
    )


def tls_args(certs: Certificates, port: int, auth_clients: str = "yes") -> list[str]:
    """disque-server arguments for a TLS listener on ``port`` with these certificates."""
    return ["--tls-port", str(port), "--tls-cert-file", str(certs.server.cert),
            "--tls-key-file", str(certs.server.key), "--tls-ca-cert-file", str(certs.ca),
            "--tls-auth-clients", auth_clients]


def tls_cluster(server_factory: Callable[..., DisqueProcess], certs: Certificates,
                count: int = 2) -> tuple[list[DisqueProcess], list[int]]:
    """``count`` joined nodes, each with a TLS port that requires client
    certificates; the nodes and their TLS ports."""
    from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined

    tls_ports = free_ports(count)
    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS),
                            *tls_args(certs, port)) for port in tls_ports]
    join(nodes)
    wait_joined(nodes)
    return nodes, tls_ports
