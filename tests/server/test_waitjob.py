"""WAITJOB (extension): block until a job is acknowledged, on a real node."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import redis

from tests.support.process import DisqueProcess, wait_for


def waiting(r: redis.Redis) -> int:
    return r.info("extensions")["waitjob_clients"]


def wait_in_thread(server: DisqueProcess, job_id: bytes, timeout_ms: int,
                   out: list[object]) -> threading.Thread:
    def run() -> None:
        try:
            out.append(server.client().execute_command("WAITJOB", job_id, timeout_ms))
        except redis.ResponseError as err:
            out.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_waiters_get_acked_when_a_worker_acks(server: DisqueProcess) -> None:
    r = server.client()
    job_id = r.execute_command("ADDJOB", "q", "request", 0)
    results: list[object] = []
    threads = [wait_in_thread(server, job_id, 10_000, results) for _ in range(2)]
    wait_for(lambda: waiting(r) == 2, 5, message="two WAITJOB clients blocked")
    assert r.info("clients")["blocked_clients"] == 2
    worker = server.client()
    got = worker.execute_command("GETJOB", "FROM", "q")
    assert got[0][1] == job_id and results == []  # delivery is not completion
    assert worker.execute_command("ACKJOB", job_id) == 1
    for thread in threads:
        thread.join(5)
    assert results == [b"ACKED", b"ACKED"]
    assert waiting(r) == 0 and r.info("clients")["blocked_clients"] == 0


def test_fastack_completes_too(server: DisqueProcess) -> None:
    r = server.client()
    job_id = r.execute_command("ADDJOB", "q", "request", 0)
    results: list[object] = []
    thread = wait_in_thread(server, job_id, 10_000, results)
    wait_for(lambda: waiting(r) == 1, 5, message="WAITJOB blocked")
    assert r.execute_command("FASTACK", job_id) == 1
    thread.join(5)
    assert results == [b"ACKED"]


def test_already_acked_answers_at_once(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "request", 0)
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("SHOW", job_id) is None  # forgotten: a single node collects at once
    started = time.monotonic()
    assert r.execute_command("WAITJOB", job_id, 0) == b"ACKED"
    assert time.monotonic() - started < 1


def test_timeout_answers_null_and_job_is_untouched(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "request", 0)
    started = time.monotonic()
    assert r.execute_command("WAITJOB", job_id, 200) is None
    assert 0.15 <= time.monotonic() - started < 5
    assert r.execute_command("QLEN", "q") == 1 and waiting(r) == 0


def test_unknown_job(r: redis.Redis) -> None:
    unknown = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
    with pytest.raises(redis.ResponseError, match=r"^NOJOB Job not known"):
        r.execute_command("WAITJOB", unknown, 100)


def test_job_deleted_or_expired_while_waiting(server: DisqueProcess) -> None:
    r = server.client()
    deleted = r.execute_command("ADDJOB", "q", "a", 0)
    expiring = r.execute_command("ADDJOB", "q", "b", 0, "TTL", 1)
    results: list[object] = []
    threads = [wait_in_thread(server, deleted, 10_000, results),
               wait_in_thread(server, expiring, 10_000, results)]
    wait_for(lambda: waiting(r) == 2, 5, message="two WAITJOB clients blocked")
    assert r.execute_command("DELJOB", deleted) == 1
    for thread in threads:
        thread.join(5)
    assert len(results) == 2
    for result in results:
        assert isinstance(result, redis.ResponseError)
        assert str(result).startswith("NOJOB Job removed from this node before it was acknowledged")
    # A removed (never acked) job is not "acked" afterwards either.
    with pytest.raises(redis.ResponseError, match=r"^NOJOB Job not known"):
        r.execute_command("WAITJOB", deleted, 10)


def test_disconnected_waiter_leaves_nothing(server: DisqueProcess) -> None:
    r = server.client()
    job_id = r.execute_command("ADDJOB", "q", "request", 0)
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"WAITJOB %s 0\r\n" % job_id)
    wait_for(lambda: waiting(r) == 1, 5, message="WAITJOB blocked")
    sock.close()
    wait_for(lambda: waiting(r) == 0 and r.info("clients")["blocked_clients"] == 0, 5,
             message="the waiter to be released")
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.ping()


@pytest.mark.parametrize(("args", "error"), [
    ([], "wrong number of arguments for 'waitjob' command"),
    (["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"],
     "wrong number of arguments for 'waitjob' command"),
    (["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", 1, 2],
     "wrong number of arguments for 'waitjob' command"),
    (["not-an-id", 100], "BADID Invalid Job ID format."),
    (["x" * 100_000, 100], "BADID Invalid Job ID format."),
    (["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", -1], "timeout is negative"),
    (["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", "soon"],
     "timeout is not an integer or out of range"),
    (["D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", "9" * 30],
     "timeout is out of range, must be between 0 and 9223372036854775807 (milliseconds)"),
])
def test_bad_waitjob_input(r: redis.Redis, args: list[object], error: str) -> None:
    with pytest.raises(redis.ResponseError) as err:
        r.execute_command("WAITJOB", *args)
    assert str(err.value) == error
    assert waiting(r) == 0 and r.ping()
