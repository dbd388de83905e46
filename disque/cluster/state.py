"""This node's view of the cluster: identity, the node table, and sends.

The cluster bus (gossip, failure detection, the job messages) plugs in here:
the job state machine only calls the ``send_*``/``broadcast_*`` methods
below.  Each send goes over the outbound link to that node; a node without a
link gets nothing, exactly as in the original, where bus sends are best
effort.  Until the bus exists no peer ever has a link, so a one-node cluster
drops nothing it needed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from ..job import Job
from . import messages
from .nodes_file import NodesFileError, load_nodes_file, save_nodes_file

__all__ = ["ClusterNode", "ClusterState", "NodesFileError", "new_node_id"]

log = logging.getLogger("disque.cluster")

# Node flags, named like CLUSTER NODES prints them.
FLAG_MYSELF = "myself"
FLAG_PFAIL = "fail?"
FLAG_FAIL = "fail"
FLAG_HANDSHAKE = "handshake"
FLAG_NOADDR = "noaddr"
FLAG_LEAVING = "leaving"
KNOWN_FLAGS = (FLAG_MYSELF, FLAG_PFAIL, FLAG_FAIL, FLAG_HANDSHAKE, FLAG_NOADDR, FLAG_LEAVING)


def new_node_id() -> str:
    """40 random hex characters."""
    return os.urandom(20).hex()


class Link(Protocol):
    def send(self, message: bytes) -> None: ...


@dataclass
class ClusterNode:
    id: str
    ip: str
    port: int
    flags: set[str] = field(default_factory=set)
    ping_sent: int = 0
    pong_received: int = 0
    link: Link | None = None

    @property
    def priority(self) -> int:
        """HELLO priority: 1 reachable, 5 no link, 10 possibly failing, 100 failing/leaving."""
        if FLAG_FAIL in self.flags or FLAG_LEAVING in self.flags:
            return 100
        if FLAG_PFAIL in self.flags:
            return 10
        if FLAG_MYSELF not in self.flags and self.link is None:
            return 5
        return 1

    def flags_string(self) -> str:
        flags = [f for f in KNOWN_FLAGS if f in self.flags]
        return ",".join(flags) if flags else "noflags"


class ClusterState:
    """The node table, with ``myself`` always in it."""

    def __init__(self, myself: ClusterNode, config_path: str | None) -> None:
        myself.flags.add(FLAG_MYSELF)
        self.myself = myself
        self.nodes: dict[str, ClusterNode] = {myself.id: myself}
        self.config_path = config_path
        self.messages_dropped = 0
        # {myself}: the node set of every job made here, shared by all of them.
        self.myself_set: frozenset[str] = frozenset((myself.id,))

    # -- identity and persistence ------------------------------------------

    @classmethod
    def load_or_create(cls, config_path: str, ip: str, port: int) -> ClusterState:
        """Reuse the node ID (and peers) saved in ``config_path``, or make a new one."""
        nodes = load_nodes_file(config_path)
        if nodes is None:
            state = cls(ClusterNode(new_node_id(), ip, port), config_path)
            state.save()
            log.info("No cluster configuration found, I'm %s", state.myself_id)
            return state
        myself = next(n for n in nodes if FLAG_MYSELF in n.flags)
        myself.ip, myself.port = ip, port
        state = cls(myself, config_path)
        for node in nodes:
            state.nodes[node.id] = node
        log.info("Node configuration loaded, I'm %s", state.myself_id)
        return state

    def save(self) -> None:
        if self.config_path:
            save_nodes_file(self.config_path, self.nodes.values())

    @property
    def myself_id(self) -> str:
        return self.myself.id

    def reset(self, hard: bool) -> None:
        """CLUSTER RESET: forget every other node; HARD also takes a new ID."""
        self.nodes = {self.myself.id: self.myself}
        if hard:
            del self.nodes[self.myself.id]
            self.myself.id = new_node_id()
            self.myself_set = frozenset((self.myself.id,))
            self.nodes[self.myself.id] = self.myself
        self.myself.flags = {FLAG_MYSELF}
        self.save()

    # -- membership ---------------------------------------------------------

    @property
    def size(self) -> int:
        """Nodes in the table that finished the handshake, failed ones included."""
        if len(self.nodes) == 1:  # the common single-node case, on every ADDJOB
            return 1
        return sum(1 for n in self.nodes.values() if FLAG_HANDSHAKE not in n.flags)

    def reachable_nodes(self) -> list[ClusterNode]:
        """Other nodes we may replicate to (not failing, leaving or handshaking)."""
        bad = {FLAG_MYSELF, FLAG_HANDSHAKE, FLAG_LEAVING, FLAG_PFAIL, FLAG_FAIL, FLAG_NOADDR}
        return [n for n in self.nodes.values() if not (n.flags & bad)]

    @property
    def reachable_count(self) -> int:
        if len(self.nodes) == 1:
            return 0
        return len(self.reachable_nodes())

    def other_node_ids(self) -> Iterator[str]:
        return (nid for nid in self.nodes if nid != self.myself.id)

    @property
    def leaving(self) -> bool:
        return FLAG_LEAVING in self.myself.flags

    def set_leaving(self, leaving: bool) -> None:
        if leaving:
            self.myself.flags.add(FLAG_LEAVING)
        else:
            self.myself.flags.discard(FLAG_LEAVING)
        self.save()

    # -- sends (best effort) -----------------------------------------------

    def send(self, node_id: str, message: bytes) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.link is None or node is self.myself:
            self.messages_dropped += node is not self.myself
            return False
        node.link.send(message)
        return True

    def _send_to_copies(self, nodes: Iterable[str], message: bytes) -> None:
        myself = self.myself.id
        for node_id in nodes:
            if node_id != myself:
                self.send(node_id, message)

    def broadcast_queued(self, job: Job, nack: bool) -> None:
        """QUEUED to the other copies, so they postpone their own requeue."""
        if len(job.delivered) > 1:
            flags = messages.MFLAG_INCR_NACKS if nack else messages.MFLAG_INCR_DELIV
            self._send_to_copies(job.delivered, messages.job_id_message(
                messages.QUEUED, self.myself, job.id, 0, flags))

    def broadcast_willqueue(self, job: Job) -> None:
        if len(job.delivered) > 1:
            self._send_to_copies(job.delivered, messages.job_id_message(
                messages.WILLQUEUE, self.myself, job.id, 0))

    def broadcast_working(self, job: Job) -> None:
        if len(job.delivered) > 1:
            self._send_to_copies(job.delivered, messages.job_id_message(
                messages.WORKING, self.myself, job.id, 0))

    def send_setack(self, node_id: str, job: Job, may_have: int) -> None:
        self.send(node_id, messages.job_id_message(messages.SETACK, self.myself, job.id, may_have))

    def broadcast_deljob(self, job_id: bytes, nodes: Iterable[str] | None) -> None:
        """DELJOB to ``nodes`` (every node when the job was unknown here)."""
        targets = self.other_node_ids() if nodes is None else nodes
        message = messages.job_id_message(messages.DELJOB, self.myself, job_id, 0)
        self._send_to_copies(list(targets), message)

    def broadcast_pause(self, queue: bytes, flags: int) -> None:
        message = messages.queue_message(messages.PAUSE, self.myself, queue, flags)
        for node_id in list(self.other_node_ids()):
            self.send(node_id, message)
