"""Cluster bus messages: the original's binary frames <-> typed messages.

Sans-IO: bytes in, tuples out, and the reverse; no sockets, no node table.
Every layout below was checked against the original server on the wire
(a raw socket speaking to a 1.0-rc1 node).

Header, 144 bytes, big-endian::

    0   "DbuZ"            4   totlen u32 (whole message)
    8   ver u16 (1)       10  unused u16
    12  type u16          14  count u16 (gossip entries)
    16  sender[40]        56  myip[46] (the original: zeros; see below)
    102 reserved[34]      136 port u16 (the sender's *client* port)
    138 flags u16         140 state u8 (0)        141 mflags[3]

mflags[1] is ours (the original sends 0 there and never reads it): bit
:data:`CAP_BATCH` says the sender takes *batched* messages, which only our
nodes send, and only to a node whose messages carried that bit:

* a job-ID message with ``count`` = k > 1 and k entries of 44 bytes;
* a REPLJOB with more than one job (the original drops those: it expects
  numjobs 1).

A cluster under load sends thousands of GOTJOB/QUEUED/REPLJOB a second to
each peer, and a receiver pays more per message than per entry (framing,
header, dispatch): :func:`coalesce` merges neighbouring ones when a link
writes its turn's output.

Announced addresses (``cluster-announce-ip``, ``-port``, ``-bus-port``):
a PING, PONG or MEET of a node that announces an address carries it in
bytes the original leaves zeroed and never reads, so no capability is
needed to send them: the IP as NUL-padded text in the first 44 bytes of
``myip`` (an IP's compressed text is at most 39 characters), a bus port
other than port + 10000 as u16 in its last two (offset 100; ``reserved``
is the cluster secret's, see auth.py), and in each gossip entry the
node's bus port (0: port + 10000) as u16 in the first two of its six
unused bytes.  The client port is the header's
``port`` as always.  A receiver takes a non-empty ``myip`` as the sender's
address instead of the link's peer address (the announced address is the
one that crosses the address translation in front of the node).

Bodies, by type (totlen must match exactly, or the message is dropped):

* PING, PONG, MEET: ``count`` gossip entries of 104 bytes each:
  node ID 40, ping_sent u32, pong_received u32 (low 32 bits of a ms clock),
  ip 46 (NUL-padded text), port u16, flags u16, 6 unused bytes.
* FAIL: the failing node's ID (40 bytes).
* job-ID messages (GOTJOB ENQUEUE QUEUED SETACK WILLQUEUE GOTACK DELJOB
  WORKING): job ID 40 + aux u32.
* job messages (REPLJOB, YOURJOBS): numjobs u32, datasize u32, then
  ``datasize`` bytes of serialized jobs (``job.serialize_job``, little-endian).
* queue messages (NEEDJOBS, PAUSE): aux u32, name length u32, name.
* QLIMIT (ours: sent only to nodes whose messages carry :data:`CAP_BATCH`,
  as the original logs every unknown type): max jobs u32, name length u32,
  name, period ms u32.

Framing errors (bad signature, a totlen below the header size or above the
reader's limit) mean the peer does not speak the protocol or is hostile:
the link is closed.  A well-framed message with a wrong length for its type
is only dropped, as the original does.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

__all__ = [
    "FrameError", "FrameReader", "GossipEntry", "Message", "UNPROVEN_MESSAGE", "batch_frame",
    "coalesce", "decode",
    "flags_from_wire", "flags_to_wire", "header_rest", "is_node_id", "is_repljob_key",
    "single_frame",
    "split_job_ids", "type_name",
]

SIGNATURE: Final = b"DbuZ"
VERSION: Final = 1
HEADER: Final = struct.Struct(">4sIHHHH40s46s34sHHB3s")
HEADER_SIZE: Final = 144
assert HEADER.size == HEADER_SIZE
GOSSIP: Final = struct.Struct(">40sII46sHHHI")
assert GOSSIP.size == 104
_AUX: Final = struct.Struct(">I")
_TWO_U32: Final = struct.Struct(">II")
_TOTLEN: Final = struct.Struct(">I")
#: The header fields a receiver reads (version, type, count, sender, port,
#: flags, mflags[0], mflags[1]), skipping the rest: unpacking the unused 80
#: bytes of myip and reserved made two bytes objects per message for nothing.
_DECODED_HEADER: Final = struct.Struct(">8xH2xHH40s80xHHxBBx")
_COUNT: Final = struct.Struct(">H")
_BUS_PORT: Final = struct.Struct(">H")
#: Bytes of ``myip`` for the announced IP's text; the bus port follows.
_MYIP_TEXT: Final = 44
assert _DECODED_HEADER.size == HEADER_SIZE

# Message types.  Final: compiled, each use (``messages.GOTJOB`` in the
# job modules too) is a constant rather than a lookup in a module's dict.
PING: Final = 0
PONG: Final = 1
MEET: Final = 2
FAIL: Final = 3
REPLJOB: Final = 4
GOTJOB: Final = 5
ENQUEUE: Final = 6
QUEUED: Final = 7
SETACK: Final = 8
WILLQUEUE: Final = 9
GOTACK: Final = 10
DELJOB: Final = 11
NEEDJOBS: Final = 12
YOURJOBS: Final = 13
WORKING: Final = 14
PAUSE: Final = 15
#: A queue's rate limit (QLIMIT ... BCAST), between our nodes only.
QLIMIT: Final = 16
TYPE_NAMES: Final = ("ping", "pong", "meet", "fail", "repljob", "gotjob", "enqueue", "queued",
              "setack", "willqueue", "gotack", "deljob", "needjobs", "yourjobs", "working",
              "pause", "qlimit")
GOSSIP_TYPES: Final = frozenset((PING, PONG, MEET))
JOB_ID_TYPES: Final = frozenset((GOTJOB, ENQUEUE, QUEUED, SETACK, WILLQUEUE, GOTACK, DELJOB,
                                 WORKING))
JOBS_TYPES: Final = frozenset((REPLJOB, YOURJOBS))
QUEUE_TYPES: Final = frozenset((NEEDJOBS, PAUSE))

# mflags[0] bits.
MFLAG_NOREPLY: Final = 1
MFLAG_INCR_NACKS: Final = 2
MFLAG_INCR_DELIV: Final = 4

# mflags[1] bits (ours, see above), set in every message we send.
CAP_BATCH: Final = 1
#: Entries one batched message carries at most: 4096 job-ID entries are
#: 180 KB, well under SMALL_MESSAGE.
MAX_BATCH: Final = 4096
#: Bytes of messages merged into one at most, and the largest REPLJOB that
#: is merged at all: a batch stays a small message (SMALL_MESSAGE).
_MAX_MERGED: Final = 256 * 1024
_MAX_MERGED_REPLJOB: Final = 64 * 1024

# Node flag bits, in the header (the sender's own flags) and in gossip entries.
WIRE_FLAGS: Final = {"fail?": 1, "fail": 2, "myself": 4, "handshake": 8, "noaddr": 16,
              "meet": 32, "deleted": 64, "leaving": 128}
_FLAG_BITS: Final = tuple((bit, name) for name, bit in WIRE_FLAGS.items())

#: Messages up to this size are buffered from anybody; bigger ones (jobs
#: with large bodies) only when the reader's ``large_ok`` agrees.
SMALL_MESSAGE: Final = 1024 * 1024
#: The largest message a link takes before it has proved itself (the
#: cluster secret, or a message from a node of the table: ``bus.py``).
#: A peer's first message on a link is a PING or MEET (ours and the
#: original's), whose gossip section is max(3, N/10) entries of 104 bytes:
#: 64 KB holds the gossip of a 6,000-node cluster.  Everything larger (job
#: copies, batches) comes after that first message.
UNPROVEN_MESSAGE: Final = 64 * 1024
#: The largest message a reader accepts unless told otherwise: a REPLJOB of
#: one job of the largest body a client may send (proto-max-bulk-len) fits.
DEFAULT_MAX_MESSAGE: Final = 512 * 1024 * 1024 + 1024 * 1024


_NODE_ID: Final = re.compile(r"[0-9a-f]{40}")


def is_node_id(text: str) -> bool:
    """40 lowercase hex characters: anything else is refused from the wire
    (an ID is written to nodes.conf, one line per node)."""
    return _NODE_ID.fullmatch(text) is not None


def flags_to_wire(flags: Iterable[str]) -> int:
    bits = 0
    for name in flags:
        bits |= WIRE_FLAGS.get(name, 0)
    return bits


def flags_from_wire(bits: int) -> set[str]:
    return {name for bit, name in _FLAG_BITS if bits & bit}


class GossipEntry(NamedTuple):
    node_id: str
    ping_sent: int
    pong_received: int
    ip: str
    port: int
    flags: int
    #: The node's announced bus port; 0: port + 10000.
    bus_port: int = 0


class Message:
    """One decoded bus message.  Only the fields of its type are meaningful.

    A plain slotted class rather than a NamedTuple: one is built per message
    received, thousands a second, and compiled it is a C struct.
    """

    __slots__ = ("aux", "bus_port", "caps", "flags", "gossip", "ip", "job_id", "mflags",
                 "node_id", "numjobs", "payload", "period", "port", "queue", "sender", "type")

    def __init__(self, msg_type: int, sender: str, port: int, flags: int, mflags: int,
                 gossip: tuple[GossipEntry, ...] = (), node_id: str = "",
                 job_id: bytes = b"", aux: int = 0, queue: bytes = b"", numjobs: int = 0,
                 payload: bytes = b"", caps: int = 0) -> None:
        self.type = msg_type
        self.sender = sender
        self.port = port        # the sender's client port
        self.flags = flags      # the sender's node flags (wire bits)
        self.mflags = mflags
        self.gossip = gossip
        self.node_id = node_id  # FAIL
        self.job_id = job_id    # job-ID messages
        self.aux = aux          # job-ID and queue messages
        self.queue = queue      # queue messages
        self.numjobs = numjobs  # job messages; batched job-ID messages: entries
        self.payload = payload  # job messages: the serialized jobs; batched: the entries
        self.caps = caps        # mflags[1]: what the sender takes (CAP_BATCH)
        self.period = 0         # QLIMIT: the period in ms (aux is the max)
        self.ip = ""            # PING/PONG/MEET: the sender's announced IP ("": none)
        self.bus_port = 0       # PING/PONG/MEET: its announced bus port (0: port + 10000)

    def __repr__(self) -> str:
        return (f"Message({TYPE_NAMES[self.type]} from {self.sender} port={self.port} "
                f"flags={self.flags} mflags={self.mflags})")


class FrameError(Exception):
    """The byte stream is not the bus protocol: close the link."""


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------

def header(msg_type: int, sender_id: str, port: int, flags: int, body_len: int,
           count: int = 0, mflags: int = 0, ip: str = "", bus_port: int = 0) -> bytes:
    """``ip`` and ``bus_port``: the sender's announced address (gossip
    messages only), in fields the original leaves zeroed."""
    myip = b""
    if ip or bus_port:
        myip = ip.encode("ascii")[:_MYIP_TEXT].ljust(_MYIP_TEXT, b"\0") + _BUS_PORT.pack(bus_port)
    return HEADER.pack(SIGNATURE, HEADER_SIZE + body_len, VERSION, 0, msg_type, count,
                       sender_id.encode("ascii"), myip, b"", port, flags, 0,
                       bytes((mflags, CAP_BATCH, 0)))


def gossip_entry(entry: GossipEntry) -> bytes:
    return GOSSIP.pack(entry.node_id.encode("ascii"), entry.ping_sent & 0xFFFFFFFF,
                       entry.pong_received & 0xFFFFFFFF, entry.ip.encode("ascii")[:46],
                       entry.port, entry.flags, entry.bus_port, 0)


def gossip_message(msg_type: int, sender_id: str, port: int, flags: int,
                   entries: Iterable[GossipEntry], ip: str = "", bus_port: int = 0) -> bytes:
    """PING, PONG or MEET with its gossip section; ``ip`` and ``bus_port``:
    the sender's announced address, if it has one."""
    body = b"".join(gossip_entry(e) for e in entries)
    count = len(body) // GOSSIP.size
    return header(msg_type, sender_id, port, flags, len(body), count, ip=ip,
                  bus_port=bus_port) + body


