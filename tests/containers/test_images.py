"""The node image and the compose file, built and run (see conftest.py).

The node image's build leaves no untagged image. A container run as the
StatefulSet runs its pods (read-only root, the required cluster secret, the
HTTP probes on the metrics port) is ready, then drains. Three node
containers on their own bridge network find one another by a network alias
they share (service-name discovery, as compose's replicas), replicate, keep
a job across a stop/start with their AOF volume, answer the health check,
drain on ``podman stop`` (SIGTERM) losing nothing; a fourth is scaled out
(joins by itself) and in (drains, is removed, and is forgotten by the
others); ``disque-server --version`` runs through the image; the Spark
image's Python workers load compiled PySpark (no zips); compose's scaled
node service and Spark service run the example pipeline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import yaml

from disque import __version__
from tests.containers.conftest import LEFT_BEHIND, ROOT, TIMINGS, Podman, inspect
from tests.support.process import wait_for


def test_version_through_the_image(podman: Podman, node_image: str) -> None:
    for args in (["disque-server", "--version"], ["--version"]):
        result = podman("run", "--rm", node_image, *args)
        assert re.fullmatch(r"Disque server v=\S+ \(python, core: compiled \(mypyc\)\)\n",
                            result.stdout), result.stdout + result.stderr


def test_the_node_image_build_leaves_no_untagged_image(podman: Podman,
                                                      node_image: str) -> None:
    """No builder stage left behind as a dangling image (docker/Dockerfile
    has one stage; the compiler comes and goes in one layer)."""
    assert LEFT_BEHIND["Dockerfile"] == set()
    assert node_image.endswith(f":{__version__}")  # the package's version, not latest


def test_the_node_image_has_no_build_tools(podman: Podman, node_image: str) -> None:
    """gcc and the Python headers stay in the build stage (BUILD_IMAGE)."""
    result = podman("run", "--rm", "--entrypoint", "sh", node_image, "-c",
                    "command -v gcc || ls /usr/include/python3*/Python.h || echo clean",
                    check=False)
    assert result.stdout.strip() == "clean", result.stdout


def _http_status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except (urllib.error.URLError, OSError):
        return 0


def test_runs_as_the_statefulset_runs_it(podman: Podman, node_image: str) -> None:
    """deploy/kubernetes/statefulset.yaml: read-only root file system, /tmp a
    tmpfs, the data on a volume, the pod's environment (the cluster secret
    required) and its probes (HTTP GETs on the metrics port); ready, then
    drained by SIGTERM, exit 0. Without the cluster secret: exit 1."""
    kube = ROOT / "deploy" / "kubernetes"
    sts = yaml.safe_load((kube / "statefulset.yaml").read_text())
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = [f"{e['name']}={e['value']}" for e in container["env"] if "value" in e
           and e["name"] != "DISQUE_CONFIG_FILE"]  # the ConfigMap's file is mounted below
    conf = podman.name("volume", "disque-test-conf")
    configmap = yaml.safe_load((kube / "configmap.yaml").read_text())
    text = configmap["data"]["disque.conf"]
    run = ["--read-only", "--tmpfs", "/tmp", *(x for e in env for x in ("-e", e))]
    name = podman.name("container", "disque-test-nosecret")
    refused = podman("run", "--name", name, *run, "-e", "DISQUE_CONFIG_FILE=none",
                     node_image, check=False)
    assert refused.returncode == 1 and "no cluster-secret" in refused.stderr, refused.stderr
    name = podman.name("container", "disque-test-ro")
    volume = podman.name("volume", "disque-test-ro")
    podman("volume", "create", conf)
    podman("run", "--rm", "-v", f"{conf}:/etc/disque", "--user", "0", "--entrypoint", "sh",
           node_image, "-c", 'printf "%s" "$0" > /etc/disque/disque.conf', text)
    podman("run", "-d", "--name", name, *run, "-v", f"{volume}:/data",
           "-v", f"{conf}:/etc/disque:ro", "-e", "DISQUE_CONFIG_FILE=/etc/disque/disque.conf",
           "-e", "DISQUE_CLUSTER_SECRET=" + "s" * 64, "-e", "DISQUE_REQUIREPASS=pw",
           "-e", "DISQUE_PASSWORD=pw", "-p", "127.0.0.1::9711", node_image)
    ports = inspect(podman, name)["NetworkSettings"]["Ports"]["9711/tcp"]
    metrics = int(ports[0]["HostPort"])
    probes = {p: container[p]["httpGet"]["path"]
              for p in ("startupProbe", "readinessProbe", "livenessProbe")}
    wait_for(lambda: _http_status(metrics, probes["readinessProbe"]) == 200, timeout=60,
             interval=0.2, message="the pod's readiness probe to pass")
    assert _http_status(metrics, probes["livenessProbe"]) == 200
    assert "(hidden)" in podman("logs", name).stderr and "s" * 64 not in \
        podman("logs", name).stderr
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


#: The service's name on the test's network (compose gives every replica its
#: service's name as a network alias).
SERVICE = "disque"


@dataclass
class Service:
    podman: Podman
    image: str
    network: str

    def run(self, node: NodeContainer) -> NodeContainer:
        """A replica: the service's alias, discovery by it, times shortened."""
        env = ["-e", "DISQUE_APPENDONLY=yes", "-e", "DISQUE_CLUSTER_NODE_TIMEOUT=3000",
               "-e", f"DISQUE_CLUSTER_DISCOVERY={SERVICE}:7711",
               "-e", "DISQUE_CLUSTER_DISCOVERY_INTERVAL=1",
               "-e", "DISQUE_CLUSTER_DISCOVERY_FORGET_TIME=3"]
        self.podman("run", "-d", "--init", "--name", node.name, "--hostname", node.name,
                    "--network", self.network, "--network-alias", SERVICE,
                    "-p", "127.0.0.1::7711", "-v", f"{node.volume}:/data", *env, self.image)
        node.port = _published_port(self.podman, node.name)
        return node


