"""deploy/kubernetes/: rendered, validated offline, and its join run for real.

No Kubernetes cluster here: the manifests are rendered by ``kubectl
kustomize`` (Debian's kubectl, when installed), checked against the API
schemas that kubernetes-validate bundles, and checked for what the node
needs (the drain fits the grace period, the probes and join names exist).
The join-by-DNS the StatefulSet relies on runs with real nodes started by
the image's entrypoint, each on its own loopback address and the same port
as pods are, with a ``getent`` stub as the cluster DNS; then all three come
back on new addresses, as pods rescheduled do.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from disque.config import Config, parse_memory
from tests.support.cluster import cluster_view, wait_joined
from tests.support.process import DisqueProcess, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
#: Kubernetes versions the manifests must be valid for: the newest schema
#: kubernetes-validate bundles and an older release still widely run.
VERSIONS = ["1.29", "latest"]


def rendered() -> list[dict[str, Any]]:
    """The resources `kubectl apply -k deploy/kubernetes/` would send; without
    kubectl, the files themselves (each one a complete resource)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
        return [yaml.safe_load((KUBE / name).read_text())
                for name in kustomization["resources"]]
    result = subprocess.run([kubectl, "kustomize", str(KUBE)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def resources() -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in rendered()}


def test_every_manifest_file_is_in_the_kustomization() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    files = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_match_the_api_schemas(resources, version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    target = kubernetes_validate.latest_version() if version == "latest" else version
    for name, resource in resources.items():
        try:
            kubernetes_validate.validate(resource, target, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{name} against Kubernetes {target}: {err}") from None


def test_an_invalid_manifest_is_caught() -> None:
    """The validation above can fail: a misspelt field is refused."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    resource = yaml.safe_load((KUBE / "poddisruptionbudget.yaml").read_text())
    resource["spec"]["maxUnavaliable"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(resource, kubernetes_validate.latest_version(),
                                     strict=True)


def _statefulset(resources) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    sts = resources["StatefulSet/disque"]
    pod = sts["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    return sts, pod, container


def _config(resources) -> Config:
    config = Config()
    config.load_text(resources["ConfigMap/disque-config"]["data"]["disque.conf"], "configmap")
    return config


def test_pods_find_each_other_by_dns(resources) -> None:
    sts, pod, container = _statefulset(resources)
    headless = resources["Service/disque-headless"]
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "disque-headless"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    labels = pod["metadata"]["labels"]
    for service in (headless, resources["Service/disque"]):
        assert service["spec"]["selector"].items() <= labels.items()
    env = {e["name"]: e for e in container["env"]}
    names = env["DISQUE_JOIN"]["value"].split(",")
    replicas = sts["spec"]["replicas"]
    assert names == [f"disque-{i}.disque-headless:7711" for i in range(replicas)]
    assert _config(resources).port == 7711
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["bus"] == ports["client"] + 10000


def test_the_drain_fits_the_grace_period(resources) -> None:
    _, pod, _ = _statefulset(resources)
    config = _config(resources)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert config.shutdown_timeout > 0
    assert config.shutdown_timeout + 5 <= grace <= 60


def test_the_cluster_secret_comes_from_a_secret(resources) -> None:
    _, _, container = _statefulset(resources)
    env = {e["name"]: e for e in container["env"]}
    ref = env["DISQUE_CLUSTER_SECRET"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "disque-cluster-secret", "key": "cluster-secret"}
    assert "cluster-secret" not in resources["ConfigMap/disque-config"]["data"]["disque.conf"]
    assert not any(kind.startswith("Secret/") for kind in resources)  # never in the repository


def test_volumes_probes_and_resources(resources) -> None:
    sts, pod, container = _statefulset(resources)
    config = _config(resources)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == config.dir == "/data"  # nodes.conf and the AOF persist
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["data"]
    assert config.appendonly
    assert mounts["config"] == "/etc/disque"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DISQUE_CONFIG_FILE"] == "/etc/disque/disque.conf"
    assert container["readinessProbe"]["exec"]["command"] == ["disque-entrypoint", "ready"]
    assert container["livenessProbe"]["exec"]["command"] == ["disque-entrypoint",
                                                              "healthcheck"]
    for probe in ("ready()", "healthcheck()"):
        assert probe in ENTRYPOINT.read_text()
    # Memory: maxmemory of jobs plus the interpreter and buffers, under the limit.
    requests = container["resources"]["requests"]
    limit = _quantity(container["resources"]["limits"]["memory"])
    assert config.maxmemory + 128 * 1024 ** 2 <= _quantity(requests["memory"]) <= limit
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.metrics_port
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001  # the image's user
    budget = resources["PodDisruptionBudget/disque"]["spec"]
    assert budget["maxUnavailable"] == 1


def _quantity(text: str) -> int:
    units = {"Ki": 1024, "Mi": 1024 ** 2, "Gi": 1024 ** 3}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", text)
    assert match, text
    return int(match.group(1)) * units.get(match.group(2) or "", 1)


def test_the_configmap_is_a_valid_disque_conf(resources) -> None:
    config = _config(resources)
    assert config.maxmemory == parse_memory("512mb")
    assert config.bind == ["0.0.0.0"]


# --------------------------------------------------------------------------
# Join by DNS, with real nodes
# --------------------------------------------------------------------------

GETENT_STUB = """#!/bin/sh
# getent stub: the cluster DNS of the test, "name address" lines in $STUB_HOSTS.
case $1 in ahostsv4 | ahosts | hosts) ;; *) exit 2 ;; esac
awk -v n="$2" '$1 == n { print $2 "       STREAM " n; found = 1 } END { exit !found }' \\
    "$STUB_HOSTS"
"""


def _port_free_on(addresses: list[str]) -> int:
    """A port free for a node (client and bus) on every one of ``addresses``."""
    while True:
        port = free_port()
        socks = []
        try:
            for address in addresses:
                for p in (port, port + 10000):
                    sock = socket.socket()
                    socks.append(sock)
                    sock.bind((address, p))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


class Pod(DisqueProcess):
    """A node started like a pod: by the entrypoint, on its own address."""

    def __init__(self, workdir: Path, name: str, env: dict[str, str]) -> None:
        super().__init__(workdir, program=["sh", str(ENTRYPOINT)])
        self.name = name
        self.env = env
        self.address = ""

    def start_at(self, address: str, port: int, timeout: float = 30) -> Pod:
        self.address = address
        env = {**self.env, "DISQUE_BIND": address, "DISQUE_LOCAL_HOST": address,
               "DISQUE_PORT": str(port), "DISQUE_DATA_DIR": str(self.workdir)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(["sh", str(ENTRYPOINT)], stdout=log,
                                         stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        self.port = port
        wait_for(lambda: self._answers(), timeout, message=f"{self.name} to answer")
        return self

    def _answers(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited:\n{self.log_text()}")
        try:
            with socket.create_connection((self.address, self.port), timeout=1):
                return True
        except OSError:
            return False

    def client(self, **kwargs: Any):
        import redis
        client = redis.Redis(host=self.address, port=self.port, protocol=2,
                             socket_timeout=30, **kwargs)
        self._clients.append(client)
        return client

    def ready(self) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "DISQUE_LOCAL_HOST": self.address, "DISQUE_PORT": str(self.port)}
        return subprocess.run(["sh", str(ENTRYPOINT), "ready"], env=env, capture_output=True,
                              text=True, timeout=30)


def test_pods_join_by_dns_and_rejoin_on_new_addresses(tmp_path: Path) -> None:
    """Three 'pods' on 127.0.0.2-4, same port, DISQUE_JOIN as in the
    StatefulSet; then all rescheduled at once on 127.0.0.5-7 with their
    volumes (nodes.conf holds the old addresses): they find each other again,
    same identities, no manual MEET."""
    sts = yaml.safe_load((KUBE / "statefulset.yaml").read_text())
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    join = next(e["value"] for e in container["env"] if e["name"] == "DISQUE_JOIN")
    names = [entry.split(":")[0] for entry in join.split(",")]
    first, second = ["127.0.0.2", "127.0.0.3", "127.0.0.4"], ["127.0.0.5", "127.0.0.6",
                                                               "127.0.0.7"]
    port = _port_free_on(first + second)
    join = join.replace(":7711", f":{port}")
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "getent").write_text(GETENT_STUB)
    (stub / "getent").chmod(0o755)
    hosts = tmp_path / "hosts"
    env = {"PATH": f"{stub}:{Path(sys.executable).parent}:{os.environ['PATH']}",
           "STUB_HOSTS": str(hosts), "HOME": str(tmp_path), "DISQUE_CONFIG_FILE": "none",
           "DISQUE_JOIN": join, "DISQUE_JOIN_INTERVAL": "0.2", "DISQUE_JOIN_RETRIES": "150",
           "DISQUE_CLUSTER_NODE_TIMEOUT": "2000", "DISQUE_APPENDONLY": "yes"}
    pods = [Pod(tmp_path / name, name, env) for name in names]
    try:
        for addresses in (first, second):
            hosts.write_text("".join(f"{n} {a}\n" for n, a in zip(names, addresses,
                                                                  strict=True)))
            for pod, address in zip(pods, addresses, strict=True):
                pod.start_at(address, port)
            wait_joined(pods, timeout=60)
            for pod in pods:
                result = pod.ready()
                assert result.returncode == 0, result.stdout
                view = cluster_view(pod)
                assert {info["addr"].split(":")[0] for info in view.values()} == set(addresses)
            if addresses is first:
                ids = {pod.name: pod.client().execute_command("CLUSTER", "MYID")
                       for pod in pods}
                for pod in pods:
                    assert pod.stop() == 0
        assert ids == {pod.name: pod.client().execute_command("CLUSTER", "MYID")
                       for pod in pods}
    finally:
        for pod in pods:
            if pod.proc is not None and pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()


def test_ready_waits_for_a_peer(tmp_path: Path) -> None:
    """The readiness probe: not ready while alone with peers to join."""
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "HOME": str(tmp_path), "DISQUE_CONFIG_FILE": "none",
           "DISQUE_JOIN": "127.0.0.1:1", "DISQUE_JOIN_RETRIES": "1"}
    pod = Pod(tmp_path / "alone", "alone", env)
    try:
        pod.start_at("127.0.0.1", _port_free_on(["127.0.0.1"]))
        result = pod.ready()
        assert result.returncode == 1 and "no reachable peer" in result.stdout
        del pod.env["DISQUE_JOIN"]
        assert pod.ready().returncode == 0  # no peers to wait for
    finally:
        pod.stop()


# --------------------------------------------------------------------------
# The web console: an optional component (deploy/kubernetes/console/)
# --------------------------------------------------------------------------

CONSOLE = KUBE / "console"


def rendered_with_console(tmp_path: Path) -> list[dict[str, Any]]:
    """What an overlay of deploy/kubernetes/ with the console component renders.

    Kustomize refuses an overlay inside its base's directory (a cycle) and
    absolute paths, so the overlay is made in a temporary directory with
    relative ones, as a user's own overlay would be.
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("rendering a kustomization with a component needs kubectl "
                    "(Debian's kubectl package)")
    base = os.path.relpath(KUBE, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {base}/console\n")
    result = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture
def with_console(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in rendered_with_console(tmp_path)}


def test_the_console_is_optional(resources, with_console) -> None:
    assert not any("console" in name for name in resources)  # the base alone: no console
    added = set(with_console) - set(resources)
    assert added == {"Deployment/disque-console", "PersistentVolumeClaim/disque-console-data"}
    component = yaml.safe_load((CONSOLE / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert set(component["resources"]) == {p.name for p in CONSOLE.glob("*.yaml")} - {
        "kustomization.yaml"}
    # The nodes' resources come out as the base renders them.
    for name, resource in resources.items():
        assert with_console[name] == resource, name


@pytest.mark.parametrize("version", VERSIONS)
def test_the_console_manifests_match_the_api_schemas(with_console, version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    target = kubernetes_validate.latest_version() if version == "latest" else version
    for name in ("Deployment/disque-console", "PersistentVolumeClaim/disque-console-data"):
        try:
            kubernetes_validate.validate(with_console[name], target, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{name} against Kubernetes {target}: {err}") from None


def _console(with_console) -> tuple[dict[str, Any], dict[str, Any]]:
    deployment = with_console["Deployment/disque-console"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_no_disque_selector_picks_the_console_pod(with_console) -> None:
    deployment, _ = _console(with_console)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for name in ("Service/disque", "Service/disque-headless", "PodDisruptionBudget/disque"):
        spec = with_console[name]["spec"]
        selector = spec["selector"].get("matchLabels", spec["selector"])
        assert not selector.items() <= labels.items(), f"{name} selects the console's pod"


def test_the_console_pod_serves_on_its_loopback_over_the_disque_service(with_console,
                                                                        tmp_path) -> None:
    from disque.console.main import parse_args
    from disque.console.settings import is_loopback

    deployment, container = _console(with_console)
    args = container["args"]
    at = args.index("--data-dir") + 1
    settings, _ = parse_args([*args[:at], str(tmp_path / "data"), *args[at + 1:]])
    client_port = next(p["port"] for p in with_console["Service/disque"]["spec"]["ports"]
                       if p["name"] == "client")
    assert settings.nodes == (f"disque:{client_port}",)
    # Open nodes (no requirepass in the ConfigMap): loopback only, reached
    # with kubectl port-forward.
    assert "requirepass" not in with_console["ConfigMap/disque-config"]["data"]["disque.conf"]
    assert is_loopback(settings.bind) and not settings.allow_open
    assert container["ports"] == [{"name": "http", "containerPort": settings.port}]
    for probe in ("readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"]
        assert f"http://127.0.0.1:{settings.port}/health" in command[2]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == args[at] == "/data"
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == "disque-console-data"
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # ReadWriteOnce
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsUser"] == 10001  # docker/Dockerfile.console's user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["image"] == "disque-py-console:latest"
    dockerfile = (ROOT / "docker" / "Dockerfile.console").read_text()
    assert "USER 10001:10001" in dockerfile


def test_the_console_pod_command_and_probe_run(with_console, server, tmp_path) -> None:
    """The container's arguments, as a process (the node's address for the
    Service's, an ephemeral port), answer the pod's readiness probe."""
    pytest.importorskip("starlette", reason="the console needs the 'console' extra")
    from tests.support.console import ConsoleProcess

    _, container = _console(with_console)
    args = list(container["args"])
    args[args.index("--nodes") + 1] = f"127.0.0.1:{server.port}"
    args[args.index("--data-dir") + 1] = str(tmp_path / "data")
    port_at = args.index("--port")
    del args[port_at:port_at + 2]  # ConsoleProcess asks for any free port
    console = ConsoleProcess(tmp_path / "console", *args).start()
    try:
        port = console.url.rsplit(":", 1)[1]
        command = container["readinessProbe"]["exec"]["command"]
        script = command[2].replace("127.0.0.1:7780", f"127.0.0.1:{port}")
        assert subprocess.run([sys.executable, "-c", script], timeout=30).returncode == 0
        assert (tmp_path / "data" / "cookie.key").exists()
    finally:
        console.stop()
