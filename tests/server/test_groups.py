"""Ordered groups (``ADDJOB ... GROUP key``) on real nodes (docs/EXTENSIONS.md,
"Ordered groups"): add order and one consumer at a time per group, across
GETJOB COUNT, blocked consumers, NACK, re-queues, dead letters, expiry,
deletions and a crash with the AOF; priorities; QSTAT, SHOW, JSCAN and the
metrics; every bad input refused with nothing stored; and a client that does
not use groups sees the original's replies (compared with the original's
binary when DISQUE_REFERENCE_SERVER names it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.test_bad_input import assert_error, assert_error_no_new_jobs, info_int
from tests.server.test_protocol_raw import Resp, pack
from tests.support.cluster import ReferenceProcess, reference_server
from tests.support.metrics import scrape, value
from tests.support.process import DisqueProcess, free_port, wait_for


@pytest.fixture
def c(node: DisqueProcess) -> Iterator[Resp]:
    with Resp(node.port) as conn:
        conn.call("DEBUG", "FLUSHALL")
        conn.call("CONFIG", "SET", "max-group-key-len", "256")
        yield conn
    assert node.alive(), f"the node died:\n{node.log_text()[-3000:]}"


def pairs(reply: list[Any]) -> dict[bytes, Any]:
    return dict(zip(*[iter(reply)] * 2, strict=True))


def add(c: Resp, queue: str, body: str, group: str | None = None, *opts: Any) -> bytes:
    args: tuple[Any, ...] = ("ADDJOB", queue, body, 0, *opts)
    if group is not None:
        args += ("GROUP", group)
    job_id = c.call(*args)
    assert isinstance(job_id, bytes) and job_id.startswith(b"D-"), job_id
    return job_id


def get(c: Resp, *queues: str, count: int = 1, opts: tuple[Any, ...] = ()) -> list[list[Any]]:
    reply = c.call("GETJOB", "NOHANG", "COUNT", count, *opts, "FROM", *queues)
    return reply or []


def bodies(entries: list[list[Any]]) -> list[bytes]:
    return [entry[2] for entry in entries]


def ids(entries: list[list[Any]]) -> list[bytes]:
    return [entry[1] for entry in entries]


# --------------------------------------------------------------------------
# Order and exclusivity
# --------------------------------------------------------------------------

def test_getjob_count_takes_a_group_in_order_and_holds_it(c: Resp) -> None:
    a = [add(c, "q", f"a{i}", "A") for i in range(4)]
    b = [add(c, "q", f"b{i}", "B") for i in range(2)]
    add(c, "q", "plain")
    assert c.call("QLEN", "q") == 7  # every queued job, those waiting behind their group too
    # The queue's order holds each group's next job only.
    assert bodies(c.call("QPEEK", "q", 10)) == [b"a0", b"b0", b"plain"]
    # A GETJOB that takes a group's next job may take the ones after it.
    assert bodies(get(c, "q", count=3)) == [b"a0", b"a1", b"a2"]
    # Group A is held: the others go on.
    assert bodies(get(c, "q", count=10)) == [b"b0", b"b1", b"plain"]
    assert get(c, "q") == []
    assert c.call("QLEN", "q") == 1  # a3 waits behind its group
    assert c.call("ACKJOB", a[0], a[1]) == 2
    assert get(c, "q") == []  # a2 still holds it
    assert c.call("ACKJOB", a[2]) == 1
    assert ids(get(c, "q")) == [a[3]]
    c.call("ACKJOB", a[3], *b)
    assert c.call("QSTAT", "q")[c.call("QSTAT", "q").index(b"len") + 1] == 0


def test_the_extensions_doc_session(c: Resp) -> None:
    """docs/EXTENSIONS.md's session, "Ordered groups"."""
    created = add(c, "orders", "order 42: created", "order-42")
    paid = add(c, "orders", "order 42: paid", "order-42")
    other = add(c, "orders", "order 43: created", "order-43")
    assert c.call("GETJOB", "FROM", "orders") == [[b"orders", created, b"order 42: created"]]
    assert c.call("GETJOB", "NOHANG", "COUNT", 10, "FROM", "orders") == [
        [b"orders", other, b"order 43: created"]]
    assert c.call("ACKJOB", created) == 1
    assert c.call("GETJOB", "NOHANG", "COUNT", 10, "FROM", "orders") == [
        [b"orders", paid, b"order 42: paid"]]


