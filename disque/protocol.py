"""Sans-IO RESP: turn received bytes into commands, and replies into bytes.

Nothing here does I/O, so it is tested with plain bytes.

Requests
--------
Clients send either RESP multi-bulk frames (``*2\r\n$4\r\nPING\r\n...``)
or *inline* commands (``PING\r\n``), which tools such as ``telnet`` and
health checks use: at a request boundary, ``*`` starts a multi-bulk frame
and anything else an inline line, split on whitespace like the original.
Multi-bulk frames are read header by header as the original's
``processMultibulkBuffer`` does, with a fast path that validates whole,
simple requests at C speed (see :class:`CommandParser`).

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
from typing import Any, Final

from .compiled import i64, mypyc_attr
from .replies import Map, Status

__all__ = [
    "integer_reply",
    "split_inline",
    "CommandParser",
    "Map",
    "NULL_ARRAY",
    "ProtocolError",
    "ReplyError",
    "Encoded",
    "Status",
    "array_header",
    "bulk_header",
    "encode",
    "status_reply",
    "OK",
]

#: Final (compiled: a C static rather than a module lookup per reply).
CRLF: Final = b"\r\n"

#: The original (like Redis) refuses inline requests longer than 64 KiB.
MAX_INLINE_SIZE: Final = 64 * 1024
#: Largest argument count accepted in one multi-bulk request.
MAX_MULTIBULK_LENGTH: Final = 1024 * 1024


class ProtocolError(Exception):
    """A request frame that cannot be parsed; the connection must be closed.

    ``commands``: the requests of the same read that were complete before
    the bad one (they still run, then the error is answered).
    """

    def __init__(self, message: str, commands: list[list[bytes]] | None = None) -> None:
        super().__init__(message)
        self.commands: list[list[bytes]] = commands if commands is not None else []


@mypyc_attr(acyclic=True)
class ReplyError:
    """A RESP error reply. ``message`` starts with the error code (``ERR``, ``NOJOB``...).

    Acyclic (for mypyc: not tracked by the cyclic collector), as
    :class:`Encoded`: it holds a string.
    """

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"ReplyError({self.message!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReplyError) and other.message == self.message

    def __hash__(self) -> int:
        return hash(self.message)


@mypyc_attr(acyclic=True)
class Encoded:
    """A reply already in RESP form, sent as it is.

    For ``+<job ID>``, the answer of every ADDJOB: made from the ID's bytes
    in one concatenation, where a Status needed the ID decoded, a str
    subclass instantiated (a Python-level call) and the text encoded back.
    Acyclic (for mypyc: not tracked by the cyclic collector, one per
    ADDJOB that the collector need not count or walk): it holds bytes.
    """

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __repr__(self) -> str:
        return f"Encoded({self.raw!r})"


def status_reply(text: bytes) -> Encoded:
    """``+text``: ``text`` (ASCII, no CR or LF) as a RESP simple string."""
    return Encoded(b"+" + text + CRLF)


class _NullArray:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NULL_ARRAY"


NULL_ARRAY: Final = _NullArray()


OK: Final = Status("OK")


#: Longest "*count" / "$len" header line accepted (digits + sign + CRLF).
MAX_HEADER_SIZE: Final = 32

#: What a client that has not authenticated may send (where a password is
#: needed): Redis's limits since 6.2.6 (CVE-2021-32675), so that nobody
#: without the password can make the node buffer more than a few KB.
PREAUTH_MAX_MULTIBULK: Final = 10
PREAUTH_MAX_BULK: Final = 16384


class CommandParser:
    """Incremental request parser: ``commands = parser.feed(data)``.

    The original's ``processMultibulkBuffer`` as a resumable state machine:
    a request is ``*count`` followed by ``count`` bulk strings, each
    ``$len`` + ``len`` bytes + CRLF.  Each header is checked when it is read
    (count, ``$`` type, length against ``max_bulk_len``), so a bad one is
    refused before anything is buffered for it, whatever argument it is.
    Anything not starting with ``*`` at a request boundary is an inline
    command.

    State between reads: the arguments read so far (``_args``), how many are
    still expected (``_argc``), the length of the bulk being read
    (``_bulklen``, -1 before its header), and the unparsed bytes.  A bulk
    body that arrives in many reads is collected as a list of chunks and
    joined once, so a large body costs O(size), not O(size x reads).

    Why not hiredis (used here before): hiredis is a *reply* parser.  It
    accepts any RESP type as an argument (``+simple``, ``=verbatim``) and
    does not say where a frame ends, so headers after the first could not be
    checked against the limits.  Measured per request when it replaced hiredis:
    this parser is faster for one request per read (the unpipelined case)
    and ~0.3 us slower per request in 16-deep pipelines.

    ``max_query_buffer`` bounds the bytes a client may send before its
    request is complete (arguments already read included).

    ``preauth`` (the connection has not authenticated and must): Redis's
    pre-auth limits (:data:`PREAUTH_MAX_MULTIBULK` arguments,
    :data:`PREAUTH_MAX_BULK` bytes each), and :meth:`feed` returns at most
    one request, keeping the rest of the read: the connection runs it (an
    AUTH may lift the limits) before the next one is parsed, as Redis parses
    and runs one request at a time.
    """

    __slots__ = (
        "_argbytes",
        "_argc",
        "_args",
        "_buf",
        "_bufpos",
        "_bulklen",
        "_chunked",
        "_chunks",
        "_partial_inline",
        "max_bulk_len",
        "max_query_buffer",
        "preauth",
    )

    def __init__(self, max_bulk_len: int = 512 * 1024 * 1024,
                 max_query_buffer: int = 1024 * 1024 * 1024) -> None:
        self.max_bulk_len = max_bulk_len
        self.max_query_buffer = max_query_buffer
        self.preauth = False
        self._reset()

    def _reset(self) -> None:
        self._buf = b""                     # unparsed bytes held from the last read
        # Where they start in ``_buf``: past 0 only before AUTH, where a
        # read is parsed one request at a time (not sliced per request).
        self._bufpos = 0
        # An inline line without its newline yet.  (Not "_inline": mypyc names
        # the C field "__inline", a keyword of GCC.)
        self._partial_inline = bytearray()
        self._args: list[bytes] | None = None
        self._argc = 0
        self._argbytes = 0
        self._bulklen = -1
        self._chunks: list[bytes] = []      # a bulk body arriving over several reads
        self._chunked = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of a request that is not complete yet."""
        return (len(self._buf) - self._bufpos + len(self._partial_inline) + self._chunked
                + self._argbytes)

    def feed(self, data: bytes) -> list[list[bytes]]:
        """Consume ``data`` and return the complete commands it finished.

        Raises :class:`ProtocolError` for a malformed request; commands
        completed before the bad one are in ``err.commands``.
        """
        out: list[list[bytes]] = []
        try:
            self._feed(data, out)
        except ProtocolError as err:
            err.commands = out
            self._reset()
            raise
        if ((self._args is not None or self._buf or self._partial_inline)
                and self.pending_bytes > self.max_query_buffer):
            self._reset()
            raise _error("Protocol error: query buffer limit reached", out)
        return out

    def _feed(self, data: bytes, out: list[list[bytes]]) -> None:
        start = 0
        if self._chunks:
            # The middle of a bulk body: wait until all of it (and its CRLF) is here.
            self._chunks.append(data)
            self._chunked += len(data)
            if self._chunked < self._bulklen + 2:
                return
            data = b"".join(self._chunks)
            self._chunks = []
            self._chunked = 0
        elif self._partial_inline:
            data = self._finish_inline(data, out)
        elif self._buf:
            held = self._buf
            start = self._bufpos
            self._buf = b""
            self._bufpos = 0
            if not data:
                data = held  # the rest of a read, a request at a time
            elif start:
                data = held[start:] + data
                start = 0
            else:
                data = held + data
        n = len(data)
        args = self._args
        pos = start
        max_bulk_len = self.max_bulk_len
        preauth = self.preauth
        one_request = False
        # After a request this read completes, whole requests may follow.
        fast = args is not None and not preauth
        if args is None and not preauth:
            pos = _whole_requests(data, pos, max_bulk_len, out)
            if pos == n:
                return  # whole requests only (the usual read): nothing to hold
        argc = self._argc
        bulklen = self._bulklen
        argbytes = self._argbytes
        find = data.find
        while True:
            if args is None:
                # A request boundary.
                if pos >= n:
                    break
                if preauth and out:
                    one_request = True  # before AUTH: one request at a time
                    break
                if fast:
                    # The request this read continued is complete.  What
                    # follows is usually whole requests again: pipelined
                    # commands larger than a read (ACKJOB of 1,000 IDs is
                    # 47 KB) would otherwise never take the fast path.
                    fast = False
                    pos = _whole_requests(data, pos, max_bulk_len, out)
                    if pos >= n:
                        break
                if data[pos] != 0x2A:  # not '*': an inline command
                    nl = find(b"\n", pos, pos + MAX_INLINE_SIZE + 1)
                    if nl < 0:
                        if n - pos > MAX_INLINE_SIZE:
                            raise ProtocolError("Protocol error: too big inline request")
                        self._partial_inline += data[pos:]
                        pos = n
                        break
                    line = data[pos:nl]
                    pos = nl + 1
                    command = split_inline(line[:-1] if line[-1:] == b"\r" else line)
                    if command:
                        out.append(command)
                    continue
                nl = find(b"\r\n", pos, pos + MAX_HEADER_SIZE)
                if nl < 0:
                    if n - pos >= MAX_HEADER_SIZE:
                        raise ProtocolError("Protocol error: invalid multibulk length")
                    break
                count = _header_int(data[pos + 1:nl])
                if count is None or count > MAX_MULTIBULK_LENGTH:
                    raise ProtocolError("Protocol error: invalid multibulk length")
                if preauth and count > PREAUTH_MAX_MULTIBULK:
                    raise ProtocolError("Protocol error: unauthenticated multibulk length")
                pos = nl + 2
                if count <= 0:
                    continue  # "*0" and "*-1" are ignored, like the original
                args = []
                argc = count
                argbytes = 0
            # The arguments.
            while argc:
                if bulklen < 0:
                    nl = find(b"\r\n", pos, pos + MAX_HEADER_SIZE)
                    if nl < 0:
                        if n - pos >= MAX_HEADER_SIZE:
                            raise ProtocolError("Protocol error: invalid bulk length")
                        if pos < n and data[pos] != 0x24:
                            raise _not_bulk(data[pos])
                        break
                    if data[pos] != 0x24:  # '$'
                        raise _not_bulk(data[pos])
                    parsed = _header_int(data[pos + 1:nl])
                    if parsed is None or not 0 <= parsed <= max_bulk_len:
                        raise ProtocolError("Protocol error: invalid bulk length")
                    if preauth and parsed > PREAUTH_MAX_BULK:
                        raise ProtocolError("Protocol error: unauthenticated bulk length")
                    bulklen = parsed
                    pos = nl + 2
                end = pos + bulklen
                if end + 2 > n:
                    break
                if data[end] != 0x0D or data[end + 1] != 0x0A:
                    raise ProtocolError("Protocol error: expected CRLF after a bulk string")
                args.append(data[pos:end])
                argbytes += bulklen
                pos = end + 2
                bulklen = -1
                argc -= 1
            if argc:
                break  # the request continues in the next read
            out.append(args)
            args = None
            argbytes = 0
        self._args = args
        self._argc = argc
        self._bulklen = bulklen
        self._argbytes = argbytes
        if one_request:
            # The rest of the read stays where it is: slicing it off for
            # every request would cost its length each time (the square of
            # a read of small requests: seconds for one of 1 MB).
            self._buf = data
            self._bufpos = pos
        elif pos < n:
            rest = data[pos:]
            if bulklen >= 0:
                self._chunks = [rest]  # inside a bulk body
                self._chunked = len(rest)
            else:
                self._buf = rest

    def _finish_inline(self, data: bytes, out: list[list[bytes]]) -> bytes:
        """Complete the inline line held from previous reads; return what follows it."""
        buf = self._partial_inline
        nl = data.find(b"\n")
        if nl < 0:
            buf += data
            if len(buf) > MAX_INLINE_SIZE:
                raise ProtocolError("Protocol error: too big inline request")
            return b""
        buf += data[:nl]
        if len(buf) > MAX_INLINE_SIZE:
            raise ProtocolError("Protocol error: too big inline request")
        line = bytes(buf).rstrip(b"\r")
        buf.clear()
        command = split_inline(line)
        if command:
            out.append(command)
        return data[nl + 1:]


