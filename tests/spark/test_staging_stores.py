"""Staging on the storage Spark clusters use: S3 (a real moto_server), local paths, errors.

The stream reader is driven as Spark's driver drives it (plain objects, no
JVM), with ``stagingPath`` on S3: a driver restarted elsewhere (another
working directory, no local files) replays the uncommitted batch identically
and acknowledges the committed one; executor fetch mode's first-writer-wins
is S3's conditional create.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from disque.client import Client
from spark_connector import executor_read, stores
from spark_connector.executor_read import fetch_or_replay, publish_fetched
from spark_connector.fetch import fetch_table
from spark_connector.options import OptionError, SourceConfig
from spark_connector.staging import StagingArea, table_buffer
from spark_connector.stores import ArrowStore, LocalStore, open_store
from spark_connector.stream_reader import DisqueStreamReader
from tests.spark.test_source_reader import make_reader, registered


@pytest.fixture
def client(disque: Client) -> Client:
    return disque  # the conftest's client of the ``server`` node


def ids_of(reader: DisqueStreamReader, start: int, end: int) -> list[str]:
    out: list[str] = []
    for part in reader.partitions({"batch": start}, {"batch": end}):
        for batch in reader.read(part):
            out += batch.column("id").to_pylist()
    return out


@pytest.mark.parametrize("scheme", ["s3", "s3a"])
def test_a_driver_restarted_elsewhere_replays_and_acknowledges_from_s3(
        server, client: Client, s3, tmp_path: Path, monkeypatch, scheme: str) -> None:
    ids = [client.add_job("q", f"j{i}") for i in range(30)]
    uri = f"{scheme}://{s3.bucket_name}/queries/q1"
    monkeypatch.chdir(tmp_path.joinpath("host-a").mkdir() or tmp_path / "host-a")
    first = make_reader(server, uri)
    end = first.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert (end["batch"], end["jobs"]) == (1, 10)
    staged = ids_of(first, 0, 1)
    assert staged == ids[:10]
    assert "queries/q1/batch-000000000001/plan.json" in s3.keys(s3.bucket_name)
    first.driver.keeper.stop()  # SIGKILL: no ACK, no clean stop, nothing local survives

    # Another host: another working directory, nothing of host A's.
    monkeypatch.chdir(tmp_path.joinpath("host-b").mkdir() or tmp_path / "host-b")
    second = make_reader(server, uri)
    try:
        # Killed during the batch: Spark replays it; the rows are identical.
        assert ids_of(second, 0, 1) == staged
        # Killed after Spark committed it: the next trigger acknowledges it.
        nxt = second.latestOffset(end, ReadMaxRows(10))
        assert nxt["batch"] == 2 and registered(client) == 20
        assert ids_of(second, 1, 2) == ids[10:20]
        assert s3.keys(s3.bucket_name, "queries/q1/acked.json")
    finally:
        second.stop()


def test_executor_mode_first_writer_wins_on_s3(server, client: Client, s3) -> None:
    ids = [client.add_job("q", f"e{i}") for i in range(6)]
    reader = make_reader(server, f"s3://{s3.bucket_name}/exec", fetchMode="executor")
    try:
        reader.latestOffset({"batch": 0}, ReadMaxRows(3))
        (part,) = reader.partitions({"batch": 0}, {"batch": 1})
        won = fetch_or_replay(part)  # the first attempt fetches and publishes
        assert won.column("id").to_pylist() == ids[:3]
        # A second attempt (speculative, or retried) fetched other jobs: its
        # conditional create is refused (412), it gives its jobs back and
        # returns the winner's rows.
        loser = fetch_table(client, ["q"], 3, batch_size=3)
        again = publish_fetched(part, client, loser)
        assert again.column("id").to_pylist() == ids[:3]
        assert client.qlen("q") == 3  # the loser's three jobs, queued again
        assert fetch_or_replay(part).column("id").to_pylist() == ids[:3]  # a replay
    finally:
        reader.stop()


def test_batches_are_compressed_on_object_stores_not_on_local_disks(
        server, client: Client, s3, tmp_path: Path) -> None:
    """An 18 MB PUT per 100k-job batch is what staging on S3 costs: there the
    batch is zstd-compressed; a local disk gets it as it is (it writes at
    memory speed). Both read back the same rows."""
    client.add_jobs("z", [b'{"order": %d, "status": "paid", "note": "' % i + b"x" * 200 + b'"}'
                          for i in range(500)])
    table = fetch_table(client, ["z"], None, batch_size=100)
    assert table.num_rows == 500
    plain = len(table_buffer(table))
    remote = StagingArea.open(f"s3://{s3.bucket_name}/zq", {})
    local = StagingArea.open(str(tmp_path / "zq"), {})
    for area in (remote, local):
        area.ensure()
        area.stage_driver_batch(1, table)
        assert area.read_batch(1).equals(table)
    stored = remote.store.read("batch-000000000001/part-00000.arrow")
    assert stored is not None and len(stored) < plain / 3, (len(stored), plain)
    assert (tmp_path / "zq" / "batch-000000000001" / "part-00000.arrow").stat().st_size == plain
    client.ack_many(table.column("id").to_pylist())


def test_staging_paths_and_uris_resolve_to_their_stores(s3, tmp_path: Path,
                                                        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = SourceConfig.from_options({"queues": "q", "stagingPath": "rel/staging"},
                                       streaming=True)
    assert config.staging_path == str(tmp_path / "rel" / "staging")  # absolute, on the driver
    assert isinstance(open_store(f"file://{tmp_path}/x"), LocalStore)
    store = open_store(f"s3a://{s3.bucket_name}/p")
    assert isinstance(store, ArrowStore) and store.exclusive
    assert store.create("k", b"1") and not store.create("k", b"2")
    assert store.read("k") == b"1"
    # staging.<argument> options reach the filesystem (here: the endpoint).
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    config = SourceConfig.from_options(
        {"queues": "q", "stagingPath": f"s3://{s3.bucket_name}/o",
         "staging.endpoint_override": s3.endpoint}, streaming=True)
    staging = StagingArea.open(config.staging_path, dict(config.staging_options))
    staging.ensure()


def test_bad_staging_fails_before_the_first_batch(server, s3, unused_port: int,
                                                  monkeypatch) -> None:
    with pytest.raises(OptionError, match=r"option 'stagingPath' .*scheme 'nosuch'"):
        make_reader(server, "nosuch://bucket/x").latestOffset({"batch": 0}, ReadMaxRows(1))
    with pytest.raises(OptionError, match="option 'stagingPath' s3://missing-bucket/x "
                                          "cannot be written"):
        make_reader(server, "s3://missing-bucket/x").latestOffset({"batch": 0},
                                                                  ReadMaxRows(1))
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{unused_port}")
    with pytest.raises(OptionError, match="cannot be written"):
        make_reader(server, f"s3://{s3.bucket_name}/x").latestOffset({"batch": 0},
                                                                     ReadMaxRows(1))


def test_lost_staging_fails_clearly_or_refetches(server, client: Client, tmp_path: Path,
                                                 caplog) -> None:
    ids = [client.add_job("q", f"l{i}", retry=1) for i in range(8)]
    staging = tmp_path / "s"
    first = make_reader(server, str(staging))
    end = first.latestOffset({"batch": 0}, ReadMaxRows(5))
    first.stop()
    import shutil

    shutil.rmtree(staging)  # staging lost (or stagingPath changed) mid-batch
    with pytest.raises(RuntimeError, match="batch 1 is in Spark's offset log but not staged"
                                           r".*onLostStaging=refetch.*its 5 jobs"):
        make_reader(server, str(staging)).partitions({"batch": 0}, end)
    again = make_reader(server, str(staging), onLostStaging="refetch", logLevel="info")
    try:
        with caplog.at_level(logging.WARNING, logger="spark_connector"):
            got = ids_of_range(again, {"batch": 0}, end)
        assert "staging a new batch 1 in its place" in caplog.text
        assert "its 5 jobs are delivered again" in caplog.text
        # The three still queued; the lost five come back after their RETRY.
        assert set(got) <= set(ids) and set(ids[5:]) <= set(got)
    finally:
        again.stop()


def ids_of_range(reader: DisqueStreamReader, start: dict, end: dict) -> list[str]:
    out: list[str] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            out += batch.column("id").to_pylist()
    return out


def test_a_committed_batch_whose_staging_is_lost_is_reported(server, client: Client,
                                                              tmp_path: Path, caplog) -> None:
    for i in range(4):
        client.add_job("q", f"c{i}")
    reader = make_reader(server, str(tmp_path / "elsewhere"))
    try:
        with caplog.at_level(logging.WARNING, logger="spark_connector"):
            reader.latestOffset({"batch": 7, "jobs": 1000}, ReadMaxRows(10))
        assert ("batch 7 was committed by Spark but is not staged under "
                f"{tmp_path / 'elsewhere'}") in caplog.text
        assert "its 1000 jobs cannot be acknowledged" in caplog.text
    finally:
        reader.stop()
    # Acknowledged batches are not reported: acked.json names the last one.
    caplog.clear()
    second = make_reader(server, str(tmp_path / "elsewhere"))
    try:
        with caplog.at_level(logging.WARNING, logger="spark_connector"):
            second.latestOffset({"batch": 8, "jobs": 4}, ReadMaxRows(10))
        assert "was committed by Spark" not in caplog.text
    finally:
        second.stop()
    assert os.path.exists(tmp_path / "elsewhere" / "acked.json")


# --------------------------------------------------------------------------
# A store that cannot be used: found before any job is taken
# --------------------------------------------------------------------------

def untouched(client: Client, queue: str, count: int) -> bool:
    """All ``count`` jobs still queued: none was taken (leased) by the source."""
    return client.qlen(queue) == count and registered(client) == count


@pytest.mark.parametrize("fetch_mode", ["driver", "executor"])
def test_an_unusable_store_fails_the_query_before_any_job_is_taken(
        server, client: Client, s3, unused_port: int, monkeypatch, fetch_mode: str) -> None:
    client.add_jobs("q", [b"%d" % i for i in range(5)])

    def first_batch(uri: str) -> None:
        make_reader(server, uri, fetchMode=fetch_mode).latestOffset({"batch": 0},
                                                                   ReadMaxRows(10))

    with pytest.raises(OptionError, match=r"scheme 'nosuch'"):
        first_batch("nosuch://bucket/x")
    with pytest.raises(OptionError, match=r"s3://missing-bucket/x .*the bucket does not exist"):
        first_batch("s3://missing-bucket/x")
    with monkeypatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{unused_port}")
        with pytest.raises(OptionError, match="the endpoint cannot be reached"):
            first_batch(f"s3://{s3.bucket_name}/x")
    assert untouched(client, "q", 5)


def test_executor_mode_names_a_missing_boto3_or_credentials_on_the_driver(
        server, client: Client, s3, tmp_path: Path, monkeypatch) -> None:
    client.add_jobs("q", [b"%d" % i for i in range(5)])
    uri = f"s3://{s3.bucket_name}/x"
    with monkeypatch.context() as env:
        env.setitem(sys.modules, "boto3", None)  # not installed: import fails
        with pytest.raises(OptionError, match=r"create \(fetchMode=executor\): boto3 is "
                                              r"missing \(pip install boto3\)"):
            make_reader(server, uri, fetchMode="executor").latestOffset({"batch": 0},
                                                                        ReadMaxRows(10))
    with monkeypatch.context() as env:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            env.delenv(name)
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        env.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        stores._boto3_clients.clear()  # made with the credentials of other tests
        with pytest.raises(OptionError, match="the credentials are missing or refused"):
            make_reader(server, uri, fetchMode="executor").latestOffset({"batch": 0},
                                                                        ReadMaxRows(10))
    stores._boto3_clients.clear()
    assert untouched(client, "q", 5)
    # Driver fetch mode does not use boto3: a driver without it stages on S3.
    with monkeypatch.context() as env:
        env.setitem(sys.modules, "boto3", None)
        reader = make_reader(server, uri)
        try:
            end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
            assert (end["batch"], end["jobs"]) == (1, 5)
        finally:
            reader.stop()


def test_an_executor_without_boto3_fails_its_task_before_its_fetch(
        server, client: Client, s3, monkeypatch) -> None:
    client.add_jobs("q", [b"%d" % i for i in range(6)])
    reader = make_reader(server, f"s3://{s3.bucket_name}/e", fetchMode="executor")
    try:
        reader.latestOffset({"batch": 0}, ReadMaxRows(6))  # the driver has boto3
        (part,) = reader.partitions({"batch": 0}, {"batch": 1})
        with monkeypatch.context() as env:  # the executor's Python has not
            env.setitem(sys.modules, "boto3", None)
            env.setattr(executor_read, "_publishable", set())
            for _attempt in range(4):  # Spark's task attempts on a cluster
                with pytest.raises(RuntimeError, match=r"cannot publish to stagingPath; no job "
                                                       r"was fetched.*boto3 is missing"):
                    fetch_or_replay(part)
        assert untouched(client, "q", 6)
    finally:
        reader.stop()


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: staging that runs out of space (a batch of 80 KB does not fit)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs (a disk that fills up)")
    path = tmp_path / "tiny"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "disque-test-tiny", str(path)],
                   check=True, timeout=30)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


def test_a_task_that_fails_after_its_fetch_gives_its_jobs_back(
        server, client: Client, tiny_disk: Path) -> None:
    ids = client.add_jobs("q", [b"x" * 2000 for _ in range(40)])
    reader = make_reader(server, str(tiny_disk / "staging"), fetchMode="executor")
    try:
        reader.latestOffset({"batch": 0}, ReadMaxRows(40))
        (part,) = reader.partitions({"batch": 0}, {"batch": 1})
        with pytest.raises(OSError):
            fetch_or_replay(part)
        # Queued again (ENQUEUE) before the task raised: not leased until RETRY.
        assert client.qlen("q") == 40
        assert {client.show(i)["state"] for i in ids} == {"queued"}
    finally:
        reader.stop()


def test_a_driver_batch_that_cannot_be_staged_gives_its_jobs_back(
        server, client: Client, tiny_disk: Path) -> None:
    ids = client.add_jobs("q", [b"x" * 2000 for _ in range(40)])
    reader = make_reader(server, str(tiny_disk / "staging"))
    try:
        with pytest.raises(OSError):  # 80 KB of bodies on a 64 KiB disk
            reader.latestOffset({"batch": 0}, ReadMaxRows(40))
        assert client.qlen("q") == 40
        assert {client.show(i)["state"] for i in ids} == {"queued"}
    finally:
        reader.stop()
