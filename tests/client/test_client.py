"""Every Client method against a real disque-server."""

from __future__ import annotations

import threading
import time

import pytest

from disque import Client, Hello, Job, ResponseError
from disque.exceptions import NoJob
from tests.client.conftest import address, fake_job_id
from tests.support.process import DisqueProcess, wait_for


def test_add_get_ack_round_trip_keeps_bytes(client: Client) -> None:
    body = bytes(range(256))
    job_id = client.add_job("q", body)
    assert job_id.startswith("D-") and len(job_id) == 40
    assert job_id[2:10] == client.node_id[:8]
    (job,) = client.get_jobs("q")
    assert job == Job("q", job_id, body)
    assert job.node_prefix == client.node_id[:8]
    assert client.ack(job.id) == 1
    assert client.show(job_id) is None


def test_str_body_is_sent_as_utf8_and_comes_back_as_bytes(client: Client) -> None:
    client.add_job("q", "café")
    assert client.get_job("q").body == "café".encode()


def test_any_queue_name_round_trips(client: Client) -> None:
    raw_name = b"q\xff\xfe name"
    client.add_job(raw_name, b"x")
    job = client.get_job(raw_name, nohang=True)
    assert job is not None and isinstance(job.queue, str)
    assert client.qlen(job.queue) == 0 and client.qstat(job.queue) is not None


def test_add_job_options_reach_the_server(client: Client) -> None:
    job_id = client.add_job("q", b"x", timeout_ms=1000, replicate=1, delay=30, retry=7,
                            ttl=100, maxlen=10)
    shown = client.show(job_id)
    assert shown is not None
    assert (shown["delay"], shown["retry"], shown["repl"], shown["state"]) == (30, 7, 1,
                                                                                "active")
    assert 95 <= shown["ttl"] <= 100
    assert client.qlen("q") == 0  # delayed
    async_id = client.add_job("q", b"y", async_=True, retry=0, replicate=1)
    assert async_id.endswith(("0", "2", "4", "6", "8", "a", "c", "e"))  # even TTL: RETRY 0
    assert client.qlen("q") == 1


def test_get_jobs_count_queues_order_and_counters(client: Client) -> None:
    for i in range(3):
        client.add_job("a", f"a{i}")
    client.add_job("b", b"b0")
    jobs = client.get_jobs("b", "a", count=10)
    assert [j.body for j in jobs] == [b"b0", b"a0", b"a1", b"a2"]
    assert client.nack(jobs[1].id) == 1
    (again,) = client.get_jobs("a", with_counters=True)
    assert again.id == jobs[1].id
    assert (again.nacks, again.additional_deliveries) == (1, 0)
    assert client.get_jobs("a", "b", nohang=True) == []
    assert client.get_job("a", nohang=True) is None


def test_get_jobs_timeout_returns_empty(client: Client) -> None:
    started = time.monotonic()
    assert client.get_jobs("empty", timeout_ms=100) == []
    assert 0.05 <= time.monotonic() - started < 5


def test_blocking_longer_than_socket_timeout_is_not_an_error(server: DisqueProcess) -> None:
    with Client(address(server), socket_timeout=0.2) as c:
        started = time.monotonic()
        assert c.get_jobs("empty", timeout_ms=700) == []
        assert time.monotonic() - started >= 0.6


def test_blocking_get_wakes_up_on_add(server: DisqueProcess, client: Client) -> None:
    got: list[Job] = []
    consumer = Client(address(server))
    thread = threading.Thread(target=lambda: got.extend(consumer.get_jobs("wake")))
    thread.start()
    wait_for(lambda: client.info("clients")["clients"]["blocked_clients"] == 1,
             message="consumer blocked")
    job_id = client.add_job("wake", b"now")
    thread.join(10)
    assert not thread.is_alive()
    assert [j.id for j in got] == [job_id]
    consumer.close()


