"""The README and the docs: what they show runs after the README's install.

Every code block of README.md, docs/*.md and docker/README.md is listed in
:data:`BLOCKS` with how it is checked: run by a test of this module, run by
another test (named), or not run, with the reason.  A block that is not
listed fails :func:`test_every_code_block_is_accounted_for`, so a new
snippet cannot go unchecked by accident.  Snippets are run as written,
except that addresses and paths are pointed at this test's own nodes and
temporary directories (the docs use 127.0.0.1:7711, 10.0.0.1 and /data).

Also checked here: the docs cite only files that ship in this repository,
and they agree with pyproject.toml on the minimum PySpark.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from disque.client import Client

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             ROOT / "docker" / "README.md"]
#: Docs whose blocks are not listed yet, with why.
UNLISTED: set[str] = set()


@dataclass(frozen=True)
class Block:
    file: str
    line: int
    lang: str
    text: str

    @property
    def key(self) -> tuple[str, str]:
        first = next(line for line in self.text.splitlines() if line.strip())
        return self.file, first.strip()


def code_blocks() -> list[Block]:
    blocks = []
    for path in DOC_FILES:
        name = str(path.relative_to(ROOT))
        if name in UNLISTED:
            continue
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("```"):
                j = i + 1
                while not lines[j].startswith("```"):
                    j += 1
                blocks.append(Block(name, i + 1, lines[i][3:].strip(),
                                    "\n".join(lines[i + 1:j]) + "\n"))
                i = j
            i += 1
    return blocks


def block(file: str, first_line_start: str) -> Block:
    for candidate in code_blocks():
        if candidate.file == file and candidate.key[1].startswith(first_line_start):
            return candidate
    raise AssertionError(f"no block of {file} starts with {first_line_start!r}")


HERE = "run here"
#: (file, start of the block's first line) -> how the block is checked.
BLOCKS: dict[tuple[str, str], str] = {
    ("README.md", "python3 -m venv .venv"): HERE,
    ("README.md", "python3 -m pip install -e '.[spark,dev]' && python3 -m jobs.demo"):
        "the install is .ci/run's; the demo runs in tests/jobs/test_examples.py "
        "(test_demo_runs_end_to_end_and_leaves_nothing_behind, --short)",
    ("README.md", "python3 -m pip install -e '.[spark,dev]' && python3 -m pytest -q"):
        ".ci/run runs exactly this command",
    ("README.md", "$ disque-server &"):
        HERE + " (the disque commands); the demo and the python3 -c line after it in "
        "tests/jobs/test_examples.py",
    ("README.md", "from disque import Client"): HERE,
    ("README.md", "import spark_connector"): HERE,
    ("README.md", "disque-server [/path/to/disque.conf]"):
        "a usage synopsis; tests/server/test_admin.py starts nodes with files and arguments",
    ("docs/BENCHMARKS.md", "python3 -m benchmarks.run SCENARIO"): "a usage synopsis",
    ("docs/BENCHMARKS.md", "python -m benchmarks.spark_source --standalone"):
        "benchmark commands (minutes each); tests/benchmarks/test_spark_standalone_smoke.py "
        "runs both with --smoke / a few rows",
    ("docs/BENCHMARKS.md", "python3 -m benchmarks.run server --rounds 3"):
        "benchmarks of minutes each; tests/benchmarks/ run every scenario with --smoke",
    ("docs/BENCHMARKS.md", "DISQUE_REFERENCE_SERVER=/path/to/disque-server python3 -m "
     "benchmarks.run original"):
        "needs the original's binary; tests/benchmarks/ run the scenario with --smoke",
    ("docs/BENCHMARKS.md", "DISQUE_REFERENCE_SERVER=/path/to/disque-server python3 -m "
     "benchmarks.run bulk"):
        "needs the original's binary; tests/benchmarks/ run the scenario with --smoke",
    ("docs/BENCHMARKS.md", "DISQUE_REFERENCE_SERVER=/path/to/disque-server python3 -m "
     "benchmarks.run latency"):
        "minutes of rounds; tests/benchmarks/test_latency_smoke.py runs the scenario with "
        "--smoke",
    ("docs/BENCHMARKS.md", "DISQUE_REFERENCE_SERVER=/path/to/disque-server "
     "python3 -m benchmarks.run latency --rounds 2 --case \"3 nodes\""):
        "minutes of rounds; tests/benchmarks/test_latency_smoke.py runs the scenario with "
        "--smoke",
    ("docs/BENCHMARKS.md", "python3 -m benchmarks.run groups --rounds 3 --json groups.json"):
        "a minute of rounds; tests/benchmarks/test_groups_smoke.py runs the scenario with "
        "--smoke",
    ("docs/BENCHMARKS.md", "DISQUE_INTERPRETED=1 python3 -m benchmarks.federation_load"):
        "three nodes and 10,000 jobs a run; tests/benchmarks/test_run_smoke.py runs it with "
        "300 jobs",
    ("docs/BENCHMARKS.md", "python3 -m benchmarks.instructions --pickup"):
        "valgrind runs; tests/benchmarks/test_instructions_smoke.py counts a short --pickup",
    ("docs/BENCHMARKS.md", "python3 -m benchmarks.run soak"):
        "rounds of 100,000 jobs; tests/benchmarks/ run the scenario with --smoke",
    ("docs/BENCHMARKS.md", "python3 -m benchmarks.instructions ADDJOB q body 0"):
        "valgrind runs of minutes; tests/benchmarks/ run the counter's smoke test",
    ("docs/CLUSTER.md", "DISQUE_REFERENCE_SERVER=/path/to/disque-server python3 -m "
     "benchmarks.run cluster"):
        "three-node benchmarks of minutes; tests/benchmarks/ run the scenario with --smoke",
    ("docs/BENCHMARKS.md", "redis-benchmark -h 127.0.0.1 -p PORT"):
        "the load commands the harness runs, quoted from its report (PORT varies)",
    ("docs/BENCHMARKS.md", "python3 -m disque.server --port 17712"):
        "a profiling recipe with py-spy, which is not a dependency",
    ("docs/CLUSTER.md", "$ mkdir -p /tmp/n1 /tmp/n2 /tmp/n3"): HERE,
    ("docs/CLIENT.md", "from disque import Client"): HERE,
    ("docs/CLIENT.md", "from disque import AsyncClient"): HERE,
    ("docs/TRACING.md", "at  process        trace     span"):
        "output: tests/spark/test_tracing_spark.py "
        "(test_a_pipeline_keeps_the_producers_trace_across_processes) draws it and checks its "
        "rows",
    ("docs/TRACING.md", "from opentelemetry import metrics, trace"):
        "tests/client/test_tracing.py (test_the_docs_set_up_runs) runs it as written against "
        "a node on a free port and checks the spans and metrics it prints",
    ("docs/CLIENT.md", "DisqueError"): "a diagram of the exception tree",
    ("docs/CLIENT.md", "disque [-h HOST]"): "a usage synopsis; tests/client/test_cli.py",
    ("docs/BENCHMARKS.md", "DISQUE_INTERPRETED=1 python3 -m benchmarks.console"):
        "fills a node with a million jobs for minutes; tests/benchmarks/"
        "test_console_smoke.py runs the same command with --smoke",
    ("docs/CLIENT.md", "$ disque redrive orders:dead"):
        "sample output with a fixed path; tests/client/test_redrive.py runs the command "
        "with these options (--rate, --journal, and the others) against real nodes",
    ("docs/PERSISTENCE.md", "*3\\r\\n$7\\r\\nLOADJOB"): "the record format, not a command",
    ("docs/EXTENSIONS.md", '127.0.0.1:7711> ADDJOB orders "..." 0 RETRY 5 BACKOFF 300'):
        "a CLI session with placeholders; tests/server/test_backoff_deadletter_server.py "
        "(test_nack_delay_on_a_real_server) and test_backoff_deadletter.py run these commands",
    ("docs/EXTENSIONS.md", '127.0.0.1:7711> ADDJOB orders "..." 0 RETRY 5 MAXDELIVERIES 3'):
        "a CLI session with placeholders; tests/server/test_backoff_deadletter_server.py "
        "(test_dead_letter_end_to_end_on_a_real_server) runs these commands",
    ("docs/EXTENSIONS.md", "disque-server --metrics-port 9711 &"):
        "fixed ports; tests/server/test_metrics.py starts nodes with metrics-port and scrapes",
    ("docs/EXTENSIONS.md", "disque-server --tls-port 7712"):
        "needs certificates; tests/server/test_tls.py and tests/client/test_tls.py start "
        "nodes with these directives and run the CLI with these options",
    ("docs/EXTENSIONS.md", "from disque import Client  # over TLS"):
        "needs certificates; tests/client/test_tls.py (test_client_over_tls) passes the "
        "same arguments",
    ("docs/EXTENSIONS.md", "# disque.conf, the same on every node"):
        "a config line; tests/cluster/test_cluster_secret.py starts nodes with it",
    ("docs/PERSISTENCE.md", "CONFIG SET aof-enqueue-jobs-once yes"): HERE,
    ("docs/FAULTS.md", "python3 -m faults --faults partition,pause,kill --time 120"):
        "schedules of minutes; tests/faults/test_schedules.py runs every kind with --time 5",
    ("docs/FAULTS.md", "python3 -m faults --faults mixed --nodes 5 --time 1800"):
        "runs of an hour and a half; tests/faults/test_schedules.py runs mixed on five "
        "nodes and soak with --time 5 to 12",
    ("docs/FAULTS.md", "python3 -m faults --faults kill,pause,partition --nodes 5 --time 120 "
                       "--groups 10"):
        "schedules of minutes; tests/faults/test_scenarios.py (test_groups_without_faults_go_"
        "out_in_add_order_one_job_at_a_time) runs --groups with the none schedule",
    ("docs/FAULTS.md", "python3 -m faults.scenarios requeue-after-pause"):
        "tests/faults/test_scenarios.py runs every scenario",
    ("docs/EXTENSIONS.md", "ADDJOB queue body ms-timeout"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> ADDJOB orders"):
        "a CLI session; tests/server/test_idempotent_addjob.py and "
        "tests/client/test_idmp_and_wait.py (test_cli) check these replies",
    ("docs/EXTENSIONS.md", "ADDJOB queue body ms-timeout [options] PRIORITY p"):
        "a syntax synopsis",
    ("docs/EXTENSIONS.md", '127.0.0.1:7711> ADDJOB orders "resize 3000 images" 0'):
        "a CLI session (IDs differ per run); tests/server/test_priority.py "
        "(test_higher_priorities_first_fifo_within_a_priority, "
        "test_show_qstat_and_the_scan_filters) checks the order and QSTAT's field",
    ("docs/EXTENSIONS.md", "ADDJOB queue body ms-timeout [options] GROUP key"):
        "a syntax synopsis",
    ("docs/EXTENSIONS.md", '127.0.0.1:7711> ADDJOB orders "order 42: created" 0 GROUP'):
        "a CLI session (IDs differ per run); tests/server/test_groups.py "
        "(test_the_extensions_doc_session) runs it and checks every reply but the IDs",
    ("docs/EXTENSIONS.md", "QLIMIT queue max period-ms [BCAST]"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> QLIMIT geocode 50 1000 BCAST"):
        "a CLI session; tests/server/test_rate_limit.py "
        "(test_getjob_delivers_at_most_max_per_window) checks these replies and QSTAT's "
        "fields, tests/cluster/test_rate_limit.py the BCAST",
    ("docs/EXTENSIONS.md", "ACL SETUSER name [rule ...]"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> ACL SETUSER orders-worker"):
        "a CLI session (IDs differ per run); tests/server/test_acl.py "
        "(test_a_user_limited_to_commands_and_queues) checks these replies",
    ("docs/EXTENSIONS.md", "WAITJOB id ms-timeout"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "ADDJOBS queue ms-timeout"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "WORKINGS id [id ...]"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] WITHLEASE"):
        "a syntax synopsis",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> GETJOB WITHCOUNTERS WITHLEASE FROM orders"):
        "a CLI session with a placeholder ID; tests/server/test_getjob_lease.py "
        "(test_counters_come_first_in_either_option_order) checks the entry's shape",
    ("docs/EXTENSIONS.md", "ADDJOB queue body ms-timeout [options] HEADER name value"):
        "a syntax synopsis",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> ADDJOB orders \"...\" 0 HEADER traceparent"):
        "a CLI session with a placeholder ID; tests/server/test_headers.py "
        "(test_withheaders_follows_withcounters_and_withlease) checks the entry's shape",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> WORKINGS"):
        "a CLI session with placeholder IDs; tests/server/test_workings.py checks these "
        "replies",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> ADDJOBS orders 0 RETRY 60"):
        "a CLI session (IDs differ per run); tests/server/test_addjobs.py "
        "(test_options_apply_to_every_job) checks the reply's shape and the options",
    ("docs/EXTENSIONS.md", "from disque import Client"):
        "needs a worker beside the producer; tests/client/test_idmp_and_wait.py "
        "(test_request_response_with_wait_job) runs the same pattern",
    ("docs/SPARK.md", "import spark_connector"): HERE,
    ("docs/SPARK.md", '"""Copy the jobs of queue \'orders\''): HERE,
    ("docs/SPARK.md", "import json"):
        "needs a query: tests/spark/test_source_faults.py "
        "(test_driver_sigkill_mid_batch_loses_nothing) runs it on every progress report of a "
        "restarted query, the replayed batch's included",
    ("docs/SPARK.md", "jobs = (spark.readStream.format(\"disque\")"):
        "fragments (no sink); tests/spark/test_cluster.py runs the cluster one's options from "
        "one seed against three nodes (test_stream_from_the_cluster_to_the_cluster_survives_"
        "a_killed_node), tests/spark/test_staging_stores.py the s3a:// staging and the "
        "staging.endpoint_override option against moto_server",
    ("docs/SPARK.md", '{"batch": 12, "jobsFetched"'):
        "sample progress; tests/spark/test_cluster.py checks the per-node fields",
    ("docs/SPARK.md", '"""Enrich the jobs of queue'):
        "tests/spark/test_tracing_spark.py (test_a_pipeline_keeps_the_producers_trace_across_"
        "processes) runs it as its own process between a producer and a worker",
    ("docs/SPARK.md", "# myapp/telemetry.py"):
        "needs an OTLP exporter; tests/spark/test_tracing_spark.py (test_the_docs_set_up_"
        "function_runs) runs it with an in-memory exporter in its place",
    ("docs/SPARK.md", "import pandas as pd"):
        "needs queued groups and a wait for the query; tests/spark/test_groups_source.py "
        "(test_the_docs_recipe_runs_as_written) runs it as written",
    ("docs/SPARK.md", "python -m spark_connector.pyspark_zips"):
        "changes a PySpark install; tests/spark/test_pyspark_zips.py runs both commands on "
        "a copy of the layout, tests/containers/test_images.py the image that ran --remove",
    ("docs/SPARK_SINK.md", "import spark_connector"): HERE,
    ("docs/SPARK_SINK.md", "disque sink: could not add jobs"):
        "sample error messages; tests/spark/test_sink.py and test_unreachable.py check them",
    ("docs/SPARK_SINK.md", "disque data source: option 'nodes' lists no node"):
        "a sample error; tests/spark/test_sink.py "
        "(test_unreachable_node_is_a_clear_error_on_the_driver) checks it",
    ("docs/SPARK_SINK.md", "<key> LF <original body>"): "a format, not a command",
    ("docs/SPARK_SINK.md", "key, _, body = job.body.partition"):
        "a fragment of the reader's own consumer (its job, client and Redis); "
        "the key format is checked in tests/spark/test_sink.py",
    ("docs/SPARK_SINK.md", "run              median jobs/s"): "sample benchmark output",
    ("docker/README.md", "docker build -f docker/Dockerfile"):
        "tests/containers/ (opt-in container tier, podman) builds the image and runs "
        "containers like this; tests/docker/ check the files and run the entrypoint",
    ("docker/README.md", "docker run -d --init -p 127.0.0.1:7711:7711 -v disque-data:/data"):
        "needs Docker (see above)",
    ("docker/README.md", "docker compose -f docker/compose.yaml up --build"):
        "tests/containers/ (test_compose_runs_the_example_pipeline) runs it with "
        "podman-compose",
    ("docker/README.md", "docker compose -f docker/compose.yaml run --rm spark"):
        "needs Docker (see above)",
    ("docker/README.md", "docker compose -f docker/compose.yaml --profile console up"):
        "needs Docker; tests/docker/test_console_service.py runs the console service's "
        "command as a process over three nodes, tests/docker/test_docker_files.py checks "
        "the service and docker/Dockerfile.console",
    ("docs/DEPLOY.md", "kubectl create secret generic disque-secrets"):
        "needs a Kubernetes cluster: tests/deploy/test_deploy_doc.py runs the secret command "
        "with --dry-run=client and renders the kustomization; tests/deploy/"
        "test_kubernetes.py validates it and runs the pods' discovery with real nodes",
    ("docs/DEPLOY.md", "podman build -f docker/Dockerfile -t registry.example.com/"):
        "needs a registry: tests/deploy/test_deploy_doc.py checks the tag is the package's "
        "version and the kustomization's image; tests/containers/ builds the image",
    ("docs/DEPLOY.md", "kubectl scale statefulset/disque"):
        "needs a Kubernetes cluster: tests/deploy/test_deploy_doc.py checks the names and "
        "figures; tests/deploy/test_kubernetes.py scales real nodes up and down by discovery",
    ("docs/DEPLOY.md", "mkdir -p overlays/external"):
        "tests/deploy/test_deploy_doc.py (test_the_external_recipe_renders) runs it and "
        "renders the overlay",
    ("docs/DEPLOY.md", "docker compose -f docker/compose.yaml up -d --scale"):
        "needs Docker: tests/deploy/test_deploy_doc.py checks the service; tests/containers/ "
        "scales node containers found by one network alias",
    ("docker/README.md", "docker compose -f docker/compose.yaml up -d --scale"):
        "needs Docker: tests/containers/ scales node containers found by one network alias",
    ("docker/README.md", "podman run --ulimit nofile=20000:20000"):
        "tests/containers/conftest.py runs podman with these limits (containers.conf)",
    ("docker/README.md", "# /etc/containers/containers.conf"):
        "tests/containers/conftest.py writes this containers.conf (CONTAINERS_CONF)",
    ("docs/DEPLOY.md", "python3 -m venv /opt/disque"):
        "installs system-wide (a user, a unit); tests/deploy/test_deploy_doc.py "
        "(test_systemd_unit) verifies the unit and runs its ExecStart and stop as written",
    ("docs/DEPLOY.md", "disque -p 7712 cluster info"):
        "tests/deploy/test_deploy_doc.py (test_rolling_restart_check) runs it between two "
        "restarts",
    ("docker/README.md", "sudo sh docker/debian-base.sh podman"):
        "tests/containers/ (the container tier, opt-in) runs these builds with the same "
        "build arguments",
    ("docs/SERVER.md", "edges       connection"):
        "a drawing of the node's layers; tests/test_node_map.py checks the table under it",
    ("docs/CONSOLE.md", "python3 -m pip install -e '.[console]'"):
        "fixed ports and paths; tests/console/conftest.py starts the console the same way "
        "(--nodes, --data-dir, --port 0) and every test there talks to it",
    ("docs/CONSOLE.md", "curl -s -u team-a:secret"):
        "needs a console and users; tests/console/test_users.py "
        "(test_scripts_use_basic_auth_on_the_api) calls the API with Basic authentication",
    ("docs/CONSOLE.md", "disque-console --nodes 10.0.0.1:7712"):
        "fixed addresses and certificate files; tests/console/test_tls.py "
        "(test_pages_redrive_and_bulk_move_over_tls) starts the console with the same "
        "options against TLS nodes that require client certificates",
    ("docs/EXTENSIONS.md", "SHOW id NOBODY"): "a syntax synopsis",
    ("docs/EXTENSIONS.md", "127.0.0.1:7711> SHOW D-"):
        "a CLI session with a placeholder ID; tests/server/test_jobs.py "
        "(test_show_nobody_gives_the_fields_without_the_body) checks the reply's fields",
    ("docker/README.md", "DISQUE_CONFIG_FILE=none DISQUE_DATA_DIR=/tmp/disque"):
        "tests/docker/test_docker_files.py runs the entrypoint the same way (on free ports)",
}


