"""The console's options, parsed once into one frozen value."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Settings", "is_loopback"]


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
    #: The user the sampler reads INFO as (None: ``default``), and its password.
    sample_user: str | None = None
    sample_password: str | None = None
    #: Seconds between two samples of a node's counters.
    sample_interval: float = 1.0
    #: Seconds of history kept (at least an hour by default).
    history_seconds: int = 3600
    #: Seconds a session may stay unused before it must log in again.
    session_idle_seconds: int = 8 * 3600
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
