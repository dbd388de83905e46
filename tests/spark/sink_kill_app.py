"""A batch write through the disque sink with task retries, run as its own process.

    python -m tests.spark.sink_kill_app PORT QUEUE ROWS [--idmp auto|true|false]
        [--batch-size N] [--speculation]

Its own Spark session because the killed task must be re-run: ``local[2,4]``
allows 4 failures per task, where the tests' shared ``local[2]`` session
allows none.  The test (tests/spark/test_sink_idempotent.py) kills the
Python worker that writes a partition while it writes, from outside.
Prints ``written`` and exits 0 when the write (with its retries) succeeded.
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("queue")
    parser.add_argument("rows", type=int)
    parser.add_argument("--idmp", default="auto")
    parser.add_argument("--batch-size", default="100")
    args = parser.parse_args()

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from spark_connector.session import local_session

    spark = local_session("disque-sink-kill-test", "local[2,4]", {
        "spark.driver.memory": "1g",
        # Small Arrow batches: the partition is sent in many round trips, so
        # a kill lands in its middle.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "500",
    })
    spark.sparkContext.setLogLevel("ERROR")
    try:
        df = (spark.range(0, args.rows, numPartitions=2)
              .selectExpr("concat('row-', cast(id as string)) as body"))
        (df.write.format("disque").mode("append")
         .option("nodes", f"127.0.0.1:{args.port}")
         .option("queue", args.queue)
         .option("dedupKey", "true")
         .option("idmp", args.idmp)
         .option("batchSize", args.batch_size)
         .save())
    finally:
        spark.stop()
    print("written", flush=True)


if __name__ == "__main__":
    main()
