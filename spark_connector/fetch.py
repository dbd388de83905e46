"""GETJOB into Arrow tables: the one fetch loop every read path shares."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from disque.exceptions import ConnectionFailed

from .schema import STAGED_SCHEMA

if TYPE_CHECKING:
    from disque.client import Client, Job

__all__ = ["fetch_table", "jobs_to_table", "empty_table"]

log = logging.getLogger("spark_connector.fetch")


def jobs_to_table(jobs: list[Job], fetched_at_us: int | None = None) -> pa.Table:
    """Staged-form table of ``jobs`` (counters must have been fetched)."""
    if fetched_at_us is None:
        fetched_at_us = time.time_ns() // 1000
    return pa.Table.from_arrays([
        pa.array([j.queue for j in jobs], pa.string()),
        pa.array([j.id for j in jobs], pa.string()),
        pa.array([j.body for j in jobs], pa.binary()),
        pa.array([j.nacks or 0 for j in jobs], pa.int64()),
        pa.array([j.additional_deliveries or 0 for j in jobs], pa.int64()),
        pa.array([fetched_at_us] * len(jobs), pa.timestamp("us", tz="UTC")),
    ], schema=STAGED_SCHEMA)


def empty_table() -> pa.Table:
    return STAGED_SCHEMA.empty_table()


def fetch_table(client: Client, queues: tuple[str, ...] | list[str], limit: int | None, *,
                batch_size: int, block_ms: int = 0) -> pa.Table:
    """Up to ``limit`` jobs (``None``: until the queues are empty), as a staged table.

    Only the first GETJOB may block, and for at most ``block_ms`` (0: never),
    so an idle queue costs one cheap command per call and a busy one is
    drained with back-to-back ``GETJOB NOHANG COUNT n`` round trips.
    """
    jobs: list[Job] = []
    first = True
    while limit is None or len(jobs) < limit:
        want = batch_size if limit is None else min(batch_size, limit - len(jobs))
        try:
            if first and block_ms > 0:
                got = client.get_jobs(*queues, count=want, timeout_ms=block_ms,
                                      with_counters=True)
            else:
                got = client.get_jobs(*queues, count=want, nohang=True, with_counters=True)
        except ConnectionFailed:
            if not jobs:
                raise
            # Keep what we hold: those jobs are leased to us and staging
            # them is better than letting them wait out their RETRY.
            log.warning("node lost after fetching %d jobs; keeping those", len(jobs))
            break
        first = False
        jobs.extend(got)
        if len(got) < want:
            break
    return jobs_to_table(jobs)
