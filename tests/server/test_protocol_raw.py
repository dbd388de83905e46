"""Protocol edge cases against a real node, over raw sockets.

Everything here is about how the node reads requests and frames replies:
inline commands, pipelines that mix framings, requests split into tiny
writes, malformed frames (which must close only the offending connection),
replies byte for byte where clients of the original depend on the exact
framing (a status reply for ADDJOB's ID, a null array for a GETJOB that
got nothing, a null bulk for SHOW of an unknown job, ...), and RESP2/RESP3
negotiation with ``HELLO`` (including the stock redis-py 8 client, which
sends ``HELLO 3`` on connect).

``Resp`` (a tiny raw client) is also used by ``test_bad_input.py``.

Tiny writes are made deterministic without sleeping: after each chunk the
test does a PING round trip on a second connection.  On loopback a sent
chunk is already in the node's receive buffer, so by the time the node has
answered that PING it has read (and parsed) the chunk on its own.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from typing import Any

import hiredis
import pytest
import redis

from tests.support.process import DisqueProcess, wait_for

JOB_ID = re.compile(rb"^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$")
STATUS_JOB_ID = re.compile(rb"^\+D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}\r\n$")
UNKNOWN_ID = b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
#: How long a test waits for a close that a buggy node never does (only xfail cases).
HANG_TIMEOUT = 1.5


# --------------------------------------------------------------------------
# A raw RESP client
# --------------------------------------------------------------------------

def pack(*args: Any) -> bytes:
    """Encode a request as a RESP multi-bulk frame."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, int):
            arg = str(arg).encode()
        elif isinstance(arg, str):
            arg = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


