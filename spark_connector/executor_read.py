"""Executor fetch mode, on the executor: fetch one partition's jobs and publish them.

A task fetches from its planned node (or a fallback), then publishes what
it got as the batch's part file with a first-writer-wins create
(:meth:`.StagingArea.publish_part`): when two attempts of a task run (a retry,
a speculative copy, a replay after a driver crash) exactly one part file
wins, the loser gives its jobs back (ENQUEUE) and returns the winner's
rows, so every attempt returns identical data.  The part file's metadata
tells the driver which node served it and until when its jobs are leased.
"""

from __future__ import annotations

import logging
import math
import socket
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from disque.exceptions import ConnectionFailed

from . import telemetry
from .fetch import empty_table, fetch_jobs
from .partitions import FetchPartition
from .staging import LEASE_UNTIL, StagingArea, wall_clock_ms

if TYPE_CHECKING:
    from disque.client import Client

__all__ = ["SERVED_BY", "LEASE_UNTIL", "fetch_or_replay", "publish_fetched", "seconds_left"]

log = logging.getLogger("spark_connector.executor_read")

#: Part-file metadata key: the node an executor task fetched the part from.
SERVED_BY = "disque.node"


def fetch_or_replay(part: FetchPartition) -> pa.Table:
    """Executor fetch mode: the part file if it exists, else fetch and publish it.

    Two attempts of the same task (a retry, a speculative copy, a replay
    after a driver crash) may both fetch; :meth:`.StagingArea.publish_part` lets exactly
    one create the file, and the loser puts what it fetched back in the
    queue (ENQUEUE: it never reached Spark, so it is not a failed attempt).
    """
    staging = staging_of(part)
    published = staging.read_part(part.seq, part.file)
    if published is not None:
        return published
    if not staging.has_batch(part.seq):
        # The driver staged the plan before any task ran: an executor that
        # does not see it does not share the driver's stagingPath, and the
        # driver would never see (nor acknowledge) what this task publishes.
        raise RuntimeError(
            f"disque source: batch {part.seq}'s plan is not visible under "
            f"{part.staging_path} from this executor ({socket.gethostname()}): with "
            "fetchMode=executor, stagingPath must be storage every node of the cluster "
            "sees (s3://..., an NFS mount); a local path works in local mode only")
    _check_publishable(part, staging)
    telemetry.setup(part.telemetry_setup)
    client = part.connection.client(node=part.node, client_name="spark-disque-fetch",
                                    fallbacks=part.fallbacks)
    try:
        metadata: dict[str, str] = {}
        try:
            fetched = fetch_jobs(client, part.queues, part.count, batch_size=part.batch_size,
                                 lease=True, headers=part.include_headers,
                                 groups=part.include_groups)
            table = fetched.table
            if fetched.lease_until is not None:
                metadata[LEASE_UNTIL] = wall_clock_ms(fetched.lease_until)
        except ConnectionFailed as exc:
            # No node answers: this part of the batch is empty, for good
            # (a replay must return the same rows), rather than failing the
            # whole query; the jobs wait on their node for the next batch.
            log.warning("batch %d %s: %s unreachable, part left empty: %s",
                        part.seq, part.file, part.node, exc)
            table = empty_table(part.include_headers, part.include_groups)
        # Which node served the part (the planned one, or a fallback): the
        # driver's per-node progress counts it there.
        metadata[SERVED_BY] = client.address or part.node
        table = table.replace_schema_metadata(metadata)
        try:
            return publish_fetched(part, client, table, staging)
        except BaseException:
            _give_back(part, client, table, staging)
            raise
    finally:
        client.close()
        telemetry.flush()


#: Staging URIs this process has published to (or probed): checked once per
#: Python worker, which Spark reuses for the tasks of many batches.
_publishable: set[str] = set()


def _check_publishable(part: FetchPartition, staging: StagingArea) -> None:
    """Fail the task before its first GETJOB if it could not publish what it fetched.

    A store the executor cannot create in (boto3 missing on this node,
    credentials or the bucket refused here) would otherwise fail the task
    after the fetch, and each attempt's jobs would stay leased until their
    RETRY.
    """
    if staging.root in _publishable:
        return
    try:
        staging.store.check_create()
    except Exception as exc:
        raise RuntimeError(
            f"disque source: batch {part.seq} {part.file}: this executor "
            f"({socket.gethostname()}) cannot publish to stagingPath; no job was fetched. "
            f"{exc}") from None
    _publishable.add(staging.root)


def _give_back(part: FetchPartition, client: Client, table: pa.Table,
               staging: StagingArea) -> None:
    """The task fails after its fetch: queue its jobs again (ENQUEUE) before it
    raises, unless its part file exists (then the driver leases and
    acknowledges them).  When that cannot be told, the jobs are left leased:
    they come back after their RETRY, never twice."""
    ids = table.column("id").to_pylist()
    if not ids:
        return
    try:
        if staging.read_part(part.seq, part.file) is not None:
            return
        client.enqueue(*ids)
    except Exception as exc:
        log.warning("batch %d %s: the task failed and its %d jobs could not be queued "
                    "again (%s): they come back after their RETRY",
                    part.seq, part.file, len(ids), exc)
        return
    log.warning("batch %d %s: the task failed after its fetch; its %d jobs were queued "
                "again", part.seq, part.file, len(ids))


def seconds_left(lease_until_ms: bytes | None) -> float | None:
    """Seconds until a part's LEASE_UNTIL (None: not given, ``inf``: never)."""
    if lease_until_ms is None:
        return None
    if lease_until_ms == b"never":
        return math.inf
    try:
        return int(lease_until_ms) / 1000 - time.time()
    except ValueError:
        return None


def staging_of(part: FetchPartition) -> StagingArea:
    return StagingArea.open(part.staging_path, dict(part.staging_options))


def publish_fetched(part: FetchPartition, client: Client, table: pa.Table,
                    staging: StagingArea | None = None) -> pa.Table:
    """Publish what this attempt fetched, or give it back if another attempt won."""
    staging = staging or staging_of(part)
    if staging.publish_part(part.seq, part.file, table):
        return table
    ids = table.column("id").to_pylist()
    if ids:
        client.enqueue(*ids)
        log.info("batch %d %s: another attempt won, re-queued %d jobs",
                 part.seq, part.file, len(ids))
    winner = staging.read_part(part.seq, part.file)
    assert winner is not None  # created by the attempt that won, never removed before ACK
    return winner