def test_visibility_commands(client: Client) -> None:
    ids = [client.add_job("v", f"j{i}") for i in range(4)]
    assert client.qlen("v") == 4
    assert client.dequeue(ids[0], ids[1]) == 2
    assert client.qlen("v") == 2
    assert client.dequeue(ids[0]) == 0  # not queued any more
    assert client.enqueue(ids[0]) == 1
    assert client.qlen("v") == 3
    assert client.working(ids[2]) == client.show(ids[2])["retry"]
    gone = fake_job_id()
    retries = client.working_many([ids[2], gone, ids[2]])
    assert retries[0] == retries[2] == client.show(ids[2])["retry"]
    assert isinstance(retries[1], NoJob)  # in place, not raised
    assert client.del_job(ids[3]) == 1 and client.show(ids[3]) is None
    assert client.fastack(ids[0], ids[1]) == 2
    assert client.ack(ids[2]) == 1
    assert client.qlen("v") == 0
    # No IDs: nothing to send, nothing done.
    for method in (client.ack, client.fastack, client.nack, client.enqueue, client.dequeue,
                   client.del_job):
        assert method() == 0


def test_queue_inspection(client: Client) -> None:
    assert client.qstat("nope") is None and client.qlen("nope") == 0
    assert client.qpeek("nope", 5) == []
    ids = [client.add_job("i", f"j{i}") for i in range(5)]
    assert [j.id for j in client.qpeek("i", 2)] == ids[:2]
    assert [j.id for j in client.qpeek("i", -2)] == [ids[4], ids[3]]
    stat = client.qstat("i")
    assert stat is not None
    assert (stat["name"], stat["len"], stat["jobs-in"], stat["pause"]) == ("i", 5, 5, "none")
    assert stat["import-from"] == []


def test_pause(client: Client) -> None:
    assert client.pause("p") == "none"
    assert client.pause("p", "in") == "in"
    assert client.pause("p", "state") == "in"
    assert client.pause("p", "out", bcast=True) == "out"
    assert client.pause("p", "in", "out") == "all"
    assert client.qstat("p")["pause"] == "all"
    assert client.pause("p", "none") == "none"


def test_pause_out_holds_jobs_until_cleared(server: DisqueProcess, client: Client) -> None:
    job_id = client.add_job("po", b"x")
    client.pause("po", "out")
    assert client.get_jobs("po", timeout_ms=50) == []
    got: list[Job] = []
    consumer = Client(address(server))
    thread = threading.Thread(target=lambda: got.extend(consumer.get_jobs("po")))
    thread.start()
    wait_for(lambda: client.qstat("po")["blocked"] == 1, message="consumer blocked")
    client.pause("po", "none")
    thread.join(10)
    assert [j.id for j in got] == [job_id]
    consumer.close()


def test_qscan_follows_cursors_with_every_option(client: Client) -> None:
    names = {f"queue-{i}" for i in range(60)}
    for name in names:
        client.add_job(name, b"x")
    client.add_jobs("big", [b"x"] * 5)
    assert set(client.qscan(count=1)) == names | {"big"}
    assert set(client.qscan(busyloop=True)) == names | {"big"}
    assert set(client.qscan(minlen=2)) == {"big"}
    assert set(client.qscan(maxlen=1)) == names
    assert set(client.qscan(importrate=1)) == set()


def test_jscan_follows_cursors_with_every_option(client: Client) -> None:
    queued = set(client.add_jobs("j1", [f"b{i}" for i in range(30)]))
    other = client.add_job("j2", b"x")
    delayed = client.add_job("j2", b"y", delay=100)
    assert set(client.jscan(count=1)) == queued | {other, delayed}
    assert set(client.jscan(queue="j1")) == queued
    assert set(client.jscan(states=["active"])) == {delayed}
    assert set(client.jscan(queue="j2", states=["queued", "active"])) == {other, delayed}
    full = list(client.jscan(queue="j2", reply="all", busyloop=True))
    assert {d["id"] for d in full} == {other, delayed}
    assert {d["body"] for d in full} == {b"x", b"y"}