def test_getjob_from_several_queues_continues_a_group(c: Resp) -> None:
    for i in range(3):
        add(c, "q1", f"a{i}", "A")
    add(c, "q2", "x")
    # One job per queue per pass, left to right; a pass takes a group's next one.
    assert bodies(get(c, "q1", "q2", count=4)) == [b"a0", b"x", b"a1", b"a2"]


def blocked(c: Resp, queue: str) -> int:
    """QSTAT's ``blocked`` (0 before a consumer's GETJOB made the queue)."""
    stat = c.call("QSTAT", queue)
    return pairs(stat)[b"blocked"] if stat is not None else 0


def test_a_blocked_consumer_gets_nothing_of_a_held_group(node: DisqueProcess, c: Resp) -> None:
    with Resp(node.port) as first, Resp(node.port) as second, Resp(node.port) as third:
        for waiting, consumer in enumerate((first, second), 1):  # served in this order
            consumer.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "q"))
            wait_for(lambda n=waiting: blocked(c, "q") == n, message="blocked consumers")
        a0 = add(c, "q", "a0", "A")
        a1 = add(c, "q", "a1", "A")
        assert ids(first.read()) == [a0]
        # a1 waits behind a0: the second consumer is still blocked ...
        assert blocked(c, "q") == 1
        # ... and gets another group's job.
        b0 = add(c, "q", "b0", "B")
        assert ids(second.read()) == [b0]
        third.send(pack("GETJOB", "TIMEOUT", 10_000, "FROM", "q"))
        wait_for(lambda: blocked(c, "q") == 1, message="the third consumer blocked")
        # Acknowledging a0 releases the group: the waiting consumer gets a1 at once.
        assert c.call("ACKJOB", a0) == 1
        assert ids(third.read()) == [a1]


def test_nack_makes_the_job_its_groups_next_again(c: Resp) -> None:
    a0, a1 = add(c, "q", "a0", "A"), add(c, "q", "a1", "A")
    assert ids(get(c, "q")) == [a0]
    assert c.call("NACK", a0) == 1
    entry = get(c, "q", opts=("WITHCOUNTERS",))[0]
    assert entry[1] == a0 and pairs(entry[3:])[b"nacks"] == 1
    # A batch NACKed from its middle: the NACKed job goes back ahead of the rest.
    c.call("ACKJOB", a0)
    a2 = add(c, "q", "a2", "A")
    assert ids(get(c, "q", count=2)) == [a1, a2]
    assert c.call("NACK", a2) == 1
    assert get(c, "q") == []  # a1 still holds the group
    c.call("ACKJOB", a1)
    assert ids(get(c, "q")) == [a2]


def test_nack_with_a_delay_keeps_the_group_held_until_it_is_back(c: Resp) -> None:
    a0, a1 = add(c, "q", "a0", "A"), add(c, "q", "a1", "A")
    assert ids(get(c, "q")) == [a0]
    assert c.call("NACK", a0, "DELAY", 1) == 1
    assert get(c, "q") == []  # a1 must not overtake a0
    wait_for(lambda: pairs(c.call("SHOW", a0))[b"state"] == b"queued", message="a0 back")
    assert ids(get(c, "q", count=2)) == [a0, a1]


def test_a_job_whose_retry_passes_comes_back_first(c: Resp) -> None:
    a0 = add(c, "q", "a0", "A", "RETRY", 1)
    a1 = add(c, "q", "a1", "A", "RETRY", 1)
    assert ids(get(c, "q")) == [a0]
    assert get(c, "q") == []
    wait_for(lambda: pairs(c.call("SHOW", a0))[b"state"] == b"queued",
             message="a0 queued again after its RETRY")
    entry = get(c, "q", opts=("WITHCOUNTERS",))[0]
    assert entry[1] == a0 and pairs(entry[3:])[b"additional-deliveries"] >= 1
    c.call("ACKJOB", a0)
    assert ids(get(c, "q")) == [a1]


