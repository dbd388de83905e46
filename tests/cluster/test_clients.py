"""Clients against a real cluster: our client's HELLO discovery and
failover, the CLI's view."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from disque import AsyncClient, Client
from disque.exceptions import NoJob
from tests.support.cluster import holders, node_id
from tests.support.process import wait_for


def test_client_discovers_the_cluster_and_fails_over(make_cluster) -> None:
    a, b, c = make_cluster(3)
    ids = {node_id(n) for n in (a, b, c)}
    with Client(f"127.0.0.1:{a.port}") as client:
        client.ping()
        assert {n.id for n in client.nodes} == ids  # one seed, three nodes from HELLO
        assert {n.port for n in client.nodes} == {a.port, b.port, c.port}
        job_id = client.add_job("q", b"payload")  # REPLICATE 3: a copy on every node
        dead = node_id(a)
        a.kill()
        # The next command finds the connection gone and moves to another node,
        # which holds a copy of the job.
        info = wait_for(lambda: client.show(job_id), timeout=15, message="failover")
        assert info["id"] == job_id and client.node_id in ids - {dead}


def test_cli_shows_the_cluster(make_cluster) -> None:
    a, b = make_cluster(2)
    result = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(a.port),
                             "cluster", "nodes"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    lines = result.stdout.strip().splitlines()
    assert {line.split()[0] for line in lines} == {node_id(a), node_id(b)}
    assert any("myself" in line for line in lines)


def test_commands_about_a_job_go_to_the_node_named_in_its_id(make_cluster) -> None:
    a, b, _ = make_cluster(3)
    with Client(f"127.0.0.1:{b.port}") as producer:
        # REPLICATE 1: only b, the creator, holds the job.
        ids = [producer.add_job("q", f"job{i}".encode(), replicate=1) for i in range(4)]
        assert producer.node_id == node_id(b)
        # Delivered (no longer queued), so that a NACK has something to do.
        assert [j.id for j in producer.get_jobs("q", count=4, nohang=True)] == ids
    with Client(f"127.0.0.1:{a.port}") as routed, \
            Client(f"127.0.0.1:{a.port}", route_by_job_id=False) as unrouted:
        routed.ping()
        unrouted.ping()
        assert routed.node_id == unrouted.node_id == node_id(a)
        # a has no copy: unrouted, SHOW and WORKING on a know nothing of it.
        assert unrouted.show(ids[0]) is None
        with pytest.raises(NoJob):
            unrouted.working(ids[0])
        shown = routed.show(ids[0])
        assert shown is not None and shown["id"] == ids[0] and shown["body"] == b"job0"
        assert routed.working(ids[0]) > 0
        # NACK counts only jobs the node knows: b does, a does not.
        assert unrouted.nack(ids[1]) == 0
        assert routed.nack(ids[1]) == 1
        assert routed.show(ids[1])["nacks"] == 1
        # ACKJOB routed to b acks a job b knows (1); on a it would be a dummy ack (0).
        assert routed.ack(ids[2]) == 1
        assert routed.ack_many([ids[3]]) == 1
        assert routed.node_id == node_id(a)  # the client's own node is unchanged
    with Client(f"127.0.0.1:{b.port}") as check:
        wait_for(lambda: check.show(ids[2]) is None and check.show(ids[3]) is None,
                 timeout=10, message="acked jobs deleted on their node")


def test_routing_falls_back_to_the_connected_node_when_the_creator_is_down(make_cluster) -> None:
    a, b, c = make_cluster(3)
    with Client(f"127.0.0.1:{b.port}") as producer:
        job_id = producer.add_job("q", b"payload", replicate=3)
    with Client(f"127.0.0.1:{a.port}", connect_timeout=0.5) as client:
        client.ping()
        b.kill()
        # b is gone: the command goes to a, which has a copy.
        shown = client.show(job_id)
        assert shown is not None and shown["id"] == job_id
        assert client.node_id == node_id(a)
        assert client.ack(job_id) == 1
        # The GC waits for b (it may hold a copy): the job stays, acked.
        assert client.show(job_id)["state"] == "acked"
    assert holders([a, c], job_id) == [a, c]


def test_async_client_routes_by_job_id(make_cluster) -> None:
    a, b, _ = make_cluster(3)
    with Client(f"127.0.0.1:{b.port}") as producer:
        ids = [producer.add_job("q", b"x", replicate=1) for _ in range(3)]
        assert len(producer.get_jobs("q", count=3, nohang=True)) == 3

    async def scenario() -> None:
        async with AsyncClient(f"127.0.0.1:{a.port}") as client:
            await client.ping()
            assert (await client.show(ids[0]))["id"] == ids[0]
            assert await client.working(ids[0]) > 0
            assert await client.nack(ids[1]) == 1
            (seconds,) = await client.working_many([ids[2]])
            assert isinstance(seconds, int) and seconds > 0
            assert await client.ack(*ids) == 3
            assert client.node_id == node_id(a)

    asyncio.run(scenario())
