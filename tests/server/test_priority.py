"""ADDJOB ... PRIORITY on a real node: the order GETJOB, QPEEK and NACK keep,
the filters and fields that show it, and every bad input refused with
nothing stored (docs/EXTENSIONS.md, "Priorities")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.test_bad_input import (
    HUGE,
    NOT_INTS,
    arg_id,
    assert_error,
    assert_error_no_new_jobs,
)
from tests.server.test_protocol_raw import Resp, pack
from tests.support.process import DisqueProcess, wait_for


@pytest.fixture
def c(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as conn:
        conn.call("DEBUG", "FLUSHALL")
        yield conn
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"


def pairs(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(*[iter(reply)] * 2, strict=True))


def add(c: Resp, queue: str, body: str, priority: int | None = None, *opts: Any) -> bytes:
    args: tuple[Any, ...] = ("ADDJOB", queue, body, 0, *opts)
    if priority is not None:
        args += ("PRIORITY", priority)
    job_id = c.call(*args)
    assert isinstance(job_id, bytes) and job_id.startswith(b"D-"), job_id
    return job_id


def bodies(entries: list[list[Any]] | None) -> list[bytes]:
    return [entry[2] for entry in entries or []]


def test_higher_priorities_first_fifo_within_a_priority(c: Resp) -> None:
    for body, priority in (("a0", None), ("b5", 5), ("c0", 0), ("d31", 31), ("e5", 5),
                           ("f1", 1), ("g0", None)):
        add(c, "q", body, priority)
    expected = [b"d31", b"b5", b"e5", b"f1", b"a0", b"c0", b"g0"]
    assert bodies(c.call("QPEEK", "q", 10)) == expected
    assert bodies(c.call("QPEEK", "q", -3)) == expected[::-1][:3]
    assert bodies(c.call("GETJOB", "COUNT", 3, "FROM", "q")) == expected[:3]
    assert bodies(c.call("GETJOB", "NOHANG", "COUNT", 10, "FROM", "q")) == expected[3:]
    assert c.call("QLEN", "q") == 0


def test_a_queue_without_priorities_keeps_the_original_order_and_replies(c: Resp) -> None:
    ids = [add(c, "plain", f"j{i}") for i in range(5)]
    assert [e[1] for e in c.call("QPEEK", "plain", 5)] == ids
    show = pairs(c.call("SHOW", ids[0]))
    assert b"priority" not in show and b"backoff" not in show
    assert b"priorities" not in pairs(c.call("QSTAT", "plain"))
    assert len(pairs(c.call("QSTAT", "plain"))) == 10  # the original's fields only
    # PRIORITY 0 is the default: a plain job, nothing added to SHOW.
    zero = add(c, "plain", "zero", 0)
    assert b"priority" not in pairs(c.call("SHOW", zero))
    assert [e[1] for e in c.call("GETJOB", "COUNT", 6, "FROM", "plain")] == [*ids, zero]


def test_show_qstat_and_the_scan_filters(c: Resp) -> None:
    low = add(c, "s1", "low")
    mid = add(c, "s1", "mid", 3)
    high = add(c, "s2", "high", 20, "RETRY", 30, "MAXDELIVERIES", 5)
    assert pairs(c.call("SHOW", mid))[b"priority"] == 3
    show_high = pairs(c.call("SHOW", high))
    assert show_high[b"priority"] == 20 and show_high[b"max-deliveries"] == 5
    assert pairs(c.call("QSTAT", "s1"))[b"priorities"] == [3, 1]
    assert pairs(c.call("QSTAT", "s2"))[b"priorities"] == [20, 1]

    def jscan(*filters: Any) -> set[bytes]:
        return set(c.call("JSCAN", "COUNT", 1000, "BUSYLOOP", *filters)[1])

    def qscan(*filters: Any) -> set[bytes]:
        return set(c.call("QSCAN", "COUNT", 1000, "BUSYLOOP", *filters)[1])

    assert jscan("MINPRIORITY", 0) == {low, mid, high}
    assert jscan("MINPRIORITY", 3) == {mid, high}
    assert jscan("MINPRIORITY", 21) == set()
    assert jscan("MINPRIORITY", 3, "QUEUE", "s1") == {mid}
    assert qscan("MINPRIORITY", 1) == {b"s1", b"s2"}
    assert qscan("MINPRIORITY", 4) == {b"s2"}
    # QSCAN's filter is about queued jobs: once delivered, the queue has none left.
    assert c.call("GETJOB", "FROM", "s2")[0][1] == high
    assert qscan("MINPRIORITY", 4) == set()
    assert b"priorities" not in pairs(c.call("QSTAT", "s2"))


def test_nack_and_requeue_keep_the_priority(c: Resp) -> None:
    urgent = add(c, "n", "urgent", 9, "RETRY", 1)
    assert c.call("GETJOB", "FROM", "n")[0][1] == urgent
    plain = [add(c, "n", f"p{i}") for i in range(3)]
    assert c.call("NACK", urgent) == 1  # back in the queue: still ahead of older jobs
    assert [e[1] for e in c.call("QPEEK", "n", 10)] == [urgent, *plain]
    assert c.call("GETJOB", "FROM", "n")[0][1] == urgent
    # Not acked: RETRY passes, the node queues it again, ahead again.
    wait_for(lambda: c.call("QLEN", "n") == 4, timeout=5, message="the requeue")
    assert c.call("GETJOB", "FROM", "n")[0][1] == urgent
    assert c.call("ACKJOB", urgent) == 1


def test_several_queues_left_to_right_each_by_its_priorities(c: Resp) -> None:
    add(c, "m1", "m1-plain")
    add(c, "m1", "m1-high", 7)
    add(c, "m2", "m2-plain")
    add(c, "m2", "m2-high", 2)
    # One job per queue per pass, left to right, as in the original; each
    # queue hands out its highest priority first.
    got = c.call("GETJOB", "COUNT", 4, "FROM", "m1", "m2")
    assert bodies(got) == [b"m1-high", b"m2-high", b"m1-plain", b"m2-plain"]


def test_blocked_consumers_get_the_highest_priority_job(c: Resp, node: DisqueProcess) -> None:
    c.call("PAUSE", "b", "out")
    add(c, "b", "plain")
    add(c, "b", "urgent", 12)
    with Resp(node.port) as waiter:
        waiter.send(pack("GETJOB", "TIMEOUT", 5000, "FROM", "b"))
        wait_for(lambda: pairs(c.call("QSTAT", "b"))[b"blocked"] == 1, timeout=5,
                 message="the consumer to block")
        c.call("PAUSE", "b", "none")  # the consumer is served: the urgent job
        assert bodies(waiter.read()) == [b"urgent"]


def test_addjobs_takes_the_priority_once_for_all(c: Resp) -> None:
    add(c, "bulk", "first")
    ids = c.call("ADDJOBS", "bulk", 0, "PRIORITY", 4, "BODIES", "x", "y")
    assert len(ids) == 2
    assert bodies(c.call("QPEEK", "bulk", 3)) == [b"x", b"y", b"first"]
    assert all(pairs(c.call("SHOW", i))[b"priority"] == 4 for i in ids)


def test_dead_letters_keep_the_priority(c: Resp) -> None:
    job_id = add(c, "d", "poison", 6, "RETRY", 1, "MAXDELIVERIES", 1)
    add(c, "d:dead", "older dead letter")
    assert c.call("GETJOB", "FROM", "d")[0][1] == job_id
    assert c.call("NACK", job_id) == 1  # over the limit: moved to d:dead
    assert pairs(c.call("SHOW", job_id))[b"queue"] == b"d:dead"
    assert bodies(c.call("QPEEK", "d:dead", 5)) == [b"poison", b"older dead letter"]


ADD = ("ADDJOB", "bad-q", "body", 0)
PRIORITY_ERROR = "ERR PRIORITY must be between 0 and 31"


@pytest.mark.parametrize("value", [32, -1, 1000, HUGE, *NOT_INTS[:5]], ids=arg_id)
def test_bad_priorities_store_nothing(c: Resp, value: Any) -> None:
    assert_error_no_new_jobs(c, (*ADD, "PRIORITY", value), exact=PRIORITY_ERROR)
    assert_error_no_new_jobs(c, ("ADDJOBS", "bad-q", 0, "PRIORITY", value, "BODIES", "a"),
                             exact=PRIORITY_ERROR)


@pytest.mark.parametrize(("args", "error"), [
    ((*ADD, "PRIORITY"), "ERR syntax error"),
    (("JSCAN", "MINPRIORITY", 32), "ERR MINPRIORITY must be between 0 and 31"),
    (("JSCAN", "MINPRIORITY", "x"), "ERR MINPRIORITY must be between 0 and 31"),
    (("QSCAN", "MINPRIORITY", -1), "ERR MINPRIORITY must be between 0 and 31"),
    (("QSCAN", "MINPRIORITY"), "ERR syntax error"),
], ids=arg_id)
def test_bad_priority_arguments(c: Resp, args: tuple, error: str) -> None:
    assert_error_no_new_jobs(c, args, exact=error)


def test_a_refused_priority_loses_no_queued_job(c: Resp) -> None:
    kept = add(c, "keep", "kept", 5)
    assert_error(c, ("ADDJOB", "keep", "x", 0, "PRIORITY", 99), exact=PRIORITY_ERROR)
    assert [e[1] for e in c.call("QPEEK", "keep", 5)] == [kept]


# --------------------------------------------------------------------------
# The job-options record: version 2 carries the priority, version 1 reads as 0
# --------------------------------------------------------------------------

def _v1_record(backoff: int, max_deliveries: int, dead_letter: bytes, dead_from: bytes) -> bytes:
    """A record as a node without priorities wrote it (version 1)."""
    import struct

    body = (struct.pack("<II", backoff, max_deliveries)
            + struct.pack("<I", len(dead_letter)) + dead_letter
            + struct.pack("<I", len(dead_from)) + dead_from)
    return b"DQX" + bytes((1,)) + struct.pack("<I", len(body)) + body


def test_records_of_both_versions_and_of_a_later_one() -> None:
    import struct

    from disque.job_options import ExtError, JobExt, decode_record, encode_record

    ext = JobExt(60, 3, b"dlq", b"", priority=17)
    record = encode_record(ext)
    assert decode_record(record) == (ext, len(record))
    # A version-1 record: the priority is 0, the rest as written.
    old = _v1_record(60, 3, b"dlq", b"from")
    assert decode_record(old) == (JobExt(60, 3, b"dlq", b"from"), len(old))
    # What a version-1 reader reads of ours: the same first fields at the same
    # offsets, and a length that covers the priority, which it skips.
    assert record[4:8] == struct.pack("<I", len(record) - 8)
    assert record[8:-1] == _v1_record(60, 3, b"dlq", b"")[8:]
    # A later version appends fields (after version 3's headers and version
    # 4's group, here none): they are skipped.
    later = bytearray(record + struct.pack("<II", 0, 0) + b"future")
    later[3] = 5
    later[4:8] = struct.pack("<I", len(later) - 8)
    assert decode_record(bytes(later)) == (ext, len(later))
    bad = bytearray(record)
    bad[-1] = 32
    with pytest.raises(ExtError, match="priority 32 out of range"):
        decode_record(bytes(bad))


def test_a_priority_only_job_travels_on_the_bus_trailer() -> None:
    from disque.job import Job
    from disque.job_options import JobExt, apply_bus_trailer, bus_trailer

    plain = Job(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", b"q", b"x")
    urgent = Job(b"D-dcb833cf-a4oZ4q6dfNCSmRqgHlWbN1ax-05a1", b"q", b"y")
    urgent.ext = JobExt(priority=9)
    assert bus_trailer([plain]) == b""  # a plain job: the original's message
    trailer = bus_trailer([plain, urgent])
    received = [Job(plain.id, b"q", b"x"), Job(urgent.id, b"q", b"y")]
    apply_bus_trailer(received, trailer, 0)
    assert received[0].ext is None and received[1].ext == JobExt(priority=9)