#: The longest ``*count`` / ``$len`` value the fast path reads (longer ones,
#: legal or not, go to the exact parser): 18 digits fit an ``i64``.
_FAST_MAX_DIGITS: Final = 18


def _whole_requests(data: bytes, start: i64, max_bulk_len: i64,
                    out: list[list[bytes]]) -> i64:
    """The fast path: append the complete, well-formed requests from ``data[start:]``.

    Returns where the first request it did not take starts (``len(data)``
    when it took them all, the usual read).  It walks the bytes once, in
    compiled code: ``*count`` CRLF, then per argument ``$len`` CRLF, ``len``
    bytes, CRLF, and slices each body out of ``data``.  Whatever it does not
    recognise (an inline command, a request cut by the end of the read, a
    header the original would refuse, a body over ``max_bulk_len``) stops it
    at that request's first byte: the exact parser goes on from there and
    reports the error, so both parsers accept exactly the same requests.
    """
    n: i64 = len(data)
    pos = start
    while pos < n:
        if data[pos] != 0x2A:  # '*'
            break
        count, p = _decimal(data, pos + 1, n)
        if count <= 0 or count > MAX_MULTIBULK_LENGTH:
            break
        args: list[bytes] = []
        while count:
            if p >= n or data[p] != 0x24:  # '$'
                break
            size, p = _decimal(data, p + 1, n)
            if size < 0 or size > max_bulk_len:
                break
            end = p + size
            if end + 1 >= n or data[end] != 0x0D or data[end + 1] != 0x0A:
                break
            args.append(data[p:end])
            p = end + 2
            count -= 1
        if count:
            break
        out.append(args)
        pos = p
    return pos