def fail_message(sender_id: str, port: int, flags: int, failing_id: str) -> bytes:
    return header(FAIL, sender_id, port, flags, 40) + failing_id.encode("ascii")


#: Headers from offset 8 (all but the signature and totlen) of the
#: messages sent per job (GOTJOB, QUEUED, REPLJOB ...), by what varies in
#: them: thousands a second go out with the same one.
_HEADER_RESTS: Final[dict[tuple[int, str, int, int, int], bytes]] = {}
#: The first 8 bytes of every job-ID message (they all have one length).
_JOB_ID_PREFIX: Final = SIGNATURE + _TOTLEN.pack(HEADER_SIZE + 44)


def _header_rest(msg_type: int, sender_id: str, port: int, flags: int, mflags: int) -> bytes:
    key = (msg_type, sender_id, port, flags, mflags)
    rest = _HEADER_RESTS.get(key)
    if rest is None:
        if len(_HEADER_RESTS) >= 1024:  # our ID or port changed many times
            _HEADER_RESTS.clear()
        rest = _HEADER_RESTS[key] = header(msg_type, sender_id, port, flags, 0,
                                           mflags=mflags)[8:]
    return rest


def job_id_message(msg_type: int, sender_id: str, port: int, flags: int, job_id: bytes,
                   aux: int, mflags: int = 0) -> bytes:
    """Messages about one job: 40-byte job ID + aux u32."""
    return b"".join((_JOB_ID_PREFIX, _header_rest(msg_type, sender_id, port, flags, mflags),
                     job_id, _AUX.pack(aux & 0xFFFFFFFF)))


