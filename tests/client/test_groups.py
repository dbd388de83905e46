"""Ordered groups through the client (sync and async) and the CLI:
``add_job(..., group=)``, ``add_jobs(..., group=)`` and ``job_groups=``,
``get_jobs(..., with_group=True)``, ``Job.group``, ``show``, ``jscan(group=)``;
a client that does not ask sees the original's entries."""

from __future__ import annotations

import asyncio

import pytest

from disque import AsyncClient, Client, ResponseError
from disque.cli.prompt import HELP
from disque.client import _wire as w
from tests.client.conftest import address, last_command_of_others
from tests.client.test_cli import disque
from tests.support.process import DisqueProcess


def test_add_job_with_a_group_and_get_it_back(client: Client) -> None:
    first = client.add_job("q", b"a0", group="order-42", retry=30)
    second = client.add_job("q", b"a1", group=b"order-42")
    plain = client.add_job("q", b"plain")
    jobs = client.get_jobs("q", count=10, with_group=True, with_counters=True)
    # A group's jobs in add order, the group held meanwhile; the plain job too.
    assert [(j.id, j.group) for j in jobs] == [(first, "order-42"), (second, "order-42"),
                                               (plain, None)]
    assert jobs[0].nacks == 0  # the counters still parsed beside it
    # The position is the job's ctime (SHOW's), increasing in add order;
    # none for a job without a group, nor when not asked for.
    assert [j.group_position for j in jobs] == [
        (client.show(first) or {})["ctime"], (client.show(second) or {})["ctime"], None]
    assert jobs[0].group_position < jobs[1].group_position
    shown = client.show(first)
    assert shown is not None and shown["group"] == "order-42"
    assert "group" not in (client.show(plain) or {})
    assert sorted(client.jscan(group="order-42")) == sorted([first, second])
    assert [j["id"] for j in client.jscan(group="order-42", reply="all")] != []
    client.ack(first, second, plain)


def test_group_is_none_unless_asked(client: Client) -> None:
    client.add_job("q", b"a0", group="g")
    job = client.get_job("q")
    assert job is not None and job.group is None
    assert job == w.Job("q", job.id, b"a0")  # the original's entry, nothing more
    client.ack(job.id)


def test_the_group_is_held_across_consumers(client: Client, server: DisqueProcess) -> None:
    a0 = client.add_job("q", b"a0", group="A")
    a1 = client.add_job("q", b"a1", group="A")
    b0 = client.add_job("q", b"b0", group="B")
    with Client(address(server)) as other:
        assert [j.id for j in client.get_jobs("q")] == [a0]
        assert [j.id for j in other.get_jobs("q", count=5, nohang=True)] == [b0]
        client.ack(a0)
        assert [j.id for j in other.get_jobs("q", count=5, nohang=True)] == [a1]
        other.ack(a1, b0)


def test_add_jobs_shared_and_per_job_groups(client: Client, server: DisqueProcess) -> None:
    shared = client.add_jobs("q", [b"a0", b"a1"], group="A", retry=30)
    assert "addjobs" in last_command_of_others(server)
    per_job = client.add_jobs("q", [b"b0", b"c0", b"b1"], job_groups=["B", "C", "B"])
    assert "addjobs" in last_command_of_others(server)
    # A batch with a job without a group, or with per-job headers too, goes
    # as pipelined ADDJOBs (ADDJOBS GROUPS gives every job a group).
    mixed = client.add_jobs("q", [b"d0", b"plain"], job_groups=["D", None],
                            job_headers=[{"k": "v"}, None])
    assert "addjob" in last_command_of_others(server)
    jobs = client.get_jobs("q", count=20, with_group=True, with_headers=True)
    assert [(j.body, j.group) for j in jobs] == [
        (b"a0", "A"), (b"a1", "A"), (b"b0", "B"), (b"b1", "B"), (b"c0", "C"), (b"d0", "D"),
        (b"plain", None)]
    assert [j.headers for j in jobs][-2:] == [{"k": b"v"}, {}]
    assert [j.id for j in jobs if j.group in ("A", "B", "C")] == [
        *shared, per_job[0], per_job[2], per_job[1]]
    assert [j.id for j in jobs][-2:] == mixed
    with pytest.raises(ValueError):  # one entry per body
        client.add_jobs("q", [b"x", b"y"], job_groups=["A"])
    with pytest.raises(ValueError):  # one or the other
        client.add_jobs("q", [b"x"], group="A", job_groups=["A"])


def test_add_jobs_with_groups_falls_back_to_addjob(client: Client) -> None:
    client._no_bulk_add.add(client.node_id)  # as on a node that lacks ADDJOBS
    ids = client.add_jobs("q", [b"a", b"b"], job_groups=["G", "G"], batch_size=1)
    jobs = client.get_jobs("q", count=2, with_group=True)
    assert [(j.id, j.group) for j in jobs] == [(ids[0], "G"), (ids[1], "G")]


