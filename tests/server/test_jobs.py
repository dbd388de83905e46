"""Job commands against a real server: time-driven behaviour uses short times
and deadline polling."""

from __future__ import annotations

import time

import pytest
import redis

from tests.support.process import wait_for


def show(r: redis.Redis, job_id: bytes) -> dict[bytes, object] | None:
    reply = r.execute_command("SHOW", job_id)
    if reply is None:
        return None
    return dict(zip(reply[::2], reply[1::2], strict=True))


def test_addjob_reply_and_id_format(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "x", 0)
    assert len(job_id) == 40 and job_id.startswith(b"D-")
    node_id = r.execute_command("HELLO")[1]
    assert job_id[2:10] == node_id[:8]
    assert job_id[10:11] == b"-" and job_id[35:36] == b"-"
    assert int(job_id[36:], 16) == 1440 | 1
    at_most_once = r.execute_command("ADDJOB", "q", "x", 0, "RETRY", 0, "TTL", 3600)
    assert int(at_most_once[36:], 16) == 60
    ids = {r.execute_command("ADDJOB", "q", "x", 0) for _ in range(500)}
    assert len(ids) == 500


def test_show_fields(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", b"\x00body\xff", 0, "RETRY", 7, "TTL", 70,
                               "DELAY", 3)
    info = show(r, job_id)
    assert info is not None
    assert list(info) == [b"id", b"queue", b"state", b"repl", b"ttl", b"ctime", b"delay",
                          b"retry", b"nacks", b"additional-deliveries", b"nodes-delivered",
                          b"nodes-confirmed", b"next-requeue-within", b"next-awake-within",
                          b"body"]
    assert info[b"id"] == job_id and info[b"queue"] == b"q"
    assert info[b"state"] == b"active"
    assert (info[b"repl"], info[b"delay"], info[b"retry"]) == (1, 3, 7)
    assert 68 <= info[b"ttl"] <= 70
    assert info[b"body"] == b"\x00body\xff"
    assert info[b"nodes-delivered"] == [r.execute_command("HELLO")[1]]
    assert 0 < info[b"next-requeue-within"] <= 3000
    assert r.execute_command("SHOW", "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0001") is None


def test_show_nobody_gives_the_fields_without_the_body(r: redis.Redis) -> None:
    """SHOW id NOBODY (an extension): SHOW's fields in SHOW's order, with
    ``body-size`` where ``body`` was; the extension fields after it."""
    body = b"\x00body\xff" * 1000
    job_id = r.execute_command("ADDJOB", "q-nobody", body, 0, "RETRY", 7, "TTL", 70,
                               "MAXDELIVERIES", 3, "PRIORITY", 2)
    full = show(r, job_id)
    reply = r.execute_command("SHOW", job_id, "NOBODY")
    bare = dict(zip(reply[::2], reply[1::2], strict=True))
    assert full is not None
    assert list(bare) == [b"body-size" if k == b"body" else k for k in full]
    assert bare[b"body-size"] == len(body)
    for key in ("id", "queue", "state", "repl", "ctime", "retry", "nacks", "max-deliveries",
                "dead-letter-queue", "priority"):
        assert bare[key.encode()] == full[key.encode()], key
    assert r.execute_command("SHOW", job_id, "nobody")[::2] == reply[::2]  # in any case
    assert r.execute_command("SHOW", "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0001",
                             "NOBODY") is None


@pytest.mark.parametrize("extra", [("BODY",), ("NOBODY", "NOBODY"), ("0",)])
def test_show_refuses_other_arguments_as_the_original(r: redis.Redis, extra: tuple) -> None:
    """Anything but one NOBODY after the ID gets the original's arity error."""
    job_id = r.execute_command("ADDJOB", "q-nobody", "x", 0)
    with pytest.raises(redis.ResponseError,
                       match=r"^wrong number of arguments for 'show' command$"):
        r.execute_command("SHOW", job_id, *extra)


def test_delay_then_queued(r: redis.Redis) -> None:
    started = time.monotonic()
    r.execute_command("ADDJOB", "q", "later", 0, "DELAY", 1)
    assert r.execute_command("QLEN", "q") == 0
    wait_for(lambda: r.execute_command("QLEN", "q") == 1, 5, message="delayed job queued")
    assert time.monotonic() - started >= 0.75  # 1 s delay, minus at most the jitter


