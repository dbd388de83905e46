"""The source's ``includeGroups`` columns (``group``, ``group_position``),
against real nodes.

The reader runs as a plain object first (what Spark's driver and executors
call, as tests/spark/test_headers_source.py does), then through the shared
local Spark session.  Each row carries its job's group key (null without
one) and its position, the job's ctime as the node orders the group by; a
micro-batch holds consecutive jobs of a group, the next ones come only in a
batch after it is acknowledged; a replayed batch gives the same columns; a
batch read peeks or drains them too.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from disque.client import Client
from spark_connector.batch_reader import DisqueBatchReader
from spark_connector.executor_read import fetch_or_replay
from spark_connector.fetch import supports_groups
from spark_connector.options import SourceConfig
from spark_connector.partitions import FetchPartition
from spark_connector.schema import GROUP, GROUP_POSITION, arrow_schema, source_schema
from spark_connector.staging import StagingArea
from spark_connector.stream_reader import DisqueStreamReader


@pytest.fixture
def client(server) -> Client:
    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


def make_reader(port: int, staging: Path, **options: str) -> DisqueStreamReader:
    opts = {"nodes": f"127.0.0.1:{port}", "queues": "q", "stagingPath": str(staging),
            "fetchTimeoutMs": "0", "fetchAhead": "false", "includeGroups": "true", **options}
    config = SourceConfig.from_options(opts, streaming=True)
    return DisqueStreamReader(config, source_schema(config.body_format, config.include_headers,
                                                    config.include_groups))


def rows(reader: DisqueStreamReader, start: int, end: int) -> list[dict]:
    out: list[dict] = []
    for part in reader.partitions({"batch": start}, {"batch": end}):
        for batch in reader.read(pickle.loads(pickle.dumps(part))):
            out.extend(batch.to_pylist())
    return out


def ctime(client: Client, job_id: str) -> int:
    shown = client.show(job_id)
    assert shown is not None
    return int(shown["ctime"])


def test_the_columns_are_nullable_string_and_long() -> None:
    schema = arrow_schema(source_schema("binary", include_groups=True))
    assert schema.field(GROUP).type == pa.string() and schema.field(GROUP).nullable
    assert schema.field(GROUP_POSITION).type == pa.int64()
    assert schema.field(GROUP_POSITION).nullable
    assert source_schema("binary", True, True).simpleString().endswith(
        "headers:array<struct<key:string,value:binary>>,group:string,group_position:bigint>")
    assert GROUP not in source_schema().fieldNames()


def test_rows_carry_the_group_and_its_position(server, client: Client,
                                               tmp_path: Path) -> None:
    a0 = client.add_job("q", b"a0", group="A")
    plain = client.add_job("q", b"plain")
    b0 = client.add_job("q", b"b0", group="B")
    a1 = client.add_job("q", b"a1", group="A")
    reader = make_reader(server.port, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    got = {row["id"]: row for row in rows(reader, 0, end["batch"])}
    assert set(got) == {a0, plain, b0, a1}
    assert [(got[i]["group"], got[i]["group_position"]) for i in (a0, b0, a1)] == [
        ("A", ctime(client, a0)), ("B", ctime(client, b0)), ("A", ctime(client, a1))]
    assert got[a0]["group_position"] < got[a1]["group_position"]
    assert got[plain]["group"] is None and got[plain]["group_position"] is None
    reader.stop()


def test_a_batch_holds_consecutive_jobs_and_the_next_ones_wait_for_its_ack(
        server, client: Client, tmp_path: Path) -> None:
    """GETJOB COUNT gives a group's consecutive jobs; the group stays held
    by the staged batch, so nothing later of it goes out (to this source's
    next batch or to anyone) until Spark commits the batch and the source
    acknowledges it."""
    ids = [client.add_job("q", f"a{i}", group="A", retry=60) for i in range(6)]
    reader = make_reader(server.port, tmp_path / "s", fetchBatchSize="2")
    # The first GETJOB (COUNT 2) takes a0 and a1; the second finds the
    # group held by them: the batch ends there, short of its limit.
    first = reader.latestOffset({"batch": 0}, ReadMaxRows(3))
    assert [r["id"] for r in rows(reader, 0, first["batch"])] == ids[:2]
    # Held: another consumer gets nothing of the group meanwhile.
    assert client.get_jobs("q", count=10, nohang=True) == []
    second = reader.latestOffset(first, ReadMaxRows(3))  # acknowledges batch 1 first
    batch2 = rows(reader, first["batch"], second["batch"])
    assert [r["id"] for r in batch2] == ids[2:4]
    assert [r["group_position"] for r in batch2] == [ctime(client, i) for i in ids[2:4]]
    reader.stop()


def test_a_replay_after_a_restart_gives_identical_rows_with_groups(
        server, client: Client, tmp_path: Path) -> None:
    plain = set()
    for i in range(30):
        job_id = client.add_job("q", f"b{i}", group=f"g{i % 4}" if i % 5 else None)
        if i % 5 == 0:
            plain.add(job_id)
    first = make_reader(server.port, tmp_path / "s")
    end = first.latestOffset({"batch": 0}, ReadMaxRows(20))
    before = rows(first, 0, end["batch"])
    first.driver.keeper.stop()  # "crash": no stop(), no ACK
    second = make_reader(server.port, tmp_path / "s")
    after = rows(second, 0, end["batch"])
    assert after == before
    assert {r["id"] for r in after if r["group"] is None} == plain & {r["id"] for r in after}
    assert 0 < len(plain & {r["id"] for r in after}) < len(after) == 20
    assert all((r["group"] is None) == (r["group_position"] is None) for r in after)
    # The staged file holds them: the replay read them back from staging.
    (table,) = [t for _, t in StagingArea(tmp_path / "s").read_parts(end["batch"])]
    assert table.column_names[-2:] == [GROUP, GROUP_POSITION]
    second.stop()


def test_without_the_option_no_columns_and_no_withgroup(server, client: Client,
                                                        tmp_path: Path, monkeypatch) -> None:
    client.add_job("q", b"x", group="A")
    sent: list[tuple] = []
    original = Client.execute_command

    def spy(self, *args):
        sent.append(args)
        return original(self, *args)

    monkeypatch.setattr(Client, "execute_command", spy)
    reader = make_reader(server.port, tmp_path / "s", includeGroups="false")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    (row,) = rows(reader, 0, end["batch"])
    assert GROUP not in row and GROUP_POSITION not in row
    getjobs = [args for args in sent if args[0] == "GETJOB"]
    assert getjobs and not any("WITHGROUP" in args for args in getjobs)
    (table,) = [t for _, t in StagingArea(tmp_path / "s").read_parts(end["batch"])]
    assert GROUP not in table.column_names
    reader.stop()


def test_a_batch_staged_without_groups_replays_with_nulls(server, client: Client,
                                                          tmp_path: Path) -> None:
    client.add_job("q", b"x", group="A")
    first = make_reader(server.port, tmp_path / "s", includeGroups="false")
    end = first.latestOffset({"batch": 0}, ReadMaxRows(10))
    first.driver.keeper.stop()
    second = make_reader(server.port, tmp_path / "s", includeHeaders="true")
    (row,) = rows(second, 0, end["batch"])
    assert (row["group"], row["group_position"], row["headers"]) == (None, None, [])
    second.stop()


def test_headers_and_groups_together(server, client: Client, tmp_path: Path) -> None:
    job_id = client.add_job("q", b"x", group="A", headers=[("k", b"v"), ("k", b"w")])
    reader = make_reader(server.port, tmp_path / "s", includeHeaders="true")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    (row,) = rows(reader, 0, end["batch"])
    assert [(h["key"], h["value"]) for h in row["headers"]] == [("k", b"v"), ("k", b"w")]
    assert (row["group"], row["group_position"]) == ("A", ctime(client, job_id))
    reader.stop()


def test_executor_fetch_mode_stages_and_replays_groups(server, client: Client,
                                                       tmp_path: Path) -> None:
    ids = [client.add_job("q", f"e{i}", group="E") for i in range(5)]
    reader = make_reader(server.port, tmp_path / "s", fetchMode="executor")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    parts = reader.partitions({"batch": 0}, end)
    assert all(isinstance(p, FetchPartition) and p.include_groups for p in parts)
    first = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
    assert [r["id"] for r in first] == ids  # one task: the group in order
    assert [r["group_position"] for r in first] == [ctime(client, i) for i in ids]
    # A second attempt of the same task reads the published part: identical.
    again = [r for p in parts for r in fetch_or_replay(p).to_pylist()]
    assert [(r["id"], r[GROUP], r[GROUP_POSITION]) for r in again] == [
        (r["id"], r["group"].encode(), r["group_position"]) for r in first]
    reader.stop()


def test_batch_reads_peek_and_drain_with_groups(server, client: Client) -> None:
    ids = [client.add_job("q", f"p{i}", group="P" if i else None) for i in range(3)]
    options = {"nodes": f"127.0.0.1:{server.port}", "queues": "q", "includeGroups": "true"}
    schema = source_schema("binary", False, True)
    peek = DisqueBatchReader(SourceConfig.from_options(options, streaming=False), schema)
    got = {r["id"]: r for p in peek.partitions() for b in peek.read(p) for r in b.to_pylist()}
    assert [(got[i]["group"], got[i]["group_position"]) for i in ids] == [
        (None, None), ("P", ctime(client, ids[1])), ("P", ctime(client, ids[2]))]
    assert client.qlen("q") == 3  # a peek changes nothing
    drain = DisqueBatchReader(SourceConfig.from_options({**options, "drain": "true"},
                                                        streaming=False), schema)
    drained = {r["id"]: r for p in drain.partitions() for b in drain.read(p)
               for r in b.to_pylist()}
    assert {i: (r["group"], r["group_position"]) for i, r in drained.items()} == {
        i: (r["group"], r["group_position"]) for i, r in got.items()}
    assert client.qlen("q") == 0


def test_a_group_key_that_is_not_utf8_fails_the_batch_naming_the_job(
        server, client: Client, tmp_path: Path) -> None:
    job_id = client.add_job("q", b"x", group=b"\xff\xfe")
    reader = make_reader(server.port, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    with pytest.raises(ValueError, match=re.escape(f"job {job_id} has a group key that is "
                                                   "not UTF-8")):
        rows(reader, 0, end["batch"])
    reader.stop()


def test_a_node_with_groups_says_so_without_touching_a_job(server, client: Client) -> None:
    client.add_job("q", b"x", group="A")
    assert supports_groups(client, "q")
    assert client.qlen("q") == 1


def test_a_read_with_groups_never_loads_pandas(server, client: Client, tmp_path: Path) -> None:
    """The group columns are built from buffers too (tests/spark/test_source_imports.py)."""
    from tests.support.fresh import run_fresh

    client.add_jobs("q", [b"job-%d" % i for i in range(50)])
    client.add_jobs("q", [b"g-%d" % i for i in range(5)], group="G")
    out = run_fresh(f"""
