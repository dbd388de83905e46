"""Commands about a job reach the node named in its ID from a client's first call.

A fresh client knows only its seeds until HELLO tells it the cluster: it
connects (and learns the node table) before it routes, so even its first
``working_many`` goes to each job's own node. A NOJOB from a node that is
not the job's own says nothing about the job: the client asks the job's
node, and when that node cannot be asked, the ID's answer is a
``ConnectionFailed`` in place, never a NoJob.

Jobs are added with REPLICATE 1: only their creator holds a copy, so a
WORKING anywhere else answers NOJOB.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from disque import AsyncClient, Client
from disque.exceptions import ConnectionFailed, NoJob
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, node_id, wait_joined
from tests.support.process import DisqueProcess


@pytest.fixture
def trio(server_factory) -> Iterator[list[DisqueProcess]]:
    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    yield nodes


def addr(node: DisqueProcess) -> str:
    return f"127.0.0.1:{node.port}"


def leased_on(node: DisqueProcess, queue: str, count: int) -> list[str]:
    """``count`` jobs created (and only held) by ``node``, delivered: leased."""
    with Client(addr(node), route_by_job_id=False) as producer:
        ids = producer.add_jobs(queue, [b"%d" % i for i in range(count)], replicate=1, retry=60)
        assert sorted(j.id for j in producer.get_jobs(queue, count=count, nohang=True)) == \
            sorted(ids)
    return ids


def test_a_fresh_clients_first_working_many_goes_to_each_jobs_node(trio) -> None:
    seed, b, c = trio
    ids = leased_on(b, "q", 10) + leased_on(c, "q", 10)
    with Client(addr(seed)) as client:  # never connected before this call
        assert client.working_many(ids) == [60] * 20
        assert client.node_id == node_id(seed)
    with Client(addr(seed)) as client:
        # Single-ID commands too: SHOW and WORKING as the first call.
        assert client.working(ids[0]) == 60
    with Client(addr(seed)) as client:
        assert client.show(ids[-1])["state"] == "active"
    with Client(addr(seed)) as client:
        assert client.nack(ids[1]) == 1  # b counts it: b holds the job


def test_the_async_clients_first_call_routes_too(trio) -> None:
    seed, b, _ = trio
    ids = leased_on(b, "aq", 5)

    async def first_call() -> list[int | object]:
        async with AsyncClient(addr(seed)) as client:
            return await client.working_many(ids)

    assert asyncio.run(first_call()) == [60] * 5


def test_a_nojob_from_another_node_is_not_the_jobs_answer(trio) -> None:
    seed, b, c = trio
    on_b = leased_on(b, "q", 3)
    on_c = leased_on(c, "q", 3)
    with Client(addr(c), route_by_job_id=False) as producer:
        # REPLICATE 2: a copy on the seed or on b; keep those on b.
        copied = producer.add_jobs("r", [b"%d" % i for i in range(20)], replicate=2,
                                   retry=60)
        assert len(producer.get_jobs("r", count=20, nohang=True)) == 20
    with Client(addr(seed), route_by_job_id=False) as look:
        copied_on_b = [i for i in copied if look.show(i) is None]
    assert copied_on_b, "some copies should be on b"
    with Client(addr(b), route_by_job_id=False) as producer:
        gone = producer.add_job("q", b"x", replicate=1)
        producer.del_job(gone)  # its own node answers NOJOB: that one is lost
    with Client(addr(seed), connect_timeout=0.5) as client:
        client.ping()
        c.kill()
        replies = client.working_many([*on_b, *on_c, gone, *copied_on_b])
    assert replies[:3] == [60] * 3
    # c cannot be asked, and no other node has a copy: not a NOJOB.
    assert all(isinstance(r, ConnectionFailed) for r in replies[3:6]), replies
    assert isinstance(replies[6], NoJob)
    # c's jobs with a copy on b: b's WORKING keeps their lease there.
    assert replies[7:] == [60] * len(copied_on_b)
