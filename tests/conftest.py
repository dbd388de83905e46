"""Fixtures shared by all tests: real disque-server processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.process import DisqueProcess


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator:
    """Start any number of servers: ``server_factory("--requirepass", "x")``."""
    started: list[DisqueProcess] = []

    def start(*args: str, config_file: Path | None = None, name: str | None = None,
              **kwargs) -> DisqueProcess:
        workdir = tmp_path / (name or f"node{len(started)}")
        proc = DisqueProcess(workdir, *args, config_file=config_file)
        started.append(proc)
        return proc.start(**kwargs)

    yield start
    for proc in started:
        proc.kill()


@pytest.fixture
def server(server_factory) -> DisqueProcess:
    """One fresh node with default settings."""
    return server_factory()


@pytest.fixture
def r(server: DisqueProcess) -> redis.Redis:
    """A RESP2 redis-py client connected to ``server`` (bytes replies)."""
    return server.client()
