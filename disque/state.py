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
    #: Jobs handed to clients by GETJOB (metrics.py; not in INFO, like the original).
    delivered_jobs: int = 0
    #: jobs_in / jobs_out of the queues evicted so far, so that the node's
    #: totals (the live queues' plus these) never go down (metrics.py).
    evicted_queues_jobs_in: int = 0
    evicted_queues_jobs_out: int = 0
    #: Connections to tls-port whose handshake failed (tls.py, metrics.py).
    tls_handshake_failures: int = 0


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

    def output_pending(self) -> int: ...

    def input_pending(self) -> int: ...


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

    def evict_idle_queues(self, idle_ms: int | None = None, budget_s: float = 0.001,
                          max_visits: int = 256) -> int:
        """Drop empty, unpaused, unused queues (a bounded slice per call).

        Walks the queue table from where the previous call stopped, so over
        successive calls every queue is looked at without any one call
        taking long.
        """
        if idle_ms is None:
            idle_ms = QUEUE_IDLE_MS[self.memory.level()]
        now = self.clock.now_ms()
        deadline = time.perf_counter() + budget_s
        evicted = 0
        cursor, candidates = self.queues.scan(
            self._queue_scan_cursor, max_visits, lambda q: q.is_evictable(now, idle_ms))
        self._queue_scan_cursor = cursor
        stats = self.stats
        for q in candidates:
            stats.evicted_queues_jobs_in += q.jobs_in
            stats.evicted_queues_jobs_out += q.jobs_out
            self.queues.remove(q)
            self.memory.sub(QUEUE_OVERHEAD_BYTES + len(q.name))
            evicted += 1
            if time.perf_counter() > deadline:
                break
        self.stats.evicted_queues += evicted
        return evicted
