"""Every error class, triggered on a real server."""

from __future__ import annotations

import os
import signal
import socket
import threading

import pytest

from disque import (
    Acked,
    AuthError,
    BadId,
    Client,
    ConnectionFailed,
    DisqueError,
    Leaving,
    MaxLen,
    NoAuth,
    NoJob,
    NoRepl,
    OutOfMemory,
    Paused,
    ResponseError,
    TooLate,
)
from tests.client.conftest import address, fake_job_id
from tests.support.cluster import join, wait_joined
from tests.support.process import DisqueProcess, wait_for


def test_bad_id(client: Client) -> None:
    for call in (lambda: client.ack("not-an-id"), lambda: client.show("D-123"),
                 lambda: client.working("x"), lambda: client.nack(fake_job_id(), "bad")):
        with pytest.raises(BadId) as err:
            call()
        assert err.value.code == "BADID"


def test_no_job(client: Client) -> None:
    with pytest.raises(NoJob):
        client.working(fake_job_id())


def test_paused(client: Client) -> None:
    client.pause("pq", "in")
    with pytest.raises(Paused):
        client.add_job("pq", b"x")


def test_maxlen(client: Client) -> None:
    client.add_job("mq", b"1", maxlen=1)
    with pytest.raises(MaxLen):
        client.add_job("mq", b"2", maxlen=1)


def test_norepl_on_a_single_node(client: Client) -> None:
    with pytest.raises(NoRepl):
        client.add_job("rq", b"x", replicate=3)


def test_too_late(client: Client) -> None:
    job_id = client.add_job("tq", b"x", ttl=1)

    def refused() -> bool:
        try:
            client.working(job_id)
        except TooLate:
            return True
        return False

    wait_for(refused, timeout=5, message="WORKING refused after half the TTL")


def test_out_of_memory(client: Client) -> None:
    client.add_jobs("oq", [b"y" * 1000] * 5)
    # Exactly what the node uses now: full (a smaller limit is refused).
    client.config_set("maxmemory", client.info("memory")["memory"]["used_memory"])
    with pytest.raises(OutOfMemory) as err:
        client.add_job("oq", b"x")
    assert err.value.code == "OOM"


def test_leaving_with_nowhere_else_to_go(server: DisqueProcess) -> None:
    with Client(address(server), max_retries=0) as c:
        c.cluster_leaving(True)
        with pytest.raises(Leaving):
            c.get_jobs("lq")
    with Client(address(server), max_retries=2, reconnect_timeout=0) as c:
        with pytest.raises(Leaving):  # re-tried twice on the same lone node
            c.get_jobs("lq", timeout_ms=100)
        assert c.nodes[0].priority == 100
        assert c.get_jobs("lq", nohang=True) == []  # NOHANG never blocks: no LEAVING


def test_leaving_unblocks_a_waiting_consumer(server: DisqueProcess, client: Client) -> None:
    errors: list[BaseException] = []
    consumer = Client(address(server), max_retries=0)

    def consume() -> None:
        try:
            consumer.get_jobs("lq2")
        except DisqueError as exc:
            errors.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: client.info("clients")["clients"]["blocked_clients"] == 1,
             message="consumer blocked")
    client.cluster_leaving(True)
    thread.join(10)
    assert [type(e) for e in errors] == [Leaving]
    consumer.close()


def test_acked(server_factory) -> None:
    """WORKING on an acked job that still exists: a two-node cluster whose
    other node is paused holds the ACK (its GC waits for that copy)."""
    a, b = (server_factory("--cluster-node-timeout", "60000") for _ in range(2))
    join([a, b])
    wait_joined([a, b])
    with Client(address(a), max_retries=0) as c:
        job_id = c.add_job("aq", b"x", replicate=2)
        os.kill(b.pid, signal.SIGSTOP)
        try:
            c.ack(job_id)
            with pytest.raises(Acked) as err:
                c.working(job_id)
            assert err.value.code == "ACKED"
        finally:
            os.kill(b.pid, signal.SIGCONT)


def test_generic_response_errors(client: Client) -> None:
    with pytest.raises(ResponseError) as err:
        client.add_job("q", b"x", delay=10, ttl=5)
    assert type(err.value) is ResponseError and err.value.code == "ERR"
    assert "DELAY is greater than TTL" in err.value.message
    with pytest.raises(ResponseError, match="COUNT must be a number greater than zero"):
        client.get_jobs("q", count=0)
    with pytest.raises(ResponseError, match="syntax error"):
        client.pause("q", "sideways")
    assert client.ping() == b"PONG"  # errors leave the connection usable


def test_auth(server_factory) -> None:
    secured = server_factory("--requirepass", "s3cret")
    with Client(address(secured)) as c, pytest.raises(NoAuth):
        c.ping()
    with Client(address(secured), password="wrong") as c, pytest.raises(AuthError):
        c.connect()
    with Client(address(secured), password="s3cret") as c:
        assert c.add_job("q", b"x")
    open_node = server_factory()
    with Client(address(open_node), password="x") as c, pytest.raises(AuthError):
        c.ping()


def test_connection_failed_names_every_address() -> None:
    ports = []
    for _ in range(2):
        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    c = Client([f"127.0.0.1:{p}" for p in ports], reconnect_timeout=0, connect_timeout=1)
    with pytest.raises(ConnectionFailed) as err:
        c.ping()
    assert isinstance(err.value, ConnectionError)
    assert set(err.value.errors) == {f"127.0.0.1:{p}" for p in ports}


def test_a_server_that_is_not_disque_is_skipped(server: DisqueProcess) -> None:
    """A node whose HELLO reply is not Disque's counts as unreachable."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def fake_redis() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(b"+OK\r\n")
            conn.recv(1024)

    thread = threading.Thread(target=fake_redis, daemon=True)
    thread.start()
    with Client([f"127.0.0.1:{port}", address(server)], randomize=False) as c:
        assert c.ping() == b"PONG"
        assert c.address == address(server)
    listener.close()
    thread.join(5)
