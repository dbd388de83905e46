"""CLUSTER subcommands: membership (MEET, FORGET, RESET, LEAVING) and views
of the node table (NODES, INFO, MYID).  The rules behind them live in
``cluster/membership.py``; these handlers only parse and answer."""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from ..cluster.nodes_file import node_line
from ..federation import waiting_asks
from ..job import JobIdGenerator
from ..protocol import OK, ReplyError, Status
from ..reset import flush_all
from ..waiters import unblock_all
from .jobs import LEAVING_ERROR
from .registry import SYNTAX_ERROR, CommandError, command, parse_int

if TYPE_CHECKING:
    from ..cluster.bus import ClusterBus
    from ..connection import ClientConnection
    from ..state import ServerState

_SUBCOMMANDS = "MEET, NODES, INFO, MYID, RESET, LEAVING, FORGET, SAVECONFIG"


@command("cluster", -2, "admin")
def cluster(state: ServerState, client: ClientConnection, argv: list[bytes]) -> Any:
    sub = argv[1].lower()
    n = len(argv)
    handler = _HANDLERS.get(sub)
    if handler is None:
        raise CommandError(f"ERR Wrong CLUSTER subcommand or number of arguments, "
                           f"try one of {_SUBCOMMANDS}")
    return handler(state, client, argv[2:], n)


def _meet(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    # CLUSTER MEET ip port [bus-port]: the bus port as Redis's, for a node
    # that announces one other than port + 10000 (cluster-announce-bus-port).
    if len(args) not in (2, 3):
        raise CommandError("ERR Wrong number of arguments for CLUSTER MEET")
    ip = args[0].decode("utf-8", "replace")
    raw_port = args[1].decode("utf-8", "replace")
    port = parse_int(args[1], f"ERR Invalid TCP port specified: {raw_port}", 0, 65535)
    bus_port = 0
    if len(args) == 3:
        raw_bus = args[2].decode("utf-8", "replace")
        bus_port = parse_int(args[2], f"ERR Invalid TCP bus port specified: {raw_bus}", 1,
                             65535)
        if bus_port == port + 10000:
            bus_port = 0
    try:
        ipaddress.ip_address(ip)
    except ValueError:
        raise CommandError(f"ERR Invalid node address specified: {ip}:{port}") from None
    if port > 55535 and not bus_port:
        raise CommandError(f"ERR Invalid node address specified: {ip}:{port}")
    _bus(state).membership.meet(ip, port, bus_port)  # a handshake under way: OK too
    return OK


def _nodes(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if args:
        raise CommandError(SYNTAX_ERROR)
    lines = []
    for node in state.cluster.nodes.values():
        line = node_line(node)
        if node is state.cluster.myself and node.ip in ("", "0.0.0.0", "::"):
            line = line.replace(f" {node.ip}:", f" {client.local_ip}:", 1)
        lines.append(line)
    return "\n".join(lines) + "\n"


def _info(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if args:
        raise CommandError(SYNTAX_ERROR)
    cl = state.cluster
    bus = _bus(state)
    stats = state.stats
    fields = [
        ("cluster_state", "ok"),
        ("cluster_known_nodes", len(cl.nodes)),
        ("cluster_reachable_nodes", cl.reachable_count),
        ("cluster_size", cl.size),
        ("cluster_stats_messages_sent", bus.stats_sent),
        ("cluster_stats_messages_received", bus.messages_received),
        # Ours: batching between our nodes (messages.CAP_BATCH).
        ("cluster_stats_messages_merged", bus.stats_merged),
        ("cluster_stats_batches_received", bus.stats_batches_received),
        # Ours: federation (NEEDJOBS asks, YOURJOBS answers and pushes).
        ("cluster_stats_needjobs_sent", stats.needjobs_sent),
        ("cluster_stats_yourjobs_sent", stats.yourjobs_sent),
        ("cluster_stats_yourjobs_pushed", stats.yourjobs_pushed),
        ("cluster_stats_jobs_exported", stats.jobs_exported),
        ("cluster_federation_asks", waiting_asks(state)),
        ("cluster_leaving", "yes" if cl.leaving else "no"),
    ]
    return "".join(f"{k}:{v}\r\n" for k, v in fields)


def _myid(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if args:
        raise CommandError(SYNTAX_ERROR)
    return state.cluster.myself_id.encode()


def _reset(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if len(args) > 1:
        raise CommandError(SYNTAX_ERROR)
    mode = args[0].lower() if args else b"soft"
    if mode not in (b"soft", b"hard"):
        raise CommandError(SYNTAX_ERROR)
    flush_all(state)
    state.cluster.reset(hard=mode == b"hard")
    state.ids = JobIdGenerator(state.cluster.myself_id)  # new node ID prefix after HARD
    return OK


def _leaving(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if not args:
        return Status("yes" if state.cluster.leaving else "no")
    if len(args) != 1 or args[0].lower() not in (b"yes", b"no"):
        raise CommandError("ERR CLUSTER LEAVING takes yes or no")
    leaving = args[0].lower() == b"yes"
    state.cluster.set_leaving(leaving)
    if state.bus is not None:
        state.bus.membership.ping_all()  # tell the others now, not at the next ping
    if leaving:
        unblock_all(state, ReplyError(LEAVING_ERROR))
    return OK


def _forget(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if len(args) != 1:
        raise CommandError("ERR Wrong number of arguments for CLUSTER FORGET")
    node_id = args[0].decode("utf-8", "replace")
    if len(node_id) != 40 or any(c not in "0123456789abcdef" for c in node_id):
        raise CommandError("ERR Invalid node identifier")
    if node_id == state.cluster.myself_id:
        raise CommandError("ERR I tried hard but I can't forget myself...")
    node = state.cluster.nodes.get(node_id)
    if node is None:
        raise CommandError(f"ERR Unknown node {node_id}")
    _bus(state).membership.forget(node)
    return OK


def _saveconfig(state: ServerState, client: ClientConnection, args: list[bytes], n: int) -> Any:
    if args:
        raise CommandError(SYNTAX_ERROR)
    try:
        state.cluster.save()
    except OSError as err:
        raise CommandError(f"ERR error saving the cluster node config: {err}") from None
    return OK


def _bus(state: ServerState) -> ClusterBus:
    if state.bus is None:  # only a state driven without a server (unit tests)
        raise CommandError("ERR the cluster bus is not running")
    return state.bus


_HANDLERS = {
    b"meet": _meet, b"nodes": _nodes, b"info": _info, b"myid": _myid, b"reset": _reset,
    b"leaving": _leaving, b"forget": _forget, b"saveconfig": _saveconfig,
}