@pytest.fixture(scope="module")
def service(podman: Podman, node_image: str) -> Iterator[Service]:
    network = podman.name("network", "disque-test-net")
    podman("network", "create", network)
    yield Service(podman, node_image, network)
    podman("network", "rm", "-f", network, check=False)


@pytest.fixture(scope="module")
def cluster(podman: Podman, service: Service) -> Iterator[list[NodeContainer]]:
    """Three node containers on a bridge network of their own, told nothing
    but the service's name (cluster-discovery), as compose.yaml's replicas."""
    nodes = [NodeContainer(podman.name("container", f"disque-test-n{i}"),
                           podman.name("volume", f"disque-test-data{i}")) for i in range(3)]
    started = time.monotonic()
    for node in nodes:
        service.run(node)
    for node in nodes:
        wait_for(lambda node=node: _answers(node), timeout=60, interval=0.2,
                 message=f"{node.name} to answer on 127.0.0.1:{node.port}")
    wait_for(lambda: all(_reachable(n) == 2 for n in nodes), timeout=60, interval=0.2,
             message=lambda: "the three containers to join: " + "; ".join(
                 podman("logs", n.name, check=False).stderr[-600:] for n in nodes))
    TIMINGS["three containers up and joined"] = time.monotonic() - started
    yield nodes
    for node in nodes:
        podman("rm", "-f", "-t", "0", node.name, check=False)
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
    _collect([b, c], "drained", ids)
    podman("start", a.name)
    a.port = _published_port(podman, a.name)
    wait_for(lambda: _answers(a), timeout=60, interval=0.2, message="the node back")
    assert a.client().execute_command("CLUSTER", "LEAVING") == b"no"
    wait_for(lambda: all(_reachable(n) == 2 for n in cluster), timeout=60, interval=0.2,
             message="the node to rejoin")


