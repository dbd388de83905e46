"""The rows the source produces: the Spark schema and its exact Arrow twin.

``read()`` yields ``pyarrow.RecordBatch`` objects (1.5-2x faster than tuples
on pyspark 4.3), and Spark checks that their schema *equals* the one it
expects, types and nullability included.  So the Arrow schema is derived
from the Spark schema with Spark's own converter, never written by hand.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

# STAGED_SCHEMA comes from the module's __getattr__ (below).
__all__ = ["source_schema", "arrow_schema", "empty_table", "to_rows", "utf8_view",  # noqa: F822
           "node_prefixes", "STAGED_SCHEMA", "HEADERS", "GROUP", "GROUP_POSITION",
           "headers_type", "staged_schema", "schema_of", "concat_staged", "empty_headers",
           "null_groups"]

#: The column ``includeHeaders`` adds, staged too (the job's headers, in order).
HEADERS = "headers"
#: The columns ``includeGroups`` adds, staged too: the job's ordered group
#: key (null without one) and its position in the group (``GETJOB ...
#: WITHGROUP``'s ``group-position``, the job's ctime; null without a group).
GROUP = "group"
GROUP_POSITION = "group_position"

# pyarrow (with numpy, 0.2-0.3 s) is imported on first use, not with this
# module: Spark asks for source_schema() in a process of its own at
# ``load()``, which needs no Arrow at all.


@functools.cache
def _staged_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field("queue", pa.string(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
        pa.field("nacks", pa.int64(), nullable=False),
        pa.field("additional_deliveries", pa.int64(), nullable=False),
        pa.field("fetched_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ])


@functools.cache
def headers_type() -> pa.DataType:
    """``array<struct<key: string, value: binary>>`` in Arrow, nothing nullable:
    exactly what Spark's converter makes of the ``headers`` column's type
    (tests/spark/test_headers_source.py keeps them equal), so staged headers
    go to Spark as they are, without a cast."""
    import pyarrow as pa

    entry = pa.struct([pa.field("key", pa.string(), nullable=False),
                       pa.field("value", pa.binary(), nullable=False)])
    return pa.list_(pa.field("element", entry, nullable=False))


@functools.cache
def staged_schema(headers: bool = False, groups: bool = False) -> pa.Schema:
    """The staged schema, with the ``headers`` column and/or the group
    columns or without.  A group key is staged as binary (a node takes any
    bytes): the rows check it as UTF-8, naming the job (:func:`to_rows`)."""
    import pyarrow as pa

    schema = _staged_schema()
    if headers:
        schema = schema.append(pa.field(HEADERS, headers_type(), nullable=False))
    if groups:
        schema = schema.append(pa.field(GROUP, pa.binary(), nullable=True))
        schema = schema.append(pa.field(GROUP_POSITION, pa.int64(), nullable=True))
    return schema


def __getattr__(name: str) -> pa.Schema:
    #: STAGED_SCHEMA: what a staged batch file holds, everything needed to
    #: rebuild the rows identically on replay.  Bodies stay binary here
    #: whatever ``bodyFormat`` is.  With ``includeHeaders`` a staged table
    #: has one more column, ``headers``, with ``includeGroups`` two more,
    #: ``group`` and ``group_position`` (:func:`staged_schema`); a batch
    #: staged without them (before the option was turned on) replays with
    #: empty headers and null groups.
    if name == "STAGED_SCHEMA":
        return _staged_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def schema_of(table: pa.Table) -> pa.Schema:
    """The staged schema of a staged table (which optional columns it has)."""
    names = table.column_names
    return staged_schema(HEADERS in names, GROUP in names)


def empty_table(headers: bool = False, groups: bool = False) -> pa.Table:
    """A staged table with no rows.

    Not ``Schema.empty_table()``: that imports pandas, 0.2-0.4 s in the
    fresh Python process Spark starts for each streaming query's driver
    side (see ``fetch.binary_array``).
    """
    import pyarrow as pa

    return pa.Table.from_batches([], schema=staged_schema(headers, groups))


def empty_headers(rows: int) -> pa.Array:
    """``rows`` empty header lists (jobs staged without their headers)."""
    import numpy as np
    import pyarrow as pa

    entries = headers_type().value_type
    children = pa.StructArray.from_arrays(
        [pa.Array.from_buffers(pa.string(), 0, [None, pa.py_buffer(np.zeros(1, np.int32)),
                                                 pa.py_buffer(b"")]),
         pa.Array.from_buffers(pa.binary(), 0, [None, pa.py_buffer(np.zeros(1, np.int32)),
                                                 pa.py_buffer(b"")])],
        fields=list(entries))
    offsets = pa.Array.from_buffers(pa.int32(), rows + 1,
                                    [None, pa.py_buffer(np.zeros(rows + 1, np.int32))])
    return pa.ListArray.from_arrays(offsets, children, type=headers_type())


def null_groups(rows: int) -> tuple[pa.Array, pa.Array]:
    """The group columns of ``rows`` jobs without a group (or staged without
    theirs): all null."""
    import pyarrow as pa

    return pa.nulls(rows, pa.binary()), pa.nulls(rows, pa.int64())


def concat_staged(tables: list[pa.Table]) -> pa.Table:
    """Staged tables as one: when some have ``headers`` (the parts a query
    staged with ``includeHeaders``), the others get empty ones; when some
    have the group columns (``includeGroups``), the others get nulls."""
    import pyarrow as pa

    headers = any(HEADERS in table.column_names for table in tables)
    groups = any(GROUP in table.column_names for table in tables)
    schema = staged_schema(headers, groups)
    out = []
    for table in tables:
        names = table.column_names
        if (headers and HEADERS not in names) or (groups and GROUP not in names):
            columns = [table.column(name) for name in _staged_schema().names]
            if headers:
                columns.append(table.column(HEADERS) if HEADERS in names
                               else empty_headers(table.num_rows))
            if groups:
                columns.extend(null_groups(table.num_rows))
            table = pa.Table.from_arrays(columns, schema=schema.with_metadata(
                table.schema.metadata or {}))
        out.append(table)
    return pa.concat_tables([empty_table(headers, groups), *out])


def source_schema(body_format: str = "binary", include_headers: bool = False,
                  include_groups: bool = False) -> StructType:
    """``queue, id, body, nacks, additional_deliveries, node, fetched_at``
    (and ``headers`` with ``include_headers``, then ``group`` and
    ``group_position`` with ``include_groups``).

    ``node`` is the 8-hex-char prefix of the ID of the node that created the
    job (from the job ID); ``fetched_at`` is when the connector took it from
    the queue (the lease start), the same on every replay of a batch.
    ``headers`` is the job's headers in order, a name as often as it was
    given (Kafka's shape, not a map: names repeat), empty for none.
    ``group`` is the job's ordered group key and ``group_position`` its
    place in the group (its ctime: sort by it, then ``id``), both null for
    a job without a group.
    """
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    body = StringType() if body_format == "string" else BinaryType()
    headers = [StructField(HEADERS, ArrayType(StructType([
        StructField("key", StringType(), False),
        StructField("value", BinaryType(), False)]), False), False)] if include_headers else []
    groups = [StructField(GROUP, StringType(), True),
              StructField(GROUP_POSITION, LongType(), True)] if include_groups else []
    return StructType([
        StructField("queue", StringType(), False),
        StructField("id", StringType(), False),
        StructField("body", body, False),
        StructField("nacks", LongType(), False),
        StructField("additional_deliveries", LongType(), False),
        StructField("node", StringType(), False),
        StructField("fetched_at", TimestampType(), False),
        *headers,
        *groups,
    ])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark will compare yielded batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def to_rows(staged: pa.Table, schema: StructType) -> pa.Table:
    """Turn a staged table into the source's rows (``schema`` order and types).

    Without ``pyarrow.compute`` (every ``cast`` goes through it): its import
    wraps every compute kernel (0.06-0.15 s), paid by each Python worker on
    its first batch and by the driver's query process on its first fetch.
    """
    import pyarrow as pa

    target = arrow_schema(schema)
    ids = staged.column("id")
    columns = {
        "queue": staged.column("queue"),
        "id": ids,
        "body": staged.column("body"),
        "nacks": staged.column("nacks"),
        "additional_deliveries": staged.column("additional_deliveries"),
        "node": node_prefixes(ids),
        "fetched_at": staged.column("fetched_at"),
    }
    if target.field("body").type != pa.binary():
        columns["body"] = _utf8_bodies(staged)
    if HEADERS in target.names:
        columns[HEADERS] = (staged.column(HEADERS) if HEADERS in staged.column_names
                            else empty_headers(staged.num_rows))
    if GROUP in target.names:
        if GROUP in staged.column_names:
            columns[GROUP] = _utf8_groups(staged)
            columns[GROUP_POSITION] = staged.column(GROUP_POSITION)
        else:  # staged before includeGroups was turned on
            columns[GROUP] = pa.nulls(staged.num_rows, pa.string())
            columns[GROUP_POSITION] = pa.nulls(staged.num_rows, pa.int64())
    arrays = [_as_type(columns[field.name], field.type) for field in target]
    return pa.Table.from_arrays(arrays, schema=target)


def _as_type(column: pa.Array | pa.ChunkedArray,
             type_: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``column`` (an Arrow array or chunked array) cast to ``type_`` only if it is
    not of that type already (a cast to the same type still loads
    ``pyarrow.compute``)."""
    return column if column.type == type_ else column.cast(type_)


def utf8_view(array: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """A binary (chunked) array as a string one (same buffers), checked as
    UTF-8 (``ArrowInvalid``).

    What ``array.cast(pa.string())`` does, without ``pyarrow.compute`` (above).
    """
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([utf8_view(chunk) for chunk in array.chunks], pa.string())
    strings = array.view(pa.string())
    strings.validate(full=True)
    return strings


#: Job IDs are D-<8 hex node prefix>-...: the prefix sits at [2:10].
_PREFIX_START, _PREFIX_END = 2, 10


def node_prefixes(ids: pa.ChunkedArray) -> pa.ChunkedArray:
    """Each job ID's node prefix (``id[2:10]``), gathered from the ID column's buffers."""
    import pyarrow as pa

    return pa.chunked_array([_chunk_prefixes(chunk) for chunk in ids.chunks if len(chunk)],
                            pa.string())


def _chunk_prefixes(chunk: pa.Array) -> pa.Array:
    import numpy as np
    import pyarrow as pa

    rows = len(chunk)
    offsets = (np.frombuffer(chunk.buffers()[1], dtype=np.int32, count=rows + 1,
                             offset=chunk.offset * 4)
               if chunk.type == pa.string() and not chunk.null_count else None)
    if offsets is not None and not bool((np.diff(offsets) < _PREFIX_END).any()):
        data = np.frombuffer(chunk.buffers()[2], dtype=np.uint8)
        heads = data[offsets[:-1, None] + np.arange(_PREFIX_END)]
        if not bool((heads >= 0x80).any()):
            width = _PREFIX_END - _PREFIX_START
            return pa.Array.from_buffers(pa.string(), rows, [
                None, pa.py_buffer(np.arange(0, width * rows + 1, width, dtype=np.int32)),
                pa.py_buffer(np.ascontiguousarray(heads[:, _PREFIX_START:]).tobytes())])
    # Not IDs a node makes (shorter, or not ASCII, where bytes are not
    # characters), or not a plain string array: Arrow's own slice.
    import pyarrow.compute as pc

    return _as_type(pc.utf8_slice_codeunits(chunk, _PREFIX_START, _PREFIX_END), pa.string())


def _utf8_groups(staged: pa.Table) -> pa.ChunkedArray:
    """Group keys as strings, naming the first job whose key is not UTF-8
    (a node takes any bytes as a key; the column is a string)."""
    import pyarrow as pa

    groups = staged.column(GROUP)
    try:
        return utf8_view(groups)
    except pa.ArrowInvalid:
        for job_id, key in zip(staged.column("id").to_pylist(), groups.to_pylist(),
                               strict=True):
            try:
                if key is not None:
                    key.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"disque source: job {job_id} has a group key that is not UTF-8 ({exc}); "
                    "the group column is a string: read this queue with "
                    "includeGroups=false") from None
        raise


def _utf8_bodies(staged: pa.Table) -> pa.ChunkedArray:
    """Bodies as strings (``bodyFormat=string``), naming the first job that is not UTF-8."""
    import pyarrow as pa

    bodies = staged.column("body")
    try:
        return utf8_view(bodies)
    except pa.ArrowInvalid:
        for job_id, body in zip(staged.column("id").to_pylist(), bodies.to_pylist(),
                                strict=True):
            try:
                body.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"disque source: job {job_id} has a body that is not UTF-8 ({exc}); "
                    "read it with bodyFormat=binary") from None
        raise
