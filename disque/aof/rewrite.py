"""The incremental rewrite (BGREWRITEAOF, automatic, CONFIG SET appendonly yes).

A snapshot made in the event loop in steps of at most
:data:`REWRITE_STEP_BUDGET_S` (one loop turn each, so clients are served
between steps): each step serializes the jobs of the next slices of the job
table as ``LOADJOB`` records of their current state (acked ones
dehydrated) and appends them to a temporary file.  Every record logged
while the rewrite runs is appended to the same file too, in the order it
happened, so the last-wins replay yields the current state.  When the scan
ends the file is fsynced in the background, the records that arrived
meanwhile are appended, and the file is renamed over the AOF.  No fork: a
fork of a process holding a million Python objects copies nearly all its
memory, reference counts being written on every access.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import TYPE_CHECKING, Final

from ..job import Job
from .background import close_quietly
from .records import idmp_record, qlimit_record, snapshot_record

if TYPE_CHECKING:
    from ..idmp import DedupEntry
    from .file import AppendOnlyFile

__all__ = ["Rewrite", "REWRITE_STEP_BUDGET_S", "REWRITE_CHUNK"]

log = logging.getLogger("disque.aof")

#: Longest time one rewrite step may run in the event loop.
REWRITE_STEP_BUDGET_S: Final = 0.002
#: A step writes at most about this much.
REWRITE_CHUNK: Final = 1024 * 1024


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
        dedup = self.aof.state.idmp
        written = 0
        if self.keys is None:
            self.keys = list(dedup.entries())
            # The queues' rate limits first, at once: there are few.
            for q in self.aof.state.queues.limited.values():
                if q.limit is not None:
                    rec = qlimit_record(q.name, q.limit.max_jobs, q.limit.period_ms)
                    out.append(rec)
                    written += len(rec)
        keys = self.keys
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
        self.aof.bio.submit(close_quietly, self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.tmp_path)
