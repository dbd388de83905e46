"""ADDJOBS, the bulk ADDJOB extension, on one real node: replies, shared
options, per-body errors, and bad input refused before anything is added."""

from __future__ import annotations

import socket

import pytest
import redis

from disque.commands.bulk import MAX_BODIES
from tests.support.process import DisqueProcess


def show(r: redis.Redis, job_id: bytes) -> dict[bytes, object]:
    reply = r.execute_command("SHOW", job_id)
    assert reply is not None, job_id
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_ids_in_order_and_jobs_queued_in_order(r: redis.Redis) -> None:
    bodies = [b"b%d" % i for i in range(50)]
    ids = r.execute_command("ADDJOBS", "q", 0, "BODIES", *bodies)
    assert len(ids) == 50 and len(set(ids)) == 50
    assert all(isinstance(i, bytes) and len(i) == 40 and i.startswith(b"D-") for i in ids)
    assert r.execute_command("QLEN", "q") == 50
    got = r.execute_command("GETJOB", "COUNT", 100, "FROM", "q")
    assert [j[1] for j in got] == ids
    assert [j[2] for j in got] == bodies


def test_options_apply_to_every_job(r: redis.Redis) -> None:
    ids = r.execute_command("ADDJOBS", "q", 0, "RETRY", 7, "TTL", 70, "DELAY", 3,
                            "BODIES", "a", "b", "c")
    for job_id, body in zip(ids, (b"a", b"b", b"c"), strict=True):
        info = show(r, job_id)
        assert (info[b"retry"], info[b"delay"], info[b"body"]) == (7, 3, body)
        assert 68 <= info[b"ttl"] <= 70
    assert r.execute_command("QLEN", "q") == 0  # delayed, like ADDJOB DELAY 3


def test_extension_options_apply_to_every_job(r: redis.Redis) -> None:
    ids = r.execute_command("ADDJOBS", "q", 0, "RETRY", 5, "BACKOFF", 60, "MAXDELIVERIES", 3,
                            "BODIES", "a", "b")
    for job_id in ids:
        info = show(r, job_id)
        assert (info[b"backoff"], info[b"max-deliveries"]) == (60, 3)
        assert info[b"dead-letter-queue"] == b"q:dead"


def test_bodies_may_look_like_options(r: redis.Redis) -> None:
    ids = r.execute_command("ADDJOBS", "q", 0, "BODIES", "BODIES", "REPLICATE", "", "ASYNC")
    got = r.execute_command("GETJOB", "COUNT", 10, "FROM", "q")
    assert [j[2] for j in got] == [b"BODIES", b"REPLICATE", b"", b"ASYNC"]
    assert [j[1] for j in got] == ids


def test_maxlen_refuses_the_bodies_beyond_it(r: redis.Redis) -> None:
    r.execute_command("ADDJOB", "q", "first", 0)
    reply = r.execute_command("ADDJOBS", "q", 0, "MAXLEN", 3, "BODIES", "a", "b", "c", "d")
    assert [isinstance(x, bytes) for x in reply] == [True, True, False, False]
    for err in reply[2:]:
        assert isinstance(err, redis.exceptions.ResponseError)
        assert str(err).startswith("MAXLEN Queue is already longer")
    assert r.execute_command("QLEN", "q") == 3


