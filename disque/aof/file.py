"""The node's append-only file: the records a turn logged, written before the
replies; the fsync policy; rewrites; loading at start-up; INFO persistence.

* ``appendfsync always``: ``fdatasync`` before the turn's replies leave, once
  per batch of replies (group commit);
* ``everysec``: the background thread fsyncs at most once a second; the
  event loop never waits for it;
* ``no``: the kernel decides.

After every command flagged ``write`` the records are written (``write(2)``)
before the command may answer; if that fails it answers ``-MISCONF`` and
later write commands are refused until a write succeeds.  So a client is
never told about a job (or an ACK) whose record is not at least in the
kernel.  When a write fails for records made outside a command (a copy
received by REPLJOB, an ADDJOB whose copies arrived), or an fsync fails under
``always``, the output queued in that turn may acknowledge them: it is
dropped with its connections and bus links (:meth:`AppendOnlyFile.on_durability_lost`),
as if the node had crashed for those peers, and the node goes on serving
reads.  After an fsync error the file cannot prove what it holds (the
kernel may have dropped the pages it failed to write, and a second fsync
would succeed): write commands are refused until a rewrite of the whole
state has reached the disk.  docs/PERSISTENCE.md describes the whole.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from ..idmp import DedupEntry
from ..job import Job, JobState
from ..protocol import ReplyError
from ..queue import set_rate_limit
from ..restore import apply_loaded_jobs
from .background import BackgroundIO, close_quietly, fsync_dir
from .reader import AofCorruptError, read_aof
from .records import (
    dehydrated_ack_record,
    deljob_record,
    idmp_record,
    loadjob_record,
    mark_record,
    qlimit_record,
    snapshot_record,
)
from .rewrite import Rewrite

if TYPE_CHECKING:
    from ..state import ServerState

__all__ = ["AppendOnlyFile", "setup_persistence"]

log = logging.getLogger("disque.aof")

#: After a failed automatic rewrite, wait this long before trying again.
REWRITE_RETRY_S: Final = 10.0
#: After an fsync error, the rewrite that makes the file whole again is
#: tried this often (write commands are refused meanwhile).
RECOVERY_RETRY_S: Final = 2.0
#: everysec: seconds between two background fsyncs.
FSYNC_PERIOD_S: Final = 1.0

OFF = "off"
ON = "on"
WAIT_REWRITE = "wait_rewrite"


class AppendOnlyFile:
    """The node's AOF: the journal of job events, the buffer, the fsync
    policy, rewrites, INFO fields (events.Journal and events.Persistence)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.config = state.config
        self._status = OFF
        self._rewrite: Rewrite | None = None
        self.path = os.path.abspath(self.config.appendfilename)
        self.fd: int | None = None
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self._forwarded = 0            # pending[:_forwarded] already given to the rewrite
        self._acked: list[Job] = []    # ACKs whose record is decided when written
        self.size = 0
        self.base_size = 0
        self.write_error: str | None = None
        #: An fsync failed: cleared only by a rewrite that reached the disk.
        self.fsync_error: str | None = None
        self._bg_fsync_error: str | None = None   # set by the background thread
        self._last_error_log = 0.0
        #: Records made outside the running write command were waiting
        #: when it started (see :meth:`refuse_write`).
        self._outside_records = False
        #: Called when output queued this turn may acknowledge records that
        #: could not be made durable (the reply batch, the cluster bus).
        self._drop_output: list[Callable[[], None]] = []
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

    @property
    def rewriting(self) -> bool:
        return self._rewrite is not None

    def _sync_job_hooks(self) -> None:
        """The job events (``state.events.journal``) and the commands' checks
        (``state.logging_persistence``) reach this file only while something
        is logged: this module is interpreted, and calls for every stored job
        and every write command only to find the AOF off cost each ADDJOB
        (and each copy a peer stores) ~2,300 instructions."""
        events = self.state.events
        journal = self if self.logging else None
        if events.journal is not journal:
            events.journal = journal
        self.state.logging_persistence = journal

    def _append(self, record: bytes) -> None:
        self.pending.append(record)
        self.pending_bytes += len(record)

    # The journal (events.Journal): called only while something is logged.

    def job_stored(self, job: Job) -> None:
        # Also a dead-letter move: a later LOADJOB replaces the earlier.
        self._append(loadjob_record(job))

    def job_acked(self, job: Job) -> None:
        self._acked.append(job)

    def idmp_settled(self, entry: DedupEntry) -> None:
        self._append(idmp_record(entry))

    def queue_limit_changed(self, name: bytes, max_jobs: int, period_ms: int) -> None:
        self._append(qlimit_record(name, max_jobs, period_ms))

    def job_forgotten(self, job: Job) -> None:
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

    def write_pending(self, own_records_only: bool = False) -> bool:
        """Write the buffered records (no fsync); False if the write failed.

        ``own_records_only``: the records are those of the write command
        that is about to answer (it answers -MISCONF), so no output queued
        before can depend on them.
        """
        if self._acked:
            self._resolve_acks()
        if not self.pending:
            return True
        if self.rewrite is not None:
            self._forward_to_rewrite()
        fd = self.fd
        if fd is None or self.fsync_error is not None:
            # No file (wait_rewrite, or a rewrite with appendonly no): the
            # rewrite has the records.  Or the file an fsync error left with
            # its last pages lost: nothing more goes to it, or after a power
            # loss the lost tail would be a hole before valid records, which
            # refuses to load; the recovery rewrite writes the whole state.
            self._clear_pending()
            return True
        data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
        try:
            written = os.write(fd, data)
        except OSError as err:
            self._write_failed(err.strerror or str(err), own_records_only)
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
            self._write_failed("short write (No space left on device?)", own_records_only)
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

    def _write_failed(self, reason: str, own_records_only: bool = False) -> None:
        now = time.monotonic()
        first = self.write_error is None
        if first or now - self._last_error_log > 10:
            log.warning("Error writing to the AOF file: %s. Write commands are refused "
                        "(-MISCONF) until a write succeeds; reads are served.", reason)
            self._last_error_log = now
        self.write_error = reason
        if first and not own_records_only:
            self._durability_lost()

    def on_durability_lost(self, drop: Callable[[], None]) -> None:
        """Register ``drop``: it discards the output queued but not sent yet
        (closing its connections), called when records that output may
        acknowledge could not be written or synced."""
        self._drop_output.append(drop)

    def _durability_lost(self) -> None:
        for drop in self._drop_output:
            drop()

    def fsync_now(self) -> None:
        """fdatasync in the event loop (appendfsync always, shutdown)."""
        if self.fd is None or self._unsynced_since is None or self.fsync_error is not None:
            # After an fsync error a second one would succeed without the
            # lost pages: only the recovery rewrite proves anything again.
            return
        try:
            os.fdatasync(self.fd)
        except OSError as err:
            self._fsync_failed(err.strerror or str(err))
            if self.config.appendfsync == "always":
                # A reply must never leave before its record is on disk.
                self._durability_lost()
            return
        self._fsync_done(self._unsynced_since)
        self._unsynced_since = None

    def _fsync_failed(self, reason: str) -> None:
        """The file may have lost records it was given: refuse writes until
        a rewrite of the whole state (from memory) reaches the disk."""
        if self.fsync_error is None:
            log.warning("Can't persist the AOF: fsync error: %s. Write commands are refused "
                        "(-MISCONF) until the append only file is rewritten (retried every "
                        "%.0f s); reads are served.", reason, RECOVERY_RETRY_S)
        self.fsync_error = reason
        if self.rewrite is None:
            self.rewrite_scheduled = True
            self._rewrite_failed_at = 0.0   # try at once

    def _fsync_done(self, covering: float) -> None:
        now = time.monotonic()
        self._last_fsync = now
        lag = now - covering
        if lag > self.fsync_max_lag:
            self.fsync_max_lag = lag

    def _bg_fsync(self, fd: int, covering: float) -> None:
        # Runs in the background thread: the cron sees the error.
        try:
            os.fdatasync(fd)
        except OSError as err:
            self._bg_fsync_error = err.strerror or str(err)
            return
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
                and not self.write_pending(own_records_only=not self._outside_records)
                and self.fd is not None):
            return ReplyError(f"MISCONF Errors writing to the AOF file: {self.write_error}")
        return reply

    def refuse_write(self) -> ReplyError | None:
        """-MISCONF while the AOF cannot take new records (a write command,
        an ADDJOB whose copies arrived, a copy offered by REPLJOB)."""
        if self.fd is None:
            return None
        if not self.can_log():
            reason = (f"fsync: {self.fsync_error}" if self.fsync_error is not None
                      else self.write_error)
            return ReplyError(f"MISCONF Errors writing to the AOF file: {reason}")
        self._outside_records = bool(self.pending or self._acked)
        return None

    def can_log(self) -> bool:
        """Whether records made now can reach the file: not after an fsync
        error (until the recovery rewrite), nor while the records a write
        failed on still cannot be written (tried again here)."""
        if self.fd is None:
            return True
        if self.fsync_error is not None:
            return False
        return self.write_error is None or self.write_pending()

    # -- periodic work ----------------------------------------------------------

    def cron(self) -> None:
        if self.pending or self._acked:
            self.write_pending()
        if self._bg_fsync_error is not None:
            reason, self._bg_fsync_error = self._bg_fsync_error, None
            self._fsync_failed(reason)
        now = time.monotonic()
        if self.fd is not None and self._unsynced_since is not None and self.fsync_error is None:
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
        if self.rewrite is None:
            retry = RECOVERY_RETRY_S if self.fsync_error is not None else REWRITE_RETRY_S
            if self.rewrite_scheduled and now - self._rewrite_failed_at >= retry:
                self.start_rewrite("after an fsync error" if self.fsync_error else "scheduled")
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
            self.bio.submit(close_quietly, self.fd)
            self.fd = None
        self._unsynced_since = None
        self.status = OFF
        self.write_error = None
        self.fsync_error = None
        self._bg_fsync_error = None
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
        if self.status == WAIT_REWRITE or self.fsync_error is not None:
            # Keep trying to write the initial file, or a whole file after an
            # fsync error.
            self.rewrite_scheduled = True

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
        self.bio.submit(fsync_dir, rewrite.target)
        new_size = rewrite.bytes_written
        if self.status == OFF:
            self.bio.submit(close_quietly, rewrite.fd)
        else:
            old = self.fd
            self.fd = rewrite.fd
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_APPEND)
            if old is not None:
                self.bio.submit(close_quietly, old)   # may free a big file: not in the loop
            # Everything pending went to the new file.
            self._clear_pending()
            self.write_error = None
            if self.fsync_error is not None:
                log.warning("The append only file was rewritten after the fsync error (%s): "
                            "write commands are accepted again", self.fsync_error)
                self.fsync_error = None
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
                for entry in self.state.idmp.entries():
                    if not entry.pending:
                        fh.write(idmp_record(entry))
                for q in self.state.queues.limited.values():
                    if q.limit is not None:
                        fh.write(qlimit_record(q.name, q.limit.max_jobs, q.limit.period_ms))
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
        fsync_dir(target)
        if self.fd is not None:
            close_quietly(self.fd)
            self.fd = None
        self._clear_pending()
        self._acked.clear()
        self._unsynced_since = None
        self.size = self.base_size = size
        log.info("Append only file written: %d jobs, %d bytes (%s)", jobs, size, target)

    # -- shutdown ---------------------------------------------------------------

    def shutdown(self, mode: str) -> None:
        self.bio.drain()
        if mode == "rewrite-aof" or self.status == WAIT_REWRITE or self.fsync_error is not None:
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
            close_quietly(self.fd)
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
            counts["idmp"] = sum(self.state.idmp.restore(entry, now)
                                 for entry in result.idmp.values())
            for name, (max_jobs, period_ms) in result.qlimits.items():
                if max_jobs:
                    set_rate_limit(self.state, self.state.queue_for_write(name), max_jobs,
                                   period_ms)
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
            ("aof_last_write_error", f"fsync: {self.fsync_error}" if self.fsync_error
             else self.write_error or ""),
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


def setup_persistence(state: ServerState) -> AppendOnlyFile:
    """Create the node's AOF (``state.persistence``) and load it if configured.

    Raises ``SystemExit`` with a clear message if the file cannot be loaded.
    """
    aof = AppendOnlyFile(state)
    state.persistence = aof
    try:
        aof.load_at_startup()
    except AofCorruptError as err:
        raise SystemExit(str(err)) from None
    return aof
