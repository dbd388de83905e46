"""A local Spark session ready for the connector: for examples, tests and benchmarks."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session"]

#: Quiet, UI-less defaults for a session on one machine.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
}


def local_session(app_name: str, master: str = "local[2]",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A Spark session whose Python workers run this interpreter, ``disque`` registered.

    Spark's Python workers must find ``spark_connector``: unless
    ``PYSPARK_PYTHON`` is set, they run the interpreter running this code.
    ``conf`` adds or overrides Spark settings.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        # One machine: the driver listens on loopback, not on the address
        # the host name resolves to (Spark's choice otherwise).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from . import register

    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in {**LOCAL_DEFAULTS, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
