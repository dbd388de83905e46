"""Pipelined ADDJOBs on a cluster replicate together, and still answer in
order (connection.ReplySlot); any other command waits for them."""

from __future__ import annotations

import os
import signal
import socket

import pytest
import redis

from tests.support.cluster import holders, show
from tests.support.process import DisqueProcess, wait_for


def _pipeline(node: DisqueProcess, commands: list[tuple]) -> list:
    pipe = node.client().pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)


def _waiting(node: DisqueProcess) -> int:
    return len(node.client().execute_command("JSCAN", 0, "COUNT", 10000, "STATE",
                                             "wait-repl")[1])


def test_replies_come_in_order_and_every_job_has_its_copies(make_cluster) -> None:
    a, b, c = make_cluster(3)
    bodies = [f"job-{i}".encode() for i in range(300)]
    replies = _pipeline(a, [("ADDJOB", "q", body, 0) for body in bodies])
    assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies)
    assert len(set(replies)) == len(bodies)
    for job_id, body in zip(replies, bodies, strict=True):
        assert show(a, job_id)[b"body"] == body  # reply i is job i
    for job_id in replies[::50]:
        assert holders([a, b, c], job_id) == [a, b, c]
    assert a.client().execute_command("QLEN", "q") == len(bodies)


def test_other_commands_wait_for_the_addjobs_before_them(make_cluster) -> None:
    a, _, _ = make_cluster(3)
    replies = _pipeline(a, [("ADDJOB", "q", "x", 0), ("ADDJOB", "q", "y", 0), ("QLEN", "q"),
                            ("ADDJOB", "q", "z", 0, "REPLICATE", 1), ("QLEN", "q")])
    # Each QLEN sees every job added before it: replicated and queued.
    assert replies[2] == 2 and replies[4] == 3
    assert [show(a, r)[b"body"] for r in (replies[0], replies[1], replies[3])] == [
        b"x", b"y", b"z"]


def test_errors_and_timeouts_keep_their_place(make_cluster) -> None:
    a, _, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)  # REPLICATE 3 cannot finish: those time out
    try:
        replies = _pipeline(a, [
            ("ADDJOB", "q", "one", 300, "REPLICATE", 3),
            ("ADDJOB", "q", "two", 0, "REPLICATE", 2),
            ("ADDJOB", "q", "bad", 0, "REPLICATE", "nope"),
            ("ADDJOB", "q", "three", 200, "REPLICATE", 3),
            ("ADDJOB", "q", "four", 0, "REPLICATE", 1),
        ])
    finally:
        os.kill(c.pid, signal.SIGCONT)
    assert isinstance(replies[0], redis.ResponseError) and "NOREPL Timeout" in str(replies[0])
    assert show(a, replies[1])[b"body"] == b"two"
    assert isinstance(replies[2], redis.ResponseError) and "REPLICATE" in str(replies[2])
    assert isinstance(replies[3], redis.ResponseError) and "NOREPL Timeout" in str(replies[3])
    assert show(a, replies[4])[b"body"] == b"four"


def test_a_client_gone_with_addjobs_waiting_leaves_no_copies(make_cluster) -> None:
    a, b, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)
    try:
        request = b"".join(b"*6\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$1\r\nx\r\n$1\r\n0\r\n"
                           b"$9\r\nREPLICATE\r\n$1\r\n3\r\n" for _ in range(20))
        with socket.create_connection(("127.0.0.1", a.port)) as sock:
            sock.sendall(request)
            wait_for(lambda: _waiting(a) == 20, timeout=10,
                     message="all 20 pipelined ADDJOBs waiting for copies at once")
            info = a.client().execute_command("CLIENT", "LIST").decode()
            assert any("flags=b" in line and "cmd=addjob" in line
                       for line in info.splitlines())
        wait_for(lambda: _waiting(a) == 0, timeout=10, message="the abandoned ADDJOBs undone")
    finally:
        os.kill(c.pid, signal.SIGCONT)
    wait_for(lambda: not any(n.client().execute_command("JSCAN", 0, "COUNT", 1000)[1]
                             for n in (a, b, c)), timeout=10,
             message="the partial copies deleted on every node")


@pytest.mark.parametrize("count", [1500])
def test_more_addjobs_than_may_overlap_still_all_answer(make_cluster, count: int) -> None:
    # Above MAX_OVERLAPPED_ADDJOBS (1024) the rest wait their turn.
    a, _, _ = make_cluster(3)
    replies = _pipeline(a, [("ADDJOB", "q", str(i), 0) for i in range(count)])
    assert len(set(replies)) == count and all(r.startswith(b"D-") for r in replies)
    assert a.client().execute_command("QLEN", "q") == count
