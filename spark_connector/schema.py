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
__all__ = ["source_schema", "arrow_schema", "empty_table", "STAGED_SCHEMA"]  # noqa: F822

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


def __getattr__(name: str) -> pa.Schema:
    #: STAGED_SCHEMA: what a staged batch file holds, everything needed to
    #: rebuild the rows identically on replay.  Bodies stay binary here
    #: whatever ``bodyFormat`` is.
    if name == "STAGED_SCHEMA":
        return _staged_schema()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def empty_table() -> pa.Table:
    """A staged table with no rows.

    Not ``Schema.empty_table()``: that imports pandas, 0.2-0.4 s in the
    fresh Python process Spark starts for each streaming query's driver
    side (see ``fetch.binary_array``).
    """
    import pyarrow as pa

    return pa.Table.from_batches([], schema=_staged_schema())


def source_schema(body_format: str = "binary") -> StructType:
    """``queue, id, body, nacks, additional_deliveries, node, fetched_at``.

    ``node`` is the 8-hex-char prefix of the ID of the node that created the
    job (from the job ID); ``fetched_at`` is when the connector took it from
    the queue (the lease start), the same on every replay of a batch.
    """
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    body = StringType() if body_format == "string" else BinaryType()
    return StructType([
        StructField("queue", StringType(), False),
        StructField("id", StringType(), False),
        StructField("body", body, False),
        StructField("nacks", LongType(), False),
        StructField("additional_deliveries", LongType(), False),
        StructField("node", StringType(), False),
        StructField("fetched_at", TimestampType(), False),
    ])


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark will compare yielded batches against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def to_rows(staged: pa.Table, schema: StructType) -> pa.Table:
    """Turn a staged table into the source's rows (``schema`` order and types)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    target = arrow_schema(schema)
    ids = staged.column("id")
    columns = {
        "queue": staged.column("queue"),
        "id": ids,
        "body": staged.column("body"),
        "nacks": staged.column("nacks"),
        "additional_deliveries": staged.column("additional_deliveries"),
        # Job IDs are D-<8 hex node prefix>-...: the prefix sits at [2:10].
        "node": pc.utf8_slice_codeunits(ids, 2, 10),
        "fetched_at": staged.column("fetched_at"),
    }
    if target.field("body").type != pa.binary():
        columns["body"] = _utf8_bodies(staged)
    arrays = [columns[field.name].cast(field.type) for field in target]
    return pa.Table.from_arrays(arrays, schema=target)


def _utf8_bodies(staged: pa.Table) -> pa.ChunkedArray:
    """Bodies as strings (``bodyFormat=string``), naming the first job that is not UTF-8."""
    import pyarrow as pa

    bodies = staged.column("body")
    try:
        return bodies.cast(pa.string())
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
