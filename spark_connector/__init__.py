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
    """Make ``format("disque")`` known to this session (idempotent).

    Where the installed ``pyspark_disque`` module already made the name
    known (Spark's lookup of ``pyspark_*`` modules), nothing is done:
    registering again would only make Spark warn that the session's source
    replaced the static one.  A Spark Connect session always registers
    (its server decides, and logs there).
    """
    if not _known(spark, DisqueDataSource.name()):
        spark.dataSource.register(DisqueDataSource)


def _known(spark: SparkSession, name: str) -> bool:
    """Is ``name`` a data source this (classic) session knows already?"""
    session = getattr(spark, "_jsparkSession", None)
    if session is None:  # Spark Connect: no JVM on this side
        return False
    return bool(session.sessionState().dataSourceManager().dataSourceExists(name))
