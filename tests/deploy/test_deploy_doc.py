"""docs/DEPLOY.md, walked through where this machine can run it.

The Kubernetes commands need a cluster: the secret is made with
``--dry-run=client`` and checked against what the StatefulSet reads; the
image's tag, the scaling command, the probes' and the forget time's
figures, the sizing arithmetic, the NetworkPolicy's labels and the compose
commands are checked against the files they describe; the recipe for
clients outside Kubernetes is run as written (the overlay made by its
commands, rendered with the component). The systemd unit is verified with
``systemd-analyze`` and its ExecStart runs as a real process, stopped with
the unit's KillSignal within its TimeoutStopSec. The check between two
restarts of a rolling upgrade runs on a real cluster.
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

from disque import __version__
from disque.config import Config
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined
from tests.support.process import DisqueProcess
from tests.test_docs import block

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "disque.service"
KUBE = ROOT / "deploy" / "kubernetes"
DOC = (ROOT / "docs" / "DEPLOY.md").read_text()
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
    _, container = _statefulset()
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]
            if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]}
    assert {ref["name"] for ref in refs.values()} == {secret["metadata"]["name"]}
    assert {ref["key"] for ref in refs.values()} == set(secret["data"])  # nothing missing
    values = {key: base64.b64decode(v).decode() for key, v in secret["data"].items()}
    assert re.fullmatch(r"[0-9a-f]{64}", values["cluster-secret"])  # long enough
    assert re.fullmatch(r"[0-9a-f]{48}", values["requirepass"])
    listed = block("docs/DEPLOY.md", "kubectl create secret").text
    assert "kubectl apply -k deploy/kubernetes/" in listed


def _statefulset() -> tuple[dict, dict]:
    sts = yaml.safe_load((KUBE / "statefulset.yaml").read_text())
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return sts, container


def _configmap() -> Config:
    configmap = yaml.safe_load((KUBE / "configmap.yaml").read_text())
    config = Config()
    config.load_text(configmap["data"]["disque.conf"], "configmap")
    return config


def test_the_image_commands_tag_the_package_version() -> None:
    commands = block("docs/DEPLOY.md", "podman build -f docker/Dockerfile").text
    build, push, edit = [line for line in commands.splitlines() if line.strip()]
    image = f"registry.example.com/disque-py:{__version__}"
    assert build.split()[-2:] == [image, "."] and "-f docker/Dockerfile" in build
    assert push == f"podman push {image}"
    assert edit == (f"cd deploy/kubernetes && kustomize edit set image disque-py={image}")
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "disque-py", "newTag": __version__}]
    assert f"`disque-py:{__version__}`" in DOC


def test_scaling_is_one_command_on_the_statefulset() -> None:
    sts, _ = _statefulset()
    config = _configmap()
    (command,) = block("docs/DEPLOY.md", "kubectl scale").text.strip().splitlines()
    assert command == f"kubectl scale statefulset/{sts['metadata']['name']} --replicas 5"
    # The figures the walk-through gives are the ConfigMap's.
    assert f"`cluster-discovery {config.cluster_discovery}`" in DOC
    assert f"every\n`cluster-discovery-interval` seconds ({config.cluster_discovery_interval})" \
        in DOC
    assert f"`cluster-discovery-forget-time` seconds ({config.cluster_discovery_forget_time} " \
           "here)" in DOC
    assert config.cluster_discovery_forget_time == 300 and "five minutes" in DOC
    # The PVC a scaled-down pod leaves: <claim template>-<pod>.
    (template,) = sts["spec"]["volumeClaimTemplates"]
    assert f"kubectl delete pvc {template['metadata']['name']}-disque-4" in DOC


def test_the_probe_figures_are_the_manifests() -> None:
    _, container = _statefulset()
    config = _configmap()
    startup = container["startupProbe"]
    allowed = startup["periodSeconds"] * startup["failureThreshold"]
    assert (f"`GET /readyz` every {startup['periodSeconds']} s, "
            f"{startup['failureThreshold']} failures allowed: **{allowed // 60} minutes**") \
        in " ".join(DOC.split())
    live = container["livenessProbe"]
    assert f"Every {live['periodSeconds']} s, {live['failureThreshold']} failures" in \
        " ".join(DOC.split())
    assert f"on its metrics port ({config.metrics_port})" in DOC


def test_the_network_policy_table_is_the_policy() -> None:
    policy = yaml.safe_load((KUBE / "networkpolicy.yaml").read_text())
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    labels = {f"`{k}: \"{v}\"`" if v == "true" else f"`{k}: {v}`"
              for peer in peers for k, v in peer.get("podSelector", {})
              .get("matchLabels", {}).items()}
    table = DOC[DOC.index("### NetworkPolicy"):DOC.index("### Clients outside")]
    for label in labels - {"`app.kubernetes.io/name: disque`"}:
        assert label in table, label
    (namespace,) = [peer["namespaceSelector"]["matchLabels"] for peer in peers
                    if "namespaceSelector" in peer]
    assert namespace == {"kubernetes.io/metadata.name": "monitoring"}
    assert "the namespace named `monitoring`" in table


def test_the_sizing_arithmetic_is_the_manifests() -> None:
    _, container = _statefulset()
    maxmemory = _configmap().maxmemory // 1024 ** 2
    raw = maxmemory * 5 // 4 + 100
    request = container["resources"]["requests"]["memory"]
    assert f"`maxmemory {maxmemory}mb`: {maxmemory * 5 // 4} Mi + 100 Mi = {raw} Mi, a " \
           f"{request.removesuffix('Mi')} Mi\n  request; a " in DOC
    assert container["resources"]["limits"]["memory"] == "1Gi" and "a 1 Gi limit" in DOC


def test_the_external_recipe_renders(tmp_path: Path) -> None:
    """The overlay as the recipe's commands make it, next to a checkout
    (../../deploy/kubernetes), rendered with the component."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("rendering needs kubectl (Debian package kubernetes-client)")
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    recipe = block("docs/DEPLOY.md", "mkdir -p overlays/external").text
    result = subprocess.run(["bash", "-ec", recipe], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rendered = subprocess.run([kubectl, "kustomize", str(tmp_path / "overlays" / "external")],
                              capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    resources = {f"{d['kind']}/{d['metadata']['name']}": d
                 for d in yaml.safe_load_all(rendered.stdout) if d}
    services = {name: r for name, r in resources.items() if name.endswith("-external")
                and name.startswith("Service/")}
    node_ports = sorted(p["nodePort"] for s in services.values() for p in s["spec"]["ports"])
    assert node_ports == [30711, 30712, 30713, 31711, 31712, 31713]
    assert "client 30711-30713, bus\n31711-31713" in DOC
    announce = (KUBE / "external" / "announce").read_text()
    (example,) = re.findall(r"`(disque-0 \S+ \d+ \d+)`", DOC)
    assert example.split() in [line.split() for line in announce.splitlines()]
    address = example.split()[1]
    assert f"disque -h {address} -p 30711 -a PASSWORD hello" in DOC


def test_the_compose_scaling_command() -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    (command,) = block("docs/DEPLOY.md", "docker compose -f docker/compose.yaml up -d --scale")\
        .text.strip().splitlines()
    service = command.split("--scale ")[1].split("=")[0]
    node = compose["services"][service]
    assert node["environment"]["DISQUE_CLUSTER_DISCOVERY"] == f"{service}:7711"
    assert f"`cluster-discovery {service}:7711`" in DOC
    assert "name" not in compose  # the project's name is the user's


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
