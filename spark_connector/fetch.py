"""GETJOB into Arrow tables: the one fetch loop every read path shares."""

from __future__ import annotations

import itertools
import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from disque.exceptions import ConnectionFailed, DisqueError, ProtocolError

from . import telemetry
from .options import OptionError
from .schema import empty_table, headers_type, null_groups, staged_schema, utf8_view

if TYPE_CHECKING:
    from disque.client import Client, Job

__all__ = ["Fetched", "fetch_jobs", "fetch_table", "jobs_to_table", "empty_table", "string_array",
           "binary_ids", "count_nonzero", "headers_array", "headers_refused_error",
           "supports_headers", "groups_refused_error", "supports_groups"]

log = logging.getLogger("spark_connector.fetch")


def jobs_to_table(jobs: list[Job], fetched_at_us: int | None = None,
                  headers: list[list[bytes]] | None = None,
                  groups: tuple[list[bytes | None], list[int | None]] | None = None
                  ) -> pa.Table:
    """Staged-form table of ``jobs`` (counters must have been fetched);
    ``headers``: each job's flat headers (name, value, ...), staged as the
    ``headers`` column; ``groups``: each job's group key and position (None
    for a job without a group), staged as the group columns.

    Columns built from buffers, as the GETJOB path's: ``pa.array`` on a
    list would import pandas into the executor's Python worker (see
    :func:`binary_array`).
    """
    if fetched_at_us is None:
        fetched_at_us = time.time_ns() // 1000
    columns = [
        _utf8_array([j.queue for j in jobs]),
        _utf8_array([j.id for j in jobs]),
        binary_array([j.body for j in jobs]),
        int64_array([j.nacks or 0 for j in jobs]),
        int64_array([j.additional_deliveries or 0 for j in jobs]),
        _timestamps(fetched_at_us, len(jobs)),
    ]
    if headers is not None:
        columns.append(headers_array(headers))
    if groups is not None:
        columns.extend(group_arrays(*groups))
    return pa.Table.from_arrays(columns, schema=staged_schema(headers is not None,
                                                               groups is not None))


#: Entry length of ``GETJOB ... WITHCOUNTERS`` without and with ``WITHLEASE``
#: (``WITHHEADERS`` adds two more fields, then ``WITHGROUP`` four, last).
_PLAIN, _LEASED = 7, 9
#: What ``WITHGROUP`` adds: ``"group-position", ctime, "group", key``.
_GROUP_FIELDS = 4


def _headers_at(entry_len: int, groups: bool) -> int:
    """Where a ``WITHHEADERS`` entry has its headers (before WITHGROUP's fields)."""
    return entry_len - 1 - (_GROUP_FIELDS if groups else 0)


def _getjob_raw(client: Client, queues: tuple[str, ...] | list[str], count: int,
                block_ms: int, lease: bool, headers: bool = False,
                groups: bool = False) -> list:
    """``GETJOB ... WITHCOUNTERS [WITHLEASE] [WITHHEADERS] [WITHGROUP]``,
    reply left raw: no Job object per job.

    The entries are ``[queue, id, body, "nacks", n, "additional-deliveries", m]``
    (then ``"next-requeue-within", ms`` with ``lease``, then ``"headers",
    [name, value, ...]`` with ``headers``, then ``"group-position", ctime,
    "group", key`` with ``groups``); turning them straight into Arrow
    columns costs a tenth of parsing them into :class:`disque.client.Job`
    objects first, which shows at 100k jobs per batch.
    """
    args: list = ["GETJOB"]
    args += ["TIMEOUT", block_ms] if block_ms > 0 else ["NOHANG"]
    args += ["COUNT", count, "WITHCOUNTERS"]
    if lease:
        args.append("WITHLEASE")
    if headers:
        args.append("WITHHEADERS")
    if groups:
        args.append("WITHGROUP")
    args += ["FROM", *queues]
    reply = client.execute_command(*args)
    if not reply:
        return []
    first = reply[0]
    size = ((_LEASED if lease else _PLAIN) + (2 if headers else 0)
            + (_GROUP_FIELDS if groups else 0))
    at = _headers_at(size, groups)
    if (len(first) != size
            or first[3] != b"nacks" or first[5] != b"additional-deliveries"
            or (lease and first[7] != b"next-requeue-within")
            or (headers and (first[at - 1] != b"headers" or not isinstance(first[at], list)))
            or (groups and (first[-4] != b"group-position" or first[-2] != b"group"))):
        raise ProtocolError(f"unexpected GETJOB WITHCOUNTERS entry: {first!r}")
    return reply


