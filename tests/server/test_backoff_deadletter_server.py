"""NACK ... DELAY, BACKOFF, MAXDELIVERIES and DEADLETTER on a real server: the
grammar, every bad input with its error (nothing stored, nothing lost), and
the end-to-end behaviour.  The timing rules: test_backoff_deadletter.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from disque.commands.jobs import MAX_NACK_DELAY
from tests.server.test_bad_input import (
    HUGE,
    NOT_INTS,
    TOO_BIG,
    arg_id,
    assert_error,
    assert_error_no_new_jobs,
    info_int,
)
from tests.server.test_protocol_raw import JOB_ID, Resp
from tests.support.process import DisqueProcess, wait_for


@pytest.fixture
def c(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as conn:
        yield conn


def show(c: Resp, job_id: bytes) -> dict[bytes, Any]:
    return dict(zip(*[iter(c.call("SHOW", job_id))] * 2, strict=True))


@pytest.fixture(autouse=True)
def sentinel(node: DisqueProcess) -> Iterator[bytes]:
    """A job with every option, stored before the test; intact after it."""
    with Resp(node.port) as conn:
        job_id = conn.call("ADDJOB", "sentinel-q", b"body\x00\xff", 0, "RETRY", 50, "BACKOFF",
                           500, "MAXDELIVERIES", 4, "DEADLETTER", "sentinel-dead")
        assert JOB_ID.match(job_id), job_id
        before = show(conn, job_id)
    yield job_id
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"
    with Resp(node.port) as conn:
        after = show(conn, job_id)
        for volatile in (b"ttl", b"next-requeue-within", b"next-awake-within"):
            after.pop(volatile), before.pop(volatile)
        assert after == before, "the sentinel job was lost or altered"
        assert conn.call("DELJOB", job_id) == 1



ADD = ("ADDJOB", "bad-q", "body", 0)
OPTION_ERRORS = [
    ((*ADD, "BACKOFF", 0), "ERR BACKOFF must be a number of seconds > 0"),
    ((*ADD, "BACKOFF", -5), "ERR BACKOFF must be a number of seconds > 0"),
    ((*ADD, "BACKOFF", 2 ** 32), "ERR BACKOFF must be a number of seconds > 0 not greater "
                                 "than 4294967295"),
    ((*ADD, "BACKOFF", HUGE), "ERR BACKOFF must be a number of seconds > 0 not greater "
                              "than 4294967295"),
    ((*ADD, "RETRY", 10, "BACKOFF", 9), "ERR BACKOFF must not be smaller than RETRY "
                                        "(10 seconds), the first re-queue delay it grows from"),
    ((*ADD, "MAXDELIVERIES", 0), "ERR MAXDELIVERIES must be between 1 and 65535"),
    ((*ADD, "MAXDELIVERIES", 65536), "ERR MAXDELIVERIES must be between 1 and 65535"),
    ((*ADD, "MAXDELIVERIES", b"9" * 5000), "ERR MAXDELIVERIES must be between 1 and 65535"),
    ((*ADD, "RETRY", 0, "REPLICATE", 1, "MAXDELIVERIES", 2),
     "ERR BACKOFF and MAXDELIVERIES need RETRY > 0 (an at-most-once job is never queued "
     "again)"),
    ((*ADD, "RETRY", 0, "REPLICATE", 1, "BACKOFF", 2),
     "ERR BACKOFF and MAXDELIVERIES need RETRY > 0 (an at-most-once job is never queued "
     "again)"),
    ((*ADD, "DEADLETTER", "x"), "ERR DEADLETTER needs MAXDELIVERIES"),
    ((*ADD, "MAXDELIVERIES", 2, "DEADLETTER", ""), "ERR DEADLETTER queue name can't be empty"),
    ((*ADD, "MAXDELIVERIES", 2, "DEADLETTER", "bad-q"),
     "ERR DEADLETTER queue must not be the job's own queue"),
    ((*ADD, "BACKOFF"), "ERR syntax error"),
    ((*ADD, "MAXDELIVERIES"), "ERR syntax error"),
    ((*ADD, "DEADLETTER"), "ERR syntax error"),
    ((*ADD, "MAXDELIVERIES", 2, "DEADLETTERS", "x"), "ERR syntax error"),
    ((*ADD, "BACKOFFS", 5), "ERR syntax error"),
] + [((*ADD, opt, bad), f"ERR {name}") for opt, name in (
    ("BACKOFF", "BACKOFF must be a number of seconds > 0"),
    ("MAXDELIVERIES", "MAXDELIVERIES must be between 1 and 65535")) for bad in NOT_INTS[:4]]


@pytest.mark.parametrize(("args", "error"), OPTION_ERRORS, ids=arg_id)
def test_addjob_extension_option_errors_store_nothing(c: Resp, args: tuple, error: str) -> None:
    assert_error_no_new_jobs(c, args, exact=error)


@pytest.fixture
def delivered(c: Resp) -> bytes:
    job_id = c.call("ADDJOB", "nack-q", "body", 0, "RETRY", 100)
    assert c.call("GETJOB", "FROM", "nack-q")[0][1] == job_id
    return job_id


NACK_DELAY_ERROR = f"ERR NACK DELAY must be a number of seconds between 0 and {MAX_NACK_DELAY}"


@pytest.mark.parametrize("value", [*NOT_INTS, b"-1", *TOO_BIG, MAX_NACK_DELAY + 1],
                         ids=arg_id)
def test_nack_delay_bad_values(c: Resp, delivered: bytes, value: Any) -> None:
    assert_error(c, ("NACK", delivered, "DELAY", value), exact=NACK_DELAY_ERROR)
    fields = dict(zip(*[iter(c.call("SHOW", delivered))] * 2, strict=True))
    assert fields[b"state"] == b"active" and fields[b"nacks"] == 0  # untouched
    assert c.call("DELJOB", delivered) == 1


@pytest.mark.parametrize("tail", [("DELAY",), ("DELAY", 5, "x"), ("DELAY", 5, "DELAY"),
                                  ("5", "DELAY")], ids=arg_id)
def test_nack_arguments_that_are_not_a_trailing_delay_are_job_ids(c: Resp, delivered: bytes,
                                                                  tail: tuple) -> None:
    # What the original answered -BADID still answers -BADID.
    assert_error(c, ("NACK", delivered, *tail), exact="BADID Invalid Job ID format.")
    assert c.call("DELJOB", delivered) == 1


@pytest.mark.parametrize("args", [("NACK", "DELAY", 5), ("NACK", "DELAY"),
                                  ("NACK", "delay", "1", "2")], ids=arg_id)
def test_nack_without_ids_is_badid_as_in_the_original(c: Resp, args: tuple) -> None:
    assert_error(c, args, exact="BADID Invalid Job ID format.")


def test_nack_delay_on_a_real_server(c: Resp, delivered: bytes) -> None:
    assert c.call("NACK", delivered, "delay", "1") == 1
    fields = dict(zip(*[iter(c.call("SHOW", delivered))] * 2, strict=True))
    assert fields[b"state"] == b"active" and 0 < fields[b"next-requeue-within"] <= 1000
    assert b"backoff" not in fields  # still a plain job
    wait_for(lambda: c.call("QLEN", "nack-q") == 1, timeout=5, message="the delayed requeue")
    got = c.call("GETJOB", "WITHCOUNTERS", "FROM", "nack-q")[0]
    assert (got[1], got[4], got[6]) == (delivered, 1, 0)
    assert c.call("ACKJOB", delivered) == 1


def test_dead_letter_end_to_end_on_a_real_server(c: Resp) -> None:
    before = info_int(c, "stats", "dead_lettered_jobs")
    job_id = c.call("ADDJOB", "e2e", "payload", 0, "RETRY", 1, "MAXDELIVERIES", 2)
    for _ in range(2):
        assert c.call("GETJOB", "TIMEOUT", 5000, "FROM", "e2e")[0][1] == job_id
        # not acked: the node requeues it after RETRY (the 2nd time: to e2e:dead)
    got = c.call("GETJOB", "TIMEOUT", 5000, "WITHCOUNTERS", "FROM", "e2e", "e2e:dead")[0]
    assert got[:3] == [b"e2e:dead", job_id, b"payload"]
    assert got[6] == 2  # additional-deliveries: the requeue and the move
    assert info_int(c, "stats", "dead_lettered_jobs") == before + 1
    qstat = dict(zip(*[iter(c.call("QSTAT", "e2e"))] * 2, strict=True))
    assert qstat[b"dead-lettered"] == 1
    assert c.call("ACKJOB", job_id) == 1
    assert c.call("SHOW", job_id) is None

