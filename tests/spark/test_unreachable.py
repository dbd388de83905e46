"""One rule for a node that cannot be reached, source and sink alike.

Both try it again for ``reconnectTimeout`` (a restarting node is waited
for), then give up with an error that names the node and the option.
"""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from disque.client import Client
from spark_connector.options import OptionError, SourceConfig
from spark_connector.sink_options import SinkConfig
from spark_connector.topology import check_reachable
from spark_connector.writer import DisqueWriteError, PartitionWriter

BODY_ONLY = StructType([StructField("body", StringType())])


def reach(side: str, nodes: str, reconnect_timeout: str) -> None:
    """What each side does first with its nodes."""
    if side == "source":
        check_reachable(SourceConfig.from_options(
            {"queues": "q", "nodes": nodes, "reconnectTimeout": reconnect_timeout},
            streaming=False))
    else:
        config = SinkConfig.from_options(
            {"queue": "q", "nodes": nodes, "reconnectTimeout": reconnect_timeout}, BODY_ONLY)
        PartitionWriter(config, 0).write(iter([pa.record_batch({"body": ["a", "b"]})]))


@pytest.mark.parametrize("side", ["source", "sink"])
def test_unreachable_node_is_given_up_after_reconnect_timeout(unused_port: int,
                                                              side: str) -> None:
    nodes = f"127.0.0.1:{unused_port}"
    began = time.monotonic()
    with pytest.raises((OptionError, DisqueWriteError)) as info:
        reach(side, nodes, "1s")
    elapsed = time.monotonic() - began
    assert 1.0 <= elapsed < 5.0, elapsed
    message = str(info.value)
    assert nodes in message and "reconnectTimeout" in message, message


@pytest.mark.parametrize("side", ["source", "sink"])
def test_node_that_starts_within_reconnect_timeout_is_used(server_factory, unused_port: int,
                                                           side: str) -> None:
    started: list = []
    timer = threading.Timer(1.0, lambda: started.append(server_factory(port=unused_port)))
    timer.start()
    try:
        reach(side, f"127.0.0.1:{unused_port}", "30s")
    finally:
        timer.join()
    assert started
    if side == "sink":
        with Client(f"127.0.0.1:{unused_port}") as client:
            assert client.qlen("q") == 2


def test_reconnect_timeout_option() -> None:
    config = SourceConfig.from_options({"queues": "q"}, streaming=False)
    assert config.connection.reconnect_timeout_s == 10.0  # the Python client's default
    sink = SinkConfig.from_options({"queue": "q", "reconnectTimeout": "250ms"}, BODY_ONLY)
    assert sink.connection.reconnect_timeout_s == 0.25
    with pytest.raises(OptionError, match="option 'reconnectTimeout' must be a duration"):
        SourceConfig.from_options({"queues": "q", "reconnectTimeout": "soon"}, streaming=False)