def test_enqueue_and_dequeue(c: Resp) -> None:
    a0, a1 = add(c, "q", "a0", "A"), add(c, "q", "a1", "A")
    assert ids(get(c, "q")) == [a0]
    assert c.call("ENQUEUE", a0) == 1  # back in its queue, ahead of a1
    assert bodies(c.call("QPEEK", "q", 5)) == [b"a0"]
    # DEQUEUE takes a job out by hand: it holds its group until queued again.
    assert c.call("DEQUEUE", a0) == 1
    assert get(c, "q") == [] and c.call("QLEN", "q") == 1
    assert c.call("ENQUEUE", a0) == 1
    assert ids(get(c, "q", count=2)) == [a0, a1]


def test_dead_letters_release_the_group(c: Resp) -> None:
    a0 = add(c, "q", "a0", "A", "RETRY", 30, "MAXDELIVERIES", 1)
    a1 = add(c, "q", "a1", "A")
    assert ids(get(c, "q")) == [a0]
    assert c.call("NACK", a0) == 1  # the second delivery would pass MAXDELIVERIES
    shown = pairs(c.call("SHOW", a0))
    assert shown[b"queue"] == b"q:dead" and shown[b"group"] == b"A"
    assert ids(get(c, "q")) == [a1]
    # In the dead-letter queue it is in group A of that queue.
    assert ids(get(c, "q:dead")) == [a0]
    assert pairs(c.call("QSTAT", "q:dead"))[b"groups-held"] == 1


def test_expiry_releases_the_group(c: Resp) -> None:
    a0 = add(c, "q", "a0", "A", "TTL", 1, "RETRY", 30)
    a1 = add(c, "q", "a1", "A")
    assert ids(get(c, "q")) == [a0]
    assert get(c, "q") == []
    wait_for(lambda: c.call("SHOW", a0) is None, message="a0 to expire")
    assert ids(get(c, "q")) == [a1]
    # A job waiting behind its group expires too, and QLEN forgets it.
    a2 = add(c, "q", "a2", "A", "TTL", 1)
    assert c.call("QLEN", "q") == 1
    wait_for(lambda: c.call("SHOW", a2) is None, message="a2 to expire")
    assert c.call("QLEN", "q") == 0


def test_deljob_and_fastack_release_the_group(c: Resp) -> None:
    jobs = [add(c, "q", f"a{i}", "A") for i in range(3)]
    assert ids(get(c, "q")) == jobs[:1]
    assert c.call("DELJOB", jobs[0]) == 1
    assert ids(get(c, "q")) == jobs[1:2]
    assert c.call("FASTACK", jobs[1]) == 1
    assert ids(get(c, "q")) == jobs[2:]
    # Deleting a job that waits behind its group leaves the rest in order.
    more = [add(c, "q", f"b{i}", "B") for i in range(3)]
    assert ids(get(c, "q")) == more[:1]
    assert c.call("DELJOB", more[1]) == 1
    assert c.call("QLEN", "q") == 1
    c.call("ACKJOB", more[0])
    assert ids(get(c, "q")) == more[2:]


# --------------------------------------------------------------------------
# Priorities
# --------------------------------------------------------------------------

def test_a_groups_order_is_add_order_and_its_next_job_competes_at_its_priority(
        c: Resp) -> None:
    low = add(c, "q", "a-low", "A")
    high = add(c, "q", "a-high", "A", "PRIORITY", 10)
    add(c, "q", "mid", None, "PRIORITY", 5)
    add(c, "q", "plain")
    # a-high waits behind a-low, whose priority is 0: mid goes first.
    assert bodies(c.call("QPEEK", "q", 10)) == [b"mid", b"a-low", b"plain"]
    assert bodies(get(c, "q")) == [b"mid"]
    assert ids(get(c, "q")) == [low]
    c.call("ACKJOB", low)
    # Now the group's next job competes at its own priority, 10.
    add(c, "q", "mid2", None, "PRIORITY", 5)
    assert ids(get(c, "q")) == [high]
    assert pairs(c.call("QSTAT", "q"))[b"priorities"] == [5, 1]


# --------------------------------------------------------------------------
# What shows it: GETJOB WITHGROUP, SHOW, JSCAN, QSTAT, the metrics
# --------------------------------------------------------------------------

