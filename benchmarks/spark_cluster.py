"""3 nodes against 1, in the same run: the Spark source's drain and the sink's write.

Run through ``benchmarks.spark_source --cluster`` and ``benchmarks.spark_sink
--cluster`` (or ``python3 -m benchmarks.run spark-source-cluster`` /
``spark-sink-cluster``). Both start a lone node and a 3-node cluster (real
processes, joined, ``appendonly no``) and one local Spark session, and
alternate the two targets ``--rounds`` times so that a busy machine hurts
both alike; medians are reported.

* **Drain**: the queue is pre-filled (not timed) with ``--jobs`` jobs: all on
  the lone node, or a third on each cluster node (REPLICATE default: 1 on the
  lone node, 3 copies on the cluster); then ``readStream`` into ``noop``
  with ``trigger(availableNow=True)`` and ``fetchMode=executor`` (one task
  per node), timed until every job is acknowledged *and* garbage collected
  on every node (``registered_jobs`` 0 everywhere).
* **Sink**: ``spark.range(rows)`` as ``body`` with 3 partitions written with
  ``df.write.format("disque")`` to the lone node, to the cluster (REPLICATE
  default, 3 copies) and to the cluster with ``replicate=1``.

All processes share the machine's cores: three nodes plus Spark on 2 cores
compete for CPU, so the cluster figures are a floor, not a scaling result.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from disque.client import Client
from tests.support.cluster import join, wait_joined
from tests.support.process import DisqueProcess, wait_for

__all__ = ["compare_drain", "compare_sink", "Targets"]


class Targets:
    """A lone node and a joined 3-node cluster, stopped on exit."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="spark-cluster-bench-"))
        self.lone = DisqueProcess(self.root / "lone", "--maxmemory", "4gb").start()
        self.cluster = [DisqueProcess(self.root / f"n{i}", "--maxmemory", "4gb").start()
                        for i in range(3)]
        join(self.cluster)
        wait_joined(self.cluster)

    def nodes(self, which: str) -> list[DisqueProcess]:
        return [self.lone] if which == "1 node" else self.cluster

    def close(self) -> None:
        for node in [self.lone, *self.cluster]:
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Targets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def address(node: DisqueProcess) -> str:
    return f"127.0.0.1:{node.port}"


def registered(node: DisqueProcess) -> int:
    with Client(address(node), route_by_job_id=False) as client:
        return int(client.info("jobs")["jobs"]["registered_jobs"])


def _prefill(nodes: list[DisqueProcess], queue: str, jobs: int, body_bytes: int) -> None:
    share = [jobs // len(nodes) + (1 if i < jobs % len(nodes) else 0) for i in range(len(nodes))]
    for i, node in enumerate(nodes):
        with Client(address(node), route_by_job_id=False) as client:
            client.add_jobs(queue, (f"{queue}-{i}-{k:09d}".ljust(body_bytes, "x")
                                    for k in range(share[i])))


def _drain_once(spark, nodes: list[DisqueProcess], root: Path, queue: str) -> float:
    reader = (spark.readStream.format("disque").option("queues", queue)
              .option("nodes", ",".join(address(n) for n in nodes))
              .option("stagingPath", str(root / f"staging-{queue}"))
              .option("fetchMode", "executor").option("maxJobsPerTrigger", "20000"))
    t0 = time.perf_counter()
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", str(root / f"checkpoint-{queue}"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    wait_for(lambda: all(registered(n) == 0 for n in nodes), timeout=120, interval=0.01,
             message="every job acknowledged on every node")
    return time.perf_counter() - t0


def _rounds(rounds: int, targets: list[str],
            run: Callable[[str, int], float]) -> dict[str, list[float]]:
    seconds: dict[str, list[float]] = {t: [] for t in targets}
    for r in range(rounds):
        for target in (targets if r % 2 == 0 else targets[::-1]):
            seconds[target].append(run(target, r))
    return seconds


def _report(title: str, count: int, seconds: dict[str, list[float]]) -> list[dict[str, Any]]:
    base = statistics.median(seconds[next(iter(seconds))])
    rows = []
    print(f"\n{title}: {count} jobs, median of {len(next(iter(seconds.values())))} rounds")
    print(f"  {'target':<28}{'seconds':>9}{'jobs/s':>10}{'vs 1 node':>11}")
    for target, values in seconds.items():
        median = statistics.median(values)
        rows.append({"target": target, "seconds": values, "median_s": median,
                     "rate": count / median, "ratio": base / median})
        print(f"  {target:<28}{median:>9.2f}{count / median:>10.0f}{base / median:>11.2f}")
    return rows


def compare_drain(spark, jobs: int, body_bytes: int, rounds: int) -> list[dict[str, Any]]:
    """Drain ``jobs`` from 1 node and from 3 nodes (a third each); jobs/s per target."""
    with Targets() as t:
        def run(target: str, r: int) -> float:
            nodes = t.nodes(target)
            queue = f"drain-{target[0]}-{r}"
            _prefill(nodes, queue, jobs, body_bytes)
            return _drain_once(spark, nodes, t.root, queue)

        _prefill(t.cluster, "warm", 300, body_bytes)  # JVM and Python workers warm
        _drain_once(spark, t.cluster, t.root, "warm")
        seconds = _rounds(rounds, ["1 node", "3 nodes"], run)
    return _report("Spark source drain (executor fetch, availableNow, into noop)", jobs,
                   seconds)


def compare_sink(spark, rows: int, rounds: int) -> list[dict[str, Any]]:
    """Write ``rows`` jobs to 1 node, to 3 nodes (3 copies) and to 3 nodes (1 copy)."""
    df = spark.range(0, rows, numPartitions=3).selectExpr("concat('job-', id) AS body")
    targets = {"1 node": {}, "3 nodes, REPLICATE 3": {}, "3 nodes, replicate=1":
               {"replicate": "1"}}
    with Targets() as t:
        def write(nodes: list[DisqueProcess], queue: str, options: dict[str, str]) -> float:
            writer = (df.write.format("disque").mode("append").option("queue", queue)
                      .option("nodes", ",".join(address(n) for n in nodes)))
            for key, value in options.items():
                writer = writer.option(key, value)
            t0 = time.perf_counter()
            writer.save()
            return time.perf_counter() - t0

        def run(target: str, r: int) -> float:
            nodes = t.nodes("1 node" if target == "1 node" else "3 nodes")
            queue = f"sink-{len(nodes)}-{r}-{len(targets[target])}"
            seconds = write(nodes, queue, targets[target])
            queued = 0
            for node in nodes:
                with Client(address(node), route_by_job_id=False) as client:
                    queued += client.qlen(queue)
            if queued != rows:
                raise RuntimeError(f"{target}: {queued} jobs queued, expected {rows}")
            return seconds

        write(t.cluster, "warm", {})
        seconds = _rounds(rounds, list(targets), run)
    return _report("Spark sink (df.write, 3 partitions)", rows, seconds)
