"""GETJOB ... WITHLEASE (an extension): how long a delivered job stays leased.

Each entry ends with ``next-requeue-within``: the milliseconds before this
node queues the job again unless it is acknowledged or postponed, as SHOW
reports it; nil for RETRY 0 jobs, which are never queued again.
"""

from __future__ import annotations

import threading

import redis

from disque.client import Client
from tests.support.process import DisqueProcess, wait_for

FIELD = b"next-requeue-within"


def _lease(entry: list) -> int | None:
    assert entry[-2] == FIELD
    return entry[-1]


def test_a_fresh_job_is_leased_for_its_retry(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "x", 0, "RETRY", 60)
    [entry] = r.execute_command("GETJOB", "WITHLEASE", "FROM", "q")
    assert entry[:3] == [b"q", job_id, b"x"] and len(entry) == 5
    # RETRY plus up to 500 ms of jitter, less the time since ADDJOB.
    assert 50_000 < _lease(entry) <= 60_500


def test_counters_come_first_in_either_option_order(r: redis.Redis) -> None:
    ids = [r.execute_command("ADDJOB", "q", f"x{i}", 0, "RETRY", 30) for i in range(2)]
    for options in (("WITHCOUNTERS", "WITHLEASE"), ("withlease", "withcounters")):
        [entry] = r.execute_command("GETJOB", *options, "FROM", "q")
        assert entry[:7] == [b"q", ids.pop(0), entry[2], b"nacks", 0,
                             b"additional-deliveries", 0]
        assert 20_000 < _lease(entry) <= 30_500


def test_retry_zero_jobs_have_no_lease(r: redis.Redis) -> None:
    r.execute_command("ADDJOB", "q", "once", 0, "RETRY", 0, "REPLICATE", 1)
    [entry] = r.execute_command("GETJOB", "WITHLEASE", "FROM", "q")
    assert _lease(entry) is None


def test_delivery_does_not_restart_the_count(r: redis.Redis) -> None:
    # The requeue time is set when the job is queued: a job that waited in
    # its queue is leased for what is left of its RETRY, not for a new one.
    job_id = r.execute_command("ADDJOB", "q", "waited", 0, "RETRY", 3)

    def left() -> int:
        shown = r.execute_command("SHOW", job_id)
        return dict(zip(shown[::2], shown[1::2], strict=True))[b"next-requeue-within"]

    wait_for(lambda: left() < 2_400, 5, message="600 ms spent in the queue")
    [entry] = r.execute_command("GETJOB", "WITHLEASE", "FROM", "q")
    assert 0 <= _lease(entry) < 2_400


def test_count_and_several_queues_give_every_entry_its_lease(r: redis.Redis) -> None:
    for queue, retry in (("a", 10), ("b", 100), ("a", 20)):
        r.execute_command("ADDJOB", queue, queue, 0, "RETRY", retry)
    entries = r.execute_command("GETJOB", "NOHANG", "COUNT", 5, "WITHLEASE", "FROM", "a", "b")
    assert [e[0] for e in entries] == [b"a", b"b", b"a"]
    for entry, retry in zip(entries, (10, 100, 20), strict=True):
        assert retry * 1000 - 5_000 < _lease(entry) <= retry * 1000 + 500


def test_a_blocked_getjob_gets_the_lease_too(server: DisqueProcess) -> None:
    r = server.client()
    out: list[object] = []
    consumer = server.client()
    thread = threading.Thread(target=lambda: out.append(consumer.execute_command(
        "GETJOB", "TIMEOUT", 10_000, "WITHLEASE", "FROM", "late")))
    thread.start()
    wait_for(lambda: r.info("clients")["blocked_clients"] == 1, 5, message="blocked")
    job_id = r.execute_command("ADDJOB", "late", "x", 0, "RETRY", 40)
    thread.join(5)
    [[entry]] = out
    assert entry[:4] == [b"late", job_id, b"x", FIELD] and 30_000 < entry[4] <= 40_500


def test_qpeek_and_plain_getjob_are_unchanged(r: redis.Redis) -> None:
    job_id = r.execute_command("ADDJOB", "q", "x", 0)
    assert r.execute_command("QPEEK", "q", 1) == [[b"q", job_id, b"x"]]
    assert r.execute_command("GETJOB", "FROM", "q") == [[b"q", job_id, b"x"]]


def test_the_client_library_reads_the_lease(server: DisqueProcess) -> None:
    client = Client(f"127.0.0.1:{server.port}")
    try:
        client.add_job("q", "x", retry=90)
        client.add_job("q", "y", retry=0, replicate=1)
        first, second = client.get_jobs("q", count=2, with_lease=True, with_counters=True)
        assert first.nacks == 0 and 80_000 < first.requeue_within_ms <= 90_500
        assert second.body == b"y" and second.requeue_within_ms is None
        plain = client.get_jobs("q", nohang=True)
        assert plain == []
        client.add_job("q", "z")
        [job] = client.get_jobs("q")
        assert job.requeue_within_ms is None  # not asked
    finally:
        client.close()
