"""The append-only file (AOF): logging jobs, reloading them, compacting the log.

File format
-----------
Like the original, the file is a list of commands replayed at start-up, each
a RESP array of bulk strings.  Two kinds of records matter::

    *3\\r\\n$7\\r\\nLOADJOB\\r\\n$<n>\\r\\n<serialized job>\\r\\n$8\\r\\n<crc>\\r\\n
    *3\\r\\n$6\\r\\nDELJOB\\r\\n$40\\r\\n<job id>\\r\\n$8\\r\\n<crc>\\r\\n

``<serialized job>`` is the original's little-endian blob
(:func:`disque.job.serialize_job`, the original's ``serializeJob``).  ``<crc>`` is 8 lowercase
hex digits: the zlib CRC-32 of every byte of the record before the ``$8`` of
the checksum element.  The checksum is this implementation's addition: it is
what lets the loader tell a torn last write (crash) from a corrupted file,
and lets ``disque-check-aof --fix`` skip a damaged record and resynchronise
on the next good one.  A third record kind marks a clean snapshot::

    *3\\r\\n$4\\r\\nMARK\\r\\n$<n>\\r\\nshutdown <unix ms>\\r\\n$8\\r\\n<crc>\\r\\n

written last by ``SHUTDOWN REWRITE-AOF``.  A fourth kind holds an IDMP key of
an idempotent ADDJOB (an extension, ``dedup.py``)::

    *3\r\n$4\r\nIDMP\r\n$<n>\r\n<until ms><job id><digest><qlen><queue><key>\r\n$8\r\n<crc>\r\n

(little-endian u64 expiry in unix ms, the 40-byte job ID, the 16-byte body
digest, a u32 queue length, then the queue name and the key), written when
the key is settled (after the job's LOADJOB) and by rewrites for every live
key; the loader keeps the keys whose window has not ended.  The original's records (``*2
LOADJOB <blob>``, ``DELJOB <id> [<id>...]``, no checksum) load too, so an AOF
written by the C server can be used to move a node to this implementation.
(The C server cannot read our files: it refuses the checksum argument.)

What is logged
--------------
* ``LOADJOB`` when this node first stores a job (``job_created_hooks``:
  ADDJOB, and replication once the cluster layer calls the hook);
* an ACK as a ``LOADJOB`` of the job in the ``acked`` state *without its
  body* (a "dehydrated" record: an ACK only needs the ID, the TTL and the
  node lists) — unless the job is garbage-collected before the records are
  written, which on a single node is always the case: then only the
  ``DELJOB`` is written;
* ``DELJOB`` when a job goes away (ack GC, DELJOB, FASTACK, expiry,
  eviction);
* a ``LOADJOB`` of the job again when it is dead-lettered to another queue
  (``job_moved_hooks``; the job's extension options, if any, follow its
  blob inside the argument: :mod:`disque.jobext`).

Deliveries, NACKs and requeues are not logged (as in the original); a
rewrite captures them.

Replay is idempotent: the loader builds a table ``id -> job`` where a later
``LOADJOB`` of an ID replaces the earlier one and ``DELJOB`` of an unknown ID
is ignored.  The table is applied to the node only at the end.  This is what
makes the incremental rewrite below correct.

Loading (spec "Disque and disk persistence")
--------------------------------------------
With ``appendonly yes`` or ``aof-enqueue-jobs-once yes``, at start-up and
before listening.  Expired jobs are skipped.  Jobs come back in memory but
are **not** queued: a job that was queued or active is active again and is
requeued by its retry timer at ``now + DELAY + RETRY ± 250 ms``; RETRY-0 jobs
get no queue time at all, so a reload never queues them.  A job whose record
does not say it was ever delivered is requeued silently (the original counted
that requeue as an additional delivery).

With ``aof-enqueue-jobs-once yes`` queued jobs are queued again, counters
untouched, delayed jobs that were never queued are queued when their delay
ends, and delivered ones wait RETRY like after a delivery.  The option then
switches itself off (``CONFIG REWRITE`` persists that when there is a config
file).  Because restoring queues is only safe from a file written while no
client could act (``SHUTDOWN REWRITE-AOF``), the option is ignored, with a
warning, for a file of ours whose last record is not the shutdown mark: a
crash after ``CONFIG SET aof-enqueue-jobs-once yes`` cannot requeue a
delivered RETRY-0 job.

Damage: a last record that is incomplete or fails its checksum, with no
valid record after it, is a torn write: the node starts with everything
before it, logs what it dropped and truncates the file there
(``aof-load-truncated no`` refuses instead).  Damage followed by valid
records is corruption: the node refuses to start and names the byte offset;
``disque-check-aof --fix`` repairs the file.

Writing and fsync
-----------------
Records are appended to an in-memory buffer by the hooks.  After every
command flagged ``write`` the buffer is written (``write(2)``, no fsync) by
``commands.registry.execute``; if that fails the command answers ``-MISCONF``
and later write commands are refused until a write succeeds.  So a client is
never told about a job (or an ACK) whose record is not at least in the
kernel: a process crash loses nothing that was acknowledged, whatever the
fsync policy.  Records made outside commands (expiry, GC) are written before
the next reply or by the cron.

* ``appendfsync always``: ``fdatasync`` in the ``before_reply`` hook, once per
  batch of replies, so no reply leaves before its records are on disk;
* ``everysec``: a background thread runs ``fdatasync`` at most once a second;
  the event loop never waits for it;
* ``no``: the kernel decides.

Rewrite (BGREWRITEAOF, automatic, CONFIG SET appendonly yes)
------------------------------------------------------------
An incremental snapshot, made in the event loop in steps of at most
:data:`REWRITE_STEP_BUDGET_S` (one loop turn each, so clients are served
between steps): each step serializes the jobs of the next slices of the job
registry (``state.jobs.scan``) as ``LOADJOB`` records of their *current*
state (acked ones dehydrated) and appends them to a temporary file.  Every
record logged while the rewrite runs is appended to the same file too, in
the order it happened, so the file is chronological: a job's snapshot record
is followed by whatever happened to it later, and the last-wins replay yields
the current state (a job deleted before its slice is visited is simply not
in the snapshot; ``scan`` returns whole slices, and a job is only written if
it is still registered).  When the scan ends the background thread fsyncs
the file, the records that arrived meanwhile are appended, the file is
renamed over the AOF, and the old file is closed in the background thread
(closing it may free a large file).  No fork: a fork of a process holding a
million Python objects copies nearly all its memory, reference counts being
written on every access.  The longest step is reported in INFO as
``aof_last_rewrite_max_step_ms``.

``SHUTDOWN REWRITE-AOF`` writes the same snapshot synchronously (nothing else
runs then), fsyncs it and ends it with the shutdown mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import mmap
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .dedup import DedupEntry
from .job import (
    FLAG_BCAST_QUEUED,
    FLAG_BCAST_WILLQUEUE,
    FLAG_DELIVERED,
    SERIALIZED_FLAGS,
    Job,
    JobState,
    SerializationError,
    is_valid_job_id,
)
from .jobext import decode_stored, stored_form
from .protocol import ReplyError

if TYPE_CHECKING:
    from .state import ServerState

__all__ = [
    "AppendOnlyFile",
    "AofCorruptError",
    "AofReader",
    "Damage",
    "setup_persistence",
    "loadjob_record",
    "deljob_record",
    "mark_record",
    "REWRITE_STEP_BUDGET_S",
]

log = logging.getLogger("disque.aof")

#: Longest time one rewrite step may run in the event loop.
REWRITE_STEP_BUDGET_S = 0.002
#: A step writes at most about this much.
REWRITE_CHUNK = 1024 * 1024
#: After a failed automatic rewrite, wait this long before trying again.
REWRITE_RETRY_S = 10.0
#: everysec: seconds between two background fsyncs.
FSYNC_PERIOD_S = 1.0

KIND_LOADJOB = 1
KIND_DELJOB = 2
KIND_MARK = 3
KIND_IDMP = 4

CRLF = b"\r\n"
_LOADJOB_PREFIX = b"*3\r\n$7\r\nLOADJOB\r\n$"
_CRC_PREFIX = b"\r\n$8\r\n"
_DIGITS = frozenset(b"0123456789")
_HEXDIGITS = frozenset(b"0123456789abcdef")


# --------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------

def _with_crc(head: bytes, payload: bytes) -> bytes:
    crc = zlib.crc32(CRLF, zlib.crc32(payload, zlib.crc32(head)))
    return b"".join((head, payload, b"\r\n$8\r\n%08x\r\n" % crc))


def loadjob_record(job: Job) -> bytes:
    """``LOADJOB <blob> <crc>`` for ``job`` as it is now."""
    blob = stored_form(job)
    return _with_crc(b"*3\r\n$7\r\nLOADJOB\r\n$%d\r\n" % len(blob), blob)


def dehydrated_ack_record(job: Job) -> bytes:
    """``LOADJOB`` of an acked job without its body: an ACK needs no payload."""
    copy = Job(job.id, job.queue, b"", state=JobState.ACKED, repl=job.repl, ctime=job.ctime,
               etime=job.etime, delay=job.delay, retry=job.retry, delivered=job.delivered)
    copy.flags = job.flags
    copy.gc_retry = job.gc_retry
    copy.nacks = job.nacks
    copy.additional_deliveries = job.additional_deliveries
    copy.ext = job.ext
    return loadjob_record(copy)


def snapshot_record(job: Job) -> bytes | None:
    """The record a rewrite writes for ``job`` (None: nothing to keep)."""
    if job.state == JobState.ACKED:
        return dehydrated_ack_record(job)
    if job.state == JobState.WAIT_REPL or job.queue is None:
        return None  # not acknowledged to anybody yet: logged when replication completes
    return loadjob_record(job)


def deljob_record(job_id: bytes) -> bytes:
    return _with_crc(b"*3\r\n$6\r\nDELJOB\r\n$40\r\n", job_id)


def mark_record(text: bytes) -> bytes:
    return _with_crc(b"*3\r\n$4\r\nMARK\r\n$%d\r\n" % len(text), text)


_IDMP_HEAD = struct.Struct("<Q40s16sI")


def idmp_record(entry: DedupEntry) -> bytes:
    """``IDMP <payload> <crc>`` for an IDMP key (see the module docstring)."""
    payload = b"".join((_IDMP_HEAD.pack(entry.until, entry.job_id, entry.digest,
                                        len(entry.queue)), entry.queue, entry.key))
    return _with_crc(b"*3\r\n$4\r\nIDMP\r\n$%d\r\n" % len(payload), payload)


def decode_idmp(payload: bytes) -> DedupEntry:
    """The entry in an IDMP record's payload; ValueError if malformed."""
    try:
        until, job_id, digest, qlen = _IDMP_HEAD.unpack_from(payload, 0)
    except struct.error:
        raise ValueError("IDMP record too short") from None
    start = _IDMP_HEAD.size
    key = payload[start + qlen:]
    if not is_valid_job_id(job_id) or len(payload) < start + qlen or not key:
        raise ValueError("malformed IDMP record")
    return DedupEntry(bytes(payload[start:start + qlen]), bytes(key), job_id, digest, until)


