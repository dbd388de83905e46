"""Reading the AOF: records, damage, and the replay into a job table.

Replay is idempotent: :func:`read_aof` builds a table ``id -> job`` where a
later ``LOADJOB`` of an ID replaces the earlier one and ``DELJOB`` of an
unknown ID is ignored; nothing is applied to a node here (``restore.py``
does that).  The original's records (``*2 LOADJOB <blob>``, ``DELJOB <id>
[<id>...]``, no checksum) load too.

Damage: a last record that is incomplete or fails its checksum, with no
valid record after it, is a torn write (the node may start with everything
before it); damage followed by valid records is corruption
(:class:`AofCorruptError`).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..idmp import DedupEntry
from ..job import BLOB_HEAD, SERIALIZED_FLAGS, Job, JobState, SerializationError, is_valid_job_id
from ..job_options import decode_stored
from .records import (
    CRC_PREFIX,
    CRLF,
    KIND_DELJOB,
    KIND_IDMP,
    KIND_LOADJOB,
    KIND_MARK,
    KIND_QLIMIT,
    LOADJOB_PREFIX,
    decode_idmp,
    decode_qlimit,
)

__all__ = ["AofReader", "AofCorruptError", "BlobDecoder", "Damage", "LoadResult", "Record",
           "read_aof"]

log = logging.getLogger("disque.aof")

_DIGITS = frozenset(b"0123456789")
_HEXDIGITS = frozenset(b"0123456789abcdef")


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
        if buf[pos:pos + 18] == LOADJOB_PREFIX:
            # Fast path: our own LOADJOB record in its canonical form.
            nl = buf.find(CRLF, pos + 18, pos + 30)
            if nl > 0:
                raw = buf[pos + 18:nl]
                if raw.isdigit():
                    start = nl + 2
                    end = start + int(raw)
                    if end + 16 <= n and buf[end:end + 6] == CRC_PREFIX \
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
                and verb in (b"LOADJOB", b"DELJOB", b"MARK", b"IDMP", b"QLIMIT")
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
        if verb == b"QLIMIT" and checked:
            return Record(KIND_QLIMIT, pos, p, args, checked)
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
                      b"\r\n$4\r\nIDMP\r\n", b"\r\n$6\r\nQLIMIT\r\n",
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
             deliveries, qlen) = BLOB_HEAD.unpack_from(blob, 0)
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
    #: Queue -> (max jobs, period ms) of its last QLIMIT record (0 jobs: removed).
    qlimits: dict[bytes, tuple[int, int]] = field(default_factory=dict)


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
        elif item.kind == KIND_QLIMIT:
            try:
                queue, max_jobs, period_ms = decode_qlimit(item.args[0])
            except ValueError as err:
                raise AofCorruptError(
                    f"Bad QLIMIT record in the append only file {path!r} at byte offset "
                    f"{item.offset}: {err}. Run 'disque-check-aof {path}'") from None
            result.qlimits[queue] = (max_jobs, period_ms)  # the last record wins
        last_kind = item.kind if item.kind != KIND_MARK else (
            KIND_MARK if item.args[0].startswith(b"shutdown") else last_kind)
    result.clean_shutdown = last_kind == KIND_MARK and result.damage is None
