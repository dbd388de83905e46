"""Sans-IO tests of ``disque.protocol``: request parsing and reply encoding with plain bytes.

The parser must give the same commands however the bytes are cut into
reads (TCP guarantees nothing about boundaries), keep inline and multi-bulk
requests apart inside one read, enforce its limits on every header, and
report malformed frames with ``ProtocolError`` (carrying the commands that
were complete before the bad frame).
"""

from __future__ import annotations

import random

import pytest

from disque.protocol import (
    MAX_INLINE_SIZE,
    MAX_MULTIBULK_LENGTH,
    NULL_ARRAY,
    OK,
    CommandParser,
    Map,
    ProtocolError,
    ReplyError,
    Status,
    encode,
    split_inline,
    status_reply,
)


def pack(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def feed_all(chunks: list[bytes], **kwargs: int) -> list[list[bytes]]:
    parser = CommandParser(**kwargs)
    out: list[list[bytes]] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out


def every_split(data: bytes) -> list[list[bytes]]:
    return [[data[:i], data[i:]] for i in range(1, len(data))]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i:i + 1] for i in range(len(data))]


BINARY = b"\x00\xff\r\n*1\r\n$4\r\nPING\r\n\xc3\x28"
REQUESTS = pack(b"ADDJOB", b"q", BINARY, b"0") + pack(b"PING") + pack(b"ECHO", b"")
EXPECTED = [[b"ADDJOB", b"q", BINARY, b"0"], [b"PING"], [b"ECHO", b""]]


# --------------------------------------------------------------------------
# Multi-bulk requests
# --------------------------------------------------------------------------

def test_whole_frames_in_one_read() -> None:
    assert feed_all([REQUESTS]) == EXPECTED


def test_binary_and_empty_arguments_are_exact() -> None:
    args = [b"", b"\x00", bytes(range(256)), b"\r\n", b"$3\r\n", b"\xff" * 70000]
    assert feed_all([pack(b"ECHO", *args)]) == [[b"ECHO", *args]]


def test_split_inside_bulk_bodies() -> None:
    big = bytes(range(256)) * 4096  # 1 MiB
    frame = pack(b"ADDJOB", b"q", big, b"0")
    head = frame.index(big)
    chunks = [frame[:head + 10]] + [frame[i:i + 65536] for i in range(head + 10, len(frame), 65536)]
    # Every chunk boundary is inside the body or its trailing CRLF/next header.
    assert feed_all(chunks) == [[b"ADDJOB", b"q", big, b"0"]]


def test_every_two_way_split_gives_the_same_commands() -> None:
    for chunks in every_split(REQUESTS):
        assert feed_all(chunks) == EXPECTED, chunks


def test_byte_by_byte() -> None:
    assert feed_all(bytewise(REQUESTS)) == EXPECTED


def test_split_after_multibulk_header() -> None:
    assert feed_all([b"*1\r\n", b"$4\r\nPING\r\n"]) == [[b"PING"]]


def test_inline_then_multibulk_in_one_read() -> None:
    assert feed_all([b"PING\r\n" + pack(b"ECHO", b"x")]) == [[b"PING"], [b"ECHO", b"x"]]


def test_multibulk_then_inline_in_one_read() -> None:
    assert feed_all([pack(b"ECHO", b"x") + b"PING\r\n"]) == [[b"ECHO", b"x"], [b"PING"]]


def test_null_and_empty_multibulk_alone_are_ignored() -> None:
    assert feed_all([b"*-1\r\n", b"*0\r\n", b"PING\r\n"]) == [[b"PING"]]


@pytest.mark.parametrize("frame", [b"*-1\r\n", b"*0\r\n"])
def test_null_and_empty_multibulk_in_one_read(frame: bytes) -> None:
    assert feed_all([frame + b"PING\r\n" + frame + pack(b"PING")]) == [[b"PING"], [b"PING"]]


