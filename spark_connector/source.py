"""The ``disque`` data source: one class that Spark instantiates per query.

Readers live in :mod:`.reader`, writers in :mod:`.writer`; this class only
parses options (once, on the driver, failing early with errors that name
the option) and hands typed configs to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

from .options import SourceConfig, option_choice

if TYPE_CHECKING:
    from pyspark.sql.datasource import (
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.types import StructType

__all__ = ["DisqueDataSource", "check_reachable"]


def check_reachable(config: SourceConfig) -> None:
    """Fail the query at its start, naming the option, if a node does not answer.

    Each node is tried for ``reconnectTimeout``, the rule the sink follows
    too: a node that is restarting is waited for, a wrong address fails the
    query once that time has passed.
    """
    from disque.exceptions import AuthError, ConnectionFailed

    from .options import OptionError

    connection = config.connection
    for node in connection.nodes:
        client = connection.client(node=node, client_name="spark-disque-check")
        try:
            client.ping()
        except AuthError as exc:
            raise OptionError("password", f"was refused by {node}: {exc}") from None
        except ConnectionFailed as exc:
            raise OptionError("nodes", f"lists {node}, which cannot be reached (tried for "
                              f"{connection.reconnect_timeout_s:g} s, reconnectTimeout): "
                              f"{exc}") from None
        finally:
            client.close()


class DisqueDataSource(DataSource):
    """Read Disque queues into Spark and write DataFrames to Disque queues.

    ``spark.readStream.format("disque").option("queues", "q1,q2")
    .option("stagingPath", "/durable/dir").load()`` for at-least-once
    streaming; ``spark.read.format("disque")`` to peek at (or drain) queues.
    """

    @classmethod
    def name(cls) -> str:
        return "disque"

    def schema(self) -> StructType:
        # Lazy imports in this module: Spark unpickles this class in a fresh
        # process for schema() at load() and for planning at start(); what
        # they do not use (pyarrow, redis-py, the readers) is not loaded there.
        from .schema import source_schema

        body_format = option_choice(self.options, "bodyFormat", ("binary", "string"), "binary")
        return source_schema(body_format)

    def _checked_schema(self, schema: StructType, config: SourceConfig) -> StructType:
        from .schema import source_schema

        expected = source_schema(config.body_format)
        if schema != expected:
            raise ValueError(
                "disque data source: the source's schema is fixed; got a user schema "
                f"{schema.simpleString()}, expected {expected.simpleString()}")
        return schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .reader import DisqueStreamReader

        # No check_reachable() here: Spark also creates a stream reader in a
        # process of its own to plan the executors' reads, which then needed
        # disque.client (redis-py, 0.25 s) and a connection for nothing.  The
        # driver side checks the nodes before its first batch (_DriverSide).
        config = SourceConfig.from_options(self.options, streaming=True)
        return DisqueStreamReader(config, self._checked_schema(schema, config))

    def reader(self, schema: StructType) -> DataSourceReader:
        from .batch_reader import DisqueBatchReader

        config = SourceConfig.from_options(self.options, streaming=False)
        check_reachable(config)
        return DisqueBatchReader(config, self._checked_schema(schema, config))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .writer import DisqueBatchWriter

        return DisqueBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .writer import DisqueStreamWriter

        return DisqueStreamWriter(self.options, schema, overwrite)
