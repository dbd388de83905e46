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
from typing import Any, NoReturn

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
    """Incremental request parser: ``commands = parser.feed(data)``.

    hiredis parses multi-bulk frames but does not say where one frame ends
    inside the bytes it was fed.  The parser needs that to know when the
    next request may be an inline command, so it counts: every completed
    frame has an exact encoded size (clients encode canonically), and
    ``_unparsed`` (bytes fed minus bytes of completed frames) is zero exactly
    at a request boundary.

    Limits: ``max_bulk_len`` bounds the declared argument count and length of
    each request's headers (checked before hiredis buffers anything) and
    ``max_query_buffer`` the bytes a client may send before its request is
    complete.  Both protect the node from a client that would otherwise make
    it buffer without limit.
    """

    __slots__ = ("_head", "_inline", "_reader", "_unparsed", "max_bulk_len",
                 "max_query_buffer")

    def __init__(self, max_bulk_len: int = 512 * 1024 * 1024,
                 max_query_buffer: int = 1024 * 1024 * 1024) -> None:
        self._reader = hiredis.Reader(protocolError=ProtocolError)
        self._inline = bytearray()
        # The start of a request whose headers are not complete yet; held
        # back until they can be checked (a few dozen bytes at most).
        self._head = b""
        self._unparsed = 0
        self.max_bulk_len = max_bulk_len
        self.max_query_buffer = max_query_buffer

    @property
    def pending_bytes(self) -> int:
        """Bytes of a request that is not complete yet."""
        return self._unparsed + len(self._inline) + len(self._head)

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
            if self._unparsed or self._head:
                data = self._feed_multibulk(data, out)
            elif self._inline or data[0] != 0x2A:  # not '*': an inline command
                data = self._feed_inline(data, out)
            else:
                data = self._feed_multibulk(data, out)

    def _feed_multibulk(self, data: bytes, out: list[list[bytes]]) -> bytes:
        if self._unparsed == 0:
            # At a request boundary: check the headers before buffering.
            if self._head:
                data = self._head + data
                self._head = b""
            if not self._headers_ok(data):
                self._head = data  # too short to judge yet
                return b""
        reader = self._reader
        reader.feed(data)
        unparsed = self._unparsed + len(data)
        gets = reader.gets
        while True:
            try:
                frame = gets()
            except ProtocolError as err:
                # After complete frames, a non-'*' byte may start an inline
                # command (clients may mix the two): resume there.
                boundary = len(data) - unparsed
                if 0 < boundary < len(data) and data[boundary] != 0x2A:
                    self._reader = hiredis.Reader(protocolError=ProtocolError)
                    self._unparsed = 0
                    return data[boundary:]
                self._fail(f"Protocol error: {err}")
            if frame is False:
                break
            if frame is None:  # "*-1": a null request, ignored like the original
                unparsed -= 5
                continue
            if type(frame) is not list:
                self._fail("Protocol error: expected '*', got something else")
            size = _digits(len(frame)) + 3
            for arg in frame:
                if type(arg) is not bytes:
                    self._fail("Protocol error: expected '$', got something else")
                n = len(arg)
                size += _digits(n) + n + 5
            unparsed -= size
            if frame:
                out.append(frame)
        if unparsed < 0:
            # Shorter than its canonical encoding: an element was not a bulk
            # string (e.g. "+PING" inside a request).
            self._fail("Protocol error: expected '$', got something else")
        self._unparsed = unparsed
        if unparsed > self.max_query_buffer:
            self._fail("Protocol error: query buffer limit reached")
        return b""

    def _headers_ok(self, data: bytes) -> bool:
        """Check ``*count`` and the first ``$len``; False if more bytes are needed."""
        end = data.find(CRLF, 0, 32)
        if end < 0:
            if len(data) >= 32:
                self._fail("Protocol error: invalid multibulk length")
            return False
        count = _parse_int(data[1:end])
        if count is None or count > MAX_MULTIBULK_LENGTH:
            self._fail("Protocol error: invalid multibulk length")
        if count <= 0:
            return True
        start = end + 2
        if len(data) <= start:
            return False
        if data[start] != 0x24:  # '$'
            return True  # hiredis reports the bad element type
        end2 = data.find(CRLF, start, start + 32)
        if end2 < 0:
            if len(data) >= start + 32:
                self._fail("Protocol error: invalid bulk length")
            return False
        size = _parse_int(data[start + 1:end2])
        if size is None or size > self.max_bulk_len:
            self._fail("Protocol error: invalid bulk length")
        return True

    def _fail(self, message: str) -> NoReturn:
        self._reader = hiredis.Reader(protocolError=ProtocolError)
        self._unparsed = 0
        self._head = b""
        self._inline.clear()
        raise ProtocolError(message)

    def _feed_inline(self, data: bytes, out: list[list[bytes]]) -> bytes:
        buf = self._inline
        nl = data.find(b"\n")
        if nl < 0:
            buf += data
            if len(buf) > MAX_INLINE_SIZE:
                self._fail("Protocol error: too big inline request")
            return b""
        buf += data[:nl]
        rest = data[nl + 1:]
        if len(buf) > MAX_INLINE_SIZE:
            self._fail("Protocol error: too big inline request")
        line = bytes(buf).rstrip(b"\r")
        buf.clear()
        args = split_inline(line)
        if args:
            out.append(args)
        return rest


def _digits(n: int) -> int:
    """Decimal digits of a non-negative int (the length of its RESP header)."""
    if n < 10:
        return 1
    if n < 100:
        return 2
    if n < 1000:
        return 3
    return len(str(n))


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


def _utf8(text: str) -> bytes:
    """Text to bytes; client bytes decoded with surrogateescape come back as sent."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


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
        raw = _utf8(value)
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
        message = value.message.replace("\r", " ").replace("\n", " ")
        out.append(b"-" + _utf8(message) + CRLF)
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
