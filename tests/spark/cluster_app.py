"""Spark applications for the standalone-cluster tests, run with spark-submit.

    spark-submit --master spark://... --py-files disque-spark.zip \\
        --conf spark.executorEnv.PYTHONPATH=disque-spark.zip \\
        tests/spark/cluster_app.py sink NODES QUEUE ROWS [--partitions N] [--batch-size N]
    ... cluster_app.py stream NODES QUEUE WORKDIR --staging URI [--fetch-mode M]
        [--available-now] [--max-jobs N] [--partitions N] [--batch-delay S]
        [--progress FILE]

Run by file path from a directory outside the checkout, as a user's job is:
it imports only pyspark and, through the short name, the connector.

``sink`` writes ROWS rows ``row-<i>`` (dedup key ``key-<i>``, IDMP on) and
prints ``written``. ``stream`` reads QUEUE and writes each micro-batch's job
IDs (and ``additional_deliveries``) to ``WORKDIR/out/batch-<id>.parquet`` with
foreachBatch on the driver (a replayed batch overwrites its own file:
duplicates in the union of the files are jobs delivered twice); the
checkpoint is ``WORKDIR/checkpoint``; it prints ``DONE`` when an
availableNow run ends, and writes each progress report's time and the
source's figures (its ``endOffset``) to ``--progress`` FILE.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path


def session(app: str):
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName(app).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def sink(args: argparse.Namespace) -> None:
    spark = session("disque-cluster-sink")
    df = (spark.range(0, args.rows, numPartitions=args.partitions)
          .selectExpr("concat('row-', cast(id as string)) as body",
                      "concat('key-', cast(id as string)) as _disque_key"))
    (df.write.format("disque").mode("append")
     .option("nodes", args.nodes).option("queue", args.queue)
     .option("dedupKey", "true").option("idmp", "true")
     .option("batchSize", str(args.batch_size)).save())
    print("written", flush=True)
    spark.stop()


def stream(args: argparse.Namespace) -> None:
    spark = session("disque-cluster-stream")
    out = args.workdir / "out"
    out.mkdir(parents=True, exist_ok=True)

    def write_batch(df, batch_id: int) -> None:
        (args.workdir / "started").write_text(str(batch_id))
        rows = df.select("id", "additional_deliveries").collect()
        if args.batch_delay:
            time.sleep(args.batch_delay)  # a slow sink: the window the tests kill in
        if rows:
            import pyarrow as pa
            import pyarrow.parquet as pq

            tmp = out / f".batch-{batch_id}.tmp"
            pq.write_table(pa.table({"id": [r.id for r in rows],
                                     "redelivered": [r.additional_deliveries for r in rows]}),
                           tmp)
            os.replace(tmp, out / f"batch-{batch_id:06d}.parquet")
        (args.workdir / "progress").write_text(str(batch_id))

    reader = (spark.readStream.format("disque")
              .option("nodes", args.nodes).option("queues", args.queue)
              .option("stagingPath", args.staging)
              .option("fetchMode", args.fetch_mode)
              .option("maxJobsPerTrigger", str(args.max_jobs))
              .option("numPartitions", str(args.partitions))
              .option("fetchTimeoutMs", "200"))
    writer = (reader.load().writeStream.foreachBatch(write_batch)
              .option("checkpointLocation", str(args.workdir / "checkpoint")))
    writer = (writer.trigger(availableNow=True) if args.available_now
              else writer.trigger(processingTime="100 milliseconds"))
    query = writer.start()
    query.awaitTermination()
    if args.progress is not None:
        import json

        reports = [json.loads(p.json) for p in query.recentProgress]
        args.progress.write_text(json.dumps(
            [{"timestamp": r["timestamp"], "figures": r["sources"][0]["endOffset"]}
             for r in reports]))
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    print("DONE", flush=True)
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    sink_args = commands.add_parser("sink")
    sink_args.add_argument("nodes")
    sink_args.add_argument("queue")
    sink_args.add_argument("rows", type=int)
    sink_args.add_argument("--partitions", type=int, default=4)
    sink_args.add_argument("--batch-size", type=int, default=100)
    stream_args = commands.add_parser("stream")
    stream_args.add_argument("nodes")
    stream_args.add_argument("queue")
    stream_args.add_argument("workdir", type=Path)
    stream_args.add_argument("--staging", required=True)
    stream_args.add_argument("--fetch-mode", default="driver")
    stream_args.add_argument("--available-now", action="store_true")
    stream_args.add_argument("--max-jobs", type=int, default=200)
    stream_args.add_argument("--partitions", type=int, default=2)
    stream_args.add_argument("--batch-delay", type=float, default=0.0)
    stream_args.add_argument("--progress", type=Path)
    args = parser.parse_args()
    {"sink": sink, "stream": stream}[args.command](args)


if __name__ == "__main__":
    main()
