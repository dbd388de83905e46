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
