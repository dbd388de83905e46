"""WORKINGS, the bulk WORKING extension, on one real node: per-ID replies in
order, each what WORKING would answer, and bad input refused as a whole."""

from __future__ import annotations

import pytest
import redis

from disque.commands.jobs import MAX_WORKING_IDS


def getjobs(r: redis.Redis, count: int, queue: str = "q") -> list[bytes]:
    return [job[1] for job in r.execute_command("GETJOB", "COUNT", count, "FROM", queue)]


def test_each_id_gets_what_working_would_answer(r: redis.Redis) -> None:
    r.execute_command("ADDJOBS", "q", 0, "RETRY", 30, "BODIES", "a", "b", "c")
    a, b, c = getjobs(r, 3)
    r.execute_command("ACKJOB", c)
    gone = a[:-4] + b"ffff" if not a.endswith(b"ffff") else a[:-4] + b"0000"
    reply = r.execute_command("WORKINGS", a, gone, b)
    assert reply[0] == 30 and reply[2] == 30
    assert isinstance(reply[1], redis.ResponseError) and str(reply[1]).startswith("NOJOB")
    # An acknowledged job: ACKED, or NOJOB once it is forgotten, as WORKING says.
    single = r.execute_command("WORKINGS", c)
    assert isinstance(single[0], redis.ResponseError)
    with pytest.raises(redis.ResponseError) as one:
        r.execute_command("WORKING", c)
    assert str(single[0]).split()[0] == str(one.value).split()[0]


def test_it_acts_like_working_on_each_job(r: redis.Redis) -> None:
    # WORKING takes a job out of its queue (the worker has it) and moves its
    # next requeue RETRY seconds away: with queued jobs both are visible.
    ids = r.execute_command("ADDJOBS", "q", 0, "RETRY", 40, "BODIES", "a", "b")
    assert r.execute_command("QLEN", "q") == 2
    assert r.execute_command("WORKINGS", *ids) == [40, 40]
    assert r.execute_command("QLEN", "q") == 0
    for job_id in ids:
        reply = r.execute_command("SHOW", job_id)
        info = dict(zip(reply[::2], reply[1::2], strict=True))
        assert info[b"state"] == b"active"
        # RETRY 40 s, with the original's jitter of +/- 250 ms.
        assert 35_000 < info[b"next-requeue-within"] <= 40_250


def test_bad_input_is_refused_before_any_job_is_touched(r: redis.Redis) -> None:
    r.execute_command("ADDJOBS", "q", 0, "RETRY", 30, "BODIES", "a")
    (job_id,) = getjobs(r, 1)
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        r.execute_command("WORKINGS")
    with pytest.raises(redis.ResponseError, match="BADID"):
        r.execute_command("WORKINGS", job_id, "not-an-id")
    with pytest.raises(redis.ResponseError, match="too many IDs"):
        r.execute_command("WORKINGS", *([job_id] * (MAX_WORKING_IDS + 1)))
    assert r.execute_command("WORKINGS", *([job_id] * MAX_WORKING_IDS)) == [30] * MAX_WORKING_IDS
