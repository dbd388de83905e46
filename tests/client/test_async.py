"""AsyncClient against real servers (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from disque import (
    AsyncClient,
    BadId,
    Client,
    ConnectionFailed,
    Hello,
    Job,
    Leaving,
    MaxLen,
    NoAuth,
    NoJob,
    Paused,
    ResponseError,
)
from tests.client.conftest import address, fake_job_id
from tests.support.process import DisqueProcess


def run(coro_fn: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(coro_fn())  # type: ignore[arg-type]


async def blocked_clients(c: AsyncClient) -> int:
    return (await c.info("clients"))["clients"]["blocked_clients"]


async def poll(value: Callable[[], Awaitable[int]], wanted: int, timeout: float = 10) -> None:
    """The async form of wait_for: poll until ``value()`` reaches ``wanted``."""
    deadline = time.monotonic() + timeout
    while await value() < wanted:
        assert time.monotonic() < deadline, f"timed out waiting for {wanted}"
        await asyncio.sleep(0.01)


def test_every_method(server: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncClient(address(server)) as c:
            hello = await c.connect()
            assert isinstance(hello, Hello) and c.node_id == hello.node_id
            job_id = await c.add_job("q", b"\x00body", retry=30, ttl=600)
            assert (await c.show(job_id))["retry"] == 30
            assert await c.qlen("q") == 1
            assert [j.id for j in await c.qpeek("q", 1)] == [job_id]
            assert (await c.qstat("q"))["len"] == 1
            (job,) = await c.get_jobs("q", with_counters=True)
            assert job == Job("q", job_id, b"\x00body", 0, 0)
            assert await c.working(job_id) == 30
            assert await c.working_many([job_id, job_id]) == [30, 30]
            assert await c.nack(job_id) == 1
            assert (await c.get_job("q", with_counters=True)).nacks == 1
            assert await c.enqueue(job_id) == 1
            assert await c.dequeue(job_id) == 1
            assert await c.ack(job_id) == 1
            assert await c.get_job("q", nohang=True) is None
            assert await c.get_jobs("q", timeout_ms=50) == []
            other = await c.add_job("q2", b"x")
            assert await c.del_job(other) == 1
            assert await c.fastack(await c.add_job("q2", b"y")) == 1
            for method in (c.ack, c.fastack, c.nack, c.enqueue, c.dequeue, c.del_job):
                assert await method() == 0

            ids = await c.add_jobs("b", [f"{i}" for i in range(1200)], batch_size=500)
            assert len(set(ids)) == 1200
            assert {q async for q in c.qscan(count=1)} >= {"b"}
            assert {q async for q in c.qscan(minlen=1000, busyloop=True)} == {"b"}
            assert {j async for j in c.jscan(queue="b", count=5)} == set(ids)
            full = [d async for d in c.jscan(queue="b", states=["queued"], reply="all")]
            assert len(full) == 1200 and isinstance(full[0]["body"], bytes)
            assert await c.ack_many(ids[:700], batch_size=64) == 700
            assert await c.fastack_many(ids[700:]) == 500

            assert await c.pause("p", "in") == "in"
            with pytest.raises(Paused):
                await c.add_job("p", b"x")
            assert await c.pause("p", "none", bcast=True) == "none"
            assert await c.ping() == b"PONG" and await c.ping(b"x") == b"x"
            assert (await c.info("server"))["server"]["tcp_port"] == server.port
            assert (await c.hello()).node_id == await c.cluster_myid()
            assert (await c.cluster_nodes())[0]["id"] == c.node_id
            assert (await c.cluster_info())["cluster_known_nodes"] == 1
            assert await c.cluster_leaving() is False
            with pytest.raises(ResponseError):
                await c.cluster_meet("not-an-ip", 7711)
            with pytest.raises(ResponseError):
                await c.cluster_forget("f" * 40)
            await c.config_set("loglevel", "notice")
            assert await c.config_get("loglevel") == {"loglevel": "notice"}
            assert await c.execute_command("QLEN", "b") == 0
            await c.cluster_reset()
            assert "AsyncClient" in repr(c)
    run(main)


def test_errors(server: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncClient(address(server)) as c:
            with pytest.raises(BadId):
                await c.ack("nope")
            with pytest.raises(NoJob):
                await c.working(fake_job_id())
            await c.add_job("m", b"1")
            with pytest.raises(MaxLen):
                await c.add_job("m", b"2", maxlen=1)
            results = await c.add_jobs("m", [b"3", b"4"], maxlen=1, return_exceptions=True)
            assert [type(r) for r in results] == [MaxLen, MaxLen]
            with pytest.raises(MaxLen):
                await c.add_jobs("m", [b"5"], maxlen=1)
            with pytest.raises(ValueError):
                await c.execute_command()
    run(main)


def test_blocking_beyond_socket_timeout_and_cancellation(server: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncClient(address(server), socket_timeout=0.2) as c:
            started = time.monotonic()
            assert await c.get_jobs("e", timeout_ms=600) == []
            assert time.monotonic() - started >= 0.5
            # Cancelling a blocked GETJOB drops the connection (a reply is
            # pending); the client reconnects for the next command.
            task = asyncio.create_task(c.get_jobs("e"))
            async with AsyncClient(address(server)) as watcher:
                await poll(lambda: blocked_clients(watcher), 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await c.ping() == b"PONG"
    run(main)


def test_concurrent_consumers_and_producer(server: DisqueProcess) -> None:
    async def main() -> None:
        consumers = [AsyncClient(address(server)) for _ in range(3)]
        async with AsyncClient(address(server)) as producer:
            tasks = [asyncio.create_task(c.get_jobs("cq")) for c in consumers]
            await poll(lambda: blocked_clients(producer), 3)
            ids = await producer.add_jobs("cq", [b"a", b"b", b"c"])
            got = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert sorted(j[0].id for j in got) == sorted(ids)
        for c in consumers:
            await c.close()
    run(main)


def test_failover_restart_and_leaving(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client(address(b)) as cb:
        b_job = cb.add_job("q", b"on-b")

    async def main() -> None:
        async with AsyncClient([address(a), address(b)], randomize=False) as c:
            await c.connect()
            assert c.address == address(a)
            await c.cluster_leaving(True)
            (job,) = await c.get_jobs("q")  # -LEAVING from A: moves to B
            assert job.id == b_job and c.address == address(b)
            b.restart()  # B restarts; A is leaving but still answers
            assert await c.ping() == b"PONG"
            # Dropped link: A is tried after B; B answers again after restart.
            b.kill()
            assert await c.ping() == b"PONG"
            assert c.address == address(a)
            a.kill()
            c.reconnect_timeout = 0.2  # the limit is a plain attribute: fail fast now
            with pytest.raises(ConnectionFailed):
                await c.ping()
    run(main)


def test_leaving_with_nowhere_to_go_and_auth(server_factory) -> None:
    lone = server_factory()
    secured = server_factory("--requirepass", "pw")

    async def main() -> None:
        async with AsyncClient(address(lone), max_retries=1, reconnect_timeout=0) as c:
            await c.cluster_leaving(True)
            with pytest.raises(Leaving):
                await c.get_jobs("q")
        async with AsyncClient(address(secured)) as c:
            with pytest.raises(NoAuth):
                await c.ping()
        async with AsyncClient(address(secured), password="pw", client_name="ac") as c:
            assert b"name=ac" in await c.execute_command("CLIENT", "LIST")
    run(main)


def test_affinity_switch(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client(address(b)) as cb:
        raw_hello = cb.execute_command("HELLO")
        b_ids = cb.add_jobs("q", [b"b"] * 4)

    async def main() -> None:
        from disque.client._wire import parse_hello
        async with AsyncClient([address(a), address(b)], randomize=False, affinity=True,
                               affinity_window=5) as c:
            await c.add_job("q", b"a")
            c._table.learn(("127.0.0.1", b.port), parse_hello(raw_hello))
            c._affinity.observe(b_ids)
            await c.get_jobs("q")
            assert c.address == address(b)
    run(main)
