"""docker/compose.yaml's topology run as processes, where no container engine exists.

The three node services start from docker/entrypoint.sh with the compose
file's own environment (DISQUE_JOIN included; host names become loopback
ports, since one machine cannot give three processes the same port), in the
compose file's dependency order; they join into one cluster by themselves.
Then the spark service's command runs, as compose would run it, against the
three nodes: the example producer and the streaming aggregation.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.test_docker_files import (
    NODES,
    ROOT,
    Node,
    entrypoint_env,
    load_compose,
)
from tests.support.cluster import bus_free_port
from tests.support.metrics import scrape, value
from tests.support.process import free_port, raw_command, wait_for


def reachable(port: int) -> int:
    info = raw_command(port, "CLUSTER", "INFO").decode()
    return int(re.search(r"cluster_reachable_nodes:(\d+)", info).group(1))


def qlen_and_registered(port: int, queue: str) -> tuple[int, int]:
    info = raw_command(port, "INFO", "jobs").decode()
    registered = int(re.search(r"registered_jobs:(\d+)", info).group(1))
    return int(raw_command(port, "QLEN", queue)), registered


@pytest.mark.slow
def test_compose_topology_as_processes_runs_the_example_pipelines(tmp_path: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark service's jobs need the 'spark' extra")
    services = load_compose()["services"]
    ports = {name: bus_free_port() for name in NODES}
    # The compose file gives every node the same metrics port (one per
    # container); processes on one host each need their own.
    metrics_ports = {name: free_port() for name in NODES}
    started: list[Node] = []
    try:
        for name in NODES:  # compose's order: each one after the nodes it depends on
            environment = dict(services[name].get("environment") or {})
            join = environment.get("DISQUE_JOIN")
            if join:
                environment["DISQUE_JOIN"] = ",".join(
                    f"127.0.0.1:{ports[peer.rsplit(':', 1)[0]]}" for peer in join.split(","))
                environment["DISQUE_JOIN_INTERVAL"] = "0.2"
            for peer in services[name].get("depends_on") or {}:
                check = subprocess.run(
                    ["sh", str(ROOT / "docker" / "entrypoint.sh"), "healthcheck"],
                    env=entrypoint_env(DISQUE_CONFIG_FILE="none",
                                       DISQUE_PORT=str(ports[peer])),
                    capture_output=True, text=True, timeout=30)
                assert check.stdout.strip() == "PONG", f"{name} depends on {peer}: {check}"
            assert environment["DISQUE_METRICS_PORT"]  # what prometheus.yml scrapes
            environment.update(DISQUE_CONFIG_FILE="none", DISQUE_BIND="127.0.0.1",
                               DISQUE_METRICS_PORT=str(metrics_ports[name]),
                               DISQUE_METRICS_BIND="127.0.0.1",
                               DISQUE_PORT=str(ports[name]),
                               DISQUE_DATA_DIR=str(tmp_path / name))
            node = Node(tmp_path / f"{name}.log", (), entrypoint_env(**environment))
            started.append(node.wait_ready())
        # Nobody told disque1 about the others: DISQUE_JOIN and gossip did.
        wait_for(lambda: all(reachable(p) == 2 for p in ports.values()), 30,
                 message=lambda: "a full mesh: " + "; ".join(n.log()[-500:] for n in started))

        spark = services["spark"]
        environment = {**spark["environment"], "OUT": str(tmp_path / "output"),
                       "NODES": ",".join(f"127.0.0.1:{ports[n]}" for n in NODES)}
        script = spark["command"][2].replace("$$", "$")
        env = {**entrypoint_env(**environment), "PYSPARK_PYTHON": sys.executable}
        result = subprocess.run([*spark["command"][:2], script], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=900)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        written = int(re.search(r"wrote (\d+) jobs to queue 'orders'", output).group(1))
        fetched = {address: int(n) for address, n in
                   re.findall(r"^node (\S+): fetched (\d+)$", result.stdout, re.M)}
        assert set(fetched) == {f"127.0.0.1:{ports[n]}" for n in NODES}, result.stdout
        assert sum(fetched.values()) == written
        assert (tmp_path / "output" / "aggregates").is_dir()
        # Every job consumed and acknowledged on every node (the ACKs'
        # garbage collection runs between the nodes: a few ms).
        queue = environment["QUEUE"]
        wait_for(lambda: all(qlen_and_registered(p, queue) == (0, 0) for p in ports.values()),
                 30, message=lambda: str({p: qlen_and_registered(p, queue)
                                          for p in ports.values()}))
        # What Prometheus scrapes: every job went in a queue and out to a consumer.
        scrapes = [scrape(port) for port in metrics_ports.values()]
        assert sum(value(s, "disque_jobs_enqueued_total") for s in scrapes) >= written
        assert sum(value(s, "disque_jobs_delivered_total") for s in scrapes) >= written
        assert all(value(s, "disque_cluster_reachable_nodes") == 2 for s in scrapes)
    finally:
        for node in started:
            node.kill()
    assert not [n for n in started if n.proc.poll() is None]
