"""What one client may make the node hold, and what it may name: the limits
of docs/SECURITY.md, each against the attack that found it missing and an
honest client at the limit beside it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from tests.server.test_bad_input import assert_error, info_int
from tests.server.test_protocol_raw import JOB_ID, Resp, pack
from tests.support.process import DisqueProcess, closed_by_peer, wait_for


def client_fields(c: Resp, name: bytes) -> dict[str, str]:
    """CLIENT LIST's fields of the connection called ``name`` ({} if none)."""
    for line in c.call("CLIENT", "LIST").decode().splitlines():
        fields = dict(part.split("=", 1) for part in line.split(" ") if "=" in part)
        if fields.get("name") == name.decode():
            return fields
    return {}


def memory(c: Resp) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in c.call("INFO", "memory").decode().splitlines():
        key, _, value = line.partition(":")
        if value.isdigit():
            out[key] = int(value)
    return out


# --------------------------------------------------------------------------
# Before AUTH: Redis's pre-auth limits, auth-timeout
# --------------------------------------------------------------------------

@pytest.fixture
def locked(server_factory) -> DisqueProcess:
    return server_factory("--requirepass", "s3cret", "--auth-timeout", "2")


@pytest.mark.parametrize(("request_start", "error"), [
    (b"*11\r\n", b"-ERR Protocol error: unauthenticated multibulk length\r\n"),
    (b"*1000000\r\n", b"-ERR Protocol error: unauthenticated multibulk length\r\n"),
    (b"*3\r\n$6\r\nADDJOB\r\n$16385\r\n", b"-ERR Protocol error: unauthenticated bulk length\r\n"),
    (b"*2\r\n$4\r\nAUTH\r\n$536870912\r\n",
     b"-ERR Protocol error: unauthenticated bulk length\r\n"),
])
def test_before_auth_a_request_is_small(locked: DisqueProcess, request_start: bytes,
                                        error: bytes) -> None:
    """With requirepass, a client that has not authenticated could make the
    node buffer a bulk of up to 1 GB (4 connections: +237 MB of RSS).  Now
    the header alone is refused, before anything is buffered."""
    with Resp(locked.port) as c:
        c.send(request_start)
        assert c.read_until_closed() == error


def test_the_limits_go_with_auth_in_the_same_read(locked: DisqueProcess) -> None:
    """AUTH pipelined with a large request: the AUTH runs before the next
    request is parsed (as in Redis), so the large one is taken."""
    body = b"b" * 100_000
    with Resp(locked.port) as c:
        c.send(pack("AUTH", "s3cret") + pack("ADDJOB", "q", body, 0, "RETRY", 0, "REPLICATE", 1)
               + pack("QLEN", "q"))
        assert c.read() == b"OK"
        assert JOB_ID.match(c.read())
        assert c.read() == 1
        # A client that failed AUTH is held to the limits again.
        assert_error(c, ("AUTH", "wrong"), exact="ERR invalid password")
        c.send(b"*3\r\n$6\r\nADDJOB\r\n$16385\r\n")
        assert c.read_until_closed() == b"-ERR Protocol error: unauthenticated bulk length\r\n"


def test_a_500_mb_body_after_auth(locked: DisqueProcess) -> None:
    """An honest client at the size limit: AUTH, then a 500 MB job, and back."""
    body = b"\x01" * (500 * 1024 * 1024)
    with Resp(locked.port, timeout=120) as c:
        assert c.call("AUTH", "s3cret") == b"OK"
        job_id = c.call("ADDJOB", "big", body, 0, "RETRY", 0, "REPLICATE", 1)
        assert JOB_ID.match(job_id)
        got = c.call("GETJOB", "FROM", "big")
        assert got[0][1] == job_id and got[0][2] == body
        del got
        assert c.call("ACKJOB", job_id) == 1


def test_a_connection_that_does_not_authenticate_is_closed(locked: DisqueProcess) -> None:
    """Idle unauthenticated connections filled maxclients; now they have
    auth-timeout seconds to authenticate."""
    with Resp(locked.port) as authed, Resp(locked.port) as idle, Resp(locked.port) as pinging:
        assert authed.call("AUTH", "s3cret") == b"OK"
        assert pinging.call("PING") == b"PONG"
        assert closed_by_peer(idle.sock, timeout=15)
        assert closed_by_peer(pinging.sock, timeout=15)  # PING is not AUTH
        assert authed.call("PING") == b"PONG"
        assert info_int(authed, "stats", "auth_timeout_disconnections") == 2


