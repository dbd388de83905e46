"""The connectors through Spark Connect: a client session of ``SparkSession.builder.remote``
against a Connect server started by the tests (tests/support/spark_connect.py).

With the package installed in the server's Python, source (both fetch modes)
and sink work as in a classic session. A server whose Python lacks it runs
batch reads and writes once the session adds the zip of
``python -m spark_connector.bundle`` as an artifact; streaming queries do not
(Spark starts their Python planner without the session's artifacts), which
docs/SPARK.md says, with what to install where.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from disque.client import Client
from spark_connector import bundle
from tests.support.spark_cluster import base_env, can_hide

pytestmark = pytest.mark.slow
pytest.importorskip("grpc", reason="Spark Connect needs pyspark[connect]'s dependencies "
                                   "(the 'spark' extra)")

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "spark" / "connect_app.py"


@pytest.fixture(scope="module")
def connect(tmp_path_factory) -> Iterator[str]:
    from tests.support.spark_connect import connect_server

    with connect_server(tmp_path_factory.mktemp("connect")) as url:
        yield url


def run_client(url: str, node: str, workdir: Path, *args: str,
               check: bool = True) -> subprocess.CompletedProcess:
    workdir.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, str(APP), url, node, str(workdir), *args],
                            cwd=workdir, capture_output=True, text=True, timeout=600,
                            env={**base_env(), "PYSPARK_PYTHON": sys.executable})
    if check:
        assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_source_and_sink_through_connect(connect, server, tmp_path: Path) -> None:
    node = f"127.0.0.1:{server.port}"
    result = run_client(connect, node, tmp_path)
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen == {"written": 50, "peeked": 50, "driver": 50, "executor": 30,
                    "stream_sink_started": 1, "streamed": 40}
    with Client(node) as client:
        assert client.qlen("cq") == 0
        assert int(client.info("jobs")["jobs"]["registered_jobs"]) == 40  # "streamed"


def test_a_server_without_the_package(tmp_path_factory, server, tmp_path: Path) -> None:
    if not can_hide():
        pytest.skip("needs root and unshare(1) to hide the project from the server")
    from tests.support.spark_connect import connect_server

    node = f"127.0.0.1:{server.port}"
    shipped = bundle.build(tmp_path / "disque-spark.zip")
    with connect_server(tmp_path_factory.mktemp("connect-bare"), hide=[ROOT]) as url:
        # Batch reads and writes: the session's artifact is on their path.
        result = run_client(url, node, tmp_path / "batch", "--artifacts", str(shipped),
                            "--batch-only")
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen == {"written": 50, "peeked": 50}
        # A stream: Spark plans it in a Python worker without the artifacts.
        result = run_client(url, node, tmp_path / "stream", "--artifacts", str(shipped),
                            check=False)
    assert result.returncode != 0
    assert "No module named 'spark_connector'" in result.stderr
