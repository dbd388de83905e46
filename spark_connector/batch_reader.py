"""``spark.read.format("disque")``: peek at queues, or drain them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from . import telemetry
from .fetch import (
    fetch_table,
    groups_refused_error,
    headers_refused_error,
    jobs_to_table,
    supports_groups,
    supports_headers,
)
from .options import ConnectionConfig, SourceConfig
from .partitions import record_batches
from .topology import discover

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from disque.client import Client

__all__ = ["DisqueBatchReader", "ScanPartition"]


@dataclass
class ScanPartition(InputPartition):
    """Batch reads: one queue on one node, peeked (JSCAN) or drained (GETJOB)."""

    node: str
    queue: str
    connection: ConnectionConfig
    drain: bool
    max_jobs: int | None
    batch_size: int
    ack_mode: str
    #: ``includeHeaders``: the jobs' headers too.
    include_headers: bool = False
    #: ``telemetrySetup``, called in the task's Python worker (drains make spans).
    telemetry_setup: str | None = None
    #: ``includeGroups``: the jobs' group keys and positions too.
    include_groups: bool = False



class DisqueBatchReader(DataSourceReader):
    """``spark.read.format("disque")``: peek at queues, or drain them (``drain=true``).

    Peeking (the default) changes nothing on the nodes: it lists the queued
    jobs with JSCAN.  Draining takes jobs with GETJOB and acknowledges each
    chunk once Spark has pulled it from the reader; a failure after that
    point (e.g. the write of the result fails) loses those jobs.  For
    at-least-once draining use the streaming source with
    ``trigger(availableNow=True)``.
    """

    def __init__(self, config: SourceConfig, schema: StructType) -> None:
        self.config = config
        self.schema = schema

    def partitions(self) -> list[InputPartition]:
        """One partition per queue and node: every usable node of the cluster,
        found through HELLO from the seeds (``discoverNodes``), as the
        streaming source reads them."""
        config = self.config
        nodes = [view.address for view in discover(config.connection)]
        if config.include_headers or config.include_groups:
            _check_extensions(config, nodes)
        return [ScanPartition(node, queue, config.connection, config.drain, config.max_jobs,
                              config.fetch_batch_size, config.ack_mode, config.include_headers,
                              config.telemetry_setup, config.include_groups)
                for node in nodes for queue in config.queues]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ScanPartition)
        if partition.drain:
            telemetry.setup(partition.telemetry_setup)
        client = partition.connection.client(node=partition.node,
                                             client_name="spark-disque-batch")
        try:
            if partition.drain:
                yield from self._drain(client, partition)
            else:
                yield from record_batches(_peek(client, partition), self.schema)
        finally:
            client.close()
            telemetry.flush()

    def _drain(self, client: Client, part: ScanPartition) -> Iterator[pa.RecordBatch]:
        """GETJOB while the node's QLEN says jobs are queued, never on an empty queue.

        A GETJOB that finds the queue empty makes the node ask the others
        for jobs (federation, also for NOHANG): they would move here after
        this partition ended, while another partition still reads their
        node, and the drain would miss them.  QLEN asks for nothing.
        """
        taken = 0
        while part.max_jobs is None or taken < part.max_jobs:
            queued = client.qlen(part.queue)
            if queued == 0:
                return
            want = min(part.batch_size, queued)
            if part.max_jobs is not None:
                want = min(want, part.max_jobs - taken)
            table = fetch_table(client, [part.queue], want, batch_size=want,
                                headers=part.include_headers, groups=part.include_groups)
            if table.num_rows == 0:
                return  # another consumer took them between QLEN and GETJOB
            ids = table.column("id").to_pylist()
            handed_over = False
            try:
                yield from record_batches(table, self.schema)
                handed_over = True
            finally:
                if handed_over:
                    (client.fastack if part.ack_mode == "fastack" else client.ack)(*ids)
                else:  # the consumer stopped early: these were never read
                    client.enqueue(*ids)
            taken += len(ids)


def _check_extensions(config: SourceConfig, nodes: list[str]) -> None:
    """``includeHeaders``, ``includeGroups``: fail the read, on the driver,
    when a node has no headers (no ordered groups)."""
    for node in nodes:
        client = config.connection.client(node=node, client_name="spark-disque-batch")
        try:
            if config.include_headers and not supports_headers(client, config.queues[0]):
                raise headers_refused_error(node, "ERR syntax error")
            if config.include_groups and not supports_groups(client, config.queues[0]):
                raise groups_refused_error(node, "ERR syntax error")
        finally:
            client.close()


def _peek(client: Client, part: ScanPartition) -> pa.Table:
    from disque.client import Job

    if part.include_headers or part.include_groups:
        return _peek_raw(client, part)
    jobs: list[Job] = []
    for info in client.jscan(queue=part.queue, states=("queued",), reply="all",
                             count=part.batch_size):
        body = info.get("body")
        if body is None:
            continue
        jobs.append(Job(str(info["queue"]), str(info["id"]), body,
                        int(info.get("nacks") or 0),
                        int(info.get("additional-deliveries") or 0)))
        if part.max_jobs is not None and len(jobs) >= part.max_jobs:
            break
    return jobs_to_table(jobs)


def _peek_raw(client: Client, part: ScanPartition) -> pa.Table:
    """:func:`_peek` with each job's headers and/or group: JSCAN's replies
    read raw, since the client's SHOW-like dicts keep one value per header
    name (a job's headers may repeat a name) and decode group keys.  A
    job's group position is its ``ctime``, as ``GETJOB ... WITHGROUP``
    gives it."""
    from disque.client import Job

    jobs: list[Job] = []
    headers: list[list[bytes]] = []
    keys: list[bytes | None] = []
    positions: list[int | None] = []

    def table() -> pa.Table:
        return jobs_to_table(jobs, headers=headers if part.include_headers else None,
                             groups=(keys, positions) if part.include_groups else None)

    cursor = 0
    while True:
        cursor_reply, items = client.execute_command(
            "JSCAN", cursor, "COUNT", part.batch_size, "QUEUE", part.queue, "STATE", "queued",
            "REPLY", "all")
        for item in items:
            info = dict(zip(item[0::2], item[1::2], strict=True))
            body = info.get(b"body")
            if body is None:
                continue
            jobs.append(Job(info[b"queue"].decode("utf-8", "surrogateescape"),
                            info[b"id"].decode(), body, int(info.get(b"nacks") or 0),
                            int(info.get(b"additional-deliveries") or 0)))
            headers.append(info.get(b"headers") or [])
            key = info.get(b"group")
            keys.append(key)
            positions.append(None if key is None else int(info[b"ctime"]))
            if part.max_jobs is not None and len(jobs) >= part.max_jobs:
                return table()
        cursor = int(cursor_reply)
        if cursor == 0:
            return table()
