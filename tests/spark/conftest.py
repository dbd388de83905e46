"""One local Spark session (local[2]) for the whole run, plus real Disque nodes.

Starting Spark costs ~5 s, so the session is shared; every test uses its own
queues, checkpoint and staging directories so tests stay independent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip(
    "pyspark", reason="the Spark connector tests need the 'spark' extra: pip install -e '.[spark]'")


def spark_conf_env() -> None:
    # Spark's Python workers must run the interpreter that has this package.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from pyspark.sql import SparkSession

    import spark_connector

    spark_conf_env()
    session = (SparkSession.builder.master("local[2]")
               .appName("disque-connector-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.pollingDelay", "50ms")
               .config("spark.driver.memory", "1g")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    spark_connector.register(session)
    yield session
    for query in session.streams.active:
        query.stop()
    session.stop()


@pytest.fixture
def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