# --------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------

class _Incomplete(Exception):
    """The record runs past the end of the data."""


class _Bad(Exception):
    """The record is malformed here."""


@dataclass
class Record:
    kind: int
    offset: int          # first byte of the record
    end: int             # first byte after it
    args: list[bytes]    # LOADJOB: [blob]; DELJOB: job IDs; MARK: [text]
    checked: bool        # carried a valid checksum


@dataclass
class Damage:
    offset: int          # first unreadable byte
    end: int             # where valid records resume (the file size for a tail)
    reason: str
    tail: bool           # nothing valid after it: a torn last write


def _number(raw: bytes) -> int:
    if not raw or not _DIGITS.issuperset(raw) or len(raw) > 12:
        raise _Bad(f"invalid length {raw[:16]!r}")
    return int(raw)


class AofReader:
    """Parse records out of a buffer (bytes or an mmap of the file)."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.size = len(buf)

    def parse_at(self, pos: int) -> Record:
        """The record starting at ``pos``; raises ``_Incomplete`` or ``_Bad``."""
        buf, n = self.buf, self.size
        if buf[pos:pos + 18] == _LOADJOB_PREFIX:
            # Fast path: our own LOADJOB record in its canonical form.
            nl = buf.find(CRLF, pos + 18, pos + 30)
            if nl > 0:
                raw = buf[pos + 18:nl]
                if raw.isdigit():
                    start = nl + 2
                    end = start + int(raw)
                    if end + 16 <= n and buf[end:end + 6] == _CRC_PREFIX \
                            and buf[end + 14:end + 16] == CRLF:
                        crc_text = buf[end + 6:end + 14]
                        if _HEXDIGITS.issuperset(crc_text):
                            if zlib.crc32(buf[pos:end + 2]) != int(crc_text, 16):
                                raise _Bad("checksum mismatch")
                            return Record(KIND_LOADJOB, pos, end + 16, [buf[start:end]], True)
        if buf[pos] != 0x2A:  # '*'
            raise _Bad(f"expected '*' but found {bytes([buf[pos]])!r}")
        nl = buf.find(CRLF, pos + 1, pos + 12)
        if nl < 0:
            if n - pos < 12:
                raise _Incomplete
            raise _Bad("bad array header")
        argc = _number(buf[pos + 1:nl])
        if argc < 2:
            raise _Bad(f"a record needs at least 2 elements, not {argc}")
        p = nl + 2
        elems: list[tuple[int, int, int]] = []
        for _ in range(argc):
            if p >= n:
                raise _Incomplete
            if buf[p] != 0x24:  # '$'
                raise _Bad(f"expected '$' at offset {p} but found {bytes([buf[p]])!r}")
            nl = buf.find(CRLF, p + 1, p + 15)
            if nl < 0:
                if n - p < 15:
                    raise _Incomplete
                raise _Bad(f"bad bulk length at offset {p}")
            size = _number(buf[p + 1:nl])
            start = nl + 2
            end = start + size
            if end + 2 > n:
                raise _Incomplete
            if buf[end:end + 2] != CRLF:
                raise _Bad(f"bulk string at offset {p} not terminated by CRLF")
            elems.append((p, start, end))
            p = end + 2
        verb = buf[elems[0][1]:elems[0][2]].upper()
        checked = False
        last_p, last_s, last_e = elems[-1]
        if (argc == 3 and last_e - last_s == 8
                and verb in (b"LOADJOB", b"DELJOB", b"MARK", b"IDMP")
                and (verb != b"DELJOB" or elems[1][2] - elems[1][1] != 8)):
            crc_text = buf[last_s:last_e]
            if not _HEXDIGITS.issuperset(crc_text):
                raise _Bad("invalid checksum field")
            if zlib.crc32(buf[pos:last_p]) != int(crc_text, 16):
                raise _Bad("checksum mismatch")
            elems.pop()
            checked = True
        args = [buf[s:e] for _, s, e in elems[1:]]
        if verb == b"LOADJOB":
            if len(args) != 1:
                raise _Bad("LOADJOB takes one argument")
            return Record(KIND_LOADJOB, pos, p, args, checked)
        if verb == b"DELJOB":
            for job_id in args:
                if not is_valid_job_id(job_id):
                    raise _Bad("DELJOB with an invalid job ID")
            return Record(KIND_DELJOB, pos, p, args, checked)
        if verb == b"MARK" and checked:
            return Record(KIND_MARK, pos, p, args, checked)
        if verb == b"IDMP" and checked:
            return Record(KIND_IDMP, pos, p, args, checked)
        raise _Bad(f"unknown command {verb[:32].decode('latin-1')!r}")

    def valid_at(self, pos: int) -> Record | None:
        """A record at ``pos`` trustworthy enough to resynchronise on."""
        try:
            rec = self.parse_at(pos)
        except (_Incomplete, _Bad):
            return None
        if not rec.checked and rec.kind == KIND_LOADJOB:
            # A record of the original's format has no checksum: require
            # that it also makes sense.
            try:
                decode_stored(rec.args[0])
            except SerializationError:
                return None
        return rec

    _SYNC_PATTERNS = (b"\r\n$7\r\nLOADJOB\r\n", b"\r\n$6\r\nDELJOB\r\n", b"\r\n$4\r\nMARK\r\n",
                      b"\r\n$4\r\nIDMP\r\n",
                      b"\r\n$7\r\nloadjob\r\n", b"\r\n$6\r\ndeljob\r\n")

    def find_next_valid(self, start: int) -> int | None:
        """Offset of the first valid record starting after ``start``."""
        buf = self.buf
        positions = {}
        for pattern in self._SYNC_PATTERNS:
            positions[pattern] = buf.find(pattern, start)
        while True:
            live = [(p, pat) for pat, p in positions.items() if p >= 0]
            if not live:
                return None
            found, pattern = min(live)
            candidate = found - 2  # "*N" precedes the CRLF
            if candidate > start and self.valid_at(candidate) is not None:
                return candidate
            positions[pattern] = buf.find(pattern, found + 1)

    def scan(self, start: int = 0) -> Iterator[Record | Damage]:
        """Every record, and a :class:`Damage` for each unreadable region."""
        pos, n = start, self.size
        while pos < n:
            try:
                rec = self.parse_at(pos)
            except (_Incomplete, _Bad) as err:
                if isinstance(err, _Incomplete):
                    reason = "incomplete record (the file ends in the middle of it)"
                else:
                    reason = str(err)
                nxt = self.find_next_valid(pos)
                if nxt is None:
                    if not any(self.buf[pos:n]):
                        reason = f"{n - pos} zero bytes (a write that never completed)"
                    yield Damage(pos, n, reason, True)
                    return
                yield Damage(pos, nxt, reason, False)
                pos = nxt
                continue
            yield rec
            pos = rec.end

    def describe(self, damage: Damage) -> str:
        """What the damaged bytes seem to hold, for the log."""
        chunk = bytes(self.buf[damage.offset:min(damage.end, damage.offset + 256)])
        for verb in (b"LOADJOB", b"DELJOB"):
            at = chunk.find(verb)
            if at >= 0:
                job_at = chunk.find(b"D-", at)
                job_id = chunk[job_at:job_at + 40] if job_at >= 0 else b""
                if is_valid_job_id(job_id):
                    return f"a {verb.decode()} record for job {job_id.decode()}"
                return f"a {verb.decode()} record"
        return "unrecognised bytes"


_BLOB_HEAD = struct.Struct("<I40sBBHIQIIHHI")
_U32 = struct.Struct("<I")


class BlobDecoder:
    """``deserialize_job`` specialised for loading many jobs.

    Same format and checks (``tests/persistence`` compares the two); it
    shares one frozenset per node list and one bytes object per queue name,
    which also saves memory with a million jobs.  Anything unusual goes
    through :func:`disque.job.deserialize_job` for its exact error.
    """

    def __init__(self) -> None:
        self._nodes: dict[bytes, frozenset[str]] = {}
        self._queues: dict[bytes, bytes] = {}

    _STATES = (JobState.WAIT_REPL, JobState.ACTIVE, JobState.QUEUED, JobState.ACKED)

    def decode(self, blob: bytes, checked: bool = False) -> Job:
        """The job in ``blob``; ``checked``: the record's checksum was valid."""
        size = len(blob)
        try:
            (length, job_id, state_gc, flags, repl, etime_s, ctime, delay, retry, nacks,
             deliveries, qlen) = _BLOB_HEAD.unpack_from(blob, 0)
            p = 76 + qlen
            (blen,) = _U32.unpack_from(blob, p)
            body = blob[p + 4:p + 4 + blen]
            p += 4 + blen
            (count,) = _U32.unpack_from(blob, p)
            p += 4
        except struct.error:
            return self._slow(blob)
        state = state_gc & 0x0F
        if (length + 4 != size or p + 40 * count != size or state > 3 or len(body) != blen
                or not (checked or is_valid_job_id(job_id))):
            return self._slow(blob)
        raw_nodes = blob[p:size]
        nodes = self._nodes.get(raw_nodes)
        if nodes is None:
            try:
                nodes = frozenset(raw_nodes[i:i + 40].decode("ascii")
                                  for i in range(0, len(raw_nodes), 40))
            except UnicodeDecodeError:
                return self._slow(blob)
            self._nodes[raw_nodes] = nodes
        queue: bytes | None = None
        if qlen:
            raw_queue = blob[76:76 + qlen]
            queue = self._queues.setdefault(raw_queue, raw_queue)
        job = Job(job_id, queue, body, state=self._STATES[state], repl=repl, ctime=ctime,
                  etime=etime_s * 1000, delay=delay, retry=retry, delivered=nodes)
        job.gc_retry = state_gc >> 4
        job.flags = flags & SERIALIZED_FLAGS
        job.nacks = nacks
        job.additional_deliveries = deliveries
        return job

    @staticmethod
    def _slow(blob: bytes) -> Job:
        # Also the way for jobs with extension options (after the blob).
        return decode_stored(blob)


