"""The connectors against a 3-node cluster of real nodes, one of them killed.

The source finds every node through HELLO from one seed, fetches from all of
them, reports progress per node and keeps its guarantee when a node dies with
jobs staged; the sink spreads partitions over the reachable nodes, moves to
another node when its own dies, and never re-sends a job it got an ID for.

Jobs use REPLICATE 2: with one node of three dead, the default (3 copies)
cannot be reached and ADDJOB answers -NOREPL, as in the original Disque.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from disque.client import Client
from spark_connector.executor_read import fetch_or_replay
from spark_connector.options import SourceConfig
from spark_connector.partitions import FetchPartition
from spark_connector.schema import source_schema
from spark_connector.sink_options import SinkConfig
from spark_connector.stream_reader import DisqueStreamReader
from spark_connector.writer import PartitionWriter
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined
from tests.support.process import DisqueProcess, wait_for

BODY_ONLY = StructType([StructField("body", StringType())])


@pytest.fixture
def cluster(server_factory) -> list[DisqueProcess]:
    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    return nodes


def addr(node: DisqueProcess) -> str:
    return f"127.0.0.1:{node.port}"


def on(node: DisqueProcess) -> Client:
    """A client that adds jobs on this node (they are queued there)."""
    return Client(addr(node), route_by_job_id=False)


def add_on_each(cluster: list[DisqueProcess], queue: str, per_node: int, tag: str,
                **options) -> list[str]:
    ids = []
    for n, node in enumerate(cluster):
        with on(node) as client:
            ids += client.add_jobs(queue, [f"{tag}{n}-{i}" for i in range(per_node)],
                                   replicate=2, **options)
    return ids


def acked_everywhere(nodes: list[DisqueProcess], ids: list[str]) -> bool:
    """Every job is acknowledged (or already garbage collected) on these nodes."""
    for node in nodes:
        with on(node) as client:
            for job_id in ids:
                info = client.show(job_id)
                if info is not None and info["state"] != "acked":
                    return False
    return True


def reader_for(seed: DisqueProcess, staging: Path, **options: str) -> DisqueStreamReader:
    config = SourceConfig.from_options(
        {"nodes": addr(seed), "queues": "events", "stagingPath": str(staging),
         "fetchTimeoutMs": "0", **options}, streaming=True)
    return DisqueStreamReader(config, source_schema())


def read_all(reader: DisqueStreamReader, start: int, end: int) -> list[str]:
    ids = []
    for part in reader.partitions({"batch": start}, {"batch": end}):
        for batch in reader.read(part):
            ids += batch.column("id").to_pylist()
    return ids


# --------------------------------------------------------------------------
# The source, driven as Spark drives it
# --------------------------------------------------------------------------

@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_source_reads_every_node_from_one_seed(cluster, tmp_path: Path, fetch_mode: str) -> None:
    produced = add_on_each(cluster, "events", 40, "j")
    reader = reader_for(cluster[0], tmp_path / "staging", fetchMode=fetch_mode)
    try:
        end = reader.latestOffset({"batch": 0}, reader.getDefaultReadLimit())["batch"]
        assert end == 1
        parts = reader.partitions({"batch": 0}, {"batch": 1})
        if fetch_mode == "executor":
            # One task per node (found through HELLO from one seed), each
            # with the other nodes as fallbacks.
            assert sorted(p.node for p in parts) == sorted(addr(n) for n in cluster)
            assert all(len(p.fallbacks) == 2 for p in parts)
        assert sorted(read_all(reader, 0, 1)) == sorted(produced)
        reader.driver._discover_executor_parts()  # what the lease thread does
        nodes = reader.reportLatestOffset()["nodes"]
        assert set(nodes) == {addr(n) for n in cluster}
        assert all(v["up"] for v in nodes.values())
        assert sum(v["fetched"] for v in nodes.values()) == 120
        # Before this batch, 40 jobs were queued on each node.
        if fetch_mode == "executor":
            assert [nodes[addr(n)]["queued"] for n in cluster] == [40, 40, 40]
        reader.commit({"batch": 1})
        # With fetchAhead the ACK runs in the background: poll either way.
        wait_for(lambda: acked_everywhere(cluster, produced), timeout=10,
                 message="every job acknowledged on every node")
    finally:
        reader.stop()


def test_a_live_batch_stays_leased_when_the_seed_holds_none_of_its_jobs(
        cluster, tmp_path: Path) -> None:
    """Heartbeats go to each job's own node from the first one on.

    The seed holds no copy of the jobs (REPLICATE 1 on the two other nodes):
    a WORKING sent to it answers NOJOB. A competing consumer polls every node
    for three times the jobs' RETRY while the batch is held: it gets none of
    them, and no lease is counted lost.
    """
    seed, b, c = cluster
    produced = []
    for node in (b, c):
        with on(node) as client:
            produced += client.add_jobs("events", [f"{node.port}-{i}" for i in range(20)],
                                        replicate=1, retry=2)
    reader = reader_for(seed, tmp_path / "staging", maxJobsPerTrigger="1000")
    competitor_got: list[str] = []
    try:
        assert reader.latestOffset({"batch": 0}, reader.getDefaultReadLimit())["batch"] == 1
        held = set(reader.driver.tables[1].column("id").to_pylist())
        with on(seed) as client:
            elsewhere = {i for i in held if client.show(i) is None}
        assert len(elsewhere) >= 20, "most of the batch should have no copy on the seed"
        competitors = [on(n) for n in cluster]
        deadline = time.monotonic() + 3 * 2  # three times the jobs' RETRY
        while time.monotonic() < deadline:
            for competitor in competitors:
                jobs = competitor.get_jobs("events", count=100, nohang=True)
                competitor_got += [j.id for j in jobs]
            time.sleep(0.05)  # a consumer's poll interval, not a wait for a condition
        for competitor in competitors:
            competitor.close()
        metrics = reader.reportLatestOffset()
        reader.commit({"batch": 1})
    finally:
        reader.stop()
    assert not set(competitor_got) & held
    assert metrics["leasesLost"] == 0
    assert metrics["jobsLeased"] == len(held)


def test_source_acks_and_keeps_reading_after_a_node_is_killed(cluster, tmp_path: Path) -> None:
    produced = add_on_each(cluster, "events", 30, "k", retry=1)
    reader = reader_for(cluster[0], tmp_path / "staging", maxJobsPerTrigger="1000")
    try:
        assert reader.latestOffset({"batch": 0}, reader.getDefaultReadLimit())["batch"] == 1
        first = read_all(reader, 0, 1)
        assert sorted(first) == sorted(produced)
        cluster[2].kill()  # staged, leased, not acknowledged yet
        survivors = cluster[:2]
        more = add_on_each(survivors, "events", 20, "m", retry=1)
        # The next triggers acknowledge batch 1 (jobs created on the dead
        # node too: ACKJOB works on any node holding a copy) and read on.
        # Not necessarily all in one batch: the driver reads the nodes one
        # after another, and a job may move meanwhile (federation answers
        # the NOHANG pass on an emptied node; a copy requeues after RETRY),
        # landing in the batch after.
        second: list[str] = []
        last = 1

        def read_on() -> bool:
            nonlocal last
            if reader.latestOffset({"batch": last},
                                   reader.getDefaultReadLimit())["batch"] == last + 1:
                second.extend(read_all(reader, last, last + 1))
                last += 1
            return set(more) <= set(second)

        wait_for(read_on, timeout=20, interval=0.2, message="every new job read")
        reader.commit({"batch": last})
        assert acked_everywhere(survivors, produced + more)
        # Nothing left to deliver, although the dead node's jobs had copies
        # that would requeue them after RETRY (1 s) had the ACK not reached them.
        reader.latestOffset({"batch": last}, reader.getDefaultReadLimit())
        assert not [n for n in survivors if on(n).qlen("events")]
        metrics = reader.reportLatestOffset()
        assert metrics["nodes"][addr(cluster[2])]["up"] is False
        assert metrics["jobsAcked"] == len(first) + len(second)
    finally:
        reader.stop()


def test_executor_task_of_a_dead_node_fetches_from_another(cluster, tmp_path: Path) -> None:
    produced = add_on_each(cluster[:1], "events", 25, "f")
    reader = reader_for(cluster[0], tmp_path / "staging", fetchMode="executor")
    try:
        reader.latestOffset({"batch": 0}, reader.getDefaultReadLimit())
        (part,) = reader.partitions({"batch": 0}, {"batch": 1})
        assert isinstance(part, FetchPartition) and part.node == addr(cluster[0])
        # The planned node dies before the task runs: the task fetches from
        # a fallback, which gets the jobs from the copies' nodes once they
        # requeue them (jobs carry the default RETRY here: ask by NEEDJOBS).
        dead = FetchPartition(part.seq, part.staging_path, part.file, addr(cluster[2]),
                              part.queues, part.count, part.connection, part.batch_size,
                              (addr(cluster[0]),))
        cluster[2].kill()
        table = fetch_or_replay(dead)
        assert sorted(table.column("id").to_pylist()) == sorted(produced)
        assert table.schema.metadata[b"disque.node"] == addr(cluster[0]).encode()
    finally:
        reader.stop()


def test_batch_read_finds_every_node_from_one_seed(spark, cluster) -> None:
    produced = add_on_each(cluster, "scan", 10, "b")

    def read(**options: str) -> list[str]:
        reader = spark.read.format("disque").option("nodes", addr(cluster[0]))
        for name, value in {"queues": "scan", **options}.items():
            reader = reader.option(name, value)
        return sorted(r.id for r in reader.load().select("id").collect())

    assert read(discoverNodes="false") == sorted(produced[:10])  # the seed's queue only
    assert read() == sorted(produced)                            # peeked on every node
    assert read(drain="true") == sorted(produced)
    assert not [n for n in cluster if on(n).qlen("scan")]


def test_a_batch_drain_from_one_seed_reads_every_job_of_the_cluster(spark, cluster) -> None:
    """A drain takes what was queued when it started, on every node, also when
    the same queue is drained again and again (20 runs of 60 jobs).

    A partition that found its queue empty with a GETJOB (here every one:
    20 jobs per node, fetched 10 per GETJOB) would ask the other nodes for
    jobs (federation), which would then move to its node after it ended,
    from the node whose partition had not started yet (two of the three
    partitions run at a time): the drain asks QLEN before each GETJOB instead.
    """
    seed = addr(cluster[0])
    counts = []
    for run in range(20):
        produced = add_on_each(cluster, "drained", 20, f"r{run}-")
        rows = (spark.read.format("disque").option("nodes", seed).option("queues", "drained")
                .option("drain", "true").option("fetchBatchSize", "10").load()
                .select("id").collect())
        counts.append(len(rows))
        assert sorted(r.id for r in rows) == sorted(produced), f"run {run}: {counts}"
        assert not [n for n in cluster if on(n).qlen("drained")]
    assert counts == [60] * 20


# --------------------------------------------------------------------------
# The sink
# --------------------------------------------------------------------------

def drain(nodes: list[DisqueProcess], queue: str) -> list[bytes]:
    bodies = []
    for node in nodes:
        with on(node) as client:
            while jobs := client.get_jobs(queue, count=500, nohang=True):
                bodies += [j.body for j in jobs]
                client.fastack(*[j.id for j in jobs])
    return bodies


def test_sink_spreads_over_the_reachable_nodes_from_one_seed(cluster) -> None:
    leaving = cluster[1]
    with on(leaving) as client:
        client.cluster_leaving(True)
    wait_for(lambda: all(on(n).hello().nodes and max(
        i.priority for i in on(n).hello().nodes) == 100 for n in (cluster[0], cluster[2])),
        timeout=10, message="the others to see the leaving node")
    config = SinkConfig.from_options({"nodes": addr(cluster[0]), "queue": "spread",
                                      "replicate": "2"}, BODY_ONLY).over_cluster()
    # The leaving node is left out; the other two share the partitions.
    assert sorted(config.connection.nodes) == sorted([addr(cluster[0]), addr(cluster[2])])
    batch = pa.record_batch({"body": ["x"]})
    used = [PartitionWriter(config, p).write(iter([batch])).node for p in range(4)]
    assert sorted(set(used)) == sorted([addr(cluster[0]), addr(cluster[2])])
    assert used[0] != used[1] and used[0] == used[2]


def test_sink_moves_to_another_node_when_its_node_is_killed(cluster) -> None:
    config = SinkConfig.from_options(
        {"nodes": addr(cluster[0]), "queue": "moved", "replicate": "2", "retry": "1",
         "batchSize": "50", "retryBackoff": "10ms"}, BODY_ONLY).over_cluster()
    writer = PartitionWriter(config, 0)
    target = next(n for n in cluster if addr(n) == writer.node)
    survivors = [n for n in cluster if n is not target]

    def batches():
        yield pa.record_batch({"body": [f"a{i}" for i in range(100)]})
        target.kill()   # between two batches: the next send finds the link dead
        yield pa.record_batch({"body": [f"b{i}" for i in range(100)]})

    message = writer.write(batches())
    assert message.jobs == 200 and message.node != addr(target)
    expected = {f"{p}{i}".encode() for p in "ab" for i in range(100)}
    # The dead node's queued jobs come back from their copies after RETRY.
    seen: list[bytes] = []
    wait_for(lambda: seen.extend(drain(survivors, "moved")) or set(seen) >= expected,
             timeout=30, interval=0.2, message=lambda: f"{len(set(seen))} of 200 jobs")
    # Each job once: no pipeline was cut mid-way, so nothing was re-sent.
    assert sorted(seen) == sorted(expected)


# --------------------------------------------------------------------------
# Both through Spark, a node killed mid-stream
# --------------------------------------------------------------------------

def test_stream_from_the_cluster_to_the_cluster_survives_a_killed_node(
        spark, cluster, tmp_path: Path) -> None:
    produced = add_on_each(cluster, "in", 100, "s", retry=1)
    seed = addr(cluster[0])
    query = (spark.readStream.format("disque").option("nodes", seed).option("queues", "in")
             .option("stagingPath", str(tmp_path / "staging")).option("fetchMode", "executor")
             .option("maxJobsPerTrigger", "60").option("fetchTimeoutMs", "100").load()
             .selectExpr("id AS body")
             .writeStream.format("disque").option("nodes", seed).option("queue", "out")
             .option("replicate", "2").option("retry", "1").option("retryBackoff", "50ms")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(processingTime="100 milliseconds").start())
    survivors = cluster[:2]
    try:
        wait_for(lambda: json.loads((query.lastProgress or {"sources": [{
            "latestOffset": "{}"}]})["sources"][0]["latestOffset"] or "{}").get(
            "jobsAcked", 0) >= 60, timeout=120, interval=0.2,
            message=lambda: f"a first batch acknowledged: {query.lastProgress}")
        cluster[2].kill()  # with batches staged, leased and being written
        produced += add_on_each(survivors, "in", 50, "t", retry=1)
        wait_for(lambda: acked_everywhere(survivors, produced), timeout=120, interval=0.5,
                 message=lambda: f"every input job acknowledged: {query.exception()}, "
                                 f"{query.lastProgress}")
        assert query.exception() is None
        progress = json.loads(query.lastProgress["sources"][0]["latestOffset"])
    finally:
        query.stop()
    # Every job the source acknowledged is in the sink's queue (jobs the sink
    # had queued on the dead node come back from their copies after RETRY).
    seen: set[bytes] = set()
    expected = {i.encode() for i in produced}
    wait_for(lambda: seen.update(drain(survivors, "out")) or seen >= expected, timeout=60,
             interval=0.2, message=lambda: f"{len(expected - seen)} jobs missing in 'out'")
    assert seen == expected
    assert set(progress["nodes"]) == {addr(n) for n in cluster}
    assert progress["nodes"][addr(cluster[2])]["up"] is False
    assert progress["nodes"][addr(cluster[2])]["fetched"] > 0  # it served the first batch


def test_sink_keeps_seeds_outside_the_cluster_and_silent_ones_as_fallbacks(
        server_factory, unused_port: int) -> None:
    a, b = server_factory(), server_factory()  # two lone nodes, not joined
    dead = f"127.0.0.1:{unused_port}"
    config = SinkConfig.from_options(
        {"nodes": f"{dead},{addr(a)},localhost:{b.port}", "queue": "lone"},
        BODY_ONLY).over_cluster()
    assert config.spread == 2
    assert sorted(config.connection.nodes[:2]) == sorted([addr(a), f"localhost:{b.port}"])
    assert config.connection.nodes[2] == dead  # tried last, never a partition's own node
    batch = pa.record_batch({"body": ["x"]})
    used = {PartitionWriter(config, p).write(iter([batch])).node for p in range(2)}
    assert len(used) == 2 and dead not in used
