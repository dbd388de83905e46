"""ADDJOBS (the bulk ADDJOB extension) on a cluster: every job of the batch
gets its copies before the reply, a job whose copies time out gets -NOREPL
in its place and leaves no copy, a client gone mid-batch leaves nothing."""

from __future__ import annotations

import os
import signal
import socket

import redis

from tests.support.cluster import holders, show
from tests.support.process import wait_for


def test_every_job_of_the_batch_is_replicated_before_the_reply(make_cluster) -> None:
    a, b, c = make_cluster(3)
    bodies = [b"job-%d" % i for i in range(500)]
    ids = a.client().execute_command("ADDJOBS", "q", 0, "BODIES", *bodies)
    assert len(set(ids)) == 500
    for job_id, body in list(zip(ids, bodies, strict=True))[::25]:
        assert holders([a, b, c], job_id) == [a, b, c]  # REPLICATE 3 by default
        assert show(b, job_id)[b"body"] == body
    assert a.client().execute_command("QLEN", "q") == 500


def test_replicate_two_and_async(make_cluster) -> None:
    a, b, c = make_cluster(3)
    two = a.client().execute_command("ADDJOBS", "q", 0, "REPLICATE", 2, "BODIES", "x", "y")
    for job_id in two:
        assert len(holders([a, b, c], job_id)) == 2
    fast = a.client().execute_command("ADDJOBS", "q", 0, "ASYNC", "BODIES", "x", "y")
    for job_id in fast:
        wait_for(lambda job_id=job_id: len(holders([a, b, c], job_id)) == 3, timeout=10,
                 message="ASYNC copies made in the background")


def test_timed_out_jobs_get_noreply_in_place_and_leave_no_copy(make_cluster) -> None:
    a, b, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)  # REPLICATE 3 cannot finish
    try:
        # One pipeline: c is soon suspected failing, and then REPLICATE 3
        # is refused up front rather than timing out.
        pipe = a.client().pipeline(transaction=False)
        pipe.execute_command("ADDJOBS", "q", 300, "BODIES", "one", "two", "three")
        pipe.execute_command("ADDJOBS", "q", 0, "REPLICATE", 2, "BODIES", "four")
        reply, ok = pipe.execute(raise_on_error=False)
    finally:
        os.kill(c.pid, signal.SIGCONT)
    assert isinstance(reply, list) and len(reply) == 3, str(reply)
    for err in reply:
        assert isinstance(err, redis.ResponseError) and "NOREPL Timeout" in str(err)
    assert show(a, ok[0])[b"body"] == b"four"

    def timed_out_copies() -> list[bytes]:
        return [job_id for n in (a, b, c)
                for job_id in n.client().execute_command("JSCAN", 0, "COUNT", 1000)[1]
                if job_id != ok[0]]

    # Job four may have copies on all three nodes (a third node is asked
    # when the first stays silent); the timed-out ones have none left.
    wait_for(lambda: not timed_out_copies(), timeout=10,
             message=lambda: f"the timed-out jobs' copies to go: {timed_out_copies()}")


def test_not_enough_nodes_refuses_the_whole_batch(make_cluster) -> None:
    a, _, _ = make_cluster(3)
    try:
        a.client().execute_command("ADDJOBS", "q", 0, "REPLICATE", 5, "BODIES", "x", "y")
    except redis.ResponseError as err:
        assert "NOREPL Not enough reachable nodes" in str(err)
    else:
        raise AssertionError("ADDJOBS REPLICATE 5 on 3 nodes was accepted")
    assert a.client().execute_command("JSCAN", 0, "COUNT", 100)[1] == []


def test_a_client_gone_mid_batch_leaves_no_copies(make_cluster) -> None:
    a, b, c = make_cluster(3)
    os.kill(c.pid, signal.SIGSTOP)
    try:
        parts = [b"ADDJOBS", b"q", b"0", b"BODIES"] + [b"x"] * 20
        request = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p)
                                                       for p in parts)
        with socket.create_connection(("127.0.0.1", a.port)) as sock:
            sock.sendall(request)
            wait_for(lambda: len(a.client().execute_command(
                "JSCAN", 0, "COUNT", 1000, "STATE", "wait-repl")[1]) == 20, timeout=10,
                message="the batch's 20 jobs waiting for copies")
        wait_for(lambda: not a.client().execute_command(
            "JSCAN", 0, "COUNT", 1000, "STATE", "wait-repl")[1], timeout=10,
            message="the abandoned batch undone")
    finally:
        os.kill(c.pid, signal.SIGCONT)
    wait_for(lambda: not any(n.client().execute_command("JSCAN", 0, "COUNT", 1000)[1]
                             for n in (a, b, c)), timeout=10,
             message="the partial copies deleted on every node")
