"""The source's ``includeHeaders`` column, against real nodes.

The reader runs as a plain object first (what Spark's driver and executors
call, as tests/spark/test_source_reader.py does), then through the shared
local Spark session.  Headers come in order, a name as often as it was
given, values as bytes; a job without headers has an empty array; a
replayed batch gives them again identically; an original node fails a
query that asks for them, before any job is taken.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from pyspark.sql.streaming.datasource import ReadMaxRows

from disque.client import Client
from spark_connector.batch_reader import DisqueBatchReader
from spark_connector.executor_read import fetch_or_replay
from spark_connector.fetch import fetch_jobs, supports_headers
from spark_connector.options import OptionError, SourceConfig
from spark_connector.partitions import FetchPartition
from spark_connector.schema import HEADERS, arrow_schema, headers_type, source_schema
from spark_connector.staging import StagingArea
from spark_connector.stream_reader import DisqueStreamReader
from tests.support.fresh import run_fresh

#: Headers of the test jobs: a repeated name, binary values, an empty one.
REPEATED = [("trace", b"a"), ("tenant", b"\x00\xff\x80"), ("trace", b"b"), ("empty", b"")]


@pytest.fixture
def client(server) -> Client:
    with Client(f"127.0.0.1:{server.port}") as c:
        yield c


def make_reader(port: int, staging: Path, **options: str) -> DisqueStreamReader:
    opts = {"nodes": f"127.0.0.1:{port}", "queues": "q", "stagingPath": str(staging),
            "fetchTimeoutMs": "0", "fetchAhead": "false", "includeHeaders": "true",
            **options}
    config = SourceConfig.from_options(opts, streaming=True)
    return DisqueStreamReader(config, source_schema(config.body_format, config.include_headers))


def rows(reader: DisqueStreamReader, start: int, end: int) -> list[dict]:
    out: list[dict] = []
    for part in reader.partitions({"batch": start}, {"batch": end}):
        for batch in reader.read(pickle.loads(pickle.dumps(part))):
            out.extend(batch.to_pylist())
    return out


def as_pairs(headers: list[dict]) -> list[tuple[str, bytes]]:
    return [(h["key"], h["value"]) for h in headers]


def test_the_staged_type_is_what_spark_makes_of_the_column() -> None:
    """Staged headers go to Spark as they are: Spark compares types exactly."""
    schema = arrow_schema(source_schema("binary", include_headers=True))
    assert schema.field(HEADERS).type == headers_type()
    assert not schema.field(HEADERS).nullable
    assert source_schema("string", True).simpleString().endswith(
        "headers:array<struct<key:string,value:binary>>>")
    assert HEADERS not in source_schema().fieldNames()


def test_rows_keep_the_order_repeated_names_and_binary_values(server, client: Client,
                                                              tmp_path: Path) -> None:
    with_headers = client.add_job("q", b"with", headers=REPEATED)
    plain = client.add_job("q", b"plain")
    reader = make_reader(server.port, tmp_path / "s")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    got = {row["id"]: row for row in rows(reader, 0, end["batch"])}
    assert as_pairs(got[with_headers]["headers"]) == REPEATED
    assert got[plain]["headers"] == []  # an empty array, not null
    assert got[with_headers]["body"] == b"with" and got[plain]["queue"] == "q"
    reader.stop()


def test_a_replay_after_a_restart_gives_identical_rows_with_headers(
        server, client: Client, tmp_path: Path) -> None:
    for i in range(30):
        client.add_job("q", f"b{i}", headers=[("n", str(i)), ("n", b"\x01" * i)]
                       if i % 3 else None)
    first = make_reader(server.port, tmp_path / "s")
    end = first.latestOffset({"batch": 0}, ReadMaxRows(20))
    before = rows(first, 0, end["batch"])
    first.driver.keeper.stop()  # "crash": no stop(), no ACK
    second = make_reader(server.port, tmp_path / "s")
    after = rows(second, 0, end["batch"])
    assert after == before
    assert [as_pairs(r["headers"]) for r in after[:3]] == [
        [], [("n", b"1"), ("n", b"\x01")], [("n", b"2"), ("n", b"\x01\x01")]]
    # The staged file holds them: the replay read them back from staging.
    (table,) = [t for _, t in StagingArea(tmp_path / "s").read_parts(end["batch"])]
    assert table.schema.field(HEADERS).type == headers_type()
    second.stop()


def test_without_the_option_no_column_and_no_withheaders(server, client: Client,
                                                          tmp_path: Path, monkeypatch) -> None:
    client.add_job("q", b"x", headers={"tenant": b"acme"})
    sent: list[tuple] = []
    original = Client.execute_command

    def spy(self, *args):
        sent.append(args)
        return original(self, *args)

    monkeypatch.setattr(Client, "execute_command", spy)
    reader = make_reader(server.port, tmp_path / "s", includeHeaders="false")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    (row,) = rows(reader, 0, end["batch"])
    assert "headers" not in row
    getjobs = [args for args in sent if args[0] == "GETJOB"]
    assert getjobs and not any("WITHHEADERS" in args for args in getjobs)
    (table,) = [t for _, t in StagingArea(tmp_path / "s").read_parts(end["batch"])]
    assert HEADERS not in table.column_names
    reader.stop()


def test_a_batch_staged_without_headers_replays_with_empty_ones(server, client: Client,
                                                                tmp_path: Path) -> None:
    """includeHeaders turned on across a restart: the batch staged before
    (without its headers) replays with empty arrays, not an error."""
    client.add_job("q", b"x", headers={"tenant": b"acme"})
    first = make_reader(server.port, tmp_path / "s", includeHeaders="false")
    end = first.latestOffset({"batch": 0}, ReadMaxRows(10))
    first.driver.keeper.stop()
    second = make_reader(server.port, tmp_path / "s")
    (row,) = rows(second, 0, end["batch"])
    assert row["headers"] == [] and row["body"] == b"x"
    second.stop()


def test_executor_fetch_mode_stages_and_replays_headers(server, client: Client,
                                                        tmp_path: Path) -> None:
    ids = [client.add_job("q", f"e{i}", headers=[("k", f"{i}"), ("k", "again")])
           for i in range(5)]
    reader = make_reader(server.port, tmp_path / "s", fetchMode="executor")
    end = reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    parts = reader.partitions({"batch": 0}, end)
    assert all(isinstance(p, FetchPartition) and p.include_headers for p in parts)
    first = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
    assert sorted(r["id"] for r in first) == sorted(ids)
    assert all(as_pairs(r["headers"])[1] == ("k", b"again") for r in first)
    # A second attempt of the same task reads the published part: identical.
    again = [r for p in parts for r in fetch_or_replay(p).to_pylist()]
    assert [(r["id"], r["headers"]) for r in again] == [(r["id"], r["headers"])
                                                        for r in first]
    reader.stop()


def test_batch_reads_peek_and_drain_with_headers(server, client: Client) -> None:
    ids = [client.add_job("q", f"p{i}", headers=REPEATED if i else None) for i in range(3)]
    config = SourceConfig.from_options({"nodes": f"127.0.0.1:{server.port}", "queues": "q",
                                        "includeHeaders": "true"}, streaming=False)
    schema = source_schema(config.body_format, True)
    peek = DisqueBatchReader(config, schema)
    got = {r["id"]: r for p in peek.partitions() for b in peek.read(p) for r in b.to_pylist()}
    assert as_pairs(got[ids[1]]["headers"]) == REPEATED and got[ids[0]]["headers"] == []
    assert client.qlen("q") == 3  # a peek changes nothing
    config = SourceConfig.from_options({"nodes": f"127.0.0.1:{server.port}", "queues": "q",
                                        "includeHeaders": "true", "drain": "true"},
                                       streaming=False)
    drain = DisqueBatchReader(config, schema)
    drained = {r["id"]: r for p in drain.partitions() for b in drain.read(p)
               for r in b.to_pylist()}
    assert set(drained) == set(ids) and as_pairs(drained[ids[2]]["headers"]) == REPEATED
    assert client.qlen("q") == 0


def test_a_node_with_headers_says_so_without_touching_a_job(server, client: Client) -> None:
    client.add_job("q", b"x")
    assert supports_headers(client, "q")
    assert client.qlen("q") == 1


def test_a_drain_with_headers_never_loads_pandas(server, client: Client,
                                                 tmp_path: Path) -> None:
    """The headers column is built from buffers too (tests/spark/test_source_imports.py)."""
    client.add_jobs("q", [b"job-%d" % i for i in range(50)])
    client.add_job("q", b"h", headers=REPEATED)
    out = run_fresh(f"""
