"""``send_pipeline``: one pipeline sent once, every reply read before a drop kept."""

from __future__ import annotations

import asyncio

from disque import AsyncClient, Client
from disque.client import PipelineReplies
from tests.client.conftest import address


def commands(*commands: tuple[bytes, ...]) -> bytes:
    return b"".join(b"*%d\r\n" % len(c) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in c)
                    for c in commands)


# QUIT makes the node answer what came before it, then close the link: a
# pipeline of ADDJOBS, QUIT, ADDJOBS is cut after its second reply.
CUT = commands((b"ADDJOBS", b"cut", b"0", b"BODIES", b"j0", b"j1", b"j2"), (b"QUIT",),
               (b"ADDJOBS", b"cut", b"0", b"BODIES", b"j3", b"j4"))
REST = commands((b"ADDJOBS", b"cut", b"0", b"BODIES", b"j3", b"j4"))


def check_cut(got: PipelineReplies, node_id: str) -> None:
    assert got.sent == 3 and got.unanswered == 1 and got.node_id == node_id
    assert got.error is not None and "after 2 of 3 replies" in str(got.error)
    assert len(got.replies[0]) == 3 and all(r.startswith(b"D-") for r in got.replies[0])


def test_a_dropped_pipeline_keeps_the_replies_already_read(server) -> None:
    with Client(address(server)) as client:
        node_id = client.connect().node_id
        asked: list[str | None] = []
        got = client.send_pipeline(lambda node: asked.append(node) or (CUT, 3))
        assert asked == [node_id]  # built once connected, for that node
        check_cut(got, node_id)
        # The link was dropped: the next pipeline connects again.
        again = client.send_pipeline(lambda _node: (REST, 1))
        assert again.error is None and again.unanswered == 0 and len(again.replies[0]) == 2
        assert sorted(j.body for j in client.get_jobs("cut", count=10, nohang=True)) == [
            f"j{i}".encode() for i in range(5)]


def test_error_replies_are_values_and_no_node_is_no_send(server, unused_port: int) -> None:
    with Client(address(server)) as client:
        got = client.send_pipeline(lambda _n: (commands((b"NOSUCH",), (b"PING",)), 2))
        assert str(got.replies[0]).startswith("ERR unknown command")
        assert got.replies[1] == b"PONG" and got.error is None
    with Client(f"127.0.0.1:{unused_port}", reconnect_timeout=0) as nowhere:
        got = nowhere.send_pipeline(lambda _n: (b"", 0))
        assert got.sent == 0 and got.replies == [] and got.error is not None


def test_drop_node_leaving_moves_to_another_node(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client(f"{address(a)},{address(b)}", randomize=False) as client:
        first = client.connect().node_id
        client.drop_node(leaving=True)
        assert client.connect().node_id != first  # the leaving node is tried last


def test_async_client_sends_pipelines_alike(server) -> None:
    async def main() -> None:
        async with AsyncClient(address(server)) as client:
            node_id = (await client.connect()).node_id
            check_cut(await client.send_pipeline(lambda _n: (CUT, 3)), node_id)
            again = await client.send_pipeline(lambda _n: (REST, 1))
            assert again.error is None and len(again.replies[0]) == 2
            await client.drop_node()
            assert client.address is None
    asyncio.run(main())
