"""A node of the cluster as this node knows it: its ID, address, flags,
the link we reach it by, what failure detection knows of it.

The bottom of the cluster column: ``nodes_file`` (nodes.conf), ``state``
(the node table) and ``membership`` build on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Final, Protocol

__all__ = ["ClusterNode", "Link", "new_node_id", "KNOWN_FLAGS", "FLAG_MYSELF", "FLAG_PFAIL",
           "FLAG_FAIL", "FLAG_HANDSHAKE", "FLAG_NOADDR", "FLAG_LEAVING"]

# Node flags, named like CLUSTER NODES prints them.
FLAG_MYSELF: Final = "myself"
FLAG_PFAIL: Final = "fail?"
FLAG_FAIL: Final = "fail"
FLAG_HANDSHAKE: Final = "handshake"
FLAG_NOADDR: Final = "noaddr"
FLAG_LEAVING: Final = "leaving"
KNOWN_FLAGS: Final = (FLAG_MYSELF, FLAG_PFAIL, FLAG_FAIL, FLAG_HANDSHAKE, FLAG_NOADDR, FLAG_LEAVING)


def new_node_id() -> str:
    """40 random hex characters."""
    return os.urandom(20).hex()


class Link(Protocol):
    #: When the link was made (ms), to tell a stuck link from a new one.
    ctime: int

    def send(self, message: bytes) -> None: ...

    def send_entry(self, key: bytes, entry: bytes) -> None: ...

    def close(self) -> None: ...

    def unsent_bytes(self) -> int: ...


@dataclass(eq=False)
class ClusterNode:
    id: str
    ip: str
    port: int
    flags: set[str] = field(default_factory=set)
    #: When our outstanding PING was sent (ms, 0 = none) and the last PONG came.
    ping_sent: int = 0
    pong_received: int = 0
    #: Our outbound link to the node: every message we send it goes there.
    link: Link | None = None
    #: When the node entered the table (ms): handshakes time out from here.
    ctime: int = 0
    #: Send MEET, not PING, on the next connection (CLUSTER MEET, not gossip).
    meet: bool = False
    #: Other nodes that reported this one failing: reporter ID -> when (ms).
    fail_reports: dict[str, int] = field(default_factory=dict)
    fail_time: int = 0
    #: What the node's last PING/PONG/MEET said it takes (mflags[1]:
    #: messages.CAP_BATCH); 0 for the original, and until we hear from it.
    caps: int = 0
    #: The node's announced bus port (cluster-announce-bus-port); 0: port + 10000.
    bus_port: int = 0

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
