"""``ServerState``: everything one node holds, passed explicitly to handlers.

The server (``server.py``) owns the event loop, the listeners and the
timers; this object owns the data: jobs, queues, the cluster view, memory
accounting, statistics, the blocked and connected clients.  It is the
bottom of the node's layers: it imports only values and tables, and the
procedures that change it (``queue``, ``jobs``, ``ack``, ``replication``,
``timers`` ...) take it as their first argument.  What they must tell the
layers above goes through :attr:`ServerState.events`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from . import _native
from .acked_ids import CollectedAcks, RecentAcks
from .acl import Acl, User
from .clock import Clock
from .cluster import ClusterState
from .config import Config
from .events import JobEvents, Persistence
from .idmp import DedupIndex
from .job import JobIdGenerator
from .job_table import JobRegistry
from .latency import REPLICATION_BUCKETS_S, LatencyHistogram
from .memory import MemoryTracker, limit_warning, rss_bytes
from .queue_table import QUEUE_OVERHEAD_BYTES, Queue, QueueRegistry
from .waiters import BlockDeadlines, Blocked, ReplicationWait

if TYPE_CHECKING:
    from .cluster.bus import ClusterBus

__all__ = ["ServerState", "Stats", "ConnectedClient", "NO_JOB_TIMER"]

log: Final = logging.getLogger("disque.state")

#: Recent job times kept for sharing (see ServerState.shared_int).
SHARED_INTS: Final = 4096
#: How long an empty queue lives with nobody using it (by memory level).
QUEUE_IDLE_MS: Final = {0: 300_000, 1: 10_000, 2: 2_000, 3: 2_000}
#: CPU one pass of idle-queue eviction may take (a pass every 100 ms), by
#: memory level: the original's 1 ms, and more once memory is short, where
#: dropping a queue costs us ~4 us against the original's ~0.1 us (200,000
#: idle queues: ~90 s at 1 ms a pass, ~9 s at 10 ms; docs/SECURITY.md).
QUEUE_EVICTION_BUDGET_S: Final = {0: 0.001, 1: 0.002, 2: 0.01, 3: 0.01}


@dataclass
class Stats:
    connections_received: int = 0
    commands_processed: int = 0
    rejected_connections: int = 0
    net_input_bytes: int = 0
    net_output_bytes: int = 0
    evicted_jobs: int = 0
    evicted_queues: int = 0
    expired_jobs: int = 0
    #: Jobs this node moved to a dead-letter queue (MAXDELIVERIES, disque.deadletter).
    dead_lettered_jobs: int = 0
    #: Jobs made by ADDJOB (and each body of ADDJOBS) on this node, jobs
    #: handed to clients by GETJOB, jobs acknowledged by ACKJOB or FASTACK
    #: here: INFO stats (extensions) and the metrics, for rates.
    added_jobs: int = 0
    delivered_jobs: int = 0
    acked_jobs: int = 0
    #: jobs_in / jobs_out of the queues evicted so far, so that the node's
    #: totals (the live queues' plus these) never go down (metrics.py).
    evicted_queues_jobs_in: int = 0
    evicted_queues_jobs_out: int = 0
    #: Connections to tls-port whose handshake failed (tls.py, metrics.py).
    tls_handshake_failures: int = 0
    #: Clients closed for their pending input or output (the limits of
    #: client-query-buffer-limit and client-output-buffer-limit; Redis's names).
    client_query_buffer_limit_disconnections: int = 0
    client_output_buffer_limit_disconnections: int = 0
    #: Connections closed for not authenticating within auth-timeout.
    auth_timeout_disconnections: int = 0
    #: Commands refused for a queue name over max-queue-name-len or more
    #: queues than max-queues-per-command.
    refused_queue_names: int = 0
    #: Federation (federation.py, CLUSTER INFO): NEEDJOBS sent (one per
    #: node asked), YOURJOBS sent and the jobs they carried, and of those
    #: the YOURJOBS sent later than their NEEDJOBS came (pushed: the jobs
    #: came after the ask, or the answer was paced under load).
    needjobs_sent: int = 0
    yourjobs_sent: int = 0
    jobs_exported: int = 0
    yourjobs_pushed: int = 0


class ConnectedClient(Protocol):
    """What the node's own code uses of a client connection (connection.py)."""

    id: int
    addr: str
    laddr: str
    blocked: Blocked | None
    last_interaction: float
    user: User | None

    @property
    def is_blocked(self) -> bool: ...

    def describe(self) -> str: ...

    def kill(self) -> None: ...

    #: The bytes of the commands queued behind a blocked one.
    pending_bytes: int

    def output_pending(self) -> int: ...

    def input_pending(self) -> int: ...

    def watch(self, now: float, soft: int, soft_seconds: int, auth_timeout: int) -> None: ...


#: ServerState.job_timer_at when no job timer is armed: every time is earlier.
NO_JOB_TIMER: Final = 1 << 62


def _no_timer(when_ms: int) -> None:
    """``ServerState.schedule_changed`` before a server owns the state (tests)."""