def _syntax_error(error: DisqueError) -> bool:
    """An original node (or an older one of ours) does not know an option
    (WITHLEASE, WITHHEADERS)."""
    return str(error).startswith("ERR syntax error")


def _refused_error(option: str, feature: str, getjob_option: str, address: str | None,
                   error: BaseException | str) -> OptionError:
    """``option`` against a node without ``feature`` (it refused GETJOB's
    ``getjob_option``): the query's error."""
    return OptionError(
        option, f"is true, but node {address} has no {feature}: it answered "
        f"GETJOB ... {getjob_option} with '{error}' (an original Disque node does; {feature} "
        f"are an extension of this server, docs/EXTENSIONS.md). Read it with {option}=false")


def headers_refused_error(address: str | None, error: BaseException | str) -> OptionError:
    """``includeHeaders`` against a node without job headers: the query's error."""
    return _refused_error("includeHeaders", "job headers", "WITHHEADERS", address, error)


def supports_headers(client: Client, queue: str) -> bool:
    """Does the node have job headers?  Asked without touching a job.

    ``GETJOB WITHHEADERS COUNT 0 FROM queue`` is refused either way: a node
    with headers parses WITHHEADERS, then refuses the count (``-ERR COUNT
    must be a number greater than zero``); one without stops at the
    unknown option (``-ERR syntax error``, the original's answer).
    """
    return _knows(client, "WITHHEADERS", queue)


def _knows(client: Client, option: str, queue: str) -> bool:
    """Does the node parse GETJOB's ``option``?  ``COUNT 0`` is refused
    after the options are read (:func:`supports_headers`): no job is taken."""
    try:
        client.execute_command("GETJOB", option, "COUNT", 0, "FROM", queue)
    except ConnectionFailed:
        raise
    except DisqueError as exc:
        return not _syntax_error(exc)
    return True


def groups_refused_error(address: str | None, error: BaseException | str) -> OptionError:
    """``includeGroups`` against a node without ordered groups: the query's error."""
    return _refused_error("includeGroups", "ordered groups", "WITHGROUP", address, error)


def supports_groups(client: Client, queue: str) -> bool:
    """Does the node have ordered groups (``GETJOB ... WITHGROUP``)?  Asked
    without touching a job, as :func:`supports_headers`."""
    return _knows(client, "WITHGROUP", queue)


def group_arrays(keys: list[bytes | None], positions: list[int | None]
                 ) -> tuple[pa.Array | pa.ChunkedArray, pa.Array]:
    """The staged ``group`` (binary, null without a group) and
    ``group_position`` (int64, null without a group) columns, built from
    buffers (no ``pa.array`` of a list: :func:`binary_array`).  Jobs without
    a group, all of them in a queue that has none, cost nothing per job."""
    count = len(keys)
    valid = np.fromiter((key is not None for key in keys), dtype=bool, count=count)
    if not valid.any():
        return null_groups(count)
    nulls = int(count - np.count_nonzero(valid))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    keys_array = binary_array([key if key is not None else b"" for key in keys])
    chunks = keys_array.chunks if isinstance(keys_array, pa.ChunkedArray) else [keys_array]
    if bitmap is not None:
        if len(chunks) > 1:  # past 2 GiB of keys: never with keys of 256 bytes at most
            raise ValueError("group keys past 2 GiB in one batch")
        _, offsets, data = chunks[0].buffers()
        keys_array = pa.Array.from_buffers(pa.binary(), count, [bitmap, offsets, data],
                                           null_count=nulls)
    values = np.array([p if p is not None else 0 for p in positions], dtype=np.int64)
    positions_array = pa.Array.from_buffers(pa.int64(), count, [bitmap, pa.py_buffer(values)],
                                            null_count=nulls)
    return keys_array, positions_array