def queue_message(msg_type: int, sender_id: str, port: int, flags: int, queue: bytes,
                  aux: int) -> bytes:
    """Messages about a queue (NEEDJOBS, PAUSE): aux u32, name length u32, name."""
    return (header(msg_type, sender_id, port, flags, 8 + len(queue))
            + _TWO_U32.pack(aux & 0xFFFFFFFF, len(queue)) + queue)


def qlimit_message(sender_id: str, port: int, flags: int, queue: bytes, max_jobs: int,
                   period_ms: int) -> bytes:
    """QLIMIT: a queue message (max jobs as aux) with the period after the name."""
    return (header(QLIMIT, sender_id, port, flags, 12 + len(queue))
            + _TWO_U32.pack(max_jobs & 0xFFFFFFFF, len(queue)) + queue
            + _AUX.pack(period_ms & 0xFFFFFFFF))


def jobs_message(msg_type: int, sender_id: str, port: int, flags: int, blobs: list[bytes],
                 mflags: int = 0, trailer: bytes = b"") -> bytes:
    """REPLJOB / YOURJOBS: numjobs u32, datasize u32, the serialized jobs.

    ``trailer`` goes after the jobs, inside ``datasize``: the extension
    options of the jobs (disque.job_options), which the original ignores.
    """
    data = b"".join(blobs) + trailer if trailer else b"".join(blobs)
    return b"".join((SIGNATURE, _TOTLEN.pack(HEADER_SIZE + 8 + len(data)),
                     _header_rest(msg_type, sender_id, port, flags, mflags),
                     _TWO_U32.pack(len(blobs), len(data)), data))