def test_a_pipeline_before_auth_does_not_hold_the_loop(server_factory) -> None:
    """Before AUTH each request is parsed and run on its own (an AUTH may lift
    the limits for the next).  The rest of the read was sliced off after each
    one, the square of the read's size: 4 MB of inline PINGs from a client
    without the password froze every other client for 7 s.  Now the node
    serves others between batches of them."""
    locked = server_factory("--requirepass", "s3cret")
    count = 800_000
    flood = socket.create_connection(("127.0.0.1", locked.port))
    answered = [0]

    def read_replies() -> None:
        while answered[0] < count:
            try:
                data = flood.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            answered[0] += data.count(b"\r\n")

    reader = threading.Thread(target=read_replies, daemon=True)
    try:
        with Resp(locked.port, timeout=60) as other:
            assert other.call("AUTH", "s3cret") == b"OK"
            reader.start()
            flood.sendall(b"PING\n" * count)
            worst = 0.0
            while reader.is_alive():
                started = time.monotonic()
                assert other.call("PING") == b"PONG"
                worst = max(worst, time.monotonic() - started)
                reader.join(0.001)  # until the flood is answered
            assert answered[0] == count
            assert worst < 1.0, f"another client waited {worst:.2f} s"
    finally:
        flood.close()


def test_a_failed_auth_in_a_pipeline_keeps_the_order(locked: DisqueProcess) -> None:
    """A pipeline whose AUTH fails: what it queued before the failure ran
    after it, and a new read (an AUTH that works) ran at once, ahead of
    them, its reply among theirs and the queued commands then run as the
    user it authenticated.  Now it waits its turn."""
    queued = 9_000
    for _ in range(3):  # the new read must come while the queue drains
        sock = socket.create_connection(("127.0.0.1", locked.port))
        with sock:
            sock.sendall(pack("AUTH", "s3cret"))
            data = bytearray()
            while not data.endswith(b"\r\n"):
                data += sock.recv(100)
            assert data == b"+OK\r\n"
            data.clear()

            def read_replies(sock: socket.socket = sock, data: bytearray = data) -> None:
                sent = False
                while not data.endswith(b"$6\r\nmarker\r\n"):
                    chunk = sock.recv(1 << 20)
                    if not chunk:
                        return
                    data += chunk
                    if not sent and b"-ERR invalid password" in data:
                        # While the commands behind the failed AUTH still run.
                        sock.sendall(pack("AUTH", "s3cret") + pack("ECHO", "marker"))
                        sent = True

            reader = threading.Thread(target=read_replies, daemon=True)
            reader.start()
            sock.sendall(pack("GETJOB", "TIMEOUT", 100, "FROM", "nothing")
                         + pack("AUTH", "wrong") + pack("HELLO", 3) * queued)
            reader.join(60)
            assert data.endswith(b"$6\r\nmarker\r\n")
            replies = bytes(data[data.index(b"-ERR invalid password"):])
            before_ok = replies[:replies.index(b"+OK\r\n")]
            assert before_ok.count(b"-NOAUTH") == queued
            # Authenticated again by an AUTH that waited in the queue: a
            # read is parsed whole again, not one request per read.
            sock.settimeout(10)
            sock.sendall(pack("ECHO", "a") + pack("ECHO", "b"))
            data.clear()
            while not data.endswith(b"$1\r\nb\r\n"):
                data += sock.recv(100)
            assert data == b"$1\r\na\r\n$1\r\nb\r\n"


def test_auth_timeout_counts_from_a_failed_auth(locked: DisqueProcess) -> None:
    """A long-lived connection whose AUTH fails (a rotated password) gets the
    whole auth-timeout to authenticate again, not a close at the next walk."""
    with Resp(locked.port) as c, Resp(locked.port) as admin:
        assert admin.call("AUTH", "s3cret") == b"OK"
        assert c.call("AUTH", "s3cret") == b"OK"
        assert c.call("CLIENT", "SETNAME", "rotating") == b"OK"
        wait_for(lambda: int(client_fields(admin, b"rotating").get("age", 0)) >= 3,
                 message="the connection older than auth-timeout (2 s)")
        assert_error(c, ("AUTH", "wrong"), exact="ERR invalid password")
        assert not closed_by_peer(c.sock, timeout=1.2)  # a walk or two later: still there
        assert c.call("AUTH", "s3cret") == b"OK"
        assert c.call("PING") == b"PONG"


