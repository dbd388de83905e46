"""Spark source latency benchmark (not a test): the first batch, and producer to sink.

    python3 -m benchmarks.spark_latency [--rate 200] [--seconds 20] [--json PATH]
    python3 -m benchmarks.spark_latency --standalone [--staging s3]   # spark_standalone.py
    python3 -m benchmarks.spark_latency --smoke                       # < 2 minutes

starts one real node and one Spark session (``local[2]``, or the standalone
cluster of benchmarks/spark_standalone.py) and, for each ``processingTime``
trigger of ``--triggers`` (0 s and 1 s by default), runs one streaming query
from ``format("disque")`` into a ``foreachBatch`` sink that writes each
batch as a Parquet file, and measures:

1. **The first batch.** ``--first-jobs`` jobs are queued before the query
   starts; the time from ``start()`` until the sink has written the first
   batch, by phase: Spark's start-up (``start()`` to its first trigger);
   the source's own steps in that trigger, from the batch's ``endOffset``
   (``timingsMs``: the source's driver process starting, which checks the
   nodes and the store and recovers staged batches; the GETJOB loop; the
   staging); the rest of Spark's first trigger (planning, the executors
   reading the rows, the sink, the checkpoint); and the first batch's ACK,
   which runs in the next trigger (or beside it, ``fetchAhead``).
2. **End to end.** A producer thread then adds ``--rate`` jobs per second
   for ``--seconds``, each body the time of its ADDJOB; the sink notes when
   the batch holding each row was written: latency = written - added.
   Reported: p50, p99 and max over the jobs added after ``--warmup`` s.

Spark's stderr goes to ``--log``.  Each figure is one run: repeat the
command to see the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.spark_standalone import Placement, add_arguments, placement
from disque.client import Client
from tests.support.process import DisqueProcess

__all__ = ["main"]

PLACEMENT = Placement(master="local[2]")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def at(timestamp: str) -> float:
    """A progress report's timestamp as Unix time."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