def test_withgroup_show_and_jscan(c: Resp) -> None:
    a0 = add(c, "q", "a0", "order-42", "HEADER", "tenant", "acme")
    plain = add(c, "q", "plain")
    entries = get(c, "q", count=2, opts=("WITHCOUNTERS", "WITHHEADERS", "WITHGROUP"))
    a0_ctime = pairs(c.call("SHOW", a0))[b"ctime"]
    assert entries[0] == [b"q", a0, b"a0", b"nacks", 0, b"additional-deliveries", 0,
                          b"headers", [b"tenant", b"acme"], b"group-position", a0_ctime,
                          b"group", b"order-42"]
    assert entries[1] == [b"q", plain, b"plain", b"nacks", 0, b"additional-deliveries", 0,
                          b"headers", [], b"group-position", None, b"group", None]
    shown = c.call("SHOW", a0)
    assert shown[-4:] == [b"headers", [b"tenant", b"acme"], b"group", b"order-42"]
    assert b"group" not in pairs(c.call("SHOW", plain))
    assert pairs(c.call("SHOW", a0, "NOBODY"))[b"group"] == b"order-42"
    a1 = add(c, "q", "a1", "order-42")
    add(c, "q", "b0", "order-43")
    cursor, found = c.call("JSCAN", "GROUP", "order-42", "REPLY", "id")
    assert cursor == b"0" and sorted(found) == sorted([a0, a1])
    _, [entry] = c.call("JSCAN", "GROUP", "order-42", "STATE", "queued", "REPLY", "all")
    assert pairs(entry)[b"id"] == a1 and pairs(entry)[b"group"] == b"order-42"
    assert c.call("JSCAN", "GROUP", "nobody") == [b"0", []]


@pytest.mark.parametrize("protocol", [2, 3])
def test_withgroup_position_in_resp2_and_resp3(c: Resp, protocol: int) -> None:
    """``group-position`` is the job's ctime (an integer, the same in both
    protocols), increasing in add order within a group, and the same again
    after a NACK; a job without a group has nil for both fields (RESP2
    ``$-1``, RESP3 ``_``); without WITHGROUP neither is sent."""
    c.call("HELLO", protocol)
    try:
        first = add(c, "q", "a0", "order-42")
        plain = add(c, "q", "plain")
        second = add(c, "q", "a1", "order-42")
        shown = [c.call("SHOW", job_id) for job_id in (first, second)]
        ctimes = [(info if isinstance(info, dict) else pairs(info))[b"ctime"] for info in shown]
        assert ctimes[0] < ctimes[1]
        nil = b"$-1\r\n" if protocol == 2 else b"_\r\n"
        raw = c.call_raw("GETJOB", "NOHANG", "COUNT", 3, "WITHGROUP", "FROM", "q")
        for ctime in ctimes:
            assert raw.count(b"$14\r\ngroup-position\r\n:%d\r\n$5\r\ngroup\r\n"
                             b"$8\r\norder-42\r\n" % ctime) == 1, raw
        assert raw.count(b"$14\r\ngroup-position\r\n" + nil + b"$5\r\ngroup\r\n" + nil) == 1
        assert raw.count(b"*7\r\n") == 3  # queue, id, body and the two pairs
        c.call("NACK", first, second)
        c.call("ACKJOB", plain)
        again = get(c, "q", count=3, opts=("WITHGROUP",))
        assert [(e[1], e[3:]) for e in again] == [
            (first, [b"group-position", ctimes[0], b"group", b"order-42"]),
            (second, [b"group-position", ctimes[1], b"group", b"order-42"])]
        c.call("NACK", first, second)
        assert b"group" not in c.call_raw("GETJOB", "NOHANG", "COUNT", 3, "FROM", "q")
    finally:
        c.call("HELLO", 2)


