"""Ordered groups in a cluster with an original node (1.0-rc1), which knows
nothing of groups (docs/EXTENSIONS.md, "Ordered groups", "In a cluster"):
the client learns from the original's syntax error that it is no group's
home, and our nodes put a group's copies on our nodes first; an original
node keeps a plain copy only when REPLICATE needs more nodes than ours."""

from __future__ import annotations

from pathlib import Path

import pytest

from disque import Client
from disque.rendezvous import ranking
from tests.cluster.test_groups_failover import queued_on
from tests.support.cluster import node_id, reference_server, show, with_original
from tests.support.process import wait_for

pytestmark = pytest.mark.skipif(
    reference_server() is None,
    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its disque-server")


def test_groups_live_on_our_nodes_beside_an_original(server_factory, tmp_path: Path) -> None:
    with with_original(server_factory, tmp_path) as (mine, original):
        ours = {node_id(n): n for n in mine}
        theirs = node_id(original)
        ids = [*ours, theirs]
        keys = [f"k-{i}" for i in range(12)]
        # Keys whose ranking puts the original first, and second.
        assert any(ranking(k.encode(), ids)[0] == theirs for k in keys)
        assert any(ranking(k.encode(), ids)[1] == theirs for k in keys)
        with Client([f"127.0.0.1:{n.port}" for n in [original, *mine]]) as client:
            added = {key: client.add_job("q", b"x", group=key, replicate=2, retry=60)
                     for key in keys}
            per_job = client.add_jobs("q", [b"y"] * len(keys), job_groups=keys, replicate=2)
            assert client._groups is not None and theirs in client._groups.no_groups
            three = client.add_job("q", b"z", group=keys[0], replicate=3)
        for i, key in enumerate(keys):
            home = next(n for n in ranking(key.encode(), ids) if n != theirs)
            for job_id in (added[key], per_job[i]):
                info = show(ours[home], job_id.encode())
                assert info is not None and info[b"state"] == b"queued", key
                # Both copies on our nodes, none on the original.
                assert all(show(n, job_id.encode()) is not None for n in mine), key
                assert show(original, job_id.encode()) is None, key
        # REPLICATE 3 needs the original: it keeps a plain copy (no group).
        plain = show(original, three.encode())
        assert plain is not None and b"group" not in plain


def test_one_of_our_nodes_takes_the_group_over_beside_an_original(
        server_factory, tmp_path: Path) -> None:
    with with_original(server_factory, tmp_path) as (mine, original):
        ours = {node_id(n): n for n in mine}
        theirs = node_id(original)
        ids = [*ours, theirs]
        key = next(f"k-{i}" for i in range(100)
                   if ranking(f"k-{i}".encode(), ids)[0] != theirs)
        home = ranking(key.encode(), ids)[0]
        other = next(n for n in ours if n != home)
        with Client([f"127.0.0.1:{n.port}" for n in mine]) as client:
            jobs = [client.add_job("q", b"%d" % i, group=key, replicate=2, retry=2).encode()
                    for i in range(4)]
        ours[home].kill()
        wait_for(lambda: len(queued_on(ours[other], "q")) == 4, timeout=30, interval=0.1,
                 message="the group queued again on our other node")
        reply = ours[other].client().execute_command("GETJOB", "COUNT", 10, "FROM", "q")
        assert [e[1] for e in reply] == jobs


def test_federation_gives_an_original_node_no_group(server_factory, tmp_path: Path) -> None:
    """An original node asking for jobs (NEEDJOBS) gets the jobs without a
    group only: it would hand a group's jobs to any consumer, in any order."""
    with with_original(server_factory, tmp_path) as (mine, original):
        producer = mine[0].client()
        grouped = [producer.execute_command("ADDJOB", "q", f"g{i}", 0, "REPLICATE", 1,
                                            "GROUP", "A") for i in range(3)]
        plain = producer.execute_command("ADDJOB", "q", "plain", 0, "REPLICATE", 1)
        consumer = original.client()

        def fetch() -> list:
            return consumer.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "q") or []

        got = wait_for(fetch, timeout=15, interval=0.05, message="a job moved to the original")
        assert [e[1] for e in got] == [plain]
        assert fetch() == [] and fetch() == []
        assert all(show(mine[0], job_id)[b"state"] == b"queued" for job_id in grouped)