def frame_end(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """End offset of the RESP2/RESP3 reply starting at ``pos``, or None if incomplete."""
    nl = buf.find(b"\r\n", pos)
    if nl < 0:
        return None
    kind = buf[pos:pos + 1]
    after = nl + 2
    if kind in (b"+", b"-", b":", b"_", b",", b"#", b"("):
        return after
    size = int(buf[pos + 1:nl])
    if kind in (b"$", b"=", b"!"):
        if size < 0:
            return after
        end = after + size + 2
        return end if len(buf) >= end else None
    if kind in (b"*", b"%", b"~", b">"):
        if size < 0:
            return after
        for _ in range(size * 2 if kind == b"%" else size):
            end = frame_end(buf, after)
            if end is None:
                return None
            after = end
        return after
    raise AssertionError(f"not a RESP reply: {bytes(buf[pos:pos + 60])!r}")


def parse(raw: bytes) -> Any:
    """Parse one raw reply; errors come back as ``hiredis.ReplyError`` values."""
    reader = hiredis.Reader()
    reader.feed(raw)
    value = reader.gets()
    assert value is not False, f"incomplete reply {raw[:80]!r}"
    return value


def err_text(value: Any) -> str:
    """The full text of an error reply (``ERR ...``), failing if it is not an error."""
    assert isinstance(value, hiredis.ReplyError), f"expected an error reply, got {value!r}"
    return value.args[0]


class Resp:
    """One raw connection: send bytes or commands, read replies exactly."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Resp:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> bool:
        chunk = self.sock.recv(4 * 1024 * 1024)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def read_raw(self) -> bytes:
        """The exact bytes of the next reply."""
        while True:
            if self.buf:
                end = frame_end(self.buf)
                if end is not None:
                    raw = bytes(self.buf[:end])
                    del self.buf[:end]
                    return raw
            if not self._fill():
                raise AssertionError(f"connection closed by the node; pending {bytes(self.buf)!r}")

    def read_exact(self, expected: bytes) -> None:
        """Read ``len(expected)`` bytes and compare them byte for byte."""
        while len(self.buf) < len(expected):
            if not self._fill():
                break
        got = bytes(self.buf[:len(expected)])
        del self.buf[:len(expected)]
        assert got == expected

    def read(self) -> Any:
        return parse(self.read_raw())

    def call(self, *args: Any) -> Any:
        self.send(pack(*args))
        return self.read()

    def call_raw(self, *args: Any) -> bytes:
        self.send(pack(*args))
        return self.read_raw()

    def read_until_closed(self) -> bytes:
        """Everything the node sends until it closes the connection (fails on timeout)."""
        try:
            while self._fill():
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            raise AssertionError(f"the node did not close the connection; got "
                                 f"{bytes(self.buf[:200])!r}") from None
        rest = bytes(self.buf)
        self.buf.clear()
        return rest


@pytest.fixture
def conn(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as c:
        yield c


@pytest.fixture
def probe(node: DisqueProcess) -> Iterator[Resp]:
    """A second connection, used as a barrier and to prove the node still serves."""
    with Resp(node.port) as c:
        yield c


@pytest.fixture(autouse=True)
def sentinel(node: DisqueProcess) -> Iterator[None]:
    """A job stored before the test must come out of it untouched."""
    with Resp(node.port) as c:
        body = b"sentinel\x00\xff\r\n"
        job_id = c.call("ADDJOB", b"raw-sentinel", body, 0)
        before = c.call("SHOW", job_id)
    yield
    with Resp(node.port) as c:
        assert c.call("PING") == b"PONG"
        after = c.call("SHOW", job_id)
        assert after is not None, "the sentinel job was lost"
        for key in (b"id", b"queue", b"state", b"body", b"repl", b"ctime", b"retry", b"nacks"):
            assert after[after.index(key) + 1] == before[before.index(key) + 1], key
        assert c.call("QLEN", b"raw-sentinel") == 1
        assert c.call("DELJOB", job_id) == 1


def info_field(c: Resp, section: str, field: str) -> int:
    text = c.call("INFO", section).decode()
    match = re.search(rf"^{field}:(\d+)\r?$", text, re.M)
    assert match, f"{field} missing from INFO {section}"
    return int(match.group(1))


def barrier(probe: Resp) -> None:
    assert probe.call("PING") == b"PONG"


def send_in_pieces(conn: Resp, probe: Resp, data: bytes, size: int = 1) -> None:
    for i in range(0, len(data), size):
        conn.send(data[i:i + size])
        barrier(probe)


def assert_protocol_error_and_close(conn: Resp, probe: Resp, prefix: bytes = b"-ERR Protocol error"
                                    ) -> bytes:
    """The node answers one protocol error line, closes this connection only."""
    rest = conn.read_until_closed()
    assert rest.startswith(prefix), rest[:200]
    assert rest.endswith(b"\r\n") and rest.count(b"\r\n") == 1, rest[:200]
    barrier(probe)
    return rest


# --------------------------------------------------------------------------
# Inline commands
# --------------------------------------------------------------------------

def test_inline_ping(conn: Resp) -> None:
    conn.send(b"PING\r\n")
    conn.read_exact(b"+PONG\r\n")
    conn.send(b"ping\n")  # bare LF, lower case
    conn.read_exact(b"+PONG\r\n")


def test_inline_blank_lines_are_ignored(conn: Resp) -> None:
    conn.send(b"\r\n\n   \r\n\t\r\nPING\r\n")
    conn.read_exact(b"+PONG\r\n")


def test_inline_addjob_with_quotes(conn: Resp) -> None:
    conn.send(b'ADDJOB raw-inline "a b" 0\r\n')
    raw = conn.read_raw()
    assert STATUS_JOB_ID.match(raw), raw
    job_id = raw[1:-2]
    conn.send(b"ADDJOB raw-inline 'c \\'d\\'' 0\r\n")
    second = conn.read_raw()[1:-2]
    conn.send(b'ADDJOB raw-inline "\\x00\\xff\\r\\n\\"" 0\r\n')
    third = conn.read_raw()[1:-2]
    conn.send(b"GETJOB NOHANG COUNT 3 FROM raw-inline\r\n")
    assert conn.read() == [[b"raw-inline", job_id, b"a b"],
                           [b"raw-inline", second, b"c 'd'"],
                           [b"raw-inline", third, b"\x00\xff\r\n\""]]
    conn.send(b"ACKJOB " + b" ".join([job_id, second, third]) + b"\r\n")
    conn.read_exact(b":3\r\n")


def test_inline_empty_quoted_argument(conn: Resp) -> None:
    conn.send(b'ECHO ""\r\n')
    conn.read_exact(b"$0\r\n\r\n")
    conn.send(b'""\r\n')
    conn.read_exact(b"-ERR unknown command ''\r\n")


def test_inline_sent_byte_by_byte(conn: Resp, probe: Resp) -> None:
    send_in_pieces(conn, probe, b"ECHO 'x y'\r\nPING\r\n")
    conn.read_exact(b"$3\r\nx y\r\n+PONG\r\n")


@pytest.mark.parametrize("line", [b'ECHO "abc\r\n', b"ECHO 'abc\r\n", b'ECHO "a"b\r\n',
                                  b"ECHO 'a'b\r\n", b'ADDJOB q "a b 0\r\n'])
def test_inline_unbalanced_quotes(conn: Resp, probe: Resp, line: bytes) -> None:
    conn.send(line)
    assert_protocol_error_and_close(conn, probe)
    assert probe.call("QLEN", "q") == 0


def test_inline_longer_than_64k_is_refused(conn: Resp, probe: Resp) -> None:
    conn.send(b"ECHO " + b"a" * (70 * 1024) + b"\r\n")
    assert_protocol_error_and_close(conn, probe)


def test_inline_without_newline_over_64k_is_refused(conn: Resp, probe: Resp) -> None:
    conn.send(b"ECHO " + b"a" * (70 * 1024))
    assert_protocol_error_and_close(conn, probe)


def test_inline_under_64k_is_served(conn: Resp) -> None:
    conn.send(b"ECHO " + b"a" * 60000 + b"\r\n")
    conn.read_exact(b"$60000\r\n" + b"a" * 60000 + b"\r\n")


# --------------------------------------------------------------------------
# Pipelines and split requests
# --------------------------------------------------------------------------

def test_pipeline_of_multibulk_requests(conn: Resp) -> None:
    n = 1000
    conn.send(b"".join(pack("ADDJOB", "raw-pipe", b"j%d\x00" % i, 0) for i in range(n))
              + pack("QLEN", "raw-pipe"))
    ids = [conn.read_raw() for _ in range(n)]
    assert all(STATUS_JOB_ID.match(raw) for raw in ids)
    assert len(set(ids)) == n
    conn.read_exact(b":%d\r\n" % n)
    assert conn.call("ACKJOB", *[raw[1:-2] for raw in ids]) == n


def test_pipeline_of_inline_requests(conn: Resp) -> None:
    conn.send(b"PING\r\nECHO a\r\nQLEN raw-nothing\r\nSHOW " + UNKNOWN_ID + b"\r\n")
    conn.read_exact(b"+PONG\r\n$1\r\na\r\n:0\r\n$-1\r\n")


def test_pipeline_inline_then_multibulk(conn: Resp) -> None:
    conn.send(b"PING\r\nECHO x\r\n" + pack("ECHO", b"a\x00b") + pack("PING"))
    conn.read_exact(b"+PONG\r\n$1\r\nx\r\n$3\r\na\x00b\r\n+PONG\r\n")


def test_pipeline_multibulk_then_inline(conn: Resp) -> None:
    conn.send(b"PING\r\n" + pack("ECHO", b"a\x00b") + b"ECHO x\r\n" + pack("PING"))
    conn.read_exact(b"+PONG\r\n$3\r\na\x00b\r\n$1\r\nx\r\n+PONG\r\n")


def test_multibulk_split_inside_arguments(conn: Resp, probe: Resp) -> None:
    """Splits in the middle of a header or a bulk (the common TCP case) are fine."""
    frame = pack("ECHO", b"hello\x00world")
    conn.send(frame[:2])  # "*2" without its CRLF
    barrier(probe)
    conn.send(frame[2:10])  # up to the middle of "ECHO"
    barrier(probe)
    conn.send(frame[10:20])  # up to the middle of the second bulk
    barrier(probe)
    conn.send(frame[20:])
    conn.read_exact(b"$11\r\nhello\x00world\r\n")


def test_multibulk_split_at_argument_boundaries(conn: Resp, probe: Resp) -> None:
    frame = pack("ECHO", b"hello")
    conn.send(frame[:4])  # "*2\r\n"
    barrier(probe)
    conn.send(frame[4:])
    conn.read_exact(b"$5\r\nhello\r\n")


def test_multibulk_sent_byte_by_byte(conn: Resp, probe: Resp) -> None:
    body = b"a\x00\xff\r\nb"
    send_in_pieces(conn, probe, pack("ADDJOB", "raw-bytewise", body, 0))
    raw = conn.read_raw()
    assert STATUS_JOB_ID.match(raw), raw
    send_in_pieces(conn, probe, pack("GETJOB", "NOHANG", "FROM", "raw-bytewise"))
    assert conn.read() == [[b"raw-bytewise", raw[1:-2], body]]


def test_null_and_empty_multibulk_are_ignored(conn: Resp, probe: Resp) -> None:
    for frame in (b"*-1\r\n", b"*0\r\n"):
        conn.send(frame)
        barrier(probe)
        conn.send(b"PING\r\n")
        conn.read_exact(b"+PONG\r\n")


@pytest.mark.parametrize("frame", [b"*-1\r\n", b"*0\r\n"])
def test_null_and_empty_multibulk_in_a_pipeline(conn: Resp, frame: bytes) -> None:
    conn.send(frame + b"PING\r\n" + frame + pack("PING"))
    conn.read_exact(b"+PONG\r\n+PONG\r\n")


def test_client_vanishing_mid_frame_leaves_nothing(node: DisqueProcess, probe: Resp) -> None:
    before = info_field(probe, "clients", "connected_clients")
    with Resp(node.port) as c:
        c.send(b"*4\r\n$6\r\nADDJOB\r\n$8\r\nraw-half\r\n$1000000\r\n" + b"x" * 5000)
        barrier(probe)
        assert info_field(probe, "clients", "connected_clients") == before + 1
    wait_for(lambda: info_field(probe, "clients", "connected_clients") <= before,
             message="the half-sent client to be gone")
    assert probe.call("QLEN", "raw-half") == 0


# --------------------------------------------------------------------------
# Malformed frames: error, then close that connection only
# --------------------------------------------------------------------------

def test_integer_array_element(conn: Resp, probe: Resp) -> None:
    conn.send(b"PING\r\n*1\r\n:5\r\n")
    conn.read_exact(b"+PONG\r\n")  # what came before the bad frame is answered
    assert_protocol_error_and_close(conn, probe)


@pytest.mark.parametrize("frame", [b"*1\r\n*1\r\n$4\r\nPING\r\n", b"*2\r\n$4\r\nECHO\r\n$-1\r\n",
                                   b"*1\r\n_\r\n", b"*1\r\n-ERR x\r\n"])
def test_non_bulk_array_elements(conn: Resp, probe: Resp, frame: bytes) -> None:
    conn.send(frame)
    assert_protocol_error_and_close(conn, probe)


NOT_BULK_ADDJOB = [
    b"*4\r\n$6\r\nADDJOB\r\n+raw-notbulk\r\n$1\r\nx\r\n$1\r\n0\r\n",
    b"*4\r\n$6\r\nADDJOB\r\n=15\r\ntxt:raw-notbulk\r\n$1\r\nx\r\n$1\r\n0\r\n",
]


@pytest.mark.parametrize("frame", NOT_BULK_ADDJOB, ids=["simple-string", "verbatim"])
def test_not_bulk_element_is_refused_and_not_run(conn: Resp, probe: Resp, frame: bytes) -> None:
    conn.sock.settimeout(HANG_TIMEOUT)
    conn.send(frame)
    assert_protocol_error_and_close(conn, probe)
    assert probe.call("QLEN", "raw-notbulk") == 0


def test_verbatim_element_does_not_desync_the_connection(conn: Resp, probe: Resp) -> None:
    conn.sock.settimeout(HANG_TIMEOUT)
    conn.send(b"*2\r\n$4\r\nECHO\r\n=5\r\ntxt:a\r\n")
    barrier(probe)
    conn.send(b"*1\r\n$999999999999\r\n")
    assert_protocol_error_and_close(conn, probe)


@pytest.mark.parametrize("header", [b"*abc\r\n", b"*1048577\r\n", b"*99999999999999999999\r\n",
                                    b"*1x\r\n"])
def test_invalid_multibulk_length(conn: Resp, probe: Resp, header: bytes) -> None:
    conn.send(header)
    assert_protocol_error_and_close(conn, probe)


def test_invalid_multibulk_length_split_header(conn: Resp, probe: Resp) -> None:
    conn.sock.settimeout(HANG_TIMEOUT)
    send_in_pieces(conn, probe, b"*1048577\r\n", size=4)
    assert_protocol_error_and_close(conn, probe)


@pytest.mark.parametrize("header", [b"$999999999999\r\n", b"$600000000\r\n", b"$abc\r\n",
                                    b"$-5\r\n"])
def test_invalid_bulk_length_closes_only_that_connection(node: DisqueProcess, probe: Resp,
                                                         header: bytes) -> None:
    with Resp(node.port) as other, Resp(node.port) as bad:
        assert other.call("PING") == b"PONG"
        bad.send(b"*1\r\n" + header)
        assert_protocol_error_and_close(bad, probe)
        assert other.call("ECHO", b"still\x00here") == b"still\x00here"
        job_id = other.call("ADDJOB", "raw-after-bad", b"x", 0)
        assert JOB_ID.match(job_id)
        assert other.call("ACKJOB", job_id) == 1


def test_invalid_bulk_length_in_later_argument(conn: Resp, probe: Resp) -> None:
    conn.sock.settimeout(HANG_TIMEOUT)
    conn.send(b"*2\r\n$4\r\nECHO\r\n$999999999999\r\n")
    assert_protocol_error_and_close(conn, probe)


def test_invalid_bulk_length_split_header(conn: Resp, probe: Resp) -> None:
    conn.sock.settimeout(HANG_TIMEOUT)
    send_in_pieces(conn, probe, b"*1\r\n$999999999999\r\n", size=4)
    assert_protocol_error_and_close(conn, probe)


@pytest.fixture
def small_limits(server_factory) -> DisqueProcess:
    """A node with a 1 MiB argument limit and a 4 MiB limit for one unfinished request."""
    return server_factory("--proto-max-bulk-len", "1mb", "--client-query-buffer-limit", "4mb")


def test_configured_bulk_limit(small_limits: DisqueProcess) -> None:
    with Resp(small_limits.port) as c, Resp(small_limits.port) as probe:
        body = os.urandom(1024 * 1024)
        job_id = c.call("ADDJOB", "raw-limit", body, 0)  # exactly at the limit
        assert c.call("GETJOB", "NOHANG", "FROM", "raw-limit") == [[b"raw-limit", job_id, body]]
        assert c.call("ACKJOB", job_id) == 1
        c.send(b"*1\r\n$1048577\r\n")
        assert_protocol_error_and_close(c, probe)


def test_configured_bulk_limit_on_the_body(small_limits: DisqueProcess) -> None:
    with Resp(small_limits.port) as c, Resp(small_limits.port) as probe:
        c.sock.settimeout(HANG_TIMEOUT)
        c.send(pack("ADDJOB", "raw-limit", b"x" * (1024 * 1024 + 1), 0))
        assert_protocol_error_and_close(c, probe)
        assert probe.call("QLEN", "raw-limit") == 0


def test_query_buffer_limit_for_one_unfinished_request(small_limits: DisqueProcess) -> None:
    with Resp(small_limits.port) as c, Resp(small_limits.port) as probe:
        chunk = b"$1048576\r\n" + b"x" * 1024 * 1024 + b"\r\n"
        c.send(b"*10\r\n$4\r\nECHO\r\n")
        try:
            for _ in range(6):
                c.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the node may close while we are still writing
        rest = c.read_until_closed()
        assert rest.startswith(b"-ERR Protocol error") and rest.count(b"\r\n") == 1, rest[:100]
        barrier(probe)


def test_query_buffer_limit_is_per_request(small_limits: DisqueProcess) -> None:
    """Complete requests totalling more than the limit in one write are fine."""
    with Resp(small_limits.port) as c:
        bodies = [os.urandom(1000 * 1000) for _ in range(10)]
        c.send(b"".join(pack("ADDJOB", "raw-many-mb", body, 0) for body in bodies))
        ids = [c.read() for _ in bodies]
        assert all(JOB_ID.match(i) for i in ids)
        assert c.call("QPEEK", "raw-many-mb", 10) == [
            [b"raw-many-mb", i, body] for i, body in zip(ids, bodies, strict=True)]
        assert c.call("ACKJOB", *ids) == 10


def test_protocol_error_spares_blocked_clients(node: DisqueProcess, probe: Resp) -> None:
    with Resp(node.port) as waiter, Resp(node.port) as bad:
        waiter.send(pack("GETJOB", "TIMEOUT", 10000, "FROM", "raw-blocked"))
        wait_for(lambda: info_field(probe, "clients", "blocked_clients") == 1,
                 message="the GETJOB to block")
        bad.send(b"*abc\r\n")
        assert_protocol_error_and_close(bad, probe)
        job_id = probe.call("ADDJOB", "raw-blocked", b"\x00payload", 0)
        assert waiter.read() == [[b"raw-blocked", job_id, b"\x00payload"]]
        assert probe.call("ACKJOB", job_id) == 1


def test_unknown_command_reply_is_one_line(conn: Resp) -> None:
    assert conn.call_raw("FOO") == b"-ERR unknown command 'FOO'\r\n"
    raw = conn.call_raw(b"NO\r\nSUCH\r\n")
    assert raw.startswith(b"-ERR unknown command '") and raw.count(b"\r\n") == 1, raw
    raw = conn.call_raw(b"\xff\xfe\x00")
    assert raw.startswith(b"-ERR unknown command '") and raw.count(b"\r\n") == 1, raw
    raw = conn.call_raw(b"X" * 100000)
    assert raw.startswith(b"-ERR unknown command '") and len(raw) < 1024, raw[:100]
    assert conn.call("PING") == b"PONG"


def test_quit_closes_after_reply_and_drops_the_rest(conn: Resp, probe: Resp) -> None:
    conn.send(b"QUIT extra args\r\n" + pack("ADDJOB", "raw-quit", "x", 0) + b"PING\r\n")
    assert conn.read_until_closed() == b"+OK\r\n"
    assert probe.call("QLEN", "raw-quit") == 0


def test_blocked_client_disconnecting_leaks_nothing(node: DisqueProcess, probe: Resp) -> None:
    with Resp(node.port) as waiter:
        waiter.send(pack("GETJOB", "TIMEOUT", 2 ** 63 - 1, "FROM", "raw-gone", "raw-gone"))
        wait_for(lambda: info_field(probe, "clients", "blocked_clients") == 1,
                 message="the GETJOB to block")
    wait_for(lambda: info_field(probe, "clients", "blocked_clients") == 0,
             message="the blocked client to be gone")
    job_id = probe.call("ADDJOB", "raw-gone", b"kept", 0)
    assert probe.call("QLEN", "raw-gone") == 1
    assert probe.call("GETJOB", "NOHANG", "FROM", "raw-gone") == [[b"raw-gone", job_id, b"kept"]]
    assert probe.call("ACKJOB", job_id) == 1


def test_huge_getjob_timeout_blocks_then_serves(node: DisqueProcess, probe: Resp) -> None:
    with Resp(node.port) as waiter:
        waiter.send(pack("GETJOB", "TIMEOUT", 2 ** 63 - 1, "FROM", "raw-huge-timeout"))
        wait_for(lambda: info_field(probe, "clients", "blocked_clients") == 1,
                 message="the GETJOB to block")
        job_id = probe.call("ADDJOB", "raw-huge-timeout", b"", 0)
        assert waiter.read() == [[b"raw-huge-timeout", job_id, b""]]
        assert probe.call("ACKJOB", job_id) == 1


# --------------------------------------------------------------------------
# Byte-exact replies: the framing the original's clients read
# --------------------------------------------------------------------------

def test_byte_exact_replies(conn: Resp) -> None:
    raw = conn.call_raw("ADDJOB", "raw-exact", b"body", 0)
    assert STATUS_JOB_ID.match(raw), raw  # a status reply, not a bulk string
    job_id = raw[1:-2]
    assert conn.call_raw("QPEEK", "raw-exact", 1) == (
        b"*1\r\n*3\r\n$9\r\nraw-exact\r\n$40\r\n" + job_id + b"\r\n$4\r\nbody\r\n")
    assert conn.call_raw("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "raw-exact") == (
        b"*1\r\n*7\r\n$9\r\nraw-exact\r\n$40\r\n" + job_id + b"\r\n$4\r\nbody\r\n"
        b"$5\r\nnacks\r\n:0\r\n$21\r\nadditional-deliveries\r\n:0\r\n")
    assert conn.call_raw("GETJOB", "NOHANG", "FROM", "raw-exact") == b"*-1\r\n"
    assert conn.call_raw("GETJOB", "TIMEOUT", 1, "FROM", "raw-exact") == b"*-1\r\n"
    assert conn.call_raw("ACKJOB", job_id) == b":1\r\n"
    assert conn.call_raw("SHOW", UNKNOWN_ID) == b"$-1\r\n"
    assert conn.call_raw("QSTAT", "raw-never") == b"$-1\r\n"
    assert conn.call_raw("QLEN", "raw-never") == b":0\r\n"
    assert conn.call_raw("QPEEK", "raw-never", 5) == b"*0\r\n"
    assert conn.call_raw("WORKING", UNKNOWN_ID) == (
        b"-NOJOB Job not known in the context of this node.\r\n")
    assert conn.call_raw("SHOW", "nope") == b"-BADID Invalid Job ID format.\r\n"
    assert conn.call_raw("ADDJOB", "q") == (
        b"-ERR wrong number of arguments for 'addjob' command\r\n")
    assert conn.call_raw("PING") == b"+PONG\r\n"


# --------------------------------------------------------------------------
# HELLO and RESP3
# --------------------------------------------------------------------------

def test_bare_hello(conn: Resp, node: DisqueProcess) -> None:
    reply = conn.call("HELLO")
    assert reply[0] == 1
    node_id = reply[1]
    assert re.fullmatch(rb"[0-9a-f]{40}", node_id)
    assert len(reply) == 3  # myself only
    entry_id, ip, port, priority = reply[2]
    assert entry_id == node_id
    assert ip, "HELLO must report a usable IP for this node"
    assert socket.inet_aton(ip.decode())
    assert int(port) == node.port
    assert int(priority) == 1
    assert conn.call("CLUSTER", "MYID") == node_id


def test_hello_2_stays_resp2(conn: Resp) -> None:
    reply = conn.call("HELLO", 2)
    assert isinstance(reply, list)  # RESP2: a flat key/value array
    info = dict(zip(reply[::2], reply[1::2], strict=True))
    assert info[b"proto"] == 2
    assert conn.call_raw("SHOW", UNKNOWN_ID) == b"$-1\r\n"
    assert conn.call_raw("GETJOB", "NOHANG", "FROM", "raw-empty") == b"*-1\r\n"


@pytest.mark.parametrize("version", [4, 1, 0, -1])
def test_hello_unsupported_version(conn: Resp, version: int) -> None:
    raw = conn.call_raw("HELLO", version)
    assert raw.startswith(b"-NOPROTO "), raw
    assert conn.call_raw("SHOW", UNKNOWN_ID) == b"$-1\r\n"  # still RESP2


def test_hello_3_reply_is_a_resp3_map(conn: Resp) -> None:
    raw = conn.call_raw("HELLO", 3)
    assert raw.startswith(b"%"), raw[:40]
    assert parse(raw)[b"proto"] == 3
    raw = conn.call_raw("HELLO", 2)
    assert raw.startswith(b"*"), raw[:40]


def test_resp3_replies_after_hello_3(conn: Resp) -> None:
    conn.call("HELLO", 3)
    assert conn.call_raw("SHOW", UNKNOWN_ID) == b"_\r\n"
    assert conn.call_raw("GETJOB", "NOHANG", "FROM", "raw-empty") == b"_\r\n"
    job_id = conn.call("ADDJOB", "raw-resp3", b"\x00\xff", 0)
    raw = conn.call_raw("SHOW", job_id)
    assert raw.startswith(b"%"), raw[:20]
    show = parse(raw)
    assert show[b"id"] == job_id and show[b"body"] == b"\x00\xff"
    assert show[b"queue"] == b"raw-resp3"
    stat = parse(conn.call_raw("QSTAT", "raw-resp3"))
    assert stat[b"len"] == 1
    assert conn.call("ACKJOB", job_id) == 1
    conn.call("HELLO", 2)
    assert conn.call_raw("SHOW", UNKNOWN_ID) == b"$-1\r\n"


def test_stock_redis_py_default_protocol(node: DisqueProcess) -> None:
    client = redis.Redis(host="127.0.0.1", port=node.port, socket_timeout=10)
    try:
        assert client.ping()
        body = b"\x00stock\xff"
        job_id = client.execute_command("ADDJOB", "raw-stock", body, 0)
        assert JOB_ID.match(job_id)
        show = client.execute_command("SHOW", job_id)
        assert isinstance(show, dict)
        assert show[b"body"] == body and show[b"queue"] == b"raw-stock"
        assert client.execute_command("SHOW", UNKNOWN_ID) is None
        assert client.execute_command("GETJOB", "NOHANG", "FROM", "raw-stock") == [
            [b"raw-stock", job_id, body]]
        assert client.execute_command("ACKJOB", job_id) == 1
    finally:
        client.close()


def test_redis_py_protocol_2_with_large_binary_body(node: DisqueProcess) -> None:
    client = node.client()
    body = os.urandom(3 * 1024 * 1024) + b"\r\n\x00"
    job_id = client.execute_command("ADDJOB", b"raw-\xffbig", body, 0)
    assert client.execute_command("GETJOB", "NOHANG", "FROM", b"raw-\xffbig") == [
        [b"raw-\xffbig", job_id, body]]
    assert client.execute_command("ACKJOB", job_id) == 1