_EMPTY_OFFSETS = np.zeros(1, dtype=np.int32)


def headers_array(flat_headers: list[list[bytes]]) -> pa.Array | pa.ChunkedArray:
    """Each job's flat headers (name, value, ...) as the ``headers`` column:
    a list of ``{key, value}`` per job, in order, repeats kept.

    Built from buffers (no ``pa.array`` of a list, which loads pandas, see
    :func:`binary_array`); names are checked as UTF-8 (the node only takes
    UTF-8 names).  Jobs without headers, the usual case, cost an offset each.
    """
    counts = np.fromiter(map(len, flat_headers), dtype=np.int64, count=len(flat_headers))
    if not counts.any():
        from .schema import empty_headers

        return empty_headers(len(flat_headers))
    items = list(itertools.chain.from_iterable(flat_headers))
    names, values = items[0::2], items[1::2]
    if sum(map(len, values)) + sum(map(len, names)) > _MAX_BINARY_BYTES:
        # Past 32-bit offsets (at most 64 KB of headers per job, but 100 000
        # jobs): one array per half of the jobs.
        half = len(flat_headers) // 2
        return pa.chunked_array([
            chunk for part in (flat_headers[:half], flat_headers[half:])
            for chunk in _chunks(headers_array(part))], headers_type())
    offsets = np.zeros(len(flat_headers) + 1, dtype=np.int32)
    np.cumsum(counts // 2, out=offsets[1:])
    entries = pa.StructArray.from_arrays([string_array(names), binary_array(values)],
                                         fields=list(headers_type().value_type))
    return pa.ListArray.from_arrays(
        pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]),
        entries, type=headers_type())


def _chunks(array: pa.Array | pa.ChunkedArray) -> list[pa.Array]:
    return array.chunks if isinstance(array, pa.ChunkedArray) else [array]


#: Above this many bytes a column no longer fits ``binary``'s 32-bit offsets.
_MAX_BINARY_BYTES = 2**31 - 1


def binary_array(values: list[bytes]) -> pa.Array | pa.ChunkedArray:
    """``pa.array(values, pa.binary())``, built from one joined buffer.

    Not ``pa.array`` on a list: its first call in a process imports pandas
    (pyarrow checks whether the list is a pandas object), 0.2-0.4 s in the
    fresh Python process Spark starts for every streaming query's driver
    side, on the path of its first batch.  The joined buffer is also about
    twice as fast (100 k IDs: 11-14 ms against 27 ms).
    """
    offsets = np.empty(len(values) + 1, dtype=np.int64)
    offsets[0] = 0
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)),
              out=offsets[1:])
    if offsets[-1] > _MAX_BINARY_BYTES:
        return pa.array(values, pa.binary())  # pyarrow splits it into chunks
    return pa.Array.from_buffers(pa.binary(), len(values), [
        None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(values))])


def int64_array(values: list[int]) -> pa.Array:
    """``pa.array(values, pa.int64())`` from a numpy buffer: no pandas import (above)."""
    return pa.Array.from_buffers(pa.int64(), len(values),
                                 [None, pa.py_buffer(np.array(values, dtype=np.int64))])


def string_array(values: list[bytes]) -> pa.Array | pa.ChunkedArray:
    """``pa.array(values, pa.string())`` for UTF-8 bytes, checked (``ArrowInvalid`` if not).

    Not ``binary_array(values).cast(pa.string())``: the first cast in a
    process imports ``pyarrow.compute``, which wraps every compute kernel at
    import (0.06-0.15 s here), in the fresh Python process Spark starts for
    every streaming query's driver side, on the path of its first batch.
    A string array has the binary array's buffers; the full validation
    checks the same UTF-8 the cast does.
    """
    return utf8_view(binary_array(values))  # over 2 GiB of names: a view per chunk


def binary_ids(column: pa.ChunkedArray) -> list[bytes]:
    """The job IDs of a staged table's string column, as bytes (no ``cast``: above)."""
    return [job_id for chunk in column.chunks for job_id in chunk.view(pa.binary()).to_pylist()]


