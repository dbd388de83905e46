"""The sink's ``group`` column (ordered groups), against real nodes.

The partition writer runs as a plain object first (its commands read back
with ``GETJOB ... WITHGROUP``, in the order the node hands a group out),
then through the shared local Spark session: rows with a key go out with
it, in row order per group, whatever per-row options cut them into; rows
with a null key, and a DataFrame without the column, are sent exactly as
before; an empty key fails the batch naming the row, a key over the node's
limit fails the task with the node's reason; in a cluster every group's
rows go to its home node, from every partition.
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
    StringType,
    StructField,
    StructType,
)

from disque.client import Client
from disque.rendezvous import ranking
from spark_connector.sink_options import SchemaError, SinkConfig
from spark_connector.writer import DisqueWriteError, PartitionWriter
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, node_id, wait_joined
from tests.support.process import DisqueProcess

GROUPED = StructType([StructField("body", StringType()), StructField("group", StringType())])
ENTRY = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def config(port: int, schema: StructType = GROUPED, **options: str) -> SinkConfig:
    return SinkConfig.from_options({"nodes": f"127.0.0.1:{port}", "queue": "q", **options},
                                   schema)


def batch(bodies: list[str], groups: list[str | None] | None = None,
          **columns: pa.Array) -> pa.RecordBatch:
    arrays = {"body": pa.array(bodies)}
    if groups is not None:
        arrays["group"] = pa.array(groups, pa.string())
    arrays.update(columns)
    return pa.RecordBatch.from_arrays(list(arrays.values()), names=list(arrays))


def delivered(client: Client, queue: str = "q") -> list[tuple[bytes, bytes | None]]:
    """(body, group) of every job of ``queue``, in the order the node hands
    them out (a group's jobs in add order), acknowledged as they come."""
    out = []
    while reply := client.execute_command("GETJOB", "NOHANG", "COUNT", 1000, "WITHGROUP",
                                          "FROM", queue):
        out += [(entry[2], entry[-1]) for entry in reply]
        client.ack(*(entry[1] for entry in reply))
    return out


def per_group(jobs: list[tuple[bytes, bytes | None]]) -> dict[bytes | None, list[bytes]]:
    out: dict[bytes | None, list[bytes]] = {}
    for body, group in jobs:
        out.setdefault(group, []).append(body)
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
# The column's type, checked on the driver
# --------------------------------------------------------------------------

def test_the_column_is_a_string() -> None:
    schema = StructType([StructField("body", StringType()), StructField("Group", StringType())])
    assert SinkConfig.from_options({"queue": "q"}, schema).columns.group == "Group"
    for data_type in (BinaryType(), IntegerType(), ArrayType(StringType())):
        bad = StructType([StructField("body", StringType()), StructField("group", data_type)])
        with pytest.raises(SchemaError, match="column 'group' must be a string, got"):
            SinkConfig.from_options({"queue": "q"}, bad)


# --------------------------------------------------------------------------
# The partition writer, one node
# --------------------------------------------------------------------------

def test_grouped_rows_go_in_one_addjobs_groups_in_row_order(server, disque: Client,
                                                           payloads: list[bytes]) -> None:
    rows = batch(["a0", "p0", "b0", "a1", "p1", "a2", "b1"],
                 ["A", None, "B", "A", None, "A", "B"])
    writer = PartitionWriter(config(server.port), 0)
    assert writer.write(iter([rows])).jobs == 7
    # The rows without a key as before (BODIES), the others with theirs (GROUPS).
    assert writer.sent_bulk == 2 and writer.sent_single == 0
    (sent,) = payloads
    assert sent == (b"*6\r\n$7\r\nADDJOBS\r\n$1\r\nq\r\n$4\r\n5000\r\n$6\r\nBODIES\r\n"
                    b"$2\r\np0\r\n$2\r\np1\r\n"
                    b"*14\r\n$7\r\nADDJOBS\r\n$1\r\nq\r\n$4\r\n5000\r\n$6\r\nGROUPS\r\n"
                    b"$1\r\nA\r\n$2\r\na0\r\n$1\r\nB\r\n$2\r\nb0\r\n$1\r\nA\r\n$2\r\na1\r\n"
                    b"$1\r\nA\r\n$2\r\na2\r\n$1\r\nB\r\n$2\r\nb1\r\n")
    assert per_group(delivered(disque)) == {b"A": [b"a0", b"a1", b"a2"], b"B": [b"b0", b"b1"],
                                            None: [b"p0", b"p1"]}


def test_without_a_key_the_commands_are_unchanged(server, disque: Client,
                                                  payloads: list[bytes]) -> None:
    """No column, or a column whose rows are all null: the same bytes,
    plain ``ADDJOBS ... BODIES``, as before the column existed."""
    body_only = StructType([StructField("body", StringType())])
    PartitionWriter(config(server.port, body_only), 0).write(iter([batch(["a", "bc"])]))
    PartitionWriter(config(server.port), 0).write(iter([batch(["a", "bc"], [None, None])]))
    expected = (b"*6\r\n$7\r\nADDJOBS\r\n$1\r\nq\r\n$4\r\n5000\r\n$6\r\nBODIES\r\n"
                b"$1\r\na\r\n$2\r\nbc\r\n")
    assert payloads == [expected, expected]
    assert delivered(disque) == [(b"a", None), (b"bc", None)] * 2


def test_per_row_options_never_reorder_a_group(server, disque: Client) -> None:
    """Rows of one group with different per-row options go in runs, in row
    order (a group-by of the options would send a1 after a2)."""
    schema = StructType([*GROUPED.fields, StructField("priority", IntegerType()),
                         StructField("queue", StringType())])
    rows = batch(["a0", "a1", "a2", "a3", "p0", "q0"], ["A", "A", "A", "A", None, "A"],
                 priority=pa.array([1, 5, 1, None, 5, 1], pa.int32()),
                 queue=pa.array(["q", "q", "q", "q", "q", "other"]))
    writer = PartitionWriter(config(server.port, schema, priority="3"), 0)
    assert writer.write(iter([rows])).jobs == 6
    assert per_group(delivered(disque)) == {b"A": [b"a0", b"a1", b"a2", b"a3"], None: [b"p0"]}
    assert delivered(disque, "other") == [(b"q0", b"A")]


def test_headers_and_idmp_rows_go_as_addjob_with_group(server, disque: Client,
                                                       payloads: list[bytes]) -> None:
    schema = StructType([*GROUPED.fields, StructField("headers", ArrayType(ENTRY)),
                         StructField("_disque_key", StringType())])
    rows = batch(["a0", "a1", "p0"], ["A", "A", None],
                 headers=pa.array([[{"key": "h", "value": b"1"}], None, None],
                                  pa.list_(pa.struct([("key", pa.string()),
                                                      ("value", pa.binary())]))),
                 _disque_key=pa.array(["k0", "k1", "k2"]))
    writer = PartitionWriter(config(server.port, schema), 0)
    writer.write(iter([rows]))
    assert writer.sent_single == 3 and writer.sent_bulk == 0  # IDMP: one ADDJOB per row
    assert (b"*11\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$5\r\nk0\na0\r\n$4\r\n5000\r\n$4\r\nIDMP\r\n"
            b"$2\r\nk0\r\n$5\r\nGROUP\r\n$1\r\nA\r\n$6\r\nHEADER\r\n$1\r\nh\r\n$1\r\n1\r\n"
            in payloads[-1])
    got = disque.get_jobs("q", count=10, nohang=True, with_group=True, with_headers=True)
    assert sorted((j.body, j.group or "", j.headers) for j in got) == [
        (b"k0\na0", "A", {"h": b"1"}), (b"k1\na1", "A", {}), (b"k2\np0", "", {})]
    assert [j.body for j in got if j.group] == [b"k0\na0", b"k1\na1"]
    disque.ack(*(j.id for j in got))
    # A retried task adds nothing twice (IDMP), group and all.
    PartitionWriter(config(server.port, schema), 0).write(iter([rows]))
    assert delivered(disque) == []


def test_headers_without_idmp_split_the_rows_but_keep_each_groups_order(
        server, disque: Client) -> None:
    schema = StructType([*GROUPED.fields, StructField("headers", ArrayType(ENTRY))])
    entries = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = batch(["a0", "a1", "p0", "a2"], ["A", "A", None, "A"],
                 headers=pa.array([None, [{"key": "h", "value": b"1"}], None, None], entries))
    writer = PartitionWriter(config(server.port, schema), 0)
    writer.write(iter([rows]))
    # The grouped rows: ADDJOBs (GROUPS takes no headers of a job's own).
    assert writer.sent_bulk == 1 and writer.sent_single == 3
    assert per_group(delivered(disque)) == {b"A": [b"a0", b"a1", b"a2"], None: [b"p0"]}


def test_an_empty_key_fails_the_batch_naming_the_row(server, disque: Client) -> None:
    rows = batch(["a", "b", "c"], ["A", None, ""])
    with pytest.raises(ValueError, match=r"column 'group' is an empty string: a group key has "
                       r"at least one byte \(null: no group\) \(row 2 of partition 0\); no job "
                       r"of this batch was added"):
        PartitionWriter(config(server.port), 0).write(iter([rows]))
    assert disque.qlen("q") == 0


def test_a_key_over_the_nodes_limit_fails_the_task_with_its_reason(server,
                                                                   disque: Client) -> None:
    disque.execute_command("CONFIG", "SET", "max-group-key-len", "8")
    ok = batch(["ok"], ["short"])
    too_long = batch(["x", "y"], ["fine", "much-too-long"])
    writer = PartitionWriter(config(server.port), 0)
    with pytest.raises(DisqueWriteError, match=r"could not add jobs to queue 'q' \(partition 0, "
                       r"node 127\.0\.0\.1:\d+\): ERR GROUP key too long: 13 bytes, at most 8 "
                       r"\(max-group-key-len\); not retried; 1 jobs of this partition were "
                       r"added before") as info:
        writer.write(iter([ok, too_long]))
    assert info.value.jobs_written == 1
    # The node refuses a whole ADDJOBS for one bad key: nothing of it was added.
    assert delivered(disque) == [(b"ok", b"short")]


# --------------------------------------------------------------------------
# A cluster: each group at its home
# --------------------------------------------------------------------------

@pytest.fixture
def cluster(server_factory) -> list[DisqueProcess]:
    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    return nodes


def test_every_partition_sends_a_groups_rows_to_its_home(cluster) -> None:
    """Three partitions, spread over three nodes, write rows of 12 groups:
    every job of a group is queued on the key's home (the client's
    ranking), in row order, partition after partition."""
    seed = f"127.0.0.1:{cluster[0].port}"
    sink = SinkConfig.from_options({"nodes": seed, "queue": "q", "replicate": "2",
                                    "retry": "60"}, GROUPED).over_cluster()
    ids = [node_id(n) for n in cluster]
    assert sorted(node for node, _ in sink.group_homes) == sorted(ids)
    keys = [f"order-{i}" for i in range(12)]
    for partition in range(3):
        rows = batch([f"{key}/{partition}/{i}" for i in range(3) for key in keys] + ["plain"],
                     [key for _ in range(3) for key in keys] + [None])
        PartitionWriter(sink, partition).write(iter([rows]))
    found: dict[str, list[tuple[int, str]]] = {}
    for node in cluster:
        # JSCAN, not GETJOB: an empty GETJOB makes a node ask the others for
        # jobs (federation), which would move them while we look.
        with Client(f"127.0.0.1:{node.port}", route_by_job_id=False) as client:
            for job in client.jscan(queue="q", states=("queued",), reply="all"):
                if job.get("group") is None:
                    continue
                assert ranking(job["group"].encode(), ids)[0] == node_id(node), job
                found.setdefault(job["group"], []).append((int(job["ctime"]), job["body"]))
    assert sorted(found) == sorted(keys)
    for key, jobs in found.items():
        assert [body for _, body in sorted(jobs)] == [
            f"{key}/{p}/{i}".encode() for p in range(3) for i in range(3)]
    assert {ranking(key.encode(), ids)[0] for key in keys} == set(ids)  # each node is a home


def test_a_partition_whose_node_is_a_groups_home_sends_it_on_its_own_connection(
        cluster) -> None:
    seed = f"127.0.0.1:{cluster[0].port}"
    sink = SinkConfig.from_options({"nodes": seed, "queue": "q"}, GROUPED).over_cluster()
    writer = PartitionWriter(sink, 0)
    home_ids = [node for node, _ in sink.group_homes]
    address = dict(sink.group_homes)

    def home(key: str) -> str:
        return address[ranking(key.encode(), home_ids)[0]]

    own = next(key for key in (f"k{i}" for i in range(100)) if home(key) == writer.node)
    other = next(key for key in (f"k{i}" for i in range(100)) if home(key) != writer.node)
    parts = writer.batcher.parts(batch(["a", "b", "c"], [own, other, None]), lambda: False)
    assert sorted((p.home, len(p)) for p in parts if p.home) == [(home(other), 1)]
    assert len([p for p in parts if p.home is None]) == 2
    for trip in writer.batcher.trips(parts):
        writer.send(trip)
    assert set(writer._clients) == {None, home(other)}
    writer.close()


# --------------------------------------------------------------------------
# Through Spark
# --------------------------------------------------------------------------

def test_spark_writes_the_group_column(spark, server, disque: Client) -> None:
    rows = [(f"a{i}", "A") for i in range(5)] + [("p", None)]
    (spark.createDataFrame(rows, "body string, group string").coalesce(1)
     .write.format("disque").option("nodes", f"127.0.0.1:{server.port}")
     .option("queue", "q").mode("append").save())
    assert per_group(delivered(disque)) == {b"A": [b"a0", b"a1", b"a2", b"a3", b"a4"],
                                            None: [b"p"]}


def test_a_stream_passes_the_sources_group_to_the_sink(spark, server, disque: Client,
                                                       tmp_path: Path) -> None:
    """Read with ``includeGroups``, write ``group`` on: the jobs keep their
    groups in the next queue (one partition keeps a group's order)."""
    nodes = f"127.0.0.1:{server.port}"
    for i in range(4):
        disque.add_job("in", f"a{i}", group="A")
    disque.add_job("in", b"plain")
    query = (spark.readStream.format("disque").option("nodes", nodes).option("queues", "in")
             .option("includeGroups", "true").option("stagingPath", str(tmp_path / "staging"))
             .option("fetchTimeoutMs", "100").load()
             .selectExpr("upper(cast(body as string)) as body", "`group`")
             .writeStream.format("disque").option("nodes", nodes).option("queue", "out")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert per_group(delivered(disque, "out")) == {b"A": [b"A0", b"A1", b"A2", b"A3"],
                                                   None: [b"PLAIN"]}
