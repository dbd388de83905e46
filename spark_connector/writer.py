"""The ``disque`` sink: ``df.write`` / ``df.writeStream`` ``.format("disque")``.

Where things run (pyspark 4.3): the writer object is built on the driver
(options and schema are checked there, see :mod:`.sink_options`), pickled,
and its ``write`` runs once per partition in an executor's Python worker.
``commit``/``abort`` run on the driver again, for streaming on a *new*
writer object built from the same options.  So ``write`` depends only on
what the pickled writer carries plus :class:`pyspark.TaskContext`.

Per partition, :class:`.PartitionWriter` (:mod:`.partition_writer`: send,
retry, failover) writes the commands :mod:`.batching` builds from the Arrow
columns; the partitions of a write spread over the cluster's nodes, found
through HELLO on the driver (:meth:`SinkConfig.over_cluster`), which first
checks that a node answers.

Delivery is at-least-once: a retried task, a replayed micro-batch or a
re-sent pipeline after a dropped connection may add a job twice.  With
``dedupKey`` each body is prefixed by a key that is the same on every
replay (see :func:`split_key` and docs/SPARK_SINK.md).
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

# DataSourceStreamArrowWriter is new in pyspark 4.1 (Arrow input for streams).
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from .partition_writer import DisqueCommitMessage, DisqueWriteError, PartitionWriter
from .sink_options import SinkConfig
from .topology import check_any_reachable

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "DisqueBatchWriter", "DisqueStreamWriter", "DisqueCommitMessage", "DisqueWriteError",
    "PartitionWriter", "split_key",
]

log = logging.getLogger("spark_connector.writer")

#: Local properties Spark sets on every task of a micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def split_key(body: bytes) -> tuple[str, bytes]:
    """Split a body written with ``dedupKey`` into ``(key, original body)``.

    The sink writes ``key + b"\\n" + body``; keys never contain a newline,
    so the first one ends the key whatever the body holds.
    """
    key, sep, rest = body.partition(b"\n")
    if not sep:
        raise ValueError("not a keyed body: no newline after the key")
    return key.decode("utf-8", "surrogateescape"), rest


def _summarize(messages: Iterable[WriterCommitMessage | None]) -> tuple[int, int, int]:
    """(jobs, retries, tasks that reported) over the messages Spark collected."""
    jobs = retries = tasks = 0
    for message in messages:
        if isinstance(message, DisqueCommitMessage):
            jobs += message.jobs
            retries += message.retries
            tasks += 1
    return jobs, retries, tasks



def _task() -> tuple[int, int, Any]:
    """(partition id, attempt number, TaskContext) of the running task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # called outside Spark (unit tests): partition 0
        return 0, 0, None
    return context.partitionId(), context.attemptNumber(), context


# --------------------------------------------------------------------------
# The two writers Spark sees
# --------------------------------------------------------------------------

#: The module of the Python process in which Spark commits a micro-batch.
_COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"


def _committing() -> bool:
    """Is this the process Spark started to commit (or abort) a micro-batch?"""
    return _COMMIT_RUNNER in sys.modules


def _on_the_cluster(config: SinkConfig) -> SinkConfig:
    """Check on the driver that a node answers, then spread over the cluster.

    A write whose nodes cannot be reached fails here, before any task runs,
    with one line naming the option (``reconnectTimeout`` still applies).
    """
    check_any_reachable(config.connection)
    return config.over_cluster()

class DisqueBatchWriter(DataSourceArrowWriter):
    """``df.write.format("disque").option("queue", "q").mode("append").save()``."""

    def __init__(self, options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> None:
        # Built on the driver: the cluster's nodes are looked up here, once.
        self.config = _on_the_cluster(SinkConfig.from_options(options, schema,
                                                              overwrite=overwrite))
        # Built once on the driver and pickled to every task (and every task
        # retry), so all of them share it: generated keys of one save() agree.
        self.write_id = self.config.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DisqueCommitMessage:
        partition, attempt, _ = _task()
        prefix = f"{self.write_id}/0/{partition}/" if self.config.dedup_key else None
        return PartitionWriter(self.config, partition, attempt=attempt,
                               key_prefix=prefix).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        jobs, retries, tasks = _summarize(messages)
        log.info("write %s committed: %d jobs from %d tasks (%d retried sends)",
                 self.write_id, jobs, tasks, retries)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        jobs, _, tasks = _summarize(messages)
        # Jobs cannot be taken back (consumers may have them already).
        log.warning("write %s failed; %d tasks had already added %d jobs, which stay queued",
                    self.write_id, tasks, jobs)


class DisqueStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("disque").option("queue", "q")...start()``."""

    def __init__(self, options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> None:
        config = SinkConfig.from_options(options, schema, overwrite=overwrite, streaming=True)
        # Spark builds a new writer to commit each micro-batch: it only logs,
        # and a node briefly down must not fail a batch whose tasks are done.
        self.config = config if _committing() else _on_the_cluster(config)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DisqueCommitMessage:
        partition, attempt, context = _task()
        prefix = None
        if self.config.dedup_key:
            # The query ID survives restarts from the checkpoint and a replayed
            # micro-batch keeps its ID: the key of a replayed row is unchanged.
            query = self.config.write_id or (
                context.getLocalProperty(QUERY_ID_PROPERTY) if context else None)
            batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
            if query is None or batch is None:
                raise RuntimeError("disque sink: dedupKey needs the streaming query and "
                                   "batch IDs, which Spark did not provide to this task")
            prefix = f"{query}/{batch}/{partition}/"
        return PartitionWriter(self.config, partition, attempt=attempt,
                               key_prefix=prefix).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        jobs, retries, tasks = _summarize(messages)
        log.info("batch %d committed: %d jobs from %d tasks (%d retried sends)",
                 batchId, jobs, tasks, retries)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        jobs, _, tasks = _summarize(messages)
        # Also called when the query is stopped mid-batch.  The tasks that
        # did not finish report nothing, but may have added jobs too.
        log.warning("batch %d aborted; %d finished tasks had added %d jobs, which a replay "
                    "of the batch adds again (at-least-once)", batchId, tasks, jobs)