def _decimal(data: bytes, pos: i64, n: i64) -> tuple[i64, i64]:
    """The header value at ``data[pos:]`` and the position after its CRLF.

    The value is -1 where the fast path must leave the header to the exact
    parser: no digits, a sign, a leading zero (refused by the original's
    string2ll), more than :data:`_FAST_MAX_DIGITS` digits, anything before
    the CRLF, or the end of the read.
    """
    value: i64 = 0
    i = pos
    limit = min(pos + _FAST_MAX_DIGITS, n)
    while i < limit:
        c: i64 = data[i]
        if c < 0x30 or c > 0x39:
            break
        value = value * 10 + (c - 0x30)
        i += 1
    digits = i - pos
    if (digits == 0 or (digits > 1 and data[pos] == 0x30)
            or i + 1 >= n or data[i] != 0x0D or data[i + 1] != 0x0A):
        return -1, pos
    return value, i + 2


def _error(message: str, commands: list[list[bytes]]) -> ProtocolError:
    return ProtocolError(message, commands)


def _not_bulk(byte: int) -> ProtocolError:
    return ProtocolError(f"Protocol error: expected '$', got '{chr(byte)}'")


def _header_int(raw: bytes) -> int | None:
    """A ``*count`` / ``$len`` value, strict like the original's string2ll."""
    if raw.isdigit():
        if raw[0] == 0x30 and len(raw) > 1:  # no leading zeros
            return None
        return int(raw)
    if raw[:1] == b"-" and raw[1:].isdigit() and raw[1] != 0x30:
        return -int(raw[1:])
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


