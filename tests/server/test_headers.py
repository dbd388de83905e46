"""Job headers on one real node (docs/EXTENSIONS.md, "Job headers"):
ADDJOB ... HEADER, ADDJOBS ... JOBS, GETJOB ... WITHHEADERS, SHOW, the
limits (a clear error, nothing stored) and the memory they count."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest

from disque.headers import headers_size
from disque.job_options import JobExt
from disque.job_table import HEADER_OVERHEAD_BYTES, HEADERS_OVERHEAD_BYTES, headers_memory
from tests.server.test_bad_input import assert_error, assert_error_no_new_jobs, info_int
from tests.server.test_protocol_raw import Resp
from tests.support.process import DisqueProcess, wait_for

TRACE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def c(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as conn:
        conn.call("DEBUG", "FLUSHALL")
        conn.call("CONFIG", "SET", "max-job-headers", "64")
        conn.call("CONFIG", "SET", "max-job-headers-size", "65536")
        yield conn
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"


def pairs(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(*[iter(reply)] * 2, strict=True))


def add(c: Resp, queue: str, body: str, *headers: Any, opts: tuple[Any, ...] = ()) -> bytes:
    args: list[Any] = ["ADDJOB", queue, body, 0, *opts]
    for name, value in zip(headers[::2], headers[1::2], strict=True):
        args += ["HEADER", name, value]
    job_id = c.call(*args)
    assert isinstance(job_id, bytes) and job_id.startswith(b"D-"), job_id
    return job_id


# --------------------------------------------------------------------------
# Replies
# --------------------------------------------------------------------------

def test_headers_come_back_with_withheaders_in_order_binary_safe(c: Resp) -> None:
    value = b"\x00\xff\r\n binary"
    job_id = add(c, "q", "body", "traceparent", TRACE, "tenant", value, "tenant", "",
                 "Tenant", "other")
    entry = c.call("GETJOB", "WITHHEADERS", "FROM", "q")[0]
    assert entry == [b"q", job_id, b"body", b"headers",
                     [b"traceparent", TRACE, b"tenant", value, b"tenant", b"",
                      b"Tenant", b"other"]]


def test_withheaders_follows_withcounters_and_withlease(c: Resp) -> None:
    job_id = add(c, "q", "body", "a", "1", opts=("RETRY", 60))
    entry = c.call("GETJOB", "WITHHEADERS", "WITHCOUNTERS", "WITHLEASE", "FROM", "q")[0]
    assert entry[:7] == [b"q", job_id, b"body", b"nacks", 0, b"additional-deliveries", 0]
    assert entry[7] == b"next-requeue-within" and isinstance(entry[8], int)
    assert entry[9:] == [b"headers", [b"a", b"1"]]
    c.call("NACK", job_id)
    entry = c.call("GETJOB", "WITHCOUNTERS", "WITHHEADERS", "FROM", "q")[0]
    assert entry == [b"q", job_id, b"body", b"nacks", 1, b"additional-deliveries", 0,
                     b"headers", [b"a", b"1"]]
    # Without WITHHEADERS, the headers stay out of the reply.
    c.call("NACK", job_id)
    assert c.call("GETJOB", "WITHCOUNTERS", "FROM", "q")[0] == [
        b"q", job_id, b"body", b"nacks", 2, b"additional-deliveries", 0]


def test_a_job_without_headers_gets_an_empty_list_when_asked(c: Resp) -> None:
    plain = add(c, "q", "plain")
    with_h = add(c, "q", "rich", "k", "v")
    entries = c.call("GETJOB", "COUNT", 2, "WITHHEADERS", "FROM", "q")
    assert entries == [[b"q", plain, b"plain", b"headers", []],
                       [b"q", with_h, b"rich", b"headers", [b"k", b"v"]]]


def test_getjob_without_withheaders_is_the_original_reply(c: Resp) -> None:
    job_id = add(c, "q", "body", "k", "v")
    raw = c.call_raw("GETJOB", "FROM", "q")
    assert raw == (b"*1\r\n*3\r\n$1\r\nq\r\n$%d\r\n%s\r\n$4\r\nbody\r\n"
                   % (len(job_id), job_id))


def test_a_blocked_getjob_withheaders_gets_them(node: DisqueProcess, c: Resp) -> None:
    with Resp(node.port) as consumer:
        consumer.send(b"*6\r\n$6\r\nGETJOB\r\n$11\r\nWITHHEADERS\r\n$7\r\nTIMEOUT\r\n"
                      b"$4\r\n5000\r\n$4\r\nFROM\r\n$2\r\nbq\r\n")
        wait_for(lambda: info_int(c, "clients", "blocked_clients") == 1,
                 message="the GETJOB to block")
        job_id = add(c, "bq", "late", "k", "v")
        assert consumer.read() == [[b"bq", job_id, b"late", b"headers", [b"k", b"v"]]]


def test_show_lists_the_headers_only_for_a_job_with_some(c: Resp) -> None:
    rich = add(c, "q", "body", "traceparent", TRACE, "bin", b"\x01\x02")
    show = pairs(c.call("SHOW", rich))
    assert show[b"headers"] == [b"traceparent", TRACE, b"bin", b"\x01\x02"]
    assert b"priority" not in show and b"backoff" not in show
    plain = add(c, "q", "body")
    assert b"headers" not in pairs(c.call("SHOW", plain))
    assert len(c.call("SHOW", plain)) == 30  # the original's 15 fields
    both = add(c, "q", "body", "k", "v", opts=("PRIORITY", 3))
    show = pairs(c.call("SHOW", both))
    assert (show[b"priority"], show[b"headers"]) == (3, [b"k", b"v"])
    assert list(show)[-2:] == [b"priority", b"headers"]


def test_jscan_reply_all_lists_them_as_show_does(c: Resp) -> None:
    job_id = add(c, "q", "body", "k", "v")
    cursor, entries = c.call("JSCAN", 0, "QUEUE", "q", "REPLY", "all")
    assert cursor == b"0" and len(entries) == 1
    assert pairs(entries[0])[b"headers"] == [b"k", b"v"]
    assert pairs(entries[0])[b"id"] == job_id


def test_an_acked_jobs_aof_record_drops_them() -> None:
    from disque.aof.records import dehydrated_ack_record, loadjob_record
    from disque.job import ACKED, Job

    job = Job(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", b"q", b"body", ctime=1,
              etime=10_000_000, retry=30)
    job.ext = JobExt(priority=3, headers=(b"k", b"v" * 100))
    assert b"v" * 100 in loadjob_record(job)
    job.state = ACKED
    record = dehydrated_ack_record(job)
    assert b"v" * 100 not in record and b"body" not in record
    assert job.ext.headers  # the job itself keeps them


def test_headers_stay_through_nack_and_requeue(c: Resp) -> None:
    job_id = add(c, "q", "body", "k", "v", opts=("RETRY", 1))
    c.call("GETJOB", "FROM", "q")
    assert c.call("NACK", job_id) == 1
    assert c.call("GETJOB", "WITHHEADERS", "FROM", "q")[0][4] == [b"k", b"v"]
    # Not acked: queued again after RETRY, headers and all.
    entry = wait_for(lambda: c.call("GETJOB", "NOHANG", "WITHHEADERS", "FROM", "q"),
                     timeout=5, message="the requeue after RETRY")
    assert entry[0][1:] == [job_id, b"body", b"headers", [b"k", b"v"]]


def test_headers_stay_through_a_dead_letter_move(c: Resp) -> None:
    job_id = add(c, "q", "body", "k", "v", opts=("RETRY", 5, "MAXDELIVERIES", 1))
    c.call("GETJOB", "FROM", "q")
    assert c.call("NACK", job_id) == 1
    entry = c.call("GETJOB", "NOHANG", "WITHHEADERS", "FROM", "q:dead")
    assert entry == [[b"q:dead", job_id, b"body", b"headers", [b"k", b"v"]]]


# --------------------------------------------------------------------------
# Bad input: a clear error, nothing stored
# --------------------------------------------------------------------------

@pytest.mark.parametrize("args, error", [
    (("HEADER",), "ERR syntax error"),
    (("HEADER", "name"), "ERR syntax error"),
    (("HEADER", "", "v"), "ERR HEADER name can't be empty"),
    (("HEADER", b"\xff\xfe", "v"), "ERR HEADER name must be UTF-8 text"),
    (("HEADER", "a\nb", "v"), "ERR HEADER name must not contain control characters"),
    (("HEADER", "tab\there", "v"), "ERR HEADER name must not contain control characters"),
    (("HEADER", "del\x7f", "v"), "ERR HEADER name must not contain control characters"),
    (("HEADER", "c1\u0085".encode(), "v"),
     "ERR HEADER name must not contain control characters"),
    (("HEADER", "ok", "v", "HEADER", "", "v"), "ERR HEADER name can't be empty"),
])
def test_a_bad_header_is_refused_and_nothing_stored(c: Resp, args: tuple[Any, ...],
                                                    error: str) -> None:
    assert_error_no_new_jobs(c, ("ADDJOB", "q", "body", 0, *args), exact=error)
    assert c.call("QLEN", "q") == 0


def test_names_may_be_any_printable_text(c: Resp) -> None:
    job_id = add(c, "q", "b", "with space", "1", "ünïcödé-名前", "2", "x-Trace.ID:1", "3")
    assert pairs(c.call("SHOW", job_id))[b"headers"][::2] == [
        b"with space", "ünïcödé-名前".encode(), b"x-Trace.ID:1"]


def test_too_many_headers_are_refused(c: Resp) -> None:
    c.call("CONFIG", "SET", "max-job-headers", "3")
    add(c, "q", "b", "a", "1", "b", "2", "c", "3")  # at the limit
    headers = ("HEADER", "a", "1") * 4
    text = assert_error_no_new_jobs(c, ("ADDJOB", "q", "body", 0, *headers))
    assert text == "ERR too many headers: 4, at most 3 per job (max-job-headers)"
    c.call("CONFIG", "SET", "max-job-headers", "0")
    assert_error_no_new_jobs(c, ("ADDJOB", "q", "body", 0, "HEADER", "a", "1"),
                             prefix="ERR too many headers: 1, at most 0")
    add(c, "q", "no headers at all")  # 0 refuses headers, not jobs
    assert c.call("QLEN", "q") == 2


def test_too_large_headers_are_refused(c: Resp) -> None:
    c.call("CONFIG", "SET", "max-job-headers-size", "10")
    add(c, "q", "b", "name", "value1")  # 10 bytes: at the limit
    text = assert_error_no_new_jobs(c, ("ADDJOB", "q", "body", 0, "HEADER", "name",
                                        "value12"))
    assert text == ("ERR headers too large: 11 bytes of names and values, at most 10 per "
                    "job (max-job-headers-size)")
    # Names count too, and the total over every header.
    assert_error_no_new_jobs(c, ("ADDJOB", "q", "body", 0, "HEADER", "a", "12345",
                                 "HEADER", "b", "1234"), prefix="ERR headers too large: 11")
    assert c.call("QLEN", "q") == 1


def test_the_limits_are_config_directives(c: Resp) -> None:
    assert c.call("CONFIG", "GET", "max-job-headers") == [b"max-job-headers", b"64"]
    assert c.call("CONFIG", "GET", "max-job-headers-size") == [b"max-job-headers-size",
                                                               b"64kb"]
    c.call("CONFIG", "SET", "max-job-headers-size", "1kb")
    assert c.call("CONFIG", "GET", "max-job-headers-size")[1] == b"1kb"
    assert_error(c, ("CONFIG", "SET", "max-job-headers", "-1"), prefix="ERR")


def test_an_idmp_retry_with_bad_headers_is_refused_too(c: Resp) -> None:
    first = c.call("ADDJOB", "q", "body", 0, "IDMP", "k", "HEADER", "a", "1")
    assert first.startswith(b"D-")
    assert_error(c, ("ADDJOB", "q", "body", 0, "IDMP", "k", "HEADER", "", "1"),
                 exact="ERR HEADER name can't be empty")
    assert c.call("ADDJOB", "q", "body", 0, "IDMP", "k", "HEADER", "a", "1") == first
    # Matched on the body alone: the first job keeps its headers.
    assert c.call("ADDJOB", "q", "body", 0, "IDMP", "k", "HEADER", "a", "2") == first
    assert pairs(c.call("SHOW", first))[b"headers"] == [b"a", b"1"]


# --------------------------------------------------------------------------
# ADDJOBS
# --------------------------------------------------------------------------

def test_addjobs_shared_headers_go_to_every_job(c: Resp) -> None:
    ids = c.call("ADDJOBS", "q", 0, "HEADER", "schema", "v2", "BODIES", "a", "b")
    entries = c.call("GETJOB", "COUNT", 2, "WITHHEADERS", "FROM", "q")
    assert [(e[1], e[4]) for e in entries] == [(i, [b"schema", b"v2"]) for i in ids]


def test_addjobs_jobs_gives_each_job_its_headers(c: Resp) -> None:
    ids = c.call("ADDJOBS", "q", 0, "RETRY", 30, "HEADER", "schema", "v2", "JOBS",
                 1, "traceparent", "t1", "a",
                 0, "b",
                 2, "traceparent", "t3", "x", b"\x00", "JOBS")
    assert len(ids) == 3 and all(i.startswith(b"D-") for i in ids)
    entries = c.call("GETJOB", "COUNT", 3, "WITHHEADERS", "FROM", "q")
    assert [e[2:] for e in entries] == [
        [b"a", b"headers", [b"schema", b"v2", b"traceparent", b"t1"]],
        [b"b", b"headers", [b"schema", b"v2"]],
        [b"JOBS", b"headers", [b"schema", b"v2", b"traceparent", b"t3", b"x", b"\x00"]],
    ]
    assert pairs(c.call("SHOW", ids[0]))[b"retry"] == 30


@pytest.mark.parametrize("jobs, error", [
    ((), "ERR syntax error: ADDJOBS needs BODIES followed by at least one body, or JOBS"),
    (("x", "body"), "ERR JOBS: a job's header count must be a number >= 0"),
    ((-1, "body"), "ERR JOBS: a job's header count must be a number >= 0"),
    ((1, "k", "v"), "ERR syntax error: JOBS needs, per job"),
    ((0, "a", 1, "k", "v", "b", 2, "k", "v"), "ERR syntax error: JOBS needs, per job"),
    ((0, "a", 1, "", "v", "b"), "ERR HEADER name can't be empty"),
    ((0, "a", 1, b"\xc3", "v", "b"), "ERR HEADER name must be UTF-8 text"),
    ((0, "a", 2, "k", "v", "k", "v", "b"),  # with the shared one: 3
     "ERR too many headers: 3, at most 2 per job (max-job-headers)"),
    ((0, "a", 70000, "b"), "ERR too many headers: at most 2 per job"),
    ((0, "a", 1, "k", "v" * 30, "b"), "ERR headers too large: 33 bytes"),
])
def test_addjobs_jobs_errors_refuse_the_whole_command(c: Resp, jobs: tuple[Any, ...],
                                                      error: str) -> None:
    c.call("CONFIG", "SET", "max-job-headers", "2")
    c.call("CONFIG", "SET", "max-job-headers-size", "32")
    args = ("ADDJOBS", "q", 0, "HEADER", "s", "v", "JOBS", *jobs)
    assert_error_no_new_jobs(c, args, prefix=error)
    assert c.call("QLEN", "q") == 0


def test_addjobs_shared_headers_over_the_limit_refuse_the_whole_command(c: Resp) -> None:
    c.call("CONFIG", "SET", "max-job-headers", "1")
    assert_error_no_new_jobs(c, ("ADDJOBS", "q", 0, "HEADER", "a", "1", "HEADER", "b", "2",
                                 "BODIES", "x", "y"), prefix="ERR too many headers: 2")
    assert_error_no_new_jobs(c, ("ADDJOBS", "q", 0, "HEADER", "", "1", "BODIES", "x"),
                             exact="ERR HEADER name can't be empty")


def test_addjobs_bodies_after_jobs_keyword_are_not_options(c: Resp) -> None:
    ids = c.call("ADDJOBS", "q", 0, "BODIES", "JOBS", "HEADER")
    assert [e[2] for e in c.call("GETJOB", "COUNT", 2, "FROM", "q")] == [b"JOBS", b"HEADER"]
    assert len(ids) == 2


# --------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------

def test_headers_count_in_used_memory(c: Resp) -> None:
    def used() -> int:
        return info_int(c, "memory", "used_memory")

    add(c, "warm", "0123456789")  # the queue's own share, out of the way
    before = used()
    add(c, "warm", "0123456789")
    plain = used() - before
    headers = (b"traceparent", TRACE, b"tenant", b"acme", b"blob", b"x" * 1000)
    before = used()
    add(c, "warm", "0123456789", *headers)
    assert used() - before - plain == headers_memory(headers)
    assert headers_memory(headers) > headers_size(headers) + 3 * HEADER_OVERHEAD_BYTES
    # Deleting the job gives it all back.
    job_id = c.call("QPEEK", "warm", -1)[0][1]
    before = used()
    assert c.call("DELJOB", job_id) == 1
    assert before - used() == plain + headers_memory(headers)


def test_the_headers_overhead_matches_what_python_allocates() -> None:
    """Per header and per job with headers, against tracemalloc (the
    interpreted extension object: the compiled one is smaller)."""
    def make(count: int) -> list[JobExt]:
        return [JobExt(headers=tuple(b"header-%d-%d" % (j, i) for i in range(2 * count)))
                for j in range(2000)]

    measured = {}
    tracemalloc.start()
    try:
        for count in (1, 10):
            base = tracemalloc.get_traced_memory()[0]
            exts = make(count)
            payload = headers_size(exts[0].headers)
            measured[count] = (tracemalloc.get_traced_memory()[0] - base) / len(exts) - payload
            del exts
    finally:
        tracemalloc.stop()
    per_header = (measured[10] - measured[1]) / 9
    assert abs(per_header - HEADER_OVERHEAD_BYTES) < 0.25 * HEADER_OVERHEAD_BYTES, per_header
    per_job = measured[1] - per_header
    assert abs(per_job - HEADERS_OVERHEAD_BYTES) < 0.35 * HEADERS_OVERHEAD_BYTES, per_job


# --------------------------------------------------------------------------
# The record (disque/job_options.py): version 3 appends the headers
# --------------------------------------------------------------------------

def test_the_record_carries_headers_and_stays_version_2_without() -> None:
    import struct

    from disque.job import Job
    from disque.job_options import (
        ExtError,
        apply_bus_trailer,
        bus_trailer,
        decode_record,
        decode_stored,
        encode_record,
        stored_form,
    )

    headers = (b"traceparent", TRACE, b"bin", b"\x00\xff", b"empty", b"")
    ext = JobExt(priority=4, headers=headers)
    record = encode_record(ext)
    assert record[3] == 3 and decode_record(record) == (ext, len(record))
    # Without headers: the version-2 record, byte for byte.
    plain = encode_record(JobExt(priority=4))
    assert plain[3] == 2 and record.startswith(plain[:3]) and record[8:len(plain)] == plain[8:]
    # What a version-2 reader keeps of ours: the fields up to the priority.
    v2_view = bytearray(record)
    v2_view[3] = 2
    assert decode_record(bytes(v2_view))[0].priority == 4
    # A later version appends after the group field (version 4; empty: no
    # group): skipped.
    later = bytearray(record + struct.pack("<I", 0) + b"future")
    later[3] = 5
    later[4:8] = struct.pack("<I", len(later) - 8)
    assert decode_record(bytes(later)) == (ext, len(later))
    # A damaged headers field is refused, never read past the record.
    for cut in (1, 3, 5, 9):
        bad = bytearray(record[:-cut])
        bad[4:8] = struct.pack("<I", len(bad) - 8)
        with pytest.raises(ExtError):
            decode_record(bytes(bad) + b"\x00" * 64)
    # The AOF's form and the bus trailer carry them.
    job = Job(b"D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1", b"q", b"body", ctime=1,
              etime=10_000_000, retry=30)
    job.ext = ext
    assert decode_stored(stored_form(job)).ext == ext
    copy = Job(job.id, b"q", b"body")
    apply_bus_trailer([copy], bus_trailer([job]), 0)
    assert copy.ext == ext
