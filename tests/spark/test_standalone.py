"""The connectors on a real Spark standalone cluster: a master and two workers,
each its own JVM, started from the pip pyspark install (tests/support/spark_cluster.py).

Worker B runs in its own mount namespace with empty directories over the
checkout and over the drivers' directories: its executors see neither the
project nor the driver's files. The connector reaches them as the docs say,
the zip of ``python -m spark_connector.bundle`` given to ``--py-files`` with
``spark.executorEnv.PYTHONPATH``; staging is on a real S3-compatible server
(moto_server). Each application is a ``spark-submit`` of
tests/spark/cluster_app.py from a directory outside the checkout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from disque.client import Client
from spark_connector import bundle
from spark_connector.staging import StagingArea
from spark_connector.writer import split_key
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined
from tests.support.process import DisqueProcess, wait_for
from tests.support.spark_cluster import (
    SparkStandalone,
    Worker,
    can_hide,
    kill_group,
    standalone_cluster,
    submit,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "tests" / "spark" / "cluster_app.py"


@pytest.fixture(scope="module")
def drivers(tmp_path_factory) -> Path:
    """Where the drivers work: hidden from worker B."""
    return tmp_path_factory.mktemp("drivers")


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, drivers: Path) -> Iterator[SparkStandalone]:
    if not can_hide():
        pytest.skip("the standalone-cluster tests need root and unshare(1) for a worker "
                    "in its own mount namespace")
    with standalone_cluster(tmp_path_factory.mktemp("standalone"),
                            hide=[ROOT, drivers]) as cluster:
        hidden = cluster.workers[1]
        # The premise: worker B's executors see neither the project nor the drivers.
        for path in (ROOT / "pyproject.toml", drivers):
            seen = subprocess.run(["nsenter", "-t", str(hidden.proc.pid), "-m", "ls", "-A",
                                   str(path)], capture_output=True, text=True, timeout=30)
            assert seen.returncode != 0 or not seen.stdout.strip(), f"worker B sees {path}"
        yield cluster


@pytest.fixture(scope="module")
def shipped(standalone: SparkStandalone) -> Path:
    """The zip the docs tell users to build, for --py-files."""
    return bundle.build(standalone.root / "disque-spark.zip")


def tasks_finished(worker: Worker) -> int:
    return sum(path.read_text(errors="replace").count("Finished task")
               for path in worker.workdir.glob("app-*/*/stderr"))


def run(standalone: SparkStandalone, shipped: Path, workdir: Path, *args: str,
        env: dict[str, str] | None = None, timeout: float = 300) -> str:
    """spark-submit cluster_app.py and wait for it; its log."""
    log = workdir / "app.log"
    proc = submit(standalone, APP, args, cwd=workdir / "cwd", log=log, py_files=shipped,
                  env=env)
    try:
        code = proc.wait(timeout=timeout)
    finally:
        kill_group(proc)
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]
    return text


def bodies_in(client: Client, queue: str) -> Counter[str]:
    """Drain ``queue``: how many jobs of each body (dedup key removed)."""
    seen: Counter[str] = Counter()
    while jobs := client.get_jobs(queue, count=1000, nohang=True):
        seen.update(split_key(job.body)[1].decode() for job in jobs)
        client.ack(*(job.id for job in jobs))
    return seen


def sink_ids(workdir: Path) -> list[str]:
    return [i for path in sorted((workdir / "out").glob("batch-*.parquet"))
            for i in pq.read_table(path).column("id").to_pylist()]


def batches_done(workdir: Path) -> int:
    progress = workdir / "progress"
    return int(progress.read_text()) + 1 if progress.exists() else 0


def start_stream_until_staged(standalone: SparkStandalone, shipped: Path, workdir: Path,
                              args: list[str], env: dict[str, str], batches: int,
                              batch_delay: float) -> subprocess.Popen:
    """Start a slow streaming app; return it once ``batches`` are done and one is staged."""
    app = submit(standalone, APP, [*args, "--batch-delay", str(batch_delay)],
                 cwd=workdir / "first", log=workdir / "first.log", py_files=shipped, env=env)
    staging = args[args.index("--staging") + 1]
    try:
        wait_for(lambda: batches_done(workdir) >= batches and StagingArea(staging).batches(),
                 timeout=240, interval=0.1,
                 message=lambda: (workdir / "first.log").read_text(errors="replace")[-3000:])
    except BaseException:
        kill_group(app)
        raise
    return app


def test_the_sink_writes_from_both_workers(standalone, shipped, server, drivers) -> None:
    before = tasks_finished(standalone.workers[1])
    run(standalone, shipped, drivers / "sink", "sink", f"127.0.0.1:{server.port}", "orders",
        "2000", "--partitions", "8")
    with Client(f"127.0.0.1:{server.port}") as client:
        bodies = bodies_in(client, "orders")
    assert bodies == Counter(f"row-{i}" for i in range(2000))
    assert tasks_finished(standalone.workers[1]) > before, "the hidden worker ran no task"


@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_the_source_stages_on_s3(standalone, shipped, server, drivers, s3,
                                 fetch_mode: str) -> None:
    with Client(f"127.0.0.1:{server.port}") as client:
        produced = client.add_jobs("events", [f"job-{i}" for i in range(600)])
        workdir = drivers / f"source-{fetch_mode}"
        staging = f"s3://{s3.bucket_name}/staging/{fetch_mode}"
        before = tasks_finished(standalone.workers[1])
        run(standalone, shipped, workdir, "stream", f"127.0.0.1:{server.port}", "events",
            str(workdir), "--staging", staging, "--fetch-mode", fetch_mode,
            "--available-now", "--max-jobs", "200", env=s3.env)
        ids = sink_ids(workdir)
        assert sorted(ids) == sorted(produced)  # each job once
        assert client.qlen("events") == 0
        assert int(client.info("jobs")["jobs"]["registered_jobs"]) == 0
    assert StagingArea(staging).batches() == []
    assert any(k.startswith(f"staging/{fetch_mode}/") for k in s3.keys(s3.bucket_name))
    assert tasks_finished(standalone.workers[1]) > before, "the hidden worker ran no task"


def test_a_driver_killed_mid_batch_restarts_elsewhere_from_s3(standalone, shipped, server,
                                                              drivers, s3, record_property
                                                              ) -> None:
    """SIGKILL the driver with a batch staged, restart it from another directory.

    The checkpoint and the output stand for shared storage (one absolute
    path); nothing else of the first driver is seen by the second: its
    working directory is new and the staging is on S3.
    """
    workdir = drivers / "restart"
    staging = f"s3://{s3.bucket_name}/staging/restart"
    client = Client(f"127.0.0.1:{server.port}")
    produced = client.add_jobs("events", [f"job-{i}" for i in range(1500)])
    args = ["stream", f"127.0.0.1:{server.port}", "events", str(workdir), "--staging", staging,
            "--max-jobs", "200"]
    first = start_stream_until_staged(standalone, shipped, workdir, args, s3.env, batches=2,
                                      batch_delay=1.5)
    kill_group(first)
    staged = StagingArea(staging).batches()
    assert staged, "the kill should leave a staged, unacknowledged batch"
    in_sink = set(sink_ids(workdir))
    acked = {i for i in produced if client.show(i) is None}
    assert acked <= in_sink  # nothing acknowledged that the sink lacks

    run(standalone, shipped, workdir / "second", *args[:3], str(workdir), *args[4:],
        "--available-now", env=s3.env)
    ids = sink_ids(workdir)
    lost = len(set(produced) - set(ids))
    duplicates = len(ids) - len(set(ids))
    record_property("lost", lost)
    record_property("duplicates", duplicates)
    print(f"driver restart elsewhere: {len(produced)} jobs, staged at the kill: batches "
          f"{staged}, lost {lost}, duplicates {duplicates}")
    # Leases (RETRY 300 s by default) never expired: nothing may come twice.
    assert (lost, duplicates) == (0, 0)
    assert client.qlen("events") == 0
    assert int(client.info("jobs")["jobs"]["registered_jobs"]) == 0
    assert StagingArea(staging).batches() == []
    client.close()


def test_an_executor_killed_mid_task_writes_each_row_once(standalone, shipped, server,
                                                          drivers) -> None:
    rows = 60000
    workdir = drivers / "executor-kill"
    client = Client(f"127.0.0.1:{server.port}")
    proc = submit(standalone, APP, ["sink", f"127.0.0.1:{server.port}", "orders", str(rows),
                                    "--partitions", "4", "--batch-size", "20"],
                  cwd=workdir / "cwd", log=workdir / "app.log", py_files=shipped)
    try:
        worker = standalone.workers[0]
        # The worker runs an executor (before any task), then the write starts.
        wait_for(worker.executor_pids, timeout=240, interval=0.1,
                 message=lambda: (workdir / "app.log").read_text()[-3000:])
        wait_for(lambda: client.qlen("orders") > 0, timeout=240, interval=0.01,
                 message=lambda: (workdir / "app.log").read_text()[-3000:])
        queued_at_kill = client.qlen("orders")
        for pid in worker.executor_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=300) == 0, (workdir / "app.log").read_text()[-4000:]
    finally:
        kill_group(proc)
    assert queued_at_kill < rows, "the write ended before the kill"
    log = (workdir / "app.log").read_text(errors="replace")
    assert "written" in log
    assert "Lost executor" in log  # Spark saw the kill and ran the lost tasks again
    bodies = bodies_in(client, "orders")
    client.close()
    # The killed tasks ran again; IDMP (dedup keys) added what they had sent once.
    assert bodies == Counter(f"row-{i}" for i in range(rows))


def test_a_node_killed_mid_batch_loses_nothing(standalone, shipped, server_factory, drivers,
                                              s3) -> None:
    nodes: list[DisqueProcess] = [
        server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS)) for _ in range(2)]
    join(nodes)
    wait_joined(nodes)
    produced: list[str] = []
    for n, node in enumerate(nodes):
        with Client(f"127.0.0.1:{node.port}", route_by_job_id=False) as client:
            produced += client.add_jobs("events", [f"n{n}-{i}" for i in range(400)],
                                        replicate=2, retry=2)
    workdir = drivers / "node-kill"
    staging = f"s3://{s3.bucket_name}/staging/node-kill"
    seeds = ",".join(f"127.0.0.1:{n.port}" for n in nodes)
    args = ["stream", seeds, "events", str(workdir), "--staging", staging, "--max-jobs", "150"]
    app = start_stream_until_staged(standalone, shipped, workdir, args, s3.env, batches=1,
                                    batch_delay=1.0)
    try:
        nodes[1].kill()  # mid-batch: jobs of both nodes staged, not acknowledged
        # The query goes on with the node left (copies of the dead node's
        # jobs are queued again there after their RETRY).
        wait_for(lambda: set(produced) <= set(sink_ids(workdir)), timeout=240, interval=0.5,
                 message=lambda: f"{len(set(produced) - set(sink_ids(workdir)))} jobs still "
                                 "missing: " + (workdir / "first.log").read_text()[-2000:])
        assert app.poll() is None, (workdir / "first.log").read_text()[-3000:]
    finally:
        kill_group(app)
    ids = sink_ids(workdir)
    assert set(ids) == set(produced)  # none lost


def packed_environment(workdir: Path) -> Path:
    """A venv-pack archive of a venv with the package installed from its wheel.

    What a user builds for ``spark.archives``: a regular (non-editable)
    install, which venv-pack accepts, plus what executors need beside it
    (pyarrow, pandas, numpy); pyspark itself comes from Spark.
    """
    source = workdir / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", ".venv", ".*_cache"))
    # The node's compiled core is of no use to executors: a pure wheel builds in seconds.
    pip = [sys.executable, "-m", "pip", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(workdir / "wheels"), str(source)],
                   check=True, timeout=600, env={**os.environ, "DISQUE_INTERPRETED": "1"})
    (wheel,) = (workdir / "wheels").glob("disque_py-*.whl")
    env_dir = workdir / "env"
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True, timeout=300)
    subprocess.run([str(env_dir / "bin" / "python"), *pip[1:], "install", str(wheel),
                    "pyarrow", "pandas", "numpy"], check=True, timeout=900)
    archive = workdir / "environment.tar.gz"
    venv_pack = shutil.which("venv-pack", path=str(Path(sys.executable).parent))
    assert venv_pack, "venv-pack is not installed: pip install -e '.[dev]'"
    subprocess.run([venv_pack, "-p", str(env_dir), "-o", str(archive), "--compress-level", "1"],
                   check=True, timeout=600, capture_output=True)
    return archive


def test_a_packed_environment_in_spark_archives(standalone, server, drivers) -> None:
    workdir = drivers / "archives"
    workdir.mkdir()
    archive = packed_environment(workdir)
    before = tasks_finished(standalone.workers[1])
    log = workdir / "app.log"
    # Spark runs a Python data source's tasks with the driver's Python path
    # (PYSPARK_DRIVER_PYTHON, else PYSPARK_PYTHON), so in client mode the
    # driver runs ./environment/bin/python too: the archive unpacked in its
    # working directory, as executors unpack it in theirs.
    cwd = workdir / "cwd"
    (cwd / "environment").mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(cwd / "environment")], check=True,
                   timeout=300)
    proc = submit(standalone, APP, ["sink", f"127.0.0.1:{server.port}", "packed", "1000",
                                    "--partitions", "6"],
                  cwd=cwd, log=log, env={"PYSPARK_PYTHON": "./environment/bin/python"},
                  conf={"spark.archives": f"{archive}#environment"})
    try:
        assert proc.wait(timeout=600) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        kill_group(proc)
    with Client(f"127.0.0.1:{server.port}") as client:
        assert bodies_in(client, "packed") == Counter(f"row-{i}" for i in range(1000))
    assert tasks_finished(standalone.workers[1]) > before, "the hidden worker ran no task"
