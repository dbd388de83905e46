"""What every example needs: a quiet local Spark session with the connector."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_NODES = "127.0.0.1:7711"


def spark_session(app_name: str, master: str = "local[2]") -> SparkSession:
    """A local Spark session with the connector (Python workers use this interpreter)."""
    from spark_connector.session import local_session

    return local_session(app_name, master, {"spark.sql.shuffle.partitions": "4"})
