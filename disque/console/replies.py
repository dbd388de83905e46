"""RESP for the console's pipelines and the shape of raw replies (no I/O).

The client's ``send_pipeline`` sends commands the caller encoded and hands
back raw replies; the queue table asks thousands of QSTATs that way, one
round trip per batch instead of one per queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["encode", "pairs", "text", "number"]


def _arg(value: str | bytes | int) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, int):
        return str(value).encode()
    return value.encode("utf-8", "surrogateescape")


def encode(commands: Iterable[Sequence[str | bytes | int]]) -> bytes:
    """The RESP multi-bulk frames of ``commands``, back to back."""
    out: list[bytes] = []
    for command in commands:
        args = [_arg(a) for a in command]
        out.append(b"*%d\r\n" % len(args))
        for arg in args:
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def text(value: Any) -> str:
    """A reply element as text (names survive any bytes: surrogateescape)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return "" if value is None else str(value)


def number(value: Any, default: int = 0) -> int:
    """A reply element as an int (``default`` when it is not one)."""
    if isinstance(value, int):
        return value
    try:
        return int(text(value))
    except ValueError:
        return default


def pairs(reply: Any) -> dict[str, Any] | None:
    """A flat key/value array (QSTAT, SHOW) as a dict with text keys, or None.

    Values stay as the node sent them (bytes, ints, lists): the caller knows
    which are text.  Anything that is not such an array is None, never an
    exception: a node's odd reply must not crash a page.
    """
    if not isinstance(reply, list) or len(reply) % 2:
        return None
    return {text(k): v for k, v in zip(reply[::2], reply[1::2], strict=True)}
