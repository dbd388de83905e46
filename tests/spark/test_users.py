"""The connectors as a user of the node (ACL, an extension): the ``user`` and
``password`` options, and a permission the user lacks failing the query or
the write with the node's -NOPERM, not an endless retry."""

from __future__ import annotations

from pathlib import Path

import pytest

from disque.client import Client
from spark_connector.options import ConnectionConfig, OptionError


def test_user_needs_a_password() -> None:
    with pytest.raises(OptionError, match="'user' needs the password option"):
        ConnectionConfig.from_options({"user": "worker"})
    config = ConnectionConfig.from_options({"user": "worker", "password": "pw"})
    assert (config.user, config.password) == ("worker", "pw")


@pytest.fixture
def secured(server_factory):
    node = server_factory("--requirepass", "admin-pw")
    with Client(f"127.0.0.1:{node.port}", password="admin-pw") as admin:
        admin.execute_command("ACL", "SETUSER", "etl", "on", ">etl-pw", "~events*",
                              "+@read", "+@write")
    return node


def test_sink_and_source_as_a_user(spark, secured, tmp_path: Path) -> None:
    options = {"nodes": f"127.0.0.1:{secured.port}", "user": "etl", "password": "etl-pw"}
    df = spark.range(0, 50, numPartitions=2).selectExpr("cast(id as string) as body")
    writer = df.write.format("disque").mode("append").option("queue", "events")
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()
    with Client(f"127.0.0.1:{secured.port}", password="admin-pw") as admin:
        assert admin.qlen("events") == 50
    reader = spark.readStream.format("disque")
    for name, value in {**options, "queues": "events", "stagingPath": str(tmp_path / "st"),
                        "fetchTimeoutMs": "100"}.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.format("memory").queryName("as_user")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(180)
    assert query.exception() is None
    assert spark.sql("select count(*) from as_user").collect()[0][0] == 50

    # A queue outside the user's patterns: the query fails with the node's
    # refusal instead of waiting for a node that "does not answer".
    reader = spark.readStream.format("disque")
    for name, value in {**options, "queues": "payroll", "stagingPath": str(tmp_path / "st2"),
                        "fetchTimeoutMs": "100"}.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.format("memory").queryName("refused")
             .option("checkpointLocation", str(tmp_path / "cp2"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception, match="NOPERM User etl has no permissions to access the "
                                        "'payroll' queue"):
        query.awaitTermination(180)
    # And the sink fails its task the same way, adding nothing.
    writer = df.write.format("disque").mode("append").option("queue", "payroll")
    for name, value in options.items():
        writer = writer.option(name, value)
    with pytest.raises(Exception, match="NOPERM"):
        writer.save()
    with Client(f"127.0.0.1:{secured.port}", password="admin-pw") as admin:
        assert admin.qlen("payroll") == 0