def test_bad_input_refuses_the_whole_command(r: redis.Redis) -> None:
    cases = {
        ("ADDJOBS", "q", 0, "BODIES"): "wrong number of arguments",
        ("ADDJOBS", "q", 0, "a"): "wrong number of arguments",
        ("ADDJOBS", "q", 0, "RETRY", 5): "ADDJOBS needs BODIES",
        ("ADDJOBS", "q", 0, "RETRY", 5, "BODIES"): "ADDJOBS needs BODIES followed by",
        ("ADDJOBS", "q", "soon", "BODIES", "a"): "timeout is not an integer",
        ("ADDJOBS", "q", -1, "BODIES", "a"): "timeout is negative",
        ("ADDJOBS", "q", 0, "TTL", 0, "BODIES", "a"): "TTL must be a number > 0",
        ("ADDJOBS", "q", 0, "REPLICATE", 70000, "BODIES", "a"): "REPLICATE must be between",
        ("ADDJOBS", "q", 0, "RETRY", "x", "BODIES", "a"): "RETRY time must be",
        ("ADDJOBS", "q", 0, "DELAY", "bodies", "a"): "syntax error",  # DELAY lacks a value
        ("ADDJOBS", "q", 0, "NOSUCH", "BODIES", "a"): "syntax error",
        ("ADDJOBS", "q", 0, "DELAY", 10, "TTL", 5, "BODIES", "a"): "DELAY is greater than TTL",
        ("ADDJOBS", "q", 0, "IDMP", "k", "BODIES", "a", "b"): "IDMP names one job",
        ("ADDJOBS", "q", 0, "BACKOFF", 0, "BODIES", "a"): "BACKOFF must be",
    }
    for args, message in cases.items():
        with pytest.raises(redis.exceptions.ResponseError, match=message):
            r.execute_command(*args)
    too_many = [b"x"] * (MAX_BODIES + 1)
    with pytest.raises(redis.exceptions.ResponseError, match=f"at most {MAX_BODIES}"):
        r.execute_command("ADDJOBS", "q", 0, "BODIES", *too_many)
    assert r.execute_command("QLEN", "q") == 0
    assert r.execute_command("PING") is True  # redis-py maps +PONG to True


def test_paused_queue_refuses_the_whole_command(r: redis.Redis) -> None:
    r.execute_command("PAUSE", "q", "in")
    with pytest.raises(redis.exceptions.ResponseError, match="PAUSED"):
        r.execute_command("ADDJOBS", "q", 0, "BODIES", "a", "b")
    r.execute_command("PAUSE", "q", "none")
    assert len(r.execute_command("ADDJOBS", "q", 0, "BODIES", "a", "b")) == 2


def test_a_huge_batch_stops_at_maxmemory_and_keeps_what_it_added(r: redis.Redis) -> None:
    used = r.info("memory")["used_memory"]
    r.execute_command("CONFIG", "SET", "maxmemory", str(used + 2_000_000))
    body = b"x" * 50_000
    reply = r.execute_command("ADDJOBS", "q", 0, "BODIES", *([body] * 200))
    added = [x for x in reply if isinstance(x, bytes)]
    refused = [x for x in reply if not isinstance(x, bytes)]
    assert 10 < len(added) < 200 and len(added) + len(refused) == 200
    # The IDs come first, then only -OOM: a refused body is never followed by an added one.
    assert reply[:len(added)] == added
    assert all(str(err).startswith("command not allowed") for err in refused)
    assert r.execute_command("QLEN", "q") == len(added)
    # The node keeps serving, and every returned ID is a job.
    jobs = r.execute_command("GETJOB", "COUNT", 1000, "FROM", "q")
    assert [j[1] for j in jobs] == added


def test_pipelined_with_addjob_and_a_large_batch(server: DisqueProcess) -> None:
    r = server.client()
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("ADDJOB", "q", "one", 0)
    pipe.execute_command("ADDJOBS", "q", 0, "BODIES", *[b"%d" % i for i in range(MAX_BODIES)])
    pipe.execute_command("QLEN", "q")
    single, many, qlen = pipe.execute()
    assert single.startswith(b"D-") and len(many) == MAX_BODIES
    assert qlen == MAX_BODIES + 1


def test_huge_bodies_through_a_raw_socket(server: DisqueProcess) -> None:
    """Two 4 MB bodies in one command, sent in small pieces."""
    body = b"z" * (4 * 1024 * 1024)
    parts = [b"ADDJOBS", b"q", b"0", b"BODIES", body, body]
    request = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        for i in range(0, len(request), 65536):
            sock.sendall(request[i:i + 65536])
        reply = b""
        while reply.count(b"\r\n") < 3:
            chunk = sock.recv(4096)
            assert chunk, "connection closed"
            reply += chunk
    assert reply.startswith(b"*2\r\n$40\r\nD-")
    r = server.client()
    assert r.execute_command("QLEN", "q") == 2
    job = r.execute_command("GETJOB", "FROM", "q")
    assert job[0][2] == body
