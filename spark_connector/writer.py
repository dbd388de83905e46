"""The ``disque`` sink: ``df.write`` / ``df.writeStream`` ``.format("disque")``.

Where things run (pyspark 4.3): the writer object is built on the driver
(options and schema are checked there, see :mod:`.sink_options`), pickled,
and its ``write`` runs once per partition in an executor's Python worker.
``commit``/``abort`` run on the driver again, for streaming on a *new*
writer object built from the same options.  So ``write`` depends only on
what the pickled writer carries plus :class:`pyspark.TaskContext`.

Per partition (:class:`PartitionWriter`): one connection, to the node
``partition % reachable nodes`` first (the others are fallbacks), so the
partitions of a write spread over the cluster's nodes, found through HELLO
on the driver (:meth:`SinkConfig.over_cluster`).  Input arrives as Arrow
record batches (``DataSourceArrowWriter``): no Row object per job; columns
are turned into Python lists once per batch.  ADDJOBs go out pipelined,
``batchSize`` per round trip (:mod:`.pipeline`: a dropped connection keeps
the jobs already answered with an ID); jobs refused with a transient error
(``retryErrors``) are re-sent with exponential backoff, and a partition
gives up after ``maxRetries`` attempts in a row without progress, with an
error naming the queue and the server's reason.  A node that cannot be
reached (``CONNECTION``) is tried again for ``reconnectTimeout`` instead,
the rule the source follows too.

Delivery is at-least-once: a retried task, a replayed micro-batch or a
re-sent pipeline after a dropped connection may add a job twice.  With
``dedupKey`` each body is prefixed by a key that is the same on every
replay (see :func:`split_key` and docs/SPARK_SINK.md).
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

# DataSourceStreamArrowWriter is new in pyspark 4.1 (Arrow input for streams).
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from disque.client._wire import Request, text
from disque.exceptions import AuthError, ConnectionFailed, DisqueError, Leaving

from .pipeline import move_away, round_trip
from .sink_options import JOB_OPTION_COLUMNS, MAX_IDMP_KEY_BYTES, RETRYABLE_ERRORS, SinkConfig

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from disque.client import Client

__all__ = [
    "DisqueBatchWriter", "DisqueStreamWriter", "DisqueCommitMessage", "DisqueWriteError",
    "PartitionWriter", "split_key",
]

log = logging.getLogger("spark_connector.writer")

#: Local properties Spark sets on every task of a micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"


def split_key(body: bytes) -> tuple[str, bytes]:
    """Split a body written with ``dedupKey`` into ``(key, original body)``.

    The sink writes ``key + b"\\n" + body``; keys never contain a newline,
    so the first one ends the key whatever the body holds.
    """
    key, sep, rest = body.partition(b"\n")
    if not sep:
        raise ValueError("not a keyed body: no newline after the key")
    return key.decode("utf-8", "surrogateescape"), rest


@dataclass(frozen=True)
class DisqueCommitMessage(WriterCommitMessage):
    """What one task reports to the driver: how many jobs went where."""

    partition: int
    attempt: int
    node: str | None
    jobs: int
    queues: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    seconds: float = 0.0


class DisqueWriteError(RuntimeError):
    """A partition could not add its jobs; ``jobs_written`` were added before."""

    def __init__(self, message: str, *, queue: str | None, reason: str,
                 partition: int, jobs_written: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.reason = reason
        self.partition = partition
        self.jobs_written = jobs_written


def _error_code(error: BaseException) -> str:
    if isinstance(error, ConnectionFailed):
        return "CONNECTION"
    return getattr(error, "code", type(error).__name__)


def _summarize(messages: Iterable[WriterCommitMessage | None]) -> tuple[int, int, int]:
    """(jobs, retries, tasks that reported) over the messages Spark collected."""
    jobs = retries = tasks = 0
    for message in messages:
        if isinstance(message, DisqueCommitMessage):
            jobs += message.jobs
            retries += message.retries
            tasks += 1
    return jobs, retries, tasks


# --------------------------------------------------------------------------
# One partition
# --------------------------------------------------------------------------

class PartitionWriter:
    """Adds the jobs of one partition: builds ADDJOBs, pipelines, retries.

    ``key_prefix`` is ``"<write>/<batch>/<partition>/"`` when generated
    dedup keys are on (the row number within the partition completes it),
    else None.  ``sleep`` is injectable so tests of the retry policy do not
    wait.
    """

    def __init__(self, config: SinkConfig, partition: int, *, attempt: int = 0,
                 key_prefix: str | None = None,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        self.config = config
        self.partition = partition
        self.attempt = attempt
        self.key_prefix = key_prefix.encode() if key_prefix is not None else None
        self.sleep = sleep
        self.rows = 0
        # Jobs added, per queue name as sent (decoded once, for the message).
        self.written: Counter[bytes] = Counter()
        self.retries = 0
        self._client: Client | None = None
        self._wait = 0.0 if config.async_ else (config.timeout_ms / 1000 or None)
        self._default_queue = config.queue.encode() if config.queue is not None else None
        self._defaults = {"delay": config.delay, "retry": config.retry, "ttl": config.ttl,
                          "replicate": config.replicate}
        # Arguments after the body that are the same for every job (when no
        # per-row column overrides them), encoded once.
        self._tail = self._encode_tail(self._defaults)
        # Whether the dedup key goes out as ADDJOB's IDMP (decided on the
        # first batch, see idmp_enabled), and the arguments after the key.
        self._idmp: bool | None = None if config.dedup_key and config.idmp != "false" else False
        self._idmp_tail: tuple[bytes, ...] = (
            (b"IDMP-WINDOW", b"%d" % config.idmp_window_s)
            if config.idmp_window_s is not None else ())
        # IDMPBUSY (the first ADDJOB with the key, e.g. of a speculative
        # twin, still waits for its copies) is transient by definition.
        self._retry_errors = config.retry_errors | {"IDMPBUSY"}

    # ------------------------------------------------------------- building

    def _encode_tail(self, values: Mapping[str, int | None]) -> tuple[bytes, ...]:
        config = self.config
        tail = [b"%d" % config.timeout_ms]
        for name in ("replicate", "delay", "retry", "ttl"):
            value = values[name]
            if value is not None:
                tail += [name.upper().encode(), b"%d" % value]
        if config.maxlen is not None:
            tail += [b"MAXLEN", b"%d" % config.maxlen]
        if config.async_:
            tail.append(b"ASYNC")
        return tuple(tail)

    def idmp_enabled(self) -> bool:
        """Send the dedup keys as IDMP?  Decided once per partition.

        ``idmp=auto`` asks the node (``COMMAND INFO WAITJOB``: the IDMP and
        WAITJOB extensions ship together; the original answers null, and
        its ADDJOB would refuse IDMP as a syntax error), ``true`` does not
        ask.  The probe follows the partition's node order, like the writes.
        """
        if self._idmp is None:
            if self.config.idmp == "true":
                self._idmp = True
            else:
                self._idmp = self._node_has_idmp()
                log.info("partition %d: node %s %s IDMP: %s", self.partition,
                         self._client.address if self._client is not None else "?",
                         "supports" if self._idmp else "does not support",
                         "retried rows are added once" if self._idmp
                         else "keys in bodies only (at-least-once)")
        return self._idmp

    def _node_has_idmp(self) -> bool:
        connection = self.config.connection
        deadline = time.monotonic() + connection.reconnect_timeout_s
        attempt = 0
        while True:
            try:
                reply = self.client().execute_command("COMMAND", "INFO", "WAITJOB")
                return bool(reply) and reply[0] is not None
            except ConnectionFailed as exc:
                attempt += 1
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DisqueWriteError(
                        f"disque sink: no node reachable to write partition {self.partition}: "
                        f"{exc}; still failing after {attempt} attempts (reconnectTimeout="
                        f"{connection.reconnect_timeout_s:g} s); 0 jobs of this partition "
                        "were added before", queue=self.config.queue, reason=str(exc),
                        partition=self.partition, jobs_written=0) from exc
                self.sleep(min(self._backoff(attempt), remaining))

    def _fail_rows(self, column: str, mask: pa.Array, what: str) -> None:
        """Raise naming the first row of this batch where ``mask`` is true."""
        row = pc.index(mask, True).as_py()
        raise ValueError(f"disque sink: column '{column}' {what} (row {self.rows + row} of "
                         f"partition {self.partition}); no job of this batch was added")

    def requests(self, batch: pa.RecordBatch) -> list[Request]:
        """The ADDJOBs for one Arrow batch, after checking its values.

        Values are checked for the whole batch before any of it is sent, so
        a bad row fails the task without a half-written batch (earlier
        batches of the partition are written, as with any task failure).
        """
        columns = self.config.columns
        n = batch.num_rows
        body = batch.column(columns.body)
        if body.null_count:
            self._fail_rows(columns.body, body.is_null(), "is null: every job needs a body")
        if columns.body_is_string:
            # Zero-copy: UTF-8 text is already the bytes we send.
            body = body.cast(pa.large_binary() if pa.types.is_large_string(body.type)
                             else pa.binary())
        bodies: list[bytes] = body.to_pylist()

        queues: list[bytes] | None = None
        if columns.queue is not None:
            queue = batch.column(columns.queue)
            if queue.null_count:
                if self._default_queue is None:
                    self._fail_rows(columns.queue, queue.is_null(),
                                    "is null and no 'queue' option gives a default")
                queue = pc.fill_null(queue, self.config.queue)
            queues = [name.encode("utf-8", "surrogateescape") for name in queue.to_pylist()]

        per_row: list[tuple[str, list[int | None]]] = []
        for name, column in columns.per_row_options:
            values = batch.column(column)
            if values.null_count < n:
                low = pc.min(values).as_py()
                minimum = JOB_OPTION_COLUMNS[name]
                if low < minimum:
                    self._fail_rows(column, pc.less(values, minimum),
                                    f"is {low}, below the minimum of {minimum}")
                per_row.append((name, values.to_pylist()))

        idmp = (columns.key is not None or self.key_prefix is not None) and self.idmp_enabled()
        idmp_keys: list[bytes] = []
        if columns.key is not None:
            keys = batch.column(columns.key)
            if keys.null_count:
                self._fail_rows(columns.key, keys.is_null(), "is null")
            newline = pc.match_substring(keys, "\n")
            if pc.any(newline).as_py():
                self._fail_rows(columns.key, newline, "contains a newline")
            if idmp:
                too_long = pc.greater(pc.binary_length(keys), MAX_IDMP_KEY_BYTES)
                if pc.any(too_long).as_py():
                    self._fail_rows(columns.key, too_long,
                                    f"is longer than {MAX_IDMP_KEY_BYTES} bytes, the most "
                                    "an IDMP key may have (or set idmp to false)")
            idmp_keys = [key.encode("utf-8", "surrogateescape") for key in keys.to_pylist()]
            bodies = [key + b"\n" + data for key, data in zip(idmp_keys, bodies, strict=True)]
        elif self.key_prefix is not None:
            prefix, first = self.key_prefix, self.rows
            idmp_keys = [b"%s%d" % (prefix, first + i) for i in range(n)]
            bodies = [key + b"\n" + data for key, data in zip(idmp_keys, bodies, strict=True)]
        self.rows += n
        if idmp:
            return self._with_idmp(self._plain_requests(bodies, queues, per_row), idmp_keys)
        return self._plain_requests(bodies, queues, per_row)

    def _with_idmp(self, reqs: list[Request], keys: list[bytes]) -> list[Request]:
        """The same ADDJOBs with ``IDMP <key> [IDMP-WINDOW s]``: a retried task
        (or a speculative twin) re-sending a row gets the first job's ID."""
        extra = self._idmp_tail
        return [Request((*req.args, b"IDMP", key, *extra), req.parse, req.wait)
                for req, key in zip(reqs, keys, strict=True)]

    def _plain_requests(self, bodies: list[bytes], queues: list[bytes] | None,
                        per_row: list[tuple[str, list[int | None]]]) -> list[Request]:
        parse, wait = text, self._wait
        if not per_row:
            tail = self._tail
            if queues is None:
                head = (b"ADDJOB", self._default_queue)
                return [Request((*head, data, *tail), parse, wait) for data in bodies]
            return [Request((b"ADDJOB", name, data, *tail), parse, wait)
                    for name, data in zip(queues, bodies, strict=True)]
        out = []
        for i, data in enumerate(bodies):
            values = dict(self._defaults)
            for name, column_values in per_row:
                if column_values[i] is not None:
                    values[name] = column_values[i]
            name = queues[i] if queues is not None else self._default_queue
            out.append(Request((b"ADDJOB", name, data, *self._encode_tail(values)), parse, wait))
        return out

    # -------------------------------------------------------------- sending

    def _node_order(self) -> list[str]:
        """Own node first, then the other spread nodes, then the fallbacks."""
        nodes = list(self.config.connection.nodes)
        spread = self.config.spread or len(nodes)
        start = self.partition % spread
        return nodes[start:spread] + nodes[:start] + nodes[spread:]

    @property
    def node(self) -> str:
        """The node this partition writes to first: partitions spread over ``nodes``."""
        return self._node_order()[0]

    def client(self) -> Client:
        if self._client is None:
            from disque.client import Client

            connection = self.config.connection
            self._client = Client(
                # Own node first, the others as fallbacks in a fixed order.
                self._node_order(), randomize=False,
                password=connection.password, connect_timeout=connection.connect_timeout_s,
                socket_timeout=connection.socket_timeout_s,
                # One round over the nodes per attempt: the backoff between
                # attempts is ours (retryBackoff), so it is the same whether
                # the node refuses connections or refuses jobs.
                reconnect_timeout=0,
                client_name=f"spark-disque-sink-p{self.partition}-{os.getpid()}")
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _backoff(self, attempt: int) -> float:
        config = self.config
        delay = min(config.retry_backoff_ms * 2 ** (attempt - 1), config.retry_backoff_max_ms)
        # Jitter, so partitions refused together do not come back together.
        return delay / 1000 * random.uniform(0.5, 1.0)

    def send(self, reqs: list[Request]) -> None:
        """Add these jobs, re-sending the ones refused with a transient error.

        Error replies in ``retryErrors`` are re-sent at most ``maxRetries``
        times in a row without progress.  An unreachable node is tried again
        until ``reconnectTimeout`` has passed since it stopped answering (the
        source's rule too), however many attempts that takes.  When the
        connection drops mid-pipeline, the jobs already answered with an ID
        are kept and only the others are re-sent (on the next node); a
        ``-LEAVING`` reply moves the partition to another node at once.
        """
        config = self.config
        pending = reqs
        attempt = 0
        started = time.monotonic()
        unreachable_since: float | None = None
        reconnects = 0
        while pending:
            error: BaseException | None = None
            again: list[int] = []           # indexes into pending, re-sent
            failed = 0                      # of which refused with a retryable error
            moved = False
            try:
                results, lost = round_trip(self.client(), pending)
            except AuthError as exc:
                self._give_up(pending[0], exc, attempt, started, retryable=False)
            fatal: tuple[Request, BaseException] | None = None
            for i, result in enumerate(results):
                if not isinstance(result, DisqueError):
                    self.written[pending[i].args[1]] += 1
                elif isinstance(result, Leaving) and "LEAVING" in config.retry_errors:
                    moved = True
                    again.append(i)
                elif isinstance(result, AuthError):
                    fatal = fatal or (pending[i], result)
                elif _error_code(result) in self._retry_errors:
                    error = result
                    again.append(i)
                    failed += 1
                elif fatal is None:
                    fatal = (pending[i], result)
            if fatal is not None:
                # Counted the whole pipeline first, so the message says
                # how many jobs really were added.
                self._give_up(*fatal, attempt, started, retryable=False)
            if moved:
                move_away(self.client())
                self.retries += 1
                log.info("partition %d: %s is leaving, moving to another node",
                         self.partition, self.node)
            if lost is not None:
                # Requests without a reply may or may not have run: re-send
                # them (at-least-once; a dedup key lets consumers drop the
                # copy).  Those answered are kept, never sent twice.
                if "CONNECTION" not in config.retry_errors:
                    self._give_up(pending[len(results)], lost, attempt, started,
                                  retryable=False)
                again += range(len(results), len(pending))
                now = time.monotonic()
                if results:  # the node answered until it dropped: try the next one now
                    unreachable_since, reconnects = None, 0
                    self.retries += 1
                    pending = [pending[i] for i in sorted(again)]
                    continue
                if unreachable_since is None:
                    unreachable_since = now
                remaining = config.connection.reconnect_timeout_s - (now - unreachable_since)
                if remaining <= 0:
                    self._give_up(pending[0], lost, reconnects, started, retryable=True)
                reconnects += 1
                self.retries += 1
                log.info("partition %d: no node reachable, retry %d (for %.1f s more): %s",
                         self.partition, reconnects, remaining, lost)
                # The last wait ends at the deadline: one more try there.
                self.sleep(min(self._backoff(reconnects), remaining))
                pending = [pending[i] for i in sorted(again)]
                continue
            unreachable_since, reconnects = None, 0
            if not again:
                return
            if failed:
                assert error is not None
                if failed < len(pending):
                    attempt = 0  # progress: the node takes jobs again, start the backoff over
                attempt += 1
                if attempt > config.max_retries:
                    first = next(pending[i] for i in again
                                 if not isinstance(results[i], Leaving))
                    self._give_up(first, error, attempt - 1, started, retryable=True)
                self.retries += 1
                log.info("partition %d: %d jobs refused (%s), retry %d/%d", self.partition,
                         failed, _error_code(error), attempt, config.max_retries)
                self.sleep(self._backoff(attempt))
            pending = [pending[i] for i in again]

    def _give_up(self, req: Request, error: BaseException, retries: int, started: float,
                 *, retryable: bool) -> None:
        queue = text(req.args[1])
        code = _error_code(error)
        where = self._client.address if self._client is not None else None
        if retryable:
            limit = (f"reconnectTimeout={self.config.connection.reconnect_timeout_s:g} s"
                     if code == "CONNECTION" else f"maxRetries={self.config.max_retries}")
            why = (f"still failing after {retries} {'retry' if retries == 1 else 'retries'} in "
                   f"{time.monotonic() - started:.1f} s ({limit})")
        else:
            why = (f"not retried ({code} is not in retryErrors)" if code in RETRYABLE_ERRORS
                   else "not retried")
        reason = str(error)
        if not reason.startswith(code):  # error replies start with their code already
            reason = f"{code}: {reason}"
        raise DisqueWriteError(
            f"disque sink: could not add jobs to queue '{queue}' (partition {self.partition}, "
            f"node {where or self.node}): {reason}; {why}; "
            f"{sum(self.written.values())} jobs of this partition were added before",
            queue=queue, reason=str(error), partition=self.partition,
            jobs_written=sum(self.written.values())) from error

    def write(self, batches: Iterator[pa.RecordBatch]) -> DisqueCommitMessage:
        """Write every batch; the commit message for the driver."""
        started = time.monotonic()
        size = self.config.batch_size
        try:
            for batch in batches:
                reqs = self.requests(batch)
                for i in range(0, len(reqs), size):
                    self.send(reqs[i:i + size])
            node = self._client.address if self._client is not None else None
        finally:
            self.close()
        return DisqueCommitMessage(
            partition=self.partition, attempt=self.attempt, node=node,
            jobs=sum(self.written.values()),
            queues={text(name): count for name, count in self.written.items()},
            retries=self.retries, seconds=time.monotonic() - started)


