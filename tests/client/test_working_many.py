"""``working_many`` sends WORKINGS (the bulk WORKING extension) by the
thousand, and one WORKING per ID to an original node (DISQUE_REFERENCE_SERVER)."""

from __future__ import annotations

import asyncio

import pytest

from disque import AsyncClient, Client
from disque.exceptions import BadId, NoJob
from tests.client.conftest import address, last_command_of_others
from tests.support.cluster import ReferenceProcess, reference_server
from tests.support.process import DisqueProcess


def test_working_many_sends_workings_and_keeps_order(server: DisqueProcess,
                                                     client: Client) -> None:
    client.add_jobs("q", [b"%d" % i for i in range(2500)], retry=50)
    ids = [job.id for job in client.get_jobs("q", count=2500)]
    acked = ids[1234]
    client.ack(acked)
    replies = client.working_many(ids)
    assert "workings" in last_command_of_others(server)
    assert len(replies) == 2500
    assert all(r == 50 for i, r in enumerate(replies) if i != 1234)
    assert isinstance(replies[1234], NoJob)


def test_a_malformed_id_gets_its_own_error_as_with_working(client: Client) -> None:
    (job_id,) = client.add_jobs("q", [b"x"], retry=20)
    replies = client.working_many([job_id, "bogus"])
    assert replies[0] == 20 and isinstance(replies[1], BadId)


def test_async_client_sends_workings_too(server: DisqueProcess) -> None:
    async def run() -> tuple[list[object], list[str]]:
        async with AsyncClient(address(server), socket_timeout=10) as c:
            ids = await c.add_jobs("aq", [b"a", b"b", b"c"], retry=25)
            return await c.working_many(ids), last_command_of_others(server)

    replies, commands = asyncio.run(run())
    assert replies == [25, 25, 25]
    assert "workings" in commands


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_an_original_node_gets_one_working_per_id(tmp_path) -> None:
    original = ReferenceProcess(tmp_path / "ref").start()
    try:
        with Client(address(original), socket_timeout=10) as c:
            ids = c.add_jobs("q", [b"%d" % i for i in range(1500)], retry=30)
            assert c.working_many(ids) == [30] * 1500
            assert c.qlen("q") == 0  # WORKING took them out of the queue
            # Remembered per node: the next call goes straight to WORKING.
            assert c.working_many(ids[:2]) == [30, 30]
    finally:
        original.kill()
