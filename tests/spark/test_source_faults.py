"""Kill the Spark driver (SIGKILL, whole process group) mid-batch and restart it.

The application is ``tests/spark/driver_app.py`` in its own process group:
a slow foreachBatch sink writing one Parquet file per batch ID (a replayed
batch overwrites its own file).  After the kill, before the restart, the test
checks that no acknowledged job is missing from the sink; after the
restart (availableNow, so it ends by itself) that every produced job is in
the sink, the queue is drained and nothing stays leased.  Duplicates can
only come from jobs whose lease really expired; the tests count them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from disque.client import Client
from spark_connector.staging import StagingArea
from tests.support.process import wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def start_app(port: int, workdir: Path, *args: str) -> subprocess.Popen:
    with open(workdir / "app.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.driver_app", str(port), "events", str(workdir),
             *args], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def sink_ids(workdir: Path) -> list[str]:
    ids: list[str] = []
    for path in sorted((workdir / "out").glob("batch-*.parquet")):
        ids.extend(pq.read_table(path).column("id").to_pylist())
    return ids


def read_int(path: Path) -> int | None:
    """The number the app wrote to ``path`` (None: none yet, or caught mid-write)."""
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def batches_done(workdir: Path) -> int:
    done = read_int(workdir / "progress")
    return 0 if done is None else done + 1


def staged_ids(workdir: Path) -> set[str]:
    staging = StagingArea(workdir / "staging")
    try:
        return {i for seq in staging.batches() for _, table in staging.read_parts(seq)
                for i in table.column("id").to_pylist()}
    except FileNotFoundError:  # a batch acknowledged (removed) while we looked
        return set()


def run_to_completion(port: int, workdir: Path, *args: str) -> None:
    proc = start_app(port, workdir, "--available-now", *args)
    try:
        assert proc.wait(timeout=300) == 0, (workdir / "app.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill_group(proc)


def acked(client: Client, ids: list[str]) -> set[str]:
    """IDs the node no longer knows: acknowledged (and garbage collected)."""
    return {i for i in ids if client.show(i) is None}


def mid_batch(workdir: Path) -> bool:
    """A batch has begun in the sink and not finished (each sleeps a while)."""
    started = read_int(workdir / "started")
    return started is not None and started == batches_done(workdir)


@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_driver_sigkill_mid_batch_loses_nothing(server, tmp_path: Path, fetch_mode: str) -> None:
    """Nothing is lost; what was fetched but not staged at the kill waits for its RETRY.

    The restarted query replays the batch Spark was running and reads on to
    the end of the queue. A job a GETJOB had leased when the driver died, in
    a batch not staged yet (the fetch ahead in driver mode, a task's fetch
    not published in executor mode), is in no staging: no driver heartbeats
    it, nobody acknowledges it, and its node queues it again after its RETRY
    (300 s here), for the next run to read. Such jobs are checked to be just
    that: leased ("active") on the node, due again within their RETRY.

    The restart also runs docs/SPARK.md's progress snippet on every progress
    report, the replayed batch's included.
    """
    client = Client(f"127.0.0.1:{server.port}")
    produced = client.add_jobs("events", [f"job-{i}" for i in range(1500)])
    app = start_app(server.port, tmp_path, "--fetch-mode", fetch_mode, "--max-jobs", "200",
                    "--batch-delay", "1.5")
    try:
        # Kill mid-batch: each batch sleeps 1.5 s in the sink with its jobs
        # staged (in executor mode the parts appear once the tasks ran).
        wait_for(lambda: batches_done(tmp_path) >= 2 and mid_batch(tmp_path)
                 and staged_ids(tmp_path), timeout=180, interval=0.1,
                 message=lambda: (tmp_path / "app.log").read_text()[-3000:])
    finally:
        kill_group(app)
    in_sink = set(sink_ids(tmp_path))
    assert acked(client, produced) <= in_sink  # nothing ACKed that the sink lacks
    assert staged_ids(tmp_path), "the kill should leave a staged, unacknowledged batch"

    run_to_completion(server.port, tmp_path, "--fetch-mode", fetch_mode, "--max-jobs", "200",
                      "--progress", str(tmp_path / "progress.json"), "--docs-snippet")
    ids = sink_ids(tmp_path)
    # Leases (RETRY 300 s by default) never expired: no job was delivered twice.
    assert len(ids) == len(set(ids))
    assert set(ids) <= set(produced)
    held = set(produced) - set(ids)
    for job_id in held:  # fetched before the kill, never staged: leased, not lost
        job = client.show(job_id)
        assert job is not None and job["state"] == "active", job
        assert 0 < job["next-requeue-within"] <= job["retry"] * 1000
    assert client.qlen("events") == 0
    assert int(client.info("jobs")["jobs"]["registered_jobs"]) == len(held)
    assert StagingArea(tmp_path / "staging").batches() == []

    reports = json.loads((tmp_path / "progress.json").read_text())
    replayed = reports[0]
    assert replayed["progress"]["sources"][0]["latestOffset"] is None  # Spark did not ask
    for report in reports:
        figures, progress = report["snippet"], report["progress"]
        assert figures["batch"] == progress["sources"][0]["endOffset"]["batch"]
        assert figures["jobs"] >= progress["numInputRows"]  # executor mode: planned
    # The replayed batch's own figures, from when it was staged; the counters
    # go on from there (they are not reset by the restart).
    assert replayed["progress"]["numInputRows"] > 0
    final = reports[-1]["snippet"]
    assert final["jobsAcked"] == replayed["snippet"]["jobsAcked"] + sum(
        r["progress"]["numInputRows"] for r in reports)
    assert final["jobsLeased"] == 0


def test_expired_leases_bound_the_duplicates(server, tmp_path: Path) -> None:
    """With RETRY 1 and the driver dead for longer, staged jobs are queued again.

    The replayed batch is acknowledged before anything new is fetched, so
    even then a lone consumer sees at most the staged jobs twice.
    """
    client = Client(f"127.0.0.1:{server.port}")
    produced = client.add_jobs("events", [f"job-{i}" for i in range(800)], retry=1)
    app = start_app(server.port, tmp_path, "--max-jobs", "200", "--batch-delay", "1.5")
    try:
        # Killed with a batch staged, as the test above: right after a batch
        # is done the next one may not have fetched its jobs yet.
        wait_for(lambda: batches_done(tmp_path) >= 1 and staged_ids(tmp_path), timeout=180,
                 interval=0.2, message=lambda: (tmp_path / "app.log").read_text()[-3000:])
    finally:
        kill_group(app)
    leased = staged_ids(tmp_path)
    assert leased, "the kill should leave a staged, unacknowledged batch"
    # Without heartbeats the node queues the staged jobs again after RETRY.
    # A batch whose ACK went out just before the kill can still be staged
    # (the source ACKs, then removes the staged copy): its jobs are gone
    # from the node instead (SHOW answers nil).
    def states() -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for job_id in leased:
            job = client.show(job_id)
            found.setdefault(job["state"] if job else "acked", set()).add(job_id)
        return found

    wait_for(lambda: set(states()) <= {"queued", "acked"}, timeout=30, interval=0.2,
             message=lambda: "staged jobs to be queued again; jobs by state: "
                             f"{ {state: len(ids) for state, ids in states().items()} }")

    run_to_completion(server.port, tmp_path, "--max-jobs", "200")
    ids = sink_ids(tmp_path)
    assert set(ids) == set(produced)
    duplicated = {i for i in ids if ids.count(i) > 1}
    assert duplicated <= leased
    assert len(ids) - len(set(ids)) <= len(leased)
    assert client.qlen("events") == 0
    assert int(client.info("jobs")["jobs"]["registered_jobs"]) == 0
