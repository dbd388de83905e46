"""How the CLI prints a reply: redis-cli's formatted and raw forms.

Formatted (``1) "x"``, ``(integer) 5``, ``(nil)``, ``(error) ERR ...``) is
redis-cli's ``cliFormatReplyTTY``; raw (bare values, one per line) its
``cliFormatReplyRaw``.  Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..exceptions import DisqueError

__all__ = ["Status", "always_raw", "format_raw", "format_reply", "format_tty", "quote"]


class Status(bytes):
    """A ``+status`` reply: printed without quotes, like redis-cli does."""


_ESCAPES = {0x5C: "\\\\", 0x22: '\\"', 0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t",
            0x07: "\\a", 0x08: "\\b"}


def quote(value: bytes) -> str:
    """A bulk string as redis-cli shows it: quoted, C escapes, ``\\xNN``."""
    out = ['"']
    for byte in value:
        if byte in _ESCAPES:
            out.append(_ESCAPES[byte])
        elif 0x20 <= byte < 0x7F:
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    out.append('"')
    return "".join(out)


def format_tty(reply: Any, prefix: str = "") -> str:
    """Human-readable form of a reply, ending with a newline."""
    if isinstance(reply, DisqueError):
        return f"(error) {reply}\n"
    if isinstance(reply, Status):
        return reply.decode("utf-8", "replace") + "\n"
    if isinstance(reply, bytes):
        return quote(reply) + "\n"
    if isinstance(reply, bool):
        return f"(integer) {int(reply)}\n"
    if isinstance(reply, int):
        return f"(integer) {reply}\n"
    if reply is None:
        return "(nil)\n"
    if isinstance(reply, list):
        if not reply:
            return "(empty array)\n"
        width = len(str(len(reply)))
        inner = prefix + " " * (width + 2)
        parts = []
        for i, element in enumerate(reply):
            parts.append(f"{prefix if i else ''}{i + 1:>{width}}) ")
            parts.append(format_tty(element, inner))
        return "".join(parts)
    return f"{reply}\n"


def format_raw(reply: Any) -> bytes:
    """Raw form: bare values, array elements one per line (no final newline)."""
    if isinstance(reply, DisqueError):
        return str(reply).encode()
    if isinstance(reply, bytes):
        return reply
    if reply is None:
        return b""
    if isinstance(reply, int):
        return str(int(reply)).encode()
    if isinstance(reply, list):
        return b"\n".join(format_raw(element) for element in reply)
    return str(reply).encode()


def format_reply(reply: Any, raw: bool) -> bytes:
    """The bytes to print for ``reply`` (with the trailing newline)."""
    if raw:
        return format_raw(reply) + b"\n"
    return format_tty(reply).encode("utf-8", "replace")


def always_raw(args: Sequence[bytes]) -> bool:
    """Commands whose text reply redis-cli prints verbatim even on a terminal."""
    names = [a.lower() for a in args[:2]]
    if names[:1] == [b"info"]:
        return True
    return len(names) == 2 and (names in ([b"cluster", b"nodes"], [b"cluster", b"info"],
                                          [b"client", b"list"], [b"client", b"info"]))
