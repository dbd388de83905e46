"""``disque-server``: the node's lifecycle.

Start-up: read the configuration, change to ``dir``, load (or create) the
node identity from ``nodes.conf``, listen for clients and (on port + 10000)
for the cluster bus (``cluster/bus.py``, with its own 100 ms cron), and arm
two timers:

* the **job timer**, armed for the earliest ``awakeme`` in the schedule and
  re-armed only when an earlier one appears, so an idle node does not wake
  up for jobs at all and a busy one never polls;
* the **cron**, ``hz`` times a second on a fixed grid (no drift: each run is
  scheduled from the previous deadline, not from "now"), for the periodic
  housekeeping: idle queue eviction, idle client timeouts, statistics.

Shutdown (SHUTDOWN, and SIGTERM / SIGINT after the drain of ``drain.py``)
is phased: stop listening, close the clients, write and sync the AOF, save
nodes.conf, remove the pid file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from . import __version__, _native
from .acl import AclError
from .bus_handlers import register_job_messages
from .clock import FOLLOW_RATE
from .cluster import ClusterState, NodesFileError
from .cluster.auth import BusAuth
from .cluster.bus import BUS_PORT_OFFSET, ClusterBus
from .cluster.discovery import Discovery, parse_target
from .commands.acl import load_acl_file
from .config import Config, ConfigError
from .connection import ReplyBatch, connection_factory
from .cyclic_gc import CollectorPolicy
from .drain import Drain
from .federation import need_jobs_cron
from .health import Health, LoadingResponder, bind_sockets
from .log import set_level, setup_logging
from .node_events import NodeEvents
from .state import NO_JOB_TIMER, ServerState
from .timers import MAX_JOBS_PER_RUN, process_due_jobs
from .tls import TLSError, TLSListener, cluster_contexts, server_context

__all__ = ["DisqueServer", "main"]

log = logging.getLogger("disque.server")

#: The highest client port: the cluster bus listens on port + 10000.
MAX_PORT = 65535 - BUS_PORT_OFFSET
#: Room in a bus message around the largest job body a client may send.
BUS_MESSAGE_SLACK = 1024 * 1024

#: Idle queues are looked at every 100 ms, like the original's evictIdleQueues.
QUEUE_EVICTION_PERIOD_S = 0.1
#: How often the client and bus link buffers are summed into used_memory:
#: a walk over every connection, so not on every cron run.
BUFFERS_PERIOD_S = 1.0
#: A difference between the system clock and the node's this large is
#: logged (a step of the system clock: see clock.py).
CLOCK_STEP_LOG_MS = 1000


class DisqueServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.state: ServerState | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._job_timer: asyncio.TimerHandle | None = None
        self._cron_handle: asyncio.TimerHandle | None = None
        self._cron_deadline = 0.0
        self._clock_stepped = False
        self._last_queue_eviction = 0.0
        self._last_buffers_sum = 0.0
        self._collector = CollectorPolicy(time.monotonic())
        self._collector.install()
        self._stopped = asyncio.Event()
        self._stopping = False
        self.port = config.port
        self._metrics: Any = None  # metrics.MetricsServer, with metrics-port
        self._tls: TLSListener | None = None  # with tls-port
        self._drain: Drain | None = None  # after a first SIGTERM / SIGINT
        self._discovery: Discovery | None = None  # with cluster-discovery
        self.health: Health | None = None

    # -- start --------------------------------------------------------------

    async def start(self) -> None:
        config = self.config
        loop = asyncio.get_running_loop()
        try:
            os.chdir(config.dir)
        except OSError as err:
            raise SystemExit(f"Can't chdir to '{config.dir}': {err.strerror}") from None
        _check_writable(config.dir)
        config.on_change("dir", self._change_dir)
        config.on_change("loglevel", set_level)
        my_ip = config.cluster_announce_ip or next(
            (a for a in config.bind if a not in ("0.0.0.0", "::", "*")), "")
        try:
            cluster = ClusterState.load_or_create(config.cluster_config_file, my_ip, config.port)
        except NodesFileError as err:
            raise SystemExit(str(err)) from None
        state = ServerState(config, cluster, NodeEvents())
        state.run_id = os.urandom(20).hex()
        state.event_loop_name = type(loop).__module__.split(".")[0]
        state.loop = loop
        state.schedule_changed = self._schedule_changed
        state.shutdown_requested = self._shutdown_requested
        self.state = state
        if config.aclfile:
            try:
                load_acl_file(state)
            except (OSError, AclError) as err:
                reason = err.strerror if isinstance(err, OSError) and err.strerror else err
                raise SystemExit(f"Error loading the ACL file '{config.aclfile}': "
                                 f"{reason}") from None
            log.info("ACL file %s loaded: %d users", config.aclfile, len(state.acl.users))
        tls_context = None
        if config.tls_port:
            try:  # before the AOF loads: a bad TLS setup fails at once
                tls_context = server_context(config)
            except TLSError as err:
                raise SystemExit(f"TLS: {err}") from None
        bus_tls = None
        if config.tls_cluster:
            try:  # as tls-port: before the AOF loads
                bus_tls = cluster_contexts(config)
            except TLSError as err:
                raise SystemExit(f"TLS: {err}") from None
        from .aof import setup_persistence
        responder = None
        if config.metrics_port:
            # The probes are answered during the AOF load too (health.py).
            metrics_sockets = bind_sockets(config.metrics_bind, config.metrics_port)
            responder = LoadingResponder(metrics_sockets)
            responder.start()
        try:
            persistence = setup_persistence(state)  # loads the AOF before listening
        except BaseException:
            if responder is not None:
                responder.stop()
                for sock in responder.sockets:
                    sock.close()
            raise
        replies = ReplyBatch(state)

        await self._listen(config, state, replies)
        if tls_context is not None:
            self._listen_tls(config, state, replies, tls_context)
        if config.port == 0:
            state.tcp_port = self.port
        _announce(config, cluster, self.port)
        auth = None
        if config.cluster_secret:
            auth = BusAuth(config.cluster_secret.encode("utf-8", "surrogateescape"))
            log.info("Cluster secret set: bus messages without its signature are refused")
        bus = ClusterBus(cluster, state.clock.now_ms, lambda: config.cluster_node_timeout,
                         max_message=config.proto_max_bulk_len + BUS_MESSAGE_SLACK,
                         before_flush=[persistence.before_reply], auth=auth,
                         max_inbound=lambda: config.cluster_max_inbound_links, tls=bus_tls)
        state.bus = bus
        # Output that may acknowledge records the AOF failed to write or sync
        # is dropped with its connections rather than sent.
        persistence.on_durability_lost(replies.drop)
        persistence.on_durability_lost(bus.drop_output)
        register_job_messages(bus, state)
        self.health = Health(state, lambda: self._stopping or self._drain is not None,
                             lambda: self._discovery)
        bus.membership.on_pong = self.health.pong
        await bus.start(config.bind, self.port)
        if bus_tls is not None:
            log.info("TLS on the cluster bus: peers' certificates verified against %s",
                     config.tls_ca_cert_file)
        # Only now, listening on both ports: a node that cannot start leaves
        # no nodes.conf (a new identity) behind.
        try:
            cluster.save()
        except OSError as err:
            raise SystemExit(f"Can't write the cluster config file "
                             f"'{config.cluster_config_file}': {err.strerror}") from None
        if config.cluster_discovery:
            name, port = parse_target(config.cluster_discovery, config.port or self.port)
            self._discovery = Discovery(bus.membership, name, port,
                                        lambda: config.cluster_discovery_interval,
                                        lambda: config.cluster_discovery_forget_time)
            self._discovery.start()
            log.info("cluster-discovery: peers from %s, port %d, every %d s", name, port,
                     config.cluster_discovery_interval)
        if responder is not None:
            # Imported here: prometheus-client is only loaded by nodes that serve it.
            from .metrics import MetricsServer
            responder.stop()
            self._metrics = MetricsServer(state, self.health)
            await self._metrics.start(config.metrics_bind, config.metrics_port,
                                      responder.sockets)
        self._cron_deadline = loop.time()
        self._schedule_cron()
        log.info("Disque %s (python, core: %s) started, pid %d, node %s", __version__,
                 _native.describe(), os.getpid(), cluster.myself_id)
        addresses = ", ".join(f"{a}:{self.port}" for a in config.bind)
        log.info("Ready to accept connections on %s", addresses)

    async def _listen(self, config: Config, state: ServerState, replies: ReplyBatch) -> None:
        """The client listeners, on a port whose bus port (+10000) is free too.

        With ``port 0`` the kernel picks the client port; one above 55535 has
        no bus port, and a taken bus port makes the node unusable in a
        cluster, so such picks are given back and another one is tried.
        """
        if config.port > MAX_PORT:
            raise SystemExit(f"Port {config.port} is too high: the cluster bus listens on "
                             f"port + {BUS_PORT_OFFSET}, so the highest usable port is "
                             f"{MAX_PORT}")
        for _attempt in range(100):
            servers = await self._create_listeners(config, state, replies, config.port)
            port = servers[0].sockets[0].getsockname()[1]
            if config.port or (port <= MAX_PORT and _bus_port_free(config.bind, port)):
                self._servers = servers
                self.port = port
                return
            for server in servers:
                server.close()
        raise SystemExit("Could not find a free port whose cluster bus port is free too")

    async def _create_listeners(self, config: Config, state: ServerState, replies: ReplyBatch,
                                port: int) -> list[asyncio.base_events.Server]:
        loop = asyncio.get_running_loop()
        servers: list[asyncio.base_events.Server] = []
        for address in config.bind:
            host = None if address == "*" else address
            try:
                server = await loop.create_server(
                    connection_factory(state, replies), host, port,
                    backlog=config.tcp_backlog, reuse_address=True)
            except OSError as err:
                for other in servers:
                    other.close()
                reason = os.strerror(err.errno) if err.errno else err.strerror
                raise SystemExit(f"Could not create server TCP listening socket "
                                 f"{address}:{port}: {reason}") from None
            servers.append(server)
            if not port:  # the other addresses listen on the port the first one got
                port = server.sockets[0].getsockname()[1]
        return servers

    def _listen_tls(self, config: Config, state: ServerState, replies: ReplyBatch,
                    context: ssl.SSLContext) -> None:
        """The TLS client listeners (tls.py), on tls-port beside the plain port."""
        self._tls = TLSListener(state, replies, context)
        try:
            self._tls.start(config.bind, config.tls_port, config.tcp_backlog)
        except TLSError as err:
            raise SystemExit(str(err)) from None
        # Not "Ready to accept connections": tools wait for that line, last.
        log.info("TLS: accepting connections on %s (client certificates: %s)",
                 ", ".join(f"{a}:{config.tls_port}" for a in config.bind),
                 {"yes": "required", "optional": "checked if sent",
                  "no": "not asked"}[config.tls_auth_clients])

    def _change_dir(self, path: str) -> None:
        os.chdir(path)

    # -- the job timer ------------------------------------------------------

    def _schedule_changed(self, when_ms: int) -> None:
        # state.job_timer_at is the armed timer's time (NO_JOB_TIMER for
        # none, -1 while due jobs are processed: re-armed once the run
        # ends).  update_awake_time, compiled, calls this only for an
        # earlier time; the test is repeated for any other caller.
        assert self.state is not None
        if when_ms < self.state.job_timer_at:
            self._arm_job_timer(when_ms)

    def _arm_job_timer(self, when_ms: int | None, minimum_ms: int = 0) -> None:
        if self._job_timer is not None:
            self._job_timer.cancel()
            self._job_timer = None
        assert self.state is not None
        self.state.job_timer_at = NO_JOB_TIMER if when_ms is None else when_ms
        if when_ms is None or self._stopping:
            return
        delay_ms = max(when_ms - self.state.clock.now_ms(), minimum_ms)
        self._job_timer = asyncio.get_running_loop().call_later(
            delay_ms / 1000, self._run_due_jobs)

    def _run_due_jobs(self) -> None:
        state = self.state
        assert state is not None
        self._job_timer = None
        state.job_timer_at = -1  # no re-arming while the run moves jobs
        processed = 0
        try:
            processed = process_due_jobs(state, state.clock.now_ms())
        except Exception:  # a bug: keep the timer alive, or no job would ever move again
            log.exception("Error processing due jobs")
        if processed >= MAX_JOBS_PER_RUN:
            self._arm_job_timer(state.clock.now_ms())  # more due: next loop turn
        else:
            # At least 1 ms: a timer that fires a hair early must not spin.
            self._arm_job_timer(state.jobs.schedule.next_time(), minimum_ms=1)

    # -- the cron -----------------------------------------------------------

    def _schedule_cron(self) -> None:
        loop = asyncio.get_running_loop()
        period = 1.0 / self.config.hz
        self._cron_deadline += period
        now = loop.time()
        if self._cron_deadline < now:  # fell behind (e.g. DEBUG SLEEP): skip, don't burst
            self._cron_deadline = now + period
        self._cron_handle = loop.call_at(self._cron_deadline, self._cron)

    def _cron(self) -> None:
        state = self.state
        assert state is not None
        try:
            now = time.monotonic()
            state.sample_ops()
            self._collector.tick(now)
            if now - self._last_buffers_sum >= BUFFERS_PERIOD_S:
                self._last_buffers_sum = now
                _watch_clients(state, now)
            state.memory.used  # noqa: B018 - updates the peak
            if state.persistence is not None:
                state.persistence.cron()
            if now - self._last_queue_eviction >= QUEUE_EVICTION_PERIOD_S:
                self._last_queue_eviction = now
                state.evict_idle_queues()
            need_jobs_cron(state)
            self._follow_wall_clock(state)
            if len(state.idmp):
                state.idmp.expire(state.clock.now_ms())  # IDMP keys past their window
            timeout = self.config.timeout
            if timeout:
                for client in list(state.clients.values()):
                    if not client.is_blocked and now - client.last_interaction > timeout:
                        log.debug("Closing idle client %s", client.addr)
                        client.kill()
        except Exception:  # pragma: no cover - keep the node alive, but say it loudly
            log.exception("Error in periodic task")
        if not self._stopping:
            self._schedule_cron()

    def _follow_wall_clock(self, state: ServerState) -> None:
        """The node's clock catches up with a stepped system clock, slowly
        (clock.py); a step is logged when first seen and when absorbed."""
        skew = state.clock.follow_wall()
        if abs(skew) >= CLOCK_STEP_LOG_MS and not self._clock_stepped:
            self._clock_stepped = True
            log.warning("The system clock moved by %+d ms: the node's timers keep their pace, "
                        "its clock follows at %d%% of real time", skew,
                        round(FOLLOW_RATE * 100))
        elif self._clock_stepped and abs(skew) < CLOCK_STEP_LOG_MS // 10:
            self._clock_stepped = False
            log.warning("The node's clock has caught up with the system clock")

    # -- stop ---------------------------------------------------------------

    def _shutdown_requested(self, mode: str) -> str | None:
        """SHUTDOWN command: returns an error text, or None once the stop is under way."""
        asyncio.get_running_loop().call_soon(self.request_stop, mode)
        return None

    def signal_stop(self) -> None:
        """SIGTERM / SIGINT: drain first (drain.py), stop once drained; a
        second signal, or ``shutdown-timeout 0``, stops at once."""
        if self._stopping:
            return
        if self._drain is not None:
            self._drain.interrupt()
        elif self.state is None or not self.config.shutdown_timeout:
            self.request_stop()
        else:
            self._drain = Drain(self.state, self._close_listeners, self.request_stop,
                                self.config.shutdown_timeout)
            self._drain.start()

    def request_stop(self, mode: str = "") -> None:
        if not self._stopping:
            log.warning("User requested shutdown...")
            asyncio.get_running_loop().create_task(self.stop(mode))

    async def stop(self, mode: str = "") -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self._close_listeners()
        if self._metrics is not None:
            self._metrics.stop()
        if self._discovery is not None:
            self._discovery.stop()
        if self._job_timer is not None:
            self._job_timer.cancel()
        if self._cron_handle is not None:
            self._cron_handle.cancel()
        state = self.state
        if state is not None and state.bus is not None:
            state.bus.stop()
        if state is not None:
            for client in list(state.clients.values()):
                client.kill()
            if state.persistence is not None:
                try:
                    state.persistence.shutdown(mode)
                except Exception:
                    log.exception("Error during shutdown")
            try:
                state.cluster.save()
            except OSError as err:
                log.warning("Could not save the cluster config on shutdown: %s", err)
        for server in self._servers:
            try:
                await asyncio.wait_for(server.wait_closed(), timeout=2)
            except (TimeoutError, Exception):
                pass
        if self.config.pidfile:
            try:
                os.unlink(self.config.pidfile)
            except OSError:
                pass
        log.warning("Disque is now ready to exit, bye bye...")
        self._stopped.set()

    def _close_listeners(self) -> None:
        """No new client connections (the stop, and the drain's first step)."""
        for server in self._servers:
            server.close()
        if self._tls is not None:
            self._tls.stop()
            self._tls = None

    async def wait_stopped(self) -> None:
        await self._stopped.wait()


def _announce(config: Config, cluster: ClusterState, port: int) -> None:
    """The address peers and clients are told (Redis's cluster-announce-*):
    the client port announced, else ours; the bus port announced, else ours
    + 10000 (0 in the table when it is the announced port + 10000, which the
    original's nodes assume)."""
    me = cluster.myself
    cluster.announce_ip = config.cluster_announce_ip
    me.port = config.cluster_announce_port or port
    bus_port = config.cluster_announce_bus_port or port + BUS_PORT_OFFSET
    me.bus_port = 0 if bus_port == me.port + BUS_PORT_OFFSET else bus_port


def _watch_clients(state: ServerState, now: float) -> None:
    """Once a second: every client's limits in time (the soft output limit,
    auth-timeout: ClientConnection.watch), then the buffers into used_memory.

    Counted: replies and bus messages waiting to be sent (a reply buffer
    grows while its reader is slow, and stays) and commands queued behind a
    blocked one.  Not the request being received: it is counted as the
    data it adds once it runs; a snapshot of it taken mid-transfer would
    count it for up to a second after it ran (a large ADDJOBS then refused
    for memory it no longer held).
    """
    config = state.config
    output_limit = config.client_output_buffer_limit
    soft, soft_seconds = output_limit.soft, output_limit.soft_seconds
    auth_timeout: int = config.auth_timeout
    clients = 0
    for client in list(state.clients.values()):
        if soft or auth_timeout:
            client.watch(now, soft, soft_seconds, auth_timeout)
        clients += client.output_pending() + client.pending_bytes
    links = state.bus.unsent_bytes() if state.bus is not None else 0
    state.memory.set_buffers(clients, links)


def _check_writable(directory: str) -> None:
    """Refuse to start in a directory the node cannot write (nodes.conf, the
    AOF): better now, with the reason, than at the first save."""
    try:
        fd, path = tempfile.mkstemp(prefix=".disque-write-check-", dir=".")
    except OSError as err:
        raise SystemExit(f"Can't write to the working directory '{directory}': "
                         f"{err.strerror}") from None
    os.close(fd)
    os.unlink(path)


def _bus_port_free(bind: list[str], port: int) -> bool:
    """Whether port + 10000 can be bound on every bind address."""
    for address in bind:
        host = "" if address in ("*", "0.0.0.0") else address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port + BUS_PORT_OFFSET))
            except OSError:
                return False
    return True


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

