"""The sink sends ADDJOBS (our bulk ADDJOB) and falls back to ADDJOBs on an original node.

Real nodes (ours, and the original when DISQUE_REFERENCE_SERVER names its
binary) and the shared local Spark session.  How a write went out is read
from the nodes: ours counts commands (INFO ``total_commands_processed``),
the original counts each command (INFO ``commandstats``).
"""

from __future__ import annotations

import re
import socket
import threading
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from disque.client import Client
from spark_connector.sink_options import SinkConfig
from spark_connector.writer import DisqueWriteError, PartitionWriter, split_key
from tests.spark.sink_support import config_for, drain
from tests.support.process import raw_command, wait_for

WITH_OPTIONS = StructType([StructField("body", StringType()), StructField("queue", StringType()),
                           StructField("delay", IntegerType()), StructField("ttl", IntegerType())])


def commands_processed(port: int) -> int:
    text = raw_command(port, "INFO", "stats")
    assert isinstance(text, bytes)
    return int(re.search(rb"total_commands_processed:(\d+)", text).group(1))


def command_calls(port: int) -> dict[str, int]:
    """The original's INFO commandstats: calls per command name."""
    text = raw_command(port, "INFO", "commandstats")
    assert isinstance(text, bytes)
    return {name.decode(): int(calls)
            for name, calls in re.findall(rb"cmdstat_(\w+):calls=(\d+)", text)}


