"""The node image and the compose file, built and run (see conftest.py).

Three node containers on their own bridge network join, replicate, keep a
job across a stop/start with their AOF volume, answer the health check,
drain on ``podman stop`` (SIGTERM) losing nothing; ``disque-server
--version`` runs through the image; the Spark image's Python workers load
compiled PySpark (no zips); compose's nodes and Spark service run the
example pipeline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.containers.conftest import ROOT, TIMINGS, Podman, inspect
from tests.support.process import wait_for


def test_version_through_the_image(podman: Podman, node_image: str) -> None:
    for args in (["disque-server", "--version"], ["--version"]):
        result = podman("run", "--rm", node_image, *args)
        assert re.fullmatch(r"Disque server v=\S+ \(python, core: compiled \(mypyc\)\)\n",
                            result.stdout), result.stdout + result.stderr


def test_the_node_image_has_no_build_tools(podman: Podman, node_image: str) -> None:
    """gcc and the Python headers stay in the build stage (BUILD_IMAGE)."""
    result = podman("run", "--rm", "--entrypoint", "sh", node_image, "-c",
                    "command -v gcc || ls /usr/include/python3*/Python.h || echo clean",
                    check=False)
    assert result.stdout.strip() == "clean", result.stdout


def test_runs_as_the_statefulset_runs_it(podman: Podman, node_image: str) -> None:
    """deploy/kubernetes/statefulset.yaml: read-only root file system, /tmp a
    tmpfs, the data on a volume; ready, then drained by SIGTERM, exit 0."""
    name = podman.name("container", "disque-test-ro")
    volume = podman.name("volume", "disque-test-ro")
    podman("run", "-d", "--name", name, "--read-only", "--tmpfs", "/tmp", "-v",
           f"{volume}:/data", "-e", "DISQUE_APPENDONLY=yes", node_image)
    wait_for(lambda: podman("exec", name, "disque-entrypoint", "ready",
                            check=False).returncode == 0,
             timeout=60, interval=0.2, message="the node to be ready")
    podman("stop", "-t", "30", name)
    assert inspect(podman, name)["State"]["ExitCode"] == 0
    assert "Drain: drained in" in podman("logs", name).stdout
    podman("rm", name)
    assert "appendonly.aof" in podman("run", "--rm", "-v", f"{volume}:/data", node_image,
                                      "ls", "/data").stdout


@dataclass
class NodeContainer:
    name: str
    volume: str
    port: int = 0  # published on 127.0.0.1

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=2, socket_timeout=20)


def _published_port(podman: Podman, name: str) -> int:
    ports = inspect(podman, name)["NetworkSettings"]["Ports"]["7711/tcp"]
    (entry,) = ports
    assert entry["HostIp"] == "127.0.0.1"
    return int(entry["HostPort"])


def _answers(node: NodeContainer) -> bool:
    try:
        return bool(node.client().ping())
    except (redis.RedisError, OSError):
        return False


def _reachable(node: NodeContainer) -> int:
    info = node.client().execute_command("CLUSTER", "INFO").decode()
    return int(re.search(r"cluster_reachable_nodes:(\d+)", info).group(1))


@pytest.fixture(scope="module")
def cluster(podman: Podman, node_image: str) -> Iterator[list[NodeContainer]]:
    """Three node containers on a bridge network of their own; the second and
    third join the first by name (DISQUE_JOIN), as in compose.yaml."""
    network = podman.name("network", "disque-test-net")
    podman("network", "create", network)
    nodes = [NodeContainer(podman.name("container", f"disque-test-n{i}"),
                           podman.name("volume", f"disque-test-data{i}")) for i in range(3)]
    started = time.monotonic()
    for i, node in enumerate(nodes):
        env = ["-e", "DISQUE_APPENDONLY=yes", "-e", "DISQUE_CLUSTER_NODE_TIMEOUT=3000"]
        if i:
            env += ["-e", f"DISQUE_JOIN={nodes[0].name}:7711", "-e", "DISQUE_JOIN_INTERVAL=1"]
        podman("run", "-d", "--init", "--name", node.name, "--hostname", node.name,
               "--network", network, "-p", "127.0.0.1::7711", "-v", f"{node.volume}:/data",
               *env, node_image)
        node.port = _published_port(podman, node.name)
    for node in nodes:
        wait_for(lambda node=node: _answers(node), timeout=60, interval=0.2,
                 message=f"{node.name} to answer on 127.0.0.1:{node.port}")
    wait_for(lambda: all(_reachable(n) == 2 for n in nodes), timeout=60, interval=0.2,
             message="the three containers to join")
    TIMINGS["three containers up and joined"] = time.monotonic() - started
    yield nodes
    for node in nodes:
        podman("rm", "-f", "-t", "0", node.name, check=False)
    podman("network", "rm", "-f", network, check=False)
    for node in nodes:
        podman("volume", "rm", "-f", node.volume, check=False)


def test_join_and_replication(cluster: list[NodeContainer]) -> None:
    a, b, c = cluster
    job_id = a.client().execute_command("ADDJOB", "repl", "body", 5000, "REPLICATE", 3)
    for node in (b, c):
        shown = node.client().execute_command("SHOW", job_id)
        assert shown is not None, node.name
    job = b.client().execute_command("GETJOB", "FROM", "repl")
    assert job[0][1] == job_id
    assert b.client().execute_command("ACKJOB", job_id) == 1


def test_health_check(podman: Podman, cluster: list[NodeContainer]) -> None:
    config = inspect(podman, cluster[0].name)["Config"]
    assert config["Healthcheck"]["Test"] == ["CMD", "disque-entrypoint", "healthcheck"]
    result = podman("healthcheck", "run", cluster[0].name, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_stop_start_keeps_jobs_in_the_aof_volume(podman: Podman,
                                                cluster: list[NodeContainer]) -> None:
    """A delivered job (not queued: nothing to hand over) is in the node's
    AOF on its volume, and back after a stop and start of the container."""
    node = cluster[2]
    job_id = node.client().execute_command("ADDJOB", "kept", "body", 5000, "REPLICATE", 1,
                                           "RETRY", 300)
    assert node.client().execute_command("GETJOB", "FROM", "kept")[0][1] == job_id
    node_id = node.client().execute_command("CLUSTER", "MYID")
    podman("stop", "-t", "30", node.name)
    assert inspect(podman, node.name)["State"]["ExitCode"] == 0
    podman("start", node.name)
    node.port = _published_port(podman, node.name)  # a new ephemeral port
    wait_for(lambda: _answers(node), timeout=60, interval=0.2, message="the node back")
    assert node.client().execute_command("CLUSTER", "MYID") == node_id
    assert node.client().execute_command("SHOW", job_id) is not None
    wait_for(lambda: all(_reachable(n) == 2 for n in cluster), timeout=60, interval=0.2,
             message="the node to rejoin")
    assert node.client().execute_command("FASTACK", job_id) == 1


def test_podman_stop_drains_losing_nothing(podman: Podman,
                                           cluster: list[NodeContainer]) -> None:
    """podman stop sends SIGTERM: the node's queued jobs (their only copies)
    move to the other two, it exits 0, and it comes back not leaving."""
    a, b, c = cluster
    ids = {a.client().execute_command("ADDJOB", "drained", f"job{i}", 5000, "REPLICATE", 1,
                                      "RETRY", 300) for i in range(200)}
    started = time.monotonic()
    podman("stop", "-t", "30", a.name)
    TIMINGS["podman stop (drain of 200 jobs)"] = time.monotonic() - started
    state = inspect(podman, a.name)["State"]
    assert state["ExitCode"] == 0
    logs = podman("logs", a.name).stdout + podman("logs", a.name).stderr
    assert "Drain: drained in" in logs and "200 jobs handed over" in logs, logs[-2000:]
    got = set()
    for node in (b, c):
        client = node.client()
        while reply := client.execute_command("GETJOB", "NOHANG", "COUNT", 100,
                                              "FROM", "drained"):
            for _queue, job_id, _body in reply:
                got.add(job_id)
                client.execute_command("ACKJOB", job_id)
    assert got == ids
    podman("start", a.name)
    a.port = _published_port(podman, a.name)
    wait_for(lambda: _answers(a), timeout=60, interval=0.2, message="the node back")
    assert a.client().execute_command("CLUSTER", "LEAVING") == b"no"
    wait_for(lambda: all(_reachable(n) == 2 for n in cluster), timeout=60, interval=0.2,
             message="the node to rejoin")


def test_spark_python_processes_load_compiled_pyspark(podman: Podman, spark_image: str) -> None:
    """The Spark image has no pyspark.zip: Spark still names it first on its
    Python workers' path, which then import the venv's PySpark and its
    bytecode instead of compiling the zip's modules again in every process."""
    script = (
        "import importlib.util, os\n"
        "from spark_connector.session import local_session\n"
        "spark = local_session('zips', 'local[1]')\n"
        "def where(_):\n"
        "    import sys, pyspark.sql.dataframe as m\n"
        "    return (m.__file__, os.path.exists(importlib.util.cache_from_source(m.__file__)),\n"
        "            [p for p in sys.path if p.endswith('.zip')])\n"
        "print('WORKER', *spark.sparkContext.parallelize([0], 1).map(where).collect()[0],\n"
        "      sep='|')\n")
    listed = podman("run", "--rm", spark_image, "python", "-m", "spark_connector.pyspark_zips")
    assert "no zips under python/lib" in listed.stdout, listed.stdout + listed.stderr
    name = podman.name("container", "disque-test-zips")
    result = podman("run", "--rm", "--name", name, spark_image, "python", "-c", script,
                    timeout=600)
    line = next((x for x in result.stdout.splitlines() if x.startswith("WORKER|")), None)
    assert line is not None, result.stdout[-3000:] + result.stderr[-3000:]
    _, module, cached, zips_on_path = line.split("|")
    assert module.startswith("/opt/venv/lib/") and ".zip" not in module, line
    assert cached == "True", line
    # Spark's entry for the zip is still there, pointing at nothing.
    assert "pyspark.zip" in zips_on_path, line


