"""The sink with idempotent ADDJOB (IDMP): retried and speculative tasks add each row once."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter

import pyarrow as pa
import pytest
from pyspark.sql.types import StringType, StructField, StructType

from disque.client import Client
from spark_connector.options import OptionError
from spark_connector.writer import DisqueWriteError, PartitionWriter, split_key
from tests.spark.sink_support import config_for
from tests.support.cluster import ReferenceProcess, reference_server
from tests.support.process import wait_for

KEYED = StructType([StructField("body", StringType()), StructField("_disque_key", StringType())])
SINK_CLIENT = re.compile(r"name=spark-disque-sink-p(\d+)-(\d+) ")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def batches(rows: int, size: int = 50) -> list[pa.RecordBatch]:
    return [pa.record_batch({"body": pa.array([f"row-{i}" for i in range(s, min(s + size, rows))])})
            for s in range(0, rows, size)]


def keys_in(client: Client, queue: str) -> Counter[str]:
    seen: Counter[str] = Counter()
    while jobs := client.get_jobs(queue, count=1000, nohang=True):
        seen.update(split_key(job.body)[0] for job in jobs)
        client.ack(*(job.id for job in jobs))
    return seen


def idmp_hits(client: Client) -> int:
    return int(client.info("extensions")["extensions"]["idmp_hits"])


# --------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------

@pytest.mark.parametrize(("options", "option", "text"), [
    ({"idmp": "maybe"}, "idmp", "must be one of auto, true, false"),
    ({"idmp": "true"}, "idmp", "no dedup key"),
    ({"dedupKey": "true", "idmpWindow": "500ms"}, "idmpWindow", "at least 1000 ms"),
    ({"dedupKey": "true", "idmpWindow": "2d"}, "idmpWindow", "must be a duration"),
    ({"dedupKey": "true", "idmpWindow": "25h"}, "idmpWindow", "at most 86400 s"),
])
def test_bad_idmp_options(options: dict, option: str, text: str) -> None:
    with pytest.raises(OptionError) as err:
        config_for(1, queue="q", **options)
    assert err.value.option == option and text in str(err.value)


def test_idmp_options_parse() -> None:
    config = config_for(1, queue="q", dedupKey="true", IDMPWINDOW="10m")
    assert (config.idmp, config.idmp_window_s) == ("auto", 600)
    assert config_for(1, queue="q").idmp == "auto"  # but no key: nothing to send


# --------------------------------------------------------------------------
# The partition writer as a plain object: a task retry and a speculative twin
# --------------------------------------------------------------------------

def test_rerun_partition_adds_each_row_once(server, disque) -> None:
    config = config_for(server.port, queue="rerun", dedupKey="true", batchSize="40",
                        idmpWindow="1h")
    first = PartitionWriter(config, 0, key_prefix="w/0/0/")
    # The first attempt dies after 3 of its 6 batches ...
    first.write(iter(batches(300)[:3]))
    assert first.idmp_enabled()
    assert disque.qlen("rerun") == 150
    # ... the retry writes the whole partition again with the same keys.
    message = PartitionWriter(config, 0, attempt=1, key_prefix="w/0/0/").write(iter(batches(300)))
    assert message.jobs == 300  # each ADDJOB answered with an ID (150 of them the first's)
    assert idmp_hits(disque) == 150
    seen = keys_in(disque, "rerun")
    assert len(seen) == 300 and set(seen.values()) == {1}


def test_speculative_twins_add_each_row_once(server, disque) -> None:
    config = config_for(server.port, queue="twins", dedupKey="true", batchSize="25")
    errors: list[BaseException] = []

    def attempt(number: int) -> None:
        try:
            PartitionWriter(config, 1, attempt=number, key_prefix="w/0/1/").write(
                iter(batches(1000)))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    seen = keys_in(disque, "twins")
    assert len(seen) == 1000 and set(seen.values()) == {1}
    assert idmp_hits(disque) == 1000


def test_key_column_reused_with_another_body_fails_the_task(server, disque) -> None:
    config = config_for(server.port, KEYED, queue="orders")
    batch = pa.record_batch({"body": pa.array(["a", "b"]),
                             "_disque_key": pa.array(["order-1", "order-1"])})
    with pytest.raises(DisqueWriteError) as err:
        PartitionWriter(config, 0).write(iter([batch]))
    assert "IDMPCONFLICT" in str(err.value) and "1 jobs of this partition" in str(err.value)
    long_key = pa.record_batch({"body": pa.array(["a"]), "_disque_key": pa.array(["k" * 257])})
    with pytest.raises(ValueError, match="longer than 256 bytes"):
        PartitionWriter(config, 0).write(iter([long_key]))
    assert [split_key(b) for b in [j.body for j in disque.get_jobs("orders", count=10,
                                                                    nohang=True)]] == [
        ("order-1", b"a")]


def test_idmp_false_sends_keys_in_bodies_only(server, disque) -> None:
    config = config_for(server.port, queue="plain", dedupKey="true", idmp="false")
    PartitionWriter(config, 0, key_prefix="w/0/0/").write(iter(batches(20)))
    PartitionWriter(config, 0, key_prefix="w/0/0/").write(iter(batches(20)))
    seen = keys_in(disque, "plain")
    assert len(seen) == 20 and set(seen.values()) == {2}  # at-least-once: consumers dedup


def test_original_node_falls_back_and_idmp_true_fails(tmp_path) -> None:
    binary = reference_server()
    if binary is None:
        pytest.skip("the original disque-server is not available (DISQUE_REFERENCE_SERVER)")
    node = ReferenceProcess(tmp_path / "ref").start()
    try:
        with Client(f"127.0.0.1:{node.port}") as client:
            auto = config_for(node.port, queue="ref", dedupKey="true")
            writer = PartitionWriter(auto, 0, key_prefix="w/0/0/")
            writer.write(iter(batches(10)))
            assert writer.idmp_enabled() is False
            assert len(keys_in(client, "ref")) == 10
            forced = config_for(node.port, queue="ref", dedupKey="true", idmp="true")
            with pytest.raises(DisqueWriteError, match="syntax error"):
                PartitionWriter(forced, 0, key_prefix="w/0/0/").write(iter(batches(10)))
            assert client.qlen("ref") == 0
    finally:
        node.kill()


# --------------------------------------------------------------------------
# Through Spark: executor tasks killed mid-partition
# --------------------------------------------------------------------------

def test_killed_tasks_are_retried_and_each_row_is_added_once(server, disque) -> None:
    """SIGKILL the Python worker writing a partition, twice, while it writes:
    Spark re-runs the task (local[2,4]) from the partition's first row and
    IDMP turns the rows already added into the first jobs' IDs."""
    rows = 20_000
    app = subprocess.Popen(
        [sys.executable, "-m", "tests.spark.sink_kill_app", str(server.port), "killed",
         str(rows), "--batch-size", "50",
         # SINK_KILL_TEST_IDMP=false shows what the test catches without IDMP.
         "--idmp", os.environ.get("SINK_KILL_TEST_IDMP", "auto")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    admin = server.client()
    killed: list[tuple[int, int, int]] = []
    try:
        for threshold in (rows // 8, rows // 2):
            def writer_running(at: int = threshold) -> list[tuple[str, str]] | None:
                if disque.qlen("killed") < at:
                    return None
                return SINK_CLIENT.findall(admin.execute_command("CLIENT", "LIST").decode())

            found = wait_for(lambda: writer_running() or app.poll() is not None, 240,
                             interval=0.005, message="the sink to write")
            if app.poll() is not None:
                break
            partition, pid = (int(x) for x in found[0])
            os.kill(pid, signal.SIGKILL)
            killed.append((partition, pid, disque.qlen("killed")))
        out, err = app.communicate(timeout=300)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait()
    assert app.returncode == 0 and "written" in out, err[-3000:]
    print(f"killed (partition, pid, jobs queued then): {killed}")
    assert killed, "the write finished before any writer could be killed"
    # Jobs were queued when each kill landed: the retries re-sent them.
    assert all(0 < queued < rows for _, _, queued in killed)
    hits = idmp_hits(disque)
    seen = keys_in(disque, "killed")
    assert len(seen) == rows, f"{rows - len(seen)} rows missing"
    twice = sum(1 for count in seen.values() if count > 1)
    assert twice == 0, f"{twice} rows added more than once"
    assert hits > 0  # the retries did re-send rows: the index answered them


def test_resubmitted_batch_write_adds_nothing_within_the_window(spark, server, disque) -> None:
    df = spark.range(0, 30, numPartitions=2).selectExpr("cast(id as string) as body")
    for _ in range(2):  # the same save() submitted twice (same writeId)
        (df.write.format("disque").mode("append").option("nodes", f"127.0.0.1:{server.port}")
         .option("queue", "resubmit").option("dedupKey", "true")
         .option("writeId", "nightly-2").save())
    seen = keys_in(disque, "resubmit")
    assert len(seen) == 30 and set(seen.values()) == {1}
    assert idmp_hits(disque) == 30
