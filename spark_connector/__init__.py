"""Spark connectors for Disque, on PySpark's Python Data Source API.

    import spark_connector
    spark_connector.register(spark)          # or rely on the installed short name
    jobs = (spark.readStream.format("disque")
            .option("nodes", "127.0.0.1:7711").option("queues", "events")
            .option("stagingPath", "/data/staging/events-query")
            .load())

See docs/SPARK.md for the options and the delivery guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .options import OptionError
from .source import DisqueDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DisqueDataSource", "OptionError", "register"]


def register(spark: SparkSession) -> None:
    """Register ``format("disque")`` on this session (idempotent)."""
    spark.dataSource.register(DisqueDataSource)