def test_qstat_fields(c: Resp) -> None:
    add(c, "plain", "x")
    assert len(c.call("QSTAT", "plain")) == 20  # the original's ten fields, nothing more
    for i in range(3):
        add(c, "q", f"a{i}", "A")
    add(c, "q", "b0", "B")
    add(c, "q", "c0", "C")
    stat = pairs(c.call("QSTAT", "q"))
    assert (stat[b"len"], stat[b"groups-held"], stat[b"groups-waiting"],
            stat[b"oldest-waiting-group-age"]) == (5, 0, 0, 0)
    assert list(stat)[:10] == [b"name", b"len", b"age", b"idle", b"blocked", b"import-from",
                               b"import-rate", b"jobs-in", b"jobs-out", b"pause"]
    taken = get(c, "q", count=10)
    assert bodies(taken) == [b"a0", b"a1", b"a2", b"b0", b"c0"]
    c.call("NACK", taken[2][1])  # a2 waits behind a0 and a1
    stat = pairs(c.call("QSTAT", "q"))
    assert (stat[b"len"], stat[b"groups-held"], stat[b"groups-waiting"]) == (1, 3, 1)
    wait_for(lambda: pairs(c.call("QSTAT", "q"))[b"oldest-waiting-group-age"] >= 1,
             timeout=5, message="the waiting group to age")
    c.call("ACKJOB", *ids(taken))
    # Nothing queued nor out: the queue shows the original's fields again.
    assert len(c.call("QSTAT", "q")) == 20


def test_metrics_per_queue(server_factory) -> None:
    port = free_port()
    node = server_factory("--metrics-port", str(port))
    with Resp(node.port) as c:
        add(c, "q", "a0", "A")
        add(c, "q", "a1", "A")
        add(c, "plain", "x")
        get(c, "q")
    samples = scrape(port)
    assert value(samples, "disque_queue_groups_held", queue="q") == 1
    assert value(samples, "disque_queue_groups_waiting", queue="q") == 1
    assert value(samples, "disque_queue_oldest_waiting_group_age_seconds", queue="q") is not None
    assert value(samples, "disque_queue_groups_held", queue="plain") is None
    assert value(samples, "disque_queue_length", queue="q") == 1


# --------------------------------------------------------------------------
# ADDJOBS
# --------------------------------------------------------------------------

def test_addjobs_option_values_may_read_like_its_keywords(c: Resp) -> None:
    """A DEADLETTER queue or a GROUP key named groups, bodies or jobs is an
    option's value, not the start of the jobs."""
    ids = c.call("ADDJOBS", "q", 0, "RETRY", 30, "MAXDELIVERIES", 2, "DEADLETTER", "groups",
                 "GROUP", "bodies", "BODIES", "x")
    shown = pairs(c.call("SHOW", ids[0]))
    assert (shown[b"dead-letter-queue"], shown[b"group"]) == (b"groups", b"bodies")
    ids = c.call("ADDJOBS", "q", 0, "HEADER", "jobs", "groups", "GROUPS", "jobs", "y")
    assert pairs(c.call("SHOW", ids[0]))[b"group"] == b"jobs"


def test_addjobs_shared_group_and_a_group_per_job(c: Resp) -> None:
    shared = c.call("ADDJOBS", "q", 0, "GROUP", "A", "BODIES", "a0", "a1")
    per_job = c.call("ADDJOBS", "q", 0, "RETRY", 30, "GROUPS", "B", "b0", "A", "a2", "B", "b1")
    with_headers = c.call("ADDJOBS", "q", 0, "GROUP", "C", "JOBS", 1, "k", "v", "c0", 0, "c1")
    assert all(job_id.startswith(b"D-") for job_id in [*shared, *per_job, *with_headers])
    assert pairs(c.call("SHOW", per_job[1]))[b"group"] == b"A"
    assert pairs(c.call("SHOW", per_job[1]))[b"retry"] == 30
    assert bodies(get(c, "q", count=3)) == [b"a0", b"a1", b"a2"]
    assert bodies(get(c, "q", count=2)) == [b"b0", b"b1"]
    assert bodies(get(c, "q", count=2)) == [b"c0", b"c1"]


# --------------------------------------------------------------------------
# Bad input: a clear error, nothing stored
# --------------------------------------------------------------------------

