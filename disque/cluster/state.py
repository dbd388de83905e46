"""This node's view of the cluster: identity, the node table, and sends.

The job state machine only calls the ``send_*``/``broadcast_*`` methods
below.  Each send goes over our outbound link to that node (``link.py``); a
node without a link gets nothing, exactly as in the original, where bus
sends are best effort: the procedures that need a message to arrive
(replication, the ACK GC) retry on their own timers.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from ..job import Job
from . import messages
from .link import BusLink
from .node import (
    FLAG_FAIL,
    FLAG_HANDSHAKE,
    FLAG_LEAVING,
    FLAG_MYSELF,
    FLAG_NOADDR,
    FLAG_PFAIL,
    ClusterNode,
    new_node_id,
)
from .nodes_file import load_nodes_file, save_nodes_file

__all__ = ["ClusterState"]

log: Final = logging.getLogger("disque.cluster")


class ClusterState:
    """The node table, with ``myself`` always in it, and the sends the job
    state machine uses.  Membership rules (handshakes, gossip, failure
    detection) live in ``membership.py``; the sockets in ``bus.py``."""

    def __init__(self, myself: ClusterNode, config_path: str | None) -> None:
        myself.flags.add(FLAG_MYSELF)
        self.myself = myself
        self.nodes: dict[str, ClusterNode] = {myself.id: myself}
        self.config_path = config_path
        # LEAVING told to the others but kept out of nodes.conf (a drain).
        self._leaving_transient = False
        self.messages_dropped = 0
        # {myself}: the node set of every job made here, shared by all of them.
        self.myself_set: frozenset[str] = frozenset((myself.id,))
        # cluster-announce-ip: sent in our PING/PONG/MEET headers ("": none).
        self.announce_ip = ""
        # replication_targets' answer, and the ms it was computed in.
        self._targets: tuple[list[str], frozenset[str]] = ([], self.myself_set)
        self._counts: tuple[int, int] = _LONE_COUNTS
        self._targets_ms = -1
        # Node IDs FORGET banned from gossip re-adds: ID -> until when (ms).
        self.banned: dict[str, int] = {}
        # Every node FORGET removed (the ACK GC stops waiting for them).
        self.forgotten: set[str] = set()
        # Handshake placeholders by the address they are meeting.
        self.handshakes: dict[tuple[str, int], ClusterNode] = {}
        # Called when nodes.conf must be written; the bus defers the write to
        # the end of the event-loop turn (many changes, one write), as the
        # original's clusterBeforeSleep.  Without a bus: write now.
        self.save_later: Callable[[], None] = self.save
        # Our headers from byte 8 by type | mflags << 8 | wire flags << 16
        # (header_key), for the ID and port they were made with.
        self._keys: dict[int, bytes] = {}
        self._keys_id = ""
        self._keys_port = 0

    # -- identity and persistence ------------------------------------------

    @classmethod
    def load_or_create(cls, config_path: str, ip: str, port: int) -> ClusterState:
        """Reuse the node ID (and peers) saved in ``config_path``, or make a new one.

        A new identity is not written here: the server saves it once it
        listens, so a node that cannot start leaves no nodes.conf behind.
        """
        nodes = load_nodes_file(config_path)
        if nodes is None:
            state = cls(ClusterNode(new_node_id(), ip, port), config_path)
            log.info("No cluster configuration found, I'm %s", state.myself_id)
            return state
        myself = next(n for n in nodes if FLAG_MYSELF in n.flags)
        myself.ip = ip or myself.ip
        myself.port = port
        state = cls(myself, config_path)
        for node in nodes:
            state.nodes[node.id] = node
        log.info("Node configuration loaded, I'm %s", state.myself_id)
        return state

    def save(self) -> None:
        if not self.config_path:
            return
        if not self._leaving_transient:
            save_nodes_file(self.config_path, self.nodes.values())
            return
        flags = self.myself.flags
        flags.discard(FLAG_LEAVING)
        try:
            save_nodes_file(self.config_path, self.nodes.values())
        finally:
            flags.add(FLAG_LEAVING)

    @property
    def myself_id(self) -> str:
        return self.myself.id

    def reset(self, hard: bool) -> None:
        """CLUSTER RESET: forget every other node; HARD also takes a new ID."""
        for node in list(self.nodes.values()):
            if node is not self.myself:
                self.remove_node(node)
        if hard:
            del self.nodes[self.myself.id]
            self.myself.id = new_node_id()
            self.myself_set = frozenset((self.myself.id,))
            self.nodes[self.myself.id] = self.myself
        self.myself.flags = {FLAG_MYSELF}
        self._targets_ms = -1  # the other nodes are gone, maybe our ID too
        self.save()

    # -- membership ---------------------------------------------------------

    def remove_node(self, node: ClusterNode, keep_link: bool = False) -> None:
        """Drop ``node`` from the table, its link and every report it made.

        ``keep_link``: the node is only re-keyed (a handshake placeholder
        that learned the real ID), its link stays.
        """
        self.nodes.pop(node.id, None)
        if self.handshakes.get((node.ip, node.port)) is node:
            del self.handshakes[(node.ip, node.port)]
        if node.link is not None and not keep_link:
            link, node.link = node.link, None
            link.close()
        for other in self.nodes.values():
            other.fail_reports.pop(node.id, None)

    @property
    def size(self) -> int:
        """Nodes in the table that finished the handshake, failed ones included."""
        if len(self.nodes) == 1:  # the common single-node case, on every ADDJOB
            return 1
        count = 0  # a loop, not sum() of a generator: this runs on every ADDJOB
        for node in self.nodes.values():
            if FLAG_HANDSHAKE not in node.flags:
                count += 1
        return count

    def reachable_nodes(self) -> list[ClusterNode]:
        """Other nodes we may replicate to (not failing, leaving or handshaking).

        NOADDR nodes are left out too: they are never linked (the original
        counted them).
        """
        bad = _UNREACHABLE
        # A peer's flags are nearly always empty: no method call then.
        return [n for n in self.nodes.values() if not n.flags or n.flags.isdisjoint(bad)]

    def replication_targets(self, now_ms: int) -> tuple[list[str], frozenset[str]]:
        """The IDs of the reachable, linked nodes a job may be copied to, and
        them with us: the node set of a job copied to all of them.

        Computed once per millisecond: a burst of ADDJOBs would otherwise
        rebuild the same list and set for every job.  A node failing within
        that millisecond may still be picked, as it may be when it fails
        just after being picked: its copy goes missing and the job waits
        for another node.
        """
        if now_ms != self._targets_ms:
            self._refresh_view(now_ms)
        return self._targets

    def addjob_counts(self, now_ms: int) -> tuple[int, int]:
        """``(size, reachable_count)`` as of this millisecond, for ADDJOB's
        default REPLICATE and its check for enough nodes.

        Computed with the replication targets, once per millisecond (each
        walks the node table: ~4% of a replicated ADDJOB when done per job),
        and stale as they may be: by less than a millisecond.
        """
        if len(self.nodes) == 1:
            return _LONE_COUNTS
        if now_ms != self._targets_ms:
            self._refresh_view(now_ms)
        return self._counts

    def _refresh_view(self, now_ms: int) -> None:
        ids = [n.id for n in self.reachable_nodes() if n.link is not None]
        self._targets = (ids, self.myself_set | frozenset(ids))
        self._counts = (self.size, self.reachable_count)
        self._targets_ms = now_ms

    @property
    def reachable_count(self) -> int:
        if len(self.nodes) == 1:
            return 0
        bad = _UNREACHABLE
        count = 0
        for node in self.nodes.values():
            flags = node.flags
            if not flags or flags.isdisjoint(bad):  # no method call for empty flags
                count += 1
        return count

    def other_node_ids(self) -> Iterator[str]:
        return (nid for nid in self.nodes if nid != self.myself.id)

    @property
    def leaving(self) -> bool:
        return FLAG_LEAVING in self.myself.flags

    def set_leaving(self, leaving: bool, persist: bool = True) -> None:
        """Set or clear our LEAVING flag.  ``persist=False`` (the drain on
        SIGTERM) keeps it out of nodes.conf: the node leaves for good only
        when told so (CLUSTER LEAVING), a restarted node is not leaving."""
        if leaving:
            self.myself.flags.add(FLAG_LEAVING)
        else:
            self.myself.flags.discard(FLAG_LEAVING)
        self._leaving_transient = leaving and not persist
        if persist:
            # Not for the drain: the file would not change, and a node whose
            # disk is full or read-only must still drain and stop on SIGTERM.
            self.save()

    # -- sends (best effort) -----------------------------------------------

    @property
    def wire_flags(self) -> int:
        """Our flags as the header carries them (in every message we send)."""
        flags = self.myself.flags
        if len(flags) == 1 and FLAG_MYSELF in flags:  # nearly always: skip the loop
            return _MYSELF_WIRE
        return messages.flags_to_wire(flags)

    def send(self, node_id: str, message: bytes) -> bool:
        node = self.nodes.get(node_id)
        if node is None or node.link is None or node is self.myself:
            self.messages_dropped += node is not self.myself
            return False
        node.link.send(message)
        return True

    # Messages from this node: our ID, client port and flags in the header.

    def job_id_message(self, msg_type: int, job_id: bytes, aux: int,
                       mflags: int = 0) -> bytes:
        me = self.myself
        return messages.job_id_message(msg_type, me.id, me.port, self.wire_flags, job_id,
                                       aux, mflags)

    def queue_message(self, msg_type: int, queue: bytes, aux: int) -> bytes:
        me = self.myself
        return messages.queue_message(msg_type, me.id, me.port, self.wire_flags, queue, aux)

    def jobs_message(self, msg_type: int, blobs: list[bytes], mflags: int = 0,
                     trailer: bytes = b"") -> bytes:
        me = self.myself
        return messages.jobs_message(msg_type, me.id, me.port, self.wire_flags, blobs, mflags,
                                     trailer)

    def header_key(self, msg_type: int, mflags: int = 0) -> bytes:
        """Our header from byte 8 for ``msg_type`` (``messages.header_rest``):
        the key of the entries of a link's batches (BusLink.send_entry).
        Made once per type, flags and mflags, not per message."""
        me = self.myself
        if me.id is not self._keys_id or me.port != self._keys_port:
            self._keys.clear()
            self._keys_id = me.id
            self._keys_port = me.port
        flags = self.wire_flags
        code = msg_type | mflags << 8 | flags << 16
        key = self._keys.get(code)
        if key is None:
            key = self._keys[code] = messages.header_rest(msg_type, me.id, me.port, flags,
                                                          mflags)
        return key

    def send_entry(self, node_id: str, key: bytes, entry: bytes) -> bool:
        """``send`` for the message of one entry under our header ``key``."""
        node = self.nodes.get(node_id)
        if node is None or node.link is None or node is self.myself:
            self.messages_dropped += node is not self.myself
            return False
        link = node.link
        if isinstance(link, BusLink):
            # Compiled, a native call: through the Link protocol it is a
            # Python-level call (~300 instructions, twice per REPLICATE 3 job).
            link.send_entry(key, entry)
        else:
            link.send_entry(key, entry)  # a test's recording link
        return True

    def send_job_id(self, node_id: str, msg_type: int, job_id: bytes, aux: int,
                    mflags: int = 0) -> bool:
        """A job-ID message (GOTJOB, ENQUEUE ...) to ``node_id``."""
        return self.send_entry(node_id, self.header_key(msg_type, mflags),
                               job_id + _AUX.pack(aux & 0xFFFFFFFF))

    def _send_id_to_copies(self, nodes: Iterable[str], msg_type: int, job_id: bytes, aux: int,
                           mflags: int = 0) -> None:
        """A job-ID message to every node of ``nodes`` but us."""
        key = self.header_key(msg_type, mflags)
        entry = job_id + _AUX.pack(aux & 0xFFFFFFFF)
        myself = self.myself.id
        for node_id in nodes:
            if node_id != myself:
                self.send_entry(node_id, key, entry)

    def broadcast(self, message: bytes) -> None:
        """``message`` to every linked node."""
        for node in list(self.nodes.values()):
            if node.link is not None and node is not self.myself:
                node.link.send(message)

    def broadcast_queued(self, job: Job, nack: bool, count: bool = True) -> None:
        """QUEUED to the other copies, so they postpone their own requeue.

        ``count``: the copies bump their counters too (a NACK, or one more
        delivery); not when we only answer a WILLQUEUE about a queued job.
        """
        if len(job.delivered) > 1:
            flags = 0
            if count:
                flags = messages.MFLAG_INCR_NACKS if nack else messages.MFLAG_INCR_DELIV
            self._send_id_to_copies(job.delivered, messages.QUEUED, job.id, 0, flags)

    def broadcast_willqueue(self, job: Job) -> None:
        if len(job.delivered) > 1:
            self._send_id_to_copies(job.delivered, messages.WILLQUEUE, job.id, 0)

    def broadcast_working(self, job: Job, delay_s: int = 0) -> None:
        """WORKING to the other copies; ``delay_s``: a NACK ... DELAY, the
        copies hold theirs that much longer (aux, which the original ignores)."""
        if len(job.delivered) > 1:
            self._send_id_to_copies(job.delivered, messages.WORKING, job.id, delay_s)

    def send_setack(self, node_id: str, job: Job, may_have: int) -> None:
        self.send_job_id(node_id, messages.SETACK, job.id, may_have)

    def send_gotack(self, node_id: str, job_id: bytes, known: bool) -> None:
        self.send_job_id(node_id, messages.GOTACK, job_id, int(known))

    def broadcast_deljob(self, job_id: bytes, nodes: Iterable[str] | None) -> None:
        """DELJOB to ``nodes`` (every node when the job was unknown here)."""
        targets = self.other_node_ids() if nodes is None else nodes
        self._send_id_to_copies(list(targets), messages.DELJOB, job_id, 0)

    def broadcast_pause(self, queue: bytes, flags: int) -> None:
        self.broadcast(self.queue_message(messages.PAUSE, queue, flags))

    def broadcast_qlimit(self, queue: bytes, max_jobs: int, period_ms: int) -> int:
        """QLIMIT to every linked node of ours (those whose messages carry
        CAP_BATCH: the original logs every unknown type); how many."""
        me = self.myself
        message = messages.qlimit_message(me.id, me.port, self.wire_flags, queue, max_jobs,
                                          period_ms)
        sent = 0
        for node in list(self.nodes.values()):
            if (node.link is not None and node is not self.myself
                    and node.caps & messages.CAP_BATCH):
                node.link.send(message)
                sent += 1
        return sent


_MYSELF_WIRE: Final = messages.WIRE_FLAGS[FLAG_MYSELF]
_AUX: Final = struct.Struct(">I")
#: addjob_counts on a lone node: size 1, no other node reachable.
_LONE_COUNTS: Final = (1, 0)
_UNREACHABLE: Final = frozenset((FLAG_MYSELF, FLAG_HANDSHAKE, FLAG_LEAVING, FLAG_PFAIL, FLAG_FAIL,
                          FLAG_NOADDR))
