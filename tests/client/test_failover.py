"""Reconnecting and moving between nodes, with real server processes."""

from __future__ import annotations

import threading

import pytest

from disque import Client, ConnectionFailed, Job
from tests.client.conftest import address
from tests.support.process import DisqueProcess, wait_for


def test_reconnects_after_the_server_restarts(server: DisqueProcess) -> None:
    with Client(address(server), reconnect_timeout=10) as c:
        node = c.connect().node_id
        server.restart()
        assert c.ping() == b"PONG"
        assert c.node_id == node  # same node (nodes.conf), same port
        assert c.add_job("q", b"x")


def test_blocked_consumer_survives_a_restart(server: DisqueProcess) -> None:
    got: list[Job] = []
    consumer = Client(address(server), reconnect_timeout=10)
    thread = threading.Thread(target=lambda: got.extend(consumer.get_jobs("q")))
    thread.start()
    with Client(address(server)) as producer:
        wait_for(lambda: producer.info("clients")["clients"]["blocked_clients"] == 1,
                 message="consumer blocked")
    server.restart()
    with Client(address(server)) as producer:
        wait_for(lambda: producer.info("clients")["clients"]["blocked_clients"] == 1,
                 message="consumer blocked again after the restart")
        job_id = producer.add_job("q", b"after")
    thread.join(10)
    assert [j.id for j in got] == [job_id]
    consumer.close()


def test_first_address_down_uses_the_second(server_factory) -> None:
    a, b = server_factory(), server_factory()
    a.kill()
    for randomize in (False, True, True, True):
        with Client([address(a), address(b)], randomize=randomize,
                    reconnect_timeout=0) as c:
            assert c.ping() == b"PONG"
            assert c.address == address(b)


def test_dropped_connection_moves_to_another_node(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client([address(a), address(b)], randomize=False) as c:
        assert c.connect() and c.address == address(a)
        a.kill()
        job_id = c.add_job("q", b"x")
        assert c.address == address(b)
        assert job_id[2:10] == c.node_id[:8]
        assert {n.port for n in c.nodes} == {a.port, b.port}


def test_no_retries_raises_then_reconnects(server: DisqueProcess) -> None:
    with Client(address(server), max_retries=0, reconnect_timeout=10) as c:
        c.connect()
        server.restart()
        with pytest.raises(ConnectionFailed):
            c.ping()  # the old connection died under this command: not re-sent
        assert c.ping() == b"PONG"  # the next command reconnects


def test_every_node_down_is_connection_failed(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client([address(a), address(b)], reconnect_timeout=0.3, retry_backoff=0.05) as c:
        c.connect()
        a.kill()
        b.kill()
        with pytest.raises(ConnectionFailed) as err:
            c.ping()
        assert set(err.value.errors) == {address(a), address(b)}


def test_leaving_moves_to_another_node(server_factory) -> None:
    a, b = server_factory(), server_factory()
    with Client(address(b)) as cb:
        job_id = cb.add_job("q", b"on-b")
    with Client([address(a), address(b)], randomize=False) as c:
        c.connect()
        assert c.address == address(a)
        leaving_id = c.node_id
        c.cluster_leaving(True)
        (job,) = c.get_jobs("q")  # A answers -LEAVING instead of blocking
        assert job.id == job_id and c.address == address(b)
        assert {n.id: n.priority for n in c.nodes}[leaving_id] == 100
        # Later connections keep away from the leaving node.
        c.close()
        c.connect()
        assert c.address == address(b)


def test_leaving_while_blocked_moves_the_consumer(server_factory) -> None:
    a, b = server_factory(), server_factory()
    got: list[Job] = []
    consumer = Client([address(a), address(b)], randomize=False)
    consumer.connect()
    thread = threading.Thread(target=lambda: got.extend(consumer.get_jobs("q")))
    thread.start()
    with Client(address(a)) as ca, Client(address(b)) as cb:
        wait_for(lambda: ca.info("clients")["clients"]["blocked_clients"] == 1,
                 message="consumer blocked on A")
        ca.cluster_leaving(True)
        wait_for(lambda: cb.info("clients")["clients"]["blocked_clients"] == 1,
                 message="consumer blocked on B")
        job_id = cb.add_job("q", b"x")
    thread.join(10)
    assert [j.id for j in got] == [job_id]
    assert consumer.address == address(b)
    consumer.close()


def test_batches_resend_leaving_replies_elsewhere(server_factory) -> None:
    """A pipelined batch whose commands get -LEAVING is re-sent on another node."""
    a, b = server_factory(), server_factory()
    with Client(address(b)) as cb:
        cb.add_jobs("q", [b"1", b"2"])
    with Client([address(a), address(b)], randomize=False) as c:
        c.connect()
        c.cluster_leaving(True)
        replies = c._execute_many([c_req for c_req in _getjob_requests(2)])
        assert [len(r) for r in replies] == [1, 1]
        assert c.address == address(b)


def _getjob_requests(n: int) -> list:
    from disque.client import _wire as w
    return [w.get_jobs(["q"], timeout_ms=1000) for _ in range(n)]


def test_a_pipeline_cut_midway_resends_only_what_was_not_answered(
        server: DisqueProcess) -> None:
    """QUIT in the middle of a pipeline: the ADDJOBs answered before it keep
    their IDs and are not added again; those after it are sent again."""
    from disque.client import _wire as w

    with Client(address(server)) as c:
        reqs = ([w.request("ADDJOB", "q", f"job{i}", 0) for i in range(3)]
                + [w.request("QUIT")]
                + [w.request("ADDJOB", "q", f"job{i}", 0) for i in range(3, 6)])
        results = c._execute_many(reqs)
        assert results[3] == b"OK"
        ids = [r.decode() for i, r in enumerate(results) if i != 3]
        assert len(set(ids)) == 6 and all(i.startswith("D-") for i in ids)
        assert c.qlen("q") == 6  # each job once
        assert sorted(j.body for j in c.get_jobs("q", count=10, nohang=True)) == [
            f"job{i}".encode() for i in range(6)]