def test_many_requests_in_one_read() -> None:
    data = b"".join(pack(b"ACKJOB", b"%040d" % i) for i in range(5000))
    out = feed_all([data])
    assert len(out) == 5000 and out[4999] == [b"ACKJOB", b"%040d" % 4999]


def test_many_arguments() -> None:
    ids = [b"D-%08x-%s-05a1" % (i, b"A" * 24) for i in range(10000)]
    assert feed_all([pack(b"ACKJOB", *ids)]) == [[b"ACKJOB", *ids]]


def test_pipelined_requests_larger_than_a_read() -> None:
    """ACKJOBs of 1,000 IDs (47 KB each) read 64 KB at a time: every read
    but the first starts inside a request, and what follows it parses."""
    ids = [b"D-%08x-%s-05a1" % (i, b"A" * 24) for i in range(1000)]
    data = b"".join(pack(b"ACKJOB", *ids[start:], *ids[:start]) for start in range(0, 1000, 100))
    chunks = [data[at:at + 65536] for at in range(0, len(data), 65536)]
    out = feed_all(chunks)
    assert out == [[b"ACKJOB", *ids[start:], *ids[:start]] for start in range(0, 1000, 100)]


def _random_request(rng: random.Random) -> tuple[bytes, list[bytes] | None]:
    """One request as sent and the command it must give (None: ignored)."""
    kind = rng.random()
    if kind < 0.05:
        return rng.choice([b"*0\r\n", b"*-1\r\n"]), None
    if kind < 0.15:
        words = [b"w%d" % rng.randrange(1000) for _ in range(rng.randrange(1, 4))]
        return b" ".join(words) + rng.choice([b"\r\n", b"\n"]), words
    args = []
    for _ in range(rng.randrange(1, 6)):
        shape = rng.random()
        if shape < 0.6:
            arg = rng.randbytes(rng.randrange(0, 60)).replace(b"\r\n", b"")
        elif shape < 0.8:
            arg = b"a\r\nb" * rng.randrange(1, 4)           # a CRLF inside a body
        else:
            arg = rng.randbytes(rng.randrange(4000, 9000))  # around the fast path's limit
        args.append(arg)
    return pack(*args), args


@pytest.mark.parametrize("seed", range(20))
def test_random_streams_cut_anywhere(seed: int) -> None:
    """Requests of every shape, cut at random places: the fast and exact paths agree."""
    rng = random.Random(seed)
    data, expected = b"", []
    for _ in range(rng.randrange(1, 40)):
        raw, command = _random_request(rng)
        data += raw
        if command is not None:
            expected.append(command)
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randrange(0, 30))))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert feed_all(chunks) == expected
    assert feed_all([data]) == expected


def _outcome(chunks: list[bytes]) -> tuple[list[list[bytes]], str | None]:
    """The commands a parser returns for ``chunks`` and the error it stops with."""
    parser = CommandParser()
    out: list[list[bytes]] = []
    for chunk in chunks:
        try:
            out += parser.feed(chunk)
        except ProtocolError as err:
            return out + (err.commands or []), str(err)
    return out, None


@pytest.mark.parametrize("seed", range(10))
def test_mutated_streams_get_the_same_answer_whole_or_byte_by_byte(seed: int) -> None:
    """Valid pipelines with bytes changed into header characters.

    Fed whole, a stream mostly goes through the fast path; fed byte by byte,
    through the exact parser alone.  Both must accept the same requests and
    refuse at the same one with the same error: the fast path only ever
    hands over to the exact parser, never decides differently.
    """
    rng = random.Random(seed)
    alphabet = b"*$\r\n0123456789-+ x"
    for _ in range(40):
        requests = (_random_request(rng)[0] for _ in range(rng.randrange(1, 12)))
        data = bytearray(b"".join(raw for raw in requests if len(raw) < 400))
        if not data:
            continue
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = alphabet[rng.randrange(len(alphabet))]
        stream = bytes(data)
        assert _outcome([stream]) == _outcome(bytewise(stream)), stream


# --------------------------------------------------------------------------
# Malformed multi-bulk frames
# --------------------------------------------------------------------------

