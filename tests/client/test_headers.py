"""Job headers through the client (sync and async) and the CLI: ``add_job(...,
headers=)``, ``add_jobs(..., job_headers=)``, ``get_jobs(..., with_headers=True)``,
``Job.headers``, ``show``; the fallback of ``add_jobs`` to ADDJOBs keeps them."""

from __future__ import annotations

import asyncio

import pytest

from disque import AsyncClient, Client, ResponseError
from disque.client import _wire as w
from tests.client.conftest import address, last_command_of_others
from tests.client.test_cli import disque
from tests.support.process import DisqueProcess

TRACE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_add_job_with_headers_and_get_them_back(client: Client) -> None:
    job_id = client.add_job("q", b"body", headers={"traceparent": TRACE, "bin": b"\x00\xff"})
    job = client.get_job("q", with_headers=True, with_counters=True)
    assert job is not None and job.id == job_id
    assert job.headers == {"traceparent": TRACE.encode(), "bin": b"\x00\xff"}
    assert job.nacks == 0  # the counters still parsed beside them
    shown = client.show(job_id)
    assert shown is not None and shown["headers"] == job.headers
    assert shown["body"] == b"body"


def test_headers_are_none_unless_asked_and_empty_for_a_plain_job(client: Client) -> None:
    client.add_job("q", b"rich", headers=[("k", "1"), ("k", "2")])  # pairs: a name repeats
    client.add_job("q", b"plain")
    rich, plain = client.get_jobs("q", count=2, with_headers=True)
    assert rich.headers == {"k": b"2"} and plain.headers == {}
    client.nack(rich.id, plain.id)
    again = client.get_jobs("q", count=2)
    assert [j.headers for j in again] == [None, None]
    assert client.show(plain.id) is not None and "headers" not in client.show(plain.id)


def test_add_jobs_per_job_and_shared_headers(client: Client, server: DisqueProcess) -> None:
    ids = client.add_jobs("q", [b"a", b"b", b"c"], headers={"schema": "v2"},
                          job_headers=[{"traceparent": "t1"}, None, [("x", b"\x00")]])
    assert "addjobs" in last_command_of_others(server)
    jobs = client.get_jobs("q", count=3, with_headers=True)
    assert [j.id for j in jobs] == ids
    assert [j.headers for j in jobs] == [
        {"schema": b"v2", "traceparent": b"t1"}, {"schema": b"v2"},
        {"schema": b"v2", "x": b"\x00"}]
    with pytest.raises(ValueError):  # one entry per body
        client.add_jobs("q", [b"a", b"b"], job_headers=[None])


def test_add_jobs_with_headers_falls_back_to_addjobs(client: Client) -> None:
    client._no_bulk_add.add(client.node_id)  # as on a node that lacks ADDJOBS
    ids = client.add_jobs("q", [b"a", b"b"], job_headers=[{"k": "1"}, {}], batch_size=1)
    jobs = client.get_jobs("q", count=2, with_headers=True)
    assert [(j.id, j.headers) for j in jobs] == [(ids[0], {"k": b"1"}), (ids[1], {})]


def test_errors_of_the_node_reach_the_caller(client: Client) -> None:
    with pytest.raises(ResponseError, match="HEADER name can't be empty"):
        client.add_job("q", b"x", headers={"": "v"})
    client.execute_command("CONFIG", "SET", "max-job-headers", "1")
    try:
        with pytest.raises(ResponseError, match="too many headers"):
            client.add_job("q", b"x", headers={"a": "1", "b": "2"})
        with pytest.raises(ResponseError, match="too many headers"):
            client.add_jobs("q", [b"x", b"y"], job_headers=[{}, {"a": "1", "b": "2"}])
    finally:
        client.execute_command("CONFIG", "SET", "max-job-headers", "64")
    assert client.qlen("q") == 0


def test_the_wire_form() -> None:
    request = w.add_job("q", b"b", headers={"n": "v"}, retry=5)
    assert request.args[-3:] == (b"HEADER", b"n", b"v")
    build = w.add_jobs_with_headers_builder("q", retry=5)
    assert build is not None
    assert build([(b"a", {"n": "v"}), (b"b", None)]).args == (
        b"ADDJOBS", b"q", b"0", b"RETRY", b"5", b"JOBS", b"1", b"n", b"v", b"a", b"0", b"b")
    assert w.get_jobs(["q"], with_headers=True).args == (b"GETJOB", b"WITHHEADERS", b"FROM",
                                                         b"q")
    job = w.parse_job([b"q", b"D-x", b"b", b"nacks", 1, b"additional-deliveries", 0,
                       b"headers", [b"k", b"v"]])
    assert (job.nacks, job.headers) == (1, {"k": b"v"})


def test_async_client(server: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncClient(address(server)) as c:
            job_id = await c.add_job("aq", b"body", headers={"traceparent": TRACE})
            ids = await c.add_jobs("aq", [b"x"], job_headers=[{"k": "v"}])
            jobs = await c.get_jobs("aq", count=2, with_headers=True)
            assert [(j.id, j.headers) for j in jobs] == [
                (job_id, {"traceparent": TRACE.encode()}), (ids[0], {"k": b"v"})]
            one = await c.get_job("aq", nohang=True, with_headers=True)
            assert one is None
            shown = await c.show(job_id)
            assert shown is not None and shown["headers"] == {"traceparent": TRACE.encode()}

    asyncio.run(main())


def test_the_cli_shows_them(server: DisqueProcess) -> None:
    p = server.port
    job_id = disque(p, "--raw", "addjob", "q", "body", "0", "header", "k", "v").stdout.strip()
    got = disque(p, "--no-raw", "getjob", "withheaders", "from", "q").stdout
    assert got == (f'1) 1) "q"\n   2) "{job_id}"\n   3) "body"\n   4) "headers"\n'
                   '   5) 1) "k"\n      2) "v"\n')
    shown = disque(p, "--no-raw", "show", job_id).stdout
    assert '"headers"' in shown and '1) "k"' in shown