class AofCorruptError(Exception):
    """The AOF cannot be loaded; the message says where and what to do."""


@dataclass
class LoadResult:
    jobs: dict[bytes, Job] = field(default_factory=dict)
    records: int = 0
    loadjobs: int = 0
    deljobs: int = 0
    valid_size: int = 0          # bytes of good records (truncate the file here)
    damage: Damage | None = None
    damage_description: str = ""
    clean_shutdown: bool = False
    legacy_only: bool = True     # only records of the original's format
    idmp: dict[tuple[bytes, bytes], DedupEntry] = field(default_factory=dict)


def read_aof(path: str, load_truncated: bool = True) -> LoadResult:
    """Replay ``path`` into a job table (nothing is applied to a node)."""
    result = LoadResult()
    size = os.path.getsize(path)
    if size == 0:
        return result
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        _replay(AofReader(mm), result, path, load_truncated)
    finally:
        mm.close()
    return result


def _replay(reader: AofReader, result: LoadResult, path: str, load_truncated: bool) -> None:
    jobs = result.jobs
    decode = BlobDecoder().decode
    last_kind = 0
    for item in reader.scan():
        if isinstance(item, Damage):
            description = reader.describe(item)
            if not item.tail:
                raise AofCorruptError(
                    f"Bad file format reading the append only file {path!r} at byte offset "
                    f"{item.offset}: {item.reason} ({item.end - item.offset} unreadable bytes "
                    f"before valid records resume at offset {item.end}). Make a backup of the "
                    f"file, then run 'disque-check-aof --fix {path}'")
            if not load_truncated:
                raise AofCorruptError(
                    f"Unexpected end of the append only file {path!r} at byte offset "
                    f"{item.offset}: {item.reason}. aof-load-truncated is no: run "
                    f"'disque-check-aof --fix {path}', or set aof-load-truncated yes")
            result.damage = item
            result.damage_description = description
            break
        result.records += 1
        result.valid_size = item.end
        if item.checked:
            result.legacy_only = False
        if item.kind == KIND_LOADJOB:
            try:
                job = decode(item.args[0], item.checked)
            except SerializationError as err:
                raise AofCorruptError(
                    f"Bad job in the append only file {path!r} at byte offset {item.offset}: "
                    f"{err}. Run 'disque-check-aof {path}'") from None
            jobs[job.id] = job
            result.loadjobs += 1
        elif item.kind == KIND_DELJOB:
            for job_id in item.args:
                jobs.pop(job_id, None)
            result.deljobs += 1
        elif item.kind == KIND_IDMP:
            try:
                entry = decode_idmp(item.args[0])
            except ValueError as err:
                raise AofCorruptError(
                    f"Bad IDMP key in the append only file {path!r} at byte offset "
                    f"{item.offset}: {err}. Run 'disque-check-aof {path}'") from None
            result.idmp[(entry.queue, entry.key)] = entry  # the last record wins
        last_kind = item.kind if item.kind != KIND_MARK else (
            KIND_MARK if item.args[0].startswith(b"shutdown") else last_kind)
    result.clean_shutdown = last_kind == KIND_MARK and result.damage is None


