"""The sink's rows as RESP, grouped and cut into round trips, from Arrow columns.

An Arrow record batch becomes :class:`Part` s: the rows of one :class:`Group`
(a queue and its ADDJOB options) as RESP bulk strings, built with Arrow
kernels (:mod:`.resp`), no Python object per row.  A group sends its rows as
one ``ADDJOBS`` (or, to an original node or with IDMP keys, one ``ADDJOB`` per
row); :meth:`Batcher.trips` cuts the parts into round trips of ``batchSize``
rows.  Values are checked for the whole batch before any of it is sent.

A ``headers`` column makes each row's headers RESP pairs too (a list per
row); only rows that have some change the commands (``ADDJOBS ... JOBS``,
``ADDJOB ... HEADER name value``), so a batch without headers is sent byte
for byte as by a sink without the column.  When the process traces, each
batch gets a ``send`` span per queue whose context goes into the headers of
the rows that carry none (:meth:`Batcher._traced`).

A ``group`` column (ordered groups) sends the rows that have a key with it:
``ADDJOBS ... GROUPS key body ...``, or ``ADDJOB ... GROUP key`` where rows
go one by one (IDMP, headers, an original node's fallback).  Each such row
goes to its key's *home*, the first node of the key's rendezvous ranking
(:class:`GroupHomes`, the client's rule), in row order: a part of grouped
rows holds consecutive rows with the same queue and options, never rows
reordered (:meth:`Batcher._runs`).  Rows with a null key go as without
the column, and a batch in which no row has a key is sent byte for byte as
by a sink without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from disque.client import MAX_BULK_BODIES
from disque.rendezvous import ranking

from . import resp
from .resp import encode_args
from .sink_options import (
    JOB_OPTION_COLUMNS,
    JOB_OPTION_MAXIMUMS,
    MAX_IDMP_KEY_BYTES,
    SinkConfig,
)
from .telemetry import MAX_LINKS

if TYPE_CHECKING:
    from .telemetry import SendSpans, Tracing

__all__ = ["Group", "Part", "Batcher", "GroupHomes"]


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
    #: With headers: ``ADDJOBS <queue> <tail> JOBS``, and ``ADDJOB <queue>``
    #: without the array header (each row's argument count differs).
    jobs_head: bytes = b""
    single_head: pa.Scalar | None = None
    single_argc: int = 0
    #: With group keys: ``ADDJOBS <queue> <tail> GROUPS``, and the
    #: beginning of an ``ADDJOB`` that ends with ``GROUP <key>``.
    groups_head: bytes = b""
    grouped_prefix: pa.Scalar | None = None

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
            idmp_tail=resp.scalar(encode_args(idmp_tail or ())),
            jobs_head=encode_args((b"ADDJOBS", queue, *tail, b"JOBS")),
            single_head=resp.scalar(encode_args((b"ADDJOB", queue))),
            single_argc=single_argc,
            groups_head=encode_args((b"ADDJOBS", queue, *tail, b"GROUPS")),
            grouped_prefix=resp.scalar(b"*%d\r\n" % (single_argc + 2)
                                       + encode_args((b"ADDJOB", queue))))


@dataclass(frozen=True, slots=True)
class Part:
    """Some rows of one group, in row order, as RESP bulk strings: the bodies
    (key included, with a dedup key) and, for IDMP, the keys.

    ``headers``: each row's headers as a list of RESP ``name value`` pairs
    (None: no row has any, and the commands are those of a sink without
    headers, byte for byte); ``own``: the same without the trace context
    the sink ``injected`` into rows that had none, for a node that refuses
    headers (an original node).

    ``group_keys``: each row's ordered group key as a RESP bulk string (None:
    these rows have no group; a part holds rows with a key or rows
    without); ``home``: the address of the node they go to, their keys'
    home (None: the partition's own node).
    """

    group: Group
    bodies: pa.Array
    keys: pa.Array | None = None
    headers: pa.ListArray | None = None
    own: pa.ListArray | None = None
    injected: bool = False
    group_keys: pa.Array | None = None
    home: str | None = None

    def __len__(self) -> int:
        return len(self.bodies)

    def slice(self, start: int, length: int) -> Part:
        keys = self.keys.slice(start, length) if self.keys is not None else None
        if self.headers is None and self.group_keys is None:
            return Part(self.group, self.bodies.slice(start, length), keys)
        return Part(self.group, self.bodies.slice(start, length), keys,
                    _slice(self.headers, start, length), _slice(self.own, start, length),
                    self.injected, _slice(self.group_keys, start, length), self.home)

    def take(self, rows: list[int]) -> Part:
        indexes = pa.array(rows, pa.int64())
        keys = self.keys.take(indexes) if self.keys is not None else None
        if self.headers is None and self.group_keys is None:
            return Part(self.group, self.bodies.take(indexes), keys)
        return Part(self.group, self.bodies.take(indexes), keys, _take(self.headers, indexes),
                    _take(self.own, indexes), self.injected, _take(self.group_keys, indexes),
                    self.home)

    @property
    def bulkable(self) -> bool:
        """Whether one ADDJOBS can carry these rows: ``ADDJOBS ... GROUPS``
        gives each job its group but takes no headers of its own."""
        return self.group_keys is None or self.headers is None

    def without_injected(self) -> Part:
        """The rows with their own headers only (the trace context left out)."""
        return replace(self, headers=self.own, injected=False) if self.injected else self

    def bulk(self) -> bytes:
        """``ADDJOBS`` with these bodies (at most MAX_BULK_BODIES); with
        headers, ``ADDJOBS ... JOBS``: per job its header count, its names
        and values, its body."""
        group = self.group
        if self.group_keys is not None:  # bulkable: no headers
            return b"*%d\r\n%s%s" % (group.bulk_argc + 2 * len(self), group.groups_head,
                                      resp.concatenated(resp.join(self.group_keys,
                                                                  self.bodies)))
        if self.headers is None:
            return b"*%d\r\n%s%s" % (group.bulk_argc + len(self), group.bulk_head,
                                      resp.concatenated(self.bodies))
        counts = self.headers.value_lengths()
        pairs = int(counts.to_numpy(zero_copy_only=False).sum())
        jobs = resp.join(resp.bulk_strings(resp.decimal(counts)),
                         resp.row_concat(self.headers), self.bodies)
        return b"*%d\r\n%s%s" % (group.bulk_argc + 2 * len(self) + 2 * pairs,
                                  group.jobs_head, resp.concatenated(jobs))

    def singles(self) -> memoryview:
        """One ``ADDJOB`` per body (with ``IDMP <key>`` when keys are sent,
        then ``GROUP <key>`` for rows with a group, then ``HEADER name
        value`` per header)."""
        group = self.group
        grouped: tuple[pa.Array | pa.Scalar, ...] = ()
        if self.group_keys is not None:
            grouped = (_GROUP, self.group_keys)
        if self.headers is None:
            prefix = group.single_prefix
            if grouped:
                assert group.grouped_prefix is not None
                prefix = group.grouped_prefix
            if self.keys is None:
                commands = resp.join(prefix, self.bodies, group.single_suffix, *grouped)
            else:
                commands = resp.join(prefix, self.bodies, group.single_suffix,
                                     _IDMP, self.keys, group.idmp_tail, *grouped)
            return resp.concatenated(commands)
        counts = self.headers.value_lengths()
        argc = pc.add(pc.multiply(counts, 3), group.single_argc + (2 if grouped else 0))
        assert group.single_head is not None
        head = resp.join(_STAR, resp.decimal(argc), _CRLF, group.single_head)
        headers = resp.row_concat(self.headers, _HEADER)
        if self.keys is None:
            commands = resp.join(head, self.bodies, group.single_suffix, *grouped, headers)
        else:
            commands = resp.join(head, self.bodies, group.single_suffix, _IDMP, self.keys,
                                 group.idmp_tail, *grouped, headers)
        return resp.concatenated(commands)


@dataclass(frozen=True, slots=True)
class _Headers:
    """A batch's ``headers`` column: rows' ``offsets`` into the flat ``names``
    and ``values`` (bytes), and each row's pairs as RESP (``pairs``)."""

    offsets: np.ndarray
    names: pa.Array
    values: pa.Array
    pairs: pa.ListArray


def _take(array: Any, indexes: pa.Array | None) -> Any:
    """``array`` (or None) at ``indexes`` (None: all of it)."""
    if array is None or indexes is None:
        return array
    return array.take(indexes)


def _slice(array: Any, start: int, length: int) -> Any:
    """``array`` (or None) from ``start``, ``length`` rows."""
    return None if array is None else array.slice(start, length)


class GroupHomes:
    """The node each ordered group key's rows go to: the first of the key's
    rendezvous ranking among ``homes`` (``(node ID, address)``, the nodes
    found on the driver; ``disque/rendezvous.py``), as the client routes
    ``add_job(group=)``.  Keys are ranked once per task (a bounded cache)."""

    __slots__ = ("_addresses", "_ids", "_known")

    def __init__(self, homes: tuple[tuple[str, str], ...]) -> None:
        self._ids = [node_id for node_id, _ in homes]
        self._addresses = dict(homes)
        self._known: dict[bytes, str] = {}

    def __bool__(self) -> bool:
        return bool(self._ids)

    def of(self, key: bytes) -> str:
        home = self._known.get(key)
        if home is None:
            if len(self._known) >= 100_000:
                self._known.clear()
            home = self._known[key] = self._addresses[ranking(key, self._ids)[0]]
        return home

    def rows(self, keys: pa.Array) -> tuple[list[str], np.ndarray]:
        """The homes of ``keys`` (no nulls), and each row's index into them."""
        distinct = pc.unique(keys)
        homes = [self.of(key) for key in distinct.to_pylist()]
        names = list(dict.fromkeys(homes))
        of_distinct = np.array([names.index(home) for home in homes], dtype=np.int64)
        at = pc.index_in(keys, value_set=distinct).to_numpy(zero_copy_only=False)
        return names, of_distinct[at]


#: Where a part's rows come from: their queue and options, their indexes in
#: the batch (None: every row), whether they have a group key, their home.
_Selection = tuple[Group, "pa.Array | None", bool, "str | None"]


_IDMP = resp.scalar(encode_args((b"IDMP",)))
_GROUP = resp.scalar(encode_args((b"GROUP",)))
_HEADER = resp.scalar(encode_args((b"HEADER",)))
_STAR = resp.scalar(b"*")
_CRLF = resp.scalar(b"\r\n")


class Batcher:
    """Builds one partition's commands: its groups, encoded once, and its row count.

    ``key_prefix`` is ``"<write>/<batch>/<partition>/"`` when generated
    dedup keys are on (the row number within the partition completes it),
    else None.  ``idmp`` (decided by the sender, which asks the node) says
    whether the dedup keys also go out as ADDJOB's ``IDMP``.
    """

    def __init__(self, config: SinkConfig, partition: int, key_prefix: bytes | None,
                 tracing: Tracing | None = None) -> None:
        self.config = config
        self.partition = partition
        self.key_prefix = key_prefix
        self.rows = 0
        self.idmp = False
        #: This process traces: each batch's ``send`` spans (:meth:`parts`).
        self.tracing = tracing
        self.spans: SendSpans | None = None
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
        #: Where rows with an ordered group key go (empty: the partition's node).
        self.homes = GroupHomes(config.group_homes)
        #: The partition's own node (set by its writer): a key whose home it
        #: is goes with the rows without a key.
        self.own_node: str | None = None

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
        headers = self._headers(batch) if columns.headers is not None else None
        group_keys = self._group_keys(batch) if columns.group is not None else None
        self.rows += n
        bodies = resp.bulk_strings(body)
        key_args = resp.bulk_strings(keys) if self.idmp and keys is not None else None
        if group_keys is not None:
            return self._grouped_parts(n, queue, per_row, group_keys, bodies, key_args, headers)
        if self.tracing is None:
            if queue is None and not per_row:
                pairs = headers.pairs if headers is not None else None
                return [Part(self.group(None), bodies, key_args, pairs, pairs)]
            return [Part(group, bodies.take(indexes), _take(key_args, indexes),
                         _take(headers.pairs if headers is not None else None, indexes),
                         _take(headers.pairs if headers is not None else None, indexes))
                    for group, indexes in self._grouped(n, queue, per_row)]
        groups = ([(self.group(None), None)] if queue is None and not per_row
                  else self._grouped(n, queue, per_row))
        return self._traced(self.tracing, [(group, indexes, False, None)
                                           for group, indexes in groups],
                            bodies, key_args, headers, n)

    def _grouped(self, n: int, queue: pa.Array | None,
                 per_row: dict[str, pa.Array]) -> list[tuple[Group, pa.Array]]:
        """Rows split by equal (queue, per-row option values), each group in row
        order, groups in the order of their first row: each group and its
        rows' indexes."""
        columns = dict(per_row)
        if queue is not None:
            columns["queue"] = queue
        names = list(columns)
        columns["row"] = pa.array(np.arange(n, dtype=np.int64))
        found = pa.table(columns).group_by(names, use_threads=False).aggregate(
            [("row", "list")])
        rows = found.column("row_list").combine_chunks()
        out = []
        for i in range(found.num_rows):
            name = found.column("queue")[i].as_py() if queue is not None else None
            group = self.group(name.encode("utf-8", "surrogateescape") if name is not None
                               else None, {o: found.column(o)[i].as_py() for o in per_row})
            out.append((group, rows[i].values))
        return out

    # ------------------------------------------------------- ordered groups

    def _group_keys(self, batch: pa.RecordBatch) -> pa.Array | None:
        """The ``group`` column as ``large_binary`` (null: no group); None
        when no row of the batch has a key (the commands are then those of a
        sink without the column).  An empty key fails the batch naming the
        row; the node judges the rest (its ``max-group-key-len``)."""
        column_name = self.config.columns.group
        assert column_name is not None
        column = batch.column(column_name)
        if column.null_count == len(column):
            return None
        keys = resp.as_binary(column)
        empty = pc.fill_null(pc.equal(pc.binary_length(keys), 0), False)
        if pc.any(empty).as_py():
            self._fail_rows(column_name, empty, "is an empty string: a group key has at least "
                            "one byte (null: no group)")
        return keys

    def _grouped_parts(self, n: int, queue: pa.Array | None, per_row: dict[str, pa.Array],
                       group_keys: pa.Array, bodies: pa.Array, key_args: pa.Array | None,
                       headers: _Headers | None) -> list[Part]:
        """The parts of a batch with a ``group`` column: the rows without a
        key as without the column, the rows with one by home, in row order."""
        selections = self._selections(n, queue, per_row, group_keys)
        group_args = resp.bulk_strings(pc.fill_null(group_keys, b""))
        if self.tracing is not None:
            return self._traced(self.tracing, selections, bodies, key_args, headers, n,
                                group_args)
        pairs = headers.pairs if headers is not None else None
        return [Part(group, _take(bodies, indexes), _take(key_args, indexes),
                     _take(pairs, indexes), _take(pairs, indexes), False,
                     _take(group_args, indexes) if grouped else None, home)
                for group, indexes, grouped, home in selections]

    def _selections(self, n: int, queue: pa.Array | None, per_row: dict[str, pa.Array],
                    group_keys: pa.Array) -> list[_Selection]:
        """Rows without a key grouped by queue and options (as
        :meth:`_grouped`); rows with one by home, then in runs of
        consecutive rows with equal queue and options (:meth:`_runs`), so
        that the rows of a group keep their order."""
        valid = pc.is_valid(group_keys).to_numpy(zero_copy_only=False)
        out: list[_Selection] = []
        plain = np.flatnonzero(~valid)
        if len(plain):
            at = pa.array(plain)
            if queue is None and not per_row:
                out.append((self.group(None), at, False, None))
            else:
                for group, local in self._grouped(
                        len(plain), queue.take(at) if queue is not None else None,
                        {name: values.take(at) for name, values in per_row.items()}):
                    out.append((group, at.take(local), False, None))
        rows = np.flatnonzero(valid)
        homes: list[str | None] = [None]
        home_of = np.zeros(len(rows), dtype=np.int64)
        if self.homes:
            names, home_of = self.homes.rows(group_keys.take(pa.array(rows)))
            homes = [None if name == self.own_node else name for name in names]
        for i, home in enumerate(homes):
            for group, at in self._runs(rows[home_of == i], queue, per_row):
                out.append((group, pa.array(at), True, home))
        return out

    def _runs(self, rows: np.ndarray, queue: pa.Array | None,
              per_row: dict[str, pa.Array]) -> list[tuple[Group, np.ndarray]]:
        """``rows`` (indexes, ascending) cut where the queue or a per-row
        option changes: each run and its group, in row order.  Not
        :meth:`_grouped`'s group-by, which would send a row of a later
        option value after the rows of an earlier one."""
        if not len(rows):
            return []
        if queue is None and not per_row:
            return [(self.group(None), rows)]
        at = pa.array(rows)
        columns = [queue.take(at)] if queue is not None else []
        columns += [pc.fill_null(values.take(at), -1) for values in per_row.values()]
        change = np.zeros(len(rows), dtype=bool)
        change[0] = True
        for column in columns:
            values = column.to_numpy(zero_copy_only=False)
            change[1:] |= values[1:] != values[:-1]
        starts = np.flatnonzero(change)
        out = []
        for start, end in zip(starts, [*starts[1:], len(rows)], strict=True):
            first = int(rows[start])
            name = queue[first].as_py() if queue is not None else None
            group = self.group(name.encode("utf-8", "surrogateescape") if name is not None
                               else None, {o: per_row[o][first].as_py() for o in per_row})
            out.append((group, rows[start:end]))
        return out

    # -------------------------------------------------------------- headers

    def _headers(self, batch: pa.RecordBatch) -> _Headers | None:
        """The ``headers`` column's pairs, encoded; None when no row has one.

        A null (or empty) array or map is no headers.  A null entry, name or
        value fails the batch naming the row (values may be empty, not
        null: the node stores bytes); the node judges the rest (an empty
        name, control characters, its limits) and its ``-ERR`` fails the
        task as any refused job does.
        """
        column_name = self.config.columns.headers
        assert column_name is not None
        column = batch.column(column_name)
        if isinstance(column, pa.MapArray):  # the same entries, as a list of structs
            column = pa.ListArray.from_arrays(
                column.offsets, column.values,
                mask=column.is_null() if column.null_count else None)
        n = len(column)
        counts = pc.fill_null(pc.list_value_length(column), 0).to_numpy(
            zero_copy_only=False).astype(np.int64)
        if not counts.any():
            return None
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        entries = column.flatten()
        fields = {entries.type.field(i).name.lower(): i
                  for i in range(entries.type.num_fields)}
        names, values = entries.field(fields["key"]), entries.field(fields["value"])
        for what, nulls in (("has a null header", entries),
                            ("has a header whose key is null", names),
                            ("has a header whose value is null (values may be empty, not null)",
                             values)):
            if nulls.null_count:
                self._fail_pairs(column_name, offsets, nulls.is_null(), what)
        names, values = resp.as_binary(names), resp.as_binary(values)
        pairs = resp.join(resp.bulk_strings(names), resp.bulk_strings(values))
        return _Headers(offsets, names, values, pa.ListArray.from_arrays(
            pa.array(offsets.astype(np.int32)), pairs))

    def _fail_pairs(self, column: str, offsets: np.ndarray, mask: pa.Array,
                    what: str) -> None:
        pair = pc.index(mask, True).as_py()
        rows = np.zeros(len(offsets) - 1, dtype=bool)
        rows[int(np.searchsorted(offsets, pair, side="right")) - 1] = True
        self._fail_rows(column, pa.array(rows), what)

    def _traced(self, tracing: Tracing, groups: list[_Selection],
                bodies: pa.Array, keys: pa.Array | None, headers: _Headers | None,
                n: int, group_args: pa.Array | None = None) -> list[Part]:
        """The parts of a batch when this process traces: one ``send {queue}``
        span per queue (:class:`.telemetry.SendSpans`), whose context goes
        into the headers of each row that carries none (no name the
        propagator reads), while the rows that do are sent as given and
        linked."""
        from .telemetry import SendSpans

        own = np.zeros(n, dtype=bool)
        if headers is not None:
            fields = pa.array(sorted(tracing.fields()), resp.BINARY)
            hits = np.zeros(len(headers.names) + 1, dtype=np.int64)
            np.cumsum(pc.is_in(headers.names, value_set=fields).to_numpy(
                zero_copy_only=False), out=hits[1:])
            own = hits[headers.offsets[1:]] > hits[headers.offsets[:-1]]
        by_queue: dict[bytes, list[_Selection]] = {}
        for selection in groups:
            by_queue.setdefault(selection[0].queue, []).append(selection)
        spans = self.spans = SendSpans(tracing)
        out = []
        pairs = headers.pairs if headers is not None else None
        for queue, queue_groups in by_queue.items():
            rows = np.concatenate([np.arange(n) if indexes is None
                                   else indexes.to_numpy(zero_copy_only=False)
                                   for _, indexes, _, _ in queue_groups])
            contexts: list[Any] = []
            if headers is not None:
                for row in rows[own[rows]]:
                    if len(contexts) >= MAX_LINKS:
                        break
                    start, end = headers.offsets[row], headers.offsets[row + 1]
                    context = tracing.extract(zip(headers.names[start:end].to_pylist(),
                                                  headers.values[start:end].to_pylist(),
                                                  strict=True))
                    if context is not None:
                        contexts.append(context)
            injects = not own[rows].all()
            span = spans.start(queue, len(rows), contexts, injects)
            extra = pa.array([encode_args(pair) for pair in tracing.inject(span)],
                             resp.BINARY) if injects else None
            for group, indexes, grouped, home in queue_groups:
                group_own = own if indexes is None else own[indexes.to_numpy(
                    zero_copy_only=False)]
                group_pairs = _take(pairs, indexes)
                sent = group_pairs
                if extra is not None and not group_own.all():
                    sent = resp.append_to_rows(group_pairs, len(group_own), ~group_own, extra)
                out.append(Part(group, _take(bodies, indexes), _take(keys, indexes), sent,
                                group_pairs, sent is not group_pairs,
                                _take(group_args, indexes) if grouped else None, home))
        return out

    def end_spans(self, address: str | None, error: BaseException | None = None) -> None:
        """End the batch's ``send`` spans (sent to ``address``, or failed)."""
        if self.spans is not None:
            self.spans.finish(address, error)
            self.spans = None

    def trips(self, parts: list[Part]) -> Iterator[list[Part]]:
        """Round trips of at most ``batchSize`` rows; one ADDJOBS (a part)
        carries at most MAX_BULK_BODIES of them.  A trip's parts go to one
        node (their ``home``)."""
        size = self.config.batch_size
        trip: list[Part] = []
        room = size
        for part in parts:
            if trip and part.home != trip[0].home:
                yield trip
                trip, room = [], size
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
