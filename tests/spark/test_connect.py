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
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from disque.client import Client
from spark_connector import bundle
from tests.support.process import free_port, wait_for
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
        # start() returns an active query; awaitTermination() raises.
        result = run_client(url, node, tmp_path / "stream", "--artifacts", str(shipped),
                            check=False)
    assert result.returncode == 3, result.stderr[-4000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["failed"] == "driver" and seen["failed_at"] == "awaitTermination"
    assert seen["active_after_start"] == 1
    assert "No module named 'spark_connector'" in seen["error"]
    with Client(node) as client:  # the failed stream took no job: all still queued
        assert client.qlen("cq") == 100  # both batch writes' 50


def test_the_docs_connect_server_recipe(server, tmp_path: Path) -> None:
    """docs/SPARK.md's commands that start (and stop) a Connect server from the
    pip PySpark, run as written but for the port (a free one) and loopback."""
    text = (ROOT / "docs" / "SPARK.md").read_text()
    start = text.rindex("```bash", 0, text.index("sbin/start-connect-server.sh"))
    block = text[start + len("```bash"):]
    lines = [line.strip() for line in block[:block.index("```")].strip().splitlines()]
    comment = next(i for i, line in enumerate(lines) if line.startswith("#"))
    port = free_port()
    launch = "\n".join(lines[:comment]).replace("15002", str(port)) + (
        " --conf spark.connect.grpc.binding.address=127.0.0.1"
        " --conf spark.driver.host=127.0.0.1 --conf spark.ui.enabled=false")
    stop = "\n".join([lines[0], *lines[comment + 1:]])
    env = {**base_env(), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    del env["SPARK_HOME"], env["SPARK_NO_DAEMONIZE"]  # the recipe finds it; a daemon
    logs = tmp_path / "connect-logs"

    def log_text() -> str:
        return "".join(p.read_text(errors="replace") for p in logs.glob("*.out"))

    subprocess.run(["bash", "-c", launch], cwd=tmp_path, env=env, check=True, timeout=120)
    try:
        wait_for(lambda: "Spark Connect server started" in log_text(), timeout=180,
                 interval=0.2, message=lambda: "the Connect server: " + log_text()[-3000:])
        result = run_client(f"sc://localhost:{port}", f"127.0.0.1:{server.port}",
                            tmp_path / "client", "--batch-only")
        seen = json.loads(result.stdout.strip().splitlines()[-1])
        assert seen == {"written": 50, "peeked": 50}
    finally:
        subprocess.run(["bash", "-c", stop], cwd=tmp_path, env=env, timeout=120)
    assert not list((tmp_path / "connect-pids").glob("*.pid"))