class ServerState:
    def __init__(self, config: Config, cluster: ClusterState, events: JobEvents,
                 clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock()
        self.cluster = cluster
        #: Tells the layers above what happened to jobs (node_events.NodeEvents).
        self.events = events
        self.jobs = JobRegistry()
        self.queues = QueueRegistry()
        self.memory = MemoryTracker(config.maxmemory)
        self._warn_about_maxmemory()
        self.ids = JobIdGenerator(cluster.myself_id)
        self.stats = Stats()
        self.clients: dict[int, ConnectedClient] = {}
        self.blocked_clients = 0
        #: When blocked commands time out (one loop timer for all).
        self.block_deadlines = BlockDeadlines()
        self.started = time.time()
        self.run_id = ""
        self.event_loop_name = "asyncio"
        #: The loop the node runs on, set by the server: on Python 3.11
        #: asyncio.get_running_loop() reads the process ID (a system call)
        #: on every call, and a timer is set for every blocked command.
        self.loop: asyncio.AbstractEventLoop | None = None
        # (monotonic time, commands processed) samples for instantaneous_ops_per_sec.
        self._ops_samples: list[tuple[float, int]] = []
        self.tcp_port = config.port
        self._last_ctime = 0
        self._shared_ints: dict[int, int] = {}
        # Compiled, a job keeps its times as machine integers, not int
        # objects: there is nothing to share, and the table costs ~1k
        # instructions a call (twice per ADDJOB).
        self._share_ints = _native.activate() != "compiled"
        self._queue_scan_cursor = 0
        # A job's awake time became ``when_ms``: the server replaces this
        # no-op with its own method (re-arm the job timer if earlier).  An
        # attribute, not a method calling a hook: it runs on every ADDJOB.
        self.schedule_changed: Callable[[int], None] = _no_timer
        #: The server's job timer's time (ms): NO_JOB_TIMER when none is
        #: armed, -1 while due jobs are processed.  update_awake_time calls
        #: schedule_changed only for an earlier time: compiled, the
        #: comparison saves most jobs a call into the interpreted server
        #: (~850 instructions per ADDJOB).
        self.job_timer_at = NO_JOB_TIMER
        #: SHUTDOWN asks the server to stop: an error text, or None once the
        #: stop is under way (None: no server owns this state).
        self.shutdown_requested: Callable[[str], str | None] | None = None
        #: The append-only file (aof/), once the server set persistence up;
        #: None in tests that drive the state without a server.
        self.persistence: Persistence | None = None
        #: ``persistence`` while it logs, None while the AOF is off (it then
        #: holds no record, and takes any write): what each command and
        #: each reply ask, so that without an AOF they make no call into
        #: the interpreted aof package (~1,600 instructions an ADDJOB).
        self.logging_persistence: Persistence | None = None
        # The cluster bus (cluster/bus.py), once the server listens; None in
        # tests that drive the state without a server.
        self.bus: ClusterBus | None = None
        # ADDJOBs waiting for their copies (replication.BlockedAdd), by job
        # ID, and the one timer that asks more nodes while any waits.
        self.replicating: dict[bytes, ReplicationWait] = {}
        self.replication_timer: asyncio.TimerHandle | None = None
        #: IDs of jobs acked here lately (WAITJOB), and of jobs whose ACK
        #: reached us from elsewhere (late copies refused).
        self.recent_acks = RecentAcks()
        self.collected_acks = CollectedAcks()
        #: IDMP keys of idempotent ADDJOBs (idmp.py, an extension).
        self.idmp = DedupIndex(self.memory, config.idmp_max_keys)
        #: WAITJOB clients by job ID (waitjob.py, an extension).
        self.job_waiters: dict[bytes, dict[Blocked, None]] = {}
        #: ADDJOB to replication achieved, for the metrics endpoint.
        self.replication_latency = LatencyHistogram(REPLICATION_BUCKETS_S)
        #: Users and their permissions (acl.py, an extension); ``default``'s
        #: password is requirepass.
        self.acl = Acl(config.requirepass)
        #: max-queue-name-len and max-queues-per-command, checked on every
        #: command that names a queue: kept here, read natively when compiled
        #: (the Config's attributes are Python-level lookups).
        self.max_queue_name_len: int = config.max_queue_name_len
        self.max_queues_per_command: int = config.max_queues_per_command
        config.on_change("max-queue-name-len", self._set_max_queue_name_len)
        config.on_change("max-queues-per-command", self._set_max_queues_per_command)
        config.on_change("maxmemory", self._set_maxmemory)
        config.on_change("idmp-max-keys", self._set_idmp_max_keys)
        config.on_change("requirepass", self.acl.set_default_password)

    def _set_maxmemory(self, value: int) -> None:
        self.memory.set_maxmemory(value)
        self._warn_about_maxmemory()

    def _warn_about_maxmemory(self) -> None:
        memory = self.memory
        warning = limit_warning(memory.maxmemory, memory.used, memory.startup, rss_bytes())
        if warning is not None:
            log.warning("WARNING: %s.", warning)

    def _set_idmp_max_keys(self, value: int) -> None:
        self.idmp.max_keys = value

    def _set_max_queue_name_len(self, value: int) -> None:
        self.max_queue_name_len = value

    def _set_max_queues_per_command(self, value: int) -> None:
        self.max_queues_per_command = value

    # -- time ---------------------------------------------------------------

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The node's loop (the running one where no server set it)."""
        loop = self.loop
        return loop if loop is not None else asyncio.get_running_loop()

    def next_ctime(self, now_ms: int) -> int:
        """Creation time ``ms * 1e6 + counter``, strictly increasing on this node."""
        # now_ms * 1_000_000 in two products of factors below 2**31: compiled,
        # a larger factor sends the product through boxed ints (~800
        # instructions, a tenth of an ADDJOB's path to a waiting consumer).
        ctime = ((now_ms >> 16) * 1_000_000 << 16) + (now_ms & 0xFFFF) * 1_000_000
        if ctime <= self._last_ctime:
            ctime = self._last_ctime + 1
        self._last_ctime = ctime
        return ctime

    def shared_int(self, value: int) -> int:
        """``value``, as the int object other jobs already hold for the same time.

        Job times are ints of 32 bytes each, and under load many jobs get the
        same expiry, requeue or awake time (dozens of jobs per millisecond,
        a requeue jitter of 500 values): sharing the objects saves up to
        ~100 bytes per job.  The table only holds recent values.  Only
        interpreted: the compiled Job stores its times unboxed.
        """
        if not self._share_ints:
            return value
        ints = self._shared_ints
        shared = ints.get(value)
        if shared is None:
            if len(ints) >= SHARED_INTS:
                ints.clear()
            ints[value] = shared = value
        return shared

    def sample_ops(self) -> None:
        """Called by the cron: keep ~1.6 s of (time, commands) samples."""
        self._ops_samples.append((time.monotonic(), self.stats.commands_processed))
        if len(self._ops_samples) > 16:
            del self._ops_samples[0]

    def instantaneous_ops(self) -> int:
        samples = self._ops_samples
        if len(samples) < 2:
            return 0
        (t0, c0), (t1, c1) = samples[0], samples[-1]
        return int((c1 - c0) / (t1 - t0)) if t1 > t0 else 0

    # -- queues -------------------------------------------------------------

    def queue_for_write(self, name: bytes) -> Queue:
        """The queue ``name``, created (and accounted) if needed."""
        q = self.queues.lookup(name)
        if q is None:
            q = self.queues.get_or_create(name, self.clock.now_ms())
            self.memory.add(QUEUE_OVERHEAD_BYTES + len(name))
        return q

    def forget_if_unused(self, q: Queue) -> None:
        """Drop ``q`` now if nothing ever used it but readers that left:
        no job ever entered it, nobody waits, it has no pause flag, rate
        limit, federation memory or group.  A GETJOB ... FROM naming many queues
        that hold nothing leaves nothing behind this way, where idle eviction
        takes minutes to walk to them (300 s idle, as in the original)."""
        if (q.jobs_in == 0 and not q.jobs and not q.waiters and not q.flags
                and q.limit is None and q.fed is None and q.groups is None
                and self.queues.lookup(q.name) is q):
            self.queues.remove(q)
            self.memory.sub(QUEUE_OVERHEAD_BYTES + len(q.name))
            self.stats.evicted_queues += 1

    def evict_idle_queues(self, idle_ms: int | None = None, budget_s: float | None = None,
                          max_visits: int = 256) -> int:
        """Drop empty, unpaused, unused queues (bounded work per call).

        Walks the queue table from where the previous call stopped, a slice
        of about ``max_visits`` queues at a time, so over successive calls
        every queue is looked at without any one call taking long.  Like the
        original's evictIdleQueues, a call goes on to the next slice while
        at least a tenth of the last one was evicted, within ``budget_s``:
        a table full of idle queues empties in a fraction of the passes a
        slice a call would take, one with few costs one slice per call.
        """
        level = self.memory.level()
        if idle_ms is None:
            idle_ms = QUEUE_IDLE_MS[level]
        if budget_s is None:
            budget_s = QUEUE_EVICTION_BUDGET_S[level]
        now = self.clock.now_ms()
        deadline = time.perf_counter() + budget_s
        evicted = 0
        stats = self.stats
        while True:
            cursor, candidates = self.queues.scan(
                self._queue_scan_cursor, max_visits, lambda q: q.is_evictable(now, idle_ms))
            self._queue_scan_cursor = cursor
            for q in candidates:
                stats.evicted_queues_jobs_in += q.jobs_in
                stats.evicted_queues_jobs_out += q.jobs_out
                self.queues.remove(q)
                self.memory.sub(QUEUE_OVERHEAD_BYTES + len(q.name))
                evicted += 1
                if time.perf_counter() > deadline:
                    stats.evicted_queues += evicted
                    return evicted
            if cursor == 0 or len(candidates) * 10 < max_visits \
                    or time.perf_counter() > deadline:
                break
        stats.evicted_queues += evicted
        return evicted
