"""RESP built from Arrow columns: the sink's commands without a Python object per row.

A column of values becomes a column of RESP bulk strings
(``$<len>\\r\\n<value>\\r\\n``) in a few Arrow kernels; the values buffer of
that column, sliced, *is* the argument list of a command (``ADDJOBS``'s
bodies) or, with a constant prefix and suffix joined to each element, a
whole pipeline of ``ADDJOB``s.  Everything here works on ``large_binary``
arrays (64-bit offsets), whatever the input type was.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BINARY", "as_binary", "bulk_strings", "concatenated", "encode_args", "join",
           "numbered", "decimal", "row_concat", "append_to_rows"]

BINARY = pa.large_binary()
_EMPTY = pa.scalar(b"", BINARY)
_DOLLAR = pa.scalar(b"$", BINARY)
_CRLF = pa.scalar(b"\r\n", BINARY)


def scalar(value: bytes) -> pa.Scalar:
    return pa.scalar(value, BINARY)


def as_binary(column: pa.Array) -> pa.Array:
    """A string or binary column as ``large_binary``: UTF-8 text already is
    the bytes sent, so this copies offsets at most."""
    return column if column.type == BINARY else column.cast(BINARY)


def _decimal(numbers: pa.Array) -> pa.Array:
    return pc.cast(pc.cast(numbers, pa.large_string()), BINARY)


def decimal(numbers: pa.Array) -> pa.Array:
    """Integers as their decimal text (``large_binary``)."""
    return _decimal(numbers)


def bulk_strings(values: pa.Array) -> pa.Array:
    """Each value as one RESP bulk string (no nulls allowed)."""
    return pc.binary_join_element_wise(_DOLLAR, _decimal(pc.binary_length(values)), _CRLF,
                                       values, _CRLF, _EMPTY)


def join(*parts: pa.Array | pa.Scalar, separator: bytes = b"") -> pa.Array:
    """Element-wise concatenation of columns and constants."""
    return pc.binary_join_element_wise(*parts, scalar(separator))


def numbered(prefix: bytes, first: int, count: int) -> pa.Array:
    """``prefix + str(first + i)`` for i in range(count)."""
    numbers = pa.array(np.arange(first, first + count, dtype=np.int64))
    return join(scalar(prefix), _decimal(numbers))


def concatenated(values: pa.Array) -> memoryview:
    """The values of a ``large_binary`` array back to back, without a copy."""
    _, offsets, data = values.buffers()
    if data is None:  # every value empty: Arrow may omit the buffer
        return memoryview(b"")
    ends = np.frombuffer(offsets, np.int64, count=len(values) + 1, offset=values.offset * 8)
    return memoryview(data)[int(ends[0]):int(ends[-1])]


def encode_args(args: Sequence[bytes]) -> bytes:
    """Arguments as RESP bulk strings (no array header)."""
    return b"".join([b"$%d\r\n%s\r\n" % (len(a), a) for a in args])


def _value_offsets(values: pa.Array) -> np.ndarray:
    """A ``large_binary`` array's offsets (``len + 1``, its slice offset applied)."""
    return np.frombuffer(values.buffers()[1], np.int64, count=len(values) + 1,
                         offset=values.offset * 8)


def row_concat(lists: pa.ListArray, prefix: pa.Scalar | None = None) -> pa.Array:
    """Each row's ``large_binary`` elements back to back (``prefix`` before
    each element when given), as one ``large_binary`` value per row.

    The elements of a row are contiguous in the list's values, so each
    row's bytes are a slice of their data: new offsets, no copy (with a
    ``prefix``, the values are encoded again once).
    """
    values = lists.values
    if prefix is not None:
        values = join(prefix, values)
    rows = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    ends = _value_offsets(values)[rows]
    data = values.buffers()[2] if len(values) else None
    return pa.Array.from_buffers(BINARY, len(lists), [
        None, pa.py_buffer(np.ascontiguousarray(ends)), data or pa.py_buffer(b"")])


def append_to_rows(lists: pa.ListArray | None, rows: int, where: np.ndarray,
                   extra: pa.Array) -> pa.ListArray:
    """``lists`` (None: ``rows`` empty lists) with the elements of ``extra``
    appended to the rows where ``where`` is true."""
    if lists is None:
        offsets = np.zeros(rows + 1, dtype=np.int64)
        values = extra.slice(0, 0)
    else:
        offsets = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        values = lists.values
    counts = np.diff(offsets)
    added = len(extra) * where.astype(np.int64)
    new_offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(counts + added, out=new_offsets[1:])
    total = int(new_offsets[-1])
    row_of = np.repeat(np.arange(rows), counts + added)
    position = np.arange(total) - new_offsets[:-1][row_of]
    own = position < counts[row_of]
    indexes = np.where(own, offsets[:-1][row_of] + position,
                       len(values) + position - counts[row_of])
    children = pa.concat_arrays([values, extra]).take(pa.array(indexes))
    return pa.ListArray.from_arrays(pa.array(new_offsets.astype(np.int32)), children)