_ESCAPES: Final = {ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("b"): 8, ord("a"): 7}


def _ishex(two: bytes) -> bool:
    return len(two) == 2 and all(ch in b"0123456789abcdefABCDEF" for ch in two)


# --------------------------------------------------------------------------
# Reply encoding
# --------------------------------------------------------------------------

_NULL_BULK: Final = b"$-1\r\n"
_NULL_ARRAY2: Final = b"*-1\r\n"
_NULL3: Final = b"_\r\n"
_SMALL_INTS: Final = [b":%d\r\n" % i for i in range(0, 1024)]
#: Reply headers of the usual sizes, looked up rather than formatted: a
#: ``b"$%d\r\n%s\r\n" % (...)`` costs a tuple, the format's parsing and a
#: copy of the value, a third of encoding a GETJOB reply.  Final (compiled:
#: C statics).
_REPLY_HEADERS_MAX: Final = 1024
_BULK_REPLY_HEADERS: Final = [b"$%d\r\n" % n for n in range(_REPLY_HEADERS_MAX)]
_ARRAY_REPLY_HEADERS: Final = [b"*%d\r\n" % n for n in range(_REPLY_HEADERS_MAX)]


def bulk_header(size: int) -> bytes:
    """``$<size>\r\n``: the header of a bulk string of ``size`` bytes."""
    return _BULK_REPLY_HEADERS[size] if size < _REPLY_HEADERS_MAX else b"$%d\r\n" % size


