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
record batches (``DataSourceArrowWriter``): no Row object per job, and the
commands are built from the columns by Arrow kernels (:mod:`.resp`), no
Python object per row either.  Rows are grouped by queue and per-row option
values; each round trip carries ``batchSize`` rows, one ``ADDJOBS`` per
group (pipelined ADDJOBs on an original node, which answers ADDJOBS with
"unknown command"; one ADDJOB ... IDMP per row when dedup keys go out as
IDMP).  :mod:`.pipeline` keeps the replies read before a dropped
connection, so only unanswered commands are re-sent; jobs refused with a
transient error (``retryErrors``), per body in the ADDJOBS reply or for a
whole command, are re-sent with exponential backoff, and a partition
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
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# DataSourceStreamArrowWriter is new in pyspark 4.1 (Arrow input for streams).
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from disque.client._wire import MAX_BULK_BODIES, is_unknown_command, text
from disque.exceptions import AuthError, ConnectionFailed, DisqueError, Leaving, ProtocolError

from . import resp
from .pipeline import exchange, move_away
from .resp import encode_args
from .sink_options import JOB_OPTION_COLUMNS, MAX_IDMP_KEY_BYTES, RETRYABLE_ERRORS, SinkConfig
from .topology import check_any_reachable

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

@dataclass(frozen=True, slots=True)
class Group:
    """Rows that share a queue and ADDJOB options: one ``ADDJOBS`` carries them.

    The fixed parts of both command forms are encoded once per group:
    ``ADDJOBS <queue> <tail> BODIES`` (then the bodies), and the text around
    each body in ``ADDJOB <queue> <body> <tail> [IDMP <key> <idmp tail>]``.
    ``tail`` is the ms-timeout and the options, as ADDJOB takes them after
    the body (ADDJOBS takes the same after the queue).
    """

    queue: bytes
    bulk_argc: int
    bulk_head: bytes
    single_prefix: pa.Scalar
    single_suffix: pa.Scalar
    idmp_tail: pa.Scalar

    @classmethod
    def of(cls, queue: bytes, tail: tuple[bytes, ...],
           idmp_tail: tuple[bytes, ...] | None) -> Group:
        """``idmp_tail``: what follows ``IDMP <key>``, when keys are sent (else None)."""
        single_argc = 3 + len(tail) + (2 + len(idmp_tail) if idmp_tail is not None else 0)
        return cls(
            queue=queue,
            bulk_argc=3 + len(tail),
            bulk_head=encode_args((b"ADDJOBS", queue, *tail, b"BODIES")),
            single_prefix=resp.scalar(b"*%d\r\n" % single_argc
                                      + encode_args((b"ADDJOB", queue))),
            single_suffix=resp.scalar(encode_args(tail)),
            idmp_tail=resp.scalar(encode_args(idmp_tail or ())))


@dataclass(frozen=True, slots=True)
class Part:
    """Some rows of one group, in row order, as RESP bulk strings: the bodies
    (key included, with a dedup key) and, for IDMP, the keys."""

    group: Group
    bodies: pa.Array
    keys: pa.Array | None = None

    def __len__(self) -> int:
        return len(self.bodies)

    def slice(self, start: int, length: int) -> Part:
        keys = self.keys.slice(start, length) if self.keys is not None else None
        return Part(self.group, self.bodies.slice(start, length), keys)

    def take(self, rows: list[int]) -> Part:
        indexes = pa.array(rows, pa.int64())
        keys = self.keys.take(indexes) if self.keys is not None else None
        return Part(self.group, self.bodies.take(indexes), keys)

    def bulk(self) -> bytes:
        """``ADDJOBS`` with these bodies (at most MAX_BULK_BODIES)."""
        group = self.group
        return b"*%d\r\n%s%s" % (group.bulk_argc + len(self), group.bulk_head,
                                  resp.concatenated(self.bodies))

    def singles(self) -> memoryview:
        """One ``ADDJOB`` per body (with ``IDMP <key>`` when keys are sent)."""
        group = self.group
        if self.keys is None:
            commands = resp.join(group.single_prefix, self.bodies, group.single_suffix)
        else:
            commands = resp.join(group.single_prefix, self.bodies, group.single_suffix,
                                 _IDMP, self.keys, group.idmp_tail)
        return resp.concatenated(commands)


_IDMP = resp.scalar(encode_args((b"IDMP",)))
#: The types of a job ID in a reply (RESP2 bulk string; str if ever decoded).
_ALL_IDS = frozenset({bytes, str})