def _batch_key(frame: bytes) -> bytes:
    """The header a message may merge under (bytes 8-144: type, sender,
    flags, mflags), or b"" for one that is sent as it is.

    Byte by byte rather than sliced or unpacked: a link runs this on every
    message it sends to our nodes (compiled, an index is a C array read).
    """
    size = len(frame)
    if frame[12] or frame[14] or frame[15]:  # type > 255, or a count: not ours to merge
        return b""
    if size == HEADER_SIZE + 44:
        return frame[8:HEADER_SIZE] if frame[13] in JOB_ID_TYPES else b""
    if (frame[13] == REPLJOB and HEADER_SIZE + 12 <= size <= _MAX_MERGED_REPLJOB
            and frame[147] == 1 and not (frame[144] or frame[145] or frame[146])):
        # One job and nothing after its blob (the blob's length is its first
        # 4 bytes, little-endian): an extension trailer (job_options) describes
        # the jobs of its own message, so that message stays whole.
        blob = frame[152] | frame[153] << 8 | frame[154] << 16 | frame[155] << 24
        if size == HEADER_SIZE + 12 + blob:
            return frame[8:HEADER_SIZE]
    return b""


def header_rest(msg_type: int, sender_id: str, port: int, flags: int, mflags: int = 0) -> bytes:
    """Bytes 8-144 of a header (all but the signature and totlen): the
    ``key`` of :func:`single_frame`, :func:`batch_frame` and a link's
    ``send_entry``."""
    return _header_rest(msg_type, sender_id, port, flags, mflags)