# --------------------------------------------------------------------------
# Background I/O
# --------------------------------------------------------------------------

class BackgroundIO:
    """One thread for the slow file operations: fsync, closing replaced files.

    Jobs run in submission order, so an fsync of a descriptor always runs
    before its close.
    """

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.submitted = 0   # written by the loop thread only
        self.done = 0        # written by the I/O thread only

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="aof-bio", daemon=True)
            self._thread.start()
        self.submitted += 1
        self._queue.put((fn, args))

    @property
    def busy(self) -> bool:
        return self.submitted != self.done

    def _run(self) -> None:
        while True:
            fn, args = self._queue.get()
            if fn is None:
                self.done += 1
                return
            try:
                fn(*args)
            except Exception:  # pragma: no cover - logged, the thread goes on
                log.exception("Error in background AOF job")
            self.done += 1

    def drain(self, timeout: float = 30.0) -> None:
        if self._thread is None:
            return
        finished = threading.Event()
        self.submit(finished.set)
        finished.wait(timeout)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --------------------------------------------------------------------------
# The incremental rewrite
# --------------------------------------------------------------------------

class Rewrite:
    """One background rewrite: the snapshot, made in slices of the event loop.

    Snapshot chunks and the records logged meanwhile are written to the
    temporary file from the event loop (a step writes at most what it
    serialized in :data:`REWRITE_STEP_BUDGET_S`, to the page cache); only
    the final fsync runs in the background thread.  (A writer thread was
    tried first: with the interpreter's 5 ms GIL switch interval it made
    some steps last 10 ms.)
    """

    def __init__(self, aof: AppendOnlyFile, target: str) -> None:
        self.aof = aof
        self.target = target
        directory = os.path.dirname(target) or "."
        self.tmp_path = os.path.join(directory, f"temp-rewriteaof-bg-{os.getpid()}.aof")
        self.fd = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.started = time.monotonic()
        self.cursor = 0
        self.scan_done = False
        self.batch: list[Job] = []
        self.batch_pos = 0
        # The IDMP keys, written after the jobs (None: not started yet).
        self.keys: list[DedupEntry] | None = None
        self.keys_pos = 0
        self.jobs_written = 0
        self.max_step = 0.0
        self.steps = 0
        self.error: str | None = None
        self.aborted = False
        self.finishing = False
        self.bytes_written = 0
        self.synced_bytes = 0
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.Handle | None = self._loop.call_soon(self.step)

    def write(self, data: bytes) -> None:
        """Append to the temporary file (event loop only)."""
        if self.error is not None or self.aborted:
            return
        try:
            view = memoryview(data)
            while view:
                written = os.write(self.fd, view)
                view = view[written:]
                self.bytes_written += written
        except OSError as err:
            self.error = err.strerror or str(err)
            self._loop.call_soon(self.aof._rewrite_failed, self)

    def _fsync(self, size: int) -> None:
        # Runs in the background thread.
        try:
            os.fsync(self.fd)
        except OSError as err:
            self.error = err.strerror or str(err)
        else:
            self.synced_bytes = size
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.aof._rewrite_fsynced, self)

    def request_fsync(self) -> None:
        self.aof.bio.submit(self._fsync, self.bytes_written)

    def step(self) -> None:
        self._handle = None
        if self.aborted or self.finishing:
            return
        if self.error is not None:
            self.aof._rewrite_failed(self)
            return
        aof = self.aof
        aof._forward_to_rewrite()
        t0 = time.perf_counter()
        deadline = t0 + REWRITE_STEP_BUDGET_S
        registry = aof.state.jobs
        out: list[bytes] = []
        out_bytes = 0
        while out_bytes < REWRITE_CHUNK:
            if self.batch_pos >= len(self.batch):
                if self.scan_done:
                    break
                self.cursor, self.batch = registry.scan(self.cursor, 1)
                self.batch_pos = 0
                if self.cursor == 0:
                    self.scan_done = True
                continue
            end = min(self.batch_pos + 32, len(self.batch))
            for job in self.batch[self.batch_pos:end]:
                # A job deleted since the scan must not come back.
                if registry.get(job.id) is job:
                    rec = snapshot_record(job)
                    if rec is not None:
                        out.append(rec)
                        out_bytes += len(rec)
                        self.jobs_written += 1
            self.batch_pos = end
            if time.perf_counter() > deadline:
                break
        if self.scan_done and self.batch_pos >= len(self.batch) and out_bytes < REWRITE_CHUNK \
                and time.perf_counter() <= deadline:
            out_bytes += self._snapshot_keys(out, deadline)
        if out:
            self.write(b"".join(out))
        self.steps += 1
        elapsed = time.perf_counter() - t0
        if elapsed > self.max_step:
            self.max_step = elapsed
        if self.error is not None:
            return  # _rewrite_failed is scheduled
        if (self.scan_done and self.batch_pos >= len(self.batch) and self.keys is not None
                and self.keys_pos >= len(self.keys)):
            self.batch = []
            self.keys = []
            self.finishing = True
            aof._forward_to_rewrite()
            self.request_fsync()
        else:
            self._handle = self._loop.call_soon(self.step)

    def _snapshot_keys(self, out: list[bytes], deadline: float) -> int:
        """Append the records of the next live IDMP keys to ``out``; their size."""
        dedup = self.aof.state.dedup
        if self.keys is None:
            self.keys = list(dedup.entries())
        keys = self.keys
        written = 0
        while self.keys_pos < len(keys) and written < REWRITE_CHUNK:
            end = min(self.keys_pos + 256, len(keys))
            for entry in keys[self.keys_pos:end]:
                # Replaced, expired or pending ones are not written: a pending
                # key is logged when its ADDJOB answers (if the job was added).
                if dedup.is_current(entry) and not entry.pending:
                    rec = idmp_record(entry)
                    out.append(rec)
                    written += len(rec)
            self.keys_pos = end
            if time.perf_counter() > deadline:
                break
        return written

    def abort(self) -> None:
        self.aborted = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        # The background thread may be fsyncing it: close it there, after.
        self.aof.bio.submit(_close_quietly, self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.tmp_path)


