"""Option parsing of the source: every bad value fails with the option's name."""

from __future__ import annotations

import pytest

from spark_connector.options import OptionError, SourceConfig
from spark_connector.source import DisqueDataSource
from spark_connector.topology import check_reachable

BASE = {"queues": "q1", "stagingPath": "/tmp/staging"}


def parse(**overrides: str) -> SourceConfig:
    return SourceConfig.from_options({**BASE, **overrides}, streaming=True)


def test_defaults() -> None:
    config = parse()
    assert config.queues == ("q1",)
    assert config.connection.nodes == ("127.0.0.1:7711",)
    assert (config.ack_mode, config.fetch_mode, config.body_format) == ("ackjob", "driver",
                                                                       "binary")
    assert config.max_jobs_per_trigger is None and config.fetch_timeout_ms == 500
    assert (config.num_partitions, config.jobs_per_partition) == (1, 25_000)


def test_options_are_case_insensitive_and_lists_are_trimmed() -> None:
    config = SourceConfig.from_options(
        {"QUEUES": " a, b ,a,", "stagingpath": "/x", "NODES": "h1:1, h2:2",
         "maxjobspertrigger": "10"}, streaming=True)
    assert config.queues == ("a", "b")
    assert config.connection.nodes == ("h1:1", "h2:2")
    assert config.max_jobs_per_trigger == 10


@pytest.mark.parametrize(("options", "option", "fragment"), [
    ({"queues": ""}, "queues", "is required"),
    ({"queues": " , "}, "queues", "at least one queue"),
    ({"stagingPath": ""}, "stagingPath", "is required"),
    ({"nodes": "host:notaport"}, "nodes", "bad address"),
    ({"nodes": ","}, "nodes", "at least one"),
    ({"nodes": "h:99999"}, "nodes", "bad address"),
    ({"maxJobsPerTrigger": "ten"}, "maxJobsPerTrigger", "must be an integer"),
    ({"maxJobsPerTrigger": "0"}, "maxJobsPerTrigger", ">= 1"),
    ({"maxJobsPerTrigger": "9" * 400}, "maxJobsPerTrigger", None),
    ({"minJobsPerTrigger": "5", "maxJobsPerTrigger": "4"}, "minJobsPerTrigger", "must not exceed"),
    ({"maxTriggerDelay": "soon"}, "maxTriggerDelay", "duration"),
    ({"fetchTimeoutMs": "-1"}, "fetchTimeoutMs", "duration"),
    ({"fetchBatchSize": "1000000"}, "fetchBatchSize", "<= 100000"),
    ({"bodyFormat": "json"}, "bodyFormat", "binary, string"),
    ({"ackMode": "never"}, "ackMode", "ackjob, fastack"),
    ({"fetchMode": "magic"}, "fetchMode", "driver, executor"),
    ({"drain": "maybe"}, "drain", "true or false"),
    ({"workingIntervalMs": "5ms"}, "workingIntervalMs", "at least 100"),
    ({"minJobRetry": "500ms"}, "minJobRetry", "at least 1000"),
    ({"logLevel": "loud"}, "logLevel", "debug, info"),
])
def test_bad_options_name_the_option(options: dict, option: str, fragment: str | None) -> None:
    with pytest.raises(OptionError) as info:
        parse(**options)
    assert info.value.option == option
    assert f"option '{option}'" in str(info.value)
    if fragment is not None:
        assert fragment in str(info.value)


def test_huge_integer_is_rejected_not_accepted_silently() -> None:
    with pytest.raises(OptionError, match="<= 100000"):
        parse(fetchBatchSize=str(10**30))


def test_durations() -> None:
    assert parse(maxTriggerDelay="2s").max_trigger_delay_ms == 2000
    assert parse(maxTriggerDelay="1.5m").max_trigger_delay_ms == 90_000
    assert parse(maxTriggerDelay="250").max_trigger_delay_ms == 250
    assert parse(fetchTimeoutMs="0").fetch_timeout_ms == 0


def test_batch_reads_do_not_need_a_staging_path() -> None:
    config = SourceConfig.from_options({"queues": "q"}, streaming=False)
    assert config.staging_path is None and config.drain is False


def test_unreachable_node_is_named(unused_port: int) -> None:
    config = SourceConfig.from_options(
        {**BASE, "nodes": f"127.0.0.1:{unused_port}", "connectTimeoutMs": "200",
         "reconnectTimeout": "200ms"},
        streaming=True)
    with pytest.raises(OptionError, match=f"option 'nodes' lists 127.0.0.1:{unused_port}"):
        check_reachable(config)


def test_schema_follows_body_format() -> None:
    assert DisqueDataSource({"bodyFormat": "string"}).schema()["body"].dataType.typeName() \
        == "string"
    assert DisqueDataSource({}).schema().fieldNames() == [
        "queue", "id", "body", "nacks", "additional_deliveries", "node", "fetched_at"]


def test_dead_letter_queues_option() -> None:
    assert parse().dead_letter_queues == ()
    config = parse(queues="a,b", deadLetterQueues="default")
    assert config.queues == ("a", "b", "a:dead", "b:dead")  # read after the live queues
    assert config.dead_letter_queues == ("a:dead", "b:dead")
    assert config.live_queues == ("a", "b")
    named = parse(queues="a", deadLetterQueues=" poison, a ,poison")
    assert named.queues == ("a", "poison") and named.dead_letter_queues == ("poison",)
    with pytest.raises(OptionError, match="'deadLetterQueues' must be 'default' or queue names"):
        parse(deadLetterQueues=" , ")


def test_stream_reader_checks_the_nodes_on_the_driver_side_only(unused_port: int,
                                                                tmp_path) -> None:
    """Creating a stream reader connects nowhere (Spark also creates one only to plan
    the executors' reads); its first driver call fails, naming the option."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    source = DisqueDataSource({"queues": "q", "stagingPath": str(tmp_path / "staging"),
                               "nodes": f"127.0.0.1:{unused_port}",
                               "connectTimeoutMs": "200", "reconnectTimeout": "200ms"})
    reader = source.streamReader(source.schema())
    assert reader.initialOffset() == {"batch": 0}
    with pytest.raises(OptionError, match=f"option 'nodes' lists 127.0.0.1:{unused_port}"):
        reader.latestOffset({"batch": 0}, ReadMaxRows(10))
    assert not (tmp_path / "staging").exists()  # failed before touching the staging area


def test_a_query_with_an_unreachable_node_fails_before_its_first_batch(
        spark, unused_port: int, tmp_path) -> None:
    query = (spark.readStream.format("disque")
             .option("queues", "q").option("nodes", f"127.0.0.1:{unused_port}")
             .option("stagingPath", str(tmp_path / "staging"))
             .option("connectTimeoutMs", "200").option("reconnectTimeout", "200ms")
             .load().writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match=f"option 'nodes' lists 127.0.0.1:{unused_port}"):
        query.awaitTermination(120)
    assert not query.recentProgress
