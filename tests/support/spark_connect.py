"""A Spark Connect server for tests, started from the pip pyspark install.

``spark-submit --class ...SparkConnectServer`` on ``local[2]``, gRPC on
127.0.0.1 with a port the kernel picks (read back from its log). With
``hide=[...]`` it runs in its own mount namespace with an empty directory
over each of those paths: a server whose Python lacks the project (the
interpreter's prefix and Spark's home stay, spark_cluster.kept).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tests.support.process import wait_for
from tests.support.spark_cluster import base_env, hiding, kill_group, spark_home

__all__ = ["connect_server"]

STARTED = re.compile(r"Spark Connect server started at: (\S+)")


@contextmanager
def connect_server(root: Path, hide: Sequence[Path] = ()) -> Iterator[str]:
    """Yield the server's ``sc://host:port``."""
    root.mkdir(parents=True, exist_ok=True)
    log = root / "connect.log"
    argv = [str(spark_home() / "bin" / "spark-submit"), "--master", "local[2]",
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.connect.grpc.binding.port=0",
            "--conf", "spark.driver.host=127.0.0.1",
            "--conf", "spark.ui.enabled=false"]
    if hide:
        argv = hiding(hide, root / "kept", argv, size="16m")
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True,
                                env={**base_env(), "PYSPARK_PYTHON": sys.executable})
    try:
        def started() -> str | None:
            text = log.read_text(errors="replace")
            if proc.poll() is not None:
                raise RuntimeError(f"the Connect server exited: {text[-3000:]}")
            found = STARTED.search(text)
            return found.group(1) if found else None

        address = wait_for(started, timeout=180, interval=0.2,
                           message=lambda: f"the Connect server: {log.read_text()[-3000:]}")
        yield f"sc://{address}"
    finally:
        kill_group(proc)
