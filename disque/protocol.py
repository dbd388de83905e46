"""Sans-IO RESP: turn received bytes into commands, and replies into bytes.

Nothing here does I/O, so it is tested with plain bytes.

Requests
--------
Clients send either RESP multi-bulk frames (``*2\\r\\n$4\\r\\nPING\\r\\n...``),
parsed by hiredis, or *inline* commands (``PING\\r\\n``), which tools such as
``telnet`` and health checks use.  hiredis cannot parse inline commands, so
the parser looks at the first byte of each new request: ``*`` hands the bytes
to hiredis until it has no partial frame left; anything else is an inline
line, split on whitespace like the original.

A malformed frame raises :class:`ProtocolError`; the connection that sent it
is closed after the error is written (the original does the same), other
connections are not affected.

Replies
-------
Handlers return plain Python values and :func:`encode` turns them into RESP2
or RESP3 bytes:

=====================  ===================  =======================
Python value           RESP2                RESP3
=====================  ===================  =======================
``Status("OK")``       ``+OK``              ``+OK``
``ReplyError(...)``    ``-ERR ...``         ``-ERR ...``
``int``                ``:1``               ``:1``
``bytes`` / ``str``    ``$3 abc``           ``$3 abc``
``None``               ``$-1`` (null bulk)  ``_``
``NULL_ARRAY``         ``*-1``              ``_``
``list`` / ``tuple``   ``*N ...``           ``*N ...``
``Map([...])``         flat ``*2N`` array   ``%N`` map
=====================  ===================  =======================

RESP3 clients (``HELLO 3``) therefore get real nulls and maps for the
key/value replies (SHOW, QSTAT, HELLO 3, JSCAN REPLY all); everything else
is identical to RESP2, which is what the original Disque speaks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import hiredis

__all__ = [
    "CommandParser",
    "Map",
    "NULL_ARRAY",
    "ProtocolError",
    "ReplyError",
    "Status",
    "encode",
    "OK",
]

CRLF = b"\r\n"

#: The original (like Redis) refuses inline requests longer than 64 KiB.
MAX_INLINE_SIZE = 64 * 1024
#: Largest argument count accepted in one multi-bulk request.
MAX_MULTIBULK_LENGTH = 1024 * 1024


class ProtocolError(Exception):
    """A request frame that cannot be parsed; the connection must be closed."""


class Status(str):
    """A RESP simple string (``+OK``); plain ``str`` values are bulk strings."""

    __slots__ = ()


class ReplyError:
    """A RESP error reply. ``message`` starts with the error code (``ERR``, ``NOJOB``...)."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"ReplyError({self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplyError) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY = _NullArray()


class Map(list):
    """Key/value pairs: a map for RESP3 clients, a flat array for RESP2 clients."""

    __slots__ = ()


OK = Status("OK")


class CommandParser:
    """Incremental request parser: ``feed(data)`` then ``commands()``.

    ``max_bulk_len`` bounds one argument and ``max_query_buffer`` the bytes a
    client may send before its request is complete.  Both protect the node
    from a client that would otherwise make it buffer without limit.
    """

    __slots__ = ("_inline", "_pending", "_reader", "max_bulk_len", "max_query_buffer")

    def __init__(self, max_bulk_len: int = 512 * 1024 * 1024,
                 max_query_buffer: int = 1024 * 1024 * 1024) -> None:
        self._reader: hiredis.Reader | None = None
        self._inline = bytearray()
        # Bytes fed to hiredis since it last produced a whole frame: an upper
        # bound for the size of the frame it is still waiting for.
        self._pending = 0
        self.max_bulk_len = max_bulk_len
        self.max_query_buffer = max_query_buffer

    def feed(self, data: bytes) -> list[list[bytes]]:
        """Consume ``data`` and return the complete commands it finished.

        Raises :class:`ProtocolError` for a malformed request; commands
        completed before the bad one are in ``err.commands``.
        """
        out: list[list[bytes]] = []
        try:
            self._feed(data, out)
        except ProtocolError as err:
            err.commands = out  # type: ignore[attr-defined]
            raise
        return out

    def _feed(self, data: bytes, out: list[list[bytes]]) -> None:
        while data:
            if self._reader is not None:
                data = self._feed_multibulk(data, out)
            elif self._inline or data[0] != 0x2A:  # not '*'
                data = self._feed_inline(data, out)
            else:
                self._reader = hiredis.Reader(protocolError=ProtocolError)
                self._pending = 0

    def _feed_multibulk(self, data: bytes, out: list[list[bytes]]) -> bytes:
        reader = self._reader
        assert reader is not None
        self._check_header(data)
        reader.feed(data)
        produced = False
        gets = reader.gets
        while True:
            try:
                frame = gets()
            except ProtocolError as err:
                self._reader = None
                raise ProtocolError(f"Protocol error: {err}") from None
            if frame is False:
                break
            produced = True
            if frame is None:  # "*-1\r\n": a null request, ignored like the original.
                continue
            if type(frame) is not list:
                self._reader = None
                raise ProtocolError("Protocol error: expected '*', got something else")
            for arg in frame:
                if type(arg) is not bytes:
                    self._reader = None
                    raise ProtocolError("Protocol error: expected '$', got something else")
            if frame:
                out.append(frame)
        if produced:
            self._pending = 0
        self._pending += len(data)
        if not reader.has_data():
            # No partial frame left: the next request may be inline again.
            self._reader = None
        elif self._pending > self.max_query_buffer:
            self._reader = None
            raise ProtocolError("Protocol error: query buffer limit reached")
        return b""

    def _check_header(self, data: bytes) -> None:
        """Reject absurd lengths before hiredis buffers them.

        Only the headers visible at the start of ``data`` are checked; that
        catches the common abuse (a huge declared length) cheaply.  Bodies
        that really are streamed in are bounded by ``max_query_buffer``.
        """
        if data[:1] == b"*":
            end = data.find(CRLF, 0, 32)
            if end > 0:
                count = _parse_int(data[1:end])
                if count is None or count > MAX_MULTIBULK_LENGTH:
                    self._reader = None
                    raise ProtocolError("Protocol error: invalid multibulk length")
                if data[end + 2:end + 3] == b"$":
                    end2 = data.find(CRLF, end + 2, end + 40)
                    if end2 > 0:
                        size = _parse_int(data[end + 3:end2])
                        if size is None or size > self.max_bulk_len:
                            self._reader = None
                            raise ProtocolError("Protocol error: invalid bulk length")
        elif data[:1] == b"$":
            end = data.find(CRLF, 0, 32)
            if end > 0:
                size = _parse_int(data[1:end])
                if size is None or size > self.max_bulk_len:
                    self._reader = None
                    raise ProtocolError("Protocol error: invalid bulk length")

    def _feed_inline(self, data: bytes, out: list[list[bytes]]) -> bytes:
        buf = self._inline
        nl = data.find(b"\n")
        if nl < 0:
            buf += data
            if len(buf) > MAX_INLINE_SIZE:
                buf.clear()
                raise ProtocolError("Protocol error: too big inline request")
            return b""
        buf += data[:nl]
        rest = data[nl + 1:]
        if len(buf) > MAX_INLINE_SIZE:
            buf.clear()
            raise ProtocolError("Protocol error: too big inline request")
        line = bytes(buf).rstrip(b"\r")
        buf.clear()
        args = split_inline(line)
        if args:
            out.append(args)
        return rest


def _parse_int(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None


def split_inline(line: bytes) -> list[bytes]:
    """Split an inline request like sdssplitargs: whitespace, "quotes", 'quotes'."""
    if b'"' not in line and b"'" not in line:
        return line.split()
    args: list[bytes] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i:i + 1].isspace():
            i += 1
        if i >= n:
            return args
        cur = bytearray()
        quote = 0
        while i < n:
            c = line[i]
            if quote == 0x22:  # "
                if c == 0x5C and i + 3 < n and line[i + 1] == 0x78 and _ishex(line[i + 2:i + 4]):
                    cur.append(int(line[i + 2:i + 4], 16))
                    i += 3
                elif c == 0x5C and i + 1 < n:
                    i += 1
                    cur.append(_ESCAPES.get(line[i], line[i]))
                elif c == 0x22:
                    if i + 1 < n and not line[i + 1:i + 2].isspace():
                        raise ProtocolError("Protocol error: unbalanced quotes in request")
                    quote = 0
                    i += 1
                    break
                else:
                    cur.append(c)
            elif quote == 0x27:  # '
                if c == 0x5C and i + 1 < n and line[i + 1] == 0x27:
                    i += 1
                    cur.append(0x27)
                elif c == 0x27:
                    if i + 1 < n and not line[i + 1:i + 2].isspace():
                        raise ProtocolError("Protocol error: unbalanced quotes in request")
                    quote = 0
                    i += 1
                    break
                else:
                    cur.append(c)
            else:
                if line[i:i + 1].isspace():
                    break
                if c in (0x22, 0x27):
                    quote = c
                else:
                    cur.append(c)
            i += 1
        if quote:
            raise ProtocolError("Protocol error: unbalanced quotes in request")
        args.append(bytes(cur))


_ESCAPES = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}


