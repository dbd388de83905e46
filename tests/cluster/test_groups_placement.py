"""Where an ordered group lives in a cluster (docs/EXTENSIONS.md, "Ordered
groups", "In a cluster"): the client sends a group's ADDJOBs to its home,
the first node of the key's rendezvous ranking, and the home copies the
jobs to the next nodes of the same ranking; while the home is down the
client sends them to the next node by rank.  Real nodes, real clients."""

from __future__ import annotations

from collections.abc import Sequence

from disque import AsyncClient, Client
from disque.rendezvous import ranking
from tests.support.cluster import node_id, show
from tests.support.process import DisqueProcess

KEYS = [f"order-{i}" for i in range(8)]


def addresses(nodes: Sequence[DisqueProcess]) -> list[str]:
    return [f"127.0.0.1:{n.port}" for n in nodes]


def where(nodes: Sequence[DisqueProcess], job_id: str) -> tuple[set[str], set[str]]:
    """(the nodes holding ``job_id`` queued, every node holding a copy), by ID."""
    queued, holders = set(), set()
    for node in nodes:
        if not node.alive():
            continue
        info = show(node, job_id.encode())
        if info is not None:
            holders.add(node_id(node))
            if info[b"state"] == b"queued":
                queued.add(node_id(node))
    return queued, holders


def test_a_groups_jobs_land_on_its_home_and_their_copies_on_the_next_nodes(
        make_cluster) -> None:
    nodes = make_cluster(3)
    ids = [node_id(n) for n in nodes]
    # A client that knows one seed: it learns the others from HELLO.
    with Client(addresses(nodes)[:1]) as client:
        added: dict[str, list[str]] = {}
        for key in KEYS:
            added[key] = [client.add_job("q", b"%d" % i, group=key, replicate=2, retry=60)
                          for i in range(2)]
            added[key] += client.add_jobs("q", [b"bulk-0", b"bulk-1"], group=key, replicate=2,
                                          retry=60)
        # Per-job groups in one call: one ADDJOBS ... GROUPS per home.
        mixed = client.add_jobs("q", [b"m-%d" % i for i in range(len(KEYS))],
                                job_groups=KEYS, replicate=2, retry=60)
        for key, job_id in zip(KEYS, mixed, strict=True):
            added[key].append(job_id)
        plain = client.add_job("q", b"plain", replicate=2)
    homes = set()
    for key, job_ids in added.items():
        ranked = ranking(key.encode(), ids)
        homes.add(ranked[0])
        for job_id in job_ids:
            queued, holders = where(nodes, job_id)
            assert queued == {ranked[0]}, (key, job_id)
            assert holders == set(ranked[:2]), (key, job_id)
    assert len(homes) > 1  # the keys spread over the nodes
    assert where(nodes, plain)[0]  # a job without a group goes where it went


def test_the_client_moves_a_groups_jobs_to_the_next_node_while_its_home_is_down(
        make_cluster) -> None:
    nodes = make_cluster(3)
    ids = [node_id(n) for n in nodes]
    by_id = dict(zip(ids, nodes, strict=True))
    key = next(k for k in KEYS if by_id[ranking(k.encode(), ids)[0]] is not nodes[0])
    ranked = ranking(key.encode(), ids)
    with Client(addresses(nodes)) as client:
        first = client.add_job("q", b"before", group=key, replicate=1)
        assert where(nodes, first)[0] == {ranked[0]}
        by_id[ranked[0]].kill()
        # The home is gone: the next node by rank takes the group's new jobs
        # (and remembers for a while not to try the dead one first).
        after = [client.add_job("q", b"after-%d" % i, group=key, replicate=1)
                 for i in range(3)]
        for job_id in after:
            assert where(nodes, job_id)[0] == {ranked[1]}


async def _async_adds(seeds: list[str], key: str) -> list[str]:
    async with AsyncClient(seeds[:1]) as client:
        ids = [await client.add_job("q", b"a", group=key, replicate=1)]
        ids += await client.add_jobs("q", [b"b", b"c"], group=key, replicate=1)
        return ids


def test_the_async_client_routes_groups_too(make_cluster) -> None:
    import asyncio

    nodes = make_cluster(3)
    ids = [node_id(n) for n in nodes]
    for key in KEYS[:3]:
        home = ranking(key.encode(), ids)[0]
        for job_id in asyncio.run(_async_adds(addresses(nodes), key)):
            assert where(nodes, job_id)[0] == {home}


def test_jobs_without_a_group_are_not_routed(make_cluster) -> None:
    """A client that does not use groups sends what it always sent, where it
    always sent it: the connected node, over its one connection."""
    nodes = make_cluster(3)
    with Client(addresses(nodes)[:1], randomize=False) as client:
        ids = [client.add_job("q", b"x", replicate=2)]
        ids += client.add_jobs("q", [b"y", b"z"], replicate=2)
        ids += client.add_jobs("q", [b"h"], job_headers=[{"k": "v"}], replicate=2)
        assert client._routes == {}  # no connection but the one
        for job_id in ids:
            assert where(nodes, job_id)[0] == {node_id(nodes[0])}
