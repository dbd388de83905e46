"""The stream reader's driver side: offsets, staging, recovery, leases and ACKs.

Spark calls ``initialOffset``, ``latestOffset``, ``partitions`` and
``commit`` in one long-lived Python process on the driver; this object
lives there, is created on first use and never pickled.  The delivery
contract it keeps is in :mod:`.stream_reader`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
)

from disque.exceptions import ConnectionFailed, DisqueError, NoPerm

from . import telemetry
from .ahead import FetchAhead
from .executor_read import SERVED_BY, seconds_left
from .fetch import (
    Fetched,
    binary_ids,
    count_nonzero,
    empty_table,
    fetch_jobs,
    groups_refused_error,
    headers_refused_error,
    supports_groups,
    supports_headers,
)
from .leases import COPY_SKEW_S, LeaseKeeper
from .logs import log_to_stderr
from .options import DEFAULT_MAX_JOBS_PER_TRIGGER, OptionError, SourceConfig
from .partitions import FetchPartition, staged_partitions
from .progress import Progress
from .staging import LEASE_UNTIL, StagingArea, lease_until_ms, wall_clock_ms
from .topology import NodeSet, check_reachable

__all__ = ["DriverSide"]

log = logging.getLogger("spark_connector.driver")


class DriverSide:
    """State and connections of the streaming reader on the driver."""

    def __init__(self, config: SourceConfig) -> None:
        assert config.staging_path is not None
        started = time.monotonic()
        self.config = config
        log_to_stderr(config.log_level)
        # This process makes the receive spans of driver fetch mode: the
        # user's OpenTelemetry set-up runs here once, first.
        telemetry.setup(config.telemetry_setup)
        # Before anything else (staging, leases): a wrong address fails the
        # query before its first batch, with an error naming the option.
        check_reachable(config)
        # The same for the staging store: an unknown scheme, a store that
        # cannot be reached, missing credentials.
        self.staging = StagingArea.open(config.staging_path, dict(config.staging_options))
        self.staging.ensure()
        if config.fetch_mode == "executor" and not self.staging.store.exclusive:
            raise OptionError(
                "fetchMode", f"executor needs a first-writer-wins create on stagingPath, "
                f"which the connector has for paths (local, NFS) and S3, not for "
                f"{self.staging.root}; use fetchMode=driver there")
        if config.fetch_mode == "executor":
            # What the tasks will do, once here: a missing boto3, bucket or
            # credentials fail the query now, not after tasks took jobs.
            self.staging.store.check_create()
        #: The cluster's nodes (seeds plus HELLO), one pinned client each.
        self.nodes = NodeSet(config.connection)
        if config.include_headers or config.include_groups:
            try:
                self._check_extensions()
            except OptionError:
                self.nodes.close()
                raise
        #: Nodes that refused the WITHHEADERS asked for tracing alone (an
        #: original node): their jobs' receive spans get no links.
        self._no_headers: set[str] = set()
        self._next_blocking = 0
        #: Nodes that refused GETJOB ... WITHLEASE (the original): their
        #: jobs' first heartbeat goes by minJobRetry.
        self._no_lease: set[str] = set()
        #: Seconds from the last driver fetch until its first job was due
        #: again (minJobRetry until a node said): fetchAhead's yardstick.
        self._last_lease_s = config.min_job_retry_ms / 1000
        self.acker = config.connection.client(client_name="spark-disque-ack")
        heartbeat_client = config.connection.client(client_name="spark-disque-lease")
        self._heartbeat_client = heartbeat_client
        interval = (None if config.working_interval_ms is None
                    else config.working_interval_ms / 1000)
        self.keeper = LeaseKeeper(
            heartbeat_client.working_many, interval_s=interval,
            discover=self._discover_executor_parts if config.fetch_mode == "executor" else None,
            renewed=self._record_lease)
        #: Guards seen_parts: the keeper thread discovers parts too.
        self._parts_lock = threading.Lock()
        #: seq -> staged table, for batches staged (or recovered) and not acked.
        self.tables: dict[int, pa.Table] = {}
        #: executor mode: seq -> part files already handed to the keeper.
        self.seen_parts: dict[int, set[str]] = {}
        #: executor mode: seq -> jobs planned (the availableNow budget is
        #: charged when planning and refunded what the tasks did not find).
        self.planned: dict[int, int] = {}
        self.available_now_budget: int | None = None
        #: The longest period of a rate limit (QLIMIT) whose full window held
        #: queued jobs back at the last QSTAT (0: none did).
        self._throttled_ms = 0
        self.last_batch_at = time.monotonic()
        self.idle = threading.Event()
        #: The figures of the progress reports (metrics()).
        self.progress = Progress()
        self.counters = self.progress.counters
        self.last_staged = 0
        #: fetchAhead: the thread that acknowledges committed batches and
        #: stages the next one while Spark runs a batch.
        self.ahead = FetchAhead()
        #: Jobs acknowledged since latest() last looked (by either thread).
        self._acked_unseen = 0
        #: fetchAhead, driver fetch mode only: the ACK of a committed batch,
        #: and the fetch of the next one, run in the background while Spark
        #: runs a batch (executor mode plans from QLEN and refunds budget on
        #: ACK: kept in order).
        self._overlap = config.fetch_ahead and config.fetch_mode == "driver"
        self._first_latest = True
        self._recover()
        # Checking the nodes and the store, the clients, recovery: what this
        # process adds to its query's start before the first fetch.
        self.progress.timed("startMs", time.monotonic() - started)

    def _check_extensions(self) -> None:
        """``includeHeaders``, ``includeGroups``: every node must have job
        headers (ordered groups), or the query fails now, before any job is
        taken (a node that joins later and has none fails the fetch from it,
        the same way)."""
        config = self.config
        for address in self.nodes.live():
            client = self.nodes.client(address)
            try:
                if config.include_headers and not supports_headers(client, config.queues[0]):
                    raise headers_refused_error(address, "ERR syntax error")
                if config.include_groups and not supports_groups(client, config.queues[0]):
                    raise groups_refused_error(address, "ERR syntax error")
            except DisqueError as exc:
                log.info("could not ask %s which extensions it has: %s", address, exc)

    # ------------------------------------------------------------ recovery

    def _recover(self) -> None:
        """Pick up batches a previous run staged: lease them again, first thing."""
        for seq in self.staging.abandoned():
            # Staged in driver mode, crashed before plan.json: promote it.
            # Without a part nothing was staged: only temporary files are left.
            if not self.staging.promote_driver_part(seq):
                self.staging.remove(seq)
        batches = self.staging.batches()
        for seq in batches:
            self._hold(seq)
        if batches:
            self.last_staged = batches[-1]
            log.info("recovered staged batches %s from %s", batches, self.staging.root)
            try:
                self.keeper.renew_due()  # WORKING before anything else happens
            except DisqueError as exc:
                log.warning("could not renew leases of recovered batches yet: %s", exc)
            self.keeper.start()

    def _check_committed(self, start: int, jobs: int | None) -> None:
        """A restarted query: was its last committed batch acknowledged?

        Spark committed batch ``start``; its jobs are acknowledged at this
        trigger, from its staging.  When that staging is gone and
        ``acked.json`` does not name it either, the staging was lost (or
        ``stagingPath`` changed): the jobs can no longer be acknowledged and
        come back after their RETRY.  Say so, loudly.
        """
        if start <= 0 or self.staging.has_batch(start):
            return
        acked = self.staging.acked_through()
        if acked is not None and acked >= start:
            return
        count = "its" if jobs is None else f"its {jobs}"
        log.warning(
            "batch %d was committed by Spark but is not staged under %s (staging lost, or "
            "stagingPath changed): %s jobs cannot be acknowledged and will be delivered "
            "again after their RETRY", start, self.staging.root, count)

    def batch_jobs(self, seq: int) -> int:
        """Jobs staged (driver mode) or planned (executor mode) for batch ``seq``."""
        table = self.tables.get(seq)
        if table is not None:
            return int(table.num_rows)
        planned = self.planned.get(seq)
        return planned if planned is not None else self.staging.plan(seq).jobs

    def _hold(self, seq: int) -> None:
        plan = self.staging.plan(seq)
        if plan.mode == "driver":
            table, staged_until = self.staging.read_batch_and_lease(seq)
            self.tables[seq] = table
            self.keeper.hold(seq, table.column("id").to_pylist(), start=False)
            jobs = table.num_rows
        else:
            jobs, staged_until = self._discover_parts(seq, start=False, recovering=True)
        self._check_lease_kept(seq, jobs, staged_until)

    def _check_lease_kept(self, seq: int, jobs: int, staged_until_ms: float | None) -> None:
        """A recovered batch: did its jobs' lease run out while the driver was away?

        The lease ran until the last heartbeat's record (``lease.json``: its
        time plus the smallest RETRY it was answered), or, before any
        heartbeat, the lease the nodes reported at the fetch.  Past that,
        the nodes queued the jobs again: the heartbeat about to go out takes
        back those nobody fetched meanwhile, but other consumers may have
        got some (a second delivery, ``additional_deliveries`` > 0).  The
        jobs count as lost leases.
        """
        if not jobs:
            return
        record = self.staging.lease(seq)
        until_ms = float(record[0]) if record is not None else staged_until_ms
        if until_ms is None or math.isinf(until_ms):
            return
        late_s = time.time() - until_ms / 1000
        if late_s <= 0:
            return
        retry = f"RETRY {record[1]} s" if record is not None else "their RETRY"
        self.keeper.count_lost(seq)
        log.warning(
            "batch %d: the leases of its %d staged jobs ran out %.0f s before this restart "
            "(%s; leased until %s UTC): the driver was away longer than that, and other "
            "consumers may have received these jobs (a second delivery has "
            "additional_deliveries > 0). Give jobs a RETRY longer than the driver may be "
            "away, Spark's start-up included (docs/SPARK.md, \"Sizing RETRY\")",
            seq, jobs, late_s, retry,
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(until_ms / 1000)))

    def _record_lease(self, seq: int, retry_s: int, sent_at: float) -> None:
        """Keeper thread: a heartbeat sent at ``sent_at`` (Unix time) kept batch
        ``seq`` leased for ``retry_s``.  Recorded as the soonest the lease can
        end: counted from the send, less :data:`COPY_SKEW_S` (another node's
        copy may be queued that much earlier), as the fetch's lease is."""
        until_ms = int((sent_at + retry_s - COPY_SKEW_S) * 1000)
        try:
            if self.staging.has_batch(seq):  # not acknowledged (and removed) meanwhile
                self.staging.record_lease(seq, until_ms, retry_s)
        except Exception as exc:  # a record missed: a restart may warn less, nothing more
            log.info("could not record batch %d's lease: %s", seq, exc)

    def _discover_parts(self, seq: int, *, start: bool = True,
                        recovering: bool = False) -> tuple[int, float | None]:
        """Executor mode: start leasing part files the tasks have published.

        Their first heartbeat goes out halfway to the lease the task's node
        reported (less :data:`COPY_SKEW_S`); at once for a part without one
        (an original node) and for every part of a recovered batch.  Returns
        the jobs of the parts found, and the soonest lease they reported
        (Unix ms, None: none said).
        """
        jobs, soonest = 0, None
        with self._parts_lock:
            seen = self.seen_parts.setdefault(seq, set())
            if not self.staging.has_batch(seq):
                return 0, None  # acknowledged and removed meanwhile
            for name, table in self.staging.read_parts(seq, skip=seen):
                seen.add(name)
                metadata = table.schema.metadata or {}
                served = metadata.get(SERVED_BY.encode())
                if served:
                    self.progress.count_node(served.decode(), "fetched", table.num_rows)
                jobs += table.num_rows
                until = lease_until_ms(table)
                if until is not None:
                    soonest = until if soonest is None else min(soonest, until)
                left = None if recovering else seconds_left(metadata.get(LEASE_UNTIL.encode()))
                # Without a lease: the task fetched these a while ago (up to a
                # lease tick plus its own run time), heartbeat at once.
                first = 0.0 if left is None else max((left - COPY_SKEW_S) / 2, 0.0)
                self.keeper.hold(seq, table.column("id").to_pylist(), start=start,
                                 first_after_s=first)
        return jobs, soonest

    # ------------------------------------------------------------- offsets

    def prepare_available_now(self) -> None:
        """Fix the target: at most the jobs queued right now (plus staged ones)."""
        self.available_now_budget = self._queue_length()
        log.info("availableNow: will read at most %d jobs", self.available_now_budget)

    def latest(self, start: int, limit: ReadLimit, start_jobs: int | None = None,
               start_offset: Mapping[str, Any] | None = None) -> int:
        """The offset that ends the next batch (``start``: no new batch).

        ``start_jobs``: how many jobs Spark's offset log says batch
        ``start`` held (None: not recorded); ``start_offset``: that offset
        whole, whose figures a restarted driver goes on from.
        """
        self.ahead.trigger()
        if self._first_latest:
            self._first_latest = False
            self._check_committed(start, start_jobs)
            if start_offset is not None:
                self.progress.carry(start_offset)
        if self._overlap:
            # Committed: acknowledged in the background (after the batch
            # being staged ahead, if any) while Spark runs the next batch.
            self.ahead.submit(self.ack_through, start)
            self.ahead.wait_staged()
        else:
            self.ack_through(start)
        staged_after = [s for s in self.staging.batches() if s > start]
        if staged_after:
            # Staged ahead, or before a crash but never (or not yet) in
            # Spark's offset log: reuse it, it holds leased jobs.
            self._stage_ahead(staged_after[0], limit)
            return staged_after[0]
        # Nothing staged ahead: the ACKs must reach the node before the next
        # GETJOB, or it could deliver again the jobs of an acknowledged batch
        # that the node queued again meanwhile (see _fetch_ahead).
        acked = self._take_acked()
        budget = self.available_now_budget
        if budget is not None and budget <= 0:
            return self._closing_batch(start) if acked else start
        max_jobs, min_jobs = self._limits(limit)
        if budget is not None:
            max_jobs = budget if max_jobs is None else min(max_jobs, budget)
        try:
            if min_jobs is not None and not self._min_jobs_ready(min_jobs):
                return start
            seq = start + 1
            if self.config.fetch_mode == "driver":
                staged = self._fetch_and_stage(seq, max_jobs)
            else:
                staged = self._plan_executor_batch(seq, max_jobs)
        except ConnectionFailed as exc:
            log.warning("no Disque node reachable, no new batch this time: %s", exc)
            return start
        if not staged:
            if acked and self.available_now_budget is not None:
                return self._closing_batch(start)
            return start
        self.last_batch_at = time.monotonic()
        self.last_staged = seq
        self.counters["batchesStaged"] += 1
        self._stage_ahead(seq, limit)
        return seq

    # ---------------------------------------------------------- fetch ahead

    def _stage_ahead(self, seq: int, limit: ReadLimit) -> None:
        """Fetch and stage batch ``seq + 1`` in the background, when it pays.

        Only after a full batch ``seq``: with fewer jobs queued than a
        batch holds, fetching early would make smaller batches, not faster
        ones.  Never with ``minJobsPerTrigger`` (it waits for a backlog by
        design) or without a batch size (``Trigger.Once`` reads everything).
        And only when the batch will be acknowledged before its first
        WORKING is due (judged by the last fetch's leases, or minJobRetry
        before any node told them, :meth:`.FetchAhead.pays`).
        """
        if not self._overlap or not self.ahead.pays(self._last_lease_s):
            return
        max_jobs, min_jobs = self._limits(limit)
        table = self.tables.get(seq)
        if max_jobs is None or min_jobs is not None or table is None:
            return
        if table.num_rows < max_jobs:
            return
        self.ahead.stage(self._fetch_ahead, seq + 1, max_jobs)

    def _fetch_ahead(self, seq: int, max_jobs: int) -> bool:
        """Background thread: stage batch ``seq`` now; ``latest`` returns it later.

        It runs after the ACK of every committed batch (same thread, in
        order).  A job of batch ``seq - 1`` (Spark runs it meanwhile) that
        waited in its queue longer than its RETRY is queued again by the
        node right after GETJOB delivered it (the original's rule: RETRY
        counts from when the job was queued); this GETJOB may deliver it
        again, and leaves it out (:meth:`_held_ids`), and the batch's first
        heartbeat was due at once (half the lease of its soonest job).  No
        WORKING round over the running batch first: it would cost the node
        and this process about what fetching its jobs did.
        """
        budget = self.available_now_budget
        if budget is not None:
            if budget <= 0:
                return False
            max_jobs = min(max_jobs, budget)
        try:
            staged = self._fetch_and_stage(seq, max_jobs, block=False)
        except (ConnectionFailed, DisqueError) as exc:
            log.warning("no Disque node reachable, batch %d is fetched when asked: %s",
                        seq, exc)
            return False
        if staged:
            self.last_staged = seq
            self.counters["batchesStaged"] += 1
        return staged

    def _take_acked(self) -> int:
        """Jobs acknowledged since the last call, once every pending ACK is done."""
        self.ahead.wait()
        acked, self._acked_unseen = self._acked_unseen, 0
        return acked

    def _closing_batch(self, start: int) -> int:
        """availableNow: an empty batch, so that the run reports its final ACK.

        The jobs of a run's last batch are acknowledged here, in the trigger
        after it committed. Spark reports no progress for a trigger without
        new data, so the run would end with a last progress showing those
        jobs leased and unacknowledged. An empty batch makes this trigger
        one that Spark runs and reports, with the counters as they are now;
        the next call acknowledges nothing and the run ends.
        """
        seq = start + 1
        self._stage_empty(seq)
        self.last_staged = seq
        return seq

    def _stage_empty(self, seq: int) -> None:
        table = empty_table(self.config.include_headers, self.config.include_groups)
        self.staging.stage_driver_batch(seq, table)
        self.tables[seq] = table

    def _limits(self, limit: ReadLimit) -> tuple[int | None, int | None]:
        if isinstance(limit, ReadAllAvailable):
            return None, None
        configured_max = self.config.max_jobs_per_trigger or DEFAULT_MAX_JOBS_PER_TRIGGER
        if isinstance(limit, ReadMaxRows):
            return limit.max_rows, None
        if isinstance(limit, ReadMinRows):
            return configured_max, limit.min_rows
        return configured_max, None

    def _min_jobs_ready(self, min_jobs: int) -> bool:
        waited_ms = (time.monotonic() - self.last_batch_at) * 1000
        if waited_ms >= self.config.max_trigger_delay_ms:
            return True
        return self._queue_length() >= min_jobs

    def _queue_lengths(self) -> list[tuple[str, int]]:
        """(address, jobs queued there) for every node that answers QSTAT;
        with ``deadLetterQueues``, also the jobs the nodes dead-lettered
        from the source's queues (``dead-lettered``, per node); for queues
        with a rate limit (QLIMIT), the fetches it held back
        (``rate-limited``, per node)."""
        out = []
        dead_lettered = 0
        rate_limited: int | None = None
        throttled_ms = 0
        live_queues = set(self.config.live_queues)
        for address in self.nodes.live():
            client = self.nodes.client(address)
            try:
                stats = [(q, client.qstat(q) or {}) for q in self.config.queues]
            except NoPerm:
                raise  # the user's permissions, not the node: fail the query saying so
            except (ConnectionFailed, DisqueError) as exc:
                log.info("QSTAT on %s failed: %s", address, exc)
                self.nodes.mark_down(address)
                continue
            queued = sum(int(stat.get("len", 0)) for _, stat in stats)
            dead_lettered += sum(int(stat.get("dead-lettered", 0)) for q, stat in stats
                                 if q in live_queues)
            for _, stat in stats:
                if "rate-limited" in stat:
                    rate_limited = (rate_limited or 0) + int(stat["rate-limited"])
                    if int(stat.get("len", 0)) and not int(stat.get("rate-limit-left", 1)):
                        # Jobs held back until the window ends, within a period.
                        throttled_ms = max(throttled_ms, int(stat["rate-limit"][1]))
            if self.nodes.check(address, client):
                out.append((address, queued))
                self.progress.count_node(address, "queued", queued, add=False)
        if not out and not self.nodes.live():
            raise ConnectionFailed("no node in 'nodes' (or found through HELLO) answers")
        if self.config.dead_letter_queues:
            self.counters["deadLettered"] = dead_lettered
        if rate_limited is not None:
            self.counters["rateLimited"] = rate_limited
        self._throttled_ms = throttled_ms
        return out

    def _queue_length(self) -> int:
        return sum(queued for _, queued in self._queue_lengths())

    def _fetch_and_stage(self, seq: int, max_jobs: int | None, *, block: bool = True) -> bool:
        config = self.config
        # Leases are counted from here, not from when a large batch is
        # finally staged.
        fetch_started = time.monotonic()
        #: When the first of the batch's jobs would be queued again.
        lease_until = math.inf
        tables: list[pa.Table] = []
        remaining = max_jobs
        live = self.nodes.live()
        reached = []
        served: list[str] = []  # the node each table came from, to give it back
        # One job, one row: not twice in this batch (two GETJOBs, or two
        # nodes), nor again while a batch that holds it runs (fetchAhead).
        seen = self._held_ids()
        for address in live:  # a quick NOHANG pass over every node first
            try:
                fetched = self._fetch_from(address, remaining, 0, seen)
            except OptionError:
                # includeHeaders (includeGroups) and a node without headers
                # (groups): the query fails; what the other nodes gave goes
                # back to its queue.
                self._give_back(seq, zip(served, tables, strict=True))
                raise
            if fetched is None:
                continue
            table = fetched.table
            lease_until = min(lease_until, self._lease_until(fetched, fetch_started))
            reached.append(address)
            tables.append(table)
            served.append(address)
            if remaining is not None:
                remaining -= table.num_rows
                if remaining <= 0:
                    break
        if not reached:
            raise ConnectionFailed("no node in 'nodes' (or found through HELLO) answered GETJOB")
        # Idle: wait (bounded) for a job on one node, rotating, so an idle
        # query costs one blocked GETJOB per fetchTimeoutMs.  availableNow
        # does not wait for new jobs, only for queued ones that a rate limit
        # (QLIMIT) holds back: at most one period, when the window opens.
        wait_ms = (config.fetch_timeout_ms if self.available_now_budget is None
                   else self._throttled_ms)
        if block and sum(t.num_rows for t in tables) == 0 and wait_ms > 0:
            address = reached[self._next_blocking % len(reached)]
            self._next_blocking += 1
            fetched = self._fetch_from(address, max_jobs, wait_ms, seen)
            if fetched is not None:
                tables.append(fetched.table)
                served.append(address)
                lease_until = min(lease_until, self._lease_until(fetched, fetch_started))
        table = pa.concat_tables(tables)
        if table.num_rows == 0:
            return False
        staging_started = time.monotonic()
        self.progress.timed("fetchMs", staging_started - fetch_started)
        # When the first job is due again, as the nodes said: a restarted
        # driver tells from it whether the lease ran out while it was away.
        table = table.replace_schema_metadata({LEASE_UNTIL: wall_clock_ms(lease_until)})
        try:
            self.staging.stage_driver_batch(seq, table)
        except BaseException:
            self._give_back(seq, zip(served, tables, strict=True))
            raise
        self.tables[seq] = table
        self.progress.timed("stageMs", time.monotonic() - staging_started)
        ids = table.column("id").to_pylist()
        # Halfway to the first job's requeue: a failed heartbeat leaves time
        # for another try.
        self._last_lease_s = lease_until - fetch_started
        first = self._last_lease_s / 2 - (time.monotonic() - fetch_started)
        self.keeper.hold(seq, ids, first_after_s=max(first, 0.0))
        self._count_fetched(seq, table)
        return True

    def _give_back(self, seq: int, fetched: Iterable[tuple[str, pa.Table]]) -> None:
        """Staging failed after the fetch: queue the jobs again (ENQUEUE, on
        the node each came from) rather than leave them leased, unstaged,
        until their RETRY.  Unless the batch got staged after all: its plan,
        the commit point, was written last (when the store cannot even be
        asked, the plan's write failed: the batch does not exist)."""
        with contextlib.suppress(Exception):
            if self.staging.has_batch(seq):
                return
        for address, table in fetched:
            ids = table.column("id").to_pylist()
            if not ids:
                continue
            try:
                self.nodes.client(address).enqueue(*ids)
            except DisqueError as exc:
                log.warning("batch %d could not be staged, and its %d jobs from %s could not "
                            "be queued again (%s): they come back after their RETRY",
                            seq, len(ids), address, exc)
                continue
            log.warning("batch %d could not be staged: its %d jobs from %s were queued again",
                        seq, len(ids), address)

    def _lease_until(self, fetched: Fetched, fetch_started: float) -> float:
        """When the first job of ``fetched`` may be queued again anywhere.

        The node's own answer less :data:`COPY_SKEW_S`; for a node that
        does not say (the original), ``minJobRetry`` from ``fetch_started``.
        """
        if fetched.lease_until is None:
            return fetch_started + self.config.min_job_retry_ms / 1000
        return fetched.lease_until - COPY_SKEW_S

    def _held_ids(self) -> set[bytes]:
        """IDs of the jobs of every batch staged and not acknowledged yet."""
        held: set[bytes] = set()
        for table in list(self.tables.values()):
            held.update(binary_ids(table.column("id")))
        return held

    def _fetch_from(self, address: str, limit: int | None, block_ms: int,
                    seen: set[bytes]) -> Fetched | None:
        """Driver mode: GETJOB on one node; None if it does not answer."""
        client = self.nodes.client(address)
        try:
            fetched = fetch_jobs(client, self.config.queues, limit,
                                 batch_size=self.config.fetch_batch_size, block_ms=block_ms,
                                 lease=address not in self._no_lease, seen=seen,
                                 headers=self.config.include_headers,
                                 trace=address not in self._no_headers,
                                 groups=self.config.include_groups)
        except (NoPerm, OptionError):
            raise  # the user's permissions or options, not the node: fail the query
        except (ConnectionFailed, DisqueError) as exc:
            log.warning("fetch from %s failed, other nodes still read: %s", address, exc)
            self.nodes.mark_down(address)
            return None
        if not fetched.lease_supported:
            log.info("%s has no GETJOB ... WITHLEASE (an original node): first heartbeats "
                     "go by minJobRetry", address)
            self._no_lease.add(address)
        if not fetched.headers_supported:
            log.info("%s has no GETJOB ... WITHHEADERS (an original node): its jobs' receive "
                     "spans have no links", address)
            self._no_headers.add(address)
        table = fetched.table
        served = client.address or address
        if not self.nodes.check(address, client):
            # The client moved to another node: the jobs are leased all the
            # same (and staged below); they count for the node that gave them.
            log.info("%s does not answer; %d jobs came from %s", address, table.num_rows, served)
        self.progress.count_node(served, "fetched", table.num_rows)
        return fetched

    def _count_fetched(self, seq: int, table: pa.Table) -> None:
        fetched = table.num_rows
        # numpy, not pyarrow.compute: its import is 0.06-0.15 s of this
        # process's first batch (see fetch.string_array).
        redelivered = count_nonzero(table.column("additional_deliveries"))
        self.counters["jobsFetched"] += fetched
        self.counters["redeliveredSeen"] += redelivered
        if self.available_now_budget is not None:
            self.available_now_budget -= fetched
        try:
            self.counters["queueLength"] = self._queue_length()
        except DisqueError:
            pass
        log.info("batch %d: staged %d jobs (%d delivered before) from %s; %d still queued",
                 seq, fetched, redelivered, ",".join(self.config.queues),
                 self.counters["queueLength"])

    def _plan_executor_batch(self, seq: int, max_jobs: int | None, *, block: bool = True) -> bool:
        """Executor mode: split the work over nodes by their queue lengths."""
        config = self.config
        per_node = self._queue_lengths()
        live = [addr for addr, _ in per_node]
        total = sum(n for _, n in per_node)
        self.counters["queueLength"] = total
        if total == 0:
            if self.available_now_budget is not None:
                self.available_now_budget = 0  # nothing left: finish the run
            elif block and config.fetch_timeout_ms > 0:
                self.idle.wait(config.fetch_timeout_ms / 1000)  # bounded idle wait
            return False
        wanted = total if max_jobs is None else min(total, max_jobs)
        parts: list[dict[str, Any]] = []
        for addr, queued in per_node:
            if queued == 0:
                continue
            share = math.ceil(wanted * queued / total)
            splits = max(config.num_partitions, math.ceil(share / config.jobs_per_partition))
            for k in range(splits):
                count = share // splits + (1 if k < share % splits else 0)
                if count:
                    parts.append({"file": f"part-{len(parts):05d}.arrow", "node": addr,
                                  "queues": list(config.queues), "count": count,
                                  "fallbacks": [a for a in live if a != addr]})
        planned_at = time.monotonic()
        self.staging.stage_executor_plan(seq, parts)
        self.progress.timed("stageMs", time.monotonic() - planned_at)
        with self._parts_lock:
            self.seen_parts[seq] = set()
        self.keeper.start()  # it discovers the parts as tasks publish them
        self.planned[seq] = wanted
        if self.available_now_budget is not None:
            self.available_now_budget -= wanted
        log.info("batch %d: %d executor partitions to fetch up to %d jobs (%d queued)",
                 seq, len(parts), wanted, total)
        return True

    def _discover_executor_parts(self) -> None:
        with self._parts_lock:
            pending = list(self.seen_parts)
        for seq in pending:
            self._discover_parts(seq)

    # ----------------------------------------------------------- partitions

    def partitions(self, start: int, end: int,
                   end_jobs: int | None = None) -> list[InputPartition]:
        out: list[InputPartition] = []
        for seq in range(start + 1, end + 1):
            if not self.staging.has_batch(seq):
                self._lost(seq, end_jobs if seq == end else None)
            plan = self.staging.plan(seq)
            if plan.mode == "driver":
                out.extend(self._staged_partitions(seq))
            else:
                out.extend(self._fetch_partitions(seq, plan.parts))
        return out

    def _lost(self, seq: int, jobs: int | None) -> None:
        """Batch ``seq`` is in Spark's offset log but not staged: fail, or
        stage a new batch ``seq`` (``onLostStaging=refetch``).

        Its jobs are leased to nobody now: they come back after their RETRY
        (to this query or another consumer), and a sink that already wrote
        the lost batch gets them again.  Spark's checkpoint is never edited.
        """
        count = "its" if jobs is None else f"its {jobs}"
        where = (f"batch {seq} is in Spark's offset log but not staged under "
                 f"{self.staging.root} (staging lost, or stagingPath changed)")
        if self.config.on_lost_staging != "refetch":
            raise RuntimeError(
                f"disque source: {where}. Restart the query with the option "
                f"onLostStaging=refetch to stage a new batch {seq} in its place ({count} jobs "
                "are delivered again after their RETRY); each query needs its own "
                "stagingPath, kept as long as its checkpoint")
        log.warning("%s: staging a new batch %d in its place (onLostStaging=refetch); %s jobs "
                    "are delivered again after their RETRY", where, seq, count)
        limit = jobs or self.config.max_jobs_per_trigger or DEFAULT_MAX_JOBS_PER_TRIGGER
        fetch = (self._fetch_and_stage if self.config.fetch_mode == "driver"
                 else self._plan_executor_batch)
        if not fetch(seq, limit, block=False):
            self._stage_empty(seq)
    def _staged_partitions(self, seq: int) -> list[InputPartition]:
        table = self.tables.get(seq)
        if table is None:
            table = self.tables[seq] = self.staging.read_batch(seq)
        return list(staged_partitions(seq, table, at_least=self.config.num_partitions,
                                      rows_per_partition=self.config.jobs_per_partition))

    def _fetch_partitions(self, seq: int, parts: list[dict]) -> list[InputPartition]:
        config = self.config
        assert config.staging_path is not None
        return [FetchPartition(seq, config.staging_path, p["file"], p["node"],
                               tuple(p["queues"]), int(p["count"]), config.connection,
                               config.fetch_batch_size, tuple(p.get("fallbacks", ())),
                               config.staging_options, config.include_headers,
                               config.telemetry_setup, config.include_groups)
                for p in parts]

    # ------------------------------------------------------------------ ACK

    def ack_through(self, end: int) -> int:
        """Acknowledge every staged batch <= ``end``, then forget it (idempotent).

        Returns the number of jobs acknowledged by this call.
        """
        acked = 0
        for seq in [s for s in self.staging.batches() if s <= end]:
            # Executor batches are read from disk: every part the tasks published.
            table = self.tables.get(seq)
            if table is None:
                table = self.staging.read_batch(seq)
            ids = table.column("id").to_pylist()
            # Stop heartbeats first: a WORKING racing the ACK would only get
            # NOJOB back.  Re-held below if the ACK fails.
            self.keeper.release_through(seq)
            ack_started = time.monotonic()
            try:
                if ids:
                    if self.config.ack_mode == "fastack":
                        self.acker.fastack_many(ids)
                    else:
                        self.acker.ack_many(ids)
                    self.progress.timed("ackMs", time.monotonic() - ack_started)
            except NoPerm:
                raise  # retrying cannot help: fail the query saying so
            except DisqueError as exc:
                # Node down, -MISCONF (its disk is full), -LOADING...: the
                # batch stays staged and leased, and the ACK is retried at
                # the next trigger. Failing the query would not help.
                log.warning("could not acknowledge batch %d yet (will retry): %s", seq, exc)
                self.keeper.hold(seq, ids)
                return acked
            with self._parts_lock:
                # Again: the keeper thread may have discovered (and held) a
                # part of this batch since the first release.
                self.keeper.release_through(seq)
                self.staging.remove(seq)
                self.seen_parts.pop(seq, None)
            self.tables.pop(seq, None)
            planned = self.planned.pop(seq, None)
            if planned is not None:
                self.counters["jobsFetched"] += len(ids)
                if self.available_now_budget is not None:
                    self.available_now_budget += max(0, planned - len(ids))
            self.counters["jobsAcked"] += len(ids)
            self._acked_unseen += len(ids)
            acked += len(ids)
            self.staging.record_acked(seq)
            log.info("batch %d: acknowledged %d jobs", seq, len(ids))
        return acked

    # -------------------------------------------------------------- metrics

    def metrics(self) -> dict[str, Any]:
        return self.progress.report(self.last_staged, leased=sum(self.keeper.held().values()),
                                    leases_lost=self.keeper.leases_lost,
                                    node_ids=self.nodes.ids,
                                    up=lambda address: self.nodes.up.get(address, False))

    def commit(self, end: int) -> None:
        """Spark committed ``end`` (it usually told ``latest`` already)."""
        if self._overlap:
            self.ahead.submit(self.ack_through, end)
        else:
            self.ack_through(end)

    def close(self) -> None:
        self.ahead.close()
        self.keeper.stop()
        self.nodes.close()
        for client in [self.acker, self._heartbeat_client]:
            client.close()
        telemetry.flush()
