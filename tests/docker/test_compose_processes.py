"""docker/compose.yaml's topology run as processes, where no container engine exists.

The node service's replicas start from docker/entrypoint.sh with the compose
file's own environment, each on its own loopback address and the same port,
as containers on a compose network are; the service's name is the test's
DNS (tests/deploy/dns.py: each replica's /etc/hosts lists every replica's
address, as the network's DNS does), so cluster-discovery joins them by
themselves. Then the spark service's command runs, as compose would run it,
given one replica (the others come from HELLO): the example producer and the
streaming aggregation.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy import dns
from tests.docker.test_docker_files import (
    NODE,
    ROOT,
    Node,
    entrypoint_env,
    load_compose,
)
from tests.support.metrics import Samples, value
from tests.support.process import port_free_on, wait_for


def reachable(address: str, port: int) -> int:
    return _field(_command(address, port, "CLUSTER", "INFO"), "cluster_reachable_nodes")


def _command(address: str, port: int, *args: object) -> Any:
    import redis
    with redis.Redis(host=address, port=port, protocol=2, socket_timeout=10) as client:
        return client.execute_command(*args)


def _field(info: bytes | dict[str, Any], name: str) -> int:
    """A field of INFO or CLUSTER INFO (redis-py parses INFO into a dict)."""
    if isinstance(info, dict):
        return int(info[name])
    match = re.search(rf"{name}:(\d+)", info.decode())
    assert match, info
    return int(match.group(1))


def qlen_and_registered(address: str, port: int, queue: str) -> tuple[int, int]:
    registered = _field(_command(address, port, "INFO", "jobs"), "registered_jobs")
    return int(_command(address, port, "QLEN", queue)), registered


def scrape(address: str, port: int) -> Samples:
    """Every sample of a replica's /metrics, as Prometheus reads them."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://{address}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.mark.slow
def test_compose_topology_as_processes_runs_the_example_pipelines(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark service's jobs need the 'spark' extra")
    why = dns.unavailable()
    if why:
        pytest.skip(f"the replicas' DNS is the test's /etc/hosts: {why}")
    services = load_compose()["services"]
    node = services[NODE]
    addresses = [f"127.0.0.{20 + i}" for i in range(node["scale"])]
    port = port_free_on(addresses)
    metrics_port = port_free_on(addresses)
    hosts = tmp_path / "hosts"
    dns.publish(hosts, NODE, addresses)
    environment = dict(node["environment"])
    name, _, service_port = environment["DISQUE_CLUSTER_DISCOVERY"].partition(":")
    assert (name, service_port) == (NODE, "7711")
    assert environment["DISQUE_METRICS_PORT"]  # what prometheus.yml scrapes
    started: list[Node] = []
    try:
        for i, address in enumerate(addresses):
            env = {**environment, "DISQUE_CONFIG_FILE": "none", "DISQUE_BIND": address,
                   "DISQUE_LOCAL_HOST": address, "DISQUE_PORT": str(port),
                   "DISQUE_CLUSTER_DISCOVERY": f"{NODE}:{port}",
                   "DISQUE_CLUSTER_DISCOVERY_INTERVAL": "1",
                   "DISQUE_METRICS_PORT": str(metrics_port), "DISQUE_METRICS_BIND": address,
                   "DISQUE_DATA_DIR": str(tmp_path / f"replica{i}")}
            replica = Node(tmp_path / f"replica{i}.log", (), entrypoint_env(**env),
                           wrap=lambda command: dns.in_dns(command, hosts))
            started.append(replica.wait_ready())
            # The service's health check, as compose runs it (depends_on:
            # service_healthy holds spark until it passes).
            check = subprocess.run(
                ["sh", str(ROOT / "docker" / "entrypoint.sh"), "healthcheck"],
                env=entrypoint_env(DISQUE_CONFIG_FILE="none", DISQUE_PORT=str(port),
                                   DISQUE_LOCAL_HOST=address),
                capture_output=True, text=True, timeout=30)
            assert check.stdout.strip() == "PONG", check
        # Nobody was told about anybody: the service's name did it.
        wait_for(lambda: all(reachable(a, port) == len(addresses) - 1 for a in addresses), 60,
                 interval=0.2, message=lambda: "a full mesh: " + "; ".join(
                     n.log()[-800:] for n in started))

        spark = services["spark"]
        assert spark["environment"]["NODES"] == f"{NODE}:7711"
        env_spark = {**spark["environment"], "OUT": str(tmp_path / "output"),
                     "NODES": f"{addresses[0]}:{port}"}
        script = spark["command"][2].replace("$$", "$")
        env = {**entrypoint_env(**env_spark), "PYSPARK_PYTHON": sys.executable}
        result = subprocess.run([*spark["command"][:2], script], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=900)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        wrote = re.search(r"wrote (\d+) jobs to queue 'orders'", output)
        assert wrote, output[-4000:]
        written = int(wrote.group(1))
        fetched = {address: int(n) for address, n in
                   re.findall(r"^node (\S+): fetched (\d+)$", result.stdout, re.M)}
        # One seed given; every replica found through HELLO and used.
        assert set(fetched) == {f"{a}:{port}" for a in addresses}, result.stdout
        assert sum(fetched.values()) == written
        assert (tmp_path / "output" / "aggregates").is_dir()
        # Every job consumed and acknowledged on every node (the ACKs'
        # garbage collection runs between the nodes: a few ms).
        queue = env_spark["QUEUE"]
        wait_for(lambda: all(qlen_and_registered(a, port, queue) == (0, 0) for a in addresses),
                 30, message=lambda: str({a: qlen_and_registered(a, port, queue)
                                          for a in addresses}))
        # What Prometheus scrapes: every job went in a queue and out to a consumer.
        scrapes = [scrape(a, metrics_port) for a in addresses]
        assert sum(value(s, "disque_jobs_enqueued_total") or 0 for s in scrapes) >= written
        assert sum(value(s, "disque_jobs_delivered_total") or 0 for s in scrapes) >= written
        assert all(value(s, "disque_cluster_reachable_nodes") == len(addresses) - 1
                   for s in scrapes)
    finally:
        for replica in started:
            replica.kill()
    assert not [n for n in started if n.proc.poll() is None]
