"""The ``disque`` sink: df.write / df.writeStream .format("disque") -> ADDJOB.

Real disque-server processes and the shared local Spark session.  The first
group runs the per-partition writer as a plain object (no Spark job), the
rest goes through Spark end to end.  Every test uses its own queue names.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    BinaryType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_connector.options import OptionError
from spark_connector.sink_options import SchemaError, SinkConfig
from spark_connector.writer import (
    DisqueCommitMessage,
    DisqueWriteError,
    PartitionWriter,
    split_key,
)
from tests.spark.sink_support import drain
from tests.support.process import free_port, wait_for


def schema_of(**columns) -> StructType:
    return StructType([StructField(name, kind) for name, kind in columns.items()])


BODY_ONLY = schema_of(body=StringType())


def nodes_of(*servers) -> str:
    return ",".join(f"127.0.0.1:{s.port}" for s in servers)



# --------------------------------------------------------------------------
# Driver-side validation (no job may be written when these fail)
# --------------------------------------------------------------------------

@pytest.mark.parametrize(("schema", "column", "text"), [
    (schema_of(payload=StringType()), "payload", "not a job field"),
    (schema_of(queue=StringType()), "body", "is required"),
    (schema_of(body=LongType()), "body", "binary or string"),
    (schema_of(body=StringType(), queue=IntegerType()), "queue", "must be a string"),
    (schema_of(body=StringType(), ttl=StringType()), "ttl", "must be an integer"),
    (schema_of(body=StringType(), delay=DoubleType()), "delay", "must be an integer"),
    (schema_of(body=StringType(), _disque_key=LongType()), "_disque_key", "must be a string"),
    (schema_of(body=StringType(), Body=StringType()), "Body", "appears twice"),
    (schema_of(body=StringType(), priority=StringType()), "priority", "priority (0 to 31)"),
])
def test_bad_schemas_name_the_column(schema: StructType, column: str, text: str) -> None:
    with pytest.raises(SchemaError) as info:
        SinkConfig.from_options({"queue": "q"}, schema)
    assert info.value.column == column
    assert f"column '{column}'" in str(info.value) and text in str(info.value)


@pytest.mark.parametrize(("options", "option", "text"), [
    ({}, "queue", "is required unless"),
    ({"queue": "q", "ttl": "0"}, "ttl", ">= 1"),
    ({"queue": "q", "delay": "60", "ttl": "60"}, "delay", "shorter than ttl"),
    ({"queue": "q", "maxlen": "x"}, "maxlen", "integer"),
    ({"queue": "q", "retryErrors": "PAUSED,NOPE"}, "retryErrors", "NOPE"),
    ({"queue": "q", "retryBackoff": "1s", "retryBackoffMax": "10ms"}, "retryBackoffMax",
     "at least"),
    ({"queue": "q", "async": "maybe"}, "async", "true or false"),
    ({"queue": "q", "nodes": "host:notaport"}, "nodes", "bad address"),
    ({"queue": "q", "writeId": "a/b"}, "writeId", "must not contain"),
    ({"queue": "q", "priority": "32"}, "priority", "<= 31"),
    ({"queue": "q", "priority": "-1"}, "priority", ">= 0"),
])
def test_bad_options_name_the_option(options: dict, option: str, text: str) -> None:
    with pytest.raises(OptionError) as info:
        SinkConfig.from_options(options, BODY_ONLY)
    assert info.value.option == option and text in str(info.value)


def test_options_are_case_insensitive_and_typed() -> None:
    schema = schema_of(BODY=BinaryType(), Queue=StringType(), ttl=IntegerType())
    config = SinkConfig.from_options(
        {"QUEUE": "q", "TimeoutMS": "2s", "retryerrors": "paused, maxlen", "async": "true"},
        schema)
    assert config.queue == "q" and config.timeout_ms == 2000 and config.async_
    assert config.retry_errors == {"PAUSED", "MAXLEN"}
    assert config.columns.body == "BODY" and not config.columns.body_is_string
    assert config.columns.queue == "Queue" and config.columns.ttl == "ttl"
    # The queue column alone is enough.
    assert SinkConfig.from_options({}, schema).queue is None
    # A key column turns keys on; an explicit dedupKey=false contradicts it.
    keyed = schema_of(body=StringType(), _disque_key=StringType())
    assert SinkConfig.from_options({"queue": "q"}, keyed).dedup_key
    with pytest.raises(OptionError, match="dedupKey"):
        SinkConfig.from_options({"queue": "q", "dedupKey": "false"}, keyed)


def test_overwrite_is_refused() -> None:
    with pytest.raises(OptionError, match=r'mode\("append"\)'):
        SinkConfig.from_options({"queue": "q"}, BODY_ONLY, overwrite=True)
    with pytest.raises(OptionError, match="complete"):
        SinkConfig.from_options({"queue": "q"}, BODY_ONLY, overwrite=True, streaming=True)


# --------------------------------------------------------------------------
# The partition writer as a plain object
# --------------------------------------------------------------------------

def config_for(server, schema: StructType = BODY_ONLY, **options: str) -> SinkConfig:
    return SinkConfig.from_options({"nodes": nodes_of(server), **options}, schema)


def test_partition_writer_counts_chunks_and_keys(server, disque) -> None:
    config = config_for(server, queue="pw", batchSize="7", dedupKey="true")
    batches = [pa.record_batch({"body": pa.array([f"{b}-{i}" for i in range(25)])})
               for b in range(3)]
    message = PartitionWriter(config, 3, key_prefix="w/0/3/").write(iter(batches))
    assert isinstance(message, DisqueCommitMessage)
    assert (message.partition, message.jobs, message.queues) == (3, 75, {"pw": 75})
    assert message.node == f"127.0.0.1:{server.port}" and message.retries == 0
    keyed = sorted(split_key(body) for body in drain(disque, "pw"))
    expected = sorted((f"w/0/3/{25 * b + i}", f"{b}-{i}".encode())
                      for b in range(3) for i in range(25))
    assert keyed == expected


def test_bad_values_fail_the_batch_before_sending(server, disque) -> None:
    schema = schema_of(body=StringType(), queue=StringType(), ttl=IntegerType())
    config = SinkConfig.from_options({"nodes": nodes_of(server)}, schema)
    good = pa.record_batch({"body": ["a"], "queue": ["bv"], "ttl": pa.array([60], pa.int32())})
    bad_ttl = pa.record_batch({"body": ["b", "c"], "queue": ["bv", "bv"],
                               "ttl": pa.array([60, -5], pa.int32())})
    with pytest.raises(ValueError, match=r"column 'ttl' is -5.*row 2 of partition 0"):
        PartitionWriter(config, 0).write(iter([good, bad_ttl]))
    no_queue = pa.record_batch({"body": ["d"], "queue": pa.array([None], pa.string()),
                                "ttl": pa.array([None], pa.int32())})
    with pytest.raises(ValueError, match="column 'queue' is null and no 'queue' option"):
        PartitionWriter(config, 0).write(iter([no_queue]))
    assert disque.qlen("bv") == 1  # the good batch only


def test_paused_queue_is_retried_with_backoff_until_unpaused(server, disque) -> None:
    disque.pause("bp", "in")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            disque.pause("bp", "none")

    config = config_for(server, queue="bp", retryBackoff="100ms", retryBackoffMax="300ms")
    batch = pa.record_batch({"body": [str(i) for i in range(10)]})
    message = PartitionWriter(config, 0, sleep=sleep).write(iter([batch]))
    assert message.jobs == 10 and message.retries == 3
    assert disque.qlen("bp") == 10
    # Doubling from retryBackoff, capped at retryBackoffMax, with jitter in [0.5, 1].
    for seconds, cap in zip(sleeps, (0.1, 0.2, 0.3), strict=True):
        assert cap / 2 <= seconds <= cap


def test_paused_queue_gives_up_after_max_retries(server, disque) -> None:
    disque.pause("bpx", "in")
    config = config_for(server, queue="bpx", maxRetries="2")
    batch = pa.record_batch({"body": ["a", "b"]})
    sleeps: list[float] = []
    with pytest.raises(DisqueWriteError) as info:
        PartitionWriter(config, 0, sleep=sleeps.append).write(iter([batch]))
    assert len(sleeps) == 2 and info.value.queue == "bpx" and info.value.jobs_written == 0
    assert "queue 'bpx'" in str(info.value) and "PAUSED" in str(info.value)
    assert "after 2 retries" in str(info.value)
    assert disque.qlen("bpx") == 0


def test_lost_node_is_retried_until_it_is_back(server, disque) -> None:
    config = config_for(server, queue="lost", retryBackoff="10ms")
    restarts: list[float] = []

    def sleep(seconds: float) -> None:
        restarts.append(seconds)
        server.restart()  # same port; the node was SIGKILLed, so it starts empty

    def batches() -> Iterator[pa.RecordBatch]:
        yield pa.record_batch({"body": ["before"] * 10})
        server.kill()
        yield pa.record_batch({"body": ["after"] * 10})

    message = PartitionWriter(config, 0, sleep=sleep).write(batches())
    assert len(restarts) == 1 and message.retries == 1 and message.jobs == 20
    assert drain(disque, "lost") == [b"after"] * 10


def test_node_out_of_memory_slows_the_writer_down_until_jobs_are_consumed(
        server, disque, caplog: pytest.LogCaptureFixture) -> None:
    # Room for 8 jobs of 100 bytes (~570 bytes accounted each) above what the
    # node uses now, less the queue's own ~1.2 kB: ~6 jobs get in, the rest
    # of the partition gets -OOM until a consumer takes jobs away.
    used = int(disque.info("memory")["memory"]["used_memory"])
    disque.config_set("maxmemory", used + 8 * 570)
    consumed: list[bytes] = []
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        consumed.extend(drain(disque, "oom"))  # the consumer frees memory

    config = config_for(server, queue="oom", retryBackoff="10ms")
    sent = [f"{i:03d}-" + "x" * 96 for i in range(40)]
    with caplog.at_level(logging.INFO, logger="spark_connector.writer"):
        message = PartitionWriter(config, 0, sleep=sleep).write(
            iter([pa.record_batch({"body": sent})]))
    consumed.extend(drain(disque, "oom"))
    assert message.jobs == 40 and message.retries >= 3, message
    # Each refusal waited retryBackoff (10 ms, with jitter in [0.5, 1]) before the re-send.
    assert len(waits) == message.retries and all(0.005 <= w <= 0.01 for w in waits), waits
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == message.retries
    assert all("(OOM)" in line for line in refusals), refusals
    # Every row arrived once: a refused ADDJOB added nothing, its re-send did.
    assert sorted(consumed) == sorted(body.encode() for body in sent)


def test_non_retryable_error_is_not_retried(server, disque) -> None:
    config = config_for(server, queue="ml", maxlen="3")
    batch = pa.record_batch({"body": [str(i) for i in range(5)]})
    with pytest.raises(DisqueWriteError) as info:
        PartitionWriter(config, 0, sleep=pytest.fail).write(iter([batch]))
    assert "MAXLEN" in str(info.value) and "not in retryErrors" in str(info.value)
    assert info.value.jobs_written == 3 and disque.qlen("ml") == 3


def test_partitions_spread_over_nodes(server_factory) -> None:
    a, b = server_factory(), server_factory()
    config = SinkConfig.from_options({"nodes": nodes_of(a, b), "queue": "spread"}, BODY_ONLY)
    batch = pa.record_batch({"body": ["x"]})
    nodes = [PartitionWriter(config, p).write(iter([batch])).node for p in range(4)]
    assert nodes == [f"127.0.0.1:{s.port}" for s in (a, b, a, b)]
    # A node that is down is skipped: the partition writes to the next one.
    a.kill()
    assert PartitionWriter(config, 0).write(iter([batch])).node == f"127.0.0.1:{b.port}"


# --------------------------------------------------------------------------
# Through Spark: batch writes
# --------------------------------------------------------------------------

def write(df, server, **options: str) -> None:
    writer = df.write.format("disque").mode("append").option("nodes", nodes_of(server))
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def test_priority_column_and_option(server, disque) -> None:
    """PRIORITY (an extension): per row from a column, the option for nulls;
    out-of-range rows fail the batch before it is sent."""
    schema = schema_of(body=StringType(), priority=IntegerType())
    config = SinkConfig.from_options({"nodes": nodes_of(server), "queue": "prio",
                                      "priority": "2"}, schema)
    batch = pa.record_batch({"body": ["plain-default", "urgent", "zero"],
                             "priority": pa.array([None, 30, 0], pa.int32())})
    PartitionWriter(config, 0).write(iter([batch]))
    assert [job.body for job in disque.qpeek("prio", 5)] == [b"urgent", b"plain-default",
                                                            b"zero"]
    too_high = pa.record_batch({"body": ["x", "y"], "priority": pa.array([1, 40], pa.int32())})
    with pytest.raises(ValueError, match=r"column 'priority' is 40, above the maximum of 31"):
        PartitionWriter(config, 0).write(iter([too_high]))
    assert disque.qlen("prio") == 3


def test_batch_write_counts(spark, server, disque) -> None:
    df = spark.range(0, 1000, numPartitions=3).selectExpr("cast(id as string) as body")
    write(df, server, queue="batch")
    assert disque.qlen("batch") == 1000
    assert sorted(int(body) for body in drain(disque, "batch")) == list(range(1000))


def test_per_row_queue_and_options_are_honoured(spark, server, disque) -> None:
    rows = [(b"\x00bin", "rq1", None, None, None, 1, None),
            (b"two", "rq2", 5, 30, 600, None, 7),
            (b"three", None, 100, None, 3600, 1, None)]
    df = spark.createDataFrame(rows, "body binary, queue string, delay int, retry int, "
                                     "ttl long, replicate smallint, priority tinyint")
    write(df, server, queue="rq-default", ttl="7200", retry="45", replicate="1")
    jobs = {job["body"]: job for job in disque.jscan(reply="all")}
    assert set(jobs) == {b"\x00bin", b"two", b"three"}
    first, second, third = jobs[b"\x00bin"], jobs[b"two"], jobs[b"three"]
    assert (first["queue"], first["retry"], first["delay"]) == ("rq1", 45, 0)
    assert 7100 < first["ttl"] <= 7200  # the option's default
    assert (second["queue"], second["delay"], second["retry"]) == ("rq2", 5, 30)
    assert 500 < second["ttl"] <= 600
    assert (third["queue"], third["delay"], third["retry"]) == ("rq-default", 100, 45)
    assert first["repl"] == second["repl"] == third["repl"] == 1
    assert second["priority"] == 7 and "priority" not in first and "priority" not in third
    # Delayed jobs are not queued yet.
    assert disque.qlen("rq1") == 1 and disque.qlen("rq2") == 0


@pytest.mark.parametrize(("ddl", "column"), [
    ("cast(id as int) as body", "body"),
    ("cast(id as string) as body, 'x' as ttl", "ttl"),
    ("cast(id as string) as body, id as value", "value"),
])
def test_bad_schema_fails_before_any_job(spark, server, disque, ddl: str, column: str) -> None:
    df = spark.range(10).selectExpr(*ddl.split(", "))
    with pytest.raises(Exception, match=f"column '{column}'"):
        write(df, server, queue="bad")
    assert disque.qlen("bad") == 0


def test_overwrite_mode_is_refused(spark, server, disque) -> None:
    df = spark.range(3).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception, match="only adds jobs"):
        (df.write.format("disque").mode("overwrite").option("nodes", nodes_of(server))
         .option("queue", "ow").save())
    assert disque.qlen("ow") == 0


def test_maxlen_error_names_queue_and_reason(spark, server, disque) -> None:
    df = spark.range(20).coalesce(1).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception) as info:
        write(df, server, queue="capped", maxlen="5", batchSize="4")
    message = str(info.value)
    assert "queue 'capped'" in message and "MAXLEN" in message
    assert disque.qlen("capped") == 5


def test_paused_queue_fails_after_retries(spark, server, disque) -> None:
    disque.pause("paused", "in")
    df = spark.range(10).coalesce(1).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception) as info:
        write(df, server, queue="paused", maxRetries="2", retryBackoff="10ms")
    message = str(info.value)
    assert "queue 'paused'" in message and "PAUSED" in message and "after 2 retries" in message
    assert disque.qlen("paused") == 0


def test_unreachable_node_is_a_clear_error_on_the_driver(spark) -> None:
    port = free_port()
    df = spark.range(3).coalesce(1).selectExpr("cast(id as string) as body")
    with pytest.raises(Exception) as info:
        (df.write.format("disque").mode("append").option("nodes", f"127.0.0.1:{port}")
         .option("queue", "nowhere").option("reconnectTimeout", "500ms")
         .option("retryBackoff", "10ms").save())
    message = str(info.value)
    # Raised where Spark builds the writer, on the driver, before any task.
    assert "Failed to initialize Python data source writer" in message, message
    assert (f"option 'nodes' lists no node that can be reached (127.0.0.1:{port}) "
            "(tried for 0.5 s, reconnectTimeout)") in message, message


def sink_clients(server) -> list[str]:
    text = server.client().execute_command("CLIENT", "LIST").decode()
    return [line for line in text.splitlines() if "name=spark-disque-sink" in line]


def test_paused_queue_slows_the_write_down_until_unpaused(spark, server, disque) -> None:
    """Back-pressure: the write waits out a pause instead of failing."""
    disque.pause("slow", "in")
    df = spark.range(0, 500, numPartitions=2).selectExpr("cast(id as string) as body")
    seen: list[int] = []

    def unpause_once_refused() -> None:
        # Runs beside the write (Spark calls stay on the main thread: a
        # py4j call from another thread does not see the session's
        # registered data sources).  Unpauses in any case, so a failed wait
        # cannot hang the write; the assertion below reports it.
        try:
            wait_for(lambda: len([c for c in sink_clients(server) if "cmd=addjob" in c]) == 2,
                     timeout=60, message="both partitions to hit the paused queue")
            seen.append(disque.qlen("slow"))
        finally:
            disque.pause("slow", "none")

    helper = threading.Thread(target=unpause_once_refused)
    helper.start()
    try:
        write(df, server, queue="slow", maxRetries="1000", retryBackoff="10ms",
              retryBackoffMax="50ms")
    finally:
        helper.join(90)
    assert seen == [0], "the write did not meet the paused queue"
    assert sorted(int(body) for body in drain(disque, "slow")) == list(range(500))


def test_dedup_keys_are_deterministic(spark, server, disque) -> None:
    df = spark.range(0, 30, numPartitions=2).selectExpr("cast(id as string) as body")
    # idmp=false: the keys only (with IDMP the node drops the re-run's jobs,
    # tests/spark/test_sink_idempotent.py).
    write(df, server, queue="keys", dedupKey="true", writeId="nightly-1", idmp="false")
    write(df, server, queue="keys", dedupKey="true", writeId="nightly-1",
          idmp="false")  # a re-run
    keyed = [split_key(body) for body in drain(disque, "keys")]
    assert len(keyed) == 60
    by_key: dict[str, set[bytes]] = {}
    for key, body in keyed:
        by_key.setdefault(key, set()).add(body)
        write_id, batch, partition, row = key.split("/")
        assert (write_id, batch) == ("nightly-1", "0") and partition in ("0", "1")
        assert row.isdigit()
    # The re-run produced the same 30 keys for the same 30 bodies.
    assert len(by_key) == 30 and all(len(bodies) == 1 for bodies in by_key.values())


def test_key_column_is_used_as_the_dedup_key(spark, server, disque) -> None:
    df = spark.range(5).selectExpr("cast(id as string) as body",
                                   "concat('order-', id) as _disque_key")
    write(df, server, queue="ordkeys")
    assert sorted(split_key(body) for body in drain(disque, "ordkeys")) == [
        (f"order-{i}", str(i).encode()) for i in range(5)]


# --------------------------------------------------------------------------
# Through Spark: streaming writes
# --------------------------------------------------------------------------

def test_stream_from_rate_source(spark, server, disque, tmp_path) -> None:
    rows_per_batch = 50
    query = (spark.readStream.format("rate-micro-batch")
             .option("rowsPerBatch", rows_per_batch).option("numPartitions", 2).load()
             .selectExpr("cast(value as string) as body")
             .writeStream.format("disque")
             .option("nodes", nodes_of(server)).option("queue", "stream")
             .option("dedupKey", "true")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="100 milliseconds")
             .start())

    def completed() -> list[dict]:
        return [p for p in query.recentProgress if p["numInputRows"] > 0]

    try:
        wait_for(lambda: len(completed()) >= 3, timeout=120,
                 message="three micro-batches to complete")
    finally:
        query.stop()
    assert query.exception() is None
    keyed = [split_key(body) for body in drain(disque, "stream")]
    values = [int(body) for _, body in keyed]
    assert len(values) == len(set(values)), "a job was added twice"
    # Every micro-batch Spark reported complete is in the queue, whole.
    for progress in completed():
        batch = progress["batchId"]
        expected = set(range(batch * rows_per_batch, (batch + 1) * rows_per_batch))
        assert expected <= set(values)
    for key, body in keyed:
        query_id, batch, partition, _row = key.split("/")
        assert query_id == str(query.id)
        assert int(body) // rows_per_batch == int(batch) and partition in ("0", "1")


def test_stream_with_bad_schema_fails_before_any_job(spark, server, disque, tmp_path) -> None:
    with pytest.raises(Exception, match="column 'value'"):
        query = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
                 .selectExpr("cast(value as string) as body", "value")
                 .writeStream.format("disque")
                 .option("nodes", nodes_of(server)).option("queue", "badstream")
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .start())
        try:
            query.awaitTermination(60)
        finally:
            query.stop()
    assert disque.qlen("badstream") == 0
