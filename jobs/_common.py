"""What every example needs: a quiet local Spark session with the connector."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_NODES = "127.0.0.1:7711"


def spark_session(app_name: str, master: str = "local[2]") -> SparkSession:
    """A Spark session whose Python workers run this interpreter.

    PYSPARK_PYTHON must name an interpreter that has ``spark_connector``
    installed; when it is not set, the one running this script does.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_connector

    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_connector.register(spark)
    return spark
