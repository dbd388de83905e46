"""``add_jobs`` uses the node's bulk ADDJOBS, and pipelined ADDJOBs against an
original node (found through DISQUE_REFERENCE_SERVER)."""

from __future__ import annotations

import asyncio

import pytest

from disque import AsyncClient, Client
from disque.exceptions import DisqueError
from tests.client.conftest import address, last_command_of_others
from tests.support.cluster import ReferenceProcess, reference_server
from tests.support.process import DisqueProcess


def test_add_jobs_sends_addjobs_and_keeps_order_and_options(server: DisqueProcess,
                                                            client: Client) -> None:
    ids = client.add_jobs("q", (b"b%d" % i for i in range(2500)), batch_size=1000, retry=42)
    assert "addjobs" in last_command_of_others(server)
    assert len(set(ids)) == 2500 and all(isinstance(i, str) for i in ids)
    jobs = client.get_jobs("q", count=2500)
    assert [j.id for j in jobs] == ids
    assert jobs[-1].body == b"b2499"
    assert client.show(ids[0])["retry"] == 42


def test_errors_take_their_place_or_are_raised(client: Client) -> None:
    client.add_job("m", b"first")
    results = client.add_jobs("m", [b"a", b"b"], maxlen=2, return_exceptions=True)
    assert isinstance(results[0], str) and isinstance(results[1], DisqueError)
    assert str(results[1]).startswith("MAXLEN")
    with pytest.raises(DisqueError, match="MAXLEN"):
        client.add_jobs("m", [b"c"], maxlen=2)
    client.pause("p", "in")
    paused = client.add_jobs("p", [b"x", b"y"], return_exceptions=True)
    assert [str(e).split()[0] for e in paused] == ["PAUSED", "PAUSED"]


def test_idmp_keys_go_through_single_addjobs(server: DisqueProcess, client: Client) -> None:
    ids = client.add_jobs("i", [b"x"], idmp="k1")
    assert client.add_job("i", b"x", idmp="k1") == ids[0]
    assert "addjob" in last_command_of_others(server)


def test_async_client_uses_addjobs_too(server: DisqueProcess) -> None:
    async def run() -> tuple[list[str], list[str]]:
        async with AsyncClient(address(server), socket_timeout=10) as c:
            ids = await c.add_jobs("aq", [b"%d" % i for i in range(300)], batch_size=100)
            return ids, last_command_of_others(server)

    ids, commands = asyncio.run(run())
    assert len(set(ids)) == 300
    assert "addjobs" in commands


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its "
                           "disque-server")
def test_an_original_node_gets_pipelined_addjobs(tmp_path) -> None:
    original = ReferenceProcess(tmp_path / "ref").start()
    try:
        with Client(address(original), socket_timeout=10) as c:
            ids = c.add_jobs("q", [b"%d" % i for i in range(250)], batch_size=100, retry=30)
            assert len(set(ids)) == 250
            assert c.qlen("q") == 250
            assert c.show(ids[-1])["retry"] == 30
            # Remembered per node: the next call goes straight to ADDJOB.
            assert len(c.add_jobs("q", [b"more"])) == 1
            assert c.qlen("q") == 251
    finally:
        original.kill()
