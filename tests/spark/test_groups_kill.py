"""1,000 ordered groups through a streaming query whose driver is SIGKILLed
mid-stream, then restarted from the same checkpoint.

The application is ``tests/spark/driver_app.py`` (``--include-groups``) in
its own process group, on a real node and a real Spark ``local[2]``: a
slow foreachBatch sink writes each micro-batch's rows (``id``, ``group``,
``group_position``) to ``out/batch-<id>.parquet``; a replayed batch
overwrites its own file.  Small GETJOB counts (7, not a multiple of a
group's 5 jobs) and batches of 300 make groups span micro-batches.

What the test accepts, precisely:

* every job reaches the sink at least once;
* per group, in add order: no delivery of a job is in an earlier batch
  than the first delivery of any job added before it (a job may be
  delivered again later, at-least-once: a duplicate is counted, not
  refused, and may only come from a lost lease);
* a job's ``group_position`` is the same in every delivery, and strictly
  increases in add order within its group;
* within one batch a group's jobs are consecutive in add order.
"""

from __future__ import annotations

import itertools
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
GROUPS, PER_GROUP = 1000, 5
#: Short, so that the jobs a GETJOB had leased when the driver died, in no
#: staged batch, come back (and release their group) soon; long enough
#: for a restart, and heartbeats renew the staged ones anyway.
RETRY_S = 15


def start_app(port: int, workdir: Path) -> subprocess.Popen:
    with open(workdir / "app.log", "ab") as log:  # the child keeps its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.driver_app", str(port), "ordered", str(workdir),
             "--include-groups", "--max-jobs", "300", "--fetch-batch-size", "7",
             "--num-partitions", "2", "--batch-delay", "0.5",
             "--stop-file", str(workdir / "stop")],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def kill_group(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def deliveries(workdir: Path) -> list[tuple[int, str, str | None, int | None]]:
    """(batch, id, group, group_position) of every row in the sink."""
    out = []
    for path in sorted((workdir / "out").glob("batch-*.parquet")):
        batch = int(path.stem.split("-")[1])
        table = pq.read_table(path).to_pydict()
        out += [(batch, job_id, group, position) for job_id, group, position in
                zip(table["id"], table["group"], table["group_position"], strict=True)]
    return out


def staged(workdir: Path) -> bool:
    try:
        return bool(StagingArea(workdir / "staging").batches())
    except FileNotFoundError:
        return False


def mid_batch(workdir: Path) -> bool:
    started, done = read_int(workdir / "started"), read_int(workdir / "progress")
    return started is not None and started == (0 if done is None else done + 1)


def test_groups_stay_in_order_across_batches_and_a_driver_sigkill(server,
                                                                   tmp_path: Path) -> None:
    client = Client(f"127.0.0.1:{server.port}")
    keys = [f"g{g:04d}" for g in range(GROUPS)]
    # Round by round, so that a group's jobs are far apart in the queue.
    order: dict[str, list[str]] = {key: [] for key in keys}
    for round_ in range(PER_GROUP):
        ids = client.add_jobs("ordered", [f"{key}/{round_}" for key in keys],
                              job_groups=keys, retry=RETRY_S)
        for key, job_id in zip(keys, ids, strict=True):
            order[key].append(job_id)
    produced = {job_id for ids in order.values() for job_id in ids}
    assert len(produced) == GROUPS * PER_GROUP

    app = start_app(server.port, tmp_path)
    try:
        wait_for(lambda: (read_int(tmp_path / "progress") or 0) >= 3 and mid_batch(tmp_path)
                 and staged(tmp_path), timeout=240, interval=0.05,
                 message=lambda: (tmp_path / "app.log").read_text()[-3000:])
    finally:
        kill_group(app)
    before = {job_id for _, job_id, _, _ in deliveries(tmp_path)}
    assert 0 < len(before) < len(produced), "the kill should come mid-stream"
    assert staged(tmp_path), "the kill should leave a staged, unacknowledged batch"

    app = start_app(server.port, tmp_path)
    try:
        # The jobs leased when the driver died and staged nowhere come back
        # after their RETRY; everything is in the sink soon after.
        wait_for(lambda: {row[1] for row in deliveries(tmp_path)} >= produced,
                 timeout=300, interval=0.5,
                 message=lambda: (f"{len(produced - {r[1] for r in deliveries(tmp_path)})} "
                                  "jobs missing\n" + (tmp_path / "app.log").read_text()[-3000:]))
        (tmp_path / "stop").touch()
        assert app.wait(timeout=120) == 0, (tmp_path / "app.log").read_text()[-3000:]
    finally:
        if app.poll() is None:
            kill_group(app)

    rows = deliveries(tmp_path)
    assert {job_id for _, job_id, _, _ in rows} == produced
    group_of = {job_id: key for key, ids in order.items() for job_id in ids}
    batches: dict[str, list[int]] = {}
    positions: dict[str, set[int | None]] = {}
    for batch, job_id, group, position in rows:
        assert group == group_of[job_id]
        batches.setdefault(job_id, []).append(batch)
        positions.setdefault(job_id, set()).add(position)
    duplicates = sum(len(b) - 1 for b in batches.values())
    spanning = 0
    for key, ids in order.items():
        # One position per job, increasing in add order.
        assert all(len(positions[job_id]) == 1 for job_id in ids), key
        ranks = [next(iter(positions[job_id])) for job_id in ids]
        assert all(a is not None and b is not None and a < b
                   for a, b in itertools.pairwise(ranks)), (key, ranks)
        # No delivery before the first delivery of a job added earlier.
        firsts = [min(batches[job_id]) for job_id in ids]
        for k, job_id in enumerate(ids):
            for b in batches[job_id]:
                assert all(first <= b for first in firsts[:k]), (key, k, b, firsts)
        spanning += len(set(firsts)) > 1
        # Within a batch the group's jobs are consecutive in add order.
        for b in {b for job_id in ids for b in batches[job_id]}:
            held = [k for k, job_id in enumerate(ids) if b in batches[job_id]]
            assert held == list(range(held[0], held[-1] + 1)), (key, b, held)
    assert spanning >= GROUPS // 10, f"only {spanning} groups spanned micro-batches"
    print(f"{len(rows)} deliveries, {duplicates} duplicates, {spanning} groups spanned batches")
    assert client.qlen("ordered") == 0
    client.close()
