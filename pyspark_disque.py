"""Lets Spark find the Disque data source by its short name, ``format("disque")``.

PySpark looks for installed top-level modules named ``pyspark_*`` that define
``DefaultSource`` and registers them under ``DefaultSource.name()``.
"""

from spark_connector.source import DisqueDataSource as DefaultSource

__all__ = ["DefaultSource"]