@dataclass(slots=True)
class _Outcome:
    """What the replies of one round trip said, row by row."""

    again: list[Part] = field(default_factory=list)  # rows to send again, in order
    failed: int = 0              # rows refused with a retryable error
    refusal: BaseException | None = None  # the last such error
    refused_queue: bytes = b""   # the queue of the first such row
    moved: bool = False          # -LEAVING: go to another node
    fatal: tuple[bytes, BaseException] | None = None
    answered: int = 0            # replies read (before a lost connection)
    lost: ConnectionFailed | None = None
    lost_queue: bytes = b""      # the queue of the first row without a reply


class PartitionWriter:
    """Adds the jobs of one partition: builds ADDJOBS (or ADDJOBs), sends, retries.

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
        # Whether the dedup key goes out as ADDJOB's IDMP (decided on the
        # first batch, see idmp_enabled), and the arguments after the key.
        self._idmp: bool | None = None if config.dedup_key and config.idmp != "false" else False
        self._idmp_tail: tuple[bytes, ...] = (
            (b"IDMP-WINDOW", b"%d" % config.idmp_window_s)
            if config.idmp_window_s is not None else ())
        # IDMPBUSY (the first ADDJOB with the key, e.g. of a speculative
        # twin, still waits for its copies) is transient by definition.
        self._retry_errors = config.retry_errors | {"IDMPBUSY"}
        # Groups by (queue, option values), encoded once; the common case
        # (one queue, the options' values) has exactly one.
        self._groups: dict[tuple[bytes, tuple[int | None, ...]], Group] = {}
        #: Nodes (IDs, or addresses before HELLO) that answered ADDJOBS with
        #: "unknown command": original nodes, which get pipelined ADDJOBs.
        self.no_bulk: set[str | None] = set()
        #: ADDJOBS commands / ADDJOB commands sent (the commit message's
        #: ``bulk`` flag and the tests read them).
        self.sent_bulk = 0
        self.sent_single = 0

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

    def group(self, queue: bytes | None, overrides: Mapping[str, int | None] = {}) -> Group:
        """The group of rows for ``queue`` (None: the default) whose per-row
        option columns hold ``overrides`` (a null falls back to the option)."""
        values = dict(self._defaults)
        values.update((name, value) for name, value in overrides.items() if value is not None)
        name = queue if queue is not None else self._default_queue
        assert name is not None  # checked on the driver, or per row in parts()
        key = (name, tuple(values.values()))
        found = self._groups.get(key)
        if found is None:
            if len(self._groups) >= 4096:  # a value per row: do not keep them all
                self._groups.clear()
            found = self._groups[key] = Group.of(
                name, self._encode_tail(values), self._idmp_tail if self._idmp else None)
        return found

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

    def parts(self, batch: pa.RecordBatch) -> list[Part]:
        """The rows of one Arrow batch as RESP, grouped by queue and options.

        Values are checked for the whole batch before any of it is sent, so
        a bad row fails the task without a half-written batch (earlier
        batches of the partition are written, as with any task failure).
        Column operations only: no Python object per row.
        """
        columns = self.config.columns
        n = batch.num_rows
        body = batch.column(columns.body)
        if body.null_count:
            self._fail_rows(columns.body, body.is_null(), "is null: every job needs a body")
        body = resp.as_binary(body)

        queue: pa.Array | None = None
        if columns.queue is not None:
            queue = batch.column(columns.queue)
            if queue.null_count:
                if self._default_queue is None:
                    self._fail_rows(columns.queue, queue.is_null(),
                                    "is null and no 'queue' option gives a default")
                queue = pc.fill_null(queue, self.config.queue)

        per_row: dict[str, pa.Array] = {}
        for name, column in columns.per_row_options:
            values = batch.column(column)
            if values.null_count < n:
                low = pc.min(values).as_py()
                minimum = JOB_OPTION_COLUMNS[name]
                if low < minimum:
                    self._fail_rows(column, pc.less(values, minimum),
                                    f"is {low}, below the minimum of {minimum}")
                per_row[name] = values

        idmp = (columns.key is not None or self.key_prefix is not None) and self.idmp_enabled()
        keys: pa.Array | None = None
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
            keys = resp.as_binary(keys)
        elif self.key_prefix is not None:
            keys = resp.numbered(self.key_prefix, self.rows, n)
        if keys is not None:
            body = resp.join(keys, body, separator=b"\n")
        self.rows += n
        bodies = resp.bulk_strings(body)
        key_args = resp.bulk_strings(keys) if idmp and keys is not None else None
        if queue is None and not per_row:
            return [Part(self.group(None), bodies, key_args)]
        return self._grouped(bodies, key_args, queue, per_row)

    def _grouped(self, bodies: pa.Array, keys: pa.Array | None, queue: pa.Array | None,
                 per_row: dict[str, pa.Array]) -> list[Part]:
        """Rows split by equal (queue, per-row option values), each group in row
        order, groups in the order of their first row."""
        columns = dict(per_row)
        if queue is not None:
            columns["queue"] = queue
        names = list(columns)
        columns["row"] = pa.array(np.arange(len(bodies), dtype=np.int64))
        found = pa.table(columns).group_by(names, use_threads=False).aggregate(
            [("row", "list")])
        rows = found.column("row_list").combine_chunks()
        out = []
        for i in range(found.num_rows):
            name = found.column("queue")[i].as_py() if queue is not None else None
            group = self.group(name.encode("utf-8", "surrogateescape") if name is not None
                               else None, {o: found.column(o)[i].as_py() for o in per_row})
            indexes = rows[i].values
            out.append(Part(group, bodies.take(indexes),
                            keys.take(indexes) if keys is not None else None))
        return out

    def trips(self, parts: list[Part]) -> Iterator[list[Part]]:
        """Round trips of at most ``batchSize`` rows; one ADDJOBS (a part)
        carries at most MAX_BULK_BODIES of them."""
        size = self.config.batch_size
        trip: list[Part] = []
        room = size
        for part in parts:
            start = 0
            while start < len(part):
                take = min(room, MAX_BULK_BODIES, len(part) - start)
                trip.append(part.slice(start, take) if take < len(part) else part)
                start += take
                room -= take
                if room == 0:
                    yield trip
                    trip, room = [], size
        if trip:
            yield trip

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

    def send(self, parts: list[Part]) -> None:
        """Add these jobs, re-sending the ones refused with a transient error.

        Error replies in ``retryErrors`` are re-sent at most ``maxRetries``
        times in a row without progress.  An unreachable node is tried again
        until ``reconnectTimeout`` has passed since it stopped answering (the
        source's rule too), however many attempts that takes.  When the
        connection drops mid-pipeline, the jobs already answered with an ID
        are kept and only the others are re-sent (on the next node); a
        ``-LEAVING`` reply moves the partition to another node at once.
        An ADDJOBS error reply that concerns the whole command (``-PAUSED``,
        ``-LEAVING``, ``-ERR ...``) counts as that reply for each of its
        bodies; ``-ERR unknown command`` (an original node) is no error:
        the same rows go out as ADDJOBs to that node from then on.
        """
        config = self.config
        pending = parts
        attempt = 0
        started = time.monotonic()
        unreachable_since: float | None = None
        reconnects = 0
        while pending:
            rows = sum(len(part) for part in pending)
            try:
                out = self._round_trip(pending)
            except AuthError as exc:
                self._give_up(pending[0].group.queue, exc, attempt, started, retryable=False)
            if out.fatal is not None:
                # Counted the whole pipeline first, so the message says
                # how many jobs really were added.
                self._give_up(*out.fatal, attempt, started, retryable=False)
            if out.moved:
                move_away(self.client())
                self.retries += 1
                log.info("partition %d: %s is leaving, moving to another node",
                         self.partition, self.node)
            if out.lost is not None:
                # Rows without a reply may or may not have been added:
                # re-send them (at-least-once; a dedup key lets consumers
                # drop the copy).  Those answered are kept, never sent twice.
                lost = out.lost
                if "CONNECTION" not in config.retry_errors:
                    self._give_up(out.lost_queue, lost, attempt, started, retryable=False)
                now = time.monotonic()
                pending = out.again
                if out.answered:  # the node answered until it dropped: try the next one now
                    unreachable_since, reconnects = None, 0
                    self.retries += 1
                    continue
                if unreachable_since is None:
                    unreachable_since = now
                remaining = config.connection.reconnect_timeout_s - (now - unreachable_since)
                if remaining <= 0:
                    self._give_up(out.lost_queue, lost, reconnects, started, retryable=True)
                reconnects += 1
                self.retries += 1
                log.info("partition %d: no node reachable, retry %d (for %.1f s more): %s",
                         self.partition, reconnects, remaining, lost)
                # The last wait ends at the deadline: one more try there.
                self.sleep(min(self._backoff(reconnects), remaining))
                continue
            unreachable_since, reconnects = None, 0
            pending = out.again
            if out.failed:
                assert out.refusal is not None
                if out.failed < rows:
                    attempt = 0  # progress: the node takes jobs again, start the backoff over
                attempt += 1
                if attempt > config.max_retries:
                    self._give_up(out.refused_queue, out.refusal, attempt - 1, started,
                                  retryable=True)
                self.retries += 1
                log.info("partition %d: %d jobs refused (%s), retry %d/%d", self.partition,
                         out.failed, _error_code(out.refusal), attempt, config.max_retries)
                self.sleep(self._backoff(attempt))

    def _round_trip(self, parts: list[Part]) -> _Outcome:
        """Send ``parts`` in one pipeline; sort the replies row by row."""
        plan: list[tuple[bool, str | None]] = []  # ADDJOBS or not, for which node

        def build(node_id: str | None) -> tuple[bytes, int]:
            node = node_id or self._client_address()
            bulk = not self._idmp and node not in self.no_bulk
            plan.append((bulk, node))
            if bulk:
                self.sent_bulk += len(parts)
                return b"".join([part.bulk() for part in parts]), len(parts)
            rows = sum(len(part) for part in parts)
            self.sent_single += rows
            return b"".join([part.singles() for part in parts]), rows

        replies, _, lost = exchange(self.client(), build, self._wait)
        out = _Outcome(answered=len(replies), lost=lost)
        if not plan:  # no node reachable: nothing was sent
            out.again, out.lost_queue = list(parts), parts[0].group.queue
            return out
        bulk, node = plan[0]
        at = 0
        for part in parts:
            count = 1 if bulk else len(part)
            got = replies[at:at + count]
            at += count
            if len(got) < count:  # cut off by the lost connection
                if not out.lost_queue:
                    out.lost_queue = part.group.queue
                again = self._sort(out, part, got) if got else []  # ADDJOBs answered count
                again += range(len(got), len(part))
            elif not bulk:
                again = self._sort(out, part, got)
            elif isinstance(got[0], DisqueError):
                if is_unknown_command(got[0]):
                    self._no_bulk_on(node)  # not an error: the same rows as ADDJOBs
                    out.again.append(part)
                    continue
                # A whole-command error: each body's reply (ADDJOB would have got it).
                again = self._sort(out, part, [got[0]] * len(part))
            elif not isinstance(got[0], list) or len(got[0]) != len(part):
                out.fatal = out.fatal or (part.group.queue, ProtocolError(
                    f"ADDJOBS of {len(part)} bodies answered {got[0]!r:.200}"))
                continue
            else:
                again = self._sort(out, part, got[0])
            if len(again) == len(part):
                out.again.append(part)
            elif again:
                out.again.append(part.take(again))
        return out

    def _sort(self, out: _Outcome, part: Part, results: list[Any]) -> list[int]:
        """Count the jobs added; return the rows of ``part`` to send again."""
        queue = part.group.queue
        if set(map(type, results)) <= _ALL_IDS:  # the common case, at C speed (no row loop)
            self.written[queue] += len(results)
            return []
        again = []
        for i, result in enumerate(results):
            if not isinstance(result, DisqueError):
                self.written[queue] += 1
            elif isinstance(result, Leaving) and "LEAVING" in self.config.retry_errors:
                out.moved = True
                again.append(i)
            elif isinstance(result, AuthError):
                out.fatal = out.fatal or (queue, result)
            elif _error_code(result) in self._retry_errors:
                if not out.failed:
                    out.refused_queue = queue
                out.refusal = result
                out.failed += 1
                again.append(i)
            elif out.fatal is None:
                out.fatal = (queue, result)
        return again

    def _client_address(self) -> str | None:
        return self._client.address if self._client is not None else None

    def _no_bulk_on(self, node: str | None) -> None:
        if node not in self.no_bulk:
            self.no_bulk.add(node)
            log.info("partition %d: node %s has no ADDJOBS (an original node): pipelined "
                     "ADDJOBs from now on", self.partition, node)

    def _give_up(self, queue_name: bytes, error: BaseException, retries: int, started: float,
                 *, retryable: bool) -> None:
        queue = text(queue_name)
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
        try:
            for batch in batches:
                for trip in self.trips(self.parts(batch)):
                    self.send(trip)
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

#: The module of the Python process in which Spark commits a micro-batch.
_COMMIT_RUNNER = "pyspark.sql.worker.python_streaming_sink_runner"


def _committing() -> bool:
    """Is this the process Spark started to commit (or abort) a micro-batch?"""
    return _COMMIT_RUNNER in sys.modules


def _on_the_cluster(config: SinkConfig) -> SinkConfig:
    """Check on the driver that a node answers, then spread over the cluster.

    A write whose nodes cannot be reached fails here, before any task runs,
    with one line naming the option (``reconnectTimeout`` still applies).
    """
    check_any_reachable(config.connection)
    return config.over_cluster()

class DisqueBatchWriter(DataSourceArrowWriter):
    """``df.write.format("disque").option("queue", "q").mode("append").save()``."""

    def __init__(self, options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> None:
        # Built on the driver: the cluster's nodes are looked up here, once.
        self.config = _on_the_cluster(SinkConfig.from_options(options, schema,
                                                              overwrite=overwrite))
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
        config = SinkConfig.from_options(options, schema, overwrite=overwrite, streaming=True)
        # Spark builds a new writer to commit each micro-batch: it only logs,
        # and a node briefly down must not fail a batch whose tasks are done.
        self.config = config if _committing() else _on_the_cluster(config)

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
