"""Fixtures for the client tests: real servers, and clients connected to them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from disque import Client
from tests.support.process import DisqueProcess


def address(proc: DisqueProcess) -> str:
    return f"127.0.0.1:{proc.port}"


def last_command_of_others(server: DisqueProcess) -> list[str]:
    """The last command of every other client connection (CLIENT LIST's cmd=):
    which command a client call really sent."""
    listing = server.client().execute_command("CLIENT", "LIST").decode().splitlines()
    return [field.split("=", 1)[1] for line in listing for field in line.split()
            if field.startswith("cmd=") and "cmd=client" not in line]


def fake_job_id(node_prefix: str = "00000000", tail: str = "0001") -> str:
    """A well-formed job ID no node created (for NOJOB / affinity tests)."""
    return f"D-{node_prefix}-{'A' * 24}-{tail}"


@pytest.fixture
def client(server: DisqueProcess) -> Iterator[Client]:
    """A Client on ``server`` with short limits so failures show quickly."""
    c = Client(address(server), socket_timeout=10, reconnect_timeout=5)
    yield c
    c.close()