USAGE = """Usage: disque-server [/path/to/disque.conf] [options]
       disque-server -v or --version
       disque-server -h or --help
       disque-server --print-config [/path/to/disque.conf] [options]

Examples:
       disque-server                      (127.0.0.1:7711, no config file needed)
       disque-server /etc/disque/disque.conf
       disque-server --port 7777 --dir /var/lib/disque
       disque-server /etc/mydisque.conf --loglevel verbose
"""


def _daemonize() -> int:
    """Detach like the original with ``daemonize yes`` (double fork).

    The command does not return before the node serves: the first parent
    waits on a pipe until the node reports (:func:`_report_start`) that it
    listens, then exits 0, or prints why it could not start and exits 1.
    Returns the pipe's write end, in the detached node.
    """
    read_fd, write_fd = os.pipe()
    if os.fork() > 0:
        os.close(write_fd)
        os._exit(_wait_for_start(read_fd))
    os.close(read_fd)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return write_fd


#: What the detached node writes on the start-up pipe once it listens.
STARTED = b"started"


def _wait_for_start(read_fd: int) -> int:
    chunks = []
    while chunk := os.read(read_fd, 4096):
        chunks.append(chunk)
    report = b"".join(chunks)
    if report == STARTED:
        return 0
    reason = report.decode("utf-8", "replace") or "the node exited during start-up"
    print(f"disque-server: {reason}", file=sys.stderr)
    return 1


