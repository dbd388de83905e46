"""Spark connector tests: skipped as a whole without the 'spark' extra.

The ``spark`` session fixture and ``unused_port`` live in tests/conftest.py
(the example-pipeline tests use them too).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="the Spark connector tests need the 'spark' extra: pip install -e '.[spark]'")

from disque.client import Client  # noqa: E402  (after the skip: the client needs no Spark)
from tests.support.cluster import ReferenceProcess, reference_server  # noqa: E402


@pytest.fixture
def disque(server) -> Iterator[Client]:
    """A client of the ``server`` fixture's node."""
    client = Client(f"127.0.0.1:{server.port}")
    yield client
    client.close()


@pytest.fixture
def original(tmp_path) -> Iterator[ReferenceProcess]:
    """A lone original node (DISQUE_REFERENCE_SERVER): the connectors' fallbacks."""
    if reference_server() is None:
        pytest.skip("the original disque-server is not available: set DISQUE_REFERENCE_SERVER "
                    "to its binary to test the connectors against it")
    node = ReferenceProcess(tmp_path / "original").start()
    yield node
    node.kill()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator:
    """One moto_server (a real S3-compatible server) for the session's staging tests."""
    pytest.importorskip("moto", reason="the S3 staging tests need moto[server] (the dev extra)")
    from tests.support.s3 import moto_server

    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch):
    """``s3_server`` seen through the standard environment, and a fresh bucket."""
    import uuid

    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    name = f"test-{uuid.uuid4().hex}"
    s3_server.bucket(name)
    s3_server.bucket_name = name
    return s3_server
