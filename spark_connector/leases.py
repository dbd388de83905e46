"""Keeping staged jobs leased: WORKING heartbeats from a driver thread.

A job handed out by GETJOB is queued again by its node after RETRY seconds
unless somebody acknowledges it or sends WORKING.  Between staging a batch and
acknowledging it Spark may take a long time (a slow sink, a restart), so the
driver keeps every staged, unacknowledged job leased: it sends WORKING
halfway to the moment the first of a batch's jobs would be queued again
(our nodes say when, ``GETJOB ... WITHLEASE``; for an original node it
assumes the smallest possible RETRY, 1 s unless the ``minJobRetry`` option
says more), and then again after a third of the smallest RETRY the WORKING
replies report.  A batch acknowledged before its first heartbeat costs none.
Jobs with RETRY 0 are never queued again and need no heartbeat.

When the job's own node refuses a heartbeat the lease is lost and the job
will be queued again: ``NOJOB`` (the job is gone: TTL expired, or it was
acknowledged elsewhere) and ``TOOLATE`` (more than half the TTL elapsed, the
node refuses to postpone).  Those jobs are counted in ``leases_lost`` and
logged; their next delivery has ``additional_deliveries`` > 0.  Only the
job's own node's answer counts: ``working_many`` sends each ID to the node
named in it, and answers ``ConnectionFailed`` in place for a job whose node
could not be asked (another node's NOJOB says nothing about a job it holds
no copy of).  Those jobs are tried again at the next heartbeat, as are all
the jobs of a round that failed as a whole (no node reachable).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from disque.exceptions import Acked, ConnectionFailed, DisqueError, NoJob, TooLate

__all__ = ["COPY_SKEW_S", "LeaseKeeper"]

log = logging.getLogger("spark_connector.leases")

#: Heartbeat at this fraction of the job's RETRY: two more tries fit before
#: the lease expires if one heartbeat is delayed or fails.
RENEW_FRACTION = 1 / 3
#: Never heartbeat more often than this, even for RETRY 1 jobs.
MIN_INTERVAL_S = 0.2
#: A node's WITHLEASE answer is its own copy's requeue time; another node
#: holding a copy may queue it up to this much earlier (it sends WILLQUEUE
#: 500 ms ahead, and each node adds up to 500 ms of jitter).
COPY_SKEW_S = 1.0


@dataclass
class _Lease:
    ids: list[str]
    due: float = 0.0                      # monotonic time of the next heartbeat
    interval: float | None = None         # learned from WORKING replies
    lost: set[str] = field(default_factory=set)
    #: Counted in leases_lost already (a restart found their lease ran out):
    #: a later refusal of the same job is not a second loss.
    counted: set[str] = field(default_factory=set)


class LeaseKeeper:
    """Background WORKING heartbeats for the jobs of staged batches.

    ``discover`` is called on every tick before renewing, to pick up jobs
    staged by someone else (executor fetch mode) while Spark runs the batch.

    ``working`` is the bulk WORKING call (``Client.working_many``: WORKINGS,
    or pipelined WORKINGs on an original node); it is
    only ever called from the keeper's own thread, so the caller can give the
    keeper a client of its own and never contend with the fetching thread.
    """

    def __init__(self, working: Callable[[list[str]], list[int | DisqueError]], *,
                 interval_s: float | None = None, tick_s: float = 0.25,
                 clock: Callable[[], float] = time.monotonic,
                 discover: Callable[[], None] | None = None,
                 renewed: Callable[[int, int, float], None] | None = None) -> None:
        self._working = working
        self._discover = discover
        #: Called (seq, smallest RETRY answered, Unix time the WORKING went
        #: out) after a heartbeat round renewed batch ``seq``: the driver
        #: records how long it is leased.
        self._renewed = renewed
        self._fixed_interval = interval_s
        self._tick = tick_s
        self._clock = clock
        self._leases: dict[int, _Lease] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self.heartbeats_sent = 0
        self.leases_lost = 0

    # -------------------------------------------------------------- API

    def hold(self, seq: int, ids: Iterable[str], *, start: bool = True,
             first_after_s: float = 0.0) -> None:
        """Start (or extend) leasing the jobs of batch ``seq``.

        The first WORKING goes out after ``first_after_s``: jobs just
        delivered are safe for their RETRY (at least 1 s), so a batch
        acknowledged sooner than that never costs a heartbeat.  Jobs of
        unknown age (recovery) use 0.  ``start=False`` leaves the thread
        alone: the caller renews itself first and calls :meth:`start` after.
        """
        ids = list(ids)
        if not ids:
            return
        due = self._clock() + first_after_s if first_after_s > 0 else 0.0
        with self._lock:
            lease = self._leases.get(seq)
            if lease is None:
                self._leases[seq] = _Lease(ids, due=due)
            else:
                known = set(lease.ids)
                lease.ids.extend(i for i in ids if i not in known)
                lease.due = min(lease.due, due)
        if start:
            self.start()

    def count_lost(self, seq: int) -> int:
        """Count every job of batch ``seq`` as a lost lease (its lease ran out
        while no heartbeat could be sent); returns how many.  They are still
        heartbeat: WORKING takes back a job nobody fetched meanwhile."""
        with self._lock:
            lease = self._leases.get(seq)
            if lease is None:
                return 0
            fresh = [i for i in lease.ids if i not in lease.counted and i not in lease.lost]
            lease.counted.update(fresh)
            self.leases_lost += len(fresh)
            return len(fresh)

    def start(self) -> None:
        """Run the heartbeat thread (idempotent)."""
        self._ensure_thread()
        self._wake.set()

    def release_through(self, seq: int) -> list[int]:
        """Stop leasing every batch <= ``seq`` (about to be acknowledged)."""
        with self._lock:
            done = [s for s in self._leases if s <= seq]
            for s in done:
                del self._leases[s]
        return done

    def held(self) -> dict[int, int]:
        with self._lock:
            return {seq: len(lease.ids) for seq, lease in self._leases.items()}

    def next_heartbeat_in(self, seq: int) -> float | None:
        """Seconds until batch ``seq``'s next WORKING (``inf``: none needed,
        ``None``: not held); negative when it is overdue."""
        with self._lock:
            lease = self._leases.get(seq)
            return None if lease is None else lease.due - self._clock()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # --------------------------------------------------------- the thread

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="disque-lease-keeper",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                if self._discover is not None:
                    self._discover()  # jobs staged by executors since the last tick
                self.renew_due()
            except DisqueError as exc:  # node unreachable: try again next tick
                log.warning("WORKING heartbeats failed, will retry: %s", exc)
            except Exception:  # never let the keeper die silently
                log.exception("lease keeper error")
            self._wake.wait(self._tick)
            self._wake.clear()

    def renew_due(self) -> int:
        """Send WORKING for every batch whose heartbeat is due; returns how many IDs."""
        now = self._clock()
        with self._lock:
            due = [(seq, lease) for seq, lease in self._leases.items() if lease.due <= now]
            for _, lease in due:  # claimed: a concurrent call skips them
                lease.due = float("inf")
        sent = 0
        for n, (seq, lease) in enumerate(due):
            ids = [i for i in lease.ids if i not in lease.lost]
            if not ids:
                continue
            sent_at = time.time()
            try:
                replies = self._working(ids)
            except BaseException:
                # No node answered: this batch and the ones not reached yet
                # are due again at the next tick, not never.
                with self._lock:
                    for _, unsent in due[n:]:
                        unsent.due = min(unsent.due, self._clock() + self._tick)
                raise
            sent += len(ids)
            retries = []
            refused: list[tuple[str, BaseException]] = []
            unanswered = 0
            for job_id, reply in zip(ids, replies, strict=True):
                if isinstance(reply, int):
                    if reply > 0:
                        retries.append(reply)
                elif isinstance(reply, NoJob | TooLate | Acked):
                    refused.append((job_id, reply))
                elif isinstance(reply, ConnectionFailed):
                    unanswered += 1  # its node could not be asked: next heartbeat
                elif isinstance(reply, Exception):
                    raise reply
            if unanswered:
                log.warning("WORKING for %d jobs of batch %d did not reach their node; "
                            "tried again at the next heartbeat", unanswered, seq)
            with self._lock:
                if self._leases.get(seq) is not lease:
                    # Released (acknowledged) while the heartbeat was in
                    # flight: NOJOB/ACKED answers are the ACK, not a loss.
                    continue
                for job_id, refusal in refused:
                    lease.lost.add(job_id)
                    if job_id in lease.counted:
                        continue  # counted when the restart found its lease ran out
                    self.leases_lost += 1
                    log.warning("lease on job %s of batch %d lost (%s): the node may "
                                "deliver it again", job_id, seq, refusal)
                renewed = bool(retries) and self._renewed is not None
                if self._fixed_interval is not None:
                    lease.interval = self._fixed_interval
                elif retries:
                    lease.interval = max(MIN_INTERVAL_S, min(retries) * RENEW_FRACTION)
                if lease.interval is None and unanswered:
                    lease.due = self._clock() + MIN_INTERVAL_S * 5  # no RETRY learned yet
                elif lease.interval is None:  # RETRY 0 everywhere: nothing to renew
                    lease.due = float("inf")
                else:
                    lease.due = self._clock() + lease.interval
            if renewed and self._renewed is not None:
                self._renewed(seq, min(retries), sent_at)
        self.heartbeats_sent += sent
        return sent
