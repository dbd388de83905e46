"""What travels from the driver to an executor task: one Spark partition of a batch.

Driver fetch mode ships the staged rows themselves (:class:`StagedPartition`),
so executors need no access to ``stagingPath``.  The rows are Arrow IPC,
zstd-compressed, and a batch is cut so that no task carries more than
:data:`MAX_PAYLOAD_BYTES`: Spark warns about tasks over 1000 KiB, and a
large task slows the scheduler, which sends it whole to one executor.

Executor fetch mode ships only what to fetch (:class:`FetchPartition`):
the task fetches from its node and publishes a part file itself
(:mod:`.executor_read`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from .options import ConnectionConfig
from .schema import to_rows

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["StagedPartition", "FetchPartition", "MAX_PAYLOAD_BYTES", "staged_partitions",
           "record_batches"]

#: The most rows one driver-mode task carries, compressed (Spark warns over 1000 KiB).
MAX_PAYLOAD_BYTES = 768 * 1024
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")



@dataclass
class StagedPartition(InputPartition):
    """Driver fetch mode: the rows themselves, as Arrow IPC bytes.

    Shipping the rows inside the partition means executors need no access
    to ``stagingPath``: it only has to be durable for the driver.
    """

    seq: int
    arrow_ipc: bytes


@dataclass
class FetchPartition(InputPartition):
    """Executor fetch mode: fetch from one node into one staged part file.

    ``fallbacks`` are the batch's other nodes, tried in order when ``node``
    does not answer: any node serves any queue (federation), and a task
    that waits for a dead node holds the whole batch up.
    """

    seq: int
    staging_path: str
    file: str
    node: str
    queues: tuple[str, ...]
    count: int
    connection: ConnectionConfig
    batch_size: int
    fallbacks: tuple[str, ...] = ()
    #: The ``staging.*`` options: how executors open ``staging_path``.
    staging_options: tuple[tuple[str, str], ...] = ()
    #: ``includeHeaders``: fetch and stage the jobs' headers.
    include_headers: bool = False
    #: ``telemetrySetup``, called in the task's Python worker before a span.
    telemetry_setup: str | None = None
    #: ``includeGroups``: fetch and stage the jobs' group keys and positions.
    include_groups: bool = False



def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _slices(table: pa.Table, splits: int) -> list[bytes]:
    rows = table.num_rows
    step = math.ceil(rows / splits)
    return [_ipc_bytes(table.slice(offset, step)) for offset in range(0, rows, step)]


def staged_partitions(seq: int, table: pa.Table, *, at_least: int,
                      rows_per_partition: int) -> list[StagedPartition]:
    """Batch ``seq``'s rows in partitions: at least ``at_least`` of them, each
    at most ``rows_per_partition`` rows and :data:`MAX_PAYLOAD_BYTES`."""
    rows = table.num_rows
    if rows == 0:
        return []
    splits = max(1, min(rows, max(at_least, math.ceil(rows / rows_per_partition))))
    payloads = _slices(table, splits)
    largest = max(map(len, payloads))
    if largest > MAX_PAYLOAD_BYTES and splits < rows:
        # Large bodies: cut again by size (compression makes it a guess; 10 % margin).
        splits = min(rows, math.ceil(splits * largest * 1.1 / MAX_PAYLOAD_BYTES))
        payloads = _slices(table, splits)
    return [StagedPartition(seq, payload) for payload in payloads]


def record_batches(staged: pa.Table, schema: StructType) -> Iterator[pa.RecordBatch]:
    if staged.num_rows:
        yield from to_rows(staged, schema).combine_chunks().to_batches()
