"""The container tier: the images of docker/ built and run with podman.

Opt-in: ``DISQUE_CONTAINER_TESTS=1`` (``.ci/run`` sets it where podman runs
a container).  Without it every test here is skipped and says why.

No registry is used: the Debian base image comes from
``docker/debian-base.sh`` (mmdebstrap + ``podman import``).  It is kept
between runs, under a tag made from the script's and the host CA bundle's
contents, and rebuilt when older than :data:`BASE_MAX_AGE_S` (Debian's
security updates); the images of docker/ are rebuilt every session (podman's
layer cache makes an unchanged rebuild quick), tagged with the package's
version as compose.yaml and the Kubernetes manifests name them, and a build
must leave no untagged image behind (the image it replaces under the same
tag is removed).  Containers run on their own
bridge network, publish on 127.0.0.1 ephemeral ports only, and everything
a test creates (containers, networks, volumes) is removed; the images stay.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from disque import __version__

ROOT = Path(__file__).resolve().parents[2]
ENABLE = "DISQUE_CONTAINER_TESTS"
#: A base older than this is rebuilt (a week of Debian security updates).
BASE_MAX_AGE_S = 7 * 24 * 3600
NODE_IMAGE = f"localhost/disque-py:{__version__}"  # the names compose.yaml uses
SPARK_IMAGE = f"localhost/disque-py-spark:{__version__}"
#: What a test run measured, printed at the end of the session.
TIMINGS: dict[str, float] = {}


def pytest_collection_modifyitems(config, items) -> None:
    if os.environ.get(ENABLE) == "1":
        return
    skip = pytest.mark.skip(reason=f"the container tier is opt-in: {ENABLE}=1 runs it (needs "
                                   "podman with runc, mmdebstrap; .ci/run sets it where "
                                   "podman can run a container)")
    for item in items:
        if "tests/containers/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter) -> None:
    if TIMINGS:
        terminalreporter.write_line("container tier timings: " + ", ".join(
            f"{name} {seconds:.1f} s" for name, seconds in TIMINGS.items()))


@dataclass
class Podman:
    """podman with the tier's own containers.conf (runc; ulimits the host allows)."""

    conf: Path
    created: dict[str, list[str]] = field(default_factory=lambda: {
        "container": [], "network": [], "volume": []})

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    def __call__(self, *args: str, timeout: float = 600, check: bool = True,
                 ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["podman", *args], capture_output=True, text=True,
                                timeout=timeout, env=self.env)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
        return result

    def name(self, kind: str, prefix: str) -> str:
        """A unique name for a container, network or volume, removed at the end."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.created[kind].append(name)
        return name

    def cleanup(self) -> None:
        for name in self.created["container"]:
            # -v: the anonymous volumes too (the image's VOLUME /data)
            self("rm", "-f", "-v", "-t", "0", name, check=False)
        for name in self.created["network"]:
            self("network", "rm", "-f", name, check=False)
        for name in self.created["volume"]:
            self("volume", "rm", "-f", name, check=False)


def _conf(directory: Path) -> Path:
    # crun refuses hybrid cgroup hosts; a container's ulimits cannot exceed
    # the caller's hard limits (podman's default nofile and nproc do here:
    # docker/README.md, "Podman's limits").
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limits = [f"nofile={min(nofile, 65536)}:{min(nofile, 65536)}"]
    if nproc != resource.RLIM_INFINITY:
        limits.append(f"nproc={min(nproc, 32768)}:{min(nproc, 32768)}")
    conf = directory / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = [" + ", ".join(f'"{x}"' for x in limits)
                    + "]\n\n[engine]\n" + ('runtime = "runc"\n' if shutil.which("runc") else ""))
    return conf


@pytest.fixture(scope="session")
def podman(tmp_path_factory) -> Iterator[Podman]:
    if shutil.which("podman") is None:
        pytest.fail(f"{ENABLE}=1 but podman is not installed")
    engine = Podman(_conf(tmp_path_factory.mktemp("podman")))
    yield engine
    engine.cleanup()


def _timed(name: str, call) -> object:
    started = time.monotonic()
    try:
        return call()
    finally:
        TIMINGS[name] = time.monotonic() - started


@pytest.fixture(scope="session")
def base_image(podman: Podman) -> str:
    """The registry-less base, built by docker/debian-base.sh unless cached."""
    script = ROOT / "docker" / "debian-base.sh"
    ca = Path(os.environ.get("HOST_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
    key = hashlib.sha256(script.read_bytes() + (ca.read_bytes() if ca.exists() else b""))
    base = f"localhost/disque-base:bookworm-{key.hexdigest()[:12]}"
    if not _fresh(podman, base):
        result = _timed("debian base (mmdebstrap + import)", lambda: subprocess.run(
            ["sh", str(script), "podman"], capture_output=True, text=True, timeout=900,
            env={**podman.env, "BASE_IMAGE": base}))
        assert result.returncode == 0, result.stdout + result.stderr  # type: ignore[union-attr]
    else:
        TIMINGS["debian base (cached)"] = 0.0
    probe = podman("run", "--rm", "--network", "none", base, "true", check=False)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run a container on this machine: {probe.stderr[-500:]}")
    return base


def _fresh(podman: Podman, image: str) -> bool:
    result = podman("image", "inspect", "--format", "{{.Created}}", image, check=False)
    if result.returncode != 0:
        return False
    created = result.stdout.strip().split(" +")[0].split(".")[0]
    try:
        when = datetime.strptime(created, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return False
    return (datetime.utcnow() - when).total_seconds() < BASE_MAX_AGE_S


def _image_id(podman: Podman, image: str) -> str | None:
    result = podman("image", "inspect", "--format", "{{.Id}}", image, check=False)
    if result.returncode != 0:
        return None
    return result.stdout.strip().removeprefix("sha256:") or None


def _dangling(podman: Podman) -> set[str]:
    return {image.removeprefix("sha256:") for image in podman(
        "images", "--filter", "dangling=true", "--no-trunc", "--format", "{{.ID}}").stdout.split()}


#: Untagged images a build of the tier left behind (none expected).
LEFT_BEHIND: dict[str, set[str]] = {}


def build(podman: Podman, dockerfile: str, tag: str, args: dict[str, str]) -> None:
    """``podman build`` of a Dockerfile of docker/, as it is but for build arguments.

    ``--format docker``: the OCI format has no HEALTHCHECK, which podman then drops.
    Records the untagged images the build made (other than the image it
    replaced under ``tag``, which is removed) in :data:`LEFT_BEHIND`.
    """
    command = ["build", "--format", "docker", "-f", f"docker/{dockerfile}", "-t", tag]
    for name, value in args.items():
        command += ["--build-arg", f"{name}={value}"]
    replaced = _image_id(podman, tag)
    before = _dangling(podman)
    result: subprocess.CompletedProcess[str] = _timed(  # type: ignore[assignment]
        f"build {dockerfile}", lambda: subprocess.run(
            ["podman", *command, str(ROOT)], capture_output=True, text=True, timeout=1800,
            env=podman.env, check=False))
    built = _image_id(podman, tag)
    assert result.returncode == 0 and built is not None, (
        f"building docker/{dockerfile} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    new = _dangling(podman) - before
    if replaced and replaced != built and replaced in new:
        podman("rmi", replaced, check=False)  # this tier's own previous build
        new.discard(replaced)
    LEFT_BEHIND[dockerfile] = new


@pytest.fixture(scope="session")
def node_image(podman: Podman, base_image: str) -> str:
    build(podman, "Dockerfile", NODE_IMAGE, {"PYTHON_IMAGE": base_image})
    return NODE_IMAGE


@pytest.fixture(scope="session")
def spark_image(podman: Podman, base_image: str) -> str:
    build(podman, "Dockerfile.spark", SPARK_IMAGE, {"PYTHON_IMAGE": base_image})
    return SPARK_IMAGE


def inspect(podman: Podman, name: str) -> dict:
    return json.loads(podman("inspect", name).stdout)[0]
