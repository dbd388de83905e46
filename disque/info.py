"""The INFO report: ``# Section`` headers and ``field:value`` lines."""

from __future__ import annotations

import os
import platform
import resource
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from . import __version__, _native

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["info_text", "SECTIONS"]


def human_bytes(n: int) -> str:
    for unit, size in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return f"{n}B"


def _server(state: ServerState) -> list[tuple[str, object]]:
    # On the node's clock: a step of the system clock does not change it.
    uptime = int(state.clock.now_ms() / 1000 - state.started)
    return [
        ("disque_version", __version__),
        ("disque_implementation", "python"),
        # "compiled (mypyc)", or "interpreted" with the reason (disque/_native.py).
        ("disque_core", _native.describe()),
        ("python_version", platform.python_version()),
        ("os", f"{platform.system()} {platform.release()} {platform.machine()}"),
        ("arch_bits", 64 if sys.maxsize > 2 ** 32 else 32),
        ("multiplexing_api", state.event_loop_name),
        ("process_id", os.getpid()),
        ("run_id", state.run_id),
        ("tcp_port", state.tcp_port),
        ("uptime_in_seconds", uptime),
        ("uptime_in_days", uptime // 86400),
        # The system clock minus the node's (clock.py): not 0 after a step.
        ("clock_skew_ms", state.clock.skew_ms()),
        ("hz", state.config.hz),
        ("config_file", state.config.config_file or ""),
        ("node_id", state.cluster.myself_id),
        ("cluster_known_nodes", len(state.cluster.nodes)),
        ("cluster_reachable_nodes", state.cluster.reachable_count),
        ("cluster_leaving", "yes" if state.cluster.leaving else "no"),
    ]


def _clients(state: ServerState) -> list[tuple[str, object]]:
    clients = list(state.clients.values())
    return [
        ("connected_clients", len(clients)),
        ("client_longest_output_list", max((c.output_pending() for c in clients), default=0)),
        ("client_biggest_input_buf", max((c.input_pending() for c in clients), default=0)),
        ("blocked_clients", state.blocked_clients),
    ]


def _memory(state: ServerState) -> list[tuple[str, object]]:
    from .memory import rss_bytes

    memory = state.memory
    used = memory.used
    rss = rss_bytes()
    return [
        ("used_memory", used),
        ("used_memory_human", human_bytes(used)),
        ("used_memory_rss", rss),
        ("used_memory_rss_human", human_bytes(rss)),
        ("used_memory_peak", memory.peak),
        ("used_memory_peak_human", human_bytes(memory.peak)),
        ("used_memory_startup", memory.startup),
        ("used_memory_dataset", memory.accounted),
        ("mem_clients_normal", memory.client_buffers),
        ("mem_cluster_links", memory.buffers - memory.client_buffers),
        ("maxmemory", memory.maxmemory),
        ("maxmemory_human", human_bytes(memory.maxmemory)),
        ("maxmemory_policy", state.config.maxmemory_policy),
        ("memory_warning_level", memory.level()),
        ("mem_fragmentation_ratio", f"{rss / used:.2f}" if used else "0.00"),
        ("mem_allocator", "pymalloc"),
    ]


def _jobs(state: ServerState) -> list[tuple[str, object]]:
    return [("registered_jobs", len(state.jobs))]


def _extensions(state: ServerState) -> list[tuple[str, object]]:
    """Counters of the extensions (docs/EXTENSIONS.md): only with ``INFO extensions``,
    so that a client of the original sees the original's sections."""
    dedup = state.idmp
    return [
        ("idmp_keys", len(dedup)),
        ("idmp_hits", dedup.hits),
        ("idmp_conflicts", dedup.conflicts),
        ("idmp_expired_keys", dedup.expired),
        ("idmp_evicted_keys", dedup.evicted),
        ("waitjob_clients", sum(len(w) for w in state.job_waiters.values())),
        # Users (ACL), named as Redis's INFO stats names them.
        ("acl_users", len(state.acl.users)),
        ("acl_access_denied_auth", state.acl.denial_total("auth")),
        ("acl_access_denied_cmd", state.acl.denial_total("command")),
        ("acl_access_denied_key", state.acl.denial_total("queue")),
        *_bus_counters(state),
    ]


def _bus_counters(state: ServerState) -> list[tuple[str, object]]:
    """What the cluster bus refused (cluster/bus.py, docs/CLUSTER.md)."""
    bus = state.bus
    if bus is None:
        return []
    return [
        ("cluster_bus_inbound_links", len(bus.inbound)),
        ("cluster_bus_unproven_links", bus.unproven_inbound()),
        ("cluster_bus_links_refused", bus.stats_links_refused),
        ("cluster_bus_unproven_links_closed", bus.stats_unproven_closed),
        ("cluster_bus_bad_links", bus.stats_bad_links),
        ("cluster_bus_messages_refused", bus.auth.refused if bus.auth is not None else 0),
        ("cluster_bus_tls_handshake_failures", bus.stats_tls_failures),
    ]


def _queues(state: ServerState) -> list[tuple[str, object]]:
    return [("registered_queues", len(state.queues))]


def _persistence(state: ServerState) -> list[tuple[str, object]]:
    if state.persistence is not None:
        return state.persistence.info_fields()
    return [  # a state without a server (in-process tests)
        ("loading", 0),
        ("aof_enabled", 0),
        ("aof_state", "off"),
        ("aof_rewrite_in_progress", 0),
        ("aof_rewrite_scheduled", 0),
        ("aof_last_rewrite_time_sec", -1),
        ("aof_current_rewrite_time_sec", -1),
        ("aof_last_bgrewrite_status", "ok"),
        ("aof_last_write_status", "ok"),
    ]


def _stats(state: ServerState) -> list[tuple[str, object]]:
    stats = state.stats
    return [
        ("total_connections_received", stats.connections_received),
        ("total_commands_processed", stats.commands_processed),
        ("instantaneous_ops_per_sec", state.instantaneous_ops()),
        ("total_net_input_bytes", stats.net_input_bytes),
        ("total_net_output_bytes", stats.net_output_bytes),
        ("rejected_connections", stats.rejected_connections),
        ("evicted_jobs", stats.evicted_jobs),
        ("evicted_queues", stats.evicted_queues),
        ("expired_jobs", stats.expired_jobs),
        # Extension: jobs this node moved to a dead-letter queue (MAXDELIVERIES).
        ("dead_lettered_jobs", stats.dead_lettered_jobs),
        # Extension: jobs added (ADDJOB here), delivered (GETJOB), acked (ACKJOB,
        # FASTACK) since start, for rates.
        ("added_jobs", stats.added_jobs),
        ("delivered_jobs", stats.delivered_jobs),
        ("acked_jobs", stats.acked_jobs),
        # The limits on clients (docs/SECURITY.md); the first two are Redis's names.
        ("client_query_buffer_limit_disconnections",
         stats.client_query_buffer_limit_disconnections),
        ("client_output_buffer_limit_disconnections",
         stats.client_output_buffer_limit_disconnections),
        ("auth_timeout_disconnections", stats.auth_timeout_disconnections),
        ("refused_queue_names", stats.refused_queue_names),
    ]


def _cpu(state: ServerState) -> list[tuple[str, object]]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return [
        ("used_cpu_sys", f"{me.ru_stime:.2f}"),
        ("used_cpu_user", f"{me.ru_utime:.2f}"),
        ("used_cpu_sys_children", f"{children.ru_stime:.2f}"),
        ("used_cpu_user_children", f"{children.ru_utime:.2f}"),
    ]


SECTIONS: dict[str, Callable[[ServerState], list[tuple[str, object]]]] = {
    "server": _server,
    "clients": _clients,
    "memory": _memory,
    "jobs": _jobs,
    "queues": _queues,
    "persistence": _persistence,
    "stats": _stats,
    "cpu": _cpu,
}

#: Sections reported only when named (not by INFO, INFO all or INFO everything).
EXTRA_SECTIONS: dict[str, Callable[[ServerState], list[tuple[str, object]]]] = {
    "extensions": _extensions,
}


def info_text(state: ServerState, section: str | None = None) -> str:
    """INFO [section]: all sections, or one ("all"/"default"/"everything" = all)."""
    wanted = (section or "default").lower()
    names = list(SECTIONS) if wanted in ("all", "default", "everything") else [wanted]
    parts: list[str] = []
    for name in names:
        build = SECTIONS.get(name) or EXTRA_SECTIONS.get(name)
        if build is None:
            continue
        lines = [f"# {name.capitalize()}"]
        lines.extend(f"{key}:{value}" for key, value in build(state))
        parts.append("\r\n".join(lines))
    return "\r\n\r\n".join(parts) + ("\r\n" if parts else "")
