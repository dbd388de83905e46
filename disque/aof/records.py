"""The AOF's records: how each one is written (see docs/PERSISTENCE.md).

Every record is a RESP array of bulk strings ending with a checksum element,
the zlib CRC-32 of every byte of the record before it::

    *3\r\n$7\r\nLOADJOB\r\n$<n>\r\n<serialized job>\r\n$8\r\n<crc>\r\n
    *3\r\n$6\r\nDELJOB\r\n$40\r\n<job id>\r\n$8\r\n<crc>\r\n
    *3\r\n$4\r\nMARK\r\n$<n>\r\nshutdown <unix ms>\r\n$8\r\n<crc>\r\n
    *3\r\n$4\r\nIDMP\r\n$<n>\r\n<until ms><job id><digest><qlen><queue><key>\r\n$8\r\n<crc>\r\n
    *3\r\n$6\r\nQLIMIT\r\n$<n>\r\n<max><period ms><queue>\r\n$8\r\n<crc>\r\n

``<serialized job>`` is the original's blob (``job.serialize_job``), with the
job's extension options after it when it has any (``job_options.stored_form``).
An IDMP payload is a little-endian u64 expiry in unix ms, the 40-byte job
ID, the 16-byte body digest, a u32 queue length, the queue name and the key.
A QLIMIT payload (a queue's rate limit, an extension) is a little-endian u32
max jobs (0: the limit was removed), a u32 period in ms and the queue name;
the last one of a queue wins.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from ..idmp import DedupEntry
from ..job import Job, JobState, is_valid_job_id
from ..job_options import JobExt, stored_form

__all__ = ["KIND_LOADJOB", "KIND_DELJOB", "KIND_MARK", "KIND_IDMP", "KIND_QLIMIT", "CRLF",
           "LOADJOB_PREFIX", "CRC_PREFIX", "with_crc", "loadjob_record",
           "dehydrated_ack_record", "snapshot_record", "deljob_record", "mark_record",
           "idmp_record", "decode_idmp", "qlimit_record", "decode_qlimit"]

KIND_LOADJOB: Final = 1
KIND_DELJOB: Final = 2
KIND_MARK: Final = 3
KIND_IDMP: Final = 4
KIND_QLIMIT: Final = 5

CRLF: Final = b"\r\n"
LOADJOB_PREFIX: Final = b"*3\r\n$7\r\nLOADJOB\r\n$"
CRC_PREFIX: Final = b"\r\n$8\r\n"


def with_crc(head: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(CRLF, zlib.crc32(payload, zlib.crc32(head)))
    return b"".join((head, payload, b"\r\n$8\r\n%08x\r\n" % crc))


def loadjob_record(job: Job) -> bytes:
    """``LOADJOB <blob> <crc>`` for ``job`` as it is now."""
    blob = stored_form(job)
    return with_crc(b"*3\r\n$7\r\nLOADJOB\r\n$%d\r\n" % len(blob), blob)


def dehydrated_ack_record(job: Job) -> bytes:
    """``LOADJOB`` of an acked job without its body: an ACK needs no payload."""
    copy = Job(job.id, job.queue, b"", state=JobState.ACKED, repl=job.repl, ctime=job.ctime,
               etime=job.etime, delay=job.delay, retry=job.retry, delivered=job.delivered)
    copy.flags = job.flags
    copy.gc_retry = job.gc_retry
    copy.nacks = job.nacks
    copy.additional_deliveries = job.additional_deliveries
    ext = job.ext
    if ext is not None and ext.headers:  # payload too: the ACK needs none of it
        ext = JobExt(ext.backoff, ext.max_deliveries, ext.dead_letter, ext.dead_from,
                     ext.priority)
    copy.ext = ext
    return loadjob_record(copy)


def snapshot_record(job: Job) -> bytes | None:
    """The record a rewrite writes for ``job`` (None: nothing to keep)."""
    if job.state == JobState.ACKED:
        return dehydrated_ack_record(job)
    if job.state == JobState.WAIT_REPL or job.queue is None:
        return None  # not acknowledged to anybody yet: logged when replication completes
    return loadjob_record(job)


def deljob_record(job_id: bytes) -> bytes:
    return with_crc(b"*3\r\n$6\r\nDELJOB\r\n$40\r\n", job_id)


def mark_record(text: bytes) -> bytes:
    return with_crc(b"*3\r\n$4\r\nMARK\r\n$%d\r\n" % len(text), text)


IDMP_HEAD: Final = struct.Struct("<Q40s16sI")


def idmp_record(entry: DedupEntry) -> bytes:
    """``IDMP <payload> <crc>`` for an IDMP key."""
    payload = b"".join((IDMP_HEAD.pack(entry.until, entry.job_id, entry.digest,
                                        len(entry.queue)), entry.queue, entry.key))
    return with_crc(b"*3\r\n$4\r\nIDMP\r\n$%d\r\n" % len(payload), payload)


QLIMIT_HEAD: Final = struct.Struct("<II")


def qlimit_record(queue: bytes, max_jobs: int, period_ms: int) -> bytes:
    """``QLIMIT <payload> <crc>``: the rate limit of ``queue`` (0 jobs: none)."""
    payload = QLIMIT_HEAD.pack(max_jobs, period_ms) + queue
    return with_crc(b"*3\r\n$6\r\nQLIMIT\r\n$%d\r\n" % len(payload), payload)


def decode_qlimit(payload: bytes) -> tuple[bytes, int, int]:
    """``(queue, max jobs, period ms)`` of a QLIMIT record; ValueError if malformed."""
    try:
        max_jobs, period_ms = QLIMIT_HEAD.unpack_from(payload, 0)
    except struct.error:
        raise ValueError("QLIMIT record too short") from None
    queue = bytes(payload[QLIMIT_HEAD.size:])
    if not queue or (max_jobs and not period_ms):
        raise ValueError("malformed QLIMIT record")
    return queue, max_jobs, period_ms


def decode_idmp(payload: bytes) -> DedupEntry:
    """The entry in an IDMP record's payload; ValueError if malformed."""
    try:
        until, job_id, digest, qlen = IDMP_HEAD.unpack_from(payload, 0)
    except struct.error:
        raise ValueError("IDMP record too short") from None
    start = IDMP_HEAD.size
    key = payload[start + qlen:]
    if not is_valid_job_id(job_id) or len(payload) < start + qlen or not key:
        raise ValueError("malformed IDMP record")
    return DedupEntry(bytes(payload[start:start + qlen]), bytes(key), job_id, digest, until)
