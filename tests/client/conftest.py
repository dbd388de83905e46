"""Fixtures for the client tests: real servers, and clients connected to them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from disque import Client
from tests.support.process import DisqueProcess


def address(proc: DisqueProcess) -> str:
    return f"127.0.0.1:{proc.port}"


def fake_job_id(node_prefix: str = "00000000", tail: str = "0001") -> str:
    """A well-formed job ID no node created (for NOJOB / affinity tests)."""
    return f"D-{node_prefix}-{'A' * 24}-{tail}"


@pytest.fixture
def client(server: DisqueProcess) -> Iterator[Client]:
    """A Client on ``server`` with short limits so failures show quickly."""
    c = Client(address(server), socket_timeout=10, reconnect_timeout=5)
    yield c
    c.close()