def count_nonzero(column: pa.ChunkedArray) -> int:
    """Rows of a non-null int64 column that are not 0, read from its buffers.

    Not ``pyarrow.compute`` (its import, :func:`string_array`) nor
    ``to_numpy()``, which imports pandas (:func:`binary_array`).
    """
    if column.type != pa.int64() or column.null_count:
        raise TypeError(f"count_nonzero reads non-null int64 columns, not {column.type}")
    return sum(int(np.count_nonzero(np.frombuffer(chunk.buffers()[1], dtype=np.int64,
                                                  count=len(chunk), offset=chunk.offset * 8)))
               for chunk in column.chunks if len(chunk))


def _utf8_array(values: list[str]) -> pa.Array | pa.ChunkedArray:
    """``pa.array(values, pa.string())`` through :func:`string_array`.

    The client decoded names with ``surrogateescape``; encoding them back the
    same way gives the bytes the node sent, which are checked as UTF-8
    exactly as on the GETJOB path.
    """
    return string_array([v.encode("utf-8", "surrogateescape") for v in values])


def _timestamps(at_us: int, count: int) -> pa.Array:
    """``count`` times the UTC timestamp ``at_us``, without ``pa.scalar`` (pandas, above)."""
    return pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), count,
                                 [None, pa.py_buffer(np.full(count, at_us, dtype=np.int64))])


def _entries_to_table(entries: list, fetched_at_us: int, headers: bool = False,
                      groups: bool = False) -> pa.Table:
    """The staged table of raw GETJOB entries; ``headers``: stage their
    headers as the ``headers`` column; ``groups``: their group key and
    position (the entries' last fields) as the group columns."""
    # One flat list, then a C-level slice per column: no Python loop per job.
    flat = list(itertools.chain.from_iterable(entries))
    step = len(entries[0]) if entries else _PLAIN
    columns = [
        string_array(flat[0::step]),
        string_array(flat[1::step]),
        binary_array(flat[2::step]),
        int64_array(flat[4::step]),
        int64_array(flat[6::step]),
        _timestamps(fetched_at_us, len(entries)),
    ]
    if headers:
        columns.append(headers_array(flat[_headers_at(step, groups)::step]))
    if groups:
        columns.extend(group_arrays(flat[step - 1::step], flat[step - 3::step]))
    return pa.Table.from_arrays(columns, schema=staged_schema(headers, groups))


def _lease_deadline(entries: list, asked_at: float) -> float:
    """Monotonic time at which the first of ``entries`` (WITHLEASE) is due again.

    Counted from when the GETJOB was sent, before the node measured: early,
    never late.  ``inf`` if none of them is ever queued again (RETRY 0).
    """
    within = [entry[8] for entry in entries if entry[8] is not None]
    return asked_at + min(within) / 1000 if within else math.inf


@dataclass
class Fetched:
    """A fetch's staged table, and until when its jobs are surely leased."""

    table: pa.Table
    #: Monotonic time at which the node would first queue one of these jobs
    #: again (``inf``: never, all RETRY 0, or no jobs); ``None`` when the
    #: node did not say (an original node: the caller falls back on
    #: ``minJobRetry``).
    lease_until: float | None
    #: False when the node refused ``WITHLEASE``: do not ask it again.
    lease_supported: bool = True
    #: False when the node refused the ``WITHHEADERS`` asked for tracing
    #: alone: do not ask it again (its jobs get no links).
    headers_supported: bool = True


def _new_entries(got: list, seen: set[bytes]) -> list:
    """The entries of ``got`` whose job ID is not in ``seen`` (first copy
    kept), adding their IDs to ``seen``.

    A node queues a delivered job again when its RETRY runs out (counted
    from when it was last queued, so a job that waited long may be due
    again at once), and a later GETJOB of the same fetch can deliver it a
    second time: one job, one row.
    """
    ids = [entry[1] for entry in got]
    if seen.isdisjoint(ids) and len(set(ids)) == len(ids):  # the usual case
        seen.update(ids)
        return got
    fresh = []
    for entry, job_id in zip(got, ids, strict=True):
        if job_id not in seen:
            seen.add(job_id)
            fresh.append(entry)
    log.info("dropped %d jobs delivered twice to one batch", len(got) - len(fresh))
    return fresh


