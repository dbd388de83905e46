"""The job: its fields, states, IDs and serialized form.

A job is immutable in what the user gave (queue, body, TTL, RETRY, DELAY,
REPLICATE) and mutable in what the node learns (state, counters, node sets,
next queue time).  The field names follow the spec's state machine
(``job.delivered``, ``job.confirmed``, ``job.qtime``...).

Job IDs (spec "Job IDs")::

    D- | dcb833cf | 8YL1NT17e9+wsA/09NqxscQI | 05a1
    prefix  node     144 random bits, base64   TTL in minutes, odd if RETRY > 0

All times inside a job are milliseconds of the wall clock, because they are
persisted (AOF) and compared across restarts; ``ctime`` is ``ms * 1e6 +
counter`` so it orders jobs created in the same millisecond.
"""

from __future__ import annotations

import os
import struct
from enum import IntEnum
from typing import TYPE_CHECKING, Final

from .compiled import mypyc_attr

if TYPE_CHECKING:
    from .job_options import JobExt

__all__ = [
    "BLOB_HEAD",
    "Job",
    "JobState",
    "WAIT_REPL",
    "ACTIVE",
    "QUEUED",
    "ACKED",
    "JobIdGenerator",
    "JOB_ID_LEN",
    "FLAG_BCAST_QUEUED",
    "FLAG_BCAST_WILLQUEUE",
    "FLAG_DELIVERED",
    "FLAG_FIFO_STALE",
    "FLAG_GROUP_COPY",
    "FLAG_GROUP_OUT",
    "FLAG_IN_FIFO",
    "SERIALIZED_FLAGS",
    "is_valid_job_id",
    "are_valid_job_ids",
    "ttl_minutes_from_id",
    "serialize_job",
    "deserialize_job",
]

JOB_ID_LEN: Final = 40


class JobState(IntEnum):
    """Job states, numbered like the original (they are persisted)."""

    WAIT_REPL = 0
    ACTIVE = 1
    QUEUED = 2
    ACKED = 3

    @property
    def label(self) -> str:
        return _STATE_LABELS[self]

    @classmethod
    def from_label(cls, label: str) -> JobState | None:
        return _LABEL_STATES.get(label.lower())


# The members as plain names: ``JobState.QUEUED`` is a metaclass lookup
# (~80 ns) and the state machine compares states on every command.
# Final: compiled, C statics, not lookups in this module's dict from every
# module that compares states.
WAIT_REPL: Final = JobState.WAIT_REPL
ACTIVE: Final = JobState.ACTIVE
QUEUED: Final = JobState.QUEUED
ACKED: Final = JobState.ACKED

_STATE_LABELS: Final = {
    JobState.WAIT_REPL: "wait-repl",
    JobState.ACTIVE: "active",
    JobState.QUEUED: "queued",
    JobState.ACKED: "acked",
}
_LABEL_STATES: Final = {v: k for k, v in _STATE_LABELS.items()}
STATE_LABEL_BYTES: Final = {int(k): v.encode() for k, v in _STATE_LABELS.items()}

# Job flags, same bits as the original so the serialized form matches.
#: The next enqueue must broadcast QUEUED (set after the first, silent one).
FLAG_BCAST_QUEUED: Final = 1
#: Send WILLQUEUE to the other copies 500 ms before qtime.
FLAG_BCAST_WILLQUEUE: Final = 2
#: Delivered to a client at least once (RETRY-0 jobs are then never queued again).
FLAG_DELIVERED: Final = 4
# This node's memory only (see queue_order.py): never serialized, and cleared
# from what is loaded or received.  Bits the original does not use, below
# 256 so that an interpreted node's flags stay cached small ints.
#: The job has the live entry of a queue's FIFO.
FLAG_IN_FIFO: Final = 0x40
#: A queue's FIFO still holds a stale entry of the job.
FLAG_FIFO_STALE: Final = 0x80
#: The job holds its group (ADDJOB ... GROUP, groups.py): it left the
#: group's queue on this node (delivered, dequeued) and was not settled yet.
FLAG_GROUP_OUT: Final = 0x20
#: The job is one of its group's *copies* here (groups.py): active, neither
#: queued nor out on this node (a copy of a job another node serves, or one
#: not queued again yet); it holds the group's younger jobs.
FLAG_GROUP_COPY: Final = 0x10
#: The flags a job's serialized form carries.
SERIALIZED_FLAGS: Final = 0xFF & ~(FLAG_IN_FIFO | FLAG_FIFO_STALE | FLAG_GROUP_OUT
                                   | FLAG_GROUP_COPY)