class Sink:
    """foreachBatch: each batch written as Parquet, then the time noted per row."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.written: list[tuple[int, int, float]] = []  # (batch, rows, time written)
        self.latencies: list[tuple[float, float]] = []   # (added at, latency)
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        bodies = [r.body for r in df.select("body").collect()]
        if bodies:
            pq.write_table(pa.table({"body": bodies}), self.out / f"batch-{batch_id:06d}.parquet")
        now = time.time()
        with self.lock:
            self.written.append((batch_id, len(bodies), now))
            for body in bodies:
                if body.startswith("t="):
                    added = float(body[2:])
                    self.latencies.append((added, now - added))


def spark_session(master: str) -> Any:
    from spark_connector.session import local_session

    return local_session("disque-latency-benchmark", master, {
        "spark.sql.streaming.pollingDelay": "10ms", **PLACEMENT.conf})


def run_trigger(args: argparse.Namespace, spark: Any, root: Path, client: Client, port: int,
                trigger: float) -> dict[str, Any]:
    name = f"t{trigger:g}".replace(".", "_")
    queue = f"latency-{name}"
    out = root / f"out-{name}"
    out.mkdir()
    client.add_jobs(queue, [b"first-%d" % i for i in range(args.first_jobs)])
    sink = Sink(out)
    started = time.time()
    query = (spark.readStream.format("disque").option("nodes", f"127.0.0.1:{port}")
             .option("queues", queue).option("bodyFormat", "string")
             .option("stagingPath", PLACEMENT.staging(root, name))
             .option("fetchTimeoutMs", "100ms").load()
             .writeStream.foreachBatch(sink)
             .option("checkpointLocation", str(root / f"checkpoint-{name}"))
             .trigger(processingTime=f"{trigger:g} seconds").start())
    try:
        deadline = time.monotonic() + 300
        while not sink.written and time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"query failed: {query.exception()}")
            time.sleep(0.01)  # a poll of the sink's own list, at its granularity
        first_written = sink.written[0][2]
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.01)  # the trigger's report comes once its commit is done
        reports = [json.loads(p.json) for p in query.recentProgress]
        first = reports[0]
        timings = first["sources"][0]["endOffset"].get("timingsMs", {})
        phases = {
            "spark start-up (start() to the first trigger)": (at(first["timestamp"]) - started),
            "source: driver process start (nodes, store, recovery)":
                timings.get("startMs", 0) / 1000,
            "source: fetch (GETJOB loop)": timings.get("fetchMs", 0) / 1000,
            "source: staging": timings.get("stageMs", 0) / 1000,
        }
        ours = sum(v for k, v in phases.items() if k.startswith("source:"))
        phases["spark: rest of the first trigger (planning, tasks, sink, checkpoint)"] = (
            first_written - at(first["timestamp"]) - ours)
        first_batch = {"seconds": first_written - started, "rows": sink.written[0][1],
                       "phases": phases,
                       "spark durationMs of the first trigger": first["durationMs"]}

        # End to end: a steady producer.
        stop = threading.Event()
        producer_errors: list[BaseException] = []
        produced = [0]

        def produce() -> None:
            with Client(f"127.0.0.1:{port}") as producer:
                interval = 1 / args.rate
                due = time.monotonic()
                try:
                    while not stop.is_set():
                        producer.add_job(queue, f"t={time.time():.6f}")
                        produced[0] += 1
                        due += interval
                        pause = due - time.monotonic()
                        if pause > 0:
                            stop.wait(pause)
                except BaseException as exc:  # reported by the main thread
                    producer_errors.append(exc)

        produced_from = time.time()
        thread = threading.Thread(target=produce, name="producer", daemon=True)
        thread.start()
        stop.wait(args.seconds)
        stop.set()
        thread.join(10)
        if producer_errors:
            raise producer_errors[0]
        drained = time.monotonic() + 60 + 3 * trigger
        while len(sink.latencies) < produced[0] and time.monotonic() < drained:
            time.sleep(0.05)  # until the sink has written every job produced
        # The first batch's ACK runs in a later trigger (before its fetch, or
        # beside it with fetchAhead): the first figures that carry an ACK.
        acks = [r["sources"][0]["endOffset"].get("timingsMs", {}).get("ackMs")
                for r in (json.loads(p.json) for p in query.recentProgress)]
        first_batch["ack of the first batch (next trigger), s"] = next(
            (ms / 1000 for ms in acks if ms is not None), 0.0)
        with sink.lock:
            measured = [lat for added, lat in sink.latencies
                        if added >= produced_from + args.warmup]
        end_to_end = {"jobs": len(measured), "rate": args.rate,
                      "p50": percentile(measured, 0.5) if measured else None,
                      "p99": percentile(measured, 0.99) if measured else None,
                      "max": max(measured) if measured else None,
                      "mean": statistics.fmean(measured) if measured else None}
    finally:
        query.stop()
    return {"trigger_s": trigger, "first_batch": first_batch, "end_to_end": end_to_end}


def print_report(result: dict[str, Any]) -> None:
    where = ("standalone cluster (a master, 2 workers of 1 core)" if result["standalone"]
             else result["master"])
    print(f"\nSpark source latency: {where}, staging {result['staging']}; one node")
    for n, run in enumerate(result["runs"], 1):
        first, e2e = run["first_batch"], run["end_to_end"]
        young = " (the application's first query: a young JVM)" if n == 1 else ""
        print(f"\ntrigger processingTime={run['trigger_s']:g} s, query {n} of the "
              f"session{young}")
        print(f"  first batch: {first['seconds'] * 1000:.0f} ms from start() to its "
              f"{first['rows']} rows written by the sink")
        for phase, seconds in first["phases"].items():
            print(f"    {phase:<72} {seconds * 1000:6.0f} ms")
        print(f"    {'(then) ack of the first batch, in the next trigger':<72} "
              f"{first['ack of the first batch (next trigger), s'] * 1000:6.0f} ms")
        if e2e["p50"] is None:
            print("  end to end: no job measured")
        else:
            print(f"  end to end, ADDJOB to the row written by the sink ({e2e['jobs']} jobs at "
                  f"{e2e['rate']}/s): p50 {e2e['p50'] * 1000:.0f} ms, p99 "
                  f"{e2e['p99'] * 1000:.0f} ms, max {e2e['max'] * 1000:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--triggers", default="0,1",
                        help="processingTime triggers in seconds, comma separated "
                             "(default: %(default)s)")
    parser.add_argument("--first-jobs", type=int, default=1000,
                        help="jobs queued before the query starts (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=200.0,
                        help="jobs per second the producer adds (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=20.0,
                        help="how long the producer runs (default: %(default)s)")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="jobs added in the first seconds are not measured "
                             "(default: %(default)s)")
    parser.add_argument("--smoke", action="store_true",
                        help="short: 100 first jobs, 4 s of production, 1 s of warm-up")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--log", metavar="PATH", type=Path,
                        default=Path(tempfile.gettempdir()) / "spark_latency_bench.stderr.log")
    add_arguments(parser)
    args = parser.parse_args()
    if args.smoke:
        args.first_jobs, args.seconds, args.warmup = 100, 4.0, 1.0
    global PLACEMENT
    with placement(args) as PLACEMENT:
        args.master = PLACEMENT.master
        run(args)


def run(args: argparse.Namespace) -> None:
    from benchmarks.spark_source import stderr_to

    result: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in
                            ["python3", "-m", "benchmarks.spark_latency", *sys.argv[1:]]),
        "cpus": os.cpu_count(), "master": args.master, "standalone": args.standalone,
        "staging": args.staging, "runs": []}
    root = Path(tempfile.mkdtemp(prefix="spark-latency-bench-"))
    node = DisqueProcess(root / "node")
    node.start()
    client = Client(f"127.0.0.1:{node.port}")
    print(f"node on port {node.port}; stderr of Spark and the source -> {args.log}",
          flush=True)
    try:
        with stderr_to(args.log):
            spark = spark_session(args.master)
            try:
                for trigger in (float(t) for t in args.triggers.split(",")):
                    result["runs"].append(run_trigger(args, spark, root, client, node.port,
                                                      trigger))
            finally:
                spark.stop()
    finally:
        client.close()
        node.kill()
        shutil.rmtree(root, ignore_errors=True)
    print_report(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"results written to {args.json}")


if __name__ == "__main__":
    main()
