"""The sink's rows as RESP, grouped and cut into round trips, from Arrow columns.

An Arrow record batch becomes :class:`Part` s: the rows of one :class:`Group`
(a queue and its ADDJOB options) as RESP bulk strings, built with Arrow
kernels (:mod:`.resp`), no Python object per row.  A group sends its rows as
one ``ADDJOBS`` (or, to an original node or with IDMP keys, one ``ADDJOB`` per
row); :meth:`Batcher.trips` cuts the parts into round trips of ``batchSize``
rows.  Values are checked for the whole batch before any of it is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disque.client import MAX_BULK_BODIES

from . import resp
from .resp import encode_args
from .sink_options import (
    JOB_OPTION_COLUMNS,
    JOB_OPTION_MAXIMUMS,
    MAX_IDMP_KEY_BYTES,
    SinkConfig,
)

__all__ = ["Group", "Part", "Batcher"]


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


class Batcher:
    """Builds one partition's commands: its groups, encoded once, and its row count.

    ``key_prefix`` is ``"<write>/<batch>/<partition>/"`` when generated
    dedup keys are on (the row number within the partition completes it),
    else None.  ``idmp`` (decided by the sender, which asks the node) says
    whether the dedup keys also go out as ADDJOB's ``IDMP``.
    """

    def __init__(self, config: SinkConfig, partition: int, key_prefix: bytes | None) -> None:
        self.config = config
        self.partition = partition
        self.key_prefix = key_prefix
        self.rows = 0
        self.idmp = False
        self._default_queue = config.queue.encode() if config.queue is not None else None
        self._defaults = {"delay": config.delay, "retry": config.retry, "ttl": config.ttl,
                          "replicate": config.replicate, "priority": config.priority}
        # The arguments after an IDMP key.
        self._idmp_tail: tuple[bytes, ...] = (
            (b"IDMP-WINDOW", b"%d" % config.idmp_window_s)
            if config.idmp_window_s is not None else ())
        # Groups by (queue, option values), encoded once; the common case
        # (one queue, the options' values) has exactly one.
        self._groups: dict[tuple[bytes, tuple[int | None, ...]], Group] = {}

    def _encode_tail(self, values: Mapping[str, int | None]) -> tuple[bytes, ...]:
        config = self.config
        tail = [b"%d" % config.timeout_ms]
        for name in ("replicate", "delay", "retry", "ttl", "priority"):
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
                name, self._encode_tail(values), self._idmp_tail if self.idmp else None)
        return found

    def _fail_rows(self, column: str, mask: pa.Array, what: str) -> None:
        """Raise naming the first row of this batch where ``mask`` is true."""
        row = pc.index(mask, True).as_py()
        raise ValueError(f"disque sink: column '{column}' {what} (row {self.rows + row} of "
                         f"partition {self.partition}); no job of this batch was added")

    def parts(self, batch: pa.RecordBatch, idmp: Callable[[], bool]) -> list[Part]:
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
                maximum = JOB_OPTION_MAXIMUMS.get(name)
                high = pc.max(values).as_py()
                if maximum is not None and high > maximum:
                    self._fail_rows(column, pc.greater(values, maximum),
                                    f"is {high}, above the maximum of {maximum}")
                per_row[name] = values

        # Asked only when the rows have keys: the sender probes the node.
        self.idmp = (columns.key is not None or self.key_prefix is not None) and idmp()
        keys: pa.Array | None = None
        if columns.key is not None:
            keys = batch.column(columns.key)
            if keys.null_count:
                self._fail_rows(columns.key, keys.is_null(), "is null")
            newline = pc.match_substring(keys, "\n")
            if pc.any(newline).as_py():
                self._fail_rows(columns.key, newline, "contains a newline")
            if self.idmp:
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
        key_args = resp.bulk_strings(keys) if self.idmp and keys is not None else None
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
