"""deploy/kubernetes/: rendered, validated offline, and its parts run for real.

No Kubernetes cluster here: the manifests (the base and its optional
components) are rendered by ``kubectl kustomize`` (Debian's kubectl, when
installed), checked against the API schemas that kubernetes-validate
bundles, and checked for what the node needs: discovery through the
headless Service, the drain within the grace period, HTTP probes on the
metrics port, resources derived from maxmemory, topology spread, the
NetworkPolicy's rules (evaluated for each kind of peer), the secrets, the
image's version tag, and the external-access component's announced
addresses (through the entrypoint, as the pods start it).
The entrypoint's DISQUE_JOIN (for set-ups without cluster-discovery) runs
with real nodes, each on its own loopback address and the same port as pods
are, with a ``getent`` stub as the DNS; then all three come back on new
addresses, as pods rescheduled do.
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

from disque import __version__
from disque.config import Config, parse_memory
from tests.deploy import dns
from tests.support.cluster import cluster_view, describe, fully_joined, wait_joined
from tests.support.process import DisqueProcess, port_free_on, wait_for

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
EXTERNAL = KUBE / "external"
MI = 1024 ** 2
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
    # No list of pods: the nodes resolve the headless Service, so that
    # `kubectl scale` is the whole operation.
    assert "DISQUE_JOIN" not in env
    config = _config(resources)
    assert config.port == 7711
    client_port = next(p["port"] for p in headless["spec"]["ports"] if p["name"] == "client")
    assert config.cluster_discovery == f"disque-headless:{client_port}"
    assert config.cluster_discovery_interval > 0
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["bus"] == ports["client"] + 10000
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {
        "client": ports["client"], "bus": ports["bus"]}


def test_the_drain_fits_the_grace_period(resources) -> None:
    _, pod, _ = _statefulset(resources)
    config = _config(resources)
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert config.shutdown_timeout > 0
    assert config.shutdown_timeout + 5 <= grace <= 60


def test_the_secrets_come_from_a_secret_and_are_required(resources) -> None:
    _, _, container = _statefulset(resources)
    env = {e["name"]: e for e in container["env"]}
    refs = {name: env[name]["valueFrom"]["secretKeyRef"]
            for name in ("DISQUE_CLUSTER_SECRET", "DISQUE_REQUIREPASS", "DISQUE_PASSWORD")}
    assert refs == {
        "DISQUE_CLUSTER_SECRET": {"name": "disque-secrets", "key": "cluster-secret",
                                  "optional": False},
        "DISQUE_REQUIREPASS": {"name": "disque-secrets", "key": "requirepass",
                               "optional": False},
        # the disque CLI's, for `kubectl exec disque-0 -- disque ...`
        "DISQUE_PASSWORD": {"name": "disque-secrets", "key": "requirepass",
                            "optional": False}}
    # An empty key is refused by the entrypoint (test_a_missing_cluster_secret_...).
    assert env["DISQUE_REQUIRE_CLUSTER_SECRET"]["value"] == "yes"
    conf = resources["ConfigMap/disque-config"]["data"]["disque.conf"]
    assert "cluster-secret" not in conf and "requirepass" not in conf
    assert not any(kind.startswith("Secret/") for kind in resources)  # never in the repository


def test_a_missing_cluster_secret_is_a_failed_start(resources, tmp_path: Path) -> None:
    """The pod's environment without a cluster secret (an empty Secret key):
    the entrypoint exits 1 before starting a node; with one, it starts it
    with the secret, masked in the log."""
    _, _, container = _statefulset(resources)
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    conf = tmp_path / "disque.conf"
    conf.write_text(resources["ConfigMap/disque-config"]["data"]["disque.conf"])
    env = {**_clean_env(), **pod_env, "DISQUE_CONFIG_FILE": str(conf),
           "DISQUE_CLUSTER_SECRET": "", "DISQUE_REQUIREPASS": "pw"}
    result = subprocess.run(["sh", str(ENTRYPOINT)], env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert "no cluster-secret" in result.stderr and "refusing to start" in result.stderr
    env["DISQUE_CLUSTER_SECRET"] = "s" * 64
    result = subprocess.run(["sh", str(ENTRYPOINT), "print-command"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()
    assert argv[argv.index("--cluster-secret") + 1] == "s" * 64
    assert argv[argv.index("--requirepass") + 1] == "pw"


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISQUE_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


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
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == config.metrics_port
    assert pod["spec"]["securityContext"]["runAsUser"] == 10001  # the image's user
    budget = resources["PodDisruptionBudget/disque"]["spec"]
    assert budget["maxUnavailable"] == 1


def test_probes_are_http_gets_on_the_metrics_port(resources) -> None:
    """No probe starts a process in the pod: the node answers them itself,
    /healthz (alive, also while loading its AOF) and /readyz (loaded and
    serving), on the port where metrics-bind lets the kubelet in."""
    _, _, container = _statefulset(resources)
    config = _config(resources)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == config.metrics_port and config.metrics_bind == ["0.0.0.0"]
    paths = {}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container[probe]
        assert set(spec) & {"exec", "grpc", "tcpSocket"} == set(), probe
        assert spec["httpGet"]["port"] == "metrics", probe
        assert spec["timeoutSeconds"] < spec["periodSeconds"], probe
        paths[probe] = spec["httpGet"]["path"]
    assert paths == {"startupProbe": "/readyz", "readinessProbe": "/readyz",
                     "livenessProbe": "/healthz"}
    # The AOF load the startup probe allows (docs/DEPLOY.md, "Probes").
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 30 * 60
    # Liveness gives a stuck node a minute; readiness drops it in 10 s.
    live = container["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] == 60
    ready = container["readinessProbe"]
    assert ready["periodSeconds"] * ready["failureThreshold"] == 10


def test_resources_are_derived_from_maxmemory(resources) -> None:
    """docs/DEPLOY.md, "Sizing": request = maxmemory x 1.25 + 100 Mi, rounded
    up to 64 Mi; limit = maxmemory x 2; one core requested at most, no CPU
    limit. The same arithmetic is in statefulset.yaml's comment."""
    _, _, container = _statefulset(resources)
    maxmemory = _config(resources).maxmemory
    request = -(-(maxmemory * 5 // 4 + 100 * MI) // (64 * MI)) * 64 * MI
    limits = container["resources"]["limits"]
    requests = container["resources"]["requests"]
    assert _quantity(requests["memory"]) == request
    assert _quantity(limits["memory"]) == 2 * maxmemory
    assert "cpu" not in limits
    assert 0 < _cpu(requests["cpu"]) <= 1
    comment = (KUBE / "statefulset.yaml").read_text()
    assert f"{(maxmemory * 5 // 4 + 100 * MI) // MI} Mi -> {requests['memory']}" in comment
    assert f"{2 * maxmemory // MI} Mi = {limits['memory']}" in comment
    sizing = (ROOT / "docs" / "DEPLOY.md").read_text()
    times = "\u00d7"  # the doc's multiplication sign
    assert f"maxmemory {times} 1.25 + 100 Mi" in sizing and f"maxmemory {times} 2" in sizing


def _cpu(text: str) -> float:
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def test_pods_spread_over_hosts(resources) -> None:
    _, pod, _ = _statefulset(resources)
    (spread,) = pod["spec"]["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"  # preferred
    assert spread["maxSkew"] == 1
    assert spread["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert "topology.kubernetes.io/zone" in (KUBE / "statefulset.yaml").read_text()


def test_the_image_is_the_package_version(resources) -> None:
    _, _, container = _statefulset(resources)
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image == {"name": "disque-py", "newTag": __version__}
    if shutil.which("kubectl"):  # rendered: the tag is applied
        assert container["image"] == f"disque-py:{__version__}"
    assert container["imagePullPolicy"] == "IfNotPresent"  # a version tag does not move


# --------------------------------------------------------------------------
# The NetworkPolicy, evaluated
# --------------------------------------------------------------------------

def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # matchExpressions: not used here
    return selector.get("matchLabels", {}).items() <= labels.items()


def allowed(policies: list[dict[str, Any]], target: dict[str, Any], port: str, *,
            pod: dict[str, str], namespace: dict[str, str] | None = None,
            address: str | None = None) -> bool:
    """Would ``policies`` let a connection to ``port`` (a container port's
    name) of ``target`` (a pod template) in, from a pod labelled ``pod`` in
    a namespace labelled ``namespace`` (None: the policies' own), or from
    ``address`` outside the cluster?  Kubernetes' rules: an ingress policy
    selecting the pod makes it deny-by-default; the union of the rules of
    every policy selecting it allows."""
    import ipaddress

    (container,) = target["spec"]["containers"]
    number = next(p["containerPort"] for p in container["ports"] if p["name"] == port)
    selecting = [p for p in policies
                 if _selects(p["spec"]["podSelector"], target["metadata"]["labels"])
                 and "Ingress" in p["spec"]["policyTypes"]]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            if not any(p.get("protocol", "TCP") == "TCP" and p["port"] in (port, number)
                       for p in rule.get("ports", [])):
                continue
            for peer in rule.get("from", []):
                if "ipBlock" in peer:
                    if address is not None and ipaddress.ip_address(address) in \
                            ipaddress.ip_network(peer["ipBlock"]["cidr"]) and not any(
                                ipaddress.ip_address(address) in ipaddress.ip_network(x)
                                for x in peer["ipBlock"].get("except", [])):
                        return True
                    continue
                if address is not None:
                    continue
                ns_ok = (_selects(peer["namespaceSelector"], namespace or {"own": "yes"})
                         if "namespaceSelector" in peer else namespace is None)
                pod_ok = _selects(peer["podSelector"], pod) if "podSelector" in peer else True
                if ns_ok and pod_ok:
                    return True
    return False


def _policies(rendered_resources: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for name, r in rendered_resources.items() if name.startswith("NetworkPolicy/")]


def test_the_network_policy(resources, with_console) -> None:
    """The bus between the StatefulSet's pods only; the client port from
    labelled clients, the console and the nodes; metrics from the monitoring
    namespace; nothing from elsewhere."""
    _, pod, _ = _statefulset(resources)
    policies = _policies(resources)
    assert [p["metadata"]["name"] for p in policies] == ["disque"]
    node = pod["metadata"]["labels"]
    client = {"app": "orders", "disque-client": "true"}
    console = with_console["Deployment/disque-console"]["spec"]["template"]["metadata"]["labels"]
    other = {"app": "orders"}
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    cases = [  # (port, peer labels, namespace labels or None for the pods' own, allowed)
        ("bus", node, None, True), ("bus", client, None, False),
        ("bus", console, None, False), ("bus", node, {"name": "elsewhere"}, False),
        ("client", node, None, True), ("client", client, None, True),
        ("client", console, None, True), ("client", other, None, False),
        ("client", prometheus, monitoring, False), ("client", client, {"x": "y"}, False),
        ("metrics", prometheus, monitoring, True), ("metrics", other, monitoring, True),
        ("metrics", client, None, False), ("metrics", node, None, False),
    ]
    for port, peer, namespace, expected in cases:
        assert allowed(policies, pod, port, pod=peer, namespace=namespace) is expected, (
            port, peer, namespace)
    for port in ("client", "bus", "metrics"):
        assert not allowed(policies, pod, port, pod={}, address="198.51.100.7")
    # The policy's port names are the container's.
    (container,) = pod["spec"]["containers"]
    names = {p["name"] for p in container["ports"]}
    for rule in policies[0]["spec"]["ingress"]:
        assert {p["port"] for p in rule["ports"]} <= names


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


class Pod(DisqueProcess):
    """A node started like a pod: by the entrypoint, on its own address."""

    def __init__(self, workdir: Path, name: str, env: dict[str, str],
                 hosts: Path | None = None, password: str | None = None) -> None:
        super().__init__(workdir, program=["sh", str(ENTRYPOINT)])
        self.name = name
        self.env = env
        self.address = ""
        #: The cluster DNS of the test: this file is the pod's /etc/hosts.
        self.hosts = hosts
        self.password = password

    def start_at(self, address: str, port: int, timeout: float = 30,
                 **variables: str) -> Pod:
        self.address = address
        env = {**self.env, "DISQUE_BIND": address, "DISQUE_LOCAL_HOST": address,
               "DISQUE_PORT": str(port), "DISQUE_DATA_DIR": str(self.workdir),
               "DISQUE_DIR": str(self.workdir), **variables}  # the pod's volume
        command = ["sh", str(ENTRYPOINT)]
        if self.hosts is not None:
            command = dns.in_dns(command, self.hosts)  # the test's DNS
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
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
        """One client per start (polled often: not a connection per call)."""
        import redis
        kwargs.setdefault("password", self.password)
        if not kwargs.keys() - {"password"}:
            for client in self._clients:
                if client.connection_pool.connection_kwargs.get("port") == self.port and \
                        client.connection_pool.connection_kwargs.get("host") == self.address:
                    return client
        client = redis.Redis(host=self.address, port=self.port, protocol=2,
                             socket_timeout=30, **kwargs)
        self._clients.append(client)
        return client

    def ready(self) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "DISQUE_LOCAL_HOST": self.address, "DISQUE_PORT": str(self.port)}
        return subprocess.run(["sh", str(ENTRYPOINT), "ready"], env=env, capture_output=True,
                              text=True, timeout=30)


def test_pods_join_by_dns_and_rejoin_on_new_addresses(tmp_path: Path) -> None:
    """DISQUE_JOIN, for set-ups without cluster-discovery: three 'pods' on
    127.0.0.2-4, same port, each given the three pods' names; then all
    rescheduled at once on 127.0.0.5-7 with their volumes (nodes.conf holds
    the old addresses): they find each other again, same identities, no
    manual MEET."""
    names = [f"disque-{i}.disque-headless" for i in range(3)]
    join = ",".join(f"{name}:7711" for name in names)
    first, second = ["127.0.0.2", "127.0.0.3", "127.0.0.4"], ["127.0.0.5", "127.0.0.6",
                                                               "127.0.0.7"]
    port = port_free_on(first + second)
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
        pod.start_at("127.0.0.1", port_free_on(["127.0.0.1"]))
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


def rendered_with(tmp_path: Path, component: str) -> list[dict[str, Any]]:
    """What an overlay of deploy/kubernetes/ with one of its components renders.

    Kustomize refuses an overlay inside its base's directory (a cycle) and
    absolute paths, so the overlay is made in a temporary directory with
    relative ones, as a user's own overlay would be.
    """
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("rendering a kustomization with a component needs kubectl "
                    "(Debian's kubectl package)")
    overlay = tmp_path / f"overlay-{component}"
    overlay.mkdir()
    base = os.path.relpath(KUBE, overlay)
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {base}/{component}\n")
    result = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def rendered_with_console(tmp_path: Path) -> list[dict[str, Any]]:
    return rendered_with(tmp_path, "console")


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


def _secret_env(container: dict[str, Any], name: str) -> tuple[str, str]:
    (entry,) = [e for e in container["env"] if e["name"] == name]
    ref = entry["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is False
    return ref["name"], ref["key"]


def test_the_console_pod_serves_the_pod_network_in_front_of_password_nodes(
        with_console, tmp_path) -> None:
    from disque.console.main import parse_args
    from disque.console.settings import is_loopback

    deployment, container = _console(with_console)
    args = container["args"]
    at = args.index("--data-dir") + 1
    settings, _ = parse_args([*args[:at], str(tmp_path / "data"), *args[at + 1:]])
    client_port = next(p["port"] for p in with_console["Service/disque"]["spec"]["ports"]
                       if p["name"] == "client")
    assert settings.nodes == (f"disque:{client_port}",)
    # Outside loopback, which the console allows only in front of nodes
    # with a password: the nodes' requirepass and the console's sampling
    # password are the same Secret's key.
    assert not is_loopback(settings.bind) and not settings.allow_open
    _, _, node_container = _statefulset(with_console)
    assert (_secret_env(container, "DISQUE_CONSOLE_SAMPLE_PASSWORD")
            == _secret_env(node_container, "DISQUE_REQUIREPASS"))
    assert container["ports"] == [{"name": "http", "containerPort": settings.port}]
    for probe in ("readinessProbe", "livenessProbe"):  # the kubelet's GET: no process
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == args[at] == "/data"
    (volume,) = deployment["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == "disque-console-data"
    assert deployment["spec"]["strategy"]["type"] == "Recreate"  # ReadWriteOnce
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert pod_security["runAsUser"] == 10001  # docker/Dockerfile.console's user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["image"] == f"disque-py-console:{__version__}"
    dockerfile = (ROOT / "docker" / "Dockerfile.console").read_text()
    assert "USER 10001:10001" in dockerfile


def test_the_console_pod_command_and_probe_run(with_console, server_factory, tmp_path) -> None:
    """The container's arguments, as a process (a node with a password for
    the Service's, an ephemeral port), serve outside loopback and answer the
    pod's probes as the kubelet sends them."""
    pytest.importorskip("starlette", reason="the console needs the 'console' extra")
    from tests.support.console import ConsoleProcess

    server = server_factory("--requirepass", "pod-secret")
    _, container = _console(with_console)
    args = list(container["args"])
    args[args.index("--nodes") + 1] = f"127.0.0.1:{server.port}"
    args[args.index("--data-dir") + 1] = str(tmp_path / "data")
    port_at = args.index("--port")
    del args[port_at:port_at + 2]  # ConsoleProcess asks for any free port
    console = ConsoleProcess(tmp_path / "console", *args).start(
        env={"DISQUE_CONSOLE_SAMPLE_PASSWORD": "pod-secret"})
    try:
        port = int(console.url.rsplit(":", 1)[1])
        for probe in ("readinessProbe", "livenessProbe"):
            path = container[probe]["httpGet"]["path"]
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                             "Connection: close\r\n\r\n".encode())
                status = sock.makefile("rb").readline()
            assert status.split()[1] == b"200", status
        assert (tmp_path / "data" / "cookie.key").exists()
    finally:
        console.stop()


# --------------------------------------------------------------------------
# Clients outside Kubernetes: an optional component (deploy/kubernetes/external/)
# --------------------------------------------------------------------------

@pytest.fixture
def with_external(tmp_path: Path) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d
            for d in rendered_with(tmp_path, "external")}


def _announce_lines(text: str) -> dict[str, tuple[str, int, int]]:
    lines = {}
    for line in text.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#"):
            name, address, port, bus = fields
            lines[name] = (address, int(port), int(bus))
    return lines


def test_the_external_component_adds_a_service_per_pod(resources, with_external) -> None:
    component = yaml.safe_load((EXTERNAL / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    sts, pod, _ = _statefulset(with_external)
    replicas = sts["spec"]["replicas"]
    (configmap,) = [r for n, r in with_external.items()
                    if n.startswith("ConfigMap/disque-external-")]  # hashed: a change rolls
    added = set(with_external) - set(resources)
    assert added == {*(f"Service/disque-{i}-external" for i in range(replicas)),
                     "NetworkPolicy/disque-external",
                     f"ConfigMap/{configmap['metadata']['name']}"}
    announce = _announce_lines(configmap["data"]["announce"])
    assert sorted(announce) == [f"disque-{i}" for i in range(replicas)]
    for i in range(replicas):
        service = with_external[f"Service/disque-{i}-external"]["spec"]
        # Exactly one pod: its name, and the StatefulSet's labels.
        assert service["selector"] == {**sts["spec"]["selector"]["matchLabels"],
                                       "statefulset.kubernetes.io/pod-name": f"disque-{i}"}
        assert service["type"] == "NodePort" and service["publishNotReadyAddresses"] is True
        ports = {p["name"]: p for p in service["ports"]}
        assert {p["targetPort"] for p in ports.values()} == {"client", "bus"}
        _, client_port, bus_port = announce[f"disque-{i}"]
        assert (ports["client"]["nodePort"], ports["bus"]["nodePort"]) == (client_port, bus_port)
        assert all(30000 <= p["nodePort"] <= 32767 for p in ports.values())
    # Everything else is the base's, but for the StatefulSet's pod template.
    for name, resource in resources.items():
        if name != "StatefulSet/disque":
            assert with_external[name] == resource, name
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["external"]["configMap"]["name"] == configmap["metadata"]["name"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_external_manifests_match_the_api_schemas(resources, with_external,
                                                      version: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    target = kubernetes_validate.latest_version() if version == "latest" else version
    for name, resource in with_external.items():
        if name in resources and resources[name] == resource:
            continue  # validated with the base
        try:
            kubernetes_validate.validate(resource, target, strict=True)
        except kubernetes_validate.ValidationError as err:
            raise AssertionError(f"{name} against Kubernetes {target}: {err}") from None


def test_each_pod_announces_its_external_address(with_external, tmp_path: Path) -> None:
    """The pod's environment (its name from the downward API) and the
    announce file mounted where the pod reads it: the entrypoint gives the
    node its line's address and ports; a pod without a line does not start."""
    sts, _, container = _statefulset(with_external)
    (configmap,) = [r for n, r in with_external.items()
                    if n.startswith("ConfigMap/disque-external-")]
    env = {e["name"]: e for e in container["env"]}
    assert env["DISQUE_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    path = env["DISQUE_ANNOUNCE_FILE"]["value"]
    assert path == f"{mounts['external']}/announce"
    announce_file = tmp_path / "announce"
    announce_file.write_text(configmap["data"]["announce"])
    announce = _announce_lines(configmap["data"]["announce"])
    base = {**_clean_env(), **{k: e["value"] for k, e in env.items() if "value" in e},
            "DISQUE_CONFIG_FILE": "none", "DISQUE_ANNOUNCE_FILE": str(announce_file),
            "DISQUE_CLUSTER_SECRET": "s" * 64, "DISQUE_REQUIREPASS": "pw"}
    for i in range(sts["spec"]["replicas"]):
        name = f"disque-{i}"
        result = subprocess.run(["sh", str(ENTRYPOINT), "print-command"],
                                env={**base, "DISQUE_NODE_NAME": name}, capture_output=True,
                                text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        argv = result.stdout.splitlines()
        got = tuple(argv[argv.index(f"--cluster-announce-{what}") + 1]
                    for what in ("ip", "port", "bus-port"))
        address, port, bus = announce[name]
        assert got == (address, str(port), str(bus))
        config = Config.from_args(argv[1:])  # the node reads them as meant
        assert (config.cluster_announce_ip, config.cluster_announce_port,
                config.cluster_announce_bus_port) == (address, port, bus)
    scaled = f"disque-{sts['spec']['replicas']}"  # scaled up without a line
    result = subprocess.run(["sh", str(ENTRYPOINT)], env={**base, "DISQUE_NODE_NAME": scaled},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and f"no line for {scaled}" in result.stderr


def test_the_external_network_policy(with_external) -> None:
    """Client and bus ports from outside (and through a NodePort's source
    NAT); metrics still from monitoring only."""
    _, pod, _ = _statefulset(with_external)
    policies = _policies(with_external)
    for port in ("client", "bus"):
        assert allowed(policies, pod, port, pod={}, address="198.51.100.7")
    assert not allowed(policies, pod, "metrics", pod={}, address="198.51.100.7")
    assert not allowed(policies, pod, "metrics", pod={"app": "orders"})


# --------------------------------------------------------------------------
# Discovery through the headless Service, with real nodes
# --------------------------------------------------------------------------

class Namespace:
    """The StatefulSet's pods on loopback addresses, with the headless
    Service's DNS (the test's hosts file) and the pods' configuration: the
    ConfigMap's disque.conf and the container's environment, secrets from
    the Secret, the times shortened, each pod on its own address with the
    same port as in Kubernetes."""

    #: Shorter than the ConfigMap's, for a test: failure detection,
    #: resolutions, and how long a removed node stays before it is forgotten.
    TIMES = {"DISQUE_CLUSTER_NODE_TIMEOUT": "3000",
             "DISQUE_CLUSTER_DISCOVERY_INTERVAL": "1",
             "DISQUE_CLUSTER_DISCOVERY_FORGET_TIME": "3"}

    def __init__(self, resources: dict[str, dict[str, Any]], tmp_path: Path,
                 addresses: list[str]) -> None:
        _, _, container = _statefulset(resources)
        self.tmp_path = tmp_path
        self.port = port_free_on(addresses)
        self.metrics_port = port_free_on(addresses)
        conf = resources["ConfigMap/disque-config"]["data"]["disque.conf"]
        config = _config(resources)
        self.service = config.cluster_discovery.split(":")[0]
        conf = conf.replace(f"port {config.port}\n", f"port {self.port}\n").replace(
            f"cluster-discovery {config.cluster_discovery}",
            f"cluster-discovery {self.service}:{self.port}")
        (tmp_path / "disque.conf").write_text(conf)
        self.hosts = tmp_path / "hosts"
        self.hosts.write_text("")
        self.password = "pw"
        self.env = {**_clean_env(), "HOME": str(tmp_path),
                    **{e["name"]: e["value"] for e in container["env"] if "value" in e},
                    "DISQUE_CONFIG_FILE": str(tmp_path / "disque.conf"),
                    "DISQUE_CLUSTER_SECRET": "s" * 64, "DISQUE_REQUIREPASS": self.password,
                    "DISQUE_PASSWORD": self.password, "DISQUE_METRICS_PORT":
                        str(self.metrics_port), **self.TIMES}
        self.pods: list[Pod] = []
        self.probe = container["readinessProbe"]["httpGet"]["path"]

    def pod(self, ordinal: int) -> Pod:
        while len(self.pods) <= ordinal:
            name = f"disque-{len(self.pods)}"
            self.pods.append(Pod(self.tmp_path / name, name, self.env, hosts=self.hosts,
                                 password=self.password))
        return self.pods[ordinal]

    def publish(self, addresses: list[str]) -> None:
        """The headless Service's addresses (the endpoints controller's work)."""
        dns.publish(self.hosts, self.service, addresses)

    def start(self, ordinal: int, address: str) -> Pod:
        return self.pod(ordinal).start_at(address, self.port,
                                          DISQUE_METRICS_BIND=address)

    def ready(self, pod: Pod) -> bool:
        """The readiness probe, as the kubelet sends it."""
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"http://{pod.address}:{self.metrics_port}"
                                        f"{self.probe}", timeout=3) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def cleanup(self) -> None:
        for pod in self.pods:
            if pod.proc is not None and pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()


def _joined(pods: list[Pod], timeout: float = 60) -> None:
    """wait_joined, polled every 0.2 s: the nodes' own pace, not a load."""
    wait_for(lambda: fully_joined(pods), timeout, interval=0.2,
             message=lambda: "a full mesh: " + describe(pods))


def _holds_for(predicate, seconds: float, message: str) -> None:
    """``predicate`` stays true for ``seconds`` (polled): a thing that must
    not happen, watched for as long as it would take to happen."""
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), message
        time.sleep(0.2)


@pytest.fixture
def namespace(resources, tmp_path: Path):
    why = dns.unavailable()
    if why:
        pytest.skip(f"the pods' DNS is the test's /etc/hosts in a mount namespace: {why}")
    addresses = [f"127.0.0.{i}" for i in (2, 3, 4, 5, 12, 13, 14)]
    ns = Namespace(resources, tmp_path, addresses)
    try:
        yield ns
    finally:
        ns.cleanup()


def test_scale_up_scale_down_and_restart_by_discovery(namespace: Namespace) -> None:
    """`kubectl scale` is the whole operation. Three pods find each other
    through the Service's name alone and are ready; a fourth is added (scale
    up) and joins; it is removed (scale down): it drains its jobs to the
    others, leaves the Service's addresses, and the others forget it by
    themselves; a pod that restarts (its address stays published) stays
    known however long it is down, and is back with its identity."""
    ns = namespace
    first = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    ns.publish(first)
    pods = [ns.start(i, address) for i, address in enumerate(first)]
    _joined(pods)
    wait_for(lambda: all(ns.ready(p) for p in pods), 30, interval=0.2,
             message="the pods to be ready")

    # Scale up: the StatefulSet's new pod is published, then starts.
    ns.publish([*first, "127.0.0.5"])
    fourth = ns.start(3, "127.0.0.5")
    _joined([*pods, fourth])
    fourth_id = fourth.client().execute_command("CLUSTER", "MYID").decode()

    # Scale down: the highest ordinal is stopped (SIGTERM: the drain), and
    # its address leaves the Service.
    job = fourth.client().execute_command("ADDJOB", "scaled", "body", 5000, "REPLICATE", 1,
                                          "RETRY", 300).decode()
    assert fourth.stop(timeout=30) == 0
    ns.publish(first)
    assert "Drain: drained in" in fourth.log_text()
    assert any(p.client().execute_command("SHOW", job) for p in pods), "the job was lost"

    def forgotten() -> bool:
        return all(fourth_id not in cluster_view(p) for p in pods)
    wait_for(forgotten, 60, interval=0.2, message=lambda: "the removed pod forgotten: " +
             "; ".join(str(cluster_view(p)) for p in pods))

    # A restart: the pod's address stays published while it is down,
    # for longer than the forget time.
    restarting = pods[1]
    restarting_id = restarting.client().execute_command("CLUSTER", "MYID").decode()
    assert restarting.stop(timeout=30) == 0
    others = [pods[0], pods[2]]
    wait_for(lambda: all({"fail", "pfail"} & cluster_view(p)[restarting_id]["flags"]
                         for p in others), 30, interval=0.2,
             message="the others to see it failing")
    forget = int(Namespace.TIMES["DISQUE_CLUSTER_DISCOVERY_FORGET_TIME"])
    _holds_for(lambda: all(restarting_id in cluster_view(p) for p in others), 3 * forget,
               "a restarting pod was forgotten")
    ns.start(1, "127.0.0.3")
    assert restarting.client().execute_command("CLUSTER", "MYID").decode() == restarting_id
    _joined(pods)
    wait_for(lambda: ns.ready(restarting), 30, interval=0.2,
             message="the restarted pod to be ready")


def test_all_pods_rescheduled_at_once_find_each_other(namespace: Namespace) -> None:
    """Every pod deleted and started again elsewhere (new addresses, the
    same volumes: nodes.conf names the old ones): the Service's new
    addresses are met, the nodes recognise one another, no one is lost."""
    ns = namespace
    first, second = ["127.0.0.2", "127.0.0.3", "127.0.0.4"], ["127.0.0.12", "127.0.0.13",
                                                               "127.0.0.14"]
    ns.publish(first)
    pods = [ns.start(i, address) for i, address in enumerate(first)]
    _joined(pods)
    ids = [p.client().execute_command("CLUSTER", "MYID") for p in pods]
    for pod in pods:
        assert pod.stop(timeout=30) == 0
    ns.publish(second)
    pods = [ns.start(i, address) for i, address in enumerate(second)]
    _joined(pods)
    assert [p.client().execute_command("CLUSTER", "MYID") for p in pods] == ids
    for pod in pods:
        addresses = {info["addr"].split(":")[0] for info in cluster_view(pod).values()}
        assert addresses == set(second)
    wait_for(lambda: all(ns.ready(p) for p in pods), 30, interval=0.2,
             message="the pods to be ready")


class Forwarder:
    """A NodePort, in user space: each (listen address, port) -> target, both
    ways, in a thread of its own; what reaches the pods from "outside"."""

    def __init__(self, routes: dict[tuple[str, int], tuple[str, int]]) -> None:
        import asyncio
        import threading
        self.loop = asyncio.new_event_loop()
        self.servers: list[Any] = []
        ready = threading.Event()

        async def pipe(reader, writer) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        def handler(target: tuple[str, int]):
            async def handle(reader, writer) -> None:
                try:
                    up_reader, up_writer = await asyncio.open_connection(*target)
                except OSError:
                    writer.close()
                    return
                await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
            return handle

        async def start() -> None:
            for (host, port), target in routes.items():
                self.servers.append(await asyncio.start_server(handler(target), host, port))
            ready.set()

        self.thread = threading.Thread(target=lambda: (self.loop.run_until_complete(start()),
                                                       self.loop.run_forever()), daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def close(self) -> None:
        for server in self.servers:
            self.loop.call_soon_threadsafe(server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        import asyncio
        tasks = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in tasks:
            task.cancel()

        async def finish() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.loop.run_until_complete(finish())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        for server in self.servers:
            self.loop.run_until_complete(server.wait_closed())
        self.loop.close()


def test_clients_outside_reach_the_announced_addresses(with_external, tmp_path: Path) -> None:
    """The external component's recipe with real nodes: three pods started
    by the entrypoint with the pod's environment (secrets required) and an
    announce file in the component's format, each behind a "NodePort" (a
    forwarder on 127.0.0.30 with ports of its own for client and bus).
    They join through those addresses, CLUSTER NODES and HELLO give only
    them, and a client given one of them adds, gets and acknowledges a job
    copied to every node."""
    from disque import Client

    _, _, container = _statefulset(with_external)
    pod_env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    outside = "127.0.0.30"
    pods_at = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = port_free_on(pods_at)
    node_ports = [port_free_on([outside]) for _ in range(2 * len(pods_at))]
    client_ports, bus_ports = node_ports[:3], node_ports[3:]
    if len(set(node_ports)) != len(node_ports):
        pytest.skip("could not find six distinct free ports on 127.0.0.30")
    announce = tmp_path / "announce"
    announce.write_text("# pod address client-port bus-port\n" + "".join(
        f"disque-{i} {outside} {client_ports[i]} {bus_ports[i]}\n" for i in range(3)))
    forwarder = Forwarder({
        **{(outside, client_ports[i]): (pods_at[i], port) for i in range(3)},
        **{(outside, bus_ports[i]): (pods_at[i], port + 10000) for i in range(3)}})
    env = {**_clean_env(), "HOME": str(tmp_path), **pod_env, "DISQUE_CONFIG_FILE": "none",
           "DISQUE_ANNOUNCE_FILE": str(announce), "DISQUE_CLUSTER_SECRET": "s" * 64,
           "DISQUE_REQUIREPASS": "pw", "DISQUE_PASSWORD": "pw",
           "DISQUE_CLUSTER_NODE_TIMEOUT": "3000", "DISQUE_JOIN_INTERVAL": "0.2",
           "DISQUE_JOIN_RETRIES": "150"}
    pods = [Pod(tmp_path / f"disque-{i}", f"disque-{i}", env, password="pw") for i in range(3)]
    external = {f"{outside}:{p}" for p in client_ports}
    try:
        for i, pod in enumerate(pods):
            join = {} if i == 0 else {
                "DISQUE_JOIN": f"{outside}:{client_ports[0]}@{bus_ports[0]}"}
            pod.start_at(pods_at[i], port, DISQUE_NODE_NAME=f"disque-{i}", **join)

        def joined() -> bool:
            for pod in pods:
                view = cluster_view(pod)
                if {info["addr"].split("@")[0] for info in view.values()} != external:
                    return False
                if any(info["flags"] - {"myself", "noflags"} or info["link"] != "connected"
                       for info in view.values()):
                    return False
            return True
        wait_for(joined, 60, interval=0.2, message=lambda: "announced addresses everywhere: "
                 + "; ".join(str(cluster_view(p)) for p in pods))
        import redis
        with redis.Redis(host=outside, port=client_ports[1], password="pw",
                         protocol=2) as seed:
            hello = seed.execute_command("HELLO")
        listed = {f"{entry[1].decode()}:{int(entry[2])}" for entry in hello[2:]}
        assert listed == external
        client = Client(f"{outside}:{client_ports[0]}", password="pw")
        try:
            job = client.add_job("outside", b"body", replicate=3, timeout_ms=5000)
            fetched = client.get_job("outside", timeout_ms=5000)
            assert fetched is not None and fetched.id == job
            client.ack(job)
        finally:
            client.close()
    finally:
        for pod in pods:
            if pod.proc is not None and pod.proc.poll() is None:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait()
        forwarder.close()