@pytest.mark.parametrize("data", [
    b"*1\r\n:5\r\n",
    b"*1\r\n*1\r\n$4\r\nPING\r\n",
    b"*2\r\n$4\r\nECHO\r\n$-1\r\n",
    b"*1\r\n_\r\n",
    b"*1\r\n-ERR x\r\n",
    b"*abc\r\n",
    b"*1x\r\n",
    b"*99999999999999999999\r\n",
    b"*%d\r\n" % (MAX_MULTIBULK_LENGTH + 1),
    b"*1\r\n$abc\r\n",
    b"*1\r\n$-5\r\n",
    b"*1\r\n$999999999999\r\n",
    b"*01\r\n$4\r\nPING\r\n",
    b"*1\r\n$04\r\nPING\r\n",
    b"*1\r\n$+4\r\nPING\r\n",
    b"*1\r\n$ 4\r\nPING\r\n",
    b"*1\r\n$4\r\nPINGxx",
    b"*2\r\n$4\r\nECHO\r\n$1\r\nab\r\n",
    b"*" + b"1" * 40,
    b"*1\r\n$" + b"1" * 40,
])
def test_malformed_frames_raise(data: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        CommandParser().feed(data)


def test_simple_string_argument_raises() -> None:
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        CommandParser().feed(b"*1\r\n+PING\r\n")


NOT_BULK = [b"*2\r\n$4\r\nECHO\r\n+a\r\n", b"*2\r\n$4\r\nECHO\r\n=5\r\ntxt:a\r\n",
            b"*1\r\n=8\r\ntxt:PING\r\n"]


@pytest.mark.parametrize("frame", NOT_BULK, ids=["simple", "verbatim", "verbatim-only"])
def test_not_bulk_elements_are_refused_and_not_returned(frame: bytes) -> None:
    with pytest.raises(ProtocolError, match=r"^Protocol error") as info:
        CommandParser().feed(b"PING\r\n" + frame + b"PING\r\n")
    assert info.value.commands == [[b"PING"]]  # type: ignore[attr-defined]


def test_verbatim_element_does_not_disable_header_checks() -> None:
    parser = CommandParser(max_bulk_len=10)
    try:
        parser.feed(b"*2\r\n$4\r\nECHO\r\n=5\r\ntxt:a\r\n")
    except ProtocolError:
        return  # refusing the frame outright is fine
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        parser.feed(b"*1\r\n$11\r\n")


def test_multibulk_length_at_the_limit_waits() -> None:
    parser = CommandParser()
    assert parser.feed(b"*%d\r\n" % MAX_MULTIBULK_LENGTH) == []


def test_bulk_length_limit() -> None:
    assert CommandParser(max_bulk_len=10).feed(b"*1\r\n$10\r\n") == []
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        CommandParser(max_bulk_len=10).feed(b"*1\r\n$11\r\n")


def test_bulk_length_limit_on_a_later_argument() -> None:
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        CommandParser(max_bulk_len=10).feed(b"*2\r\n$4\r\nECHO\r\n$11\r\n")


def test_bulk_length_limit_when_header_arrives_alone() -> None:
    parser = CommandParser(max_bulk_len=10)
    assert parser.feed(b"*1\r\n") == []
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        parser.feed(b"$11\r\n")


def test_multibulk_length_limit_split_header() -> None:
    parser = CommandParser()
    assert parser.feed(b"*%d" % (MAX_MULTIBULK_LENGTH + 1)) == []
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        parser.feed(b"\r\n")


def test_query_buffer_limit() -> None:
    parser = CommandParser(max_query_buffer=1000)
    assert parser.feed(b"*2\r\n$4\r\nECHO\r\n$100000\r\n") == []
    with pytest.raises(ProtocolError, match=r"^Protocol error"):
        for _ in range(10):
            parser.feed(b"x" * 500)


def test_error_carries_the_commands_before_it() -> None:
    with pytest.raises(ProtocolError) as info:
        CommandParser().feed(b"PING\r\n" + pack(b"ECHO", b"a") + b"*1\r\n:5\r\n")
    assert info.value.commands == [[b"PING"], [b"ECHO", b"a"]]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# Inline requests
# --------------------------------------------------------------------------

def test_inline_basic() -> None:
    assert feed_all([b"PING\r\n", b"ping\n", b"ECHO  a\t b \r\n"]) == [
        [b"PING"], [b"ping"], [b"ECHO", b"a", b"b"]]


def test_inline_blank_lines_are_ignored() -> None:
    assert feed_all([b"\r\n\n  \r\n\t\n"]) == []


def test_inline_byte_by_byte() -> None:
    assert feed_all(bytewise(b'ADDJOB q "a b" 0\r\nPING\r\n')) == [
        [b"ADDJOB", b"q", b"a b", b"0"], [b"PING"]]


def test_inline_limit() -> None:
    parser = CommandParser()
    assert parser.feed(b"a" * MAX_INLINE_SIZE) == []
    with pytest.raises(ProtocolError, match=r"^Protocol error: too big inline request"):
        parser.feed(b"a")
    with pytest.raises(ProtocolError, match=r"^Protocol error: too big inline request"):
        CommandParser().feed(b"ECHO " + b"a" * MAX_INLINE_SIZE + b"\r\n")
    assert feed_all([b"ECHO " + b"a" * 60000 + b"\r\n"]) == [[b"ECHO", b"a" * 60000]]


@pytest.mark.parametrize(("line", "args"), [
    (b"", []),
    (b"   ", []),
    (b"a b  c", [b"a", b"b", b"c"]),
    (b'"a b"', [b"a b"]),
    (b"'a b'", [b"a b"]),
    (b'""', [b""]),
    (b"''", [b""]),
    (b'"" x', [b"", b"x"]),
    (b'a"b c"', [b"ab c"]),
    (b'"\\x00\\xff\\x4A"', [b"\x00\xff\x4a"]),
    (b'"\\n\\r\\t\\b\\a\\\\\\"\\q"', [b"\n\r\t\b\a\\\"q"]),
    (b'"\\x4"', [b"x4"]),
    (b"'it\\'s'", [b"it's"]),
    (b"'a\\nb'", [b"a\\nb"]),
    (b'ADDJOB q "a b" 0', [b"ADDJOB", b"q", b"a b", b"0"]),
    (b"\xff\xfe \x00", [b"\xff\xfe", b"\x00"]),
])
def test_split_inline(line: bytes, args: list[bytes]) -> None:
    assert split_inline(line) == args


@pytest.mark.parametrize("line", [b'"abc', b"'abc", b'"a"b', b"'a'b", b'x "y', b'"\\"'])
def test_split_inline_unbalanced_quotes(line: bytes) -> None:
    with pytest.raises(ProtocolError, match="unbalanced quotes"):
        split_inline(line)


def test_unbalanced_quotes_through_the_parser() -> None:
    with pytest.raises(ProtocolError) as info:
        CommandParser().feed(b'PING\r\nECHO "abc\r\nPING\r\n')
    assert info.value.commands == [[b"PING"]]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# Reply encoding
# --------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "resp2", "resp3"), [
    (OK, b"+OK\r\n", b"+OK\r\n"),
    (Status("D-1"), b"+D-1\r\n", b"+D-1\r\n"),
    (status_reply(b"D-1"), b"+D-1\r\n", b"+D-1\r\n"),
    ([status_reply(b"D-1"), b"x"], b"*2\r\n+D-1\r\n$1\r\nx\r\n", b"*2\r\n+D-1\r\n$1\r\nx\r\n"),
    (ReplyError("BADID Invalid Job ID format."), b"-BADID Invalid Job ID format.\r\n",
     b"-BADID Invalid Job ID format.\r\n"),
    (ReplyError("ERR a\r\nb"), b"-ERR a  b\r\n", b"-ERR a  b\r\n"),
    (0, b":0\r\n", b":0\r\n"),
    (1023, b":1023\r\n", b":1023\r\n"),
    (1024, b":1024\r\n", b":1024\r\n"),
    (-1, b":-1\r\n", b":-1\r\n"),
    (2 ** 63 - 1, b":9223372036854775807\r\n", b":9223372036854775807\r\n"),
    (True, b":1\r\n", b":1\r\n"),
    (b"", b"$0\r\n\r\n", b"$0\r\n\r\n"),
    (b"\x00\r\n\xff", b"$4\r\n\x00\r\n\xff\r\n", b"$4\r\n\x00\r\n\xff\r\n"),
    ("é", b"$2\r\n\xc3\xa9\r\n", b"$2\r\n\xc3\xa9\r\n"),
    (bytearray(b"ab"), b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
    (memoryview(b"ab"), b"$2\r\nab\r\n", b"$2\r\nab\r\n"),
    (None, b"$-1\r\n", b"_\r\n"),
    (NULL_ARRAY, b"*-1\r\n", b"_\r\n"),
    ([], b"*0\r\n", b"*0\r\n"),
    ([b"q", [1, None]], b"*2\r\n$1\r\nq\r\n*2\r\n:1\r\n$-1\r\n",
     b"*2\r\n$1\r\nq\r\n*2\r\n:1\r\n_\r\n"),
    ((b"a",), b"*1\r\n$1\r\na\r\n", b"*1\r\n$1\r\na\r\n"),
    (Map([b"k", 1, b"n", None]), b"*4\r\n$1\r\nk\r\n:1\r\n$1\r\nn\r\n$-1\r\n",
     b"%2\r\n$1\r\nk\r\n:1\r\n$1\r\nn\r\n_\r\n"),
    (Map([]), b"*0\r\n", b"%0\r\n"),
    ([Map([b"a", [b"x"]])], b"*1\r\n*2\r\n$1\r\na\r\n*1\r\n$1\r\nx\r\n",
     b"*1\r\n%1\r\n$1\r\na\r\n*1\r\n$1\r\nx\r\n"),
])
def test_encode(value: object, resp2: bytes, resp3: bytes) -> None:
    assert encode(value) == resp2
    assert encode(value, resp3=True) == resp3


