"""A Spark streaming application for the fault tests, run as its own process.

    python -m tests.spark.driver_app PORT QUEUE WORKDIR [--available-now]
        [--fetch-mode driver|executor] [--max-jobs N] [--batch-delay S]
        [--progress FILE] [--docs-snippet] [--include-groups]
        [--fetch-batch-size N] [--num-partitions N] [--stop-file FILE]

It reads QUEUE with ``format("disque")`` (the short name, found through the
installed ``pyspark_disque`` module: no register() call here) and writes
each micro-batch's job IDs to ``WORKDIR/out/batch-<id>.parquet`` with
foreachBatch.  A replayed batch overwrites its own file, which is the
idempotent-sink pattern the docs recommend, so duplicates in the union of
all files are exactly the jobs Disque delivered twice.  ``WORKDIR/started``
and ``WORKDIR/progress`` hold the ID of the last batch begun and finished.  ``--batch-delay``
makes every batch slow, so a test can kill the driver in the middle of one.
``--progress`` writes the query's progress reports (``recentProgress``, as
JSON) to FILE once the query ends; with ``--docs-snippet``, each with what
docs/SPARK.md's progress snippet ("Progress and logs") evaluates to on it,
run as written against the report.  ``--include-groups`` reads with
``includeGroups`` and writes each row's ``group`` and ``group_position`` too;
``--stop-file`` stops the query (cleanly) once FILE exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import types
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("queue")
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--available-now", action="store_true")
    parser.add_argument("--fetch-mode", default="driver")
    parser.add_argument("--max-jobs", type=int, default=200)
    parser.add_argument("--batch-delay", type=float, default=0.0)
    parser.add_argument("--progress", type=Path)
    parser.add_argument("--docs-snippet", action="store_true")
    parser.add_argument("--include-groups", action="store_true")
    parser.add_argument("--fetch-batch-size", type=int, default=1000)
    parser.add_argument("--num-partitions", type=int, default=1)
    parser.add_argument("--stop-file", type=Path)
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("disque-fault-test")
             .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.streaming.pollingDelay", "50ms")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    out = args.workdir / "out"
    out.mkdir(parents=True, exist_ok=True)

    def write_batch(df, batch_id: int) -> None:
        (args.workdir / "started").write_text(str(batch_id))
        columns = ["id", "additional_deliveries"]
        if args.include_groups:
            columns += ["group", "group_position"]
        rows = df.select(*columns).collect()
        if args.batch_delay:
            time.sleep(args.batch_delay)  # a slow sink: the window the test kills in
        if rows:
            import pyarrow as pa
            import pyarrow.parquet as pq

            data = {"id": [r.id for r in rows],
                    "redelivered": [r.additional_deliveries for r in rows]}
            if args.include_groups:
                data["group"] = [r.group for r in rows]
                data["group_position"] = pa.array([r.group_position for r in rows], pa.int64())
            table = pa.table(data)
            tmp = out / f".batch-{batch_id}.tmp"
            pq.write_table(table, tmp)
            os.replace(tmp, out / f"batch-{batch_id:06d}.parquet")
        (args.workdir / "progress").write_text(str(batch_id))

    stream = (spark.readStream.format("disque")
              .option("nodes", f"127.0.0.1:{args.port}").option("queues", args.queue)
              .option("stagingPath", str(args.workdir / "staging"))
              .option("fetchMode", args.fetch_mode)
              .option("maxJobsPerTrigger", str(args.max_jobs))
              .option("fetchTimeoutMs", "200")
              .option("fetchBatchSize", str(args.fetch_batch_size))
              .option("numPartitions", str(args.num_partitions))
              .option("includeGroups", str(args.include_groups).lower())
              .load())
    writer = (stream.writeStream.foreachBatch(write_batch)
              .option("checkpointLocation", str(args.workdir / "checkpoint")))
    writer = (writer.trigger(availableNow=True) if args.available_now
              else writer.trigger(processingTime="100 milliseconds"))
    query = writer.start()
    if args.stop_file is not None:
        while not query.awaitTermination(0.2):
            if args.stop_file.exists():
                query.stop()
    query.awaitTermination()
    if args.progress is not None:
        reports = []
        for progress in query.recentProgress:
            report = {"progress": json.loads(progress.json)}
            if args.docs_snippet:
                report["snippet"] = docs_snippet(progress)
            reports.append(report)
        args.progress.write_text(json.dumps(reports))
    if query.exception() is not None:
        raise SystemExit(f"query failed: {query.exception()}")
    print("DONE", flush=True)


def docs_snippet(progress: object) -> object:
    """docs/SPARK.md's progress snippet, run with ``query.lastProgress`` being
    ``progress``: what a monitoring loop copied from the docs gets."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "SPARK.md").read_text()
    section = text[text.index("## Progress and logs"):]
    code = section[section.index("```python\n") + 10:]
    lines = code[:code.index("```")].strip().splitlines()
    namespace = {"query": types.SimpleNamespace(lastProgress=progress)}
    exec("\n".join(lines[:-1]), namespace)
    return eval(lines[-1], namespace)


if __name__ == "__main__":
    main()
