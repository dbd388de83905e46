"""Job options the original's job has no room for: BACKOFF, MAXDELIVERIES,
DEADLETTER, the dead-letter mark, PRIORITY, the headers and the GROUP key.
The policy they drive and their one encoding live here (the headers' rules:
:mod:`disque.headers`; what a group does: :mod:`disque.groups`).

A job without any of them has ``job.ext is None`` and is, everywhere, the
original's job: same blob, same bus messages, same AOF record.

Policy
------
* **Back-off** (``BACKOFF cap``): the delay before the next re-queue grows
  with the re-queues so far, ``k = nacks + additional-deliveries`` (the
  original's counters, which every copy keeps in step through QUEUED's
  INCR flags): ``min(cap, RETRY * 2**k)``.  It replaces RETRY wherever the
  node schedules a re-queue (after a delivery, a postponement, WORKING), and
  a NACK of such a job waits that long instead of re-queueing at once.
* **Delivery limit** (``MAXDELIVERIES n``): a job has been delivered
  ``1 + nacks + additional-deliveries`` times (every queueing is one
  delivery attempt); the re-queue that would make it ``n + 1`` moves it to
  its dead-letter queue instead (:mod:`disque.deadletter`).
* **Priority** (``PRIORITY p``, 0 to 31): the queue hands out higher
  priorities first (``queue_order.JobOrder``); it never changes.
* **Headers** (``HEADER name value``): inert metadata the node carries with
  the job; they never change once the job is stored (its share of
  ``used_memory`` counts them, ``job_table.job_memory``).
* **Group** (``GROUP key``): the job is delivered in add order with the
  other jobs of its queue and key, one consumer at a time
  (:mod:`disque.groups`); the key never changes once the job is stored.

Encoding
--------
One record, little-endian like the job blob::

    "DQX" | u8 version (2, 3 or 4) | u32 length of the rest |
    u32 backoff | u32 max-deliveries |
    u32 len + dead-letter queue ("" = <queue>:dead) |
    u32 len + dead-from queue ("" = not dead-lettered) |
    u8 priority                                  (version 2 on)
    u32 count | count x (u32 len + name | u32 len + value)
                                                 (version 3 on, only with headers or a group)
    u32 len + group key                          (version 4, only with a group;
                                                  a later version writes "" for none)

A reader skips fields it does not know (past the last it knows, up to the
length), so later versions can append fields: a version-1 reader keeps the
job without its priority, a version-2 reader without its headers, a
version-3 reader without its group, and a record without a field reads as
its default (priority 0, no headers, no group).  A job without headers nor
a group is written as version 2, byte for byte as before them; one with
headers and no group as version 3, as before groups; a job with a group
writes the headers' count even when it is 0.

* **AOF**: the record follows the job blob inside ``LOADJOB``'s argument.
* **Bus** (REPLJOB, YOURJOBS): after the ``numjobs`` blobs, inside the
  message's ``datasize``, a trailer ``"DQXT" | u32 count | count x (u32 job
  index | record)``.  The original reads ``numjobs`` blobs and ignores the
  rest of ``datasize`` (checked with the 1.0-rc1 binary: it stores the jobs
  and answers GOTJOB), so a mixed cluster keeps working and an original node
  keeps a plain job.  A new bus message type was not an option: the original
  logs every unknown type at warning level.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final

from .compiled import mypyc_attr
from .job import Job, SerializationError, deserialize_job, serialize_job

__all__ = [
    "JobExt",
    "ExtError",
    "MAX_PRIORITY",
    "DEAD_SUFFIX",
    "encode_record",
    "decode_record",
    "bus_trailer",
    "apply_bus_trailer",
    "group_refusal",
    "retry_seconds",
    "deliveries",
    "limit_reached",
    "dead_letter_queue",
    "stored_form",
    "decode_stored",
]

#: The default dead-letter queue is the job's queue with this suffix.
DEAD_SUFFIX: Final = b":dead"
MAGIC: Final = b"DQX"
VERSION: Final = 2
#: The version of a record with headers.
HEADERS_VERSION: Final = 3
#: The version of a record with a group key.
GROUP_VERSION: Final = 4
TRAILER_MAGIC: Final = b"DQXT"

_HEAD: Final = struct.Struct("<3sBI")
_FIXED: Final = struct.Struct("<II")
_U32: Final = struct.Struct("<I")
#: Priorities run from 0 (the default: the original's order) to this.
MAX_PRIORITY: Final = 31


class ExtError(SerializationError):
    """An extension record that is truncated or inconsistent."""


@mypyc_attr(acyclic=True)
class JobExt:
    """The extension options of one job (``Job.ext``).

    Acyclic, as its job: it holds numbers, bytes and a flag.
    """

    __slots__ = ("backoff", "dead_from", "dead_letter", "group", "headers", "max_deliveries",
                 "nack_pending", "priority")

    def __init__(self, backoff: int = 0, max_deliveries: int = 0, dead_letter: bytes = b"",
                 dead_from: bytes = b"", priority: int = 0,
                 headers: tuple[bytes, ...] = (), group: bytes | None = None) -> None:
        #: Cap of the re-queue delay in seconds; 0: no back-off (RETRY every time).
        self.backoff = backoff
        #: Deliveries after which the job is dead-lettered; 0: no limit.
        self.max_deliveries = max_deliveries
        #: The dead-letter queue; empty: ``<queue>:dead``.
        self.dead_letter = dead_letter
        #: The queue the job was dead-lettered from; empty: not dead-lettered.
        self.dead_from = dead_from
        #: 0 (the original's order) to MAX_PRIORITY: higher ones are handed out first.
        self.priority = priority
        #: The headers, flat: name, value, name, value ... (empty: none).
        #: Never changed once the job is stored: its memory share counts them.
        self.headers = headers
        #: The group key (GROUP, groups.py), or None: not in a group.  Never
        #: changed once the job is stored: its memory share counts it.
        self.group = group
        #: This node's copy waits for a NACK ... DELAY to end: its next
        #: queueing counts as the NACK.  Local: never encoded.
        self.nack_pending = False

    @property
    def travels(self) -> bool:
        """Whether anything here must be encoded (nack_pending is local)."""
        return bool(self.priority or self.headers or self.group is not None
                    or self.has_delivery_options)

    @property
    def has_delivery_options(self) -> bool:
        """BACKOFF, MAXDELIVERIES or DEADLETTER, or a dead-letter move."""
        return bool(self.backoff or self.max_deliveries or self.dead_letter or self.dead_from)

    def moved(self, dead_from: bytes) -> JobExt:
        """These options on a job dead-lettered from ``dead_from``."""
        return JobExt(self.backoff, self.max_deliveries, self.dead_letter, dead_from,
                      self.priority, self.headers, self.group)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, JobExt) and self.backoff == other.backoff
                and self.max_deliveries == other.max_deliveries
                and self.dead_letter == other.dead_letter and self.dead_from == other.dead_from
                and self.priority == other.priority and self.headers == other.headers
                and self.group == other.group)

    def __hash__(self) -> int:
        return hash((self.backoff, self.max_deliveries, self.dead_letter, self.dead_from,
                     self.priority, self.headers, self.group))

    def __repr__(self) -> str:
        return (f"JobExt(backoff={self.backoff}, max_deliveries={self.max_deliveries}, "
                f"dead_letter={self.dead_letter!r}, dead_from={self.dead_from!r}, "
                f"priority={self.priority}, headers={self.headers!r}, group={self.group!r})")


# --------------------------------------------------------------------------
# Policy
# --------------------------------------------------------------------------

def retry_seconds(job: Job) -> int:
    """Seconds until the next re-queue of ``job``: RETRY, or its back-off."""
    ext = job.ext
    retry = job.retry
    if ext is None or not ext.backoff or not retry:
        return retry
    # 2**32 already exceeds any cap (u32 seconds): no bigger shift needed.
    shift = min(job.nacks + job.additional_deliveries, 32)
    return min(ext.backoff, retry << shift)


def deliveries(job: Job) -> int:
    """How many times the job has been queued for delivery, cluster-wide."""
    return 1 + job.nacks + job.additional_deliveries


def limit_reached(job: Job) -> bool:
    """True when a re-queue now would exceed the job's MAXDELIVERIES."""
    ext = job.ext
    return (ext is not None and ext.max_deliveries > 0 and not ext.dead_from
            and deliveries(job) >= ext.max_deliveries)