def test_encode_iterables() -> None:
    assert encode(x for x in (b"a", 2)) == b"*2\r\n$1\r\na\r\n:2\r\n"
    assert encode({b"k": None}.keys()) == b"*1\r\n$1\r\nk\r\n"


def test_encode_large_bulk() -> None:
    body = bytes(range(256)) * 80000
    assert encode(body) == b"$%d\r\n%s\r\n" % (len(body), body)


@pytest.mark.parametrize("size", [1, 1023, 1024, 1025])
def test_encode_sizes_around_the_header_tables(size: int) -> None:
    """Headers below 1024 come from tables, the others are formatted: both agree."""
    body = b"x" * size
    assert encode(body) == b"$%d\r\n%s\r\n" % (size, body)
    assert encode("é" * size) == b"$%d\r\n%s\r\n" % (2 * size, "é".encode() * size)
    items = [b"ab"] * size
    assert encode(items) == b"*%d\r\n" % size + b"$2\r\nab\r\n" * size
    assert encode([[body]]) == b"*1\r\n*1\r\n$%d\r\n%s\r\n" % (size, body)


def test_encode_refuses_unknown_types() -> None:
    with pytest.raises(TypeError):
        encode(object())
    with pytest.raises(TypeError):
        encode(1.5)


def test_encode_error_with_client_bytes_does_not_raise() -> None:
    raw = encode(ReplyError("ERR Invalid argument '\udcff' for CONFIG SET 'loglevel'"))
    assert raw.startswith(b"-ERR Invalid argument '") and raw.endswith(b"\r\n")
    assert raw.count(b"\r\n") == 1