def _report_start(fd: int | None, report: bytes) -> None:
    if fd is None:
        return
    try:
        os.write(fd, report)
        os.close(fd)
    except OSError:
        pass


async def _serve(config: Config, started: Callable[[], None]) -> None:
    server = DisqueServer(config)
    await server.start()
    started()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.signal_stop)
    await server.wait_stopped()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    if args and args[0] in ("-v", "--version"):
        print(f"Disque server v={__version__} (python, core: {_native.describe()})")
        return 0
    print_config = bool(args) and args[0] == "--print-config"
    try:
        config = Config.from_args(args[1:] if print_config else args)
    except ConfigError as err:
        print(f"\n*** FATAL CONFIG FILE ERROR ***\n{err}\n", file=sys.stderr)
        return 1
    if print_config:  # every directive, commented: a sample disque.conf
        sys.stdout.write(config.render())
        return 0
    report_fd: int | None = None
    if config.daemonize:
        if not config.logfile:
            config.logfile = os.devnull
        report_fd = _daemonize()
    try:
        setup_logging(config.loglevel, config.logfile)
        if config.pidfile:
            with open(config.pidfile, "w") as fh:
                fh.write(f"{os.getpid()}\n")
    except OSError as err:
        reason = f"Can't open '{err.filename}': {err.strerror}"
        _report_start(report_fd, reason.encode())
        print(f"disque-server: {reason}", file=sys.stderr)
        return 1
    runner: Callable[..., Any]
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency; fall back anyway
        runner = asyncio.run
    try:
        runner(_serve(config, lambda: _report_start(report_fd, STARTED)))
    except SystemExit as err:
        if isinstance(err.code, str):
            logging.getLogger("disque.server").error("%s", err.code)
            # The log may be a file nobody is looking at: say it where the
            # command was run too (the daemon's parent prints it).
            if report_fd is not None:
                _report_start(report_fd, err.code.encode())
            elif config.logfile:
                print(f"disque-server: {err.code}", file=sys.stderr)
            if config.pidfile:
                with contextlib.suppress(OSError):
                    os.unlink(config.pidfile)
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
