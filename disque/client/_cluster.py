"""Which node to talk to: seed addresses, the HELLO node table, affinity.

This is the "Client libraries" part of the Disque spec, kept free of I/O so
that the sync and async clients share it and it can be tested alone:

1. the client is given several addresses and tries them in random order
   until one answers;
2. after connecting it runs HELLO and remembers the node table with each
   node's priority (1 reachable ... 100 failing or leaving);
3. when a node answers ``-LEAVING`` or the connection drops, the client moves
   to another node, lower priority numbers first;
4. commands about jobs (ACKJOB, FASTACK, NACK, WORKING, SHOW) go to the node
   named in each job ID (``job_id[2:10]`` is a prefix of its creator's node
   ID), which holds a copy unless the job was replicated externally, when
   HELLO knows that node and it answered lately (:class:`JobRouter`);
5. optionally (``affinity=True``) a consumer watches the node-ID prefix of
   the job IDs it receives (``job_id[2:10]``) and moves to the node that
   produces most of them, so jobs stop being shipped between nodes for it;
6. the ADDJOBs of an ordered group go to the group's *home*, the first node
   of the key's rendezvous ranking (``disque.rendezvous``) among the nodes
   HELLO lists as usable, and to the next one by rank while that one is
   unreachable, leaving or refusing groups (an original node)
   (:class:`GroupRouter`).  The nodes copy the group's jobs to the next
   ones of the same ranking.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..rendezvous import ranking
from ._wire import DEFAULT_PORT, Hello, NodeInfo, format_address

__all__ = ["Address", "parse_address", "parse_addresses", "NodeTable", "Affinity",
           "JobRouter", "GroupRouter", "answered_by_own_node", "job_node_prefix",
           "format_address"]

Address = tuple[str, int]

#: Priority HELLO gives a failing or leaving node; also what we assume for a
#: node that told us ``-LEAVING`` until it says otherwise.
LEAVING_PRIORITY = 100
#: Priority HELLO gives a node that may be failing (PFAIL): not a group's home.
PFAIL_PRIORITY = 10


def parse_address(value: str | tuple[str, int], default_port: int = DEFAULT_PORT) -> Address:
    """``"host:port"``, ``"host"``, ``"[::1]:7711"`` or ``(host, port)``."""
    if isinstance(value, tuple):
        return str(value[0]), int(value[1])
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, _, port = value.partition(":")
    else:  # bare host, or a bare IPv6 address
        host, port = value, ""
    if not host:
        raise ValueError(f"invalid address {value!r}")
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"invalid port in address {value!r}") from None
    if not 0 < number < 65536:
        raise ValueError(f"port out of range (1-65535) in address {value!r}")
    return host, number


def parse_addresses(addresses: str | tuple[str, int] | Iterable[str | tuple[str, int]]
                    ) -> list[Address]:
    """One address, a comma separated string, or an iterable of addresses."""
    if isinstance(addresses, tuple) and len(addresses) == 2 and isinstance(addresses[1], int):
        items: list[str | tuple[str, int]] = [addresses]  # type: ignore[list-item]
    elif isinstance(addresses, str):
        items = [a for a in addresses.split(",") if a.strip()]
    else:
        items = list(addresses)  # type: ignore[arg-type]
    seeds: list[Address] = []
    for item in items:
        address = parse_address(item)
        if address not in seeds:
            seeds.append(address)
    if not seeds:
        raise ValueError("at least one address is needed")
    return seeds


class NodeTable:
    """Seeds plus what HELLO told us, and the order to try nodes in."""

    def __init__(self, seeds: Sequence[Address], randomize: bool = True,
                 rng: random.Random | None = None, seeds_only: bool = False) -> None:
        self.seeds = list(seeds)
        #: Dial only the seeds (TLS: HELLO's addresses are plain-text ports).
        self.seeds_only = seeds_only
        self.randomize = randomize
        self.rng = rng or random.Random()
        #: node ID -> its HELLO entry (the union of every HELLO seen, newest wins).
        self.nodes: dict[str, NodeInfo] = {}
        #: addresses we actually connected through -> node ID behind them.
        self.address_ids: dict[Address, str] = {}
        #: node ID -> priority we saw ourselves (``-LEAVING``), until the node
        #: itself reports something else in its own HELLO.
        self.overrides: dict[str, int] = {}

    def learn(self, address: Address, hello: Hello) -> None:
        """Record a HELLO reply read through ``address``."""
        self.address_ids[address] = hello.node_id
        for node in hello.nodes:
            if node.id == hello.node_id and (not node.host or node.port <= 0):
                # The original server reports an empty IP for itself before
                # CLUSTER MEET: the address we used is the right one.
                node = NodeInfo(node.id, address[0], address[1], node.priority)
            self.nodes[node.id] = node
        self.overrides.pop(hello.node_id, None)

    def mark_leaving(self, node_id: str | None) -> None:
        if node_id:
            self.overrides[node_id] = LEAVING_PRIORITY

    def priority(self, node_id: str | None) -> int:
        if node_id is None:
            return 1  # an address never reached: assume healthy, like the user does
        if node_id in self.overrides:
            return self.overrides[node_id]
        node = self.nodes.get(node_id)
        return node.priority if node is not None else 1

    def address_of(self, node_id: str) -> Address | None:
        """How to reach a node: an address that worked before, else its HELLO one."""
        for address, nid in self.address_ids.items():
            if nid == node_id:
                return address
        node = self.nodes.get(node_id)
        if node is None or not node.host or node.port <= 0 or self.seeds_only:
            return None
        return node.host, node.port

    def node_by_prefix(self, prefix: str) -> NodeInfo | None:
        for node in self.nodes.values():
            if node.id.startswith(prefix):
                return node
        return None

    def candidates(self, avoid: Address | None = None) -> list[Address]:
        """Addresses to try, best first.

        Every known node once (seeds and HELLO entries that are the same
        node are merged), sorted by priority; equal priorities in random
        order (or in the order given when ``randomize`` is off).  ``avoid``
        (the node that just failed or said LEAVING) goes last: it is still
        worth a try when nothing else answers, e.g. a lone node restarting.
        """
        entries: list[tuple[Address, str | None]] = []
        seen_ids: set[str] = set()
        for seed in self.seeds:
            node_id = self.address_ids.get(seed)
            if node_id is not None:
                if node_id in seen_ids:
                    continue
                seen_ids.add(node_id)
            entries.append((seed, node_id))
        for node_id in self.nodes:
            if node_id in seen_ids:
                continue
            address = self.address_of(node_id)
            if address is None:
                continue
            seen_ids.add(node_id)
            entries.append((address, node_id))
        if self.randomize:
            self.rng.shuffle(entries)
        avoid_id = self.address_ids.get(avoid) if avoid is not None else None

        def rank(entry: tuple[Address, str | None]) -> tuple[bool, int]:
            address, node_id = entry
            avoided = address == avoid or (avoid_id is not None and node_id == avoid_id)
            return avoided, self.priority(node_id)

        entries.sort(key=rank)
        return [address for address, _ in entries]


class Affinity:
    """Consumer-side affinity: which node produces most of our jobs?

    Keeps the node prefixes of the last ``window`` jobs received.  Once
    ``min_jobs`` were seen, if one prefix accounts for at least ``threshold``
    of them, it is not the current node's, and that node is known from
    HELLO with a usable priority, :meth:`pick` names it.
    """

    def __init__(self, window: int = 200, threshold: float = 0.6,
                 min_jobs: int | None = None) -> None:
        if window < 1 or not 0 < threshold <= 1:
            raise ValueError("affinity window must be >= 1 and threshold in (0, 1]")
        self.window: deque[str] = deque(maxlen=window)
        self.threshold = threshold
        self.min_jobs = window if min_jobs is None else min(min_jobs, window)

    def observe(self, job_ids: Iterable[str]) -> None:
        self.window.extend(job_id[2:10] for job_id in job_ids)

    def reset(self) -> None:
        self.window.clear()

    def pick(self, current_node_id: str | None, table: NodeTable) -> str | None:
        if len(self.window) < self.min_jobs:
            return None
        prefix, count = Counter(self.window).most_common(1)[0]
        if count / len(self.window) < self.threshold:
            return None
        if current_node_id is not None and current_node_id.startswith(prefix):
            return None
        node = table.node_by_prefix(prefix)
        if node is None or table.priority(node.id) >= LEAVING_PRIORITY:
            return None
        if table.address_of(node.id) is None:
            return None
        return node.id


def job_node_prefix(job_id: str | bytes | bytearray | memoryview | int) -> str | None:
    """The creator's node-ID prefix in a job ID (``D-<8 hex>-...``), or None.

    None for anything that does not look like a job ID: such IDs go to the
    current node, whose ``-BADID`` the caller then sees as before.
    """
    if isinstance(job_id, str):
        raw = job_id
    elif isinstance(job_id, (bytes, bytearray, memoryview)):
        raw = bytes(job_id[:11]).decode("ascii", "replace")
    else:
        return None
    if len(raw) < 11 or not raw.startswith("D-") or raw[10] != "-":
        return None
    prefix = raw[2:10]
    if any(c not in "0123456789abcdef" for c in prefix):
        return None
    return prefix


def answered_by_own_node(job_id: str | bytes | bytearray | memoryview | int,
                         node_id: str | None) -> bool:
    """Is ``node_id`` the node named in ``job_id`` (or is the ID not one that
    names a node, so that any node's answer is the answer)?"""
    prefix = job_node_prefix(job_id)
    return prefix is None or (node_id is not None and node_id.startswith(prefix))


#: Job IDs joined by newlines, each checked as :func:`job_node_prefix` does.
_JOINED_JOB_IDS = re.compile(r"(?:D-[0-9a-f]{8}-[^\n]*\n)*")


def job_node_prefixes(job_ids: Sequence[Any]) -> list[str | None]:
    """:func:`job_node_prefix` of each ID.

    IDs given as ``str`` (what the Spark source and most callers pass) are
    checked by one regex over the joined IDs instead of one Python call per
    ID: ``ack_many`` of 100k IDs spent 0.4 s here otherwise.
    """
    try:
        joined = "\n".join(job_ids)
    except TypeError:  # bytes, ints...: one at a time
        return [job_node_prefix(job_id) for job_id in job_ids]
    if (joined.count("\n") == len(job_ids) - 1
            and _JOINED_JOB_IDS.fullmatch(joined + "\n") is not None):
        return [job_id[2:10] for job_id in job_ids]
    return [job_node_prefix(job_id) for job_id in job_ids]


class JobRouter:
    """Which node a command about a job goes to: the one named in its ID.

    The node that created a job holds a copy of it (unless it replicated the
    job externally, being short of memory or leaving), so ACKJOB there
    starts the GC where the job is, NACK and WORKING act on a copy, and
    SHOW finds it even when the connected node has none.  ``None`` means
    "the connected node": the ID names it, the ID is malformed, HELLO does
    not know that node, or talking to it failed less than ``retry_after``
    seconds ago (so a dead node costs one connect timeout, not one per
    command).
    """

    def __init__(self, table: NodeTable, retry_after: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.retry_after = retry_after
        self.clock = clock
        #: node ID -> monotonic time before which it is not tried again.
        self.down_until: dict[str, float] = {}

    def target(self, job_id: str | bytes | bytearray | memoryview | int,
               current: str | None) -> str | None:
        prefix = job_node_prefix(job_id)
        return None if prefix is None else self._node_for(prefix, current)

    def _node_for(self, prefix: str, current: str | None) -> str | None:
        if current is not None and current.startswith(prefix):
            return None
        node = self.table.node_by_prefix(prefix)
        if node is None or self.table.address_of(node.id) is None:
            return None
        if self.table.priority(node.id) >= LEAVING_PRIORITY:
            return None  # failing (a connect would time out) or leaving
        until = self.down_until.get(node.id)
        if until is not None:
            if until > self.clock():
                return None
            del self.down_until[node.id]
        return node.id

    def group(self, job_ids: Sequence[Any], current: str | None) -> dict[str | None, list[int]]:
        """Indexes into ``job_ids`` by target node, order kept within a group.

        One malformed ID sends the whole command to the connected node, so
        that it fails with ``-BADID`` as a whole, as it does unrouted,
        rather than after the other groups were acted on.  Each node prefix
        is resolved once (``ack_many`` passes thousands of IDs, of a few
        nodes).
        """
        prefixes = job_node_prefixes(job_ids)
        if None in prefixes:
            return {None: list(range(len(job_ids)))}
        if prefixes.count(prefixes[0]) == len(prefixes):  # all from one node: common
            assert prefixes[0] is not None
            return {self._node_for(prefixes[0], current): list(range(len(job_ids)))}
        nodes: dict[str, str | None] = {}
        groups: dict[str | None, list[int]] = {}
        for i, prefix in enumerate(prefixes):
            assert prefix is not None
            if prefix not in nodes:
                nodes[prefix] = self._node_for(prefix, current)
            groups.setdefault(nodes[prefix], []).append(i)
        return groups

    def failed(self, node_id: str) -> None:
        """Talking to ``node_id`` failed: use the connected node for a while."""
        self.down_until[node_id] = self.clock() + self.retry_after


class GroupRouter:
    """Where the ADDJOBs of an ordered group go: its home first.

    :meth:`homes` ranks, by the key's rendezvous hashing, every node HELLO
    listed that has an address, does not look failing or leaving (HELLO
    priority below 10) and did not fail us in the last ``retry_after``
    seconds, nor refuse a group (an original node answers ``GROUP`` with a
    syntax error: :meth:`refused`).  The nodes rank the same way among the
    nodes they reach, so a client that sees the cluster as the nodes do
    sends a group's jobs to the node that also holds the first copy.
    """

    def __init__(self, table: NodeTable, retry_after: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.retry_after = retry_after
        self.clock = clock
        #: node ID -> monotonic time before which it is not a home.
        self.down_until: dict[str, float] = {}
        #: Nodes that answered GROUP with a syntax error: they have no groups.
        self.no_groups: set[str] = set()

    def homes(self, key: bytes) -> list[str]:
        """The node IDs to send ``key``'s jobs to, best first (may be empty)."""
        table = self.table
        now = self.clock()
        usable = []
        for node_id in table.nodes:
            if node_id in self.no_groups or table.priority(node_id) >= PFAIL_PRIORITY:
                continue
            until = self.down_until.get(node_id)
            if until is not None:
                if until > now:
                    continue
                del self.down_until[node_id]
            if table.address_of(node_id) is not None:
                usable.append(node_id)
        return ranking(key, usable)

    def failed(self, node_id: str) -> None:
        """Sending to ``node_id`` failed: the next node by rank for a while."""
        self.down_until[node_id] = self.clock() + self.retry_after

    def refused(self, node_id: str) -> None:
        """``node_id`` does not know GROUP (an original node): never a home."""
        self.no_groups.add(node_id)