def test_scan_restarts_when_the_node_changes(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client([address(a), address(b)], randomize=False) as c:
        for i in range(40):
            c.add_job(f"a{i}", b"x")
        with Client(address(b)) as cb:
            cb.add_job("on-b", b"x")
        names = c.qscan(count=1)
        first = next(names)
        assert first.startswith("a")
        a.kill()
        rest = list(names)
    assert rest == ["on-b"]


def test_batches(client: Client) -> None:
    ids = client.add_jobs("batch", (f"job-{i}" for i in range(2500)), batch_size=1000,
                          retry=60)
    assert len(ids) == len(set(ids)) == 2500
    assert client.qlen("batch") == 2500
    assert client.show(ids[-1])["retry"] == 60
    jobs = client.get_jobs("batch", count=2500)
    assert [j.body for j in jobs[:2]] == [b"job-0", b"job-1"]
    assert client.ack_many((j.id for j in jobs[:1500]), batch_size=100) == 1500
    assert client.fastack_many([j.id for j in jobs[1500:]], batch_size=7) == 1000
    assert client.info("jobs")["jobs"]["registered_jobs"] == 0
    assert client.add_jobs("batch", []) == [] and client.ack_many([]) == 0


def test_hello_ping_info(server: DisqueProcess, client: Client) -> None:
    hello = client.hello()
    assert isinstance(hello, Hello) and hello.version == 1
    assert hello.node_id == client.node_id == client.cluster_myid()
    assert hello.myself is not None and hello.myself.port == server.port
    assert [n.id for n in client.nodes] == [hello.node_id]
    assert client.ping() == b"PONG" and client.ping("hi") == b"hi"
    info = client.info()
    assert info["server"]["tcp_port"] == server.port
    assert {"server", "clients", "memory", "jobs", "queues", "stats"} <= set(info)
    assert set(client.info("queues")) == {"queues"}


def test_cluster_and_config_commands(client: Client) -> None:
    assert client.cluster_leaving() is False
    assert client.cluster_leaving(True) is True
    assert client.cluster_leaving() is True
    assert client.cluster_leaving(False) is False
    (me,) = client.cluster_nodes()
    assert me["id"] == client.node_id and "myself" in me["flags"]
    assert client.cluster_info()["cluster_known_nodes"] == 1
    with pytest.raises(ResponseError) as err:
        client.cluster_forget("f" * 40)
    assert err.value.code == "ERR"
    # A bad address: the server's error is passed through.
    with pytest.raises(ResponseError, match="Invalid node address"):
        client.cluster_meet("not-an-ip", 7711)
    client.config_set("loglevel", "warning")
    assert client.config_get("loglevel") == {"loglevel": "warning"}
    client.add_job("r", b"x")
    old_id = client.node_id
    client.cluster_reset(hard=True)
    assert client.qlen("r") == 0
    assert client.cluster_myid() != old_id


def test_execute_command_is_raw(client: Client) -> None:
    assert client.execute_command("PING") == b"PONG"
    assert client.execute_command("QLEN", "x") == 0
    with pytest.raises(ValueError):
        client.execute_command()
    with pytest.raises(ResponseError) as err:
        client.execute_command("NOSUCHCOMMAND")
    assert err.value.message.startswith("ERR unknown command")


def test_lazy_connect_close_and_context_manager(server: DisqueProcess) -> None:
    c = Client(address(server))
    assert c.address is None and c.node_id is None and "not connected" in repr(c)
    hello = c.connect()
    assert c.address == address(server) and c.node_id == hello.node_id
    assert c.seeds == [address(server)]
    c.close()
    assert c.address is None
    assert c.ping() == b"PONG"  # reconnects by itself
    with c:
        pass
    assert c.address is None


def test_client_name(server: DisqueProcess) -> None:
    with Client(address(server), client_name="worker-7") as c:
        assert b"name=worker-7" in c.execute_command("CLIENT", "LIST")


def test_affinity_moves_to_the_node_producing_most_jobs(server_factory) -> None:
    """Consumer affinity with two real nodes.

    Without the cluster bus a node neither lists its peers in HELLO nor
    receives other nodes' jobs, so the test gives the client B's real HELLO
    reply and B-made job IDs directly; the move itself is real.
    """
    a, b = server_factory(), server_factory()
    with Client(address(b)) as cb:
        b_hello_raw = cb.execute_command("HELLO")
        b_jobs = cb.add_jobs("aff", [b"from-b"] * 3)
    with Client([address(a), address(b)], randomize=False, affinity=True,
                affinity_window=10) as c:
        c.add_job("aff", b"from-a")
        from disque.client._wire import parse_hello
        c._table.learn(("127.0.0.1", b.port), parse_hello(b_hello_raw))
        c._affinity.observe(b_jobs * 3)  # 9 jobs made by B ...
        (job,) = c.get_jobs("aff")  # ... and 1 by A: 90% B, so move
        assert job.body == b"from-a"
        assert c.address == address(b)
        assert [j.body for j in c.get_jobs("aff", count=5)] == [b"from-b"] * 3
    with Client(address(a), affinity=True, affinity_window=2) as c:
        c.add_jobs("own", [b"1", b"2"])
        c.get_jobs("own", count=2)  # all from the node we are on: stay
        assert c.address == address(a)
    assert fake_job_id()  # helper sanity


def test_add_jobs_options_apply_to_every_body(client: Client) -> None:
    """Options are encoded once for the whole call; every body keeps its own bytes."""
    bodies = ["text é", b"\x00bin\r\n", bytearray(b"ba"), memoryview(b"mv")]
    ids = client.add_jobs("opts", bodies, ttl=600, retry=7, delay=30, batch_size=3)
    shown = [client.show(job_id) for job_id in ids]
    assert [s["body"] for s in shown] == ["text é".encode(), b"\x00bin\r\n", b"ba", b"mv"]
    assert {(s["retry"], s["delay"], s["state"]) for s in shown} == {(7, 30, "active")}
    assert all(job_id.endswith("-000b") for job_id in ids)  # 600 s = 10 minutes, odd: RETRY > 0
    with pytest.raises(TypeError):
        client.add_jobs("opts", [], ttl=None, delay=object())


def test_priorities(client: Client) -> None:
    """PRIORITY (an extension): higher first, the scans filter on it."""
    plain = client.add_job("pq", b"plain")
    urgent = client.add_job("pq", b"urgent", priority=9)
    bulk = client.add_jobs("pq", [b"b1", b"b2"], priority=3)
    assert [j.id for j in client.qpeek("pq", 5)] == [urgent, *bulk, plain]
    assert client.show(urgent)["priority"] == 9
    assert "priority" not in client.show(plain)
    assert set(client.jscan(min_priority=3)) == {urgent, *bulk}
    assert set(client.qscan(min_priority=9)) == {"pq"}
    assert client.qstat("pq")["priorities"] == [9, 1, 3, 2]
    assert [j.id for j in client.get_jobs("pq", count=4)] == [urgent, *bulk, plain]
    with pytest.raises(ValueError, match="priority must be between 0 and 31"):
        client.add_job("pq", b"x", priority=32)


def test_rate_limits(client: Client) -> None:
    """QLIMIT (an extension): set, read, enforced by GETJOB, lifted."""
    assert client.qlimit("rl") is None
    assert client.qlimit("rl", 2, 60_000) == (2, 60_000)
    assert client.qlimit("rl") == (2, 60_000)
    client.add_jobs("rl", [b"a", b"b", b"c"])
    assert len(client.get_jobs("rl", count=3, nohang=True)) == 2
    assert client.get_jobs("rl", nohang=True) == []
    stat = client.qstat("rl")
    assert stat["rate-limit"] == [2, 60_000] and stat["rate-limited"] == 2
    assert client.qlimit("rl", off=True) is None
    assert len(client.get_jobs("rl", nohang=True)) == 1
    with pytest.raises(ValueError, match="both"):
        client.qlimit("rl", 5)
    with pytest.raises(ValueError, match=">= 1"):
        client.qlimit("rl", 0, 1000)
    with pytest.raises(ResponseError, match="QLIMIT period"):
        client.qlimit("rl", 5, 100_000_000)


def test_users(server: DisqueProcess) -> None:
    """username (ACL, an extension): AUTH username password on every connection."""
    with Client(address(server)) as admin:
        admin.execute_command("ACL", "SETUSER", "worker", "on", ">wpw", "~jobs:*", "+@all")
    with Client(address(server), username="worker", password="wpw") as worker:
        job_id = worker.add_job("jobs:a", b"x")
        assert worker.execute_command("ACL", "WHOAMI") == b"worker"
        assert worker.ack(job_id) == 1  # routed by job ID: a second connection, same user
        from disque import NoPerm

        with pytest.raises(NoPerm, match="no permissions to access the 'other' queue"):
            worker.add_job("other", b"x")
    with pytest.raises(ValueError, match="username needs a password"):
        Client(address(server), username="worker")
    from disque.exceptions import AuthError

    with pytest.raises(AuthError), \
            Client(address(server), username="worker", password="nope") as bad:
        bad.ping()