def test_retry_requeues_with_additional_delivery(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "work", 0, "RETRY", 1)
    assert r.execute_command("GETJOB", "FROM", "q")[0][1] == job_id
    wait_for(lambda: r.execute_command("QLEN", "q") == 1, 5, message="requeue")
    [entry] = r.execute_command("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert entry == [b"q", job_id, b"work", b"nacks", 0, b"additional-deliveries", 1]


def test_an_earlier_time_rearms_the_job_timer_and_a_later_one_keeps_it(r: redis.Redis) -> None:
    # The job timer is armed for the earliest awake time, and update_awake_time
    # only calls into the server for a time before it (state.job_timer_at):
    # a job due sooner than the armed time must still re-arm it, and one
    # due later must not push the earlier one back.
    late = r.execute_command("ADDJOB", "late", "x", 0, "RETRY", 3600)
    assert r.execute_command("GETJOB", "FROM", "late")[0][1] == late  # timer: ~1 h
    soon = r.execute_command("ADDJOB", "soon", "x", 0, "RETRY", 1)
    assert r.execute_command("GETJOB", "FROM", "soon")[0][1] == soon  # timer: ~1 s
    later = r.execute_command("ADDJOB", "later", "x", 0, "RETRY", 1800)
    assert r.execute_command("GETJOB", "FROM", "later")[0][1] == later
    wait_for(lambda: r.execute_command("QLEN", "soon") == 1, 5, message="RETRY 1 requeue")
    # And after that run the timer is armed again, for the next due job.
    again = r.execute_command("ADDJOB", "again", "x", 0, "RETRY", 1)
    assert r.execute_command("GETJOB", "FROM", "again")[0][1] == again
    wait_for(lambda: r.execute_command("QLEN", "again") == 1, 5, message="second requeue")
    assert r.execute_command("QLEN", "late") == 0 and r.execute_command("QLEN", "later") == 0


def test_ttl_expiry(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "short", 0, "TTL", 1)
    assert show(r, job_id) is not None
    wait_for(lambda: show(r, job_id) is None, 5, message="expiry")
    assert r.execute_command("QLEN", "q") == 0


def test_working_and_toolate(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "x", 0, "TTL", 2, "RETRY", 1)
    r.execute_command("GETJOB", "FROM", "q")
    assert r.execute_command("WORKING", job_id) == 1
    started = time.monotonic()

    def too_late() -> bool:
        try:
            r.execute_command("WORKING", job_id)
        except redis.ResponseError as err:
            assert str(err).startswith("TOOLATE Half of job TTL already elapsed")
            return True
        return False

    wait_for(too_late, 5, message="TOOLATE")
    assert time.monotonic() - started >= 0.5
    with pytest.raises(redis.ResponseError, match=r"^NOJOB Job not known"):
        r.execute_command("WORKING", "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0001")


def test_nack_enqueue_dequeue_deljob(r: redis.Redis) -> None:
    a = r.execute_command("ADDJOB", "q", "a", 0)
    b = r.execute_command("ADDJOB", "q", "b", 0)
    assert r.execute_command("DEQUEUE", a, b) == 2
    assert r.execute_command("QLEN", "q") == 0
    assert r.execute_command("DEQUEUE", a) == 0
    assert r.execute_command("ENQUEUE", b) == 1
    assert r.execute_command("ENQUEUE", b) == 0
    assert r.execute_command("NACK", a) == 1
    assert show(r, a)[b"nacks"] == 1
    # Best-effort order by creation time: a (older) comes first again.
    assert [j[1] for j in r.execute_command("GETJOB", "COUNT", 2, "FROM", "q")] == [a, b]
    assert r.execute_command("DELJOB", a, b, "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0001") == 2
    assert show(r, a) is None


def test_ackjob_and_fastack(r: redis.Redis) -> None:
    ids = [r.execute_command("ADDJOB", "q", str(i), 0) for i in range(4)]
    assert r.execute_command("ACKJOB", ids[0], ids[1]) == 2
    assert r.execute_command("ACKJOB", ids[0]) == 0
    assert r.execute_command("FASTACK", ids[2], ids[3], ids[0]) == 2
    assert r.execute_command("QLEN", "q") == 0
    assert r.info("jobs")["registered_jobs"] == 0


def test_getjob_order_count_and_queues_left_to_right(r: redis.Redis) -> None:
    q1 = [r.execute_command("ADDJOB", "q1", f"a{i}", 0) for i in range(3)]
    q2 = [r.execute_command("ADDJOB", "q2", f"b{i}", 0) for i in range(3)]
    got = r.execute_command("GETJOB", "COUNT", 4, "FROM", "q1", "q2", "missing")
    assert [j[1] for j in got] == [q1[0], q2[0], q1[1], q2[1]]
    got = r.execute_command("GETJOB", "COUNT", 10, "FROM", "q1", "q2")
    assert [j[1] for j in got] == [q1[2], q2[2]]
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q1", "q2") is None


def test_getjob_timeout_returns_null(r: redis.Redis) -> None:
    started = time.monotonic()
    assert r.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "empty") is None
    assert time.monotonic() - started >= 0.15