def test_bad_group_options_store_nothing(c: Resp) -> None:
    for args, error in [
        (("ADDJOB", "q", "x", 0, "GROUP", ""), "ERR GROUP key can't be empty"),
        (("ADDJOB", "q", "x", 0, "GROUP", "a" * 257),
         "ERR GROUP key too long: 257 bytes, at most 256 (max-group-key-len)"),
        (("ADDJOB", "q", "x", 0, "GROUP", "a", "GROUP", "b"),
         "ERR GROUP may be given only once"),
        (("ADDJOB", "q", "x", 0, "GROUP", "a", "DELAY", 5),
         "ERR DELAY can't be used with GROUP: a group's jobs go out in the order they were "
         "added"),
        (("ADDJOB", "q", "x", 0, "DELAY", 1, "GROUP", "a"),
         "ERR DELAY can't be used with GROUP: a group's jobs go out in the order they were "
         "added"),
        (("ADDJOB", "q", "x", 0, "GROUP"), "ERR syntax error"),
        (("ADDJOBS", "q", 0, "GROUP", "", "BODIES", "x"), "ERR GROUP key can't be empty"),
        (("ADDJOBS", "q", 0, "GROUP", "a" * 300, "BODIES", "x"),
         "ERR GROUP key too long: 300 bytes, at most 256 (max-group-key-len)"),
        (("ADDJOBS", "q", 0, "GROUPS", "a", "x", "", "y"), "ERR GROUP key can't be empty"),
        (("ADDJOBS", "q", 0, "GROUPS", "a", "x", "b"),
         "ERR syntax error: GROUPS needs, per job, its group and its body"),
        (("ADDJOBS", "q", 0, "GROUP", "a", "GROUPS", "a", "x"),
         "ERR GROUPS gives each job its group: no GROUP option with it"),
        (("ADDJOBS", "q", 0, "DELAY", 3, "GROUPS", "a", "x"),
         "ERR DELAY can't be used with GROUP: a group's jobs go out in the order they were "
         "added"),
        (("ADDJOBS", "q", 0, "GROUPS"), None),
    ]:
        text = assert_error_no_new_jobs(c, args, exact=error)
        assert text.startswith("ERR")
    assert c.call("QLEN", "q") == 0
    # The limit follows the directive.
    c.call("CONFIG", "SET", "max-group-key-len", "4")
    assert_error(c, ("ADDJOB", "q", "x", 0, "GROUP", "abcde"),
                 exact="ERR GROUP key too long: 5 bytes, at most 4 (max-group-key-len)")
    add(c, "q", "x", "abcd")
    assert c.call("CONFIG", "GET", "max-group-key-len") == [b"max-group-key-len", b"4"]
    assert_error(c, ("CONFIG", "SET", "max-group-key-len", "0"), prefix="ERR")
    # ASYNC and binary keys are fine.
    c.call("CONFIG", "SET", "max-group-key-len", "256")
    job_id = c.call("ADDJOB", "q", "y", 0, "ASYNC", "GROUP", b"\x00\xff key")
    assert pairs(c.call("SHOW", job_id))[b"group"] == b"\x00\xff key"


# --------------------------------------------------------------------------
# A crash: the AOF brings the order and the held groups back
# --------------------------------------------------------------------------

def test_aof_reload_keeps_the_order_and_the_held_groups(tmp_path: Path) -> None:
    node = DisqueProcess(tmp_path / "n", "--appendonly", "yes", "--appendfsync", "always")
    node.start()
    try:
        with Resp(node.port) as c:
            a = [add(c, "q", f"a{i}", "A", "RETRY", 1) for i in range(3)]
            b = add(c, "q", "b0", "B", "RETRY", 1)
            assert ids(get(c, "q")) == [a[0]]  # a0 out, holding A
            c.call("BGREWRITEAOF")
            wait_for(lambda: info_int(c, "persistence", "aof_rewrite_in_progress") == 0,
                     message="the rewrite to end")
            a3 = add(c, "q", "a3", "A", "RETRY", 1)  # after the rewrite: a LOADJOB record
        node.kill()
        node.start(port=node.port)
        with Resp(node.port) as c:
            # Every job came back active (the original's rule): every group is
            # held until its jobs are queued again by their RETRY.
            assert get(c, "q") == []
            assert pairs(c.call("SHOW", a3))[b"group"] == b"A"

            def all_queued() -> bool:
                return c.call("QLEN", "q") == 5
            wait_for(all_queued, message="every job queued again after its RETRY")
            got = get(c, "q", count=10)
            assert ids(got) == [*a, a3, b]
    finally:
        node.kill()


