"""Helpers the sink's tests share (tests/spark/test_sink*.py)."""

from __future__ import annotations

from pyspark.sql.types import StringType, StructField, StructType

from disque.client import Client
from spark_connector.sink_options import SinkConfig

BODY_ONLY = StructType([StructField("body", StringType())])


def config_for(port: int, schema: StructType = BODY_ONLY, **options: str) -> SinkConfig:
    """The sink's options for one node on ``port``, checked against ``schema``."""
    return SinkConfig.from_options({"nodes": f"127.0.0.1:{port}", **options}, schema)


def drain(client: Client, queue: str) -> list[bytes]:
    """Every body queued in ``queue`` (the jobs are acked)."""
    bodies = []
    while jobs := client.get_jobs(queue, count=1000, nohang=True):
        bodies += [job.body for job in jobs]
        client.ack(*(job.id for job in jobs))
    return bodies