def test_every_code_block_is_accounted_for() -> None:
    found = {b.key: b for b in code_blocks()}
    listed = {key: how for key, how in BLOCKS.items()}

    def matches(key: tuple[str, str], listed_key: tuple[str, str]) -> bool:
        return key[0] == listed_key[0] and key[1].startswith(listed_key[1])

    unlisted = [f"{b.file}:{b.line}: {key[1]!r}" for key, b in found.items()
                if not any(matches(key, lk) for lk in listed)]
    assert not unlisted, "code blocks nobody checks (list them in BLOCKS):\n" + "\n".join(
        unlisted)
    stale = [lk for lk in listed if not any(matches(key, lk) for key in found)]
    assert not stale, f"BLOCKS lists blocks that are gone: {stale}"


# --------------------------------------------------------------------------
# What the docs cite
# --------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(r"`((?:docs|docker|benchmarks|jobs|tests|disque|spark_connector)"
                       r"/[\w./-]+)`")


@pytest.mark.parametrize("path", [p for p in DOC_FILES
                                  if str(p.relative_to(ROOT)) not in UNLISTED],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_cite_only_what_ships(path: Path) -> None:
    text = path.read_text()
    for target in LINK.findall(text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (path.parent / target).exists(), f"{path.name} links to missing {target}"
    for target in REPO_PATH.findall(text):
        assert (ROOT / target).exists() or (path.parent / target).exists(), \
            f"{path.name} names {target}, which is not in the repository"
    # Files a user of this repository does not have: the project's working
    # notes and its issue tracker.
    for pattern in (r"C-BEHAVIOUR", r"\.\./shared", r"\bissue \d+", r"\bissues? #\d+"):
        assert not re.search(pattern, text), f"{path.name} cites {pattern!r}"


def test_docs_and_pyproject_agree_on_the_minimum_pyspark() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["spark"]
    (spec,) = [s for s in extras if s.startswith("pyspark")]
    minimum = re.search(r">=([\d.]+)", spec).group(1)
    for path in DOC_FILES:
        for found in re.findall(r"pyspark ≥ ([\d.]+)", path.read_text()):
            assert found == minimum, f"{path.name} says pyspark ≥ {found}, pyproject {minimum}"


# --------------------------------------------------------------------------
# Shell blocks
# --------------------------------------------------------------------------

def test_readme_virtual_environment(tmp_path: Path) -> None:
    text = block("README.md", "python3 -m venv").text
    result = subprocess.run(["bash", "-c", text + "python3 -c 'import sys; print(sys.prefix)'"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / ".venv")


def tour_steps() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) of the tour's `disque` commands."""
    steps: list[tuple[str, list[str]]] = []
    for line in block("README.md", "$ disque-server &").text.splitlines():
        if line.startswith("$ "):
            command = line[2:].split("  #")[0].strip()
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line)
    return [(c, out) for c, out in steps if c.startswith("disque ")]


def test_readme_tour_commands(server) -> None:
    """The tour's `disque` commands, in order, against a node on a free port.

    Output is compared as the README shows it (formatted: the tour is a
    terminal), with the job ID of this run in place of the README's.
    Lines the CLI writes on stderr for a person (the waiting hint) are
    checked in tests/client/test_cli.py.
    """
    job_id = None
    readme_id = re.compile(r"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")
    steps = tour_steps()
    assert [c.split()[1] for c, _ in steps] == [
        "addjob", "getjob", "ackjob", "getjob", "getjob", "shutdown"]
    for command, expected in steps:
        if job_id is not None:
            command = readme_id.sub(job_id, command)
        words = command.split()
        result = subprocess.run(
            [sys.executable, "-m", "disque.cli", "-p", str(server.port), "--no-raw", *words[1:]],
            capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        if words[1] == "addjob":
            job_id = result.stdout.strip()
            assert readme_id.fullmatch(job_id)
            continue
        want = [readme_id.sub(job_id, line) for line in expected
                if not line.startswith("(waiting for")]
        assert result.stdout.splitlines() == want, command


def test_cluster_tour(tmp_path: Path) -> None:
    """docs/CLUSTER.md's three nodes, as written, on free ports and directories.

    The outputs the page shows literally are compared; the node IDs and times
    it abbreviates are checked for their shape.
    """
    from tests.support.cluster import bus_free_port

    while True:  # three distinct ports (each call released its port: it may come back)
        ports = {7711: bus_free_port(), 7712: bus_free_port(), 7713: bus_free_port()}
        if len(set(ports.values())) == 3:
            break
    doc_port = re.compile(r"\b(771[123])\b")
    doc_id = re.compile(r"D-[0-9a-f]{4}\.\.\.-[0-9a-f]{4}")
    steps: list[tuple[str, list[str]]] = []
    for line in block("docs/CLUSTER.md", "$ mkdir -p").text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:].split("  #")[0].strip(), []))
        else:
            steps[-1][1].append(line)
    job_id = ""
    try:
        for command, expected in steps:
            command = doc_port.sub(lambda m: str(ports[int(m.group(1))]), command)
            command = command.replace("/tmp/", f"{tmp_path}/")
            command = doc_id.sub(job_id, command)
            if command.startswith("disque -p") and "cluster nodes" in command:
                # "within a second or two": wait for the gossip to bring 7713.
                deadline = time.monotonic() + 20
                while True:
                    out = _sh(command).stdout
                    if out.count(" connected") == 3 or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                got = sorted(x.split()[1:3] for x in out.splitlines() if x.strip())
                want = sorted([doc_port.sub(lambda m: str(ports[int(m.group(1))]),
                                            w.split()[1]), w.split()[2]] for w in expected)
                assert got == want, out
                continue
            result = _sh(command)
            assert result.returncode == 0, (command, result.stdout, result.stderr)
            if " addjob " in command:
                job_id = result.stdout.strip()
                assert re.fullmatch(r"D-[0-9a-f]{8}-\S{24}-05a1", job_id), job_id
            elif " show " in command:
                assert "active" in result.stdout and job_id in result.stdout
            elif " getjob " in command:
                assert job_id in result.stdout and "hello" in result.stdout
            elif expected:
                assert result.stdout.splitlines() == expected, command
    finally:
        for port in ports.values():
            _sh(f"disque -p {port} shutdown")


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    """A shell command of the docs, with `disque` formatting as on a terminal."""
    command = re.sub(r"\bdisque -p", "disque --no-raw -p", command)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)


