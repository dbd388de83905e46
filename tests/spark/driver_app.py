"""A Spark streaming application for the fault tests, run as its own process.

    python -m tests.spark.driver_app PORT QUEUE WORKDIR [--available-now]
        [--fetch-mode driver|executor] [--max-jobs N] [--batch-delay S]
        [--progress FILE] [--docs-snippet]

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
run as written against the report.
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
        rows = df.select("id", "additional_deliveries").collect()
        if args.batch_delay:
            time.sleep(args.batch_delay)  # a slow sink: the window the test kills in
        if rows:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.table({"id": [r.id for r in rows],
                              "redelivered": [r.additional_deliveries for r in rows]})
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
              .load())
    writer = (stream.writeStream.foreachBatch(write_batch)
              .option("checkpointLocation", str(args.workdir / "checkpoint")))
    writer = (writer.trigger(availableNow=True) if args.available_now
              else writer.trigger(processingTime="100 milliseconds"))
    query = writer.start()
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