def dead_letter_queue(job: Job) -> bytes:
    """Where the job goes when dead-lettered."""
    ext = job.ext
    if ext is not None and ext.dead_letter:
        return ext.dead_letter
    return (job.queue or b"") + DEAD_SUFFIX


#: GROUP's errors (what a key may be: non-empty, at most ``max-group-key-len`` bytes).
GROUP_EMPTY: Final = "ERR GROUP key can't be empty"


def group_refusal(key: bytes, max_len: int) -> str | None:
    """Why ``key`` cannot be a group key (an ``-ERR`` text), or None.

    Any bytes: the node only compares keys.  ``max_len`` is the
    ``max-group-key-len`` directive: a job carries its key on every copy,
    in the AOF and in each group's state, so a key is an identifier, not
    data (SQS's MessageGroupId: at most 128 characters).
    """
    if not key:
        return GROUP_EMPTY
    if len(key) > max_len:
        return (f"ERR GROUP key too long: {len(key)} bytes, at most {max_len} "
                "(max-group-key-len)")
    return None


# --------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------

def encode_record(ext: JobExt) -> bytes:
    """One job's extension record (see the module docstring)."""
    parts = [
        _FIXED.pack(ext.backoff & 0xFFFFFFFF, ext.max_deliveries & 0xFFFFFFFF),
        _U32.pack(len(ext.dead_letter)), ext.dead_letter,
        _U32.pack(len(ext.dead_from)), ext.dead_from,
        bytes((ext.priority,)),
    ]
    headers = ext.headers
    group = ext.group
    version = VERSION
    if headers or group is not None:
        version = HEADERS_VERSION
        parts.append(_U32.pack(len(headers) // 2))
        for item in headers:
            parts.append(_U32.pack(len(item)))
            parts.append(item)
        if group is not None:
            version = GROUP_VERSION
            parts.append(_U32.pack(len(group)))
            parts.append(group)
    body = b"".join(parts)
    return _HEAD.pack(MAGIC, version, len(body)) + body


def decode_record(data: bytes | memoryview, offset: int = 0) -> tuple[JobExt, int]:
    """The record at ``offset`` and the offset after it.

    A later version keeps these fields first and appends its own: they are
    skipped (up to the record's length).
    """
    view = memoryview(data)
    try:
        magic, version, length = _HEAD.unpack_from(view, offset)
        pos = offset + _HEAD.size
        end = pos + length
        if magic != MAGIC or end > len(view) or version < 1:
            raise ExtError("not a job extension record")
        backoff, max_deliveries = _FIXED.unpack_from(view, pos)
        pos += _FIXED.size
        dead_letter, pos = _string(view, pos, end)
        dead_from, pos = _string(view, pos, end)
    except struct.error:
        raise ExtError("truncated job extension record") from None
    priority = 0
    headers: tuple[bytes, ...] = ()
    group: bytes | None = None
    if pos < end:  # version 2 on
        priority = view[pos]
        if priority > MAX_PRIORITY:
            raise ExtError(f"job priority {priority} out of range")
        pos += 1
        if pos < end:  # version 3 on
            headers, pos = _headers(view, pos, end)
            if pos < end:  # version 4 on (empty: no group, for later versions' sake)
                key, pos = _string(view, pos, end)
                group = key or None
    return (JobExt(backoff, max_deliveries, dead_letter, dead_from, priority, headers, group),
            end)


def _headers(view: memoryview, pos: int, end: int) -> tuple[tuple[bytes, ...], int]:
    """The headers field (version 3): ``u32 count``, then the names and
    values; and the offset after it."""
    if pos + 4 > end:
        raise ExtError("truncated headers in job extension record")
    (count,) = _U32.unpack_from(view, pos)
    pos += 4
    if count * 8 > end - pos:  # each header takes two lengths at least
        raise ExtError("truncated headers in job extension record")
    items: list[bytes] = []
    for _ in range(2 * count):
        item, pos = _string(view, pos, end)
        items.append(item)
    return tuple(items), pos


def _string(view: memoryview, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 4 > end:
        raise ExtError("truncated string in job extension record")
    (size,) = _U32.unpack_from(view, pos)
    pos += 4
    if pos + size > end:
        raise ExtError("truncated string in job extension record")
    return bytes(view[pos:pos + size]), pos + size


def stored_form(job: Job) -> bytes:
    """The job as the AOF stores it: the original's blob, then its
    extension record if it has one."""
    blob = serialize_job(job)
    ext = job.ext
    if ext is not None and ext.travels:
        return blob + encode_record(ext)
    return blob


def decode_stored(data: bytes) -> Job:
    """The other direction of :func:`stored_form`; raises SerializationError."""
    job, end = deserialize_job(data)
    if end < len(data):
        job.ext, end = decode_record(data, end)
        if end != len(data):
            raise SerializationError("trailing bytes after the job")
    return job


def bus_trailer(jobs: Sequence[Job]) -> bytes:
    """The trailer of a REPLJOB/YOURJOBS carrying ``jobs`` (empty if none has options)."""
    entries = [_U32.pack(i) + encode_record(job.ext)
               for i, job in enumerate(jobs) if job.ext is not None and job.ext.travels]
    if not entries:
        return b""
    return TRAILER_MAGIC + _U32.pack(len(entries)) + b"".join(entries)


def apply_bus_trailer(jobs: Sequence[Job], payload: bytes | memoryview, offset: int) -> None:
    """Give ``jobs`` (the message's jobs in order) the options its trailer at
    ``offset`` carries.  Bytes that are not our trailer are ignored (another
    implementation may put something else there); a damaged trailer raises
    :class:`ExtError` and leaves the jobs as they are."""
    view = memoryview(payload)
    if bytes(view[offset:offset + 4]) != TRAILER_MAGIC:
        return
    try:
        (count,) = _U32.unpack_from(view, offset + 4)
    except struct.error:
        raise ExtError("truncated job extension trailer") from None
    pos = offset + 8
    found: list[tuple[int, JobExt]] = []
    for _ in range(count):
        try:
            (index,) = _U32.unpack_from(view, pos)
        except struct.error:
            raise ExtError("truncated job extension trailer") from None
        ext, pos = decode_record(view, pos + 4)
        if index >= len(jobs):
            raise ExtError("job extension for a job the message does not carry")
        found.append((index, ext))
    for index, ext in found:
        jobs[index].ext = ext