def test_a_controlled_restart_keeps_queued_jobs_queued_and_delivered_ones_out(
        tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("appendonly yes\n")
    node = DisqueProcess(tmp_path / "n", config_file=conf)
    node.start()
    try:
        with Resp(node.port) as c:
            a = [add(c, "q", f"a{i}", "A", "RETRY", 2) for i in range(2)]
            b = [add(c, "q", f"b{i}", "B", "RETRY", 2) for i in range(2)]
            assert ids(get(c, "q")) == [a[0]]
            assert c.call("CONFIG", "SET", "aof-enqueue-jobs-once", "yes") == b"OK"
            assert c.call("CONFIG", "REWRITE") == b"OK"
            c.send(pack("SHUTDOWN", "REWRITE-AOF"))
            wait_for(lambda: not node.alive(), message="the node to exit")
        node.start(port=node.port)
        assert "aof-enqueue-jobs-once switched off" in node.log_text()
        with Resp(node.port) as c:
            # B's jobs were queued: they are at once; A is held by a0 until its RETRY.
            assert ids(get(c, "q", count=10)) == b
            assert c.call("ACKJOB", *b) == 2
            wait_for(lambda: c.call("QLEN", "q") == 2, message="a0 queued again")
            assert ids(get(c, "q", count=10)) == a
    finally:
        node.kill()


# --------------------------------------------------------------------------
# A client that does not use groups sees the original's replies
# --------------------------------------------------------------------------

_ID = re.compile(rb"D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")


def _plain_session(port: int) -> list[bytes]:
    """Group-free commands; their raw replies with job IDs made neutral."""
    out: list[bytes] = []
    with Resp(port) as c:
        job_ids: list[bytes] = []
        for i in range(3):
            job_ids.append(c.call("ADDJOB", "plainq", f"job-{i}", 0, "RETRY", 30))
        out.append(c.call_raw("QLEN", "plainq"))
        out.append(c.call_raw("GETJOB", "NOHANG", "COUNT", 2, "FROM", "plainq"))
        out.append(c.call_raw("GETJOB", "WITHCOUNTERS", "FROM", "plainq"))
        out.append(c.call_raw("NACK", job_ids[0]))
        out.append(c.call_raw("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "plainq"))
        out.append(c.call_raw("ACKJOB", *job_ids))
        out.append(c.call_raw("GETJOB", "NOHANG", "FROM", "plainq"))
        stat = c.call("QSTAT", "plainq")
        out.append(repr([stat[i] for i in range(0, len(stat), 2)]).encode())
        job = c.call("ADDJOB", "plainq", "shown", 0)
        shown = c.call("SHOW", job)
        out.append(repr([(shown[i], type(shown[i + 1]).__name__)
                         for i in range(0, len(shown), 2)]).encode())
        c.call("ACKJOB", job)
    return [_ID.sub(b"<id>", reply) for reply in out]


def test_a_client_without_groups_gets_the_original_replies(node: DisqueProcess) -> None:
    ours = _plain_session(node.port)
    assert ours[0] == b":3\r\n"
    assert ours[1] == (b"*2\r\n*3\r\n$6\r\nplainq\r\n$40\r\n<id>\r\n$5\r\njob-0\r\n"
                       b"*3\r\n$6\r\nplainq\r\n$40\r\n<id>\r\n$5\r\njob-1\r\n")


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original's binary: set DISQUE_REFERENCE_SERVER to "
                           "compare replies with it")
def test_replies_without_groups_match_the_original_byte_for_byte(node: DisqueProcess,
                                                                 tmp_path: Path) -> None:
    original = ReferenceProcess(tmp_path / "ref").start()
    try:
        assert _plain_session(node.port) == _plain_session(original.port)
        with Resp(original.port) as c:  # and the original refuses the extension
            assert_error(c, ("ADDJOB", "q", "x", 0, "GROUP", "g"), exact="ERR syntax error")
            assert_error(c, ("GETJOB", "NOHANG", "WITHGROUP", "FROM", "q"),
                         exact="ERR syntax error")
    finally:
        original.kill()
