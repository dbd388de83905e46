"""Producer: write a dataset of order events to a Disque queue with the Spark sink.

Generates a deterministic synthetic dataset of order events as Parquet (so
the example needs no download), then writes one job per event: the body is
the event as JSON. This is the batch side of the sink
(``df.write.format("disque")``); the same ``select`` works with
``writeStream``.

    python -m jobs.produce_events --events 100000 --queue orders
    python -m jobs.produce_events --help
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ._common import DEFAULT_NODES, spark_session

PRODUCTS = ["keyboard", "mouse", "monitor", "laptop", "dock", "cable", "headset", "webcam"]
#: Event times start here and are spread over ``--minutes`` minutes.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def generate_events(count: int, minutes: int = 30, seed: int = 7) -> pa.Table:
    """``count`` order events, in event-time order, reproducible from ``seed``."""
    rng = random.Random(seed)
    step = timedelta(minutes=minutes) / max(count, 1)
    return pa.table({
        "order_id": pa.array([f"o-{seed}-{i:08d}" for i in range(count)]),
        "customer": pa.array([f"c-{rng.randrange(5000):05d}" for _ in range(count)]),
        "product": pa.array([rng.choice(PRODUCTS) for _ in range(count)]),
        "quantity": pa.array([rng.randint(1, 5) for _ in range(count)], pa.int32()),
        "amount": pa.array([round(rng.uniform(5, 500), 2) for _ in range(count)]),
        "event_time": pa.array([EPOCH + step * i for i in range(count)],
                               pa.timestamp("us", tz="UTC")),
    })


def write_dataset(path: Path, count: int, minutes: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    target = path / "orders.parquet"
    pq.write_table(generate_events(count, minutes), target)
    return target


def produce(spark, dataset: Path, nodes: str, queue: str, *, retry: int = 60,
            partitions: int | None = None) -> int:
    """Write every event of ``dataset`` to ``queue``; returns how many jobs were added.

    The sink's partitions spread over the cluster's nodes: ``partitions``
    (e.g. one per node) splits a small dataset, which Spark reads as one
    partition, so that every node gets a share.
    """
    events = spark.read.parquet(str(dataset))
    if partitions:
        events = events.repartition(partitions)
    (events.selectExpr("to_json(struct(*)) AS body")
     .write.format("disque")
     .option("nodes", nodes).option("queue", queue)
     .option("retry", str(retry))   # seconds before an unacknowledged job is redelivered
     .mode("append").save())
    return events.count()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="Disque nodes, host:port,...")
    parser.add_argument("--queue", default="orders")
    parser.add_argument("--events", type=int, default=10_000, help="how many events")
    parser.add_argument("--minutes", type=int, default=30,
                        help="event-time span of the dataset")
    parser.add_argument("--data", type=Path, default=Path("demo-output/dataset"),
                        help="where the generated Parquet dataset is written")
    parser.add_argument("--partitions", type=int, default=None,
                        help="Spark partitions to write with (they spread over the nodes)")
    args = parser.parse_args(argv)
    dataset = write_dataset(args.data, args.events, args.minutes)
    spark = spark_session("disque-produce-events")
    try:
        began = time.monotonic()
        written = produce(spark, dataset, args.nodes, args.queue, partitions=args.partitions)
        elapsed = time.monotonic() - began
        print(f"wrote {written} jobs to queue {args.queue!r} in {elapsed:.1f}s "
              f"({written / elapsed:.0f} jobs/s); dataset {dataset}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
