"""The Prometheus endpoint (``metrics-port``, an extension, off by default).

``GET /metrics`` on ``metrics-port`` answers in the Prometheus text format
(``prometheus-client`` writes it).  The samples are built at scrape time
from what the node already counts (the INFO figures, each queue's
``jobs_in``/``jobs_out``, the bus's counters, the AOF's status), by one
custom collector: nothing is added to the command path, and the numbers
cannot drift from INFO's.  The HTTP side is a few lines of asyncio on the
node's own event loop, so a scrape reads the state between two commands,
never while one runs (prometheus-client's own server is a thread).

Rates (jobs in/out per second) are PromQL's job:
``rate(disque_queue_enqueued_total[1m])``.  A queue's counters start again
from 0 when an idle empty queue is evicted and later re-created; ``rate()``
takes such resets in its stride, and the node-wide totals
(``disque_jobs_enqueued_total``) include evicted queues and never go down.

The same port answers the probes, ``GET /healthz`` and ``GET /readyz``
(``health.py`` says what they mean).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from . import __version__, _native
from .cluster import messages
from .federation import waiting_asks
from .groups import oldest_waiting_age_ms

if TYPE_CHECKING:
    from .health import Health
    from .state import ServerState

__all__ = ["NodeCollector", "MetricsServer", "make_registry"]

log = logging.getLogger("disque.metrics")

#: Node states of ``disque_cluster_node_state`` (one series each, 1 for the current one).
NODE_STATES = ("ok", "pfail", "fail", "handshake", "leaving", "noaddr")
#: A request (line and headers) larger than this is refused: scrapers send a few hundred bytes.
MAX_REQUEST = 8192
#: A connection that has not sent its request by then is closed.
REQUEST_TIMEOUT_S = 10.0


def _label(raw: bytes) -> str:
    # Queue names are bytes; a label is text.  Undecodable bytes stay visible.
    return raw.decode("utf-8", "backslashreplace")


def _node_state(flags: set[str]) -> str:
    for flag, name in (("handshake", "handshake"), ("fail", "fail"), ("fail?", "pfail"),
                       ("leaving", "leaving"), ("noaddr", "noaddr")):
        if flag in flags:
            return name
    return "ok"


class NodeCollector(Collector):
    """Every sample of ``/metrics``, read from ``state`` when Prometheus asks."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        yield from self._node()
        yield from self._queues()
        yield from self._replication()
        yield from self._cluster()
        yield from self._aof()

    # -- the node -------------------------------------------------------------

    def _node(self) -> Iterator[Metric]:
        state = self.state
        stats = state.stats
        info = GaugeMetricFamily("disque_info", "The node: version, ID, core",
                                 labels=["version", "node_id", "core"])
        info.add_metric([__version__, state.cluster.myself_id, _native.activate()], 1)
        yield info
        yield GaugeMetricFamily("disque_uptime_seconds", "Seconds since the node started",
                                value=time.time() - state.started)
        gauges = (
            ("disque_connected_clients", "Client connections", len(state.clients)),
            ("disque_blocked_clients", "Clients blocked in GETJOB or ADDJOB",
             state.blocked_clients),
            ("disque_memory_used_bytes", "Memory used (INFO used_memory)", state.memory.used),
            ("disque_memory_max_bytes", "maxmemory", state.memory.maxmemory),
            ("disque_memory_warning_level", "0 normal, 1-3 rising memory pressure",
             state.memory.level()),
            ("disque_jobs", "Jobs registered on this node, in every state", len(state.jobs)),
            ("disque_queues", "Queues on this node", len(state.queues)),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=float(value))
        queues = list(state.queues.all())
        counters: list[tuple[str, str, float]] = [
            ("disque_connections_received", "Client connections accepted",
             stats.connections_received),
            ("disque_connections_rejected", "Client connections refused (maxclients)",
             stats.rejected_connections),
            ("disque_tls_handshake_failures", "TLS-port connections whose handshake failed",
             stats.tls_handshake_failures),
            ("disque_client_limit_disconnections",
             "Clients closed for their pending input or output, or for not authenticating "
             "in time (client-query-buffer-limit, client-output-buffer-limit, auth-timeout)",
             stats.client_query_buffer_limit_disconnections
             + stats.client_output_buffer_limit_disconnections
             + stats.auth_timeout_disconnections),
            ("disque_commands_processed", "Commands run", stats.commands_processed),
            ("disque_net_input_bytes", "Bytes read from clients", stats.net_input_bytes),
            ("disque_net_output_bytes", "Bytes written to clients", stats.net_output_bytes),
            ("disque_jobs_enqueued", "Jobs put in a queue (new, requeued, NACKed)",
             stats.evicted_queues_jobs_in + sum(q.jobs_in for q in queues)),
            ("disque_jobs_dequeued", "Jobs taken out of a queue (delivered, acked, moved)",
             stats.evicted_queues_jobs_out + sum(q.jobs_out for q in queues)),
            ("disque_jobs_added", "Jobs made by ADDJOB (ADDJOBS: each body) on this node",
             stats.added_jobs),
            ("disque_jobs_delivered", "Jobs handed to clients by GETJOB",
             stats.delivered_jobs),
            ("disque_jobs_acked", "Jobs acknowledged by ACKJOB or FASTACK on this node",
             stats.acked_jobs),
            ("disque_jobs_expired", "Jobs removed at the end of their TTL", stats.expired_jobs),
            ("disque_jobs_evicted", "Jobs evicted under memory pressure", stats.evicted_jobs),
            ("disque_queues_evicted", "Idle empty queues dropped", stats.evicted_queues),
        ]
        counters.append(("disque_dead_lettered_jobs", "Jobs moved to a dead-letter queue",
                         stats.dead_lettered_jobs))
        for name, doc, total in counters:
            yield CounterMetricFamily(name, doc, value=total)
        denials = CounterMetricFamily(
            "disque_acl_denials", "Commands refused by users' permissions (-NOPERM: reason "
            "command or queue) and failed AUTHs (reason auth; user empty when unknown)",
            labels=["user", "reason"])
        for (user, reason), count in state.acl.denials.items():
            denials.add_metric([user, reason], count)
        yield denials
        yield GaugeMetricFamily("disque_acl_users", "Users (ACL), default included",
                                value=len(state.acl.users))

    # -- queues ---------------------------------------------------------------

    def _queues(self) -> Iterator[Metric]:
        length = GaugeMetricFamily("disque_queue_length", "Jobs queued (QLEN)",
                                   labels=["queue"])
        blocked = GaugeMetricFamily("disque_queue_blocked_clients",
                                    "Clients blocked in GETJOB on the queue", labels=["queue"])
        paused = GaugeMetricFamily("disque_queue_paused",
                                   "Pause flags: 1 in, 2 out, 3 all", labels=["queue"])
        enqueued = CounterMetricFamily("disque_queue_enqueued", "Jobs put in the queue "
                                       "since it was created (QSTAT jobs-in)", labels=["queue"])
        dequeued = CounterMetricFamily("disque_queue_dequeued", "Jobs taken out of the queue "
                                       "since it was created (QSTAT jobs-out)", labels=["queue"])
        by_priority = GaugeMetricFamily(
            "disque_queue_priority_length", "Jobs queued with a priority above 0 (QSTAT "
            "priorities; only priorities holding jobs)", labels=["queue", "priority"])
        limit_max = GaugeMetricFamily(
            "disque_queue_rate_limit_jobs", "QLIMIT: jobs the queue may deliver per period "
            "(only rate-limited queues)", labels=["queue"])
        limit_period = GaugeMetricFamily(
            "disque_queue_rate_limit_period_seconds", "QLIMIT: the period of the limit",
            labels=["queue"])
        limited = CounterMetricFamily(
            "disque_queue_rate_limited", "GETJOB fetches the queue's rate limit held back "
            "(QSTAT rate-limited)", labels=["queue"])
        groups_held = GaugeMetricFamily(
            "disque_queue_groups_held", "GROUP: groups with a job delivered and not "
            "settled (QSTAT groups-held; only queues with groups)", labels=["queue"])
        groups_waiting = GaugeMetricFamily(
            "disque_queue_groups_waiting", "GROUP: held groups with jobs waiting behind "
            "them (QSTAT groups-waiting)", labels=["queue"])
        groups_age = GaugeMetricFamily(
            "disque_queue_oldest_waiting_group_age_seconds", "GROUP: how long the group "
            "held longest with jobs waiting behind it has been so "
            "(QSTAT oldest-waiting-group-age)", labels=["queue"])
        now = self.state.clock.now_ms()
        for q in self.state.queues.limited.values():
            limit = q.limit
            if limit is not None:
                name = [_label(q.name)]
                limit_max.add_metric(name, limit.max_jobs)
                limit_period.add_metric(name, limit.period_ms / 1000)
                limited.add_metric(name, limit.limited)
        for q in self.state.queues.all():
            name = [_label(q.name)]
            length.add_metric(name, len(q))
            blocked.add_metric(name, len(q.waiters))
            paused.add_metric(name, q.flags & 3)
            enqueued.add_metric(name, q.jobs_in)
            dequeued.add_metric(name, q.jobs_out)
            for priority, jobs in q.jobs.priorities():
                by_priority.add_metric([*name, str(priority)], jobs)
            groups = q.groups
            if groups is not None:
                groups_held.add_metric(name, groups.held)
                groups_waiting.add_metric(name, len(groups.blocked))
                groups_age.add_metric(name, oldest_waiting_age_ms(q, now) / 1000)
        yield from (length, blocked, paused, enqueued, dequeued, by_priority, limit_max,
                    limit_period, limited, groups_held, groups_waiting, groups_age)

    # -- replication ------------------------------------------------------------

    def _replication(self) -> Iterator[Metric]:
        histogram = self.state.replication_latency
        family = HistogramMetricFamily(
            "disque_replication_latency_seconds",
            "ADDJOB (synchronous replication) to replication achieved")
        family.add_metric([], histogram.cumulative(), histogram.total)
        yield family
        yield GaugeMetricFamily("disque_replicating_jobs",
                                "ADDJOBs waiting for their copies now",
                                value=len(self.state.replicating))

    # -- the cluster bus ----------------------------------------------------------

    def _cluster(self) -> Iterator[Metric]:
        state = self.state
        cluster = state.cluster
        now = state.clock.now_ms()
        yield GaugeMetricFamily("disque_cluster_known_nodes", "Nodes in the table, this one too",
                                value=len(cluster.nodes))
        yield GaugeMetricFamily("disque_cluster_reachable_nodes",
                                "Other nodes reachable now", value=cluster.reachable_count)
        link_up = GaugeMetricFamily("disque_cluster_link_up",
                                    "1 if our outbound bus link to the node is connected",
                                    labels=["node", "address"])
        node_state = GaugeMetricFamily("disque_cluster_node_state",
                                       "The node's state as this node sees it (1 = current)",
                                       labels=["node", "address", "state"])
        pong_age = GaugeMetricFamily("disque_cluster_node_pong_age_seconds",
                                     "Seconds since the node last answered a PING",
                                     labels=["node", "address"])
        for node in cluster.nodes.values():
            if "myself" in node.flags:
                continue
            labels = [node.id, f"{node.ip}:{node.port}"]
            link_up.add_metric(labels, int(node.link is not None))
            current = _node_state(node.flags)
            for name in NODE_STATES:
                node_state.add_metric([*labels, name], int(name == current))
            if node.pong_received:
                pong_age.add_metric(labels, max(now - node.pong_received, 0) / 1000)
        yield from (link_up, node_state, pong_age)
        bus = state.bus
        if bus is None:
            return
        received = CounterMetricFamily("disque_cluster_messages_received",
                                       "Bus messages received, by type", labels=["type"])
        for msg_type, count in sorted(bus.stats_received.items()):
            received.add_metric([messages.TYPE_NAMES[msg_type]], count)
        yield received
        auth = bus.auth
        for name, doc, value in (
                ("disque_cluster_messages_sent", "Bus messages sent", bus.stats_sent),
                ("disque_cluster_sent_bytes", "Bytes written to bus links",
                 bus.stats_sent_bytes),
                ("disque_cluster_messages_dropped",
                 "Bus messages dropped (bad length, unknown type or sender)",
                 bus.stats_dropped),
                ("disque_cluster_bad_links", "Bus links closed for breaking the framing",
                 bus.stats_bad_links),
                ("disque_cluster_messages_refused",
                 "Bus messages refused for a missing or wrong cluster secret",
                 auth.refused if auth is not None else 0),
                ("disque_cluster_links_refused",
                 "Inbound bus links refused at cluster-max-inbound-links, all proven",
                 bus.stats_links_refused),
                ("disque_cluster_unproven_links_closed",
                 "Inbound bus links closed for proving nothing in time, or to make room",
                 bus.stats_unproven_closed),
                ("disque_cluster_tls_handshake_failures",
                 "Bus TLS handshakes that failed, both ways (tls-cluster)",
                 bus.stats_tls_failures)):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("disque_cluster_inbound_links", "Bus links other nodes opened",
                                value=len(bus.inbound))
        stats = state.stats
        for name, doc, value in (
                ("disque_cluster_needjobs_sent", "NEEDJOBS sent (federation), one per node asked",
                 stats.needjobs_sent),
                ("disque_cluster_yourjobs_sent", "YOURJOBS sent (federation)",
                 stats.yourjobs_sent),
                ("disque_cluster_yourjobs_pushed",
                 "YOURJOBS sent after their NEEDJOBS came (pushed, or paced under load)",
                 stats.yourjobs_pushed),
                ("disque_cluster_jobs_exported", "Jobs sent to other nodes by YOURJOBS",
                 stats.jobs_exported)):
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily("disque_cluster_federation_asks",
                                "Other nodes' NEEDJOBS waiting here for jobs to push",
                                value=waiting_asks(state))

    # -- persistence -------------------------------------------------------------

    def _aof(self) -> Iterator[Metric]:
        aof = self.state.persistence
        fields: dict[str, Any] = dict(aof.info_fields()) if aof is not None else {}
        gauges = (
            ("disque_aof_enabled", "1 if the AOF is on", int(fields.get("aof_enabled", 0))),
            ("disque_aof_loading", "1 while the AOF is being loaded",
             int(fields.get("loading", 0))),
            ("disque_aof_rewrite_in_progress", "1 during an AOF rewrite",
             int(fields.get("aof_rewrite_in_progress", 0))),
            ("disque_aof_rewrite_scheduled", "1 if a rewrite waits to start",
             int(fields.get("aof_rewrite_scheduled", 0))),
            ("disque_aof_last_write_ok", "0 if the last AOF write or fsync failed",
             int(fields.get("aof_last_write_status", "ok") == "ok")),
            ("disque_aof_last_rewrite_ok", "0 if the last AOF rewrite failed",
             int(fields.get("aof_last_bgrewrite_status", "ok") == "ok")),
            ("disque_aof_size_bytes", "AOF size", int(fields.get("aof_current_size", 0))),
            ("disque_aof_base_size_bytes", "AOF size after the last rewrite",
             int(fields.get("aof_base_size", 0))),
            ("disque_aof_buffer_bytes", "Bytes waiting to be written to the AOF",
             int(fields.get("aof_buffer_length", 0))),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(name, doc, value=value)
        yield CounterMetricFamily("disque_aof_rewrites", "AOF rewrites done",
                                  value=int(fields.get("aof_rewrites", 0)))
        yield CounterMetricFamily("disque_aof_delayed_fsyncs",
                                  "Writes that waited for a slow fsync (everysec)",
                                  value=int(fields.get("aof_delayed_fsync", 0)))


def make_registry(state: ServerState) -> CollectorRegistry:
    """The node's collector, plus the process's CPU, memory and file descriptors."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(state))
    ProcessCollector(registry=registry)
    return registry


# --------------------------------------------------------------------------
# The HTTP endpoint
# --------------------------------------------------------------------------

def _response(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8",
              head: bool = False) -> bytes:
    header = (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
              f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    return header if head else header + body


class MetricsProtocol(asyncio.Protocol):
    """One scrape: read the request head, answer, close (``Connection: close``)."""

    def __init__(self, registry: CollectorRegistry, health: Health | None = None) -> None:
        self.registry = registry
        self.health = health
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.timer = asyncio.get_running_loop().call_later(REQUEST_TIMEOUT_S, transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def data_received(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_REQUEST:
                self._reply(_response("431 Request Header Fields Too Large", b"too large\n"))
            return
        self._reply(self.answer(bytes(self.buffer[:end])))

    def answer(self, head: bytes) -> bytes:
        words = head.split(b"\r\n", 1)[0].split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            return _response("400 Bad Request", b"bad request\n")
        method, target = words[0], words[1].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            return _response("405 Method Not Allowed", b"GET /metrics\n")
        head_only = method == b"HEAD"
        if target == b"/healthz":
            return _response("200 OK", b"ok\n", head=head_only)
        if target == b"/readyz":
            if self.health is None:
                return _response("200 OK", b"ready\n", head=head_only)
            ready, reason = self.health.ready()
            return _response("200 OK" if ready else "503 Service Unavailable",
                             reason.encode() + b"\n", head=head_only)
        if target != b"/metrics":
            return _response("404 Not Found", b"GET /metrics\n", head=method == b"HEAD")
        try:
            body = generate_latest(self.registry)
        except Exception:  # a bug: the scrape fails, the node goes on
            log.exception("Error collecting metrics")
            return _response("500 Internal Server Error", b"error collecting metrics\n")
        return _response("200 OK", body, CONTENT_TYPE_LATEST, head=method == b"HEAD")

    def _reply(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)
        self.transport.close()


class MetricsServer:
    """The listeners of ``metrics-port`` on ``metrics-bind``."""

    def __init__(self, state: ServerState, health: Health | None = None) -> None:
        self.registry = make_registry(state)
        self.health = health
        self._servers: list[asyncio.base_events.Server] = []

    async def start(self, bind: list[str], port: int,
                    sockets: list[socket.socket] | None = None) -> None:
        """Listen on ``bind``:``port``, or on ``sockets`` already bound
        (health.bind_sockets: the port answered during the AOF load)."""
        loop = asyncio.get_running_loop()
        for sock in sockets or []:
            self._servers.append(await loop.create_server(
                lambda: MetricsProtocol(self.registry, self.health), sock=sock))
        for address in bind if sockets is None else []:
            host = None if address == "*" else address
            try:
                server = await loop.create_server(
                    lambda: MetricsProtocol(self.registry, self.health), host, port,
                    reuse_address=True)
            except OSError as err:
                self.stop()
                raise SystemExit(f"Could not create the metrics TCP listening socket "
                                 f"{address}:{port}: {err.strerror}") from None
            self._servers.append(server)
        log.info("Prometheus metrics on %s (probes: /healthz, /readyz)",
                 ", ".join(f"http://{a}:{port}/metrics" for a in bind))

    def stop(self) -> None:
        for server in self._servers:
            server.close()
        self._servers.clear()