def test_controlled_restart_commands(server_factory, tmp_path: Path) -> None:
    """docs/PERSISTENCE.md's controlled restart, on a node with a config file."""
    conf = tmp_path / "disque.conf"
    conf.write_text("appendonly yes\n")
    node = server_factory(config_file=conf)
    with Client(f"127.0.0.1:{node.port}") as c:
        c.add_job("kept", b"x")
    for line in block("docs/PERSISTENCE.md", "CONFIG SET aof-enqueue").text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        result = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(node.port),
                                 *line.split()], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (line, result.stdout, result.stderr)
    assert node.proc is not None and node.proc.wait(30) == 0
    node.start(port=node.port)  # "start the node again"
    with Client(f"127.0.0.1:{node.port}") as c:
        assert c.qlen("kept") == 1  # queued again at once, as the doc promises


# --------------------------------------------------------------------------
# Python blocks
# --------------------------------------------------------------------------

def pointed_at(code: str, nodes: str, tmp_path: Path) -> str:
    """The snippet with its example addresses and paths replaced by ours."""
    address = r"(?:10\.0\.0\.\d|127\.0\.0\.1):77\d\d"
    code = re.sub(rf'\["{address}"(?:, "{address}")*\]', f'"{nodes}"', code)
    code = re.sub(rf'"{address}(?:,{address})*"', f'"{nodes}"', code)
    for path in re.findall(r'"(/(?:data|checkpoints)/[^"]*)"', code):
        code = code.replace(f'"{path}"', f'"{tmp_path}{path}"')
    return code


