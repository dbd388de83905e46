"""The sink's ``headers`` column, against real nodes.

The partition writer runs as a plain object first (the commands it builds,
read back with ``GETJOB ... WITHHEADERS``), then through the shared local
Spark session: the array form (the source's column, Kafka's shape) and the
map form (``create_map``) both reach the node in order; a DataFrame
without headers sends exactly what it sent before the column existed;
headers the node refuses fail the task with the node's reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from disque.client import Client
from spark_connector.sink_options import SchemaError, SinkConfig
from spark_connector.writer import DisqueWriteError, PartitionWriter

ENTRY = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
ARRAY_SCHEMA = StructType([StructField("body", StringType()),
                           StructField("headers", ArrayType(ENTRY))])
ARROW_ARRAY = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def config(port: int, schema: StructType, **options: str) -> SinkConfig:
    return SinkConfig.from_options({"nodes": f"127.0.0.1:{port}", "queue": "q", **options},
                                   schema)


def batch(bodies: list[str], headers: list | None = None,
          headers_type: pa.DataType = ARROW_ARRAY, **columns: pa.Array) -> pa.RecordBatch:
    arrays = {"body": pa.array(bodies)}
    if headers is not None:
        arrays["headers"] = pa.array(headers, headers_type)
    arrays.update(columns)
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


def fetched(client: Client, queue: str = "q") -> dict[bytes, list[bytes]]:
    """body -> flat headers, of every job queued in ``queue`` (acked)."""
    out = {}
    while reply := client.execute_command("GETJOB", "NOHANG", "COUNT", 1000, "WITHHEADERS",
                                          "FROM", queue):
        for entry in reply:
            assert entry[3] == b"headers"
            out[entry[2]] = entry[4]
        client.ack(*(entry[1] for entry in reply))
    return out


@pytest.fixture
def payloads(monkeypatch) -> Iterator[list[bytes]]:
    """The bytes of every pipeline the sink sends."""
    sent: list[bytes] = []
    original = Client.send_pipeline

    def spy(self, build, **kwargs):
        def recording(node_id):
            data, count = build(node_id)
            sent.append(bytes(data))
            return data, count
        return original(self, recording, **kwargs)

    monkeypatch.setattr(Client, "send_pipeline", spy)
    yield sent


# --------------------------------------------------------------------------
# The column's types, checked on the driver
# --------------------------------------------------------------------------

@pytest.mark.parametrize("data_type", [
    ArrayType(ENTRY),
    ArrayType(StructType([StructField("KEY", StringType(), False),
                          StructField("value", StringType(), False)]), False),
    ArrayType(StructType([StructField("value", BinaryType()), StructField("key", StringType())])),
    MapType(StringType(), BinaryType()),
    MapType(StringType(), StringType()),
])
def test_accepted_header_types(data_type) -> None:
    schema = StructType([StructField("body", StringType()), StructField("Headers", data_type)])
    assert SinkConfig.from_options({"queue": "q"}, schema).columns.headers == "Headers"


@pytest.mark.parametrize("data_type", [
    StringType(),
    ArrayType(StringType()),
    MapType(IntegerType(), BinaryType()),
    MapType(StringType(), IntegerType()),
    ArrayType(StructType([StructField("name", StringType()), StructField("value", BinaryType())])),
    ArrayType(StructType([*ENTRY.fields, StructField("extra", StringType())])),
])
def test_other_types_are_refused_naming_the_column(data_type) -> None:
    schema = StructType([StructField("body", StringType()), StructField("headers", data_type)])
    with pytest.raises(SchemaError, match=r"column 'headers' must be array<struct<key: string, "
                       r"value: binary or string>>.*map<string, binary or string>, got"):
        SinkConfig.from_options({"queue": "q"}, schema)


# --------------------------------------------------------------------------
# The partition writer
# --------------------------------------------------------------------------

def test_array_headers_reach_the_node_in_order(server, disque: Client) -> None:
    rows = batch(["a", "b", "c", "d"], [
        [{"key": "t", "value": b"1"}, {"key": "tenant", "value": b"\x00\xff"},
         {"key": "t", "value": b"2"}],
        None, [], [{"key": "empty", "value": b""}]])
    writer = PartitionWriter(config(server.port, ARRAY_SCHEMA), 0)
    assert writer.write(iter([rows])).jobs == 4
    assert writer.sent_bulk == 1  # one ADDJOBS ... JOBS
    assert fetched(disque) == {b"a": [b"t", b"1", b"tenant", b"\x00\xff", b"t", b"2"],
                               b"b": [], b"c": [], b"d": [b"empty", b""]}


def test_map_headers_with_string_values(server, disque: Client) -> None:
    schema = StructType([StructField("body", StringType()),
                         StructField("headers", MapType(StringType(), StringType()))])
    rows = batch(["a", "b"], [[("tenant", "acme"), ("v", "é")], None],
                 pa.map_(pa.string(), pa.string()))
    PartitionWriter(config(server.port, schema), 0).write(iter([rows]))
    assert fetched(disque) == {b"a": [b"tenant", b"acme", b"v", "é".encode()], b"b": []}


def test_headers_with_idmp_go_out_on_each_addjob(server, disque: Client) -> None:
    schema = StructType([*ARRAY_SCHEMA.fields, StructField("_disque_key", StringType())])
    rows = batch(["a", "b", "c"], [[{"key": "n", "value": b"1"}, {"key": "n", "value": b"2"}],
                                   None, [{"key": "x", "value": b"y"}]],
                 _disque_key=pa.array(["k1", "k2", "k3"]))
    writer = PartitionWriter(config(server.port, schema), 0)
    writer.write(iter([rows]))
    assert writer.sent_single == 3 and writer.sent_bulk == 0  # IDMP: one ADDJOB per row
    assert fetched(disque) == {b"k1\na": [b"n", b"1", b"n", b"2"], b"k2\nb": [],
                               b"k3\nc": [b"x", b"y"]}
    # A retried row is the same job (IDMP), headers and all.
    PartitionWriter(config(server.port, schema), 0).write(iter([rows]))
    assert fetched(disque) == {}


def test_per_row_queues_and_options_keep_each_rows_headers(server, disque: Client) -> None:
    schema = StructType([*ARRAY_SCHEMA.fields, StructField("queue", StringType()),
                         StructField("ttl", IntegerType())])
    rows = batch(["a", "b", "c"], [[{"key": "n", "value": b"a"}], None,
                                   [{"key": "n", "value": b"c"}]],
                 queue=pa.array(["q1", "q2", "q1"]), ttl=pa.array([60, 60, 120], pa.int32()))
    PartitionWriter(config(server.port, schema), 0).write(iter([rows]))
    assert fetched(disque, "q1") == {b"a": [b"n", b"a"], b"c": [b"n", b"c"]}
    assert fetched(disque, "q2") == {b"b": []}


def test_without_headers_the_commands_are_unchanged(server, disque: Client,
                                                    payloads: list[bytes]) -> None:
    """No column, or a column with no header in it: the same bytes, plain
    ``ADDJOBS ... BODIES``, as before the column existed."""
    body_only = StructType([StructField("body", StringType())])
    PartitionWriter(config(server.port, body_only), 0).write(iter([batch(["a", "bc"])]))
    PartitionWriter(config(server.port, ARRAY_SCHEMA), 0).write(
        iter([batch(["a", "bc"], [None, []])]))
    expected = (b"*6\r\n$7\r\nADDJOBS\r\n$1\r\nq\r\n$4\r\n5000\r\n$6\r\nBODIES\r\n"
                b"$1\r\na\r\n$2\r\nbc\r\n")
    assert payloads == [expected, expected]
    shown = [disque.show(job.id) for job in disque.get_jobs("q", count=4, nohang=True)]
    assert len(shown) == 4 and all("headers" not in job for job in shown)


def test_null_names_or_values_fail_the_batch_naming_the_row(server, disque: Client) -> None:
    for bad, what in (({"key": None, "value": b"v"}, "whose key is null"),
                      ({"key": "k", "value": None}, "whose value is null")):
        rows = batch(["a", "b"], [[{"key": "ok", "value": b"1"}], [bad]])
        with pytest.raises(ValueError, match=rf"column 'headers' has a header {what}.*"
                           r"\(row 1 of partition 0\); no job of this batch was added"):
            PartitionWriter(config(server.port, ARRAY_SCHEMA), 0).write(iter([rows]))
    assert disque.qlen("q") == 0


def test_headers_over_the_nodes_limits_fail_the_task_with_its_reason(server,
                                                                      disque: Client) -> None:
    disque.execute_command("CONFIG", "SET", "max-job-headers", "2")
    ok = batch(["ok"], [[{"key": "a", "value": b"1"}]])
    too_many = batch(["x", "y"], [None, [{"key": "h", "value": b"%d" % i} for i in range(3)]])
    writer = PartitionWriter(config(server.port, ARRAY_SCHEMA), 0)
    with pytest.raises(DisqueWriteError, match=r"could not add jobs to queue 'q' \(partition 0, "
                       r"node 127\.0\.0\.1:\d+\): ERR too many headers: .*max-job-headers.*not "
                       r"retried; 1 jobs of this partition were added before") as info:
        writer.write(iter([ok, too_many]))
    assert info.value.jobs_written == 1
    # The node refuses a whole ADDJOBS for one job's bad headers: nothing of it was added.
    assert list(fetched(disque)) == [b"ok"]
    disque.execute_command("CONFIG", "SET", "max-job-headers-size", "10")
    with pytest.raises(DisqueWriteError, match=r"ERR headers too large"):
        PartitionWriter(config(server.port, ARRAY_SCHEMA), 0).write(
            iter([batch(["z"], [[{"key": "name", "value": b"x" * 20}]])]))


def test_an_original_node_refuses_headers_clearly(original) -> None:
    rows = batch(["a"], [[{"key": "tenant", "value": b"acme"}]])
    with pytest.raises(DisqueWriteError, match=r"ERR syntax error \(the node refused the jobs' "
                       r"headers: an original Disque node has no job headers; drop the "
                       r"'headers' column to write to it\); not retried"):
        PartitionWriter(config(original.port, ARRAY_SCHEMA), 0).write(iter([rows]))
    # Rows without headers still go to it, as before.
    writer = PartitionWriter(config(original.port, ARRAY_SCHEMA), 0)
    assert writer.write(iter([batch(["b"], [None])])).jobs == 1


# --------------------------------------------------------------------------
# Through Spark
# --------------------------------------------------------------------------

def test_spark_writes_array_and_map_headers(spark, server, disque: Client) -> None:
    nodes = f"127.0.0.1:{server.port}"
    (spark.sql("select 'a' as body, array(named_struct('key', 't', 'value', cast('1' as binary)),"
               " named_struct('key', 't', 'value', unhex('00FF'))) as headers "
               "union all select 'b', cast(null as array<struct<key:string,value:binary>>)")
     .write.format("disque").option("nodes", nodes).option("queue", "arrays")
     .mode("append").save())
    assert fetched(disque, "arrays") == {b"a": [b"t", b"1", b"t", b"\x00\xff"], b"b": []}
    from pyspark.sql.functions import create_map, lit

    (spark.range(1).select(lit("c").alias("body"), create_map(
        lit("tenant"), lit("acme"), lit("region"), lit("eu")).alias("headers"))
     .write.format("disque").option("nodes", nodes).option("queue", "maps")
     .mode("append").save())
    assert fetched(disque, "maps") == {b"c": [b"tenant", b"acme", b"region", b"eu"]}


def test_spark_write_of_bad_headers_fails_with_the_nodes_reason(spark, server,
                                                                disque: Client) -> None:
    disque.execute_command("CONFIG", "SET", "max-job-headers", "1")
    df = spark.sql("select 'a' as body, map('x', '1', 'y', '2') as headers")
    with pytest.raises(Exception, match="ERR too many headers"):
        (df.write.format("disque").option("nodes", f"127.0.0.1:{server.port}")
         .option("queue", "bad").mode("append").save())
    assert disque.qlen("bad") == 0


def test_a_stream_passes_the_sources_headers_to_the_sink(spark, server, disque: Client,
                                                         tmp_path: Path) -> None:
    """The pipeline docs/SPARK.md shows: the headers column through a transformation."""
    nodes = f"127.0.0.1:{server.port}"
    disque.add_job("in", b"one", headers=[("trace", b"1"), ("trace", b"2"), ("bin", b"\xff")])
    disque.add_job("in", b"two")
    query = (spark.readStream.format("disque").option("nodes", nodes).option("queues", "in")
             .option("includeHeaders", "true").option("stagingPath", str(tmp_path / "staging"))
             .option("fetchTimeoutMs", "100").load()
             .selectExpr("upper(cast(body as string)) as body", "headers")
             .writeStream.format("disque").option("nodes", nodes).option("queue", "out")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert fetched(disque, "out") == {b"ONE": [b"trace", b"1", b"trace", b"2", b"bin", b"\xff"],
                                      b"TWO": []}