def test_scale_out_and_in(podman: Podman, service: Service,
                          cluster: list[NodeContainer]) -> None:
    """A fourth replica joins by the service's name alone; scaled in, it
    drains its jobs to the others on SIGTERM, and once removed (gone from
    the name's answer) the others forget it by themselves."""
    fourth = service.run(NodeContainer(podman.name("container", "disque-test-n3"),
                                       podman.name("volume", "disque-test-data3")))
    everyone = [*cluster, fourth]
    started = time.monotonic()
    wait_for(lambda: _answers(fourth), timeout=60, interval=0.2, message="the fourth up")
    wait_for(lambda: all(_reachable(n) == 3 for n in everyone), timeout=60, interval=0.2,
             message="the fourth replica to join")
    TIMINGS["scale out: fourth replica joined"] = time.monotonic() - started
    fourth_id = fourth.client().execute_command("CLUSTER", "MYID").decode()
    ids = {fourth.client().execute_command("ADDJOB", "scaled", f"job{i}", 5000, "REPLICATE", 1,
                                           "RETRY", 300) for i in range(50)}
    podman("stop", "-t", "30", fourth.name)
    logs = podman("logs", fourth.name).stderr + podman("logs", fourth.name).stdout
    assert "Drain: drained in" in logs and "50 jobs handed over" in logs, logs[-2000:]
    podman("rm", fourth.name)
    started = time.monotonic()
    wait_for(lambda: all(fourth_id not in n.client().execute_command("CLUSTER", "NODES")
                         .decode() for n in cluster), timeout=60, interval=0.2,
             message="the others to forget the removed replica")
    TIMINGS["scale in: removed replica forgotten"] = time.monotonic() - started
    _collect(cluster, "scaled", ids)


def _collect(nodes: list[NodeContainer], queue: str, ids: set[bytes]) -> None:
    """Fetch and acknowledge ``ids`` from ``queue`` on ``nodes``, every one.

    Polled with a deadline: a GETJOB may federate, and the jobs it pulls
    from a peer are queued here after its NOHANG reply went out."""
    got: set[bytes] = set()

    def fetch() -> bool:
        for node in nodes:
            client = node.client()
            while reply := client.execute_command("GETJOB", "NOHANG", "COUNT", 100,
                                                  "FROM", queue):
                for _queue, job_id, _body in reply:
                    got.add(job_id)
                    client.execute_command("ACKJOB", job_id)
        return got >= ids
    wait_for(fetch, timeout=30, interval=0.2,
             message=lambda: str({job_id: [_shown(n, job_id) for n in nodes]
                                  for job_id in ids - got}))
    assert got == ids


def _shown(node: NodeContainer, job_id: bytes) -> dict[str, object] | None:
    """SHOW's fields that say where a job is, for a failure's message."""
    shown = node.client().execute_command("SHOW", job_id)
    if shown is None:
        return None
    fields = dict(zip(shown[::2], shown[1::2], strict=True))
    wanted = (b"state", b"nodes-delivered", b"nodes-confirmed", b"next-requeue-within")
    return {k.decode(): fields.get(k) for k in wanted}


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
        replicas = load_compose_scale()
        spark = f"{project}_spark_1"
        waited = podman("wait", spark, timeout=900)
        TIMINGS["compose: up to the pipeline's end"] = time.monotonic() - started
        logs = podman("logs", spark)
        output = logs.stdout + logs.stderr
        assert waited.stdout.strip() == "0", output[-4000:]
        written = int(re.search(r"wrote (\d+) jobs to queue 'orders'", output).group(1))
        fetched = [int(n) for n in re.findall(r"^node \S+: fetched (\d+)$", output, re.M)]
        assert len(fetched) == replicas and sum(fetched) == written, output[-4000:]
        names = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                       "--format", "{{.Names}}").stdout.split()
        assert not [n for n in names if "prometheus" in n or "grafana" in n]
        for name in names:  # published on the loopback only, on free ports
            for bindings in (inspect(podman, name)["NetworkSettings"]["Ports"] or {}).values():
                assert all(b["HostIp"] == "127.0.0.1" for b in bindings or [])
    finally:
        # The replicas' anonymous /data volumes (compose's down -v removes
        # the named ones only).
        anonymous = set()
        names = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                       "--format", "{{.Names}}", check=False).stdout.split()
        for name in names:
            for mount in inspect(podman, name).get("Mounts") or []:
                if mount.get("Type") == "volume" and mount.get("Destination") == "/data":
                    anonymous.add(mount["Name"])
        down = run("down", "-v", "-t", "30")
        for volume in anonymous:
            podman("volume", "rm", "-f", volume, check=False)
        leftovers = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                           "--format", "{{.Names}}", check=False).stdout.split()
        assert down.returncode == 0 and not leftovers, down.stderr[-2000:]


def load_compose_scale() -> int:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    return int(compose["services"]["disque"]["scale"])
