"""A plain Python worker (no Spark): the standalone way to consume a queue.

The loop every Disque consumer should have:

* ``GETJOB ... WITHCOUNTERS`` a few jobs at a time, blocking with a timeout;
* while a job is processed, a heartbeat thread sends ``WORKING`` every third
  of the job's RETRY, so a slow job is not delivered to someone else;
* ``ACKJOB`` on success; ``NACK`` on failure, which queues the job again at
  once and counts a failed attempt (``nacks``);
* dead letters: a job that already failed ``--max-attempts`` times is not
  processed again but moved to ``<queue>-dead`` (ADDJOB there, then ACK the
  original), as the Disque README suggests with its counters.
  ``additional_deliveries`` (lost leases, node restarts) is reported but not
  held against the job: it was not the job's fault.
* or, with ``--server-dead-letters``, the node does it (this server's
  extension, docs/EXTENSIONS.md): jobs added with ``MAXDELIVERIES n``
  (``add_job(..., max_deliveries=n, backoff=s)``) are moved by the node to
  their dead-letter queue (``<queue>:dead`` by default) at the re-queue
  after their n-th delivery, same job ID; the worker only NACKs, with
  ``--nack-delay S`` (``NACK ... DELAY``) or the job's BACKOFF spacing the
  attempts, and reports the queue's ``dead-lettered`` count (QSTAT).

    python -m jobs.worker --queue orders
    python -m jobs.worker --queue orders --idle-exit 5 --max-attempts 3
    python -m jobs.worker --queue orders --server-dead-letters --nack-delay 10
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from disque.client import Client, Job
from disque.exceptions import DisqueError

from ._common import DEFAULT_NODES

log = logging.getLogger("jobs.worker")


class Heartbeat:
    """Sends WORKING for one job until stopped; learns the period from the reply."""

    def __init__(self, client: Client, job_id: str) -> None:
        self._client = client
        self._job_id = job_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        period = 0.0  # first WORKING right away: its reply is the job's RETRY
        while not self._stop.wait(period):
            try:
                retry = self._client.working(self._job_id)
            except DisqueError as exc:  # TOOLATE, NOJOB, node gone: lease is lost
                log.warning("job %s: heartbeat refused (%s)", self._job_id, exc)
                return
            if retry <= 0:
                return  # RETRY 0: never redelivered, nothing to renew
            period = max(0.2, retry / 3)


@dataclass
class Stats:
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0


def process_order(job: Job) -> None:
    """The work. Here: validate an order event; raise to fail the attempt."""
    event = json.loads(job.body)
    if float(event["amount"]) < 0:
        raise ValueError(f"negative amount in order {event.get('order_id')}")


def run(client: Client, heartbeat_client: Client, queue: str, handler: Callable[[Job], None],
        *, max_attempts: int = 3, dead_letter: str | None = None, idle_exit: float | None = None,
        max_jobs: int | None = None, batch: int = 10, server_dead_letters: bool = False,
        nack_delay: int | None = None) -> Stats:
    """Consume ``queue`` until idle for ``idle_exit`` seconds or ``max_jobs`` handled.

    ``server_dead_letters``: the node dead-letters jobs (MAXDELIVERIES), the
    worker never does; ``nack_delay``: seconds before a failed job is
    delivered again (None: at once, or after the job's BACKOFF).
    """
    dead_letter = dead_letter or f"{queue}-dead"
    stats = Stats()
    idle_since = time.monotonic()
    while max_jobs is None or stats.acked + stats.nacked + stats.dead_lettered < max_jobs:
        jobs = client.get_jobs(queue, count=batch, timeout_ms=1000, with_counters=True)
        if not jobs:
            if idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
                break
            continue
        idle_since = time.monotonic()
        for job in jobs:
            if not server_dead_letters and (job.nacks or 0) >= max_attempts:
                # Dead letter: keep the body, say why; ACK only after the copy exists.
                # A week to look at it (the default TTL is a day).
                client.add_job(dead_letter, job.body, ttl=7 * 24 * 3600)
                client.ack(job.id)
                stats.dead_lettered += 1
                log.warning("job %s failed %d times: moved to %s", job.id, job.nacks,
                            dead_letter)
                continue
            try:
                with Heartbeat(heartbeat_client, job.id):
                    handler(job)
            except Exception as exc:
                client.nack(job.id, delay=nack_delay)
                stats.nacked += 1
                log.info("job %s failed (attempt %d): %s", job.id, (job.nacks or 0) + 1, exc)
            else:
                client.ack(job.id)
                stats.acked += 1
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default=DEFAULT_NODES, help="Disque nodes, host:port,...")
    parser.add_argument("--queue", default="orders")
    parser.add_argument("--dead-letter", default=None, help="default: <queue>-dead")
    parser.add_argument("--max-attempts", type=int, default=3,
                        help="failed attempts (NACKs) before a job is dead-lettered")
    parser.add_argument("--server-dead-letters", action="store_true",
                        help="leave dead letters to the node (jobs added with MAXDELIVERIES)")
    parser.add_argument("--nack-delay", type=int, default=None,
                        help="seconds before a failed job is delivered again (NACK ... DELAY)")
    parser.add_argument("--idle-exit", type=float, default=None,
                        help="exit after this many seconds without jobs (default: never)")
    parser.add_argument("--max-jobs", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    with Client(args.nodes) as client, Client(args.nodes) as heartbeat_client:
        try:
            stats = run(client, heartbeat_client, args.queue, process_order,
                        max_attempts=args.max_attempts, dead_letter=args.dead_letter,
                        idle_exit=args.idle_exit, max_jobs=args.max_jobs,
                        server_dead_letters=args.server_dead_letters,
                        nack_delay=args.nack_delay)
        except KeyboardInterrupt:
            print("interrupted: jobs in hand will be redelivered after their RETRY")
            return
        if args.server_dead_letters:
            # Counted by the node that moved them (QSTAT is per node).
            stats.dead_lettered = int((client.qstat(args.queue) or {}).get("dead-lettered", 0))
    print(f"acked {stats.acked}, nacked {stats.nacked}, dead-lettered {stats.dead_lettered}")


if __name__ == "__main__":
    main()