def bodies(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


# --------------------------------------------------------------------------
# The partition writer as a plain object
# --------------------------------------------------------------------------

def test_one_addjobs_per_batch_size_rows(server, disque) -> None:
    config = config_for(server.port, queue="bulk", batchSize="400")
    writer = PartitionWriter(config, 0)
    before = commands_processed(server.port)
    message = writer.write(iter([pa.record_batch({"body": bodies("a", 1000)}),
                                 pa.record_batch({"body": bodies("b", 300)})]))
    # 400 + 400 + 200 rows of the first batch, 300 of the second.
    assert (writer.sent_bulk, writer.sent_single) == (4, 0)
    # CLIENT SETNAME, HELLO, the four ADDJOBS (nothing per row), and the
    # INFO that reads the counter.
    assert commands_processed(server.port) - before == 7
    assert message.jobs == 1300 and message.queues == {"bulk": 1300}
    # One queue, one connection: the jobs are queued in row order.
    assert drain(disque, "bulk") == [b.encode() for b in bodies("a", 1000) + bodies("b", 300)]


def test_refused_bodies_alone_are_sent_again(server, disque) -> None:
    """MAXLEN refuses the bodies past the limit inside the ADDJOBS array;
    only those are re-sent, once a consumer made room."""
    config = config_for(server.port, queue="full", maxlen="5", retryErrors="MAXLEN",
                        retryBackoff="10ms", batchSize="12")
    consumed: list[bytes] = []
    queued_at_sleep: list[int] = []

    def sleep(_seconds: float) -> None:
        queued_at_sleep.append(disque.qlen("full"))
        consumed.extend(drain(disque, "full"))

    writer = PartitionWriter(config, 0, sleep=sleep)
    message = writer.write(iter([pa.record_batch({"body": bodies("r", 12)})]))
    consumed.extend(drain(disque, "full"))
    # 12 sent, 5 taken; 7 sent again, 5 taken; 2 sent again, both taken.
    assert queued_at_sleep == [5, 5]
    assert (writer.sent_bulk, message.retries, message.jobs) == (3, 2, 12)
    assert consumed == [b.encode() for b in bodies("r", 12)]  # each once, in order


def test_whole_command_error_fails_naming_its_queue_and_counts_the_rest(server, disque) -> None:
    """DELAY >= TTL refuses a whole ADDJOBS (an option error): every body of
    that command failed; the other group's command of the same round trip
    went through and is counted."""
    config = SinkConfig.from_options({"nodes": f"127.0.0.1:{server.port}"}, WITH_OPTIONS)
    batch = pa.record_batch({
        "body": bodies("x", 6),
        "queue": ["fine", "bad", "fine", "bad", "fine", "fine"],
        "delay": pa.array([None, 100, None, 100, None, None], pa.int32()),
        "ttl": pa.array([None, 50, None, 50, None, None], pa.int32()),
    })
    writer = PartitionWriter(config, 0, sleep=pytest.fail)
    with pytest.raises(DisqueWriteError) as info:
        writer.write(iter([batch]))
    assert info.value.queue == "bad" and info.value.jobs_written == 4
    assert "queue 'bad'" in str(info.value) and "DELAY is greater than TTL" in str(info.value)
    assert "4 jobs of this partition were added before" in str(info.value)
    assert writer.sent_bulk == 2  # one ADDJOBS per (queue, delay, ttl)
    assert disque.qlen("fine") == 4 and disque.qlen("bad") == 0


def test_paused_queue_refuses_its_whole_addjobs_until_unpaused(server, disque) -> None:
    disque.pause("held", "in")
    schema = StructType([StructField("body", StringType()), StructField("queue", StringType())])
    config = SinkConfig.from_options({"nodes": f"127.0.0.1:{server.port}",
                                      "retryBackoff": "10ms"}, schema)
    waits: list[tuple[int, int]] = []

    def sleep(_seconds: float) -> None:
        waits.append((disque.qlen("open"), disque.qlen("held")))
        disque.pause("held", "none")

    batch = pa.record_batch({"body": bodies("p", 8), "queue": ["held", "open"] * 4})
    writer = PartitionWriter(config, 0, sleep=sleep)
    message = writer.write(iter([batch]))
    # The open queue's ADDJOBS went through in the first round trip; the
    # paused one's four bodies were all refused, then sent again alone.
    assert waits == [(4, 0)]
    assert (writer.sent_bulk, message.retries, message.queues) == (3, 1, {"held": 4, "open": 4})
    assert drain(disque, "held") == [b"p0", b"p2", b"p4", b"p6"]


def test_per_row_options_group_rows_with_equal_values(server, disque) -> None:
    config = SinkConfig.from_options({"nodes": f"127.0.0.1:{server.port}", "queue": "g-default",
                                      "ttl": "7200"}, WITH_OPTIONS)
    n = 40
    queues = [None if i % 4 == 0 else f"g{i % 2}" for i in range(n)]
    ttls = [600 if i % 3 == 0 else None for i in range(n)]
    batch = pa.record_batch({"body": bodies("o", n), "queue": pa.array(queues, pa.string()),
                             "delay": pa.array([None] * n, pa.int32()),
                             "ttl": pa.array(ttls, pa.int32())})
    writer = PartitionWriter(config, 0)
    message = writer.write(iter([batch]))
    expected = {(q or "g-default", 600 if t else 7200)
                for q, t in zip(queues, ttls, strict=True)}
    assert message.jobs == n and writer.sent_bulk == len(expected) == 6
    jobs = {job["body"].decode(): job for job in disque.jscan(reply="all")}
    for i in range(n):
        job = jobs[f"o{i}"]
        assert job["queue"] == (queues[i] or "g-default")
        assert (ttls[i] or 7200) - 100 < job["ttl"] <= (ttls[i] or 7200)
    # Rows of one group keep their order in their queue.
    queued = drain(disque, "g1")
    for ttl in (600, None):
        rows = [f"o{i}".encode() for i in range(n) if queues[i] == "g1" and ttls[i] == ttl]
        assert [body for body in queued if body in rows] == rows


def test_idmp_keys_still_go_out_as_one_addjob_per_row(server, disque) -> None:
    config = config_for(server.port, queue="idmp-rows", dedupKey="true", batchSize="10")
    writer = PartitionWriter(config, 0, key_prefix="w/0/0/")
    writer.write(iter([pa.record_batch({"body": bodies("k", 25)})]))
    again = PartitionWriter(config, 0, key_prefix="w/0/0/")
    again.write(iter([pa.record_batch({"body": bodies("k", 25)})]))  # a re-run
    assert (writer.sent_bulk, writer.sent_single) == (0, 25)
    keyed = sorted(split_key(body) for body in drain(disque, "idmp-rows"))
    assert keyed == sorted((f"w/0/0/{i}", f"k{i}".encode()) for i in range(25))


# --------------------------------------------------------------------------
# A connection lost between two ADDJOBS of one pipeline
# --------------------------------------------------------------------------

def reply_end(buf: bytes, at: int) -> int | None:
    """Where the RESP reply starting at ``at`` ends, or None if incomplete."""
    line = buf.find(b"\r\n", at)
    if line < 0:
        return None
    kind, head = buf[at:at + 1], buf[at + 1:line]
    if kind in (b"+", b"-", b":"):
        return line + 2
    if kind == b"$":
        end = line + 2 + int(head) + 2 if int(head) >= 0 else line + 2
        return end if end <= len(buf) else None
    end: int | None = line + 2
    for _ in range(max(int(head), 0)):
        assert end is not None
        end = reply_end(buf, end)
        if end is None:
            return None
    return end


class CuttingProxy:
    """A TCP relay to a node: its first connection passes ``replies``
    replies to the client, waits until the node has sent the next one too,
    drops that one and closes both sides.  Later connections pass through."""

    def __init__(self, port: int, replies: int) -> None:
        self.port, self.replies = port, replies
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        first = True
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.port))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client, first),
                             daemon=True).start()
            first = False

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass

    def _replies(self, upstream: socket.socket, client: socket.socket, cut: bool) -> None:
        if not cut:
            return self._pump(upstream, client)
        buf, at, passed = b"", 0, 0
        while passed <= self.replies:
            data = upstream.recv(65536)
            if not data:
                break
            buf += data
            while passed <= self.replies and (end := reply_end(buf, at)) is not None:
                if passed < self.replies:  # passed on as it arrives: the client waits for it
                    client.sendall(buf[at:end])
                at, passed = end, passed + 1
        for sock in (client, upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # the other side closed first
                pass
            sock.close()
        self.cut.set()

    def close(self) -> None:
        self.listener.close()


def test_lost_connection_keeps_the_answered_addjobs(server, disque) -> None:
    # CLIENT SETNAME and HELLO, then the first of two ADDJOBS: the second is
    # run by the node but its reply never arrives.
    proxy = CuttingProxy(server.port, replies=3)
    try:
        schema = StructType([StructField("body", StringType()), StructField("queue", StringType())])
        config = SinkConfig.from_options({"nodes": proxy.address, "discoverNodes": "false"},
                                         schema)
        batch = pa.record_batch({"body": bodies("c", 10), "queue": ["c1"] * 5 + ["c2"] * 5})
        writer = PartitionWriter(config, 0, sleep=pytest.fail)
        message = writer.write(iter([batch]))
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    assert message.retries == 1 and message.queues == {"c1": 5, "c2": 5}
    assert writer.sent_bulk == 3  # both, then the unanswered one again
    # The answered command was never sent twice; the unanswered one was.
    assert Counter(drain(disque, "c1")) == Counter(b.encode() for b in bodies("c", 5))
    assert Counter(drain(disque, "c2")) == Counter(
        {f"c{i}".encode(): 2 for i in range(5, 10)})


# --------------------------------------------------------------------------
# Through Spark
# --------------------------------------------------------------------------

def test_spark_write_goes_out_as_addjobs(spark, server, disque) -> None:
    df = spark.range(0, 6000, numPartitions=2).selectExpr("cast(id as string) as body")
    before = commands_processed(server.port)
    (df.write.format("disque").mode("append").option("nodes", f"127.0.0.1:{server.port}")
     .option("queue", "via-bulk").option("batchSize", "1000").save())
    commands = commands_processed(server.port) - before
    # Per partition: CLIENT SETNAME, HELLO, three ADDJOBS of 1000; then the
    # driver's look-up of the nodes and the INFO. Row by row: 6000 ADDJOBs.
    assert commands <= 20, commands
    assert sorted(int(b) for b in drain(disque, "via-bulk")) == list(range(6000))


def test_original_node_gets_pipelined_addjobs(original) -> None:
    config = SinkConfig.from_options({"nodes": f"127.0.0.1:{original.port}",
                                      "batchSize": "10", "ttl": "600"}, WITH_OPTIONS)
    batch = pa.record_batch({"body": bodies("f", 30), "queue": ["o1", "o2", "o3"] * 10,
                             "delay": pa.array([None] * 30, pa.int32()),
                             "ttl": pa.array([None, 60] * 15, pa.int32())})
    writer = PartitionWriter(config, 0)
    message = writer.write(iter([batch, batch]))
    # The first round trip asked for ADDJOBS once per group in it; "unknown
    # command" put the node on the list; every row then went as an ADDJOB.
    assert len(writer.no_bulk) == 1 and writer.sent_single == 60
    assert writer.sent_bulk == 2  # the first round trip: the first 10 rows of two groups
    assert message.jobs == 60 and message.queues == {"o1": 20, "o2": 20, "o3": 20}
    assert command_calls(original.port)["addjob"] == 60
    with Client(f"127.0.0.1:{original.port}") as client:
        seen = Counter(drain(client, "o1") + drain(client, "o2") + drain(client, "o3"))
    assert seen == Counter({f"f{i}".encode(): 2 for i in range(30)})


def test_spark_write_to_an_original_node(spark, original) -> None:
    address = f"127.0.0.1:{original.port}"
    df = spark.range(0, 3000, numPartitions=2).selectExpr("cast(id as string) as body")
    df.write.format("disque").mode("append").option("nodes", address).option(
        "queue", "from-spark").save()
    calls = command_calls(original.port)
    assert calls["addjob"] == 3000 and "addjobs" not in calls
    with Client(address) as client:
        wait_for(lambda: client.qlen("from-spark") == 3000, timeout=10)
        assert sorted(int(b) for b in drain(client, "from-spark")) == list(range(3000))