def fetch_jobs(client: Client, queues: tuple[str, ...] | list[str], limit: int | None, *,
               batch_size: int, block_ms: int = 0, lease: bool = False,
               seen: set[bytes] | None = None, headers: bool = False,
               trace: bool = True, groups: bool = False) -> Fetched:
    """Up to ``limit`` distinct jobs (``None``: until the queues are empty), as a staged table.

    Only the first GETJOB may block, and for at most ``block_ms`` (0: never),
    so an idle queue costs one cheap command per call and a busy one is
    drained with back-to-back ``GETJOB NOHANG COUNT n`` round trips.
    ``lease`` asks each job's lease (``WITHLEASE``, this server's
    extension); a node that refuses it is asked again without.

    ``headers`` (``includeHeaders``) stages each job's headers
    (``WITHHEADERS``, an extension too); a node that refuses them fails the
    fetch with :func:`headers_refused_error`, before any job is taken.
    When this process traces (:func:`.telemetry.tracer`) and ``trace`` is
    true, the headers are asked for anyway, for the ``receive`` span's
    links, and a node that refuses them is asked again without
    (``Fetched.headers_supported``).

    ``groups`` (``includeGroups``) stages each job's group key and position
    (``WITHGROUP``, an extension); a node that refuses it fails the fetch
    with :func:`groups_refused_error`, before any job is taken.

    ``seen`` holds the IDs (bytes) of jobs the caller already has (other
    nodes' share of the batch, a batch still running): a job delivered
    again is left out, and every ID fetched is added to it.  The limit
    counts distinct jobs.
    """
    entries: list = []
    first = True
    lease_until = math.inf
    supported = headers_supported = True
    tracing = telemetry.tracer() if trace else None
    ask_headers = headers or tracing is not None
    started_ns = time.time_ns()
    if seen is None:
        seen = set()
    while limit is None or len(entries) < limit:
        want = batch_size if limit is None else min(batch_size, limit - len(entries))
        asked_at = time.monotonic()
        try:
            got = _getjob_raw(client, queues, want, block_ms if first else 0, lease, ask_headers,
                              groups)
        except ConnectionFailed:
            if not entries:
                raise
            # Keep what we hold: those jobs are leased to us and staging
            # them is better than letting them wait out their RETRY.
            log.warning("node lost after fetching %d jobs; keeping those", len(entries))
            break
        except DisqueError as exc:
            if entries or not _syntax_error(exc):
                raise
            # Nothing was fetched yet: a node without an extension asked
            # for.  Groups first (the newest), then headers, then the lease.
            if groups:
                raise groups_refused_error(client.address, exc) from None
            if ask_headers:
                if headers:
                    raise headers_refused_error(client.address, exc) from None
                ask_headers = headers_supported = False
                continue
            if not lease:
                raise
            lease = supported = False
            continue
        first = False
        fresh = _new_entries(got, seen)
        if lease and fresh:
            lease_until = min(lease_until, _lease_deadline(fresh, asked_at))
        entries.extend(fresh)
        if len(got) < want:
            break
    table = _entries_to_table(entries, time.time_ns() // 1000, headers, groups)
    if tracing is not None and entries:
        # No span for a fetch that found nothing: an idle query polls.
        at = _headers_at(len(entries[0]), groups)
        tracing.receive(list(queues), client.address, started_ns,
                        ((e[1], e[0], e[4], e[6], e[at] if ask_headers else None)
                         for e in entries), len(entries))
    if entries and not lease:
        return Fetched(table, None, supported, headers_supported)
    return Fetched(table, lease_until, supported, headers_supported)  # no jobs: no lease


def fetch_table(client: Client, queues: tuple[str, ...] | list[str], limit: int | None, *,
                batch_size: int, block_ms: int = 0, headers: bool = False,
                groups: bool = False) -> pa.Table:
    """:func:`fetch_jobs`' table, without leases (batch drains: each fetch
    is acknowledged as soon as Spark took its rows, no heartbeat)."""
    return fetch_jobs(client, queues, limit, batch_size=batch_size, block_ms=block_ms,
                      headers=headers, groups=groups).table
