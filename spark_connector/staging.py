"""Durable staging of fetched jobs: what makes a replayed batch identical.

Layout under ``stagingPath`` (one directory, or key prefix, per streaming
query; :mod:`.stores` says which storage it may be on)::

    batch-000000000042/
        plan.json           the batch exists once this file exists
        part-00000.arrow    staged jobs (Arrow IPC stream, zstd on remote stores),
                            immutable once named
        lease.json          until when the driver's last heartbeat kept the jobs
                            leased (written by each heartbeat round)
    acked.json              the last batch acknowledged

Every file appears whole or not at all (:meth:`.Store.write`): a crash
leaves either the complete file or no file, never a torn one.

* Driver fetch mode writes the part file(s) first and ``plan.json`` last:
  ``plan.json`` is the commit point of the batch.
* Executor fetch mode writes ``plan.json`` first (which node / queues / how
  many jobs each partition fetches); each Spark task later creates its own
  part file with :meth:`StagingArea.publish_part`, which refuses to replace
  an existing one, so the first attempt to finish wins and a replay reads
  what it wrote.

A batch directory is removed once every job in it is acknowledged, and
``acked.json`` names it: a restarted driver tells a batch acknowledged (and
removed) from one whose staging was lost.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from .schema import concat_staged, schema_of
from .stores import Store, open_store

__all__ = ["StagingArea", "BatchPlan", "LEASE_UNTIL", "lease_until_ms", "table_buffer",
           "table_from", "wall_clock_ms"]

PLAN = "plan.json"
ACKED = "acked.json"
LEASE = "lease.json"
#: Part-file metadata key: when the part's first job is due again (Unix
#: time in ms, "never" for RETRY 0 only), as the node said (WITHLEASE).
#: Wall-clock, not monotonic: executors may run on other machines, and a
#: restarted driver compares it with its own clock.
LEASE_UNTIL = "disque.lease_until_ms"
#: The one part file of a batch fetched on the driver.
DRIVER_PART = "part-00000.arrow"
_BATCH_PREFIX = "batch-"


def table_buffer(table: pa.Table, compression: str | None = None) -> memoryview:
    """A staged table as an Arrow IPC stream (its metadata, e.g. the node an
    executor task fetched from, kept; its ``headers`` and group columns
    when it has them), ``compression`` an IPC codec or None (or one this pyarrow was
    built without).

    Uncompressed, it is written once into a buffer of its exact size: a
    growing buffer then a copy to ``bytes`` would touch a batch's megabytes
    three times (fresh pages, each a fault, cost more than the copies).
    """
    schema = schema_of(table).with_metadata(
        table.schema.metadata or {})
    if compression is not None and pa.Codec.is_available(compression):
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression=compression)
        with pa.ipc.new_stream(sink, schema, options=options) as writer:
            writer.write_table(table)
        return memoryview(sink.getvalue())
    size = pa.MockOutputStream()
    with pa.ipc.new_stream(size, schema) as writer:
        writer.write_table(table)
    buffer = pa.allocate_buffer(size.size())
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(buffer), schema) as writer:
        writer.write_table(table)
    return memoryview(buffer)


def wall_clock_ms(monotonic_at: float) -> str:
    """A time.monotonic() instant as Unix ms (``never`` for ``inf``)."""
    if math.isinf(monotonic_at):
        return "never"
    return str(int((time.time() + monotonic_at - time.monotonic()) * 1000))


def lease_until_ms(table: pa.Table) -> float | None:
    """A staged part's LEASE_UNTIL (Unix ms; ``inf``: never; None: not said)."""
    value = (table.schema.metadata or {}).get(LEASE_UNTIL.encode())
    if value is None:
        return None
    if value == b"never":
        return math.inf
    try:
        return float(int(value))
    except ValueError:
        return None


def table_from(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.BufferReader(data)).read_all()


@dataclass
class BatchPlan:
    """What ``plan.json`` says about one staged batch."""

    seq: int
    mode: str                                  # "driver" or "executor"
    #: driver mode: [{"file": name, "rows": n}]; executor mode:
    #: [{"file": name, "node": "host:port", "queues": [...], "count": n}]
    parts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"seq": self.seq, "mode": self.mode, "parts": self.parts})

    @classmethod
    def from_json(cls, text: str | bytes) -> BatchPlan:
        data = json.loads(text)
        return cls(int(data["seq"]), str(data["mode"]), list(data["parts"]))

    @property
    def jobs(self) -> int:
        """Jobs staged (driver mode) or planned (executor mode)."""
        return sum(int(p.get("rows", p.get("count", 0))) for p in self.parts)


def batch_name(seq: int) -> str:
    return f"{_BATCH_PREFIX}{seq:012d}"


def _seq_of(name: str) -> int | None:
    if name.startswith(_BATCH_PREFIX):
        with contextlib.suppress(ValueError):
            return int(name[len(_BATCH_PREFIX):])
    return None