def test_client_snippets(server_factory, tmp_path: Path) -> None:
    a, b = server_factory(), server_factory()
    nodes = f"127.0.0.1:{a.port},127.0.0.1:{b.port}"
    handled: list[bytes] = []
    readme = pointed_at(block("README.md", "from disque import Client").text, nodes, tmp_path)
    exec(compile(readme, "README.md", "exec"), {})
    sync = pointed_at(block("docs/CLIENT.md", "from disque import Client").text, nodes, tmp_path)
    exec(compile(sync, "docs/CLIENT.md", "exec"), {"handle": handled.append})
    assert handled == [b"payload"]
    code = pointed_at(block("docs/CLIENT.md", "from disque import AsyncClient").text,
                      f"127.0.0.1:{a.port}", tmp_path)
    body = "async def main():\n" + "".join(f"    {line}\n" for line in code.splitlines())
    namespace: dict = {}
    exec(compile(body, "docs/CLIENT.md", "exec"), namespace)
    asyncio.run(namespace["main"]())


def test_spark_snippets(spark, server, tmp_path: Path) -> None:
    nodes = f"127.0.0.1:{server.port}"
    df = spark.createDataFrame([(1, "a"), (2, "b")], "n int, s string")
    events = (spark.readStream.format("rate").option("rowsPerSecond", "5").load()
              .selectExpr("cast(value as string) as value", "'evt' as kind"))
    for file in ("README.md", "docs/SPARK.md", "docs/SPARK_SINK.md"):
        code = pointed_at(block(file, "import spark_connector").text, nodes, tmp_path)
        code = code.replace('"emails"', '"docs-emails"').replace('"events"', '"docs-events"')
        before = {q.id for q in spark.streams.active}
        try:
            exec(compile(code, file, "exec"), {"spark": spark, "df": df, "events": events})
        finally:
            for query in spark.streams.active:
                if query.id not in before:
                    query.stop()
    with Client(nodes) as c:
        assert c.qlen("orders") == 2  # the README's batch write
        assert c.qlen("docs-emails") == 2  # SPARK_SINK.md's batch write



def test_spark_complete_example_runs_quietly(server, tmp_path: Path) -> None:
    """SPARK.md's complete script, as a user runs it: its own process, its own Spark."""
    pytest.importorskip("pyspark", reason="needs the 'spark' extra")
    script = tmp_path / "copy_orders.py"
    script.write_text(block("docs/SPARK.md", '"""Copy the jobs of queue').text)
    env = {**os.environ, "DISQUE_NODES": f"127.0.0.1:{server.port}",
           "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "work")],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "100 jobs copied, 100 acknowledged"
    # Following the docs costs no warning from Spark about the connector
    # (a replaced data source, a task too large) nor from the connector.
    noisy = [line for line in result.stderr.splitlines()
             if re.search(r"WARN (DataSourceManager|TaskSetManager)|spark_connector", line)]
    assert not noisy, "\n".join(noisy)
    with Client(f"127.0.0.1:{server.port}") as client:
        assert client.qlen("orders") == 0