#: Entries bigger than this (a REPLJOB's job blob) leave in a message of
#: their own, never batched: a batch stays a small message.
MAX_BATCHED_ENTRY: Final = _MAX_MERGED_REPLJOB - HEADER_SIZE - 8
#: Bytes of entries one batched message carries at most (one more entry
#: may go over it).
MAX_BATCH_BYTES: Final = _MAX_MERGED


def is_repljob_key(key: bytes) -> bool:
    """Whether ``key`` (:func:`header_rest`) heads REPLJOB messages."""
    return key[5] == REPLJOB and key[4] == 0  # bytes 12-13 of the frame: the type


def single_frame(key: bytes, entry: bytes) -> bytes:
    """The message of one entry under the header ``key`` (:func:`header_rest`):
    a job-ID message (entry = job ID + aux) or a REPLJOB/YOURJOBS of one job
    (entry = its blob), byte for byte what :func:`job_id_message` and
    :func:`jobs_message` make (what the original takes)."""
    if key[5] in JOBS_TYPES:  # key[5] is byte 13 of the frame: the type's low byte
        return b"".join((SIGNATURE, _TOTLEN.pack(HEADER_SIZE + 8 + len(entry)), key,
                         _TWO_U32.pack(1, len(entry)), entry))
    return b"".join((_JOB_ID_PREFIX, key, entry))


def batch_frame(key: bytes, entries: list[bytes]) -> bytes:
    """One message for ``entries`` under the header ``key`` (CAP_BATCH peers
    only when there are several): REPLJOB blobs as one REPLJOB of that many
    jobs, job-ID entries as one message whose ``count`` says how many."""
    if len(entries) == 1:
        return single_frame(key, entries[0])
    if key[5] in JOBS_TYPES:
        data = b"".join(entries)
        return b"".join((SIGNATURE, _TOTLEN.pack(HEADER_SIZE + 8 + len(data)), key,
                         _TWO_U32.pack(len(entries), len(data)), data))
    # Job-ID messages: ``count`` (bytes 14-16) says how many entries follow.
    return b"".join([SIGNATURE, _TOTLEN.pack(HEADER_SIZE + 44 * len(entries)), key[:6],
                     _COUNT.pack(len(entries)), key[8:], *entries])


def _merged(run: list[bytes], key: bytes) -> bytes:
    """One message for a run of messages with the same header ``key``."""
    if len(run) == 1:
        return run[0]
    if key[5] == REPLJOB:
        return batch_frame(key, [frame[HEADER_SIZE + 8:] for frame in run])
    return batch_frame(key, [frame[HEADER_SIZE:] for frame in run])


