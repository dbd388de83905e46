"""Adversarial input for every command: a clear error, nothing lost.

For each command in the table: wrong arity, non-numbers where numbers go,
negative and huge numbers, unknown options, malformed job IDs, binary and
empty and very large bodies, many IDs in one call, binary and empty queue
names.  Each must get the error the original Disque 1.0-rc1 answers, in
its words and with its code (``ERR``, ``BADID``, ...), the connection
must keep serving, and nothing already stored may be lost or altered: an
autouse fixture stores a sentinel job before every test and checks it,
byte for byte, afterwards.

Most tests share one node (they only touch their own queues and jobs);
those that change node-wide settings (requirepass, SHUTDOWN) get their own.
Errors are compared on the full wire text (``ERR ...``), read with a raw
RESP client because redis-py strips the ``ERR`` prefix.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from disque.config import DIRECTIVES
from tests.server.test_protocol_raw import JOB_ID, UNKNOWN_ID, Resp, err_text, parse
from tests.support.process import DisqueProcess, wait_for

HUGE = b"99999999999999999999"
INT64_OVER = str(2 ** 63).encode()
INT64_MAX = str(2 ** 63 - 1).encode()
INT64_MIN = str(-2 ** 63).encode()
INT64_UNDER = str(-2 ** 63 - 1).encode()

#: Never a valid integer, in any field.
NOT_INTS = [b"abc", b"", b"1.5", b"+1", b" 1", b"1 ", b"0x10", b"1e3", b"-0", b"\xff",
            b"1\x00"]
#: Well-formed numbers beyond 64 bits: answered with the range, not "not a number".
TOO_BIG = [HUGE, INT64_OVER, b"9" * 5000]
TOO_SMALL = [b"-99999999999999999999", INT64_UNDER]


def arg_id(value: Any) -> str:
    if isinstance(value, tuple | list):
        return " ".join(arg_id(v) for v in value)[:60]
    if isinstance(value, bytes):
        text = repr(value)[2:-1] if value else "''"
        return text if len(text) < 30 else f"{text[:20]}...({len(value)})"
    return str(value)


@pytest.fixture
def c(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as conn:
        yield conn


SENTINEL_BODY = b"sentinel \x00\xff\xfe\r\n body"
SENTINEL_QUEUE = b"bi-sentinel\x00"
STABLE_FIELDS = (b"id", b"queue", b"state", b"repl", b"ctime", b"delay", b"retry", b"nacks",
                 b"additional-deliveries", b"nodes-delivered", b"nodes-confirmed", b"body")


def show_fields(c: Resp, job_id: bytes) -> dict[bytes, Any] | None:
    reply = c.call("SHOW", job_id)
    if reply is None:
        return None
    fields = dict(zip(reply[::2], reply[1::2], strict=True))
    return {k: fields[k] for k in STABLE_FIELDS}


@pytest.fixture(autouse=True)
def sentinel(node: DisqueProcess) -> Iterator[bytes]:
    """A job stored before the test; after it the node serves and the job is intact."""
    with Resp(node.port) as conn:
        job_id = conn.call("ADDJOB", SENTINEL_QUEUE, SENTINEL_BODY, 0)
        assert JOB_ID.match(job_id), job_id
        before = show_fields(conn, job_id)
        myid = conn.call("CLUSTER", "MYID")
    yield job_id
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"
    with Resp(node.port) as conn:
        assert conn.call("PING") == b"PONG"
        assert show_fields(conn, job_id) == before, "the sentinel job was lost or altered"
        assert conn.call("QLEN", SENTINEL_QUEUE) == 1
        assert conn.call("CLUSTER", "MYID") == myid
        assert conn.call("DELJOB", job_id) == 1


def info_int(c: Resp, section: str, field: str) -> int:
    for line in c.call("INFO", section).decode().splitlines():
        if line.startswith(field + ":"):
            return int(line.split(":", 1)[1])
    raise AssertionError(f"{field} missing from INFO {section}")


def assert_error(c: Resp, args: tuple, exact: str | None = None, prefix: str | None = None,
                 one_of: tuple[str, ...] = ()) -> str:
    """Send ``args``; the reply must be that error, and the connection must keep serving."""
    text = err_text(c.call(*args))
    if exact is not None:
        assert text == exact
    if prefix is not None:
        assert text.startswith(prefix), text
    if one_of:
        assert text in one_of, text
    assert "\r" not in text and "\n" not in text
    assert c.call("PING") == b"PONG"
    return text


def assert_error_no_new_jobs(c: Resp, args: tuple, **kwargs: Any) -> str:
    jobs = info_int(c, "jobs", "registered_jobs")
    text = assert_error(c, args, **kwargs)
    assert info_int(c, "jobs", "registered_jobs") == jobs, "a refused command stored a job"
    return text


def add_jobs(c: Resp, queue: bytes | str, n: int, body: bytes = b"job") -> list[bytes]:
    return [c.call("ADDJOB", queue, body + b"%d" % i, 0) for i in range(n)]


# --------------------------------------------------------------------------
# Arity and unknown commands
# --------------------------------------------------------------------------

ARITY = [
    ("ADDJOB",), ("ADDJOB", "q"), ("ADDJOB", "q", "body"),
    ("GETJOB",),
    ("ACKJOB",), ("FASTACK",), ("NACK",), ("ENQUEUE",), ("DEQUEUE",), ("DELJOB",),
    ("WORKING",), ("WORKING", UNKNOWN_ID, UNKNOWN_ID),
    ("SHOW",), ("SHOW", UNKNOWN_ID, UNKNOWN_ID),
    ("QLEN",), ("QLEN", "a", "b"), ("QSTAT",), ("QSTAT", "a", "b"),
    ("QPEEK",), ("QPEEK", "q"), ("QPEEK", "q", "1", "2"),
    ("PAUSE",), ("PAUSE", "q"),
    ("PING", "a", "b"), ("ECHO",), ("ECHO", "a", "b"), ("AUTH",),
    ("CONFIG",), ("DEBUG",), ("CLIENT",), ("TIME", "x"), ("CLUSTER",),
]


@pytest.mark.parametrize("args", ARITY, ids=arg_id)
def test_wrong_arity(c: Resp, args: tuple) -> None:
    name = args[0].lower()
    assert_error_no_new_jobs(c, args, exact=f"ERR wrong number of arguments for '{name}' command")


@pytest.mark.parametrize("args", [("aDdJoB", "q"), ("ackjob",), ("Show",), ("qPeEk", "q")],
                         ids=arg_id)
def test_wrong_arity_any_case(c: Resp, args: tuple) -> None:
    name = args[0].lower()
    assert_error(c, args, exact=f"ERR wrong number of arguments for '{name}' command")


@pytest.mark.parametrize(("args", "expected"), [
    (("INFO", "server", "clients"), "ERR syntax error"),
    (("QSCAN", "0", "0"), "ERR syntax error"),
    (("JSCAN", "0", "0"), "ERR syntax error"),
    (("SHUTDOWN", "NOSAVE", "NOW"), "ERR syntax error"),
], ids=arg_id)
def test_variadic_commands_with_extra_arguments(c: Resp, args: tuple, expected: str) -> None:
    assert_error(c, args, exact=expected)


def test_command_with_extra_arguments(c: Resp) -> None:
    assert_error(c, ("COMMAND", "COUNT", "x"), prefix="ERR ")
    assert_error(c, ("COMMAND", "FOO"), prefix="ERR ")
    assert_error(c, ("COMMAND", b"\xff\x00"), prefix="ERR ")


@pytest.mark.parametrize("name", [b"NOSUCH", b"", b"ADDJOBX", b"\x00", b"GET JOB"], ids=arg_id)
def test_unknown_command(c: Resp, name: bytes) -> None:
    assert_error(c, (name, "x"), exact=f"ERR unknown command '{name.decode()}'")


def test_unknown_command_binary_name(c: Resp) -> None:
    assert_error(c, (b"\xff\xfe\r\n",), prefix="ERR unknown command '")


# --------------------------------------------------------------------------
# ADDJOB options
# --------------------------------------------------------------------------

TIMEOUT_ERR = "ERR timeout is not an integer or out of range"
NEG_TIMEOUT = "ERR timeout is negative"
TIMEOUT_RANGE = f"ERR timeout is out of range, must be between 0 and {2 ** 63 - 1} (milliseconds)"
AT_MOST_INT64 = f" and at most {2 ** 63 - 1}"
DELAY_AFTER_TTL = ("ERR The specified DELAY is greater than TTL. Job refused since would never "
                   "be delivered")

ADDJOB_ERRORS = (
    [((b"bi-add", b"b", v), TIMEOUT_ERR) for v in NOT_INTS]
    + [((b"bi-add", b"b", v), NEG_TIMEOUT) for v in (b"-1", INT64_MIN, *TOO_SMALL)]
    + [((b"bi-add", b"b", v), TIMEOUT_RANGE) for v in TOO_BIG]
    + [((b"bi-add", b"b", b"0", b"TTL", v), "ERR TTL must be a number > 0")
       for v in [*NOT_INTS, b"0", b"-1", INT64_MIN, *TOO_SMALL]]
    + [((b"bi-add", b"b", b"0", b"TTL", v),
        "ERR TTL must be a number > 0 and at most 315360000 (10 years)")
       for v in [b"315360001", INT64_MAX, *TOO_BIG]]
    + [((b"bi-add", b"b", b"0", b"DELAY", v), "ERR DELAY time must be a non negative number")
       for v in [*NOT_INTS, b"-1", INT64_MIN, *TOO_SMALL]]
    + [((b"bi-add", b"b", b"0", b"DELAY", v), DELAY_AFTER_TTL) for v in TOO_BIG]
    + [((b"bi-add", b"b", b"0", b"RETRY", v), "ERR RETRY time must be a non negative number")
       for v in [*NOT_INTS, b"-1", INT64_MIN, *TOO_SMALL]]
    + [((b"bi-add", b"b", b"0", b"RETRY", v),
        "ERR RETRY time must be a non negative number not greater than 4294967295")
       for v in [b"4294967296", INT64_MAX, *TOO_BIG]]
    + [((b"bi-add", b"b", b"0", b"REPLICATE", v), "ERR REPLICATE must be between 1 and 65535")
       for v in [*NOT_INTS, b"0", b"-1", b"65536", INT64_MAX, INT64_MIN, *TOO_BIG, *TOO_SMALL]]
    + [((b"bi-add", b"b", b"0", b"MAXLEN", v), "ERR MAXLEN must be a positive number")
       for v in [*NOT_INTS, b"0", b"-1", INT64_MIN, *TOO_SMALL]]
    + [((b"bi-add", b"b", b"0", b"MAXLEN", v), "ERR MAXLEN must be a positive number"
        + AT_MOST_INT64) for v in TOO_BIG]
    # An option with no value, an unknown option.
    + [((b"bi-add", b"b", b"0", opt), "ERR syntax error")
       for opt in (b"TTL", b"DELAY", b"RETRY", b"REPLICATE", b"MAXLEN", b"FOO", b"", b"\xff",
                   b"TTL5", b"NOHANG", b"ASYNCX")]
    + [((b"bi-add", b"b", b"0", b"TTL", b"10", b"BOGUS", b"1"), "ERR syntax error"),
       ((b"bi-add", b"b", b"0", b"ASYNC", b"TTL"), "ERR syntax error")]
    # Options are parsed before the timeout, like the original.
    + [((b"bi-add", b"b", b"abc", b"TTL", b"0"), "ERR TTL must be a number > 0")]
)


# Every numeric argument, with a well-formed number far out of its range: the
# error names the range (the original said "must be a number > 0" for a TTL
# of 99999999999999999999, which is a number > 0).
OUT_OF_RANGE = [
    ("ADDJOB", "bi-range", "b", HUGE),
    *[("ADDJOB", "bi-range", "b", 0, opt, HUGE)
      for opt in ("TTL", "RETRY", "DELAY", "MAXLEN", "REPLICATE")],
    ("GETJOB", "NOHANG", "COUNT", HUGE, "FROM", "bi-range"),
    ("GETJOB", "TIMEOUT", HUGE, "FROM", "bi-range"),
    ("QPEEK", "bi-range", HUGE), ("QPEEK", "bi-range", b"-" + HUGE),
    *[("QSCAN", opt, HUGE) for opt in ("COUNT", "MINLEN", "MAXLEN", "IMPORTRATE")],
    ("JSCAN", "COUNT", HUGE),
    ("CLIENT", "KILL", "ID", HUGE),
    ("DEBUG", "SLEEP", HUGE),
    *[("CONFIG", "SET", name, HUGE) for name, d in DIRECTIVES.items()
      if isinstance(d.default, int) and not isinstance(d.default, bool) and d.mutable],
]
RANGE_WORDS = re.compile(r"at most \d+|between -?\d+ and \d+|not greater than \d+|"
                         r"takes \d+ to \d+|DELAY is greater than TTL")


@pytest.mark.parametrize("args", OUT_OF_RANGE, ids=arg_id)
def test_out_of_range_numbers_name_the_range(c: Resp, args: tuple) -> None:
    text = assert_error_no_new_jobs(c, args, prefix="ERR ")
    assert RANGE_WORDS.search(text), text
    assert "not an integer" not in text and "must be a number > 0\"" not in text


def test_issue_examples_name_the_range(c: Resp) -> None:
    assert_error(c, ("ADDJOB", "q", "body", 0, "TTL", HUGE),
                 exact="ERR TTL must be a number > 0 and at most 315360000 (10 years)")
    assert_error(c, ("GETJOB", "NOHANG", "COUNT", HUGE, "FROM", "q"),
                 exact=f"ERR COUNT must be a number greater than zero and at most {2 ** 63 - 1}")


@pytest.mark.parametrize(("args", "expected"), ADDJOB_ERRORS, ids=arg_id)
def test_addjob_option_errors(c: Resp, args: tuple, expected: str) -> None:
    assert_error_no_new_jobs(c, ("ADDJOB", *args), exact=expected)
    assert c.call("QLEN", "bi-add") == 0


@pytest.mark.parametrize("args", [
    (b"TTL", b"10", b"DELAY", b"10"),
    (b"TTL", b"10", b"DELAY", b"11"),
    (b"DELAY", b"86400"),  # the default TTL is one day
    (b"DELAY", INT64_MAX),
    (b"TTL", b"1", b"DELAY", b"1"),
], ids=arg_id)
def test_addjob_delay_not_below_ttl(c: Resp, args: tuple) -> None:
    assert_error_no_new_jobs(c, ("ADDJOB", "bi-add", "b", 0, *args),
                             prefix="ERR The specified DELAY is greater than TTL. Job refused")


@pytest.mark.parametrize("args", [
    (b"RETRY", b"0", b"REPLICATE", b"2"),
    (b"REPLICATE", b"2", b"RETRY", b"0"),
    (b"REPLICATE", b"65535", b"RETRY", b"0", b"ASYNC"),
], ids=arg_id)
def test_addjob_retry_0_with_replicate_over_1(c: Resp, args: tuple) -> None:
    text = assert_error_no_new_jobs(c, ("ADDJOB", "bi-add", "b", 0, *args), prefix="ERR ")
    assert "RETRY" in text and "REPLICATE" in text


@pytest.mark.parametrize("args", [(b"REPLICATE", b"2"), (b"REPLICATE", b"65535"),
                                  (b"REPLICATE", b"3", b"ASYNC")], ids=arg_id)
def test_addjob_replicate_more_than_nodes(c: Resp, args: tuple) -> None:
    assert_error_no_new_jobs(c, ("ADDJOB", "bi-add", "b", 0, *args), prefix="NOREPL ")


def test_addjob_large_valid_numbers(c: Resp) -> None:
    ids = [c.call("ADDJOB", "bi-add-ok", "b", INT64_MAX),
           c.call("ADDJOB", "bi-add-ok", "b", 0, "MAXLEN", INT64_MAX),
           c.call("ADDJOB", "bi-add-ok", "b", 0, "REPLICATE", 1, "RETRY", 0),
           c.call("ADDJOB", "bi-add-ok", "b", 0, "ttl", 10, "Delay", 0, "rEtRy", 3, "maxlen", 5,
                  "replicate", 1, "async", "TTL", 20)]
    assert all(JOB_ID.match(i) for i in ids), ids
    assert int(ids[2][-4:], 16) % 2 == 0  # RETRY 0: at-most-once, even TTL field
    assert int(ids[0][-4:], 16) % 2 == 1
    ids.append(c.call("ADDJOB", "bi-add-ok", "b", 0, "TTL", 315360000))  # 10 years: the limit
    ids.append(c.call("ADDJOB", "bi-add-ok", "b", 0, "RETRY", 4294967295))
    assert all(JOB_ID.match(i) for i in ids[-2:]), ids
    assert c.call("ACKJOB", *ids) == len(ids)
    assert c.call("QLEN", "bi-add-ok") == 0


def test_addjob_maxlen_refuses_when_full(c: Resp) -> None:
    job_id = c.call("ADDJOB", "bi-maxlen", "a", 0)
    assert_error_no_new_jobs(c, ("ADDJOB", "bi-maxlen", "b", 0, "MAXLEN", 1), prefix="MAXLEN ")
    assert c.call("QLEN", "bi-maxlen") == 1
    assert c.call("ACKJOB", job_id) == 1


# --------------------------------------------------------------------------
# GETJOB options
# --------------------------------------------------------------------------

GETJOB_ERRORS = (
    [(("COUNT", v, "FROM", "bi-get"), "ERR COUNT must be a number greater than zero")
     for v in [*NOT_INTS, b"0", b"-1", INT64_MIN, *TOO_SMALL]]
    + [(("NOHANG", "COUNT", v, "FROM", "bi-get"),
        "ERR COUNT must be a number greater than zero" + AT_MOST_INT64) for v in TOO_BIG]
    + [(("TIMEOUT", v, "FROM", "bi-get"), TIMEOUT_ERR) for v in NOT_INTS]
    + [(("TIMEOUT", v, "FROM", "bi-get"), NEG_TIMEOUT) for v in (b"-1", INT64_MIN, *TOO_SMALL)]
    + [(("TIMEOUT", v, "FROM", "bi-get"), TIMEOUT_RANGE) for v in TOO_BIG]
    + [(args, "ERR syntax error") for args in [
        ("NOHANG", "COUNT", "1"), ("NOHANG", "FROM"), ("NOHANG", "TIMEOUT"), ("NOHANG", "COUNT"),
        ("BAR", "FROM", "bi-get"), ("NOHANG", b"", "FROM", "bi-get"),
        (b"\xff", "FROM", "bi-get"), ("NOHANG", "WITHCOUNTERS"), ("NOHANG", "WITHLEASE"),
        ("WITHLEASE", "1", "FROM", "bi-get")]]
)


@pytest.mark.parametrize(("args", "expected"), GETJOB_ERRORS, ids=arg_id)
def test_getjob_option_errors(c: Resp, args: tuple, expected: str) -> None:
    job_id = c.call("ADDJOB", "bi-get", "x", 0)
    assert_error(c, ("GETJOB", *args), exact=expected)
    assert c.call("QLEN", "bi-get") == 1  # nothing was taken
    assert c.call("ACKJOB", job_id) == 1


def test_getjob_from_without_queues(c: Resp) -> None:
    # Arity -2 in the original (then a syntax error), -3 here (arity error): both refuse.
    assert_error(c, ("GETJOB", "FROM"), one_of=(
        "ERR syntax error", "ERR wrong number of arguments for 'getjob' command"))


def test_getjob_everything_after_from_is_a_queue(c: Resp) -> None:
    job_id = c.call("ADDJOB", "NOHANG", "x", 0)
    assert c.call_raw("GETJOB", "NOHANG", "FROM", "COUNT", "TIMEOUT") == b"*-1\r\n"
    assert c.call("GETJOB", "NOHANG", "FROM", "COUNT", "NOHANG") == [[b"NOHANG", job_id, b"x"]]
    assert c.call("ACKJOB", job_id) == 1


def test_getjob_huge_valid_numbers(c: Resp) -> None:
    assert c.call_raw("GETJOB", "NOHANG", "COUNT", INT64_MAX, "TIMEOUT", INT64_MAX,
                      "FROM", "bi-none") == b"*-1\r\n"
    ids = add_jobs(c, "bi-get-huge", 3)
    reply = c.call("GETJOB", "COUNT", INT64_MAX, "TIMEOUT", INT64_MAX, "FROM", "bi-get-huge")
    assert [entry[1] for entry in reply] == ids
    assert c.call("ACKJOB", *ids) == 3


def test_getjob_many_queues(c: Resp) -> None:
    """As many queues as max-queues-per-command (1024 by default) work; more
    are refused, creating nothing."""
    queues = info_int(c, "queues", "registered_queues")
    too_many = [b"bi-many-%d" % i for i in range(10000)]
    assert_error(c, ("GETJOB", "TIMEOUT", 1, "FROM", *too_many),
                 exact="ERR too many queues: 10000, the limit is 1024 (max-queues-per-command)")
    assert info_int(c, "queues", "registered_queues") == queues
    names = [*too_many[:1021], b"", b"\x00", b"\xff"]
    assert c.call_raw("GETJOB", "NOHANG", "FROM", *names) == b"*-1\r\n"
    job_id = c.call("ADDJOB", names[-1], "x", 0)
    assert c.call("GETJOB", "TIMEOUT", 1, "FROM", *names) == [[names[-1], job_id, b"x"]]
    assert c.call_raw("GETJOB", "TIMEOUT", 1, "FROM", *names) == b"*-1\r\n"
    assert c.call("ACKJOB", job_id) == 1


# --------------------------------------------------------------------------
# Job IDs
# --------------------------------------------------------------------------

VALID = UNKNOWN_ID
assert len(VALID) == 40
BAD_IDS = [
    b"",
    b"x",
    VALID[:-1],  # 39 characters
    VALID + b"1",  # 41 characters
    b" " + VALID[:-1],
    b"X" + VALID[1:],  # wrong prefix
    b"d" + VALID[1:],
    b"D_" + VALID[2:],
    VALID[:2] + b"zzzzzzzz" + VALID[10:],  # non-hex node part
    VALID[:2] + b"dcb833c:" + VALID[10:],
    b"D-dcb833c-f" + VALID[11:],  # dashes in the wrong place
    VALID[:10] + b"+" + VALID[11:],
    VALID[:20] + b"!" + VALID[21:],  # valid-looking, one bad character
    VALID[:20] + b" " + VALID[21:],
    VALID[:20] + b"\x00" + VALID[21:],
    VALID[:20] + b"\xff" + VALID[21:],
    VALID[:20] + b"\r\n" + VALID[22:],
    VALID[:36] + b"05g1",  # non-hex TTL
    VALID[:36] + b"-5a1",
    b"D-" + b"-" * 38,
    b"A" * 40,
    b"\xff" * 40,
]
assert all(len(i) == 40 for i in BAD_IDS[9:])
BADID = "BADID Invalid Job ID format."
ID_COMMANDS = ["ACKJOB", "FASTACK", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB", "WORKING", "SHOW"]
MULTI_ID_COMMANDS = ["ACKJOB", "FASTACK", "NACK", "ENQUEUE", "DEQUEUE", "DELJOB"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=arg_id)
@pytest.mark.parametrize("cmd", ID_COMMANDS)
def test_malformed_job_ids(c: Resp, cmd: str, bad: bytes) -> None:
    assert_error_no_new_jobs(c, (cmd, bad), exact=BADID)


@pytest.mark.parametrize("cmd", MULTI_ID_COMMANDS)
def test_one_bad_id_means_nothing_is_done(c: Resp, cmd: str, sentinel: bytes) -> None:
    ids = add_jobs(c, "bi-mixed", 3)
    active = c.call("GETJOB", "NOHANG", "FROM", "bi-mixed")[0][1]  # now active, not queued
    for args in ([*ids, b"bad"], [b"bad", *ids], [sentinel, ids[0], VALID[:-1]],
                 [active, b"x" * 40]):
        assert_error(c, (cmd, *args), exact=BADID)
    assert c.call("QLEN", "bi-mixed") == 2
    assert c.call("QPEEK", "bi-mixed", 5) == [[b"bi-mixed", i, b"job%d" % n]
                                              for n, i in enumerate(ids) if i != active]
    shown = [show_fields(c, i) for i in ids]
    assert all(s is not None for s in shown)
    assert [s[b"state"] for s in shown] == [b"active", b"queued", b"queued"]  # type: ignore[index]
    assert all(s[b"nacks"] == 0 and s[b"additional-deliveries"] == 0  # type: ignore[index]
               for s in shown)
    assert c.call("DELJOB", *ids) == 3


@pytest.mark.parametrize(("cmd", "expected"), [
    ("ACKJOB", 0), ("FASTACK", 0), ("NACK", 0), ("ENQUEUE", 0), ("DEQUEUE", 0), ("DELJOB", 0)])
def test_unknown_well_formed_ids(c: Resp, cmd: str, expected: int) -> None:
    at_most_once = VALID[:-1] + b"0"
    assert c.call(cmd, VALID, at_most_once) == expected
    assert c.call("PING") == b"PONG"


def test_unknown_well_formed_id_working_and_show(c: Resp) -> None:
    assert_error(c, ("WORKING", VALID), exact="NOJOB Job not known in the context of this node.")
    assert c.call_raw("SHOW", VALID) == b"$-1\r\n"


def fake_ids(n: int) -> list[bytes]:
    return [b"D-%08x-%024d-%04x" % (i, i, 1 + 2 * (i % 100)) for i in range(n)]


@pytest.mark.parametrize("cmd", MULTI_ID_COMMANDS)
def test_ten_thousand_ids_in_one_call(c: Resp, cmd: str) -> None:
    queue = b"bi-10k-" + cmd.encode()
    ids = add_jobs(c, queue, 3)
    if cmd in ("NACK", "ENQUEUE"):
        assert len(c.call("GETJOB", "NOHANG", "COUNT", 3, "FROM", queue)) == 3  # make them active
    many = fake_ids(10000)
    # One bad ID at the very end: nothing at all happens.
    assert_error(c, (cmd, *many, *ids, b"D-bad"), exact=BADID)
    expected_len = 0 if cmd in ("NACK", "ENQUEUE") else 3
    assert c.call("QLEN", queue) == expected_len
    # Then the real thing, with the real IDs lost among 10 000 unknown ones.
    assert c.call(cmd, *many[:5000], *ids, *many[5000:]) == 3
    if cmd == "DEQUEUE":
        assert c.call("QLEN", queue) == 0
        assert [show_fields(c, i)[b"state"] for i in ids] == [b"active"] * 3  # type: ignore[index]
    elif cmd in ("NACK", "ENQUEUE"):
        assert c.call("QLEN", queue) == 3
        field = b"nacks" if cmd == "NACK" else b"additional-deliveries"
        assert [show_fields(c, i)[field] for i in ids] == [1, 1, 1]  # type: ignore[index]
    else:
        assert c.call("QLEN", queue) == 0
        assert all(c.call("GETJOB", "NOHANG", "FROM", queue) is None for _ in range(2))
    c.call("DELJOB", *ids)
    assert c.call("PING") == b"PONG"


def test_same_id_many_times(c: Resp) -> None:
    (job_id,) = add_jobs(c, "bi-dup", 1)
    assert c.call("DEQUEUE", *[job_id] * 1000) == 1
    assert c.call("ENQUEUE", *[job_id] * 1000) == 1
    assert c.call("QLEN", "bi-dup") == 1
    assert c.call("ACKJOB", *[job_id] * 10000) == 1
    assert c.call("QLEN", "bi-dup") == 0


# --------------------------------------------------------------------------
# Bodies and queue names
# --------------------------------------------------------------------------

BODIES = [
    b"", b"\x00", b"a\x00b", b"\x00" * 1000, b"\xff\xfe\xfd", b"\xc3\x28", b"\x80" * 300,
    bytes(range(256)), b"\r\n", b"\r", b"\n", b"*1\r\n$4\r\nPING\r\n", b"-ERR not an error\r\n",
    b"+OK", b" ", "é日本".encode() + b"\xed\xa0\x80", "text".encode("utf-16"),
]


def round_trip(c: Resp, queue: bytes, body: bytes) -> None:
    job_id = c.call("ADDJOB", queue, body, 0)
    assert JOB_ID.match(job_id), job_id
    assert c.call("QPEEK", queue, 1) == [[queue, job_id, body]]
    assert c.call("QPEEK", queue, -1) == [[queue, job_id, body]]
    shown = show_fields(c, job_id)
    assert shown is not None
    assert shown[b"body"] == body and shown[b"queue"] == queue
    cursor, entries = c.call("JSCAN", "QUEUE", queue, "REPLY", "all", "BUSYLOOP")
    assert cursor == b"0" and len(entries) == 1
    assert entries[0][entries[0].index(b"body") + 1] == body
    assert c.call("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", queue) == [
        [queue, job_id, body, b"nacks", 0, b"additional-deliveries", 0]]
    assert c.call("ACKJOB", job_id) == 1
    assert c.call("QLEN", queue) == 0


@pytest.mark.parametrize("body", BODIES, ids=arg_id)
def test_binary_bodies_round_trip(c: Resp, body: bytes) -> None:
    round_trip(c, b"bi-body", body)


@pytest.mark.parametrize("megabytes", [20, 40])
def test_very_large_bodies_round_trip(c: Resp, megabytes: int) -> None:
    body = os.urandom(megabytes * 1024 * 1024 - 3) + b"\x00\r\n"
    job_id = c.call("ADDJOB", "bi-large", body, 0)
    assert JOB_ID.match(job_id)
    assert c.call("QLEN", "bi-large") == 1
    assert show_fields(c, job_id)[b"body"] == body  # type: ignore[index]
    assert c.call("QPEEK", "bi-large", 1) == [[b"bi-large", job_id, body]]
    assert c.call("GETJOB", "NOHANG", "FROM", "bi-large") == [[b"bi-large", job_id, body]]
    assert c.call("ECHO", body) == body
    assert c.call("ACKJOB", job_id) == 1


QUEUE_NAMES = [b"", b"\x00", b"\x00\x00\x00", b"\xff\xfe", b"a\r\nb", b" ", b"*1\r\n",
               "日本".encode(), b"bi-long-" + b"q" * (1024 - 8)]  # max-queue-name-len


@pytest.mark.parametrize("name", QUEUE_NAMES, ids=arg_id)
def test_binary_and_empty_queue_names(c: Resp, name: bytes) -> None:
    assert c.call("QLEN", name) == 0
    job_id = c.call("ADDJOB", name, b"x\x00", 0)
    assert c.call("QLEN", name) == 1
    stat = c.call("QSTAT", name)
    assert stat[stat.index(b"name") + 1] == name and stat[stat.index(b"len") + 1] == 1
    assert c.call("QPEEK", name, 1) == [[name, job_id, b"x\x00"]]
    assert c.call("JSCAN", "QUEUE", name, "BUSYLOOP") == [b"0", [job_id]]
    assert name in c.call("QSCAN", "BUSYLOOP")[1]
    assert c.call("PAUSE", name, "in") == b"in"
    assert_error(c, ("ADDJOB", name, "y", 0), exact="PAUSED Queue paused in input, try later")
    assert c.call("PAUSE", name, "none") == b"none"
    assert c.call("GETJOB", "NOHANG", "FROM", name) == [[name, job_id, b"x\x00"]]
    assert c.call("ACKJOB", job_id) == 1
    assert c.call("QLEN", name) == 0
    round_trip(c, name, b"\xff\x00")


def test_unknown_queue_lookups(c: Resp) -> None:
    for name in (b"bi-never", b"\xff\x00never", b"n" * 1024):  # max-queue-name-len
        assert c.call("QLEN", name) == 0
        assert c.call_raw("QSTAT", name) == b"$-1\r\n"
        assert c.call_raw("QPEEK", name, INT64_MIN) == b"*0\r\n"
        assert c.call("PAUSE", name, "state") == b"none"
        assert c.call_raw("QSTAT", name) == b"$-1\r\n"  # PAUSE state creates nothing
        assert c.call("JSCAN", "QUEUE", name, "BUSYLOOP") == [b"0", []]


# --------------------------------------------------------------------------
# Queue commands: QPEEK QSCAN JSCAN PAUSE
# --------------------------------------------------------------------------

@pytest.mark.parametrize("count", NOT_INTS, ids=arg_id)
def test_qpeek_bad_count(c: Resp, count: bytes) -> None:
    assert_error(c, ("QPEEK", SENTINEL_QUEUE, count),
                 exact="ERR value is not an integer or out of range")


@pytest.mark.parametrize("count", [*TOO_BIG, *TOO_SMALL], ids=arg_id)
def test_qpeek_count_out_of_range(c: Resp, count: bytes) -> None:
    assert_error(c, ("QPEEK", SENTINEL_QUEUE, count), exact=(
        f"ERR value is out of range, must be between {-2 ** 63} and {2 ** 63 - 1}"))


def test_qpeek_extreme_counts(c: Resp) -> None:
    ids = add_jobs(c, "bi-peek", 3)
    entries = [[b"bi-peek", i, b"job%d" % n] for n, i in enumerate(ids)]
    assert c.call("QPEEK", "bi-peek", INT64_MAX) == entries
    assert c.call("QPEEK", "bi-peek", INT64_MIN) == entries[::-1]
    assert c.call("QPEEK", "bi-peek", -2) == entries[:0:-1]
    assert c.call_raw("QPEEK", "bi-peek", 0) == b"*0\r\n"
    assert c.call("QLEN", "bi-peek") == 3
    assert c.call("ACKJOB", *ids) == 3


SCAN_ERRORS = [
    ("QSCAN", "COUNT", "0"), ("QSCAN", "COUNT", "-1"), ("QSCAN", "COUNT", "abc"),
    ("QSCAN", "COUNT", HUGE), ("QSCAN", "MINLEN", "abc"), ("QSCAN", "MINLEN", "-1"),
    ("QSCAN", "MAXLEN", "-1"), ("QSCAN", "MAXLEN", HUGE), ("QSCAN", "IMPORTRATE", "abc"),
    ("QSCAN", "IMPORTRATE", "-1"), ("QSCAN", HUGE), ("QSCAN", "-1"),
    ("JSCAN", "COUNT", "0"), ("JSCAN", "COUNT", "abc"), ("JSCAN", "COUNT", INT64_OVER),
    ("JSCAN", "STATE", "bogus"), ("JSCAN", "STATE", b"\xff"), ("JSCAN", "STATE", ""),
    ("JSCAN", "REPLY", "x"), ("JSCAN", "REPLY", ""), ("JSCAN", "STATE"), ("JSCAN", "QUEUE"),
    ("JSCAN", "REPLY"), ("JSCAN", "COUNT"), ("JSCAN", HUGE),
]


@pytest.mark.parametrize("args", SCAN_ERRORS, ids=arg_id)
def test_scan_bad_options(c: Resp, args: tuple) -> None:
    assert_error(c, args, prefix="ERR ")


@pytest.mark.parametrize("args", [("QSCAN", "FOO"), ("QSCAN", "COUNT"), ("QSCAN", b"\xff"),
                                  ("JSCAN", "FOO"), ("JSCAN", b"")], ids=arg_id)
def test_scan_unknown_options(c: Resp, args: tuple) -> None:
    # The original takes the first unknown word for a cursor ("invalid cursor").
    assert_error(c, args, one_of=("ERR syntax error", "ERR invalid cursor"))


def test_scan_huge_counts(c: Resp) -> None:
    ids = add_jobs(c, "bi-scan", 2)
    cursor, names = c.call("QSCAN", "COUNT", INT64_MAX, "BUSYLOOP")
    assert cursor == b"0" and b"bi-scan" in names and SENTINEL_QUEUE in names
    cursor, found = c.call("JSCAN", "QUEUE", "bi-scan", "COUNT", INT64_MAX, "STATE", "QUEUED",
                           "STATE", "active", "BUSYLOOP", "REPLY", "ID")
    assert cursor == b"0" and sorted(found) == sorted(ids)
    assert c.call("ACKJOB", *ids) == 2


@pytest.mark.parametrize("args", [("foo",), ("",), (b"\xff",), ("in", "foo"), ("all", "x"),
                                  ("none", "in", "bcastx")], ids=arg_id)
def test_pause_bad_options(c: Resp, args: tuple) -> None:
    assert_error(c, ("PAUSE", "bi-pause", *args), exact="ERR syntax error")
    assert c.call("PAUSE", "bi-pause", "state") == b"none"  # nothing applied
    assert c.call_raw("QSTAT", "bi-pause") == b"$-1\r\n"
    assert_error(c, ("PAUSE", SENTINEL_QUEUE, "all", "nope"), exact="ERR syntax error")
    assert c.call("PAUSE", SENTINEL_QUEUE, "state") == b"none"


# --------------------------------------------------------------------------
# Server commands
# --------------------------------------------------------------------------

def test_ping_and_echo_binary(c: Resp) -> None:
    for value in (b"", b"\x00", b"\xff\r\n", bytes(range(256))):
        assert c.call("PING", value) == value
        assert c.call("ECHO", value) == value


def test_info_odd_sections(c: Resp) -> None:
    for section in (b"", b"nosuch", b"\xff\x00", b"x" * 100_000, b"ALL", b"sErVeR"):
        assert isinstance(c.call("INFO", section), bytes)
    assert b"registered_jobs:" in c.call("INFO", "jobs")


@pytest.mark.parametrize(("args", "prefix"), [
    (("abc",), "ERR Protocol version is not an integer or out of range"),
    (("",), "ERR Protocol version is not an integer or out of range"),
    (("1.5",), "ERR Protocol version is not an integer or out of range"),
    ((b"\xff",), "ERR Protocol version is not an integer or out of range"),
    ((HUGE,), "ERR Protocol version is not an integer or out of range"),
    (("4",), "NOPROTO "), (("1",), "NOPROTO "), (("0",), "NOPROTO "), (("-1",), "NOPROTO "),
    ((INT64_MAX,), "NOPROTO "),
    (("3", "FOO"), "ERR Syntax error in HELLO option"),
    (("3", "AUTH"), "ERR Syntax error in HELLO option"),
    (("3", "AUTH", "default"), "ERR Syntax error in HELLO option"),
    (("2", "SETNAME"), "ERR Syntax error in HELLO option"),
    (("3", b"\xff"), "ERR Syntax error in HELLO option"),
    (("3", "SETNAME", "a b"), "ERR "),
    (("3", "AUTH", "default", "x"), "ERR "),
], ids=arg_id)
def test_hello_bad_arguments(c: Resp, args: tuple, prefix: str) -> None:
    assert_error(c, ("HELLO", *args), prefix=prefix)
    assert c.call_raw("SHOW", VALID) == b"$-1\r\n"  # still RESP2: nothing was switched


@pytest.mark.parametrize(("args", "expected"), [
    (("x",), "ERR Client sent AUTH, but no password is set"),
    ((b"\xff\x00",), "ERR Client sent AUTH, but no password is set"),
    (("a", "b", "c"), "ERR syntax error"),
], ids=arg_id)
def test_auth_without_requirepass(c: Resp, args: tuple, expected: str) -> None:
    assert_error(c, ("AUTH", *args), exact=expected)


def config_snapshot(c: Resp) -> dict[bytes, bytes]:
    flat = c.call("CONFIG", "GET", "*")
    return dict(zip(flat[::2], flat[1::2], strict=True))


CONFIG_ERRORS = (
    [("GET",), ("SET", "hz"), ("SET",), ("REWRITE", "x"), ("FOO",), (b"\xff",),
     ("SET", "nosuch", "1"), ("SET", b"\xff", "1"), ("SET", "", ""),
     ("SET", "loglevel", "bogus"), ("SET", "maxmemory-policy", "bogus"),
     ("SET", "dir", "/nonexistent/dir"), ("SET", "dir", b"/nonexistent/\xff"), ("SET", "dir", ""),
     ("SET", "port", "1"), ("SET", "cluster-config-file", "x.conf")]
    + [("SET", "hz", v) for v in [b"abc", b"-1", b"0", HUGE, INT64_OVER, b"\xff", b""]]
    + [("SET", "maxmemory", v) for v in [b"abc", b"-1", b"\xff", b"", b"1.5xb"]]
    + [("SET", "maxclients", v) for v in [b"abc", b"0", INT64_OVER, HUGE]]
    + [("SET", "cluster-node-timeout", v) for v in [b"abc", b"-1", HUGE]]
    # Request limits so small that every command, this CONFIG SET included,
    # would be a protocol error: the node could only be killed.
    + [("SET", name, v) for name in ("proto-max-bulk-len", "client-query-buffer-limit")
       for v in [b"0", b"100", b"1048575"]]
)


@pytest.mark.parametrize("args", CONFIG_ERRORS, ids=arg_id)
def test_config_bad_arguments(c: Resp, args: tuple) -> None:
    before = config_snapshot(c)
    assert_error(c, ("CONFIG", *args), prefix="ERR ")
    assert config_snapshot(c) == before


@pytest.mark.parametrize("name", ["loglevel", "maxmemory-policy"])
def test_config_set_non_utf8_value(c: Resp, name: str) -> None:
    before = config_snapshot(c)
    assert_error(c, ("CONFIG", "SET", name, b"\xff\xfe"), prefix="ERR ")
    assert config_snapshot(c) == before


def test_config_get_odd_patterns(c: Resp) -> None:
    for pattern in (b"", b"\xff", b"nosuch", b"[", b"x" * 100_000):
        assert c.call("CONFIG", "GET", pattern) == []


@pytest.mark.parametrize("args", [
    ("FOO",), ("FLUSHALL", "x"), ("FLUSHALL", ""), ("SLEEP",), ("SLEEP", "abc"), ("SLEEP", "-1"),
    ("SLEEP", "nan"), ("SLEEP", "inf"), ("SLEEP", "1e308"), ("SLEEP", HUGE), ("SLEEP", b"\xff"),
    ("SLEEP", "61"), ("SLEEP", "0", "0"), (b"\xff",),
], ids=arg_id)
def test_debug_bad_arguments(c: Resp, args: tuple) -> None:
    assert_error(c, ("DEBUG", *args), prefix="ERR ")  # and the sentinel is still there


def test_command_info_unknown(c: Resp) -> None:
    assert c.call("COMMAND", "INFO", "nosuch", b"\xff", "") == [None, None, None]
    assert c.call("COMMAND", "INFO") == []
    assert c.call("COMMAND", "COUNT") >= 29


@pytest.mark.parametrize("args", [
    ("FOO",), (b"\xff",), ("SETNAME",), ("SETNAME", "a b"), ("SETNAME", b"\xff"),
    ("SETNAME", "a\nb"), ("SETNAME", "a", "b"), ("GETNAME", "x"), ("LIST", "x"), ("ID", "x"),
    ("KILL", "ID", "abc"), ("KILL", "ID", "0"), ("KILL", "ID", "-1"), ("KILL", "ID", HUGE),
    ("KILL", "ID", ""), ("KILL", "FOO", "bar"), ("KILL", "ADDR", "x", "SKIPME", "maybe"),
    ("KILL", "1.2.3.4:5"), ("KILL", b"\xff"), ("SETINFO", "foo", "bar"),
    ("SETINFO", "lib-name", "a b"), ("SETINFO", "lib-name"),
], ids=arg_id)
def test_client_bad_arguments(c: Resp, args: tuple) -> None:
    assert_error(c, ("CLIENT", *args), prefix="ERR ")


def test_cluster_bad_arguments(c: Resp) -> None:
    myid = c.call("CLUSTER", "MYID")
    for args in [("FOO",), (b"\xff",), ("MEET",), ("MEET", "x", "y"),
                 ("MEET", "127.0.0.1", "abc"), ("MEET", "127.0.0.1", "-1"),
                 ("MEET", "127.0.0.1", "65536"), ("MEET", "127.0.0.1", HUGE),
                 ("MEET", "127.0.0.1", b"\xff"), ("MEET", b"\xff", "7711"),
                 ("MEET", "999.1.1.1", "7711"), ("MEET", "", "7711"), ("FORGET",),
                 ("FORGET", "x"), ("FORGET", b"\xff" * 40), ("FORGET", myid),
                 ("FORGET", b"0" * 40), ("RESET", "maybe"), ("RESET", "HARD", "x"),
                 ("RESET", ""), ("LEAVING", "maybe"), ("LEAVING", "yes", "no"),
                 ("LEAVING", ""), ("NODES", "x"), ("INFO", "x"), ("MYID", "x"),
                 ("SAVECONFIG", "x")]:
        assert_error(c, ("CLUSTER", *args), prefix="ERR ")
    assert c.call("CLUSTER", "MYID") == myid
    assert c.call("CLUSTER", "LEAVING") == b"no"


# --------------------------------------------------------------------------
# Node-wide settings: their own node
# --------------------------------------------------------------------------

def test_auth_bad_input_with_requirepass(server_factory) -> None:
    node = server_factory("--requirepass", "s3cret")
    with Resp(node.port) as c:
        assert c.call("PING") == b"PONG"
        assert_error(c, ("ADDJOB", "q", "x", 0), exact="NOAUTH Authentication required.")
        for args in (("GETJOB", "NOHANG", "FROM", "q"), ("SHOW", VALID), ("ACKJOB", "bad"),
                     ("QLEN", "q"), ("HELLO",), ("CONFIG", "GET", "*"), ("DEBUG", "FLUSHALL")):
            assert err_text(c.call(*args)).startswith("NOAUTH ")
        # Arity is checked before authentication, like the original.
        assert_error(c, ("ADDJOB",), exact="ERR wrong number of arguments for 'addjob' command")
        for password in (b"wrong", b"", b"\xff\x00", b"s3cret\x00", b"S3CRET", b"p" * 16384):
            assert_error(c, ("AUTH", password), exact="ERR invalid password")
            assert err_text(c.call("QLEN", "q")).startswith("NOAUTH ")
        # Longer ones are Redis's pre-auth protocol error (tests/server/test_client_limits.py).
        with Resp(node.port) as other:
            other.send(b"*2\r\n$4\r\nAUTH\r\n$1000000\r\n")
            assert other.read_until_closed() == (b"-ERR Protocol error: unauthenticated bulk "
                                                 b"length\r\n")
        assert_error(c, ("AUTH", "s3cret", "x", "y"), exact="ERR syntax error")
        # A failed HELLO AUTH does not authenticate; a good one answers in RESP3.
        text = err_text(c.call("HELLO", 3, "AUTH", "default", "wrong"))
        assert text.startswith(("ERR ", "WRONGPASS ")), text
        assert err_text(c.call("QLEN", "q")).startswith("NOAUTH ")
        assert parse_raw_hello(c.call_raw("HELLO", 3, "AUTH", "default", "s3cret")) == 3
        job_id = c.call("ADDJOB", "q", b"\x00", 0)
        assert JOB_ID.match(job_id)
        assert c.call("ACKJOB", job_id) == 1
    # Stock redis-py 8 with a password sends HELLO 3 AUTH default <password>.
    client = redis.Redis(host="127.0.0.1", port=node.port, password="s3cret", socket_timeout=10)
    try:
        assert client.ping()
        job_id = client.execute_command("ADDJOB", "q", b"\xff", 0)
        assert client.execute_command("SHOW", job_id)[b"body"] == b"\xff"
        assert client.execute_command("ACKJOB", job_id) == 1
    finally:
        client.close()
    bad = redis.Redis(host="127.0.0.1", port=node.port, password="nope", socket_timeout=10,
                      retry=Retry(NoBackoff(), 0))
    try:
        with pytest.raises(redis.exceptions.AuthenticationError):
            bad.ping()
    finally:
        bad.close()


def parse_raw_hello(raw: bytes) -> int:
    """The ``proto`` field of a HELLO 2/3 reply, checking it is encoded in that protocol."""
    reply = parse(raw)
    proto = (reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2],
                                                            strict=True)))[b"proto"]
    assert raw[:1] == (b"%" if proto == 3 else b"*"), raw[:20]
    return proto


def test_binary_requirepass(server: DisqueProcess) -> None:
    password = b"p\xff\x00w"
    with Resp(server.port) as admin:
        assert admin.call("CONFIG", "SET", "requirepass", password) == b"OK"
        with Resp(server.port) as c:
            assert_error(c, ("AUTH", "wrong"), exact="ERR invalid password")
            assert c.call("AUTH", password) == b"OK"
        assert admin.call("CONFIG", "GET", "requirepass") == [b"requirepass", password]


@pytest.mark.parametrize("args", [("FOO",), ("a", "b"), ("NOSAVE", "x"), ("SAVEX",)],
                         ids=arg_id)
def test_shutdown_bad_arguments(server: DisqueProcess, args: tuple) -> None:
    with Resp(server.port) as c:
        assert_error(c, ("SHUTDOWN", *args), exact="ERR syntax error")
    assert server.alive()


def test_shutdown_non_utf8_argument(server: DisqueProcess) -> None:
    with Resp(server.port) as c:
        c.send(b"PING\r\n")
        assert c.read() == b"PONG"
        assert_error(c, ("SHUTDOWN", b"\xff"), exact="ERR syntax error")
    assert server.alive()


def test_shutdown_empty_argument(server: DisqueProcess) -> None:
    with Resp(server.port) as c:
        assert_error(c, ("SHUTDOWN", ""), exact="ERR syntax error")
    assert server.alive()


def test_handler_crash_does_not_eat_pipelined_replies(server: DisqueProcess) -> None:
    """SHUTDOWN with non-UTF-8 bytes used to raise in its handler, which dropped the
    connection together with the replies of the commands pipelined before it."""
    with Resp(server.port) as c:
        c.send(b"PING\r\n*2\r\n$8\r\nSHUTDOWN\r\n$1\r\n\xff\r\nPING\r\n")
        assert c.read() == b"PONG"
        assert err_text(c.read()) == "ERR syntax error"
        assert c.read() == b"PONG"


def test_redis_py_pipeline_with_errors_keeps_reply_order(r: redis.Redis) -> None:
    """Stock redis-py (RESP2): errors inside a pipeline land at their own position."""
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("ADDJOB", "bi-pipe", b"\x00a", 0)
    pipe.execute_command("ADDJOB", "bi-pipe", b"b", 0, "TTL", 0)
    pipe.execute_command("SHOW", b"not-an-id")
    pipe.execute_command("ADDJOB", "bi-pipe", b"\xffc", 0, "REPLICATE", 0)
    pipe.execute_command("ADDJOB", "bi-pipe", b"d", "abc")
    pipe.execute_command("ACKJOB")
    pipe.execute_command("ADDJOB", "bi-pipe", b"", 0)
    pipe.execute_command("QLEN", "bi-pipe")
    results = pipe.execute(raise_on_error=False)
    assert JOB_ID.match(results[0]) and JOB_ID.match(results[6])
    errors = [str(e) for e in results[1:6]]
    assert errors == ["TTL must be a number > 0", "BADID Invalid Job ID format.",
                      "REPLICATE must be between 1 and 65535",
                      "timeout is not an integer or out of range",
                      "wrong number of arguments for 'ackjob' command"]
    assert all(isinstance(e, redis.exceptions.ResponseError) for e in results[1:6])
    assert results[7] == 2
    assert r.execute_command("GETJOB", "NOHANG", "COUNT", 5, "FROM", "bi-pipe") == [
        [b"bi-pipe", results[0], b"\x00a"], [b"bi-pipe", results[6], b""]]
    body = os.urandom(20 * 1024 * 1024)
    job_id = r.execute_command("ADDJOB", b"bi-pipe\xff", body, 0)
    assert r.execute_command("SHOW", job_id)[-1] == body
    assert r.execute_command("ACKJOB", job_id, results[0], results[6]) == 3


def test_many_clients_sending_garbage(node: DisqueProcess, c: Resp) -> None:
    """Bad frames on many connections at once: each is closed, the node keeps serving."""
    garbage = [b"*abc\r\n", b"*1\r\n:1\r\n", b'ECHO "x\r\n', b"*1\r\n$-9\r\n",
               b"\x00" * 70000, b"*1\r\n$999999999999\r\n"]
    conns = [Resp(node.port) for _ in range(60)]
    try:
        for i, conn in enumerate(conns):
            conn.send(garbage[i % len(garbage)])
        for conn in conns:
            assert conn.read_until_closed().startswith(b"-ERR Protocol error")
    finally:
        for conn in conns:
            conn.close()
    wait_for(lambda: info_int(c, "clients", "connected_clients") <= 3,
             message="the garbage connections to be gone")
    round_trip(c, b"bi-after-garbage", b"\x00ok")
