"""docs/DEPLOY.md, walked through where this machine can run it.

The Kubernetes commands need a cluster: the secret is made with
``--dry-run=client`` and checked against what the StatefulSet reads. The
systemd unit is verified with ``systemd-analyze`` and its ExecStart runs as
a real process, stopped with the unit's KillSignal within its TimeoutStopSec.
The check between two restarts of a rolling upgrade runs on a real cluster.
"""

from __future__ import annotations

import base64
import configparser
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined
from tests.support.process import DisqueProcess
from tests.test_docs import block

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "disque.service"
BIN = Path(sys.executable).parent


def test_the_secret_command_makes_what_the_statefulset_reads() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (Debian package kubernetes-client)")
    first = block("docs/DEPLOY.md", "kubectl create secret").text.split("\nkubectl apply")[0]
    command = first.replace("\\\n", " ").strip() + " --dry-run=client -o yaml"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    secret = yaml.safe_load(result.stdout)
    sts = yaml.safe_load((ROOT / "deploy" / "kubernetes" / "statefulset.yaml").read_text())
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    ref = next(e["valueFrom"]["secretKeyRef"] for e in container["env"]
               if e["name"] == "DISQUE_CLUSTER_SECRET")
    assert secret["metadata"]["name"] == ref["name"]
    value = base64.b64decode(secret["data"][ref["key"]]).decode()
    assert re.fullmatch(r"[0-9a-f]{64}", value)  # long enough for cluster-secret
    listed = block("docs/DEPLOY.md", "kubectl create secret").text
    assert "kubectl apply -k deploy/kubernetes/" in listed


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    return unit


def test_systemd_unit(tmp_path: Path) -> None:
    """The unit as DEPLOY.md installs it: verified, and its ExecStart started
    and stopped as systemd would, with the config the doc makes."""
    unit = _unit()
    service = unit["Service"]
    steps = block("docs/DEPLOY.md", "python3 -m venv /opt/disque").text
    assert "cp deploy/systemd/disque.service /etc/systemd/system/" in steps
    # The doc's config: disque-server --print-config > /etc/disque/disque.conf
    (printing,) = [line for line in steps.splitlines() if "--print-config" in line]
    conf = tmp_path / "disque.conf"
    command = printing.split("&&", 1)[1].strip().replace("/opt/disque/bin/", f"{BIN}/")
    command = command.replace("/etc/disque/disque.conf", str(conf))
    assert subprocess.run(["bash", "-c", command], timeout=60).returncode == 0
    data = tmp_path / "data"
    data.mkdir()
    exec_start = shlex.split(service["ExecStart"])
    assert exec_start[0] == "/opt/disque/bin/disque-server"
    assert exec_start[1] == "/etc/disque/disque.conf"
    assert exec_start[exec_start.index("--dir") + 1] == service["WorkingDirectory"] == \
        "/var/lib/disque" == service["ReadWritePaths"]
    assert service["KillSignal"] == "SIGTERM"
    grace = int(service["TimeoutStopSec"])

    analyze = shutil.which("systemd-analyze")
    if analyze is not None:  # with the paths of this test: it checks they exist
        local = tmp_path / "disque.service"
        local.write_text(UNIT.read_text().replace("/opt/disque/bin/", f"{BIN}/")
                         .replace("/etc/disque/disque.conf", str(conf)))
        result = subprocess.run([analyze, "verify", str(local)], capture_output=True,
                                text=True, timeout=60)
        # systemd-analyze also reports the user the doc creates (useradd) if missing.
        problems = [line for line in result.stderr.splitlines()
                    if line.strip() and "disque" in line and "user" not in line.lower()]
        assert not problems, result.stderr

    argv = [f"{BIN}/disque-server", str(conf), *exec_start[2:]]
    argv[argv.index("--dir") + 1] = str(data)
    node = DisqueProcess(data, "--port", "0", program=argv[:1])
    node.program = argv  # ExecStart as written (the test's port appended)
    node.start()
    assert node.client().ping()
    assert node.proc is not None
    node.proc.send_signal(getattr(signal, service["KillSignal"]))
    assert node.proc.wait(grace) == 0
    assert (data / "nodes.conf").exists()


def test_rolling_restart_check(server_factory) -> None:
    """Between two restarts: the restarted node is joined and not leaving."""
    a, b = (server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
            for _ in range(2))
    join([a, b])
    wait_joined([a, b])
    command = block("docs/DEPLOY.md", "disque -p 7712 cluster info").text.strip()
    assert b.stop() == 0  # SIGTERM: the drain
    b.start(port=b.port)
    wait_joined([a, b])
    result = subprocess.run(["bash", "-c", command.replace("7712", str(b.port))],
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": f"{BIN}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert lines == ["cluster_reachable_nodes:1", "cluster_leaving:no"]
