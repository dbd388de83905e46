"""``nodes.conf``: the node ID and known peers, kept across restarts.

One line per node, as CLUSTER NODES prints it::

    <id> <ip>:<port>[@<bus port>] <flags> <ping_sent_ms> <pong_recv_ms> connected|disconnected

``@<bus port>`` only for a node that announces one other than port + 10000
(``cluster-announce-bus-port``), as Redis writes it.

Written to a temporary file, fsynced and renamed, so a crash never leaves a
half-written file (the original wrote in place).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable

from .node import KNOWN_FLAGS, ClusterNode

_NODE_ID = re.compile(r"^[0-9a-f]{40}$")


class NodesFileError(Exception):
    """nodes.conf exists but cannot be used; the node refuses to start."""


def node_line(node: ClusterNode) -> str:
    link = "connected" if node.link is not None or "myself" in node.flags else "disconnected"
    bus = f"@{node.bus_port}" if node.bus_port else ""
    return (f"{node.id} {node.ip}:{node.port}{bus} {node.flags_string()} "
            f"{node.ping_sent} {node.pong_received} {link}")


def save_nodes_file(path: str, nodes: Iterable[ClusterNode]) -> None:
    lines = [node_line(n) for n in nodes if "handshake" not in n.flags]
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError:
        # A full disk: leave no half-written file behind to take more room.
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    directory = os.path.dirname(os.path.abspath(path))
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_nodes_file(path: str) -> list[ClusterNode] | None:
    """The nodes saved in ``path``, or None if it is missing or empty."""

    try:
        with open(path, encoding="ascii") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise NodesFileError(f"Unable to read the cluster config file {path}: {err}") from None
    nodes: list[ClusterNode] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 6 or not _NODE_ID.match(fields[0]) or ":" not in fields[1]:
            raise NodesFileError(f"Unrecoverable error: corrupted cluster config file "
                                 f"{path} at line {lineno}: {line!r}")
        ip, _, port = fields[1].rpartition(":")
        port, _, bus_port = port.partition("@")
        flags = set() if fields[2] == "noflags" else set(fields[2].split(","))
        unknown = flags.difference(KNOWN_FLAGS)
        if unknown or not port.isdigit() or (bus_port and not bus_port.isdigit()):
            raise NodesFileError(f"Unrecoverable error: corrupted cluster config file "
                                 f"{path} at line {lineno}: {line!r}")
        if not (fields[3].isdigit() and fields[4].isdigit()):
            raise NodesFileError(f"Unrecoverable error: corrupted cluster config file "
                                 f"{path} at line {lineno}: {line!r}")
        # As the original: a ping or pong time saved means "recently", now.
        now = time.time_ns() // 1_000_000
        nodes.append(ClusterNode(fields[0], ip, int(port), flags,
                                 ping_sent=now if int(fields[3]) else 0,
                                 pong_received=now if int(fields[4]) else 0,
                                 bus_port=int(bus_port) if bus_port else 0))
    if not nodes:
        return None
    myself_count = sum(1 for n in nodes if "myself" in n.flags)
    if myself_count != 1 or len({n.id for n in nodes}) != len(nodes):
        raise NodesFileError(f"Unrecoverable error: corrupted cluster config file {path}: "
                             "exactly one 'myself' node and unique IDs are required")
    return nodes
