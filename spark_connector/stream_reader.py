"""``spark.readStream.format("disque")``: the stream reader Spark calls.

Delivery contract (docs/SPARK.md explains it for users):

* An offset is ``{"batch": n, "jobs": k, ...}``: a batch sequence number,
  how many jobs the batch holds (for messages only; an offset without it
  reads as unknown), and the source's figures (:mod:`.progress`; read by
  nothing but the progress reports and a restarted driver).  Before offset n is
  returned, the jobs of batch n are durably staged under ``stagingPath``
  (see :mod:`.staging`), so a restarted query replays exactly that batch.
* Jobs are acknowledged only for batches Spark has committed: at the start
  of ``latestOffset(start)`` (Spark calls it only once the batch ending at
  ``start`` is in the commit log; it is the only hook that runs after the
  last batch of an availableNow run) and again, idempotently, in
  ``commit(end)``.  That last call of an availableNow run returns one empty
  batch, so that the run's final progress report shows the final ACK.
* Staged jobs that are not acknowledged yet are kept leased with WORKING
  heartbeats (:mod:`.leases`).
* ``fetchAhead`` (driver fetch mode, on by default): while Spark runs batch
  n, one background thread acknowledges batch n-1 (committed) and then
  fetches and stages batch n+1, so the next ``latestOffset`` returns at
  once.  The rules above hold unchanged: batch n+1 is staged (and leased)
  before its offset is returned, exactly as a batch staged just before a
  crash, which a restarted query reuses.  It is done only when batch n was
  full (a backlog), so a trickling queue still gets batches as large as
  they can be.  No GETJOB is ever sent before the ACKs of the committed
  batches are done (the node may have queued their jobs again, and would
  deliver them twice), and a fetch leaves out the jobs of every batch still
  held (see ``_fetch_ahead``).

Where the methods run (pyspark 4.3): ``initialOffset``, ``latestOffset``,
``partitions`` and ``commit`` in one long-lived Python process on the
driver; ``read`` on executors, on a *different* reader object, with only
what travels in the :class:`InputPartition`.  So everything driver-side
lives in :class:`.driver.DriverSide`, created on first use and never pickled, and
``read`` is a pure function of its partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from .options import DEFAULT_MAX_JOBS_PER_TRIGGER, SourceConfig
from .partitions import FetchPartition, StagedPartition, record_batches

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from .driver import DriverSide

__all__ = ["DisqueStreamReader"]


class DisqueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("disque")``: at-least-once, replayable batches."""

    def __init__(self, config: SourceConfig, schema: StructType) -> None:
        assert config.staging_path is not None
        self.config = config
        self.schema = schema
        self._driver: DriverSide | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get a pickled copy: the driver's clients, threads and
        # caches must not travel (and cannot be pickled).
        state = self.__dict__.copy()
        state["_driver"] = None
        return state

    @property
    def driver(self) -> DriverSide:
        if self._driver is None:
            from .driver import DriverSide

            self._driver = DriverSide(self.config)
        return self._driver

    # --------------------------------------------------------- driver side

    def initialOffset(self) -> dict:
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.config.min_jobs_per_trigger is not None:
            return ReadMinRows(self.config.min_jobs_per_trigger)
        return ReadMaxRows(self.config.max_jobs_per_trigger or DEFAULT_MAX_JOBS_PER_TRIGGER)

    def prepareForTriggerAvailableNow(self) -> None:
        self.driver.prepare_available_now()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        seq = self.driver.latest(int(start["batch"]), limit, start.get("jobs"), start)
        if seq == int(start["batch"]):
            return start  # no new batch: exactly the offset Spark gave
        # The count rides in Spark's offset log: a restarted query that finds
        # the batch's staging lost can say how many jobs come back.  The
        # figures ride along (progress.py): the batch's endOffset in the
        # progress reports, also when Spark replays it after a restart.
        figures = self.driver.metrics()
        del figures["batch"]
        return {"batch": seq, "jobs": self.driver.batch_jobs(seq), **figures}

    def reportLatestOffset(self) -> dict | None:
        # Shown as sources[0].latestOffset in query progress (null for a
        # batch replayed after a restart: Spark does not ask then).
        return self.driver.metrics()

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return self.driver.partitions(int(start["batch"]), int(end["batch"]), end.get("jobs"))

    def commit(self, end: dict) -> None:
        self.driver.commit(int(end["batch"]))

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None

    # ------------------------------------------------------- executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, StagedPartition):
            staged = pa.ipc.open_stream(partition.arrow_ipc).read_all()
        elif isinstance(partition, FetchPartition):
            from .executor_read import fetch_or_replay

            staged = fetch_or_replay(partition)
        else:
            raise TypeError(f"unexpected partition {partition!r}")
        return record_batches(staged, self.schema)