class StagingArea:
    """The staged batches of one query, on the store ``stagingPath`` names."""

    def __init__(self, store: Store | str | os.PathLike[str]) -> None:
        self.store = store if isinstance(store, Store) else open_store(os.fspath(store))

    @classmethod
    def open(cls, uri: str, options: Mapping[str, str] = {}) -> StagingArea:
        return cls(open_store(uri, options))

    @property
    def root(self) -> str:
        """The staging URI, for messages."""
        return self.store.uri

    def ensure(self) -> None:
        """Fail now, naming ``stagingPath``, if the store cannot be written."""
        self.store.check()

    def _key(self, seq: int, name: str) -> str:
        return f"{batch_name(seq)}/{name}"

    def has_batch(self, seq: int) -> bool:
        return self.store.exists(self._key(seq, PLAN))

    def batches(self) -> list[int]:
        """Sequence numbers of the batches that exist (have a plan), ascending."""
        found = [seq for seq in map(_seq_of, self.store.children()) if seq is not None]
        return sorted(seq for seq in found if self.has_batch(seq))

    def abandoned(self) -> list[int]:
        """Batch directories without a plan: a crash before the batch existed."""
        found = [seq for seq in map(_seq_of, self.store.children()) if seq is not None]
        return sorted(seq for seq in found if not self.has_batch(seq))

    def plan(self, seq: int) -> BatchPlan:
        data = self.store.read(self._key(seq, PLAN))
        if data is None:
            raise FileNotFoundError(f"{self.root}: batch {seq} has no {PLAN}")
        return BatchPlan.from_json(data)

    def stage_driver_batch(self, seq: int, table: pa.Table) -> BatchPlan:
        """Durably stage jobs fetched on the driver as batch ``seq``."""
        self.store.write(self._key(seq, DRIVER_PART),
                         table_buffer(table, self.store.compression))
        return self._commit_driver_batch(seq, table.num_rows)

    def promote_driver_part(self, seq: int) -> bool:
        """Finish a driver batch whose part file was named but whose plan was not.

        The part appeared whole, so it is complete: only the commit point is
        missing.  False if there is no part (nothing was staged).
        """
        data = self.store.read(self._key(seq, DRIVER_PART))
        if data is None:
            return False
        self._commit_driver_batch(seq, table_from(data).num_rows)
        return True

    def _commit_driver_batch(self, seq: int, rows: int) -> BatchPlan:
        plan = BatchPlan(seq, "driver", [{"file": DRIVER_PART, "rows": rows}])
        self.store.write(self._key(seq, PLAN), plan.to_json().encode())
        return plan

    def stage_executor_plan(self, seq: int, parts: list[dict[str, Any]]) -> BatchPlan:
        plan = BatchPlan(seq, "executor", parts)
        self.store.write(self._key(seq, PLAN), plan.to_json().encode())
        return plan

    def read_part(self, seq: int, name: str) -> pa.Table | None:
        data = self.store.read(self._key(seq, name))
        return None if data is None else table_from(data)

    def publish_part(self, seq: int, name: str, table: pa.Table) -> bool:
        """Create part ``name`` of batch ``seq`` unless it exists; True if we did.

        First writer wins, even between processes on different hosts
        (speculative or retried task attempts): :meth:`.Store.create`.
        """
        return self.store.create(self._key(seq, name),
                                 table_buffer(table, self.store.compression))

    def read_parts(self, seq: int, skip: Container[str] = ()) -> Iterator[tuple[str, pa.Table]]:
        """The part files of batch ``seq`` that exist now, except those named in ``skip``."""
        plan = self.plan(seq)
        for part in plan.parts:
            if part["file"] in skip:
                continue
            table = self.read_part(seq, part["file"])
            if table is not None:
                yield part["file"], table

    def read_batch(self, seq: int) -> pa.Table:
        """Every job staged for batch ``seq`` so far, as one table."""
        return self.read_batch_and_lease(seq)[0]

    def read_batch_and_lease(self, seq: int) -> tuple[pa.Table, float | None]:
        """:meth:`read_batch`, and when the first of its jobs was due again
        as staged (the soonest LEASE_UNTIL of its parts, Unix ms; None: no
        part said)."""
        tables = [table for _, table in self.read_parts(seq)]
        leases = [lease for lease in map(lease_until_ms, tables) if lease is not None]
        return concat_staged(tables), min(leases, default=None)

    def record_lease(self, seq: int, until_ms: int, retry_s: int) -> None:
        """A heartbeat kept batch ``seq``'s jobs leased until ``until_ms`` (Unix
        ms; ``retry_s``, their smallest RETRY): what a restarted driver
        compares with its clock."""
        self.store.write(self._key(seq, LEASE), json.dumps(
            {"until_ms": until_ms, "retry_s": retry_s}).encode())

    def lease(self, seq: int) -> tuple[int, int] | None:
        """``(until_ms, retry_s)`` of the last heartbeat recorded for ``seq``."""
        data = self.store.read(self._key(seq, LEASE))
        if data is None:
            return None
        try:
            record = json.loads(data)
            return int(record["until_ms"]), int(record["retry_s"])
        except (ValueError, KeyError, TypeError):
            return None

    def remove(self, seq: int) -> None:
        self.store.remove_tree(batch_name(seq))

    def acked_through(self) -> int | None:
        """The last batch acknowledged (None: none yet, or ``acked.json`` lost)."""
        data = self.store.read(ACKED)
        return None if data is None else int(json.loads(data)["batch"])

    def record_acked(self, seq: int) -> None:
        self.store.write(ACKED, json.dumps({"batch": seq}).encode())