# --------------------------------------------------------------------------
# compose.yaml
# --------------------------------------------------------------------------

def test_compose_runs_the_example_pipeline(podman: Podman, node_image: str,
                                           spark_image: str) -> None:
    """The compose file as it is: its nodes and its Spark service run the
    pipeline (monitoring is a profile, not started). Host ports: free ones."""
    project = f"disque-test-{os.getpid()}"
    program = shutil.which("podman-compose", path=f"{Path(sys.executable).parent}:"
                                                  f"{os.environ.get('PATH', '')}")
    assert program, "podman-compose is not installed (the 'dev' extra has it)"
    compose = [program, "-p", project, "-f", str(ROOT / "docker" / "compose.yaml")]
    env = {**podman.env, "DISQUE1_PORT": "", "DISQUE2_PORT": "", "DISQUE3_PORT": ""}

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*compose, *args], capture_output=True, text=True,
                              timeout=timeout, env=env)

    started = time.monotonic()
    try:
        up = run("up", "-d")
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        spark = f"{project}_spark_1"
        waited = podman("wait", spark, timeout=900)
        TIMINGS["compose: up to the pipeline's end"] = time.monotonic() - started
        logs = podman("logs", spark)
        output = logs.stdout + logs.stderr
        assert waited.stdout.strip() == "0", output[-4000:]
        written = int(re.search(r"wrote (\d+) jobs to queue 'orders'", output).group(1))
        fetched = [int(n) for n in re.findall(r"^node \S+: fetched (\d+)$", output, re.M)]
        assert len(fetched) == 3 and sum(fetched) == written, output[-4000:]
        names = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                       "--format", "{{.Names}}").stdout.split()
        assert not [n for n in names if "prometheus" in n or "grafana" in n]
        for name in names:  # published on the loopback only, on free ports
            for bindings in (inspect(podman, name)["NetworkSettings"]["Ports"] or {}).values():
                assert all(b["HostIp"] == "127.0.0.1" for b in bindings or [])
    finally:
        down = run("down", "-v", "-t", "30")
        leftovers = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                           "--format", "{{.Names}}", check=False).stdout.split()
        assert down.returncode == 0 and not leftovers, down.stderr[-2000:]