def test_huge_multibulk_count_is_a_protocol_error_not_a_crash() -> None:
    """A count header longer than any valid one is refused, not converted (int() limit)."""
    with pytest.raises(ProtocolError, match=r"^Protocol error") as info:
        CommandParser().feed(pack(b"PING") + b"*" + b"9" * 5000 + b"\r\n")
    assert info.value.commands == [[b"PING"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("sizes", [(0, 0), (1, 5), (1023, 1024), (1025, 70000)])
@pytest.mark.parametrize("count", [1, 3, 1100])
def test_getjob_replies_encoded_ahead_equal_the_generic_encoding(
        sizes: tuple[int, int], count: int) -> None:
    """GETJOB's usual reply (no extra fields) is encoded without building
    the entry lists: the bytes must be those of the generic encoder, in
    RESP2 and RESP3, around the header tables' edges (1024) too."""
    from disque.job import Job
    from disque.queue_table import Queue
    from disque.waiters import getjob_entry, plain_entries_reply

    queue_size, body_size = sizes
    queue = b"q" * queue_size
    q = Queue(queue, 0)
    jobs = [Job(b"D-%08x-%s-0001" % (i, b"A" * 24), queue, b"%d" % i + b"b" * body_size)
            for i in range(count)]
    # An ID of another length (none this node makes or accepts): spelled out.
    odd = Job(b"D-odd", queue, b"odd body")
    for batch in (jobs, [odd], [*jobs, odd], jobs):  # the queue's prefix made once, reused
        generic = [getjob_entry(job, 0) for job in batch]
        fast = plain_entries_reply(q, batch)
        assert encode(fast) == encode(generic) == encode(generic, resp3=True)
        assert encode(fast, resp3=True) == encode(generic)


def test_one_request_at_a_time_before_auth_parses_as_usual() -> None:
    """Before AUTH (``preauth``) ``feed`` returns one request and keeps the
    rest of the read: however the bytes are cut, and wherever the limits
    are lifted (an AUTH), the commands are those of the usual parse, and
    nothing is left held at the end."""
    rng = random.Random(3)

    def request() -> bytes:
        roll = rng.random()
        if roll < 0.3:
            words = [rng.choice([b"PING", b"AUTH", b"x", b"yy"]) for _ in range(rng.randint(1, 3))]
            return b" ".join(words) + rng.choice([b"\n", b"\r\n"])
        if roll < 0.35:
            return b"*0\r\n"
        if roll < 0.38:
            return b"\r\n"
        args = [bytes(rng.choice(b"ab\r\n") for _ in range(rng.randint(0, 30)))
                for _ in range(rng.randint(1, 5))]
        return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)

    for _ in range(2000):
        stream = b"".join(request() for _ in range(rng.randint(1, 30)))
        expected = CommandParser().feed(stream)
        parser = CommandParser()
        parser.preauth = True
        lift_after = rng.randint(0, 40)
        got: list[list[bytes]] = []
        pos = 0
        while pos < len(stream):
            size = rng.randint(1, 40)
            commands = parser.feed(stream[pos:pos + size])
            pos += size
            while commands:
                assert len(commands) == 1 or not parser.preauth
                got += commands
                if len(got) >= lift_after:
                    parser.preauth = False
                commands = parser.feed(b"")
        assert got == expected
        assert parser.pending_bytes == 0


def test_one_request_at_a_time_costs_the_read_once() -> None:
    """The rest of a read was sliced off after each request: a read of 1 MB
    of inline PINGs cost the square of its size (5.8 s compiled).  Now it
    is held where it is: 16 times the bytes cost about 16 times the time."""
    import time

    def seconds(size: int) -> float:
        parser = CommandParser()
        parser.preauth = True
        started = time.perf_counter()
        commands = parser.feed(b"PING\n" * (size // 5))
        count = len(commands)
        while commands:
            commands = parser.feed(b"")
            count += len(commands)
        assert count == size // 5 and parser.pending_bytes == 0
        return time.perf_counter() - started

    small = min(seconds(64 * 1024) for _ in range(3))
    large = seconds(1024 * 1024)
    assert large < 64 * small, (small, large)  # quadratic: ~256 times
