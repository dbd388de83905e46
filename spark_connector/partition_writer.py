"""One partition of a write: its commands sent, refused rows retried, failover.

:class:`PartitionWriter` holds one connection, to the node ``partition %
reachable nodes`` first (the others are fallbacks), and, for rows with an
ordered group key, one to each home node their keys have (that node
first, then the partition's own list).  Each round trip is one
pipeline sent with the client's ``send_pipeline``, which keeps the replies
read before a dropped connection, so only unanswered commands are re-sent;
jobs refused with a transient error (``retryErrors``), per body in the
ADDJOBS reply or for a whole command, are re-sent with exponential backoff,
and a partition gives up after ``maxRetries`` attempts in a row without
progress, with an error naming the queue and the server's reason.  A node
that cannot be reached (``CONNECTION``) is tried again for
``reconnectTimeout`` instead, the rule the source follows too.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import WriterCommitMessage

from disque.client import is_unknown_command
from disque.exceptions import AuthError, ConnectionFailed, DisqueError, Leaving, ProtocolError

from . import telemetry
from .batching import Batcher, Part
from .sink_options import RETRYABLE_ERRORS, SinkConfig

if TYPE_CHECKING:
    from disque.client import Client

__all__ = ["PartitionWriter", "DisqueWriteError", "DisqueCommitMessage", "text"]

log = logging.getLogger("spark_connector.writer")


class DisqueWriteError(RuntimeError):
    """A partition could not add its jobs; ``jobs_written`` were added before."""

    def __init__(self, message: str, *, queue: str | None, reason: str,
                 partition: int, jobs_written: int) -> None:
        super().__init__(message)
        self.queue = queue
        self.reason = reason
        self.partition = partition
        self.jobs_written = jobs_written


def text(name: bytes) -> str:
    """A queue name as sent, for messages (any bytes survive: surrogateescape)."""
    return name.decode("utf-8", "surrogateescape")


def headers_refused(error: BaseException) -> bool:
    """The node refused a job's headers: an original node (a syntax error),
    or ours over ``max-job-headers`` / ``max-job-headers-size``."""
    message = str(error)
    return (message.startswith("ERR syntax error") or message.startswith("ERR too many headers")
            or message.startswith("ERR headers too large"))


def _error_code(error: BaseException) -> str:
    if isinstance(error, ConnectionFailed):
        return "CONNECTION"
    return getattr(error, "code", type(error).__name__)



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
    headers_refused: bool = False  # rows refused for the trace context the sink added


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
        self.sleep = sleep
        # Spans only where this Python process has a tracer provider (set
        # up by telemetrySetup, once per process): zero cost otherwise.
        telemetry.setup(config.telemetry_setup)
        self.tracing = telemetry.tracer()
        self.batcher = Batcher(config, partition,
                               key_prefix.encode() if key_prefix is not None else None,
                               self.tracing)
        self.batcher.own_node = self.node
        # Jobs added, per queue name as sent (decoded once, for the message).
        self.written: Counter[bytes] = Counter()
        self.retries = 0
        #: One client per node written to: None is the partition's own
        #: node, an address a group's home (:attr:`.Part.home`).
        self._clients: dict[str | None, Client] = {}
        #: Whose client :meth:`client` gives: the node of the parts being sent.
        self._target: str | None = None
        self._wait = 0.0 if config.async_ else (config.timeout_ms / 1000 or None)
        # Whether the dedup key goes out as ADDJOB's IDMP (decided on the
        # first batch, see idmp_enabled).
        self._idmp: bool | None = None if config.dedup_key and config.idmp != "false" else False
        # IDMPBUSY (the first ADDJOB with the key, e.g. of a speculative
        # twin, still waits for its copies) is transient by definition.
        self._retry_errors = config.retry_errors | {"IDMPBUSY"}
        #: Nodes (IDs, or addresses before HELLO) that answered ADDJOBS with
        #: "unknown command": original nodes, which get pipelined ADDJOBs.
        self.no_bulk: set[str | None] = set()
        #: ADDJOBS commands / ADDJOB commands sent (the tests read them).
        self.sent_bulk = 0
        self.sent_single = 0
        #: Nodes that refused the trace context the sink added to rows'
        #: headers (an original node, or ours with low header limits): it
        #: goes to them without it, as the client does (docs/TRACING.md).
        self.no_headers: set[str | None] = set()
        #: What to add to a give-up message (a node without headers).
        self._hint = ""

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

    @property
    def _client(self) -> Client | None:
        """The client of the node being written to (None: not connected yet)."""
        return self._clients.get(self._target)

    def client(self) -> Client:
        """The client of the node being written to: the partition's own
        node, or the home of the group keys of the rows being sent (that
        node first, then the partition's nodes as fallbacks)."""
        client = self._clients.get(self._target)
        if client is None:
            from disque.client import Client

            connection = self.config.connection
            order = self._node_order()
            if self._target is not None:
                order = [self._target, *(node for node in order if node != self._target)]
            client = self._clients[self._target] = Client(
                # Own node first, the others as fallbacks in a fixed order.
                order, randomize=False,
                password=connection.password, username=connection.user,
                connect_timeout=connection.connect_timeout_s,
                socket_timeout=connection.socket_timeout_s,
                # One round over the nodes per attempt: the backoff between
                # attempts is ours (retryBackoff), so it is the same whether
                # the node refuses connections or refuses jobs.
                reconnect_timeout=0,
                client_name=f"spark-disque-sink-p{self.partition}-{os.getpid()}")
        return client

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            client.close()

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
        ``parts`` go to one node: their ``home`` (:meth:`.Batcher.trips`).
        """
        home = parts[0].home if parts else None
        self._target = None if home == self.node else home
        try:
            self._send(parts)
        finally:
            self._target = None

    def _send(self, parts: list[Part]) -> None:
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
                self.client().drop_node(leaving=True)  # -LEAVING: go elsewhere
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
        # Each part as an ADDJOBS or not, for which node.
        plan: list[tuple[list[bool], str | None]] = []

        def build(node_id: str | None) -> tuple[bytes, int]:
            node = node_id or self._client_address()
            bulk = not self._idmp and node not in self.no_bulk
            # ADDJOBS ... GROUPS takes no job's own headers: such rows go as ADDJOBs.
            forms = [bulk and part.bulkable for part in parts]
            plan.append((forms, node))
            sent = parts
            if self.no_headers and node in self.no_headers:
                sent = [part.without_injected() for part in parts]
            if all(forms):
                self.sent_bulk += len(parts)
                return b"".join([part.bulk() for part in sent]), len(parts)
            if not any(forms):
                rows = sum(len(part) for part in parts)
                self.sent_single += rows
                return b"".join([part.singles() for part in sent]), rows
            count = 0
            payload: list[bytes | memoryview] = []
            for form, part in zip(forms, sent, strict=True):
                if form:
                    self.sent_bulk += 1
                    count += 1
                    payload.append(part.bulk())
                else:
                    self.sent_single += len(part)
                    count += len(part)
                    payload.append(part.singles())
            return b"".join(payload), count

        sent = self.client().send_pipeline(build, wait=self._wait)
        replies = sent.replies
        out = _Outcome(answered=len(replies), lost=sent.error)
        if not plan:  # no node reachable: nothing was sent
            out.again, out.lost_queue = list(parts), parts[0].group.queue
            return out
        forms, node = plan[0]
        at = 0
        for bulk, part in zip(forms, parts, strict=True):
            count = 1 if bulk else len(part)
            got = replies[at:at + count]
            at += count
            # The sink's own trace context, refused: sent again without it.
            strip = part.injected and node not in self.no_headers
            if len(got) < count:  # cut off by the lost connection
                if not out.lost_queue:
                    out.lost_queue = part.group.queue
                again = self._sort(out, part, got, strip) if got else []  # ADDJOBs answered
                again += range(len(got), len(part))
            elif not bulk:
                again = self._sort(out, part, got, strip)
            elif isinstance(got[0], DisqueError):
                if is_unknown_command(got[0]):
                    self._no_bulk_on(node)  # not an error: the same rows as ADDJOBs
                    out.again.append(part)
                    continue
                # A whole-command error: each body's reply (ADDJOB would have got it).
                again = self._sort(out, part, [got[0]] * len(part), strip)
            elif not isinstance(got[0], list) or len(got[0]) != len(part):
                out.fatal = out.fatal or (part.group.queue, ProtocolError(
                    f"ADDJOBS of {len(part)} bodies answered {got[0]!r:.200}"))
                continue
            else:
                again = self._sort(out, part, got[0], strip)
            if len(again) == len(part):
                out.again.append(part)
            elif again:
                out.again.append(part.take(again))
        if out.headers_refused:
            self.no_headers.add(node)
            log.info("partition %d: node %s refused the trace context in job headers: "
                     "sent without it from now on", self.partition, node)
        return out

    def _sort(self, out: _Outcome, part: Part, results: list[Any],
              strip: bool = False) -> list[int]:
        """Count the jobs added; return the rows of ``part`` to send again.

        ``strip``: rows refused for their headers are sent again without the
        trace context the sink added to them (not a failure).
        """
        queue = part.group.queue
        if set(map(type, results)) <= _ALL_IDS:  # the common case, at C speed (no row loop)
            self.written[queue] += len(results)
            return []
        again = []
        for i, result in enumerate(results):
            if not isinstance(result, DisqueError):
                self.written[queue] += 1
            elif strip and headers_refused(result):
                out.headers_refused = True
                again.append(i)
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
                if part.group_keys is not None and str(result).startswith("ERR syntax error"):
                    self._hint = (" (the node refused the jobs' group: an original Disque "
                                  "node has no ordered groups; give those rows a null "
                                  "'group', or drop the column, to write to it)")
                elif part.headers is not None and str(result).startswith("ERR syntax error"):
                    self._hint = (" (the node refused the jobs' headers: an original Disque "
                                  "node has no job headers; drop the 'headers' column to "
                                  "write to it)")
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
            f"node {where or self.node}): {reason}{self._hint}; {why}; "
            f"{sum(self.written.values())} jobs of this partition were added before",
            queue=queue, reason=str(error), partition=self.partition,
            jobs_written=sum(self.written.values())) from error

    def _write_traced(self, batches: Iterator[pa.RecordBatch]) -> None:
        """:meth:`write`'s loop with each batch's ``send`` spans, ended once its
        jobs are added (or the task fails); spans flushed before the task ends."""
        try:
            for batch in batches:
                parts = self.batcher.parts(batch, self.idmp_enabled)
                try:
                    for trip in self.batcher.trips(parts):
                        self.send(trip)
                except BaseException as exc:
                    self.batcher.end_spans(self._client_address(), exc)
                    raise
                self.batcher.end_spans(self._client_address())
        finally:
            telemetry.flush()

    def write(self, batches: Iterator[pa.RecordBatch]) -> DisqueCommitMessage:
        """Write every batch; the commit message for the driver."""
        started = time.monotonic()
        try:
            if self.tracing is None:
                for batch in batches:
                    for trip in self.batcher.trips(self.batcher.parts(batch, self.idmp_enabled)):
                        self.send(trip)
            else:
                self._write_traced(batches)
            node = self._client.address if self._client is not None else None
        finally:
            self.close()
        return DisqueCommitMessage(
            partition=self.partition, attempt=self.attempt, node=node,
            jobs=sum(self.written.values()),
            queues={text(name): count for name, count in self.written.items()},
            retries=self.retries, seconds=time.monotonic() - started)
