"""QSCAN and JSCAN: every element present during the whole iteration is returned."""

from __future__ import annotations

import redis


def scan_all(r: redis.Redis, command: str, *options: object) -> tuple[list, int]:
    cursor = b"0"
    items: list = []
    calls = 0
    while True:
        cursor, batch = r.execute_command(command, cursor, *options)
        items.extend(batch)
        calls += 1
        if cursor == b"0":
            return items, calls


def test_jscan_returns_every_job_across_calls(r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(3000):
        pipe.execute_command("ADDJOB", f"q{i % 3}", str(i), 0)
    ids = set(pipe.execute())
    found, calls = scan_all(r, "JSCAN", "COUNT", 50)
    assert set(found) == ids
    assert calls > 10  # it really iterated


def test_jscan_keeps_stable_elements_while_jobs_change(r: redis.Redis) -> None:
    stable = {r.execute_command("ADDJOB", "q", "s", 0) for _ in range(1000)}
    cursor = b"0"
    seen: set[bytes] = set()
    churn = 0
    while True:
        cursor, batch = r.execute_command("JSCAN", cursor, "COUNT", 20)
        seen.update(batch)
        # Jobs come and go during the iteration.
        new = r.execute_command("ADDJOB", "q", "c", 0)
        r.execute_command("ACKJOB", new)
        churn += 1
        if cursor == b"0":
            break
    assert stable <= seen
    assert churn > 5


def test_jscan_filters_and_reply_all(r: redis.Redis) -> None:
    queued = r.execute_command("ADDJOB", "a", "1", 0)
    active = r.execute_command("ADDJOB", "a", "2", 0)
    other = r.execute_command("ADDJOB", "b", "3", 0)
    r.execute_command("DEQUEUE", active)
    assert set(r.execute_command("JSCAN", "BUSYLOOP", "QUEUE", "a")[1]) == {queued, active}
    assert r.execute_command("JSCAN", "BUSYLOOP", "STATE", "active")[1] == [active]
    both = r.execute_command("JSCAN", "STATE", "active", "STATE", "queued", "BUSYLOOP")[1]
    assert set(both) == {queued, active, other}
    cursor, [entry] = r.execute_command("JSCAN", "BUSYLOOP", "QUEUE", "b", "REPLY", "all")
    assert cursor == b"0"
    fields = dict(zip(entry[::2], entry[1::2], strict=True))
    assert fields[b"id"] == other and fields[b"state"] == b"queued" and fields[b"body"] == b"3"
    # The cursor may come anywhere among the options.
    assert r.execute_command("JSCAN", "QUEUE", "b", "0", "BUSYLOOP")[1] == [other]


def test_qscan_options(r: redis.Redis) -> None:
    for name, count in (("empty", 0), ("one", 1), ("five", 5)):
        for _ in range(count):
            r.execute_command("ADDJOB", name, "x", 0)
    r.execute_command("PAUSE", "empty", "in")  # a queue with no jobs, kept alive
    names, _ = scan_all(r, "QSCAN", "COUNT", 1)
    assert set(names) == {b"empty", b"one", b"five"}
    assert set(r.execute_command("QSCAN", "BUSYLOOP", "MINLEN", 1)[1]) == {b"one", b"five"}
    assert r.execute_command("QSCAN", "BUSYLOOP", "MAXLEN", 0)[1] == [b"empty"]
    assert r.execute_command("QSCAN", "MINLEN", 2, "MAXLEN", 5, "BUSYLOOP")[1] == [b"five"]
    assert r.execute_command("QSCAN", "BUSYLOOP", "IMPORTRATE", 1)[1] == []
    cursor, _ = r.execute_command("QSCAN", "COUNT", 1)
    assert cursor.isdigit()


def test_small_keyspace_comes_back_whole_in_one_call(r: redis.Redis) -> None:
    # Like SCAN on a small Redis keyspace: one call, cursor 0, every name.
    ids = {r.execute_command("ADDJOB", name, "x", 0) for name in ("a", "b", "c")}
    for args in ((), ("0",)):
        cursor, names = r.execute_command("QSCAN", *args)
        assert (cursor, sorted(names)) == (b"0", [b"a", b"b", b"c"])
        cursor, found = r.execute_command("JSCAN", *args)
        assert (cursor, set(found)) == (b"0", ids)


def test_empty_keyspace_ends_in_one_call(r: redis.Redis) -> None:
    assert r.execute_command("QSCAN") == [b"0", []]
    assert r.execute_command("JSCAN") == [b"0", []]


def test_default_count_pages_a_bigger_keyspace_in_few_calls(r: redis.Redis) -> None:
    pipe = r.pipeline(transaction=False)
    for i in range(250):
        pipe.execute_command("ADDJOB", f"q{i}", "x", 0)
    pipe.execute()
    names, calls = scan_all(r, "QSCAN")
    assert len(set(names)) == 250
    assert calls <= 4  # pages of about COUNT (100) names, never empty ones
