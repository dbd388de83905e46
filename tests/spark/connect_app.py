"""A Spark Connect client for tests/spark/test_connect.py, run as its own process.

    python tests/spark/connect_app.py URL NODE WORKDIR [--artifacts ZIP] [--batch-only]

Against the Connect server at URL (``sc://host:port``): a batch write of 50
jobs to queue ``cq`` through the sink; a batch read of them (peek); then,
unless ``--batch-only``, the source in driver and in executor fetch mode
(availableNow, each into Parquet under WORKDIR) and the sink as a stream.
``--artifacts`` adds ZIP to the session first (``addArtifacts(pyfile=True)``).
Prints one JSON line: what each step saw. A source query that fails does so
after ``start()`` returned: the line then says which query, that it was
active after ``start()``, and the error of ``awaitTermination()``; the exit
status is 3.
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("node")
    parser.add_argument("workdir")
    parser.add_argument("--artifacts")
    parser.add_argument("--batch-only", action="store_true")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(args.url).getOrCreate()
    if args.artifacts:
        spark.addArtifacts(args.artifacts, pyfile=True)
    import spark_connector

    spark_connector.register(spark)
    seen: dict[str, int] = {}
    (spark.range(0, 50).selectExpr("concat('c-', cast(id as string)) as body")
     .write.format("disque").mode("append")
     .option("nodes", args.node).option("queue", "cq").save())
    seen["written"] = 50
    seen["peeked"] = (spark.read.format("disque").option("nodes", args.node)
                      .option("queues", "cq").load().count())
    if not args.batch_only:
        for mode in ("driver", "executor"):
            query = (spark.readStream.format("disque").option("nodes", args.node)
                     .option("queues", "cq").option("fetchMode", mode)
                     .option("stagingPath", f"{args.workdir}/staging-{mode}")
                     .option("maxJobsPerTrigger", "20").load()
                     .select("id", "body").writeStream.format("parquet")
                     .option("path", f"{args.workdir}/out-{mode}")
                     .option("checkpointLocation", f"{args.workdir}/checkpoint-{mode}")
                     .trigger(availableNow=True).start())
            active = query.isActive  # start() returned: where does a failure show?
            try:
                query.awaitTermination()
            except Exception as exc:
                seen.update(failed=mode, active_after_start=int(active),
                            failed_at="awaitTermination", error=str(exc)[:3000])
                print(json.dumps(seen), flush=True)
                raise SystemExit(3) from None
            seen[mode] = spark.read.parquet(f"{args.workdir}/out-{mode}").count()
            if mode == "driver":  # more jobs for the executor-mode query
                (spark.range(0, 30).selectExpr("concat('d-', cast(id as string)) as body")
                 .write.format("disque").mode("append")
                 .option("nodes", args.node).option("queue", "cq").save())
        # The sink as a stream: a rate source's first 40 rows into queue "streamed".
        query = (spark.readStream.format("rate").option("rowsPerSecond", "40").load()
                 .selectExpr("concat('r-', cast(value as string)) as body")
                 .where("cast(substr(body, 3) as int) < 40")
                 .writeStream.format("disque").option("nodes", args.node)
                 .option("queue", "streamed")
                 .option("checkpointLocation", f"{args.workdir}/checkpoint-sink")
                 .trigger(processingTime="500 milliseconds").start())
        seen["stream_sink_started"] = 1
        import time

        from disque.client import Client

        with Client(args.node) as client:
            deadline = time.monotonic() + 120
            while client.qlen("streamed") < 40 and time.monotonic() < deadline:
                time.sleep(0.2)
            seen["streamed"] = client.qlen("streamed")
        query.stop()
    print(json.dumps(seen), flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
