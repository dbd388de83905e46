"""Streaming consumer: Disque queue -> JSON events -> windowed aggregates -> Parquet.

Reads the ``orders`` queue with the streaming source (at-least-once), parses
the JSON bodies, drops redelivered jobs by job ID within the watermark, and
writes per-window, per-product order counts and revenue as Parquet with a
checkpoint. What each piece guarantees:

* the source acknowledges a job only after Spark committed the micro-batch
  that holds it, and replays an uncommitted batch identically after a crash;
* a job whose lease expired can be delivered twice: ``dropDuplicatesWithinWatermark``
  on the job ID makes the aggregates count it once (the idempotent step);
* the Parquet file sink with a checkpoint commits each batch exactly once.

A window is written once the watermark (latest event time minus
``--watermark``) passes its end; the newest windows stay open until later
events arrive.

    python -m jobs.stream_aggregates                     # runs until Ctrl-C
    python -m jobs.stream_aggregates --available-now     # drain what is queued, then exit
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ._common import DEFAULT_NODES, spark_session

EVENT_SCHEMA = ("order_id STRING, customer STRING, product STRING, quantity INT, "
                "amount DOUBLE, event_time TIMESTAMP")


def build_query(spark, *, nodes: str, queue: str, output: Path, checkpoint: Path,
                staging: Path, window: str = "5 minutes", watermark: str = "2 minutes",
                available_now: bool = False, max_jobs_per_trigger: int = 5000,
                fetch_mode: str = "driver"):
    """Start the streaming query; returns the ``StreamingQuery``.

    ``fetch_mode="executor"`` fetches from every node of the cluster in
    parallel, in Spark tasks (docs/SPARK.md).
    """
    from pyspark.sql import functions as F

    jobs = (spark.readStream.format("disque")
            .option("nodes", nodes).option("queues", queue)
            .option("stagingPath", str(staging))   # durable, one per query
            .option("bodyFormat", "string")
            .option("maxJobsPerTrigger", str(max_jobs_per_trigger))
            .option("fetchMode", fetch_mode)
            .load())
    events = (jobs.select(F.col("id").alias("job_id"),
                          F.from_json("body", EVENT_SCHEMA).alias("event"))
              .select("job_id", "event.*")
              # A body that is not an order event has no event time: a real
              # pipeline would send it to a dead-letter queue (see jobs.worker).
              .where(F.col("event_time").isNotNull()))
    aggregates = (events.withWatermark("event_time", watermark)
                  .dropDuplicatesWithinWatermark(["job_id"])
                  .groupBy(F.window("event_time", window), "product")
                  .agg(F.count("*").alias("orders"), F.sum("quantity").alias("units"),
                       F.round(F.sum("amount"), 2).alias("revenue"))
                  .select(F.col("window.start").alias("window_start"),
                          F.col("window.end").alias("window_end"),
                          "product", "orders", "units", "revenue"))
    writer = (aggregates.writeStream.format("parquet").outputMode("append")
              .option("path", str(output)).option("checkpointLocation", str(checkpoint))
              .queryName(f"disque-{queue}-aggregates"))
    writer = (writer.trigger(availableNow=True) if available_now
              else writer.trigger(processingTime="1 second"))
    return writer.start()


def source_metrics(query) -> dict[str, Any]:
    """The disque source's counters from the query's last progress report
    (its ``endOffset``, never null: docs/SPARK.md, "Progress and logs")."""
    progress = query.lastProgress
    if not progress or not progress.get("sources"):
        return {}
    end = progress["sources"][0].get("endOffset")
    return json.loads(end) if isinstance(end, str) else dict(end or {})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="Disque nodes, host:port,...")
    parser.add_argument("--queue", default="orders")
    parser.add_argument("--output", type=Path, default=Path("demo-output/aggregates"))
    parser.add_argument("--checkpoint", type=Path, default=Path("demo-output/checkpoint"))
    parser.add_argument("--staging", type=Path, default=Path("demo-output/staging"),
                        help="the source's stagingPath (keep it with the checkpoint)")
    parser.add_argument("--window", default="5 minutes")
    parser.add_argument("--watermark", default="2 minutes")
    parser.add_argument("--max-jobs-per-trigger", type=int, default=5000)
    parser.add_argument("--available-now", action="store_true",
                        help="process what is queued now, then stop")
    parser.add_argument("--fetch-mode", choices=("driver", "executor"), default="driver",
                        help="executor: Spark tasks fetch from every node in parallel")
    args = parser.parse_args(argv)
    spark = spark_session("disque-stream-aggregates")
    query = build_query(spark, nodes=args.nodes, queue=args.queue, output=args.output,
                        checkpoint=args.checkpoint, staging=args.staging,
                        window=args.window, watermark=args.watermark,
                        available_now=args.available_now,
                        max_jobs_per_trigger=args.max_jobs_per_trigger,
                        fetch_mode=args.fetch_mode)
    try:
        while query.isActive:
            query.awaitTermination(5)
            metrics = source_metrics(query)
            if metrics:
                print(f"fetched {metrics.get('jobsFetched', 0)}  "
                      f"acked {metrics.get('jobsAcked', 0)}  "
                      f"queued {metrics.get('queueLength', 0)}", flush=True)
        if query.exception() is not None:
            raise SystemExit(f"query failed: {query.exception()}")
        for address, node in sorted(source_metrics(query).get("nodes", {}).items()):
            print(f"node {address}: fetched {node['fetched']}", flush=True)
    except KeyboardInterrupt:
        query.stop()
    finally:
        spark.stop()
    print(f"aggregates in {args.output} ({time.strftime('%H:%M:%S')})")


if __name__ == "__main__":
    main()