def _ishex(two: bytes) -> bool:
    return len(two) == 2 and all(ch in b"0123456789abcdefABCDEF" for ch in two)


# --------------------------------------------------------------------------
# Reply encoding
# --------------------------------------------------------------------------

_NULL_BULK = b"$-1\r\n"
_NULL_ARRAY2 = b"*-1\r\n"
_NULL3 = b"_\r\n"
_SMALL_INTS = [b":%d\r\n" % i for i in range(0, 1024)]


def encode(value: Any, resp3: bool = False) -> bytes:
    """Encode one reply value (see the module docstring for the mapping)."""
    out: list[bytes] = []
    _encode_into(value, out, resp3)
    return b"".join(out)


def _encode_into(value: Any, out: list[bytes], resp3: bool) -> None:
    t = type(value)
    if t is bytes:
        out.append(b"$%d\r\n%s\r\n" % (len(value), value))
    elif t is Status:
        out.append(b"+" + value.encode() + CRLF)
    elif t is int:
        if 0 <= value < 1024:
            out.append(_SMALL_INTS[value])
        else:
            out.append(b":%d\r\n" % value)
    elif t is str:
        raw = value.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    elif t is list or t is tuple:
        out.append(b"*%d\r\n" % len(value))
        for item in value:
            _encode_into(item, out, resp3)
    elif value is None:
        out.append(_NULL3 if resp3 else _NULL_BULK)
    elif t is Map:
        if resp3:
            out.append(b"%%%d\r\n" % (len(value) // 2))
        else:
            out.append(b"*%d\r\n" % len(value))
        for item in value:
            _encode_into(item, out, resp3)
    elif t is ReplyError:
        out.append(b"-" + value.message.replace("\r", " ").replace("\n", " ").encode() + CRLF)
    elif value is NULL_ARRAY:
        out.append(_NULL3 if resp3 else _NULL_ARRAY2)
    elif t is bool:
        out.append(_SMALL_INTS[int(value)])
    elif t is bytearray or t is memoryview:
        out.append(b"$%d\r\n%s\r\n" % (len(value), bytes(value)))
    elif isinstance(value, Iterable):
        items = list(value)
        _encode_into(items, out, resp3)
    else:  # pragma: no cover - a programming error, not client input
        raise TypeError(f"cannot encode reply of type {t.__name__}")
