"""The source end to end in a real local Spark session against real nodes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from disque.client import Client
from spark_connector.staging import StagingArea
from tests.support.process import wait_for


def stream(spark, server, tmp_path: Path, **options: str):
    opts = {"nodes": f"127.0.0.1:{server.port}", "queues": "events",
            "stagingPath": str(tmp_path / "staging"), "fetchTimeoutMs": "100", **options}
    reader = spark.readStream.format("disque")
    for key, value in opts.items():
        reader = reader.option(key, value)
    return reader.load()


def registered(client: Client) -> int:
    return int(client.info("jobs")["jobs"]["registered_jobs"])


def memory_ids(spark, name: str) -> list[str]:
    return [row.id for row in spark.sql(f"select id from {name}").collect()]


def test_available_now_drains_the_queue_exactly_once(spark, server, tmp_path: Path) -> None:
    client = Client(f"127.0.0.1:{server.port}")
    produced = client.add_jobs("events", [f'{{"n": {i}}}' for i in range(2500)])
    query = (stream(spark, server, tmp_path, maxJobsPerTrigger="700", bodyFormat="string")
             .writeStream.format("memory").queryName("drain_once")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    ids = memory_ids(spark, "drain_once")
    assert sorted(ids) == sorted(produced)  # every job, exactly once
    assert client.qlen("events") == 0 and registered(client) == 0  # all ACKed
    assert StagingArea(tmp_path / "staging").batches() == []
    # The source's counters ride along in the progress' endOffset (and latestOffset).
    progress = json.loads(query.lastProgress["sources"][0]["endOffset"])
    assert json.loads(query.lastProgress["sources"][0]["latestOffset"])["jobsAcked"] == 2500
    assert progress["jobsFetched"] == 2500 and progress["redeliveredSeen"] == 0
    assert progress["jobsAcked"] == 2500 and progress["jobsLeased"] == 0
    bodies = spark.sql("select body from drain_once where body like '{\"n\": 7}'").collect()
    assert [r.body for r in bodies] == ['{"n": 7}']


@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_available_now_progress_ends_with_the_final_ack(spark, server, tmp_path: Path,
                                                        fetch_mode: str) -> None:
    # One batch: the jobs are acknowledged after it committed, in a trigger of
    # their own; the run's last progress report must already show that.
    client = Client(f"127.0.0.1:{server.port}")
    client.add_jobs("events", [f"{i}" for i in range(100)])
    query = (stream(spark, server, tmp_path, fetchMode=fetch_mode)
             .writeStream.format("memory").queryName(f"final_ack_{fetch_mode}")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert registered(client) == 0
    progress = json.loads(query.lastProgress["sources"][0]["latestOffset"])
    assert (progress["jobsFetched"], progress["jobsAcked"], progress["jobsLeased"]) == (
        100, 100, 0), progress
    assert sum(p["numInputRows"] for p in query.recentProgress) == 100


def test_processing_time_trigger_follows_a_live_producer(spark, server, tmp_path: Path) -> None:
    client = Client(f"127.0.0.1:{server.port}")
    produced: list[str] = []

    def produce() -> None:
        with Client(f"127.0.0.1:{server.port}") as producer:
            for i in range(20):
                produced.extend(producer.add_jobs("events", [f"{i}-{k}" for k in range(50)]))

    query = (stream(spark, server, tmp_path, maxJobsPerTrigger="300")
             .writeStream.format("memory").queryName("live")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="200 milliseconds").start())
    try:
        thread = threading.Thread(target=produce)
        thread.start()
        thread.join(60)
        wait_for(lambda: len(memory_ids(spark, "live")) >= 1000, timeout=120,
                 interval=0.5, message="all jobs in the sink")
        # The last batch is acknowledged by the next trigger's latestOffset.
        wait_for(lambda: registered(client) == 0, timeout=30, message="every job ACKed")
        assert query.exception() is None
    finally:
        query.stop()
    ids = memory_ids(spark, "live")
    assert sorted(ids) == sorted(produced)
    assert client.qlen("events") == 0


def test_batch_read_peeks_and_drains(spark, server) -> None:
    client = Client(f"127.0.0.1:{server.port}")
    client.add_jobs("events", [f"{i}" for i in range(40)])
    base = (spark.read.format("disque").option("nodes", f"127.0.0.1:{server.port}")
            .option("queues", "events"))
    assert base.load().count() == 40
    assert client.qlen("events") == 40
    drained = base.option("drain", "true").load().collect()
    assert len(drained) == 40 and client.qlen("events") == 0 and registered(client) == 0


def test_bad_options_fail_the_query_at_start(spark, server, tmp_path: Path) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    reader = (spark.readStream.format("disque").option("nodes", f"127.0.0.1:{server.port}")
              .option("stagingPath", str(tmp_path / "s")))
    with pytest.raises((PySparkException, Py4JJavaError), match="option 'queues' is required"):
        (reader.load().writeStream.format("memory").queryName("bad")
         .option("checkpointLocation", str(tmp_path / "c")).start().awaitTermination(30))


@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_node_crash_and_aof_restart_under_a_running_query(spark, server_factory,
                                                          tmp_path: Path, fetch_mode: str) -> None:
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    client = Client(f"127.0.0.1:{node.port}", reconnect_timeout=30)
    # A restarted node loads its jobs without queueing them: they are queued
    # again after RETRY (the spec's rule, since another node may have
    # delivered them meanwhile).  RETRY 2 keeps the test short.
    produced = client.add_jobs("events", [f"a{i}" for i in range(600)], retry=2)
    query = (stream(spark, node, tmp_path, maxJobsPerTrigger="100", fetchMode=fetch_mode)
             .writeStream.format("memory").queryName(f"node_crash_{fetch_mode}")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="100 milliseconds").start())
    table = f"node_crash_{fetch_mode}"
    try:
        wait_for(lambda: len(memory_ids(spark, table)) >= 200, timeout=120, interval=0.5)
        node.kill()     # SIGKILL while batches are staged and leased
        node.start(port=node.port)
        produced += client.add_jobs("events", [f"b{i}" for i in range(300)], retry=2)
        wait_for(lambda: len(set(memory_ids(spark, table))) >= 900, timeout=180,
                 interval=0.5, message=lambda: (
                     f"every job in the sink after the node restart: query "
                     f"{query.status}, {query.exception()}, progress {query.lastProgress}, "
                     f"qlen {client.qlen('events')}, registered {registered(client)}"))
        wait_for(lambda: registered(client) == 0, timeout=60, message="every job ACKed")
        assert query.exception() is None
    finally:
        query.stop()
    ids = memory_ids(spark, table)
    assert set(ids) == set(produced)
    # Duplicates need a lease that expired while the node was down: only
    # jobs of the (at most two) staged, unacknowledged batches qualify.
    duplicates = len(ids) - len(set(ids))
    assert duplicates <= 2 * 100, duplicates


def test_dead_letter_queues_are_read_and_counted(spark, server, tmp_path: Path) -> None:
    client = Client(f"127.0.0.1:{server.port}")
    live = client.add_jobs("events", ["ok-1", "ok-2"])
    poison = client.add_job("events", "poison", retry=1, max_deliveries=1)
    assert client.get_job("events", "events:dead", nohang=True).id == live[0]
    assert client.get_job("events", nohang=True).id == live[1]
    assert client.get_job("events", nohang=True).id == poison
    client.nack(live[0], live[1])  # plain jobs: back in events
    assert client.nack(poison) == 1  # its limit: moved to events:dead by the node
    query = (stream(spark, server, tmp_path, deadLetterQueues="default", bodyFormat="string")
             .writeStream.format("memory").queryName("dead_letters")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    rows = {r.id: (r.queue, r.body) for r in spark.sql("select * from dead_letters").collect()}
    assert rows == {live[0]: ("events", "ok-1"), live[1]: ("events", "ok-2"),
                    poison: ("events:dead", "poison")}
    progress = json.loads(query.lastProgress["sources"][0]["latestOffset"])
    assert progress["deadLettered"] == 1
    assert registered(client) == 0


def test_a_rate_limited_queue_is_read_at_its_rate_and_reported(spark, server,
                                                                tmp_path: Path) -> None:
    """QLIMIT (an extension) holds the source to the queue's rate; the
    progress reports the fetches the limit held back."""
    client = Client(f"127.0.0.1:{server.port}")
    produced = client.add_jobs("limited", [f"job-{i}" for i in range(12)])
    assert client.qlimit("limited", 5, 1000) == (5, 1000)
    started = time.monotonic()
    query = (stream(spark, server, tmp_path, queues="limited", bodyFormat="string")
             .writeStream.format("memory").queryName("limited_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert sorted(memory_ids(spark, "limited_rows")) == sorted(produced)
    assert time.monotonic() - started >= 2.0  # three windows of 5: at least two waits
    progress = json.loads(query.lastProgress["sources"][0]["latestOffset"])
    assert progress["rateLimited"] >= 1
    assert registered(client) == 0


def test_spark_real_time_mode_takes_no_python_source(spark, server, tmp_path: Path) -> None:
    """Spark's real-time mode (4.1+) refuses Python data sources: docs/SPARK.md
    ("Latency") says so and what a query gets instead."""
    writer = (stream(spark, server, tmp_path).writeStream.format("console")
              .outputMode("update").option("checkpointLocation", str(tmp_path / "checkpoint"))
              .trigger(realTime="5 seconds"))
    with pytest.raises(Exception, match=r"REAL_TIME_MODE\.INPUT_STREAM_NOT_SUPPORTED"):
        query = writer.start()
        try:
            query.awaitTermination(120)
        finally:
            query.stop()