def test_no_auth_timeout_without_a_password(server_factory) -> None:
    """Nothing to authenticate: a quiet client stays (two of the node's
    once-a-second walks over its clients pass while it waits)."""
    node = server_factory("--auth-timeout", "1")
    with Resp(node.port) as c:
        assert c.call("PING") == b"PONG"
        assert not closed_by_peer(c.sock, timeout=2.5)
        assert c.call("PING") == b"PONG"
        assert info_int(c, "stats", "auth_timeout_disconnections") == 0


# --------------------------------------------------------------------------
# Pending input and output, bounded in bytes
# --------------------------------------------------------------------------

def block(c: Resp, name: bytes, queue: bytes) -> None:
    c.call("CLIENT", "SETNAME", name)
    c.send(pack("GETJOB", "FROM", queue))


def test_commands_queued_behind_a_block_count_against_the_query_limit(
        server_factory) -> None:
    """20 x 30 MB commands behind a blocked GETJOB added 640 MB with a 64 MB
    query-buffer limit: the count of queued commands was bounded, not their
    bytes.  Now they count with the request being read."""
    node = server_factory("--client-query-buffer-limit", "4mb")
    with Resp(node.port) as admin, Resp(node.port) as c:
        block(c, b"hog", b"ql-empty")
        wait_for(lambda: info_int(admin, "clients", "blocked_clients") == 1)
        chunk = pack("ECHO", b"e" * (1024 * 1024))
        try:
            for _ in range(20):
                c.send(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # closed while we were still sending: what is tested
        assert closed_by_peer(c.sock, timeout=15)
        assert info_int(admin, "stats", "client_query_buffer_limit_disconnections") == 1
        wait_for(lambda: memory(admin)["mem_clients_normal"] < 1024 * 1024,
                 message=lambda: f"buffers freed: {memory(admin)}")
    assert "Closing client that reached max query buffer length" in node.log_text()


def test_an_honest_client_queues_at_the_limit(server_factory) -> None:
    """Queued commands under the limit run once the block ends; while they
    wait, they count in used_memory."""
    node = server_factory("--client-query-buffer-limit", "4mb")
    with Resp(node.port) as admin, Resp(node.port) as c:
        block(c, b"waiter", b"ql-honest")
        wait_for(lambda: info_int(admin, "clients", "blocked_clients") == 1)
        payload = b"p" * (1024 * 1024)
        c.send(pack("ECHO", payload) * 3)
        wait_for(lambda: int(client_fields(admin, b"waiter")["qbuf"]) >= 3 * len(payload),
                 message="the three ECHOs queued")
        wait_for(lambda: memory(admin)["mem_clients_normal"] >= 3 * len(payload),
                 message=lambda: f"queued commands in used_memory: {memory(admin)}")
        job_id = admin.call("ADDJOB", "ql-honest", "go", 0)
        assert c.read()[0][1] == job_id
        for _ in range(3):
            assert c.read() == payload


def test_what_a_deleted_user_queued_does_not_run(server_factory) -> None:
    """ACL DELUSER closes the user's connections, but the commands they had
    queued (behind replies the client had not read yet) still ran once it
    read them, as the deleted user: here an ADDJOB whose ID nobody saw."""
    node = server_factory()
    with Resp(node.port) as admin:
        admin.call("ADDJOB", "big", b"b" * (8 * 1024 * 1024), 0)
        assert admin.call("ACL", "SETUSER", "eve", "on", ">pw", "~*", "+@all") == b"OK"
        sock = socket.create_connection(("127.0.0.1", node.port))
        # Small enough that the replies wait in the node, not so small that
        # reading them at the end takes minutes.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        with sock:
            sock.sendall(pack("AUTH", "eve", "pw") + pack("CLIENT", "SETNAME", "eve")
                         + pack("QPEEK", "big", 1) + pack("QPEEK", "big", 1)
                         + pack("ADDJOB", "after-deluser", "x", 0))
            wait_for(lambda: int(client_fields(admin, b"eve").get("qbuf", 0)) > 0,
                     message="the commands behind the unread reply queued")
            assert admin.call("ACL", "DELUSER", "eve") == 1
            sock.settimeout(30)
            while sock.recv(1 << 20):  # eve reads what was written, to the end
                pass
        assert admin.call("QLEN", "after-deluser") == 0
        assert admin.call("QLEN", "big") == 1


def test_unread_replies_do_not_pile_up(server_factory) -> None:
    """A 10 KB pipeline of 400 QPEEKs of a 1 MB job queued 400 MB of replies
    within one read.  Now a client's commands stop while its replies are not
    read: the node holds about one reply, the rest waits as commands."""
    node = server_factory()
    with Resp(node.port) as admin:
        admin.call("ADDJOB", "amp", b"a" * (1024 * 1024), 0)
        sock = socket.create_connection(("127.0.0.1", node.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock.sendall(pack("CLIENT", "SETNAME", "amp") + pack("QPEEK", "amp", 1) * 400)
            wait_for(lambda: int(client_fields(admin, b"amp").get("qbuf", 0)) > 0,
                     message="the QPEEKs held back while the replies are unread")
            fields = client_fields(admin, b"amp")
            assert int(fields["omem"]) < 4 * 1024 * 1024, fields
            assert memory(admin)["mem_clients_normal"] < 8 * 1024 * 1024
        finally:
            sock.close()
    # A client that reads gets every reply.
    with Resp(node.port, timeout=60) as reader:
        reader.send(pack("QPEEK", "amp", 1) * 400)
        for _ in range(400):
            assert len(reader.read()[0][2]) == 1024 * 1024


def test_one_reply_over_the_hard_output_limit_disconnects(server_factory) -> None:
    node = server_factory("--client-output-buffer-limit", "normal 1mb 0 0")
    with Resp(node.port) as admin:
        # Far more than the kernel's socket buffers take (they are not ours).
        admin.call("ADDJOB", "obl", b"o" * (32 * 1024 * 1024), 0)
        sock = socket.create_connection(("127.0.0.1", node.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with sock:
            sock.sendall(pack("QPEEK", "obl", 1))
            assert closed_by_peer(sock, timeout=15)
        assert info_int(admin, "stats", "client_output_buffer_limit_disconnections") == 1
        assert admin.call("QLEN", "obl") == 1  # the job is where it was
    assert "closed for overcoming of output buffer limits" in node.log_text()


def test_replies_above_the_soft_limit_for_too_long_disconnect(server_factory) -> None:
    node = server_factory("--client-output-buffer-limit", "normal 0 256kb 1")
    with Resp(node.port) as admin:
        admin.call("ADDJOB", "soft", b"s" * (32 * 1024 * 1024), 0)
        sock = socket.create_connection(("127.0.0.1", node.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        with sock:
            sock.sendall(pack("QPEEK", "soft", 1))
            assert closed_by_peer(sock, timeout=15)
        assert info_int(admin, "stats", "client_output_buffer_limit_disconnections") == 1
        # A reader of the same reply is not disconnected.
        assert len(admin.call("QPEEK", "soft", 1)[0][2]) == 32 * 1024 * 1024


@pytest.mark.parametrize("text", ["normal 1", "replica 1mb 1mb 1", "normal 100 0 0",
                                  "normal 1mb 2mb 1", "normal x 0 0", "normal 0 0 -1"])
def test_bad_output_limits_are_refused(server_factory, text: str) -> None:
    node = server_factory()
    with Resp(node.port) as c:
        before = c.call("CONFIG", "GET", "client-output-buffer-limit")
        assert_error(c, ("CONFIG", "SET", "client-output-buffer-limit", text),
                     prefix="ERR Invalid argument")
        assert c.call("CONFIG", "GET", "client-output-buffer-limit") == before
        assert before == [b"client-output-buffer-limit", b"normal 1gb 256mb 60"]


def test_a_pipeline_of_10000_addjobs_at_the_smallest_query_limit(server_factory) -> None:
    node = server_factory("--client-query-buffer-limit", "1mb")
    with Resp(node.port, timeout=60) as c:
        c.send(b"".join(pack("ADDJOB", "pipe", b"job-%05d" % i, 0) for i in range(10_000)))
        ids = [c.read() for _ in range(10_000)]
        assert all(JOB_ID.match(job_id) for job_id in ids)
        assert c.call("QLEN", "pipe") == 10_000


def test_50_blocked_consumers(server_factory) -> None:
    node = server_factory()
    results: list[Any] = []
    consumers = [Resp(node.port, timeout=30) for _ in range(50)]
    try:
        for i, consumer in enumerate(consumers):
            block(consumer, b"consumer-%d" % i, b"fifty")
        with Resp(node.port) as admin:
            wait_for(lambda: info_int(admin, "clients", "blocked_clients") == 50)
            ids = {admin.call("ADDJOB", "fifty", b"%d" % i, 0) for i in range(50)}
            threads = [threading.Thread(target=lambda c=c: results.append(c.read()[0][1]))
                       for c in consumers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)
        assert sorted(results) == sorted(ids)
    finally:
        for consumer in consumers:
            consumer.close()


# --------------------------------------------------------------------------
# What one command may name
# --------------------------------------------------------------------------

NAMING_COMMANDS = [("QLEN", "{q}"), ("QSTAT", "{q}"), ("QPEEK", "{q}", 1), ("PAUSE", "{q}", "in"),
                   ("QLIMIT", "{q}", 10, 1000), ("ADDJOB", "{q}", "x", 0),
                   ("ADDJOBS", "{q}", 0, "BODIES", "x"), ("GETJOB", "NOHANG", "FROM", "{q}"),
                   ("GETJOB", "NOHANG", "FROM", "ok", "{q}"),
                   ("ADDJOB", "ok", "x", 0, "RETRY", 1, "MAXDELIVERIES", 1, "DEADLETTER", "{q}")]


@pytest.mark.parametrize("args", NAMING_COMMANDS, ids=lambda a: " ".join(map(str, a[:2])))
def test_a_queue_name_over_the_limit_is_refused(server_factory, args: tuple) -> None:
    node = server_factory("--max-queue-name-len", "100")
    name = b"n" * 101
    with Resp(node.port) as c:
        queues = info_int(c, "queues", "registered_queues")
        jobs = info_int(c, "jobs", "registered_jobs")
        assert_error(c, tuple(name if a == "{q}" else a for a in args),
                     exact="ERR queue name too long: 101 bytes, the limit is 100 "
                           "(max-queue-name-len)")
        assert info_int(c, "queues", "registered_queues") == queues
        assert info_int(c, "jobs", "registered_jobs") == jobs
        assert c.call("QLEN", b"n" * 100) == 0  # at the limit


def test_the_queues_a_read_made_for_nothing_go_with_it(server_factory) -> None:
    """GETJOB ... FROM 200,000 names made 200,000 queues that stayed after the
    client left (idle eviction takes 300 s, as in the original).  A queue
    that only a reader made goes when its last reader does."""
    node = server_factory()
    names = [b"made-%d" % i for i in range(1024)]
    with Resp(node.port) as c, Resp(node.port) as other:
        assert c.call("ADDJOB", "made-5", "kept", 0)
        queues = info_int(c, "queues", "registered_queues")
        assert c.call_raw("GETJOB", "TIMEOUT", 10, "FROM", *names[6:]) == b"*-1\r\n"
        assert info_int(c, "queues", "registered_queues") == queues  # timed out
        block(other, b"gone", b"made-7")
        wait_for(lambda: info_int(c, "queues", "registered_queues") == queues + 1)
        other.close()
        wait_for(lambda: info_int(c, "queues", "registered_queues") == queues,
                 message="the queue of a reader that left")
        # Woken from one queue, the others it made go; one that held a job stays.
        got = c.call("GETJOB", "FROM", *names[:6])
        assert got[0][0] == b"made-5"
        assert c.call("QSTAT", "made-5") is not None
        assert info_int(c, "queues", "registered_queues") == queues


# --------------------------------------------------------------------------
# Settings that point the node at the file system
# --------------------------------------------------------------------------

def test_dir_is_protected(server_factory, tmp_path) -> None:
    node = server_factory()
    with Resp(node.port) as c:
        before = c.call("CONFIG", "GET", "dir")
        assert_error(c, ("CONFIG", "SET", "dir", "/proc"),
                     exact="ERR CONFIG SET failed (possibly related to argument 'dir') - can't "
                           "set protected config (enable-protected-configs is no)")
        assert c.call("CONFIG", "GET", "dir") == before
        for name in ("aclfile", "appendfilename", "cluster-config-file", "tls-cert-file",
                     "tls-key-file", "tls-ca-cert-file", "logfile", "enable-protected-configs"):
            assert_error(c, ("CONFIG", "SET", name, str(tmp_path / "x")),
                         exact=f"ERR Unsupported CONFIG parameter: {name}")


@pytest.mark.parametrize("setting", ["yes", "local"])
def test_dir_when_protected_configs_are_enabled(server_factory, tmp_path, setting: str) -> None:
    node = server_factory("--enable-protected-configs", setting)
    target = tmp_path / "elsewhere"
    target.mkdir()
    with Resp(node.port) as c:
        assert c.call("CONFIG", "SET", "dir", str(target)) == b"OK"
        assert c.call("CONFIG", "GET", "dir") == [b"dir", str(target).encode()]
