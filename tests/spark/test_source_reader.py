"""The stream reader as a plain object against a real node (no JVM).

These tests drive the methods the way Spark's driver does (latestOffset,
partitions, commit) and run ``read`` on what ``partitions`` returned, which
is what executors get, so each rule of the delivery contract is checked
directly: staging before the offset, identical replay, ACK only through a
committed offset, leases, read limits and availableNow.

Most tests run with ``fetchAhead`` off (it is on by default), so that each
call's effects can be checked the moment it returns; the ``fetchAhead`` tests
at the end check the same rules with the background ACK and the batch staged
ahead.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from disque.client import Client
from spark_connector.batch_reader import DisqueBatchReader
from spark_connector.executor_read import fetch_or_replay, publish_fetched
from spark_connector.fetch import fetch_jobs, fetch_table
from spark_connector.options import SourceConfig
from spark_connector.partitions import FetchPartition
from spark_connector.schema import source_schema
from spark_connector.staging import StagingArea
from spark_connector.stream_reader import DisqueStreamReader
from tests.support.process import wait_for


@pytest.fixture
def client(server) -> Client:
    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


def make_reader(server, staging: Path, **options: str) -> DisqueStreamReader:
    opts = {"nodes": f"127.0.0.1:{server.port}", "queues": "q", "stagingPath": str(staging),
            "fetchTimeoutMs": "0", "fetchAhead": "false", **options}
    config = SourceConfig.from_options(opts, streaming=True)
    return DisqueStreamReader(config, source_schema(config.body_format))


def rows(reader: DisqueStreamReader, start: int, end: int) -> list[dict]:
    """What executors would produce for the batch range (start, end]."""
    out: list[dict] = []
    for part in reader.partitions({"batch": start}, {"batch": end}):
        for batch in reader.read(part):
            out.extend(batch.to_pylist())
    return out


def same_batch(offset: dict, other: dict) -> bool:
    """Two offsets name the same batch (their figures, progress.py, may differ)."""
    return (offset["batch"], offset.get("jobs")) == (other["batch"], other.get("jobs"))


def registered(client: Client) -> int:
    return int(client.info("jobs")["jobs"]["registered_jobs"])


def test_batch_is_staged_before_its_offset_and_acked_only_after_commit(
        server, client: Client, tmp_path: Path) -> None:
    ids = [client.add_job("q", f"body-{i}") for i in range(25)]
    reader = make_reader(server, tmp_path / "staging")
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(10))
    assert end["batch"] == 1
    assert StagingArea(tmp_path / "staging").batches() == [1]
    got = rows(reader, 0, 1)
    assert [r["id"] for r in got] == ids[:10]
    assert got[0]["body"] == b"body-0" and got[0]["queue"] == "q"
    assert got[0]["nacks"] == 0 and got[0]["additional_deliveries"] == 0
    assert got[0]["node"] == ids[0][2:10]
    assert client.qlen("q") == 15 and registered(client) == 25  # leased, not acked
    # The next batch is planned only after batch 1 committed: ACK happens there.
    assert reader.latestOffset(end, ReadMaxRows(10))["batch"] == 2
    assert registered(client) == 15
    assert StagingArea(tmp_path / "staging").batches() == [2]
    reader.commit({"batch": 2})
    reader.commit({"batch": 2})  # idempotent
    assert registered(client) == 5
    assert StagingArea(tmp_path / "staging").batches() == []
    reader.stop()


def test_no_new_offset_when_the_queue_is_empty(server, client: Client, tmp_path: Path) -> None:
    reader = make_reader(server, tmp_path / "s")
    assert reader.latestOffset({"batch": 0}, ReadMaxRows(10))["batch"] == 0
    assert StagingArea(tmp_path / "s").batches() == []
    reader.stop()


def test_idle_fetch_blocks_boundedly_and_wakes_on_a_new_job(server, client: Client,
                                                             tmp_path: Path) -> None:
    import threading
    import time

    reader = make_reader(server, tmp_path / "s", fetchTimeoutMs="5s")
    timer = threading.Timer(0.3, lambda: Client(f"127.0.0.1:{server.port}").add_job("q", "x"))
    timer.start()
    began = time.monotonic()
    assert reader.latestOffset({"batch": 0}, ReadMaxRows(10))["batch"] == 1
    assert time.monotonic() - began < 4  # woke on the job, did not wait the full 5 s
    timer.join()
    reader.stop()


def test_restart_replays_the_identical_batch(server, client: Client, tmp_path: Path) -> None:
    for i in range(30):
        client.add_job("q", f"b{i}")
    first = make_reader(server, tmp_path / "s")
    end = first.latestOffset({"batch": 0}, ReadMaxRows(20))
    before = rows(first, 0, end["batch"])
    first.driver.keeper.stop()  # "crash": no stop(), no ACK
    # A new driver process: Spark asks for the uncommitted batch directly.
    second = make_reader(server, tmp_path / "s")
    after = rows(second, 0, end["batch"])
    assert after == before
    assert client.qlen("q") == 10
    second.stop()


def test_orphan_staged_batch_is_reused_not_refetched(server, client: Client,
                                                     tmp_path: Path) -> None:
    for i in range(30):
        client.add_job("q", f"b{i}")
    first = make_reader(server, tmp_path / "s")
    end = first.latestOffset({"batch": 4}, ReadMaxRows(20))
    staged = rows(first, 4, end["batch"])
    first.driver.keeper.stop()  # crash before Spark wrote the offset
    second = make_reader(server, tmp_path / "s")
    assert same_batch(second.latestOffset({"batch": 4}, ReadMaxRows(20)), end)
    assert rows(second, 4, end["batch"]) == staged
    assert client.qlen("q") == 10  # nothing more was fetched
    second.stop()


def test_half_written_batch_directory_is_promoted_or_dropped(server, client: Client,
                                                             tmp_path: Path) -> None:
    for i in range(5):
        client.add_job("q", f"b{i}")
    reader = make_reader(server, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(5))
    reader.driver.keeper.stop()
    (tmp_path / "s" / "batch-000000000001" / "plan.json").unlink()  # between part and plan
    seventh = tmp_path / "s" / "batch-000000000007"  # a crash before anything was named
    seventh.mkdir()
    (seventh / ".tmp-x").write_bytes(b"partial")
    second = make_reader(server, tmp_path / "s")
    assert same_batch(second.latestOffset({"batch": 0}, ReadMaxRows(5)), end)
    assert [r["body"] for r in rows(second, 0, 1)] == [f"b{i}".encode() for i in range(5)]
    assert not seventh.exists()
    second.stop()


def test_leases_are_renewed_with_working(server, client: Client, tmp_path: Path) -> None:
    job_id = client.add_job("q", "slow", retry=1)
    reader = make_reader(server, tmp_path / "s")
    reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    keeper = reader.driver.keeper
    # RETRY 1: the node would queue it again after 1 s without heartbeats.
    # Wait until heartbeats have spanned more than 3 RETRY periods.
    wait_for(lambda: keeper.heartbeats_sent >= 10, timeout=15)
    info = client.show(job_id)
    assert info is not None and info["state"] == "active"
    assert client.qlen("q") == 0 and keeper.leases_lost == 0
    reader.stop()


def test_restart_renews_leases_first(server, client: Client, tmp_path: Path) -> None:
    client.add_job("q", "x", retry=1)
    first = make_reader(server, tmp_path / "s")
    first.latestOffset({"batch": 0}, ReadMaxRows(10))
    first.driver.keeper.stop()
    second = make_reader(server, tmp_path / "s")
    keeper = second.driver.keeper  # recovery happens on first use, before any offset call
    assert keeper.heartbeats_sent == 1
    second.stop()


@pytest.mark.parametrize("heartbeats", [0, 2])
def test_a_restart_after_the_leases_ran_out_says_so(server, client: Client, tmp_path: Path,
                                                    caplog, heartbeats: int) -> None:
    """Back after RETRY (before the first heartbeat, or after some): a warning
    that names the batch, its jobs and their RETRY; the leases count as lost."""
    ids = client.add_jobs("q", [b"a", b"b", b"c"], retry=2)
    first = make_reader(server, tmp_path / "s")
    first.latestOffset({"batch": 0}, ReadMaxRows(10))
    keeper = first.driver.keeper
    wait_for(lambda: keeper.heartbeats_sent >= 3 * heartbeats, timeout=15)
    first.driver.keeper.stop()  # the driver dies: no more heartbeats, no ACK
    # Away for longer than RETRY: the node queues the jobs again.
    wait_for(lambda: {client.show(i)["state"] for i in ids} == {"queued"}, timeout=15)
    with caplog.at_level(logging.WARNING, logger="spark_connector"):
        second = make_reader(server, tmp_path / "s")
        try:
            metrics = second.reportLatestOffset()  # recovery: the driver side's start
            retry = "RETRY 2 s" if heartbeats else "their RETRY"
            assert re.search(rf"batch 1: the leases of its 3 staged jobs ran out \d+ s before "
                             rf"this restart \({retry}; leased until ", caplog.text), caplog.text
            assert metrics["leasesLost"] == 3
        finally:
            second.stop()


def test_a_restart_within_retry_warns_of_nothing(server, client: Client, tmp_path: Path,
                                                 caplog) -> None:
    client.add_jobs("q", [b"a", b"b"], retry=60)
    first = make_reader(server, tmp_path / "s")
    first.latestOffset({"batch": 0}, ReadMaxRows(10))
    first.driver.keeper.stop()
    with caplog.at_level(logging.WARNING, logger="spark_connector"):
        second = make_reader(server, tmp_path / "s")
        try:
            assert second.reportLatestOffset()["leasesLost"] == 0
        finally:
            second.stop()
    assert "ran out" not in caplog.text


def test_lost_lease_is_counted(server, client: Client, tmp_path: Path) -> None:
    job_id = client.add_job("q", "x", retry=1)
    reader = make_reader(server, tmp_path / "s")
    reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    client.del_job(job_id)  # e.g. its TTL expired
    wait_for(lambda: reader.driver.keeper.leases_lost == 1, timeout=10)
    assert reader.reportLatestOffset()["leasesLost"] == 1
    reader.stop()


def test_read_limits(server, client: Client, tmp_path: Path) -> None:
    for i in range(12):
        client.add_job("q", f"{i}")
    reader = make_reader(server, tmp_path / "s", maxJobsPerTrigger="5")
    assert reader.getDefaultReadLimit() == ReadMaxRows(5)
    end = reader.latestOffset({"batch": 0}, reader.getDefaultReadLimit())
    assert len(rows(reader, 0, end["batch"])) == 5
    end2 = reader.latestOffset(end, ReadAllAvailable())  # engine overrides: take all
    assert len(rows(reader, end["batch"], end2["batch"])) == 7
    reader.stop()


def test_min_jobs_waits_for_enough_jobs_or_the_max_delay(server, client: Client,
                                                         tmp_path: Path) -> None:
    for i in range(3):
        client.add_job("q", f"{i}")
    reader = make_reader(server, tmp_path / "s", minJobsPerTrigger="5",
                         maxTriggerDelay="1h")
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(5)
    assert reader.latestOffset({"batch": 0}, limit)["batch"] == 0
    assert client.qlen("q") == 3  # nothing taken while waiting
    for i in range(2):
        client.add_job("q", f"more{i}")
    assert reader.latestOffset({"batch": 0}, limit)["batch"] == 1
    reader.stop()
    client.add_job("q", "lonely")
    short = make_reader(server, tmp_path / "s2", minJobsPerTrigger="5",
                        maxTriggerDelay="200ms")
    wait_for(lambda: short.latestOffset({"batch": 0}, limit)["batch"] == 1, timeout=10)
    short.stop()


def test_available_now_reads_only_what_was_queued_at_the_start(server, client: Client,
                                                               tmp_path: Path) -> None:
    for i in range(7):
        client.add_job("q", f"{i}")
    reader = make_reader(server, tmp_path / "s")
    reader.prepareForTriggerAvailableNow()
    for i in range(5):
        client.add_job("q", f"late{i}")
    offset, seen = {"batch": 0}, 0
    while True:
        end = reader.latestOffset(offset, ReadMaxRows(3))
        if end == offset:
            break
        seen += len(rows(reader, offset["batch"], end["batch"]))
        offset = end
    assert seen == 7
    assert client.qlen("q") == 5
    assert registered(client) == 5  # every read job acked by the final call
    reader.stop()


def test_available_now_ends_with_an_empty_batch_that_reports_the_final_ack(
        server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", [f"{i}" for i in range(4)])
    reader = make_reader(server, tmp_path / "s")
    reader.prepareForTriggerAvailableNow()
    first = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert first["batch"] == 1 and len(rows(reader, 0, 1)) == 4
    assert reader.reportLatestOffset()["jobsLeased"] == 4
    # Spark reports no progress for a trigger without new data: the call
    # that acknowledges the last batch returns an empty one instead.
    closing = reader.latestOffset(first, ReadMaxRows(10))
    assert closing["batch"] == 2 and rows(reader, 1, 2) == []
    assert registered(client) == 0
    metrics = reader.reportLatestOffset()
    assert (metrics["jobsAcked"], metrics["jobsLeased"], metrics["batchesStaged"]) == (4, 0, 1)
    assert reader.latestOffset(closing, ReadMaxRows(10)) == closing  # the run ends
    assert StagingArea(tmp_path / "s").batches() == []
    reader.stop()


def test_processing_time_reader_adds_no_empty_batch(server, client: Client,
                                                    tmp_path: Path) -> None:
    client.add_jobs("q", ["a", "b"])
    reader = make_reader(server, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert reader.latestOffset(end, ReadMaxRows(10)) == end  # acked, nothing new
    assert registered(client) == 0
    reader.stop()


def test_body_format_string_and_bad_utf8(server, client: Client, tmp_path: Path) -> None:
    client.add_job("q", "héllo")
    reader = make_reader(server, tmp_path / "s", bodyFormat="string")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert rows(reader, 0, end["batch"])[0]["body"] == "héllo"
    bad = client.add_job("q", b"\xff\xfe")
    end2 = reader.latestOffset(end, ReadMaxRows(10))
    with pytest.raises(ValueError, match=re.escape(bad)):
        rows(reader, end["batch"], end2["batch"])
    reader.stop()


def test_fastack_mode(server, client: Client, tmp_path: Path) -> None:
    client.add_job("q", "x")
    reader = make_reader(server, tmp_path / "s", ackMode="fastack")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    reader.commit(end)
    assert registered(client) == 0
    reader.stop()


def test_partitions_split_a_big_batch(server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", [f"{i}" for i in range(100)])
    reader = make_reader(server, tmp_path / "s", numPartitions="3")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(100))
    parts = reader.partitions({"batch": 0}, end)
    assert len(parts) == 3
    assert len({r["id"] for r in rows(reader, 0, 1)}) == 100
    reader.stop()


def test_default_partitions_hold_up_to_25000_jobs(server, client: Client,
                                                  tmp_path: Path) -> None:
    client.add_jobs("q", [b"x"] * 25_001)
    reader = make_reader(server, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(100_000))
    parts = reader.partitions({"batch": 0}, end)
    sizes = [sum(b.num_rows for b in reader.read(p)) for p in parts]
    assert sizes == [12_501, 12_500]
    reader.stop()


def test_missing_staged_batch_is_a_clear_error(server, tmp_path: Path) -> None:
    reader = make_reader(server, tmp_path / "s")
    with pytest.raises(RuntimeError, match="not staged"):
        reader.partitions({"batch": 0}, {"batch": 1})
    reader.stop()


# ------------------------------------------------------------ executor mode

def test_executor_mode_plans_then_tasks_fetch_and_replay(server, client: Client,
                                                         tmp_path: Path) -> None:
    client.add_jobs("q", [f"{i}" for i in range(40)])
    reader = make_reader(server, tmp_path / "s", fetchMode="executor", numPartitions="2")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(30))
    assert client.qlen("q") == 40  # the driver only planned
    parts = reader.partitions({"batch": 0}, end)
    assert len(parts) == 2 and sum(p.count for p in parts) == 30
    first = [fetch_or_replay(p).column("id").to_pylist() for p in parts]
    assert client.qlen("q") == 10
    again = [fetch_or_replay(p).column("id").to_pylist() for p in parts]  # retried tasks
    assert again == first and client.qlen("q") == 10
    # The driver's lease keeper finds the published parts while the batch runs.
    wait_for(lambda: reader.driver.keeper.held().get(1) == 30, timeout=10)
    next_end = reader.latestOffset(end, ReadMaxRows(30))
    assert next_end["batch"] == 2 and registered(client) == 10
    reader.stop()


def test_executor_parts_carry_the_nodes_lease(server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", [f"{i}" for i in range(10)], retry=120)
    reader = make_reader(server, tmp_path / "s", fetchMode="executor", numPartitions="2")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    for part in reader.partitions({"batch": 0}, end):
        fetch_or_replay(part)  # what the tasks do: fetch WITHLEASE, publish the part
    keeper = reader.driver.keeper
    wait_for(lambda: keeper.held().get(1) == 10, timeout=10)
    # Due again in ~120 s: the first heartbeat waits ~60 s, not "at once".
    assert 55 < keeper.next_heartbeat_in(1) <= 60 and keeper.heartbeats_sent == 0
    keeper.stop()  # the driver crashes; a new one recovers the batch ...
    second = make_reader(server, tmp_path / "s", fetchMode="executor", numPartitions="2")
    # ... and heartbeats its jobs before anything else, whatever their lease.
    assert second.driver.keeper.heartbeats_sent == 10
    second.stop()


def test_losing_attempt_gives_its_jobs_back(server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", [f"{i}" for i in range(10)])
    reader = make_reader(server, tmp_path / "s", fetchMode="executor")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(4))
    (part,) = reader.partitions({"batch": 0}, end)
    assert isinstance(part, FetchPartition)
    winner = fetch_or_replay(part)
    loser_fetch = fetch_table(client, ["q"], 4, batch_size=4)
    result = publish_fetched(part, client, loser_fetch)
    assert result.column("id").to_pylist() == winner.column("id").to_pylist()
    assert client.qlen("q") == 6  # the loser's 4 jobs are queued again
    reader.stop()


# --------------------------------------------------------------- batch reads

def batch_rows(server, **options: str) -> list[dict]:
    opts = {"nodes": f"127.0.0.1:{server.port}", "queues": "q", **options}
    config = SourceConfig.from_options(opts, streaming=False)
    reader = DisqueBatchReader(config, source_schema())
    out = []
    for part in reader.partitions():
        for batch in reader.read(part):
            assert isinstance(batch, pa.RecordBatch)
            out.extend(batch.to_pylist())
    return out


def test_batch_peek_changes_nothing_and_drain_consumes(server, client: Client) -> None:
    client.add_jobs("q", [f"{i}" for i in range(25)])
    peeked = batch_rows(server, fetchBatchSize="7")
    assert sorted(r["body"] for r in peeked) == sorted(f"{i}".encode() for i in range(25))
    assert client.qlen("q") == 25
    assert len(batch_rows(server, maxJobs="4")) == 4
    drained = batch_rows(server, drain="true", fetchBatchSize="10")
    assert len(drained) == 25 and client.qlen("q") == 0 and registered(client) == 0


def test_log_level_info_reports_each_batch(server, client: Client, tmp_path: Path,
                                           caplog: pytest.LogCaptureFixture) -> None:
    client.add_jobs("q", ["a", "b", "c"])
    reader = make_reader(server, tmp_path / "s", logLevel="info")
    with caplog.at_level("INFO", logger="spark_connector"):
        end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
        reader.commit(end)
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("spark_connector")]
    assert "batch 1: staged 3 jobs (0 delivered before) from q; 0 still queued" in messages
    assert "batch 1: acknowledged 3 jobs" in messages
    reader.stop()


def test_ack_failure_keeps_the_batch_staged_and_retries(server_factory, tmp_path: Path) -> None:
    node = server_factory("--appendonly", "yes", "--appendfsync", "always")
    client = Client(f"127.0.0.1:{node.port}")
    client.add_jobs("q", ["a", "b"])
    reader = make_reader(node, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    node.kill()
    reader.commit(end)  # the node is down: no exception, nothing forgotten
    assert StagingArea(tmp_path / "s").batches() == [1]
    node.start(port=node.port)
    reader.commit(end)
    assert StagingArea(tmp_path / "s").batches() == []
    assert registered(client) == 0
    reader.stop()


def test_quick_batches_cost_no_heartbeat(server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", ["a", "b"], retry=120)
    reader = make_reader(server, tmp_path / "s", minJobRetry="60s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    reader.commit(end)  # acknowledged long before the first heartbeat (30 s) is due
    assert reader.driver.keeper.heartbeats_sent == 0 and registered(client) == 0
    reader.stop()


# ---------------------------------------------------------------- fetchAhead

def ahead_reader(server, staging: Path, **options: str) -> DisqueStreamReader:
    # minJobRetry 60 s: a batch staged ahead is acknowledged long before its
    # first heartbeat would be due, so the reader stages ahead.
    return make_reader(server, staging, fetchAhead="true", minJobRetry="60s", **options)


def test_fetch_ahead_stages_the_next_batch_and_acks_in_the_background(
        server, client: Client, tmp_path: Path) -> None:
    ids = client.add_jobs("q", [f"b{i}" for i in range(35)])
    reader = ahead_reader(server, tmp_path / "s")
    staging = StagingArea(tmp_path / "s")
    assert reader.latestOffset({"batch": 0}, ReadMaxRows(10))["batch"] == 1
    assert [r["id"] for r in rows(reader, 0, 1)] == ids[:10]
    assert reader.latestOffset({"batch": 1}, ReadMaxRows(10))["batch"] == 2
    # Batch 2 was full: batch 3 is fetched, staged and leased meanwhile, and
    # batch 1 (committed) is acknowledged; batch 2 is not (Spark runs it).
    wait_for(lambda: staging.batches() == [2, 3] and registered(client) == 25, timeout=10)
    assert reader.driver.keeper.held() == {2: 10, 3: 10}
    assert client.qlen("q") == 5
    assert [r["id"] for r in rows(reader, 1, 2)] == ids[10:20]
    assert reader.latestOffset({"batch": 2}, ReadMaxRows(10))["batch"] == 3
    assert [r["id"] for r in rows(reader, 2, 3)] == ids[20:30]
    # Batch 3 was full too: batch 4 is staged ahead with what is left (5).
    assert reader.latestOffset({"batch": 3}, ReadMaxRows(10))["batch"] == 4
    assert [r["id"] for r in rows(reader, 3, 4)] == ids[30:]
    # Not full: nothing is fetched ahead, and the last call waits for the ACKs.
    assert reader.latestOffset({"batch": 4}, ReadMaxRows(10))["batch"] == 4
    assert registered(client) == 0 and staging.batches() == []
    assert reader.reportLatestOffset()["jobsAcked"] == 35
    reader.stop()


def test_a_batch_staged_ahead_survives_a_crash_and_is_reused(
        server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", [f"b{i}" for i in range(40)])
    first = ahead_reader(server, tmp_path / "s")
    end = first.latestOffset({"batch": 0}, ReadMaxRows(10))
    end = first.latestOffset(end, ReadMaxRows(10))
    wait_for(lambda: StagingArea(tmp_path / "s").batches() == [2, 3], timeout=10)
    staged = rows(first, 2, 3)
    first.driver.keeper.stop()  # crash: Spark never saw batch 3
    second = ahead_reader(server, tmp_path / "s")
    assert second.latestOffset(end, ReadMaxRows(10))["batch"] == 3
    assert rows(second, 2, 3) == staged
    assert client.qlen("q") == 10  # nothing more was fetched for batch 3
    second.stop()


def test_fetch_ahead_waits_when_a_batch_outlives_half_its_lease(
        server, client: Client, tmp_path: Path) -> None:
    # RETRY 2: the node says the jobs are due in ~2 s, so the first heartbeat
    # goes out ~0.5 s after the fetch (less the 1 s other copies may be early).
    client.add_jobs("q", [f"b{i}" for i in range(30)], retry=2)
    reader = make_reader(server, tmp_path / "s", fetchAhead="true")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    reader.driver.ahead._last_trigger_at -= 1.0  # a trigger that took 1 s
    end = reader.latestOffset(end, ReadMaxRows(10))
    assert end["batch"] == 2
    reader.driver.ahead.wait()
    assert StagingArea(tmp_path / "s").batches() == [2]  # not staged ahead
    assert client.qlen("q") == 10 and registered(client) == 20  # batch 1 acknowledged
    reader.stop()


def test_available_now_with_fetch_ahead_reads_what_was_queued_and_acks_it_all(
        server, client: Client, tmp_path: Path) -> None:
    ids = client.add_jobs("q", [f"{i}" for i in range(23)])
    reader = ahead_reader(server, tmp_path / "s")
    reader.prepareForTriggerAvailableNow()
    client.add_jobs("q", [f"late{i}" for i in range(4)])
    offset, seen = {"batch": 0}, []
    while True:
        end = reader.latestOffset(offset, ReadMaxRows(5))
        if end == offset:
            break
        seen += [r["id"] for r in rows(reader, offset["batch"], end["batch"])]
        reader.commit(end)
        offset = end
    assert seen == ids  # in order, each once, and none of the late ones
    assert client.qlen("q") == 4 and registered(client) == 4
    assert StagingArea(tmp_path / "s").batches() == []
    metrics = reader.reportLatestOffset()
    assert (metrics["jobsFetched"], metrics["jobsAcked"], metrics["jobsLeased"]) == (23, 23, 0)
    reader.stop()


# ------------------------------------------------------- leases from the node

def test_the_first_heartbeat_waits_for_the_nodes_lease(server, client: Client,
                                                       tmp_path: Path) -> None:
    # Default minJobRetry (1 s) would heartbeat after 0.5 s; the node says
    # the jobs are due again in ~120 s, so the first WORKING waits ~60 s.
    client.add_jobs("q", ["a", "b"], retry=120)
    reader = make_reader(server, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert 55 < reader.driver.keeper.next_heartbeat_in(1) <= 60
    assert not reader.driver._no_lease
    reader.commit(end)
    assert reader.driver.keeper.heartbeats_sent == 0
    reader.stop()


def test_a_job_that_waited_in_its_queue_is_heartbeat_sooner(server, client: Client,
                                                            tmp_path: Path) -> None:
    # Delivery does not restart the RETRY count: a job queued 1.5 s ago with
    # RETRY 3 is due again within ~1.5 s, less the 1 s other copies may be early.
    job_id = client.add_job("q", "waited", retry=3)
    client.add_job("q", "fresh", retry=300)
    wait_for(lambda: client.show(job_id)["next-requeue-within"] < 1_500, 5,
             message="the job to wait 1.5 s in its queue")
    reader = make_reader(server, tmp_path / "s")
    reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    keeper = reader.driver.keeper
    assert keeper.next_heartbeat_in(1) <= 0.25
    # Kept leased past the RETRY the job had left when it was delivered.
    wait_for(lambda: keeper.heartbeats_sent >= 8, timeout=15)  # 4 WORKINGS of 2 IDs
    assert client.show(job_id)["state"] == "active" and client.qlen("q") == 0
    assert keeper.leases_lost == 0
    reader.stop()


def test_retry_zero_batches_need_no_heartbeat(server, client: Client, tmp_path: Path) -> None:
    client.add_jobs("q", ["a", "b"], retry=0, replicate=1)
    reader = make_reader(server, tmp_path / "s")
    reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert reader.driver.keeper.next_heartbeat_in(1) == float("inf")
    reader.stop()


def test_an_original_node_is_leased_by_min_job_retry(original, tmp_path: Path) -> None:
    with Client(f"127.0.0.1:{original.port}") as client:
        ids = client.add_jobs("q", ["a", "b", "c"], retry=120)
        reader = make_reader(original, tmp_path / "s", minJobRetry="4s")
        end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
        # GETJOB ... WITHLEASE was refused once; the same jobs came without it.
        assert reader.driver._no_lease == {f"127.0.0.1:{original.port}"}
        assert [r["id"] for r in rows(reader, 0, 1)] == ids
        assert 1 < reader.driver.keeper.next_heartbeat_in(1) <= 2  # minJobRetry / 2
        reader.commit(end)
        assert reader.latestOffset(end, ReadMaxRows(10)) == end
        reader.stop()


def test_executor_parts_from_an_original_node_are_heartbeat_at_once(
        original, tmp_path: Path) -> None:
    with Client(f"127.0.0.1:{original.port}") as client:
        client.add_jobs("q", ["a", "b", "c"], retry=120)
        reader = make_reader(original, tmp_path / "s", fetchMode="executor")
        end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
        (part,) = reader.partitions({"batch": 0}, end)
        assert len(fetch_or_replay(part)) == 3
        keeper = reader.driver.keeper
        wait_for(lambda: keeper.heartbeats_sent == 3, timeout=10,
                 message="the part's jobs heartbeat once discovered")
        reader.stop()


def test_fetch_ahead_goes_by_the_nodes_lease_without_min_job_retry(
        server, client: Client, tmp_path: Path) -> None:
    # Default minJobRetry (1 s) would forbid staging ahead after a 1 s trigger;
    # the node says these jobs (RETRY 300) are due in ~300 s, so it stages ahead.
    client.add_jobs("q", [f"b{i}" for i in range(30)])
    reader = make_reader(server, tmp_path / "s", fetchAhead="true")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    reader.driver.ahead._last_trigger_at -= 1.0  # a trigger that took 1 s
    assert reader.latestOffset(end, ReadMaxRows(10))["batch"] == 2
    wait_for(lambda: StagingArea(tmp_path / "s").batches() == [2, 3], timeout=10)
    assert client.qlen("q") == 0
    reader.stop()


def test_fetch_ahead_stages_from_the_first_trigger_when_the_lease_is_long(
        server, client: Client, tmp_path: Path) -> None:
    # No trigger measured yet (a 2-batch availableNow run never has one):
    # RETRY 300 leaves room for any plausible trigger, so batch 2 is staged
    # while Spark would run batch 1.
    ids = client.add_jobs("q", [f"b{i}" for i in range(20)], retry=300)
    reader = make_reader(server, tmp_path / "s", fetchAhead="true")
    try:
        assert reader.latestOffset({"batch": 0}, ReadMaxRows(10))["batch"] == 1
        wait_for(lambda: StagingArea(tmp_path / "s").batches() == [1, 2], timeout=10)
        assert client.qlen("q") == 0
        # No WORKING round over batch 1 before fetching ahead: its first
        # heartbeat is ~150 s away, and batch 2 leaves its jobs out anyway.
        assert reader.driver.keeper.heartbeats_sent == 0
        assert reader.latestOffset({"batch": 1}, ReadMaxRows(10))["batch"] == 2
        assert [r["id"] for r in rows(reader, 1, 2)] == ids[10:]
    finally:
        reader.stop()


def test_fetch_ahead_waits_for_a_measured_trigger_when_the_lease_is_short(
        server, client: Client, tmp_path: Path) -> None:
    # RETRY 5: the node says ~5 s (less 1 s of skew), half of it 2 s; a
    # first trigger is taken to last at least 1 s, and 2.5 of those do not fit.
    client.add_jobs("q", [f"b{i}" for i in range(20)], retry=5)
    reader = make_reader(server, tmp_path / "s", fetchAhead="true")
    try:
        assert reader.latestOffset({"batch": 0}, ReadMaxRows(10))["batch"] == 1
        reader.driver.ahead.wait()
        assert StagingArea(tmp_path / "s").batches() == [1]
        assert client.qlen("q") == 10
    finally:
        reader.stop()


class _WaitsForRequeue(Client):
    """A client that, after its first GETJOB, waits until the node has
    queued again the job it delivered (its RETRY ran out): the next GETJOB
    of the same fetch then delivers that job a second time."""

    def execute_command(self, *args):
        reply = super().execute_command(*args)
        if args[0] == "GETJOB" and not getattr(self, "waited", False):
            self.waited = True
            wait_for(lambda: self.qlen("dup") == 2, timeout=10,
                     message="the node to queue the delivered job again")
        return reply


def test_a_job_delivered_twice_in_one_fetch_is_one_row(server, client: Client) -> None:
    first, second = (client.add_job("dup", body, retry=1) for body in ("a", "b"))
    with _WaitsForRequeue(f"127.0.0.1:{server.port}") as slow:
        fetched = fetch_jobs(slow, ["dup"], 2, batch_size=1, lease=True)
    # Rounds: a, a again (left out), b: the limit counts distinct jobs.
    assert fetched.table.column("id").to_pylist() == [first, second]


def test_a_job_of_a_running_batch_is_not_staged_again(server, client: Client,
                                                      tmp_path: Path) -> None:
    ids = [client.add_job("q", f"j{i}", retry=1) for i in range(3)]
    reader = make_reader(server, tmp_path / "staging", fetchAhead="true")
    try:
        reader.latestOffset({"batch": 0}, ReadMaxRows(2))
        # The node queues the batch's jobs again (no heartbeat yet): what a
        # batch staged ahead of this one would fetch.
        client.enqueue(*ids[:2])
        seen = reader.driver._held_ids()
        assert seen == {i.encode() for i in ids[:2]}
        fetched = fetch_jobs(client, ["q"], None, batch_size=10, seen=seen)
        assert fetched.table.column("id").to_pylist() == [ids[2]]
    finally:
        reader.stop()


def test_driver_mode_tasks_carry_compressed_slices_of_bounded_size(
        server, client: Client, tmp_path: Path) -> None:
    # 3 MB of bodies that do not compress: more than one task must carry them.
    import os

    from spark_connector.partitions import MAX_PAYLOAD_BYTES

    bodies = [os.urandom(3000) for _ in range(1000)]
    client.add_jobs("q", bodies)
    reader = make_reader(server, tmp_path / "staging")
    try:
        reader.latestOffset({"batch": 0}, ReadMaxRows(5000))
        parts = reader.partitions({"batch": 0}, {"batch": 1})
        assert len(parts) > 3
        assert all(len(p.arrow_ipc) <= MAX_PAYLOAD_BYTES for p in parts)
        assert [r["body"] for r in rows(reader, 0, 1)] == bodies
    finally:
        reader.stop()