def test_errors_of_the_node_reach_the_caller(client: Client) -> None:
    with pytest.raises(ResponseError, match="DELAY can't be used with GROUP"):
        client.add_job("q", b"x", group="g", delay=5)
    with pytest.raises(ResponseError, match="GROUP key too long"):
        client.add_job("q", b"x", group="k" * 300)
    with pytest.raises(ResponseError, match="GROUP key too long"):
        client.add_jobs("q", [b"x", b"y"], job_groups=["ok", "k" * 300])
    with pytest.raises(ValueError):
        client.add_job("q", b"x", group="")
    assert client.qlen("q") == 0


def test_the_wire_form() -> None:
    assert w.add_job("q", b"b", group="g", retry=5).args[-2:] == (b"GROUP", b"g")
    build = w.add_jobs_with_groups_builder("q", retry=5)
    assert build is not None
    request = build([(b"a", None, "g1"), (b"b", None, b"g2")])
    assert request is not None and request.args == (
        b"ADDJOBS", b"q", b"0", b"RETRY", b"5", b"GROUPS", b"g1", b"a", b"g2", b"b")
    assert build([(b"a", None, None)]) is None  # no group: ADDJOBs
    bulk = w.add_jobs_builder("q", group="g")
    assert bulk is not None and bulk([b"a"]).args == (b"ADDJOBS", b"q", b"0", b"GROUP", b"g",
                                                      b"BODIES", b"a")
    assert w.get_jobs(["q"], with_headers=True, with_group=True).args == (
        b"GETJOB", b"WITHHEADERS", b"WITHGROUP", b"FROM", b"q")
    job = w.parse_job([b"q", b"D-x", b"b", b"nacks", 1, b"additional-deliveries", 0,
                       b"headers", [b"k", b"v"], b"group", b"g"])
    assert (job.nacks, job.headers, job.group) == (1, {"k": b"v"}, "g")
    assert w.parse_job([b"q", b"D-x", b"b", b"group", None]).group is None
    assert w.jscan_page(0, group="g").args[-4:] == (b"GROUP", b"g", b"REPLY", b"id")


def test_async_client(server: DisqueProcess) -> None:
    async def main() -> None:
        async with AsyncClient(address(server)) as c:
            first = await c.add_job("aq", b"a0", group="A")
            ids = await c.add_jobs("aq", [b"a1", b"b0"], job_groups=["A", "B"])
            shared = await c.add_jobs("aq", [b"c0"], group="C")
            jobs = await c.get_jobs("aq", count=10, with_group=True)
            assert [(j.id, j.group) for j in jobs] == [
                (first, "A"), (ids[0], "A"), (ids[1], "B"), (shared[0], "C")]
            assert await c.get_job("aq", nohang=True, with_group=True) is None
            shown = await c.show(first)
            assert shown is not None and shown["group"] == "A"
            assert [job_id async for job_id in c.jscan(group="B")] == [ids[1]]

    asyncio.run(main())


def test_the_cli_shows_them(server: DisqueProcess) -> None:
    p = server.port
    job_id = disque(p, "--raw", "addjob", "q", "body", "0", "group", "g").stdout.strip()
    got = disque(p, "--no-raw", "getjob", "withgroup", "from", "q").stdout
    shown = disque(p, "--raw", "show", job_id).stdout.splitlines()
    ctime = int(shown[shown.index("ctime") + 1])
    assert got == (f'1) 1) "q"\n   2) "{job_id}"\n   3) "body"\n   4) "group-position"\n'
                   f'   5) (integer) {ctime}\n   6) "group"\n   7) "g"\n')
    shown = disque(p, "--no-raw", "show", job_id).stdout
    assert shown.endswith('"group"\n32) "g"\n')
    stat = disque(p, "--no-raw", "qstat", "q").stdout
    assert '"groups-held"' in stat
    assert "[GROUP key]" in HELP and "[WITHGROUP]" in HELP and "GROUPS group job" in HELP


def test_a_redriven_job_keeps_its_group(server: DisqueProcess) -> None:
    from tests.client.test_redrive import redrive
    from tests.console.workload import make_dead_letters

    make_dead_letters(server, "grouped", [b"g0", b"g1"], group="G")
    result = redrive(server.port, "grouped:dead", "--rate", "1000")
    assert result.returncode == 0, result.stderr
    assert "finished: moved 2" in result.stdout
    with Client(address(server)) as c:
        jobs = c.get_jobs("grouped", count=5, nohang=True, with_group=True)
    assert sorted(j.body for j in jobs) == [b"g0", b"g1"] and {j.group for j in jobs} == {"G"}
