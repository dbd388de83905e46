"""docker/compose.yaml's console service run as a process, where no container engine exists.

The console's command comes from the compose file as written, with what a
container gives it replaced by this machine's equivalents: the nodes'
service name becomes one node's loopback port (the console finds the others
through HELLO, as it does the compose service's replicas), ``--bind
0.0.0.0`` the loopback, the fixed port an ephemeral one and ``/data`` a
temporary directory.  Then the image's
health check (its own command line, from docker/Dockerfile.console) is run
against it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docker.test_docker_files import (
    CONSOLE,
    DOCKER,
    NODE,
    load_compose,
    stages,
    words,
)
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined

pytest.importorskip("starlette", reason="the console needs the 'console' extra")
httpx = pytest.importorskip("httpx", reason="the console's API is called with httpx")


def test_the_console_service_runs_over_the_three_nodes(server_factory, tmp_path: Path) -> None:
    from tests.support.console import ConsoleProcess

    services = load_compose()["services"]
    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(services[NODE]["scale"])]
    join(nodes)
    wait_joined(nodes)
    ports = {node.port for node in nodes}
    command = [str(arg) for arg in services[CONSOLE]["command"]]
    seeds = command[command.index("--nodes") + 1]
    assert seeds == f"{NODE}:7711"
    command[command.index("--nodes") + 1] = f"127.0.0.1:{nodes[0].port}"
    command[command.index("--bind") + 1] = "127.0.0.1"
    command[command.index("--data-dir") + 1] = str(tmp_path / "data")
    console = ConsoleProcess(tmp_path / "console", *command).start()
    try:
        overview = httpx.get(f"{console.url}/api/overview", timeout=30).json()
        assert sorted(n["address"] for n in overview["nodes"]) == sorted(
            f"127.0.0.1:{p}" for p in ports)
        assert overview["totals"]["up"] == 3
        assert "Open console" in httpx.get(console.url + "/", timeout=30).text
        assert (tmp_path / "data" / "cookie.key").exists()
        # The image's health check, as its HEALTHCHECK runs it.
        health = dict(stages(DOCKER / "Dockerfile.console")[-1])["HEALTHCHECK"]
        check = words(health.split("CMD", 1)[1].strip())
        assert check[0] == "python"
        port = console.url.rsplit(":", 1)[1]
        script = check[2].replace("127.0.0.1:7780", f"127.0.0.1:{port}")
        assert subprocess.run([sys.executable, "-c", script], timeout=30).returncode == 0
    finally:
        console.stop()