def test_maxlen_and_paused_in(r: redis.Redis) -> None:
    r.execute_command("ADDJOB", "q", "1", 0)
    r.execute_command("ADDJOB", "q", "2", 0, "MAXLEN", 2)
    with pytest.raises(redis.ResponseError, match=r"^MAXLEN Queue is already longer"):
        r.execute_command("ADDJOB", "q", "3", 0, "MAXLEN", 2)
    assert r.execute_command("PAUSE", "q", "in") == b"in"
    with pytest.raises(redis.ResponseError, match=r"^PAUSED Queue paused in input"):
        r.execute_command("ADDJOB", "q", "4", 0)
    assert r.execute_command("QLEN", "q") == 2


def test_replication_beyond_cluster_size_is_norepl(r: redis.Redis) -> None:
    with pytest.raises(redis.ResponseError, match=r"^NOREPL Not enough reachable nodes"):
        r.execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 2)
    with pytest.raises(redis.ResponseError, match="please explicitly set  REPLICATE to 1"):
        r.execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 3, "RETRY", 0)
    assert r.execute_command("ADDJOB", "q", "x", 0, "REPLICATE", 1, "RETRY", 0, "ASYNC")


def test_qpeek_positive_and_negative(r: redis.Redis) -> None:
    ids = [r.execute_command("ADDJOB", "q", f"j{i}", 0) for i in range(5)]
    assert [j[1] for j in r.execute_command("QPEEK", "q", 2)] == ids[:2]
    assert [j[1] for j in r.execute_command("QPEEK", "q", -2)] == [ids[4], ids[3]]
    assert [j[1] for j in r.execute_command("QPEEK", "q", 100)] == ids
    assert r.execute_command("QPEEK", "q", 0) == []
    assert r.execute_command("QPEEK", "nosuch", 3) == []
    assert r.execute_command("QLEN", "q") == 5  # peeking consumes nothing
    assert r.execute_command("QPEEK", "q", 1) == [[b"q", ids[0], b"j0"]]


def test_qstat(r: redis.Redis) -> None:
    assert r.execute_command("QSTAT", "nosuch") is None
    r.execute_command("ADDJOB", "q", "x", 0)
    r.execute_command("ADDJOB", "q", "y", 0)
    r.execute_command("GETJOB", "FROM", "q")
    reply = r.execute_command("QSTAT", "q")
    stat = dict(zip(reply[::2], reply[1::2], strict=True))
    assert stat[b"name"] == b"q"
    assert (stat[b"len"], stat[b"jobs-in"], stat[b"jobs-out"], stat[b"blocked"]) == (1, 2, 1, 0)
    assert stat[b"pause"] == b"none" and stat[b"import-from"] == [] and stat[b"import-rate"] == 0
    assert stat[b"age"] >= 0 and stat[b"idle"] >= 0


def test_pause_states(r: redis.Redis) -> None:
    assert r.execute_command("PAUSE", "q", "state") == b"none"
    assert r.execute_command("QSTAT", "q") is None  # asking does not create it
    assert r.execute_command("PAUSE", "q", "in", "out") == b"all"
    assert r.execute_command("PAUSE", "q", "out") == b"out"
    assert r.execute_command("PAUSE", "q", "all") == b"all"
    assert r.execute_command("PAUSE", "q", "none") == b"none"
    assert r.execute_command("PAUSE", "q", "in", "bcast") == b"in"
    assert r.execute_command("PAUSE", "q", "STATE") == b"in"


def test_paused_out_holds_jobs_until_unpaused(server) -> None:
    r = server.client()
    r.execute_command("ADDJOB", "q", "held", 0)
    r.execute_command("PAUSE", "q", "out")
    assert r.execute_command("GETJOB", "NOHANG", "FROM", "q") is None
    waiter = server.client()
    import threading

    result: list[object] = []
    thread = threading.Thread(
        target=lambda: result.append(waiter.execute_command("GETJOB", "TIMEOUT", 5000,
                                                            "FROM", "q")))
    thread.start()
    wait_for(lambda: r.info("clients")["blocked_clients"] == 1, 5, message="client blocked")
    r.execute_command("PAUSE", "q", "none")
    thread.join(5)
    assert result and result[0][0][2] == b"held"