def coalesce(frames: list[bytes]) -> list[bytes]:
    """``frames`` for a peer that takes batched messages (CAP_BATCH).

    Runs of neighbouring job-ID messages with the same header (type, flags,
    mflags) become one message with ``count`` entries; runs of single-job
    REPLJOBs with the same header become one REPLJOB.  Only neighbours
    merge, so the peer handles everything in the order it was sent.
    """
    out: list[bytes] = []
    run: list[bytes] = []
    run_key = b""
    run_bytes = 0
    for frame in frames:
        key = _batch_key(frame)
        if key and key == run_key and len(run) < MAX_BATCH and run_bytes < _MAX_MERGED:
            run.append(frame)
            run_bytes += len(frame) - HEADER_SIZE  # what it adds to the merged message
            continue
        if run:
            out.append(_merged(run, run_key))
        if key:
            run = [frame]
            run_key = key
            run_bytes = len(frame) - HEADER_SIZE
        else:
            run = []
            run_key = b""
            out.append(frame)
    if run:
        out.append(_merged(run, run_key))
    return out


# --------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------

class FrameReader:
    """Splits a link's byte stream into whole messages, checking each header.

    ``feed`` takes whatever one read returned and gives back every complete
    message in it (many per read under load); a partial one waits for the
    next read.  The signature and the length are checked as soon as the
    first 8 bytes of a message are there, so a hostile length is refused
    before any of its body is buffered.
    """

    __slots__ = ("_buffer", "held", "large_ok", "max_message", "small_message")

    def __init__(self, max_message: int = DEFAULT_MAX_MESSAGE,
                 large_ok: Callable[[bytes], bool] | None = None,
                 small_message: int = SMALL_MESSAGE) -> None:
        self._buffer = bytearray()
        self.max_message = max_message
        #: Asked, with the 144-byte header, whether a message longer than
        #: ``small_message`` may be buffered (only jobs, from known nodes,
        #: are over SMALL_MESSAGE): a stranger cannot make us hold hundreds
        #: of MB.  A link that has not proved itself yet reads with
        #: ``small_message`` = UNPROVEN_MESSAGE and raises it once it has.
        self.large_ok = large_ok
        self.small_message = small_message
        #: ``feed`` stopped before a message that needs ``large_ok``, to let
        #: the caller handle the messages before it first (the PING that
        #: proves a link may share a read with the first big job copy):
        #: call ``feed(b"")`` after them to go on.
        self.held = False

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message held."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        pos = 0
        end = len(buffer)
        self.held = False
        while end - pos >= 8:
            if buffer[pos:pos + 4] != SIGNATURE:
                raise FrameError("bad signature")
            (totlen,) = _TOTLEN.unpack_from(buffer, pos + 4)
            if totlen < HEADER_SIZE:
                raise FrameError(f"message length {totlen} is below the header size")
            if totlen > self.max_message:
                raise FrameError(f"message length {totlen} is over the limit "
                                 f"of {self.max_message} bytes")
            if totlen > self.small_message and self.large_ok is not None:
                if end - pos < HEADER_SIZE:
                    break
                if frames:
                    self.held = True  # the messages before it may change the answer
                    break
                if not self.large_ok(bytes(buffer[pos:pos + HEADER_SIZE])):
                    if self.small_message < SMALL_MESSAGE:
                        raise FrameError(f"message length {totlen} is over the limit of "
                                         f"{self.small_message} bytes for a link that has "
                                         "not proved itself")
                    raise FrameError(f"message length {totlen} is only allowed for jobs "
                                     "from known nodes")
            if end - pos < totlen:
                break
            frames.append(bytes(buffer[pos:pos + totlen]))
            pos += totlen
        if pos:
            del buffer[:pos]
        return frames


def _body_length_ok(msg_type: int, count: int, frame: bytes) -> bool:
    size = len(frame) - HEADER_SIZE
    if msg_type in JOB_ID_TYPES:
        return size == 44 if count <= 1 else size == 44 * count  # batched (CAP_BATCH)
    if msg_type in GOSSIP_TYPES:
        return size == count * GOSSIP.size
    if msg_type == FAIL:
        return size == 40
    if msg_type in JOBS_TYPES or msg_type in QUEUE_TYPES:
        return size >= 8 and size == 8 + _TWO_U32.unpack_from(frame, HEADER_SIZE)[1]
    if msg_type == QLIMIT:
        return size >= 12 and size == 12 + _TWO_U32.unpack_from(frame, HEADER_SIZE)[1]
    return False


