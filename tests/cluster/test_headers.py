"""Job headers across real nodes (docs/EXTENSIONS.md, "Job headers"): they
travel with every copy (REPLJOB's trailer), survive a SIGKILL and an AOF
rewrite, federation (YOURJOBS), NACK, re-queues, dead-lettering and the
drain; an original node keeps a plain copy, and a job delivered from it has
lost them."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from tests.support.cluster import reference_server, show, with_original
from tests.support.process import DisqueProcess, wait_for

HEADERS = [b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
           b"tenant", b"\x00acme\xff"]
AOF = ("--appendonly", "yes", "--appendfsync", "always")


def add(node: DisqueProcess, queue: str, body: str, *opts: Any) -> bytes:
    args: list[Any] = ["ADDJOB", queue, body, 5000, *opts]
    for name, value in zip(HEADERS[::2], HEADERS[1::2], strict=True):
        args += ["HEADER", name, value]
    return node.client().execute_command(*args)


def headers_of(node: DisqueProcess, job_id: bytes) -> list[bytes] | None:
    info = show(node, job_id)
    assert info is not None, f"no copy of {job_id!r} on {node.port}"
    return info.get(b"headers")


def fetch(nodes: list[DisqueProcess], queue: str, timeout: float = 15) -> tuple[
        DisqueProcess, list[Any]]:
    """GETJOB WITHHEADERS from whichever node has a job queued: (node, entry)."""
    def got() -> tuple[DisqueProcess, list[Any]] | None:
        for node in nodes:
            if not node.alive():
                continue
            jobs = node.client().execute_command("GETJOB", "NOHANG", "WITHHEADERS", "FROM",
                                                 queue)
            if jobs:
                return node, jobs[0]
        return None
    return wait_for(got, timeout=timeout, interval=0.05, message=f"a job queued in {queue}")


def test_every_copy_has_them_and_a_delivery_from_another_copy_too(make_cluster) -> None:
    a, b, c = make_cluster(3)
    job_id = add(a, "q", "body", "REPLICATE", 3, "RETRY", 1)
    assert all(headers_of(n, job_id) == HEADERS for n in (a, b, c))
    # The creator dies: another copy queues the job after RETRY and delivers it.
    a.kill()
    node, entry = fetch([b, c], "q")
    assert entry == [b"q", job_id, b"body", b"headers", HEADERS]
    assert node.client().execute_command("ACKJOB", job_id) == 1


def test_a_sigkill_and_an_aof_rewrite_keep_them(make_cluster) -> None:
    a, b, _c = make_cluster(3, *AOF)
    job_id = add(a, "q", "body", "REPLICATE", 3, "RETRY", 300)
    plain = a.client().execute_command("ADDJOB", "q", "plain", 5000, "REPLICATE", 3)
    for node in (a, b):
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
        node.start(port=node.port)
        assert headers_of(node, job_id) == HEADERS
        assert headers_of(node, plain) is None
    # A rewrite writes them from memory; a restart reads them back.
    r = b.client()
    assert r.execute_command("BGREWRITEAOF")
    wait_for(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0, timeout=20,
             message="the rewrite to end")
    assert b.proc is not None
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(10)
    b.start(port=b.port)
    assert headers_of(b, job_id) == HEADERS
    assert headers_of(b, plain) is None


def test_federation_brings_them(make_cluster) -> None:
    a, b, _c = make_cluster(3)
    job_id = add(b, "fq", "far away", "REPLICATE", 1)
    entry = a.client().execute_command("GETJOB", "TIMEOUT", 10000, "WITHHEADERS", "FROM", "fq")
    assert entry == [[b"fq", job_id, b"far away", b"headers", HEADERS]]
    assert headers_of(a, job_id) == HEADERS  # the imported copy keeps them


def test_nack_requeue_and_dead_letters_keep_them(make_cluster) -> None:
    nodes = make_cluster(3, *AOF)
    a = nodes[0]
    job_id = add(a, "q", "body", "REPLICATE", 3, "RETRY", 1, "MAXDELIVERIES", 3)
    node, entry = fetch(nodes, "q")
    assert entry[4] == HEADERS
    assert node.client().execute_command("NACK", job_id) == 1  # delivery 2
    node, entry = fetch(nodes, "q")
    assert entry[4] == HEADERS
    # Not acked: RETRY passes, a copy re-queues it: delivery 3, the last.
    node, entry = fetch(nodes, "q")
    assert entry[4] == HEADERS
    # The next re-queue moves it to q:dead on every copy, headers and all.
    assert node.client().execute_command("NACK", job_id) == 1
    wait_for(lambda: all(show(n, job_id)[b"queue"] == b"q:dead" for n in nodes), timeout=15,
             message="every copy to learn the move")
    assert all(headers_of(n, job_id) == HEADERS for n in nodes)
    node, entry = fetch(nodes, "q:dead")
    assert entry == [b"q:dead", job_id, b"body", b"headers", HEADERS]
    # The move was logged: a restarted node has the dead letter with its headers.
    other = next(n for n in nodes if n is not node)
    assert other.proc is not None
    other.proc.send_signal(signal.SIGKILL)
    other.proc.wait(10)
    other.start(port=other.port)
    info = show(other, job_id)
    assert info is not None and (info[b"queue"], info[b"headers"]) == (b"q:dead", HEADERS)


def test_the_drain_hands_them_over(make_cluster) -> None:
    a, b, c = make_cluster(3, *AOF)
    ids = [add(a, "work", f"j{i}", "REPLICATE", 1, "RETRY", 300) for i in range(20)]
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    assert a.proc.wait(30) == 0
    assert "20 jobs handed over" in a.log_text()
    got = {}
    for node in (b, c):
        jobs = node.client().execute_command("GETJOB", "NOHANG", "COUNT", 100, "WITHHEADERS",
                                             "FROM", "work") or []
        got.update({job[1]: job[4] for job in jobs})
    assert got == {job_id: HEADERS for job_id in ids}


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_an_original_node_keeps_a_plain_copy_and_delivers_it_without_them(
        server_factory, tmp_path) -> None:
    with with_original(server_factory, tmp_path, ours=2) as (mine, original):
        creator, consumer = mine
        job_id = add(creator, "q", "body", "REPLICATE", 3, "RETRY", 1)
        # The original stored the job although its REPLJOB carried the headers.
        copy = show(original, job_id)
        assert copy is not None and (copy[b"queue"], copy[b"body"]) == (b"q", b"body")
        assert b"headers" not in copy
        assert headers_of(consumer, job_id) == HEADERS
        # Only the original's copy is left: it queues the job after RETRY and
        # hands it to our consumer (federation) without the headers.
        assert consumer.client().execute_command("DELJOB", job_id) == 1
        creator.kill()
        entry = consumer.client().execute_command("GETJOB", "TIMEOUT", 15000, "WITHHEADERS",
                                                  "FROM", "q")
        assert entry == [[b"q", job_id, b"body", b"headers", []]]


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_a_client_without_headers_sees_the_originals_replies(server_factory,
                                                             tmp_path) -> None:
    with with_original(server_factory, tmp_path, ours=1) as (mine, original):
        ours = mine[0]
        for node in (ours, original):
            r = node.client()
            job_id = r.execute_command("ADDJOB", "solo", "body", 0, "REPLICATE", 1,
                                       "RETRY", 30)
            keys = r.execute_command("SHOW", job_id)[::2]
            assert b"headers" not in keys
            assert r.execute_command("GETJOB", "WITHCOUNTERS", "FROM", "solo") == [
                [b"solo", job_id, b"body", b"nacks", 0, b"additional-deliveries", 0]]
        original_keys = original.client().execute_command(
            "SHOW", original.client().execute_command("ADDJOB", "k", "b", 0, "REPLICATE", 1))[::2]
        our_keys = ours.client().execute_command(
            "SHOW", ours.client().execute_command("ADDJOB", "k", "b", 0, "REPLICATE", 1))[::2]
        assert our_keys == original_keys
        # The original knows no headers: HEADER and WITHHEADERS are its syntax errors.
        with pytest.raises(Exception, match="syntax error"):
            original.client().execute_command("ADDJOB", "q", "x", 0, "HEADER", "a", "b")
        with pytest.raises(Exception, match="syntax error"):
            original.client().execute_command("GETJOB", "NOHANG", "WITHHEADERS", "FROM", "q")
