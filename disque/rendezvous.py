"""Rendezvous hashing (highest random weight) of an ordered group's key over
node IDs: the one ranking the client and the nodes compute alike, without
talking to each other (docs/EXTENSIONS.md, "Ordered groups", "In a cluster").

Each node gets a score for the key, a hash of its ID and the key; the
ranking is the nodes by score, highest first.  A group's **home** is the
first node of its ranking: the client sends the group's ADDJOBs there and
the node copies the jobs to the next ones.  When a node leaves the set
(failing, unreachable), only the groups it was first for move, each to
its next node; when a node joins, only the groups it now comes first for
move to it (about one in N), and the others stay where they were.  A
modulo over the node list would move nearly every group.

The score is BLAKE2b over the node ID (40 hex characters: fixed length, so
ID and key cannot run into each other) followed by the key, 64 bits
big-endian; ties (never seen with 64 bits) go to the greater ID.  It does
not depend on Python's randomized ``hash()``: every process computes the
same ranking.
"""

from __future__ import annotations

from collections.abc import Iterable
from hashlib import blake2b

__all__ = ["score", "ranking", "outranks"]


def score(key: bytes, node_id: str) -> int:
    """``node_id``'s weight for ``key``."""
    return int.from_bytes(blake2b(node_id.encode() + key, digest_size=8).digest(), "big")


def ranking(key: bytes, node_ids: Iterable[str]) -> list[str]:
    """``node_ids`` in ``key``'s order, the home first."""
    return sorted(node_ids, key=lambda node_id: (score(key, node_id), node_id), reverse=True)


def outranks(key: bytes, a: str, b: str) -> bool:
    """Whether node ``a`` comes before node ``b`` in ``key``'s ranking."""
    return (score(key, a), a) > (score(key, b), b)