# --------------------------------------------------------------------------
# The AOF
# --------------------------------------------------------------------------

OFF = "off"
ON = "on"
WAIT_REWRITE = "wait_rewrite"


class AppendOnlyFile:
    """The node's AOF: hooks, buffer, fsync policy, rewrites, INFO fields."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.config = state.config
        self._status = OFF
        self._rewrite: Rewrite | None = None
        self._job_hooks_on = False
        self.path = os.path.abspath(self.config.appendfilename)
        self.fd: int | None = None
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self._forwarded = 0            # pending[:_forwarded] already given to the rewrite
        self._acked: list[Job] = []    # ACKs whose record is decided when written
        self.size = 0
        self.base_size = 0
        self.write_error: str | None = None
        self.fsync_error: str | None = None
        self._last_error_log = 0.0
        self._unsynced_since: float | None = None   # oldest write not fsynced yet
        self._last_fsync = time.monotonic()
        self.fsync_max_lag = 0.0
        self.delayed_fsyncs = 0
        self.bio = BackgroundIO()
        self.rewrite_scheduled = False
        self.last_rewrite_time = -1
        self.last_rewrite_max_step = 0.0
        self.last_rewrite_jobs = 0
        self.last_bgrewrite_status = "ok"
        self.rewrites = 0
        self._rewrite_failed_at = 0.0
        self.loading = False
        self.write_each_command = True
        state.before_reply_hooks.append(self.before_reply)
        self.config.on_change("appendonly", self._set_appendonly)
        self.config.on_change("appendfsync", self._set_appendfsync)

    # -- hooks ----------------------------------------------------------------

    @property
    def status(self) -> str:
        return self._status

    @status.setter
    def status(self, value: str) -> None:
        self._status = value
        self._sync_job_hooks()

    @property
    def rewrite(self) -> Rewrite | None:
        return self._rewrite

    @rewrite.setter
    def rewrite(self, value: Rewrite | None) -> None:
        self._rewrite = value
        self._sync_job_hooks()

    @property
    def logging(self) -> bool:
        return self._status != OFF or self._rewrite is not None

    def _sync_job_hooks(self) -> None:
        """The job hooks are in the state's lists only while something is
        logged: this module is interpreted, and a hook called for every
        stored job only to find the AOF off cost each ADDJOB (and each copy
        a peer stores) ~750 instructions."""
        on = self.logging
        if on == self._job_hooks_on:
            return
        self._job_hooks_on = on
        state = self.state
        hooks: list[tuple[list[Any], Any]] = [
            (state.job_created_hooks, self._on_created),
            (state.job_acked_hooks, self._on_acked),
            # A later LOADJOB replaces the earlier.
            (state.job_moved_hooks, self._on_created),
            (state.job_removed_hooks, self._on_removed),
            (state.dedup.on_settled, self._on_idmp),
        ]
        for registry, hook in hooks:
            if on:
                registry.append(hook)
            else:
                registry.remove(hook)

    def _append(self, record: bytes) -> None:
        self.pending.append(record)
        self.pending_bytes += len(record)

    # The job hooks below are registered only while something is logged
    # (_sync_job_hooks).

    def _on_created(self, job: Job) -> None:
        self._append(loadjob_record(job))

    def _on_acked(self, job: Job) -> None:
        self._acked.append(job)

    def _on_idmp(self, entry: DedupEntry) -> None:
        self._append(idmp_record(entry))

    def _on_removed(self, job: Job) -> None:
        if job.state != JobState.WAIT_REPL and not job.is_dummy_ack:
            self._append(deljob_record(job.id))

    def _resolve_acks(self) -> None:
        """ACKs of jobs still here are logged (dehydrated); others were deleted."""
        acked, self._acked = self._acked, []
        registry = self.state.jobs
        for job in acked:
            if registry.get(job.id) is job and job.state == JobState.ACKED:
                self._append(dehydrated_ack_record(job))

    # -- writing --------------------------------------------------------------

    def _forward_to_rewrite(self) -> None:
        if self._acked:
            self._resolve_acks()
        rewrite = self.rewrite
        if rewrite is not None and self._forwarded < len(self.pending):
            rewrite.write(b"".join(self.pending[self._forwarded:]))
            self._forwarded = len(self.pending)

    def write_pending(self) -> bool:
        """Write the buffered records (no fsync); False if the write failed."""
        if self._acked:
            self._resolve_acks()
        if not self.pending:
            return True
        if self.rewrite is not None:
            self._forward_to_rewrite()
        fd = self.fd
        if fd is None:
            # No file (wait_rewrite, or a rewrite with appendonly no): the
            # rewrite has the records.
            self._clear_pending()
            return True
        data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
        try:
            written = os.write(fd, data)
        except OSError as err:
            self._write_failed(err.strerror or str(err))
            return False
        if written < len(data):
            # Short write (disk full): take the partial record back if we
            # can, else keep the rest for the next attempt.
            try:
                os.ftruncate(fd, self.size)
            except OSError:
                self.size += written
                rest = data[written:]
                self.pending = [rest]
                self.pending_bytes = len(rest)
                self._forwarded = 1
            else:
                self.pending = [data]
                self.pending_bytes = len(data)
                self._forwarded = 1
            self._write_failed("short write (No space left on device?)")
            return False
        self.size += written
        self._clear_pending()
        if self._unsynced_since is None:
            self._unsynced_since = time.monotonic()
        if self.write_error is not None:
            log.warning("AOF write error looks solved, Disque can write again.")
            self.write_error = None
        return True

    def _clear_pending(self) -> None:
        self.pending = []
        self.pending_bytes = 0
        self._forwarded = 0

    def _write_failed(self, reason: str) -> None:
        now = time.monotonic()
        if self.write_error is None or now - self._last_error_log > 10:
            log.warning("Error writing to the AOF file: %s", reason)
            self._last_error_log = now
        self.write_error = reason

    def fsync_now(self) -> None:
        """fdatasync in the event loop (appendfsync always, shutdown)."""
        if self.fd is None or self._unsynced_since is None:
            return
        try:
            os.fdatasync(self.fd)
        except OSError as err:
            if self.config.appendfsync == "always":
                # A reply must never leave before its record is on disk.
                log.critical("Can't persist AOF for fsync error when the AOF fsync policy is "
                             "'always': %s. Exiting...", err.strerror or err)
                logging.shutdown()
                os._exit(1)
            self.fsync_error = err.strerror or str(err)
            return
        self._fsync_done(self._unsynced_since)
        self._unsynced_since = None

    def _fsync_done(self, covering: float) -> None:
        now = time.monotonic()
        self._last_fsync = now
        lag = now - covering
        if lag > self.fsync_max_lag:
            self.fsync_max_lag = lag

    def _bg_fsync(self, fd: int, covering: float) -> None:
        # Runs in the background thread.
        try:
            os.fdatasync(fd)
        except OSError as err:
            self.fsync_error = err.strerror or str(err)
            return
        self.fsync_error = None
        self._fsync_done(covering)

    def before_reply(self) -> None:
        """Called before any reply is written: no client may see unlogged work."""
        if self.pending or self._acked:
            self.write_pending()
        if self.config.appendfsync == "always" and self._unsynced_since is not None:
            self.fsync_now()

    def after_command(self, reply: Any) -> Any:
        """After a write command: its records must be written before it answers."""
        if ((self.pending or self._acked) and self.write_each_command
                and not self.write_pending() and self.fd is not None):
            return ReplyError(f"MISCONF Errors writing to the AOF file: {self.write_error}")
        return reply

    def refuse_write(self) -> ReplyError | None:
        """-MISCONF for write commands while the AOF cannot be written."""
        if self.write_error is not None:
            if self.fd is None or self.write_pending():
                return None
            return ReplyError(f"MISCONF Errors writing to the AOF file: {self.write_error}")
        if self.fsync_error is not None and self.fd is not None:
            return ReplyError(f"MISCONF Errors writing to the AOF file: fsync: "
                              f"{self.fsync_error}")
        return None

    # -- periodic work ----------------------------------------------------------

    def cron(self) -> None:
        if self.pending or self._acked:
            self.write_pending()
        now = time.monotonic()
        if self.fd is not None and self._unsynced_since is not None:
            policy = self.config.appendfsync
            if policy == "always":
                self.fsync_now()
            elif policy == "everysec" and now - self._last_fsync >= FSYNC_PERIOD_S:
                if self.bio.busy:
                    self.delayed_fsyncs += 1  # the previous fsync is still running
                else:
                    covering = self._unsynced_since
                    self._unsynced_since = None
                    self.bio.submit(self._bg_fsync, self.fd, covering)
        elif self.fsync_error is not None and self.fd is not None and not self.bio.busy:
            self.bio.submit(self._bg_fsync, self.fd, now)   # retry a failed fsync
        if self.rewrite is None:
            if self.rewrite_scheduled and now - self._rewrite_failed_at >= REWRITE_RETRY_S:
                self.start_rewrite("scheduled")
            elif self.status == ON and self._auto_rewrite_due(now):
                log.info("Starting automatic rewriting of AOF on %d%% growth",
                         self._growth())
                self.start_rewrite("automatic")

    def _growth(self) -> int:
        base = self.base_size or 1
        return self.size * 100 // base - 100

    def _auto_rewrite_due(self, now: float) -> bool:
        percentage = self.config.auto_aof_rewrite_percentage
        return (percentage > 0 and self.size > self.config.auto_aof_rewrite_min_size
                and self._growth() >= percentage
                and now - self._rewrite_failed_at >= REWRITE_RETRY_S)

    # -- turning it on and off --------------------------------------------------

    def _open_append(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _set_appendonly(self, enabled: bool) -> None:
        if enabled and self.status == OFF:
            self.path = os.path.abspath(self.config.appendfilename)
            if self.rewrite is None:
                self.start_rewrite("appendonly yes", raise_errors=True)
            # The rewrite running (or just started) becomes the initial one.
            self.status = WAIT_REWRITE
            log.info("AOF turned on: writing the initial append only file")
        elif not enabled and self.status != OFF:
            self.stop()

    def _set_appendfsync(self, policy: str) -> None:
        if policy == "always":
            self.fsync_now()

    def stop(self) -> None:
        """CONFIG SET appendonly no: flush, fsync and close in the background."""
        if self.status == WAIT_REWRITE and self.rewrite is not None:
            self.rewrite.abort()
            self.rewrite = None
        self.write_pending()
        self._clear_pending()
        self._acked.clear()
        if self.fd is not None:
            self.bio.submit(self._bg_fsync, self.fd, time.monotonic())
            self.bio.submit(_close_quietly, self.fd)
            self.fd = None
        self._unsynced_since = None
        self.status = OFF
        self.write_error = None
        self.fsync_error = None
        self.rewrite_scheduled = False
        log.info("AOF turned off")

    # -- rewrite ------------------------------------------------------------------

    def start_rewrite(self, why: str, raise_errors: bool = False) -> bool:
        if self.rewrite is not None:
            return False
        target = os.path.abspath(self.config.appendfilename)
        try:
            self.rewrite = Rewrite(self, target)
        except OSError as err:
            self._rewrite_failed_at = time.monotonic()
            self.last_bgrewrite_status = "err"
            message = f"can't open the temporary rewrite file: {err.strerror or err}"
            log.warning("Background AOF rewrite not started: %s", message)
            if raise_errors:
                raise RuntimeError(message) from None
            return False
        self.rewrite_scheduled = False
        log.info("Background append only file rewriting started (%s)", why)
        return True

    def _rewrite_failed(self, rewrite: Rewrite) -> None:
        if self.rewrite is not rewrite:
            return
        log.warning("Background AOF rewrite terminated with error: %s", rewrite.error)
        rewrite.abort()
        self.rewrite = None
        self.last_bgrewrite_status = "err"
        self._rewrite_failed_at = time.monotonic()
        if self.status == WAIT_REWRITE:
            self.rewrite_scheduled = True   # keep trying to write the initial file

    def _rewrite_fsynced(self, rewrite: Rewrite) -> None:
        """The snapshot is on disk: switch files."""
        if self.rewrite is not rewrite or rewrite.aborted:
            return
        if rewrite.error is not None:
            self._rewrite_failed(rewrite)
            return
        self._forward_to_rewrite()
        if rewrite.bytes_written - rewrite.synced_bytes > 4 * 1024 * 1024:
            # Much arrived during the fsync: one more round, it will be shorter.
            rewrite.request_fsync()
            return
        t0 = time.perf_counter()
        try:
            if self.config.appendfsync == "always" and self.status == ON:
                # Replies already sent for those records were fsynced in the
                # old file: they must be in the new one before it replaces it.
                os.fdatasync(rewrite.fd)
            os.rename(rewrite.tmp_path, rewrite.target)
        except OSError as err:
            rewrite.error = err.strerror or str(err)
            self._rewrite_failed(rewrite)
            return
        self.bio.submit(_fsync_dir, rewrite.target)
        new_size = rewrite.bytes_written
        if self.status == OFF:
            self.bio.submit(_close_quietly, rewrite.fd)
        else:
            old = self.fd
            self.fd = rewrite.fd
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_APPEND)
            if old is not None:
                self.bio.submit(_close_quietly, old)   # may free a big file: not in the loop
            # Everything pending went to the new file.
            self._clear_pending()
            self.write_error = None
            self.size = self.base_size = new_size
            self.path = rewrite.target
            if self.config.appendfsync == "always" or new_size == rewrite.synced_bytes:
                self._unsynced_since = None
            else:
                self._unsynced_since = time.monotonic()
            if self.status == WAIT_REWRITE:
                self.status = ON
                log.info("AOF is now on (%s)", rewrite.target)
        switch_ms = (time.perf_counter() - t0) * 1000
        if self.rewrite is rewrite:
            self.rewrite = None
        self.rewrites += 1
        self.last_bgrewrite_status = "ok"
        self.last_rewrite_time = int(time.monotonic() - rewrite.started)
        self.last_rewrite_max_step = max(rewrite.max_step, switch_ms / 1000)
        self.last_rewrite_jobs = rewrite.jobs_written
        log.info("Background AOF rewrite finished successfully: %d jobs, %d bytes, %.2f s, "
                 "longest step %.2f ms, switch %.2f ms", rewrite.jobs_written, new_size,
                 time.monotonic() - rewrite.started, rewrite.max_step * 1000, switch_ms)

    def rewrite_sync(self, mark_shutdown: bool) -> None:
        """Write the whole state now (SHUTDOWN REWRITE-AOF); raises OSError."""
        if self.rewrite is not None:
            self.rewrite.abort()
            self.rewrite = None
        target = os.path.abspath(self.config.appendfilename)
        tmp = os.path.join(os.path.dirname(target), f"temp-rewriteaof-{os.getpid()}.aof")
        jobs = 0
        try:
            with open(tmp, "wb", buffering=1024 * 1024) as fh:
                for job in self.state.jobs.all():
                    rec = snapshot_record(job)
                    if rec is not None:
                        fh.write(rec)
                        jobs += 1
                for entry in self.state.dedup.entries():
                    if not entry.pending:
                        fh.write(idmp_record(entry))
                if mark_shutdown:
                    fh.write(mark_record(b"shutdown %d" % self.state.clock.now_ms()))
                fh.flush()
                os.fsync(fh.fileno())
                size = fh.tell()
            os.rename(tmp, target)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(target)
        if self.fd is not None:
            _close_quietly(self.fd)
            self.fd = None
        self._clear_pending()
        self._acked.clear()
        self._unsynced_since = None
        self.size = self.base_size = size
        log.info("Append only file written: %d jobs, %d bytes (%s)", jobs, size, target)

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, mode: str) -> None:
        self.bio.drain()
        if mode == "rewrite-aof" or self.status == WAIT_REWRITE:
            try:
                self.rewrite_sync(mark_shutdown=mode == "rewrite-aof")
            except OSError as err:
                log.error("Error writing the append only file on shutdown: %s",
                          err.strerror or err)
                if self.config.aof_enqueue_jobs_once:
                    # The file on disk was not written atomically at shutdown:
                    # the next start must not restore queues from it.
                    self.config.aof_enqueue_jobs_once = False
                    if self.config.config_file:
                        with contextlib.suppress(Exception):
                            self.config.rewrite()
        else:
            if self.rewrite is not None:
                self.rewrite.abort()
                self.rewrite = None
            if self.fd is not None:
                if not self.write_pending():
                    log.warning("Could not write the last AOF records on shutdown: %s",
                                self.write_error)
                log.info("Calling fsync() on the AOF file.")
                try:
                    os.fsync(self.fd)
                except OSError as err:
                    log.warning("fsync of the AOF failed on shutdown: %s", err.strerror or err)
        self.bio.drain()
        if self.fd is not None:
            _close_quietly(self.fd)
            self.fd = None

    # -- loading ----------------------------------------------------------------

    def load_at_startup(self) -> None:
        """Load the AOF if the configuration asks for it, then open it for appending."""
        config = self.config
        enqueue_once = config.aof_enqueue_jobs_once
        self.path = os.path.abspath(config.appendfilename)
        if config.appendonly or enqueue_once:
            if os.path.exists(self.path):
                if os.path.isdir(self.path):
                    raise AofCorruptError(f"Can't open the append-only file {self.path!r}: "
                                          f"it is a directory")
                self.load(self.path, enqueue_once)
            if enqueue_once:
                config.aof_enqueue_jobs_once = False
                log.info("aof-enqueue-jobs-once switched off after loading")
                if config.config_file:
                    try:
                        config.rewrite()
                    except Exception as err:
                        log.warning("Could not rewrite the config file to switch "
                                    "aof-enqueue-jobs-once off: %s", err)
        if config.appendonly:
            try:
                self.fd = self._open_append(self.path)
            except OSError as err:
                raise AofCorruptError(f"Can't open the append-only file {self.path!r}: "
                                      f"{err.strerror}") from None
            self.size = self.base_size = os.fstat(self.fd).st_size
            self.status = ON

    def load(self, path: str, enqueue_once: bool) -> None:
        t0 = time.monotonic()
        self.loading = True
        gc_was_enabled = gc.isenabled()
        gc.disable()   # a million new objects would trigger many useless collections
        try:
            try:
                result = read_aof(path, self.config.aof_load_truncated)
            except OSError as err:
                raise AofCorruptError(f"Can't read the append-only file {path!r}: "
                                      f"{err.strerror}") from None
            if result.damage is not None:
                damage = result.damage
                log.warning("!!! Warning: the append only file %s ends with a damaged record "
                            "at byte offset %d: %s. Dropping %d bytes (%s) and loading the %d "
                            "records before it.", path, damage.offset, damage.reason,
                            damage.end - damage.offset, result.damage_description,
                            result.records)
                try:
                    with open(path, "r+b") as fh:
                        fh.truncate(result.valid_size)
                        fh.flush()
                        os.fsync(fh.fileno())
                except OSError as err:
                    raise AofCorruptError(f"Can't truncate the damaged end of {path!r}: "
                                          f"{err.strerror}") from None
                log.warning("AOF truncated to %d bytes", result.valid_size)
            restore_queues = enqueue_once
            if enqueue_once and not result.clean_shutdown and not result.legacy_only:
                log.warning("aof-enqueue-jobs-once ignored: %s was not written by SHUTDOWN "
                            "REWRITE-AOF (it does not end with the shutdown mark), so queued "
                            "jobs are not restored: they are requeued by their retry timers",
                            path)
                restore_queues = False
            counts = apply_loaded_jobs(self.state, result.jobs.values(), restore_queues)
            now = self.state.clock.now_ms()
            counts["idmp"] = sum(self.state.dedup.restore(entry, now)
                                 for entry in result.idmp.values())
        finally:
            self.loading = False
            if gc_was_enabled:
                # The loaded jobs live long and hold no cycles: keep the cyclic
                # collector from walking them (with a million jobs one walk
                # stalls the event loop for seconds).
                gc.freeze()
                gc.enable()
        log.info("DB loaded from append only file: %.3f seconds (%d records; %d jobs "
                 "loaded, %d queued, %d expired skipped; %d IDMP keys)", time.monotonic() - t0,
                 result.records, counts["loaded"], counts["queued"], counts["expired"],
                 counts["idmp"])

    # -- INFO ---------------------------------------------------------------------

    def info_fields(self) -> list[tuple[str, object]]:
        rewrite = self.rewrite
        now = time.monotonic()
        fields: list[tuple[str, object]] = [
            ("loading", int(self.loading)),
            ("aof_enabled", int(self.status != OFF)),
            ("aof_state", self.status),
            ("aof_rewrite_in_progress", int(rewrite is not None)),
            ("aof_rewrite_scheduled", int(self.rewrite_scheduled)),
            ("aof_last_rewrite_time_sec", self.last_rewrite_time),
            ("aof_current_rewrite_time_sec",
             int(now - rewrite.started) if rewrite is not None else -1),
            ("aof_last_bgrewrite_status", self.last_bgrewrite_status),
            ("aof_last_write_status",
             "err" if self.write_error or self.fsync_error else "ok"),
            ("aof_last_write_error", self.write_error or self.fsync_error or ""),
            ("aof_rewrites", self.rewrites),
            ("aof_last_rewrite_jobs", self.last_rewrite_jobs),
            ("aof_last_rewrite_max_step_ms", f"{self.last_rewrite_max_step * 1000:.2f}"),
        ]
        if rewrite is not None:
            fields += [
                ("aof_rewrite_jobs_written", rewrite.jobs_written),
                ("aof_rewrite_max_step_ms", f"{rewrite.max_step * 1000:.2f}"),
            ]
        if self.status != OFF:
            fields += [
                ("aof_current_size", self.size),
                ("aof_base_size", self.base_size),
                ("aof_pending_rewrite", int(self.rewrite_scheduled)),
                ("aof_buffer_length", self.pending_bytes),
                ("aof_rewrite_buffer_length", 0),
                ("aof_pending_bio_fsync", int(self.bio.busy)),
                ("aof_delayed_fsync", self.delayed_fsyncs),
                ("aof_fsync_max_lag_ms", int(self.fsync_max_lag * 1000)),
            ]
        return fields


# --------------------------------------------------------------------------
# Applying loaded jobs to the node
# --------------------------------------------------------------------------

def apply_loaded_jobs(state: ServerState, jobs: Any, restore_queues: bool) -> dict[str, int]:
    """Register replayed jobs: active (requeued later by RETRY) or, once, queued."""
    from .ack import gc_retry_delay_ms
    from .jobext import retry_seconds
    from .jobs import register_job, requeue_time
    from .queue import enqueue_job

    now = state.clock.now_ms()
    counts = {"loaded": 0, "queued": 0, "expired": 0}
    to_enqueue: list[Job] = []
    node_sets: dict[frozenset[str], frozenset[str]] = {}
    names: dict[bytes, bytes] = {}
    for job in jobs:
        if job.etime <= now:
            counts["expired"] += 1
            continue
        job.delivered = node_sets.setdefault(job.delivered, job.delivered)
        if job.queue is not None:
            job.queue = names.setdefault(job.queue, job.queue)
        if job.state == JobState.ACKED:
            job.confirmed = frozenset()
            job.qtime = now + gc_retry_delay_ms(0)
        elif job.queue is None:
            continue  # a job without a queue is meaningless
        else:
            was_queued = job.state == JobState.QUEUED
            job.state = JobState.ACTIVE
            job.flags &= ~FLAG_BCAST_WILLQUEUE
            if restore_queues:
                if was_queued:
                    job.qtime = now  # enqueue_job needs a queue time
                    to_enqueue.append(job)
                elif not job.flags & FLAG_BCAST_QUEUED:
                    # Delayed and never queued: queue it when its delay ends.
                    job.qtime = max(now, job.ctime // 1_000_000 + job.delay * 1000)
                elif job.retry:
                    # Delivered: requeue RETRY after now, as after a delivery.
                    job.qtime = requeue_time(state, retry_seconds(job), now)
                    job.flags |= FLAG_BCAST_WILLQUEUE
                else:
                    job.qtime = 0   # a delivered RETRY-0 job is never queued again
            elif job.retry:
                job.qtime = requeue_time(state, job.delay + retry_seconds(job), now)
                job.flags |= FLAG_BCAST_WILLQUEUE
                if not job.flags & FLAG_DELIVERED:
                    # Not known to have been delivered: requeueing it is not
                    # an additional delivery (the original counted one).
                    job.flags &= ~FLAG_BCAST_QUEUED
            else:
                job.qtime = 0   # RETRY 0: a reload never queues it
        if register_job(state, job):
            counts["loaded"] += 1
    for job in to_enqueue:
        # Restore the queued state exactly: with BCAST_QUEUED clear the
        # enqueue is the silent kind (no additional delivery counted, no
        # QUEUED broadcast) and sets the flag back.
        had_bcast = job.flags & FLAG_BCAST_QUEUED
        job.flags &= ~FLAG_BCAST_QUEUED
        if enqueue_job(state, job):
            counts["queued"] += 1
        else:
            job.flags |= had_bcast
    return counts


# --------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------

def setup_persistence(server: Any, state: ServerState) -> AppendOnlyFile:
    """Create the node's AOF, load it if configured, register the shutdown hook.

    Raises ``SystemExit`` with a clear message if the file cannot be loaded.
    """
    aof = AppendOnlyFile(state)
    state.aof = aof
    try:
        aof.load_at_startup()
    except AofCorruptError as err:
        raise SystemExit(str(err)) from None

    def shutdown_hook(mode: str) -> None:
        aof.shutdown(mode)

    shutdown_hook.supports_rewrite = True  # type: ignore[attr-defined]
    server.shutdown_hooks.append(shutdown_hook)
    return aof
