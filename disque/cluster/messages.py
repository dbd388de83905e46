"""Cluster bus message encoding (the original's wire format, C-BEHAVIOUR.md §3).

Header, 144 bytes, big-endian::

    "DbuZ" | totlen u32 | ver u16 (1) | unused u16 | type u16 | count u16 |
    sender[40] | myip[46] | reserved[34] | port u16 | flags u16 | state u8 |
    mflags[3]

Only the encoders used by the job state machine live here for now; the
receiving side comes with the cluster bus.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import ClusterNode

SIGNATURE = b"DbuZ"
VERSION = 1
HEADER = struct.Struct(">4sIHHHH40s46s34sHHB3s")
assert HEADER.size == 144

# Message types.
PING, PONG, MEET, FAIL, REPLJOB, GOTJOB, ENQUEUE, QUEUED, SETACK, WILLQUEUE, \
    GOTACK, DELJOB, NEEDJOBS, YOURJOBS, WORKING, PAUSE = range(16)

# mflags[0] bits.
MFLAG_NOREPLY = 1
MFLAG_INCR_NACKS = 2
MFLAG_INCR_DELIV = 4

# Node flag bits carried in the header.
NODE_FLAG_BITS = {"myself": 1, "fail?": 2, "fail": 4, "handshake": 8, "noaddr": 16,
                  "leaving": 32}


def _header(msg_type: int, sender: ClusterNode, body_len: int, count: int = 0,
            mflags: int = 0) -> bytes:
    flags = 0
    for name in sender.flags:
        flags |= NODE_FLAG_BITS.get(name, 0)
    return HEADER.pack(SIGNATURE, HEADER.size + body_len, VERSION, 0, msg_type, count,
                       sender.id.encode(), b"", b"", sender.port, flags, 0,
                       bytes((mflags, 0, 0)))


def job_id_message(msg_type: int, sender: ClusterNode, job_id: bytes, aux: int,
                   mflags: int = 0) -> bytes:
    """Messages about one job: 40-byte job ID + aux u32."""
    body = job_id + struct.pack(">I", aux & 0xFFFFFFFF)
    return _header(msg_type, sender, len(body), mflags=mflags) + body


def queue_message(msg_type: int, sender: ClusterNode, queue: bytes, aux: int) -> bytes:
    """Messages about a queue (NEEDJOBS, PAUSE): aux u32, name length u32, name."""
    body = struct.pack(">II", aux & 0xFFFFFFFF, len(queue)) + queue
    return _header(msg_type, sender, len(body)) + body
