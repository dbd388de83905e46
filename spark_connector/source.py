"""The ``disque`` data source: one class that Spark instantiates per query.

Readers live in :mod:`.stream_reader` and :mod:`.batch_reader`, writers in
:mod:`.writer`; this class only
parses options (once, on the driver, failing early with errors that name
the option) and hands typed configs to them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource

from .options import SourceConfig, option_bool, option_choice

if TYPE_CHECKING:
    from pyspark.sql.datasource import (
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        DataSourceWriter,
    )
    from pyspark.sql.types import StructType

__all__ = ["DisqueDataSource"]


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
        return source_schema(body_format, option_bool(self.options, "includeHeaders", False),
                             option_bool(self.options, "includeGroups", False))

    def _checked_schema(self, schema: StructType, config: SourceConfig) -> StructType:
        from .schema import source_schema

        expected = source_schema(config.body_format, config.include_headers,
                                 config.include_groups)
        if schema != expected:
            raise ValueError(
                "disque data source: the source's schema is fixed; got a user schema "
                f"{schema.simpleString()}, expected {expected.simpleString()}")
        return schema

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from .stream_reader import DisqueStreamReader

        # No check_reachable() here: Spark also creates a stream reader in a
        # process of its own to plan the executors' reads, which then needed
        # disque.client (redis-py, 0.25 s) and a connection for nothing.  The
        # driver side checks the nodes before its first batch (DriverSide).
        config = SourceConfig.from_options(self.options, streaming=True)
        return DisqueStreamReader(config, self._checked_schema(schema, config))

    def reader(self, schema: StructType) -> DataSourceReader:
        from .batch_reader import DisqueBatchReader
        from .topology import check_reachable

        config = SourceConfig.from_options(self.options, streaming=False)
        check_reachable(config)
        return DisqueBatchReader(config, self._checked_schema(schema, config))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from .writer import DisqueBatchWriter

        return DisqueBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from .writer import DisqueStreamWriter

        return DisqueStreamWriter(self.options, schema, overwrite)
