"""Fixtures shared by all tests: real disque-server processes on loopback."""

from __future__ import annotations

import os
import sys
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


@pytest.fixture(scope="session")
def spark() -> Iterator:
    """One local Spark session (local[2]) for the whole run, connector registered.

    Starting Spark costs ~5 s, so the session is shared; every test uses its
    own queues, checkpoint and staging directories so tests stay independent.
    """
    pytest.importorskip("pyspark", reason="needs the 'spark' extra: pip install -e '.[spark]'")
    from spark_connector.session import local_session

    # Spark's Python workers must run the interpreter that has this package.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = local_session("disque-connector-tests", "local[2]", {
        "spark.sql.streaming.pollingDelay": "50ms",
        "spark.driver.memory": "1g",
    })
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    from tests.support.process import free_port

    return free_port()