def integer_reply(value: int) -> bytes:
    """``:<value>\r\n``: an integer reply (the same in RESP2 and RESP3)."""
    return _SMALL_INTS[value] if 0 <= value < 1024 else b":%d\r\n" % value


def array_header(size: int) -> bytes:
    """``*<size>\r\n``: the header of an array of ``size`` elements."""
    return _ARRAY_REPLY_HEADERS[size] if size < _REPLY_HEADERS_MAX else b"*%d\r\n" % size


def _bulk_into(value: bytes, out: list[bytes]) -> None:
    """``$<len>\r\n<value>\r\n``, as three pieces of ``out`` (joined once, at the end)."""
    out.append(bulk_header(len(value)))
    out.append(value)
    out.append(CRLF)


def _array_into(items: list[Any], out: list[bytes], resp3: bool) -> None:
    """An array reply; typed as a list, so compiled its loop indexes the list directly."""
    out.append(array_header(len(items)))
    for item in items:
        if type(item) is bytes:  # most elements (GETJOB entries): no recursion
            _bulk_into(item, out)
        else:
            _encode_into(item, out, resp3)


def _utf8(text: str) -> bytes:
    """Text to bytes; client bytes decoded with surrogateescape come back as sent."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape")


def encode(value: Any, resp3: bool = False) -> bytes:
    """Encode one reply value (see the module docstring for the mapping)."""
    if type(value) is Encoded:  # ADDJOB's ID: the commonest reply
        return value.raw
    if type(value) is Status:  # +OK, +PONG
        return b"+" + value.encode() + CRLF
    out: list[bytes] = []
    _encode_into(value, out, resp3)
    return b"".join(out)


def _encode_into(value: Any, out: list[bytes], resp3: bool) -> None:
    t = type(value)
    if t is bytes:
        _bulk_into(value, out)
    elif t is Status:
        out.append(b"+" + value.encode() + CRLF)
    elif t is int:
        if 0 <= value < 1024:
            out.append(_SMALL_INTS[value])
        else:
            out.append(b":%d\r\n" % value)
    elif t is str:
        _bulk_into(_utf8(value), out)
    elif t is list:
        _array_into(value, out, resp3)
    elif t is tuple:
        _array_into(list(value), out, resp3)
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
    elif t is Encoded:
        out.append(value.raw)
    elif t is bool:
        out.append(_SMALL_INTS[int(value)])
    elif t is bytearray or t is memoryview:
        out.append(b"$%d\r\n%s\r\n" % (len(value), bytes(value)))
    elif isinstance(value, Iterable):
        items = list(value)
        _encode_into(items, out, resp3)
    else:  # pragma: no cover - a programming error, not client input
        raise TypeError(f"cannot encode reply of type {t.__name__}")