@mypyc_attr(acyclic=True)
class Job:
    """One job as held by this node.

    ``delivered`` is the set of node IDs that may have a copy and
    ``confirmed`` the nodes that confirmed replication (``wait-repl``) or
    the ACK (``acked``).  Both are frozensets shared between jobs where
    possible (the common single-copy case costs nothing per job).

    Acyclic (for mypyc: not tracked by CPython's cyclic collector): a job
    holds bytes, numbers, frozensets of strings and its :class:`JobExt`,
    none of which can lead back to it, so it can never be part of a
    reference cycle.  Untracked, the millions a node stores are never
    walked by a collection, and making one does not count towards the
    next.
    """

    __slots__ = (
        "additional_deliveries",
        "awakeme",
        "body",
        "confirmed",
        "ctime",
        "delay",
        "delivered",
        "etime",
        "ext",
        "flags",
        "gc_retry",
        "id",
        "nacks",
        "qtime",
        "queue",
        "repl",
        "retry",
        "state",
    )

    def __init__(self, job_id: bytes, queue: bytes | None, body: bytes,
                 state: JobState = JobState.ACTIVE, repl: int = 1, ctime: int = 0,
                 etime: int = 0, delay: int = 0, retry: int = 0,
                 delivered: frozenset[str] = frozenset(),
                 confirmed: frozenset[str] = frozenset()) -> None:
        self.id = job_id
        self.queue = queue
        self.body = body
        self.state = state
        self.flags = 0
        self.repl = repl
        self.ctime = ctime
        self.etime = etime            # absolute expiry, ms
        self.delay = delay            # seconds
        self.retry = retry            # seconds
        self.qtime = 0                # next (re)queue time, ms; 0 = never
        self.awakeme = 0              # when process_job must look at it, ms
        self.nacks = 0
        self.additional_deliveries = 0
        self.gc_retry = 0
        self.delivered = delivered
        self.confirmed = confirmed
        #: The extension options (BACKOFF, MAXDELIVERIES, DEADLETTER,
        #: PRIORITY, headers, GROUP), or None for a job of the original's
        #: kind (nearly all of them).
        self.ext: JobExt | None = None

    @property
    def is_dummy_ack(self) -> bool:
        """An ACK held for a job this node never had (spec "dummy ACK")."""
        return self.state == JobState.ACKED and not self.delivered and self.queue is None

    @property
    def ttl_seconds(self) -> int:
        """The TTL the job was created with, in seconds."""
        return max(0, (self.etime - self.ctime // 1_000_000) // 1000)

    def __repr__(self) -> str:
        return f"<Job {self.id.decode()} {JobState(self.state).label} queue={self.queue!r}>"


# --------------------------------------------------------------------------
# Job IDs
# --------------------------------------------------------------------------

_B64: Final = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
#: 6-bit value of each base64 character (-1 for others); used for scan slices.
B64_VALUE: Final[list[int]] = [-1] * 256
for _i, _c in enumerate(_B64):
    B64_VALUE[_c] = _i


#: Each random byte becomes one base64 character, from its low 6 bits: 256
#: is a multiple of 64, so the characters stay uniform (6 bits each).
_RANDOM_TO_B64: Final = bytes(_B64[b & 63] for b in range(256))
#: Characters of an ID's random part (144 bits).
_RANDOM_CHARS: Final = 24


class JobIdGenerator:
    """``D-<node8>-<24 base64 chars of 144 random bits>-<ttl>``.

    The random part comes from ``os.urandom`` (the kernel's CSPRNG), drawn
    in blocks of ``ID_BLOCK`` IDs and made base64 characters once per block
    (``bytes.translate``, a byte per character).  The block is laid out as
    the replies of ADDJOB, ``+<ID>\\r\\n`` after one another (one join when
    it is drawn), for the TTL suffix of the ID that drew it: such an ID
    costs one slice of the block, and its reply another
    (:meth:`status_line`), where building them cost five concatenations and
    slices.  An ID of another TTL takes the next random part with its own
    suffix.  The original hashed a seed and a counter with SHA-1 per ID
    (and, through an indexing bug, used only ~114 of the 144 bits); that was
    7-10% of the node's ADDJOB time here.
    """

    __slots__ = ("_block", "_block_key", "_end", "_last_id", "_last_key", "_last_pos",
                 "_last_suffix", "_pos", "_prefix", "_record", "_suffixes")

    #: IDs drawn per ``os.urandom`` call (96 KiB of randomness).
    ID_BLOCK: Final = 4096

    def __init__(self, node_id: str) -> None:
        self._prefix = b"D-" + node_id[:8].encode() + b"-"
        self._block = b""
        # Where the next record (its "+") starts, where the records end,
        # their length and the TTL key they were made for.
        self._pos = 0
        self._end = 0
        self._record = 0
        self._block_key = -1
        # The last ID sliced from the block and its record (status_line).
        self._last_id: bytes | None = None
        self._last_pos = 0
        # "-%04x" TTL suffixes by ttl * 2 + (retry > 0): a handful of distinct
        # values in practice; the last one apart, since a producer's jobs
        # share it and comparing its key costs less than a lookup.
        self._suffixes: dict[int, bytes] = {}
        self._last_key = -1
        self._last_suffix = b""

    def next_id(self, ttl: int, retry: int) -> bytes:
        """A new job ID for a job with ``ttl`` seconds and ``retry`` seconds."""
        key = ttl * 2 + (retry > 0)
        pos = self._pos
        if pos >= self._end:
            self._draw(key, ttl, retry)
            pos = self._pos
        self._pos = pos + self._record
        prefix_len = len(self._prefix)
        if key == self._block_key:
            job_id: bytes = self._block[pos + 1:pos + self._record - 2]
            self._last_id = job_id
            self._last_pos = pos
            return job_id
        start = pos + 1 + prefix_len
        return (self._prefix + self._block[start:start + _RANDOM_CHARS]
                + self._suffix(key, ttl, retry))

    def status_line(self, job_id: bytes) -> bytes:
        """``+<job_id>\\r\\n``, ADDJOB's reply: for the ID :meth:`next_id`
        returned last, a slice of the block."""
        if job_id is self._last_id:
            pos = self._last_pos
            return self._block[pos:pos + self._record]
        return b"+" + job_id + b"\r\n"

    def _draw(self, key: int, ttl: int, retry: int) -> None:
        """A new block of ``ID_BLOCK`` records for TTL key ``key``."""
        suffix = self._suffix(key, ttl, retry)
        chars = os.urandom(_RANDOM_CHARS * self.ID_BLOCK).translate(_RANDOM_TO_B64)
        # Between two random parts: an ID's end, its CRLF, the next "+" and prefix.
        glue = suffix + b"\r\n+" + self._prefix
        runs = [b""]  # the empty ends put the glue before the first record and after the last
        for i in range(0, len(chars), _RANDOM_CHARS):
            runs.append(chars[i:i + _RANDOM_CHARS])
        runs.append(b"")
        self._block = glue.join(runs)
        self._record = len(glue) + _RANDOM_CHARS
        self._pos = len(suffix) + 2
        self._end = self._pos + self._record * self.ID_BLOCK
        self._block_key = key
        self._last_id = None

    def _suffix(self, key: int, ttl: int, retry: int) -> bytes:
        if key == self._last_key:
            return self._last_suffix
        found = self._suffixes.get(key)
        if found is None:
            if len(self._suffixes) > 1024:
                self._suffixes.clear()
            found = self._suffixes[key] = b"-%04x" % encode_ttl_minutes(ttl, retry)
        self._last_suffix = found
        self._last_key = key
        return found


def encode_ttl_minutes(ttl: int, retry: int) -> int:
    """TTL in minutes, odd for at-least-once jobs and even for RETRY 0."""
    minutes = min(ttl // 60, 0xFFFF)
    return minutes | 1 if retry > 0 else minutes & ~1


#: The form of a job ID (is_valid_job_id checks it without a regex).
_ID_PATTERN: Final = rb"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}"


def _id_classes(hex_as: int) -> bytes:
    """A translate table: base64 characters to ``b``, hex digits to
    ``hex_as``, the dash to itself, anything else to ``!``."""
    classes = bytearray(b"!" * 256)
    for char in _B64:
        classes[char] = ord("b")
    for char in b"0123456789abcdef":
        classes[char] = hex_as
    classes[ord("-")] = ord("-")
    return bytes(classes)


#: An ID through _ID_BASE64 must read _ID_SHAPE (base64 characters and
#: dashes where they belong), and through _ID_HEX its ends must read
#: _ID_HEAD and _ID_TAIL (hex digits where they belong; "D" is checked on
#: its own).
_ID_BASE64: Final = _id_classes(ord("b"))
_ID_HEX: Final = _id_classes(ord("h"))
_ID_SHAPE: Final = b"b-" + b"b" * 8 + b"-" + b"b" * 24 + b"-" + b"b" * 4
_ID_HEAD: Final = b"b-" + b"h" * 8 + b"-"
_ID_TAIL: Final = b"-" + b"h" * 4
#: Where the hex digits of an ID are (its _ID_HEAD and _ID_TAIL).
_ID_HEX_OFFSETS: Final = (*range(2, 10), *range(36, 40))


def is_valid_job_id(job_id: bytes) -> bool:
    """True if ``job_id`` has the exact 40-character job ID form (_ID_PATTERN).

    Two translates and three comparisons rather than the regular
    expression: compiled, a third of its cost, and a peer checks the ID of
    every copy it gets.
    """
    if len(job_id) != 40 or job_id[0] != 68 or job_id.translate(_ID_BASE64) != _ID_SHAPE:
        return False
    classes = job_id.translate(_ID_HEX)
    return classes[:11] == _ID_HEAD and classes[35:] == _ID_TAIL


def are_valid_job_ids(job_ids: list[bytes]) -> bool:
    """True if every ID is valid (ACKJOB with 1,000 IDs): a few passes over
    all of them joined, as :func:`is_valid_job_id` makes over one.

    Joined by spaces (which translate to ``!``), the IDs must read
    _ID_SHAPE n times separated by ``!``.  Spaces sit only where two
    arguments meet, so that also proves each argument is 40 bytes long.  The
    "D" and the hex digits are then checked column by column: every 41st
    byte from a column's offset.
    """
    count = len(job_ids)
    if count <= 1:
        return not job_ids or is_valid_job_id(job_ids[0])
    joined = b" ".join(job_ids)
    if len(joined) != 41 * count - 1:
        return False
    if joined.translate(_ID_BASE64) != ((_ID_SHAPE + b"!") * count)[:-1]:
        return False
    if joined[::41] != b"D" * count:
        return False
    classes = joined.translate(_ID_HEX)
    column = b"h" * count
    return all(classes[offset::41] == column for offset in _ID_HEX_OFFSETS)


def ttl_minutes_from_id(job_id: bytes) -> int:
    """The TTL field of a (valid) job ID: its parity tells at-least-once (odd)."""
    return int(job_id[36:40], 16)


# --------------------------------------------------------------------------
# Serialization (the original's blob, used by the AOF and the cluster bus)
# --------------------------------------------------------------------------
#
# Little-endian, as job.c:serializeJob:
#   u32 length of what follows
#   id[40] | u8 state (low nibble) + gc_retry (high nibble) | u8 flags |
#   u16 repl | u32 etime (absolute seconds) | u64 ctime | u32 delay |
#   u32 retry | u16 nacks | u16 additional deliveries          (68 bytes)
#   u32 len + queue | u32 len + body | u32 count + count * 40-byte node IDs

# Final: compiled, a Final module name is a C static rather than a lookup
# in the module's dict (serialize/deserialize run once per replicated job).
_FIXED: Final = struct.Struct("<40sBBHIQIIHH")
_FIXED_SIZE: Final = 68
_U32: Final = struct.Struct("<I")
#: The blob's length, the fixed part and the queue name's length: what
#: precedes the name, in one unpack (a struct call costs more than the
#: bytes it handles).
BLOB_HEAD: Final = struct.Struct("<I40sBBHIQIIHHI")
_HEAD_SIZE: Final = 76
_ACKED: Final = 3  # JobState.ACKED, as a plain int


def serialize_job(job: Job, bus_now_ms: int | None = None) -> bytes:
    """The job in the original's serialized blob form (see above).

    With ``bus_now_ms``, the form sent on the cluster bus: the expiry as the
    seconds left, rounded up (at least 1), rather than an absolute time,
    since the nodes' clocks differ; and without the DELIVERED flag, which is
    this node's business.  The original sends the whole seconds left + 1:
    a job sent in the millisecond it was made then gave copies one second
    more than its TTL (SHOW: 601 for TTL 600).
    """
    queue = job.queue or b""
    body = job.body
    flags = job.flags
    if bus_now_ms is None:
        etime_s = job.etime // 1000
    else:
        etime_s = max(1, -((bus_now_ms - job.etime) // 1000))  # ceil(left / 1000)
        flags &= ~FLAG_DELIVERED
    gc_retry = job.gc_retry
    nacks = job.nacks
    deliveries = job.additional_deliveries
    # An IntEnum is an int: compiled, this unboxes it, where int() was a
    # Python-level call of the int type (~450 instructions a job).
    state: int = job.state
    nodes = _node_list_blob(job.delivered)
    qlen = len(queue)
    head = _HEADS.get(qlen)
    if head is None:
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        head = _HEADS[qlen] = struct.Struct(f"<I40sBBHIQIIHHI{qlen}sI")
    return b"".join((
        head.pack(_FIXED_SIZE + 8 + qlen + len(body) + len(nodes), job.id,
                  (state & 0x0F) | ((gc_retry if gc_retry < 15 else 15) << 4),
                  flags & SERIALIZED_FLAGS, job.repl & 0xFFFF, etime_s & 0xFFFFFFFF,
                  job.ctime & 0xFFFFFFFFFFFFFFFF, job.delay & 0xFFFFFFFF,
                  job.retry & 0xFFFFFFFF, nacks if nacks < 0xFFFF else 0xFFFF,
                  deliveries if deliveries < 0xFFFF else 0xFFFF, qlen, queue, len(body)),
        body, nodes))


#: Queue name length -> the struct of everything before the body (the
#: length, the fixed part, the queue name, the body's length): one pack per
#: blob.  Queue names have few distinct lengths.
_HEADS: Final[dict[int, struct.Struct]] = {}
_HEADS_MAX: Final = 256


class SerializationError(ValueError):
    """A serialized job blob that is truncated or inconsistent."""


def deserialize_job(blob: bytes, offset: int = 0) -> tuple[Job, int]:
    """Parse one blob at ``offset``; return the job and the offset after it.

    Plain bytes slicing and pre-built structs: a peer runs this once per
    replicated job, and memoryview slices plus struct's format-string cache
    cost it a third of its time.
    """
    size = len(blob)
    # Every unpacked field typed: compiled, an untyped one is a boxed object
    # whose every ``&``, ``>>`` or ``*`` below is a Python-level operation.
    length: int
    job_id: bytes
    state_gc: int
    flags: int
    repl: int
    etime_s: int
    ctime: int
    delay: int
    retry: int
    nacks: int
    deliveries: int
    qlen: int
    blen: int
    count: int
    try:
        (length, job_id, state_gc, flags, repl, etime_s, ctime, delay, retry, nacks,
         deliveries, qlen) = BLOB_HEAD.unpack_from(blob, offset)
        end = offset + 4 + length
        if end > size or length < _FIXED_SIZE + 4:
            raise SerializationError("truncated job blob")
        pos = offset + _HEAD_SIZE
        if pos + qlen + 4 > end:
            raise SerializationError("truncated string in job blob")
        queue = blob[pos:pos + qlen]
        pos += qlen
        # Byte by byte rather than a struct call, which costs ten times more.
        blen = blob[pos] | blob[pos + 1] << 8 | blob[pos + 2] << 16 | blob[pos + 3] << 24
        pos += 4
        if pos + blen + 4 > end:
            raise SerializationError("truncated string in job blob")
        body = blob[pos:pos + blen]
        pos += blen
        count = blob[pos] | blob[pos + 1] << 8 | blob[pos + 2] << 16 | blob[pos + 3] << 24
        pos += 4
        if pos + 40 * count != end:
            raise SerializationError("bad node list in job blob")
        nodes = _node_list(blob[pos:end])
    except (struct.error, UnicodeDecodeError) as err:
        raise SerializationError(str(err)) from None
    if not is_valid_job_id(job_id):
        raise SerializationError("invalid job ID in job blob")
    state = state_gc & 0x0F
    if state > _ACKED:
        raise SerializationError("invalid job state in job blob")
    job = Job(job_id, queue or None, body, _STATES[state], repl, ctime, etime_s * 1000, delay,
              retry, nodes)
    job.gc_retry = state_gc >> 4
    job.flags = flags & SERIALIZED_FLAGS
    job.nacks = nacks
    job.additional_deliveries = deliveries
    return job, end


_STATES: Final = tuple(sorted(JobState))
#: Node sets -> their serialized form (count, then the IDs sorted), the
#: other direction of _NODE_LISTS.
_NODE_BLOBS: Final[dict[frozenset[str], bytes]] = {}


def _node_list_blob(nodes: frozenset[str]) -> bytes:
    last = _LAST_NODES
    if last.nodes is nodes:  # the same shared set as the job before (usual)
        return last.blob
    blob = _NODE_BLOBS.get(nodes)
    if blob is None:
        ordered = sorted(nodes)
        blob = _U32.pack(len(ordered)) + "".join(ordered).encode("ascii")
        if len(_NODE_BLOBS) >= _NODE_LISTS_MAX:
            _NODE_BLOBS.clear()
        _NODE_BLOBS[nodes] = blob
    last.nodes = nodes
    last.blob = blob
    return blob

#: Node lists seen in job blobs -> their frozenset.  A cluster has few
#: distinct lists (every job of REPLICATE 3 on 3 nodes carries the same
#: one), and building the set costs more than the rest of the blob.
_NODE_LISTS: Final[dict[bytes, frozenset[str]]] = {}
_NODE_LISTS_MAX: Final = 4096


def _node_list(raw: bytes) -> frozenset[str]:
    last = _LAST_NODES
    if raw == last.raw:  # the list of the job before (usual): no hashing of raw
        return last.raw_nodes
    nodes = _NODE_LISTS.get(raw)
    if nodes is None:
        text = raw.decode("ascii")
        nodes = frozenset(text[i:i + 40] for i in range(0, len(text), 40))
        if len(_NODE_LISTS) >= _NODE_LISTS_MAX:
            _NODE_LISTS.clear()
        _NODE_LISTS[raw] = nodes
    last.raw = raw
    last.raw_nodes = nodes
    return nodes


class _LastNodeList:
    """The node list serialized last and the one deserialized last, in both
    forms: consecutive jobs nearly always carry the same one."""

    __slots__ = ("blob", "nodes", "raw", "raw_nodes")

    def __init__(self) -> None:
        self.nodes: frozenset[str] = frozenset()
        self.blob = _U32.pack(0)
        self.raw = b""
        self.raw_nodes: frozenset[str] = frozenset()


_LAST_NODES: Final = _LastNodeList()
