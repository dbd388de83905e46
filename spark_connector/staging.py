"""Durable staging of fetched jobs: what makes a replayed batch identical.

Layout under ``stagingPath`` (one directory per streaming query)::

    batch-000000000042/
        plan.json           the batch exists once this file exists
        part-00000.arrow    staged jobs (Arrow IPC stream), immutable once named

Every file is written to a temporary name, fsync'ed, and then given its final
name atomically; the directory is fsync'ed after.  A crash therefore leaves
either the complete file or no file, never a torn one.

* Driver fetch mode writes the part file(s) first and ``plan.json`` last:
  ``plan.json`` is the commit point of the batch.
* Executor fetch mode writes ``plan.json`` first (which node / queues / how
  many jobs each partition fetches); each Spark task later creates its own
  part file with :func:`publish_part`, which refuses to replace an existing
  one, so the first attempt to finish wins and a replay reads what it wrote.

A batch directory is removed once every job in it is acknowledged.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc

from .schema import STAGED_SCHEMA, empty_table

__all__ = ["StagingArea", "BatchPlan", "write_table", "read_table", "publish_part"]

PLAN = "plan.json"
#: The one part file of a batch fetched on the driver.
DRIVER_PART = "part-00000.arrow"
_BATCH_PREFIX = "batch-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(directory: Path, data_writer: Any) -> Path:
    """Write via ``data_writer(file)`` to a fsync'ed temporary file in ``directory``."""
    tmp = directory / f".tmp-{uuid.uuid4().hex}"
    with open(tmp, "wb") as handle:
        data_writer(handle)
        handle.flush()
        os.fsync(handle.fileno())
    return tmp


def _write_arrow(table: pa.Table) -> Any:
    # The table's metadata (e.g. the node an executor task fetched from) is kept.
    schema = STAGED_SCHEMA.with_metadata(table.schema.metadata or {})

    def write(handle: Any) -> None:
        with pa.ipc.new_stream(handle, schema) as writer:
            writer.write_table(table)
    return write


def write_table(path: Path, table: pa.Table) -> None:
    """Atomically create or replace ``path`` with ``table``."""
    tmp = _write_temp(path.parent, _write_arrow(table))
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def publish_part(path: Path, table: pa.Table) -> bool:
    """Create ``path`` holding ``table`` unless it exists; True if we created it.

    ``os.link`` fails when the target exists, which makes "first writer wins"
    atomic even between two processes (speculative or retried task attempts).
    """
    tmp = _write_temp(path.parent, _write_arrow(table))
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    _fsync_dir(path.parent)
    return True


def read_table(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_stream(source).read_all()


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
    def from_json(cls, text: str) -> BatchPlan:
        data = json.loads(text)
        return cls(int(data["seq"]), str(data["mode"]), list(data["parts"]))


class StagingArea:
    """The staged batches of one query, on a local or shared filesystem."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def ensure(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise PermissionError(f"staging path {self.root} is not writable")

    def batch_dir(self, seq: int) -> Path:
        return self.root / f"{_BATCH_PREFIX}{seq:012d}"

    def batches(self) -> list[int]:
        """Sequence numbers of the batches that exist (have a plan), ascending."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            if entry.name.startswith(_BATCH_PREFIX) and (entry / PLAN).exists():
                with contextlib.suppress(ValueError):
                    found.append(int(entry.name[len(_BATCH_PREFIX):]))
        return sorted(found)

    def abandoned_dirs(self) -> Iterator[Path]:
        """Batch directories without a plan: a crash before the batch existed."""
        if not self.root.is_dir():
            return
        for entry in self.root.iterdir():
            if entry.name.startswith(_BATCH_PREFIX) and not (entry / PLAN).exists():
                yield entry

    def plan(self, seq: int) -> BatchPlan:
        return BatchPlan.from_json((self.batch_dir(seq) / PLAN).read_text())

    def stage_driver_batch(self, seq: int, table: pa.Table) -> BatchPlan:
        """Durably stage jobs fetched on the driver as batch ``seq``."""
        directory = self.batch_dir(seq)
        directory.mkdir(exist_ok=True)
        write_table(directory / DRIVER_PART, table)
        return self._commit_driver_batch(seq, table.num_rows)

    def promote_driver_part(self, seq: int) -> bool:
        """Finish a driver batch whose part file was named but whose plan was not.

        The part was renamed into place, so it is complete: only the commit
        point is missing.  False if there is no part (nothing was staged).
        """
        part = self.batch_dir(seq) / DRIVER_PART
        if not part.exists():
            return False
        self._commit_driver_batch(seq, read_table(part).num_rows)
        return True

    def _commit_driver_batch(self, seq: int, rows: int) -> BatchPlan:
        plan = BatchPlan(seq, "driver", [{"file": DRIVER_PART, "rows": rows}])
        self._write_plan(self.batch_dir(seq), plan)
        return plan

    def stage_executor_plan(self, seq: int, parts: list[dict[str, Any]]) -> BatchPlan:
        directory = self.batch_dir(seq)
        directory.mkdir(exist_ok=True)
        plan = BatchPlan(seq, "executor", parts)
        self._write_plan(directory, plan)
        return plan

    def _write_plan(self, directory: Path, plan: BatchPlan) -> None:
        tmp = _write_temp(directory, lambda h: h.write(plan.to_json().encode()))
        os.replace(tmp, directory / PLAN)
        _fsync_dir(directory)
        _fsync_dir(self.root)

    def part_path(self, seq: int, name: str) -> Path:
        return self.batch_dir(seq) / name

    def read_parts(self, seq: int, skip: Container[str] = ()) -> Iterator[tuple[str, pa.Table]]:
        """The part files of batch ``seq`` that exist now, except those named in ``skip``."""
        plan = self.plan(seq)
        for part in plan.parts:
            if part["file"] in skip:
                continue
            path = self.part_path(seq, part["file"])
            if path.exists():
                yield part["file"], read_table(path)

    def read_batch(self, seq: int) -> pa.Table:
        """Every job staged for batch ``seq`` so far, as one table."""
        return pa.concat_tables([empty_table(),
                                 *(table for _, table in self.read_parts(seq))])

    def remove(self, seq: int) -> None:
        shutil.rmtree(self.batch_dir(seq), ignore_errors=True)
