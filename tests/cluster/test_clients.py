"""Clients against a real cluster: our client's HELLO discovery and
failover, the CLI's view."""

from __future__ import annotations

import subprocess
import sys

from disque import Client
from tests.support.cluster import node_id
from tests.support.process import wait_for


def test_client_discovers_the_cluster_and_fails_over(make_cluster) -> None:
    a, b, c = make_cluster(3)
    ids = {node_id(n) for n in (a, b, c)}
    with Client(f"127.0.0.1:{a.port}") as client:
        client.ping()
        assert {n.id for n in client.nodes} == ids  # one seed, three nodes from HELLO
        assert {n.port for n in client.nodes} == {a.port, b.port, c.port}
        job_id = client.add_job("q", b"payload")  # REPLICATE 3: a copy on every node
        dead = node_id(a)
        a.kill()
        # The next command finds the connection gone and moves to another node,
        # which holds a copy of the job.
        info = wait_for(lambda: client.show(job_id), timeout=15, message="failover")
        assert info["id"] == job_id and client.node_id in ids - {dead}


def test_cli_shows_the_cluster(make_cluster) -> None:
    a, b = make_cluster(2)
    result = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(a.port),
                             "cluster", "nodes"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    lines = result.stdout.strip().splitlines()
    assert {line.split()[0] for line in lines} == {node_id(a), node_id(b)}
    assert any("myself" in line for line in lines)