def type_name(frame: bytes) -> str:
    """The type of a whole frame, for logs, without decoding it."""
    msg_type = int.from_bytes(frame[12:14], "big")
    return TYPE_NAMES[msg_type].upper() if msg_type < len(TYPE_NAMES) else f"type {msg_type}"


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


#: Sender IDs already checked -> their text: a message's sender is nearly
#: always a node we heard from a moment ago.
_SENDERS: Final[dict[bytes, str]] = {}
_SENDERS_MAX: Final = 4096


def _valid_sender(raw: bytes) -> str | None:
    try:
        sender_id = raw.decode("ascii")
    except UnicodeDecodeError:
        return None
    if not is_node_id(sender_id):
        return None
    if len(_SENDERS) >= _SENDERS_MAX:
        _SENDERS.clear()
    _SENDERS[raw] = sender_id
    return sender_id


def decode(frame: bytes) -> Message | None:
    """A whole frame (from :class:`FrameReader`) as a Message, or None to drop it.

    Dropped: another protocol version, an unknown type, a body whose length
    does not match its type, a sender that is not a node ID.
    """
    (version, msg_type, count, sender, port, flags, mflags,
     caps) = _DECODED_HEADER.unpack_from(frame)
    if version != VERSION or msg_type >= len(TYPE_NAMES):
        return None
    if not _body_length_ok(msg_type, count, frame):
        return None
    sender_id = _SENDERS.get(sender)
    if sender_id is None:
        sender_id = _valid_sender(sender)
        if sender_id is None:
            return None
    body = HEADER_SIZE
    if msg_type in JOB_ID_TYPES:  # the most frequent: GOTJOB, QUEUED, SETACK ...
        if count > 1:  # batched: see split_job_ids
            return Message(msg_type, sender_id, port, flags, mflags, numjobs=count,
                           payload=frame[body:], caps=caps)
        return Message(msg_type, sender_id, port, flags, mflags,
                       job_id=frame[body:body + 40], aux=_AUX.unpack_from(frame, body + 40)[0],
                       caps=caps)
    if msg_type in JOBS_TYPES:
        numjobs = _TWO_U32.unpack_from(frame, body)[0]
        return Message(msg_type, sender_id, port, flags, mflags, numjobs=numjobs,
                       payload=frame[body + 8:], caps=caps)
    if msg_type in GOSSIP_TYPES:
        entries = []
        for i in range(count):
            (node_id, ping_sent, pong_received, ip, gport, gflags, gbus_port,
             _u2) = GOSSIP.unpack_from(frame, body + i * GOSSIP.size)
            entries.append(GossipEntry(_text(node_id), ping_sent, pong_received, _text(ip),
                                       gport, gflags, gbus_port))
        msg = Message(msg_type, sender_id, port, flags, mflags, gossip=tuple(entries),
                      caps=caps)
        if frame[56]:  # an announced IP (the original sends zeros)
            msg.ip = _text(frame[56:56 + _MYIP_TEXT])
        msg.bus_port = _BUS_PORT.unpack_from(frame, 56 + _MYIP_TEXT)[0]
        return msg
    if msg_type == FAIL:
        return Message(msg_type, sender_id, port, flags, mflags, node_id=_text(frame[body:]))
    aux = _TWO_U32.unpack_from(frame, body)[0]
    if msg_type == QLIMIT:
        msg = Message(msg_type, sender_id, port, flags, mflags, aux=aux,
                      queue=frame[body + 8:-4], caps=caps)
        msg.period = _AUX.unpack_from(frame, len(frame) - 4)[0]
        return msg
    return Message(msg_type, sender_id, port, flags, mflags, aux=aux, queue=frame[body + 8:],
                   caps=caps)


def split_job_ids(msg: Message) -> list[Message]:
    """The entries of a batched job-ID message, each as the message it stands for."""
    payload = msg.payload
    return [Message(msg.type, msg.sender, msg.port, msg.flags, msg.mflags,
                    job_id=payload[i:i + 40], aux=_AUX.unpack_from(payload, i + 40)[0],
                    caps=msg.caps)
            for i in range(0, len(payload), 44)]