def _task() -> tuple[int, int, Any]:
    """(partition id, attempt number, TaskContext) of the running task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:  # called outside Spark (unit tests): partition 0
        return 0, 0, None
    return context.partitionId(), context.attemptNumber(), context


# --------------------------------------------------------------------------
# The two writers Spark sees
# --------------------------------------------------------------------------

class DisqueBatchWriter(DataSourceArrowWriter):
    """``df.write.format("disque").option("queue", "q").mode("append").save()``."""

    def __init__(self, options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> None:
        # Built on the driver: the cluster's nodes are looked up here, once.
        self.config = SinkConfig.from_options(options, schema,
                                              overwrite=overwrite).over_cluster()
        # Built once on the driver and pickled to every task (and every task
        # retry), so all of them share it: generated keys of one save() agree.
        self.write_id = self.config.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DisqueCommitMessage:
        partition, attempt, _ = _task()
        prefix = f"{self.write_id}/0/{partition}/" if self.config.dedup_key else None
        return PartitionWriter(self.config, partition, attempt=attempt,
                               key_prefix=prefix).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        jobs, retries, tasks = _summarize(messages)
        log.info("write %s committed: %d jobs from %d tasks (%d retried sends)",
                 self.write_id, jobs, tasks, retries)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        jobs, _, tasks = _summarize(messages)
        # Jobs cannot be taken back (consumers may have them already).
        log.warning("write %s failed; %d tasks had already added %d jobs, which stay queued",
                    self.write_id, tasks, jobs)


class DisqueStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("disque").option("queue", "q")...start()``."""

    def __init__(self, options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> None:
        self.config = SinkConfig.from_options(options, schema, overwrite=overwrite,
                                              streaming=True).over_cluster()

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DisqueCommitMessage:
        partition, attempt, context = _task()
        prefix = None
        if self.config.dedup_key:
            # The query ID survives restarts from the checkpoint and a replayed
            # micro-batch keeps its ID: the key of a replayed row is unchanged.
            query = self.config.write_id or (
                context.getLocalProperty(QUERY_ID_PROPERTY) if context else None)
            batch = context.getLocalProperty(BATCH_ID_PROPERTY) if context else None
            if query is None or batch is None:
                raise RuntimeError("disque sink: dedupKey needs the streaming query and "
                                   "batch IDs, which Spark did not provide to this task")
            prefix = f"{query}/{batch}/{partition}/"
        return PartitionWriter(self.config, partition, attempt=attempt,
                               key_prefix=prefix).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        jobs, retries, tasks = _summarize(messages)
        log.info("batch %d committed: %d jobs from %d tasks (%d retried sends)",
                 batchId, jobs, tasks, retries)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        jobs, _, tasks = _summarize(messages)
        # Also called when the query is stopped mid-batch.  The tasks that
        # did not finish report nothing, but may have added jobs too.
        log.warning("batch %d aborted; %d finished tasks had added %d jobs, which a replay "
                    "of the batch adds again (at-least-once)", batchId, tasks, jobs)