import json, pickle, sys
from pyspark.sql.streaming.datasource import ReadMaxRows
from spark_connector.source import DisqueDataSource
source = DisqueDataSource({{"nodes": "127.0.0.1:{server.port}", "queues": "q",
                          "stagingPath": {str(tmp_path / "staging")!r}, "fetchTimeoutMs": "0",
                          "includeGroups": "true"}})
reader = source.streamReader(source.schema())
end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(1000))
batches = [b for p in reader.partitions(reader.initialOffset(), end)
           for b in reader.read(pickle.loads(pickle.dumps(p)))]
reader.stop()
loaded = [m for m in ("pandas", "pyarrow.compute") if m in sys.modules]
print(json.dumps({{"rows": sum(b.num_rows for b in batches),
                  "grouped": sum(b.num_rows - b.column("group").null_count
                                 for b in batches),
                  "loaded": loaded}}))
""")
    assert out == {"rows": 55, "grouped": 5, "loaded": []}


def test_an_original_node_fails_the_query_at_its_start(original, tmp_path: Path) -> None:
    from spark_connector.fetch import fetch_jobs
    from spark_connector.options import OptionError

    with Client(f"127.0.0.1:{original.port}") as c:
        job_id = c.add_job("q", b"x")
        assert not supports_groups(c, "q")
        reader = make_reader(original.port, tmp_path / "s")
        with pytest.raises(OptionError, match=r"option 'includeGroups' is true, but node "
                           r"127\.0\.0\.1:\d+ has no ordered groups.*includeGroups=false"):
            reader.latestOffset({"batch": 0}, ReadMaxRows(10))
        assert StagingArea(tmp_path / "s").batches() == []
        # The fetch itself refuses too (a node that joins later), with nothing taken.
        with pytest.raises(OptionError, match="includeGroups"):
            fetch_jobs(c, ["q"], 10, batch_size=10, lease=True, groups=True)
        assert [j.id for j in c.qpeek("q", 10)] == [job_id]


# --------------------------------------------------------------------------
# Through Spark
# --------------------------------------------------------------------------

def test_a_streaming_query_gives_the_columns_and_a_group_sorts_by_position(
        spark, server, client: Client, tmp_path: Path) -> None:
    """The docs' recipe (docs/SPARK.md, "Ordered groups"): within a batch,
    ``groupBy("group").applyInPandas`` with each group sorted by
    ``group_position`` sees a group's jobs in add order."""
    added = {key: [client.add_job("q", f"{key}{i}", group=key) for i in range(4)]
             for key in ("A", "B", "C")}
    plain = client.add_job("q", b"plain")
    query = (spark.readStream.format("disque").option("nodes", f"127.0.0.1:{server.port}")
             .option("queues", "q").option("includeGroups", "true")
             .option("bodyFormat", "string")
             .option("stagingPath", str(tmp_path / "staging")).option("fetchTimeoutMs", "100")
             .load()
             .writeStream.format("memory").queryName("with_groups")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    table = spark.sql("select * from with_groups")
    got = {row.id: row for row in table.collect()}
    assert got[plain].group is None and got[plain].group_position is None

    def in_order(frame):
        import pandas as pd

        frame = frame.sort_values(["group_position", "id"])
        return pd.DataFrame({"group": [frame["group"].iloc[0]],
                             "ids": [",".join(frame["id"])]})

    ordered = {row.group: row.ids.split(",") for row in
               table.where("`group` IS NOT NULL").repartition(3).groupBy("group")
               .applyInPandas(in_order, "group string, ids string").collect()}
    assert ordered == added


def test_the_docs_recipe_runs_as_written(spark, server, client: Client,
                                         tmp_path: Path) -> None:
    """docs/SPARK.md's ``foreachBatch`` recipe ("Ordered groups"): each
    group's rows handled in add order, whatever partitions they were in."""
    import pyarrow.parquet as pq

    from tests.support.process import wait_for
    from tests.test_docs import block, pointed_at

    added = {key: [client.add_job("orders", f"{key}{i}", group=key) for i in range(6)]
             for key in ("A", "B", "C", "D")}
    code = pointed_at(block("docs/SPARK.md", "import pandas as pd").text,
                      f"127.0.0.1:{server.port}", tmp_path)
    namespace = {"spark": spark}
    exec(compile(code, "docs/SPARK.md", "exec"), namespace)
    query = namespace["query"]
    out = tmp_path / "data" / "handled"

    def handled() -> list[list[dict]]:
        if not out.exists():
            return []
        return [pq.read_table(path).to_pylist() for path in sorted(out.glob("*.parquet"))]

    try:
        wait_for(lambda: sum(map(len, handled())) >= 24, timeout=180, interval=0.5,
                 message=lambda: f"handled {handled()}; query: {query.exception()}")
    finally:
        query.stop()
    seen: dict[str, list[str]] = {}
    for rows in handled():  # one file per task: a group's rows as its handler returned them
        per_file: dict[str, list[str]] = {}
        for row in rows:
            per_file.setdefault(row["group"], []).append(row["id"])
        for key, ids in per_file.items():
            assert ids == [i for i in added[key] if i in ids], (key, ids)
            seen.setdefault(key, []).extend(ids)
    assert {key: sorted(ids) for key, ids in seen.items()} == {
        key: sorted(ids) for key, ids in added.items()}