import json, pickle, sys
from pyspark.sql.streaming.datasource import ReadMaxRows
from spark_connector.source import DisqueDataSource
source = DisqueDataSource({{"nodes": "127.0.0.1:{server.port}", "queues": "q",
                          "stagingPath": {str(tmp_path / "staging")!r}, "fetchTimeoutMs": "0",
                          "includeHeaders": "true"}})
reader = source.streamReader(source.schema())
end = reader.latestOffset(reader.initialOffset(), ReadMaxRows(1000))
batches = [b for p in reader.partitions(reader.initialOffset(), end)
           for b in reader.read(pickle.loads(pickle.dumps(p)))]
reader.stop()
loaded = [m for m in ("pandas", "pyarrow.compute") if m in sys.modules]
# Counted after: to_pylist() of a list column loads pandas itself.
print(json.dumps({{"rows": sum(b.num_rows for b in batches),
                  "headers": sum(len(r["headers"]) for b in batches for r in b.to_pylist()),
                  "loaded": loaded}}))
""")
    assert out == {"rows": 51, "headers": 4, "loaded": []}


# --------------------------------------------------------------------------
# An original node
# --------------------------------------------------------------------------

def test_an_original_node_fails_the_query_at_its_start(original, tmp_path: Path) -> None:
    with Client(f"127.0.0.1:{original.port}") as c:
        job_id = c.add_job("q", b"x")
        assert not supports_headers(c, "q")
        reader = make_reader(original.port, tmp_path / "s")
        with pytest.raises(OptionError, match=r"option 'includeHeaders' is true, but node "
                           r"127\.0\.0\.1:\d+ has no job headers.*includeHeaders=false"):
            reader.latestOffset({"batch": 0}, ReadMaxRows(10))
        assert StagingArea(tmp_path / "s").batches() == []
        # Nothing was taken: the job is still queued for a reader without the option.
        assert [j.id for j in c.qpeek("q", 10)] == [job_id]
        # The fetch itself refuses too (a node that joins later), with nothing taken.
        with pytest.raises(OptionError, match="includeHeaders"):
            fetch_jobs(c, ["q"], 10, batch_size=10, lease=True, headers=True)
        assert c.qlen("q") == 1
        plain = make_reader(original.port, tmp_path / "plain", includeHeaders="false")
        end = plain.latestOffset({"batch": 0}, ReadMaxRows(10))
        assert [r["id"] for r in rows(plain, 0, end["batch"])] == [job_id]
        plain.stop()


def test_an_original_node_fails_a_batch_read_with_headers(original) -> None:
    config = SourceConfig.from_options({"nodes": f"127.0.0.1:{original.port}", "queues": "q",
                                        "includeHeaders": "true"}, streaming=False)
    with pytest.raises(OptionError, match="has no job headers"):
        DisqueBatchReader(config, source_schema("binary", True)).partitions()


# --------------------------------------------------------------------------
# Through Spark
# --------------------------------------------------------------------------

def test_a_streaming_query_gives_the_headers_column(spark, server, client: Client,
                                                    tmp_path: Path) -> None:
    with_headers = client.add_job("q", b"with", headers=REPEATED)
    plain = client.add_job("q", b"plain")
    query = (spark.readStream.format("disque").option("nodes", f"127.0.0.1:{server.port}")
             .option("queues", "q").option("includeHeaders", "true")
             .option("stagingPath", str(tmp_path / "staging")).option("fetchTimeoutMs", "100")
             .load()
             .writeStream.format("memory").queryName("with_headers")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    got = {row.id: row for row in spark.sql("select * from with_headers").collect()}
    assert [(h.key, bytes(h.value)) for h in got[with_headers].headers] == REPEATED
    assert got[plain].headers == []
    # Spark SQL sees Kafka's shape: filter on a header.
    tenants = spark.sql("select id from with_headers "
                        "where exists(headers, h -> h.key = 'tenant')").collect()
    assert [r.id for r in tenants] == [with_headers]
    assert spark.read.format("disque").option("nodes", f"127.0.0.1:{server.port}").option(
        "queues", "q").option("includeHeaders", "true").load().schema == source_schema(
        "binary", True)


def test_a_streaming_query_on_an_original_node_fails_naming_the_option(
        spark, original, tmp_path: Path) -> None:
    with Client(f"127.0.0.1:{original.port}") as c:
        c.add_job("q", b"x")
        query = (spark.readStream.format("disque")
                 .option("nodes", f"127.0.0.1:{original.port}").option("queues", "q")
                 .option("includeHeaders", "true").option("minJobRetry", "60s")
                 .option("stagingPath", str(tmp_path / "staging")).load()
                 .writeStream.format("memory").queryName("original_headers")
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        with pytest.raises(Exception) as info:  # StreamingQueryException
            query.awaitTermination(180)
        assert "option 'includeHeaders' is true, but node" in str(info.value)
        assert c.qlen("q") == 1  # nothing taken
