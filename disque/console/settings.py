"""The console's options, parsed once into one frozen value."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings", "is_loopback", "host_allowed"]


@dataclass(frozen=True)
class Settings:
    """What ``disque-console`` was started with (see :mod:`disque.console.main`)."""

    #: Seed addresses (``host:port``); the rest of the cluster comes from HELLO.
    nodes: tuple[str, ...]
    bind: str = "127.0.0.1"
    port: int = 7780
    #: Where history, the audit log and the cookie key live; None: memory only.
    data_dir: Path | None = None
    #: Serve on a non-loopback address although the nodes have no password.
    allow_open: bool = False
    #: Host names an open console answers besides IP addresses and
    #: ``localhost`` (against DNS rebinding: see :func:`host_allowed`).
    allowed_hosts: tuple[str, ...] = ()
    #: The user the sampler reads INFO as (None: ``default``), and its password.
    sample_user: str | None = None
    sample_password: str | None = None
    #: Seconds between two samples of a node's counters.
    sample_interval: float = 1.0
    #: Seconds of history kept (at least an hour by default).
    history_seconds: int = 3600
    #: Seconds a session may stay unused before it must log in again.
    session_idle_seconds: int = 8 * 3600
    #: Seconds a session lasts at most, however busy.
    session_lifetime_seconds: int = 24 * 3600
    #: Sessions kept at most (the least recently used go first), and of
    #: those the anonymous ones of an open console, which anybody makes by
    #: sending a request without a cookie.
    max_sessions: int = 10_000
    max_anonymous_sessions: int = 1_000
    #: Seconds between two checks of whether the nodes take a password.
    probe_seconds: float = 30.0
    #: Prometheus's address (``http://prometheus:9090``): the charts link to
    #: the same series there.  None: no links.
    prometheus_url: str | None = None
    #: TLS to the nodes' ``tls-port`` (the seeds are then every node's TLS
    #: address: HELLO lists plain ports), the CA that signs their
    #: certificates (None: the system's), the console's own certificate
    #: and key (for ``tls-auth-clients``), and whether to check the nodes'
    #: certificates at all.
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_verify: bool = True
    #: How much the console lowers its own CPU priority at start (``nice``).
    nice: int = 10
    #: Seconds a page of the job browser may keep calling JSCAN to fill itself.
    browse_budget: float = 0.05
    #: How many bytes of a job's body a page shows.
    body_preview_bytes: int = 64 * 1024
    #: Seconds a node that failed to answer is left alone before the next try.
    node_retry_seconds: float = 2.0
    #: Seconds to wait for a node's reply.
    node_timeout: float = 10.0


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or name to bind) only serves this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_allowed(host: str, settings: Settings) -> bool:
    """Whether an open console answers a request whose ``Host`` header is ``host``.

    A console in front of open nodes listens on loopback, where only this
    machine reaches it, but a page of any web site can still make the
    browser send it requests: it makes its own name resolve to 127.0.0.1
    (DNS rebinding) and is then the console's *own origin* for the browser,
    which lets it read pages, CSRF tokens included, and act.  Such a request
    names the attacker's host in its ``Host`` header; a browser that really
    opened the console names an address, ``localhost``, the ``--bind``
    name or one given with ``--allowed-hosts``.
    """
    host = host.strip().lower()
    if host.startswith("["):
        name = host[1:host.find("]")] if "]" in host else host[1:]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.rstrip(".")
    if not name:
        return False
    if name == "localhost" or name == settings.bind.lower().strip("[]") or name in {
            h.lower() for h in settings.allowed_hosts}:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
