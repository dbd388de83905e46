"""Blocked GETJOB clients: arrival order, disconnects, pipelining behind a block."""

from __future__ import annotations

import socket
import threading

import redis

from tests.support.process import DisqueProcess, wait_for


def blocked(r: redis.Redis) -> int:
    return r.info("clients")["blocked_clients"]


def test_blocked_clients_are_served_in_arrival_order(server: DisqueProcess) -> None:
    r = server.client()
    results: dict[int, object] = {}

    def consume(index: int) -> None:
        client = server.client()
        results[index] = client.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", "q")

    threads = []
    for index in range(3):
        thread = threading.Thread(target=consume, args=(index,))
        thread.start()
        threads.append(thread)
        wait_for(lambda i=index: blocked(r) == i + 1, 5, message=f"consumer {index} blocked")
    ids = [r.execute_command("ADDJOB", "q", f"job{i}", 0) for i in range(3)]
    for thread in threads:
        thread.join(5)
    assert [results[i][0][1] for i in range(3)] == ids
    assert blocked(r) == 0


def test_blocked_on_several_queues_gets_first_available(server: DisqueProcess) -> None:
    r = server.client()
    out: list[object] = []
    consumer = server.client()
    thread = threading.Thread(target=lambda: out.append(consumer.execute_command(
        "GETJOB", "WITHCOUNTERS", "FROM", "a", "b")))
    thread.start()
    wait_for(lambda: blocked(r) == 1, 5, message="blocked")
    job_id = r.execute_command("ADDJOB", "b", "from-b", 0)
    thread.join(5)
    assert out == [[[b"b", job_id, b"from-b", b"nacks", 0, b"additional-deliveries", 0]]]
    stat = r.execute_command("QSTAT", "b")
    assert stat[stat.index(b"blocked") + 1] == 0
    # "a" was made by the GETJOB alone and never held a job: gone with its reader.
    assert r.execute_command("QSTAT", "a") is None


def test_disconnected_blocked_client_leaks_nothing(server: DisqueProcess) -> None:
    r = server.client()
    for _ in range(20):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"*4\r\n$6\r\nGETJOB\r\n$4\r\nFROM\r\n$1\r\nq\r\n$1\r\nz\r\n")
        wait_for(lambda: blocked(r) == 1, 5, message="blocked")
        sock.close()
        wait_for(lambda: blocked(r) == 0, 5, message="unblocked after disconnect")
    # The queues the GETJOBs made, for nothing, went with their readers.
    assert r.execute_command("QSTAT", "q") is None
    assert r.execute_command("QSTAT", "z") is None
    job_id = r.execute_command("ADDJOB", "q", "kept", 0)
    # Nobody is waiting any more: the job stays queued for the next consumer.
    assert r.execute_command("QLEN", "q") == 1
    assert r.execute_command("GETJOB", "FROM", "q")[0][1] == job_id


def test_commands_pipelined_behind_a_blocked_getjob_run_after_it(server: DisqueProcess) -> None:
    r = server.client()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"GETJOB FROM q\r\nPING\r\n")
    wait_for(lambda: blocked(r) == 1, 5, message="blocked")
    job_id = r.execute_command("ADDJOB", "q", "x", 0)
    sock.settimeout(5)
    data = b""
    while not data.endswith(b"+PONG\r\n"):
        chunk = sock.recv(4096)
        assert chunk, "connection closed"
        data += chunk
    assert data == b"*1\r\n*3\r\n$1\r\nq\r\n$40\r\n" + job_id + b"\r\n$1\r\nx\r\n+PONG\r\n"
    sock.close()


def test_leaving_unblocks_waiting_clients(server: DisqueProcess) -> None:
    r = server.client()
    errors: list[str] = []
    consumer = server.client()

    def consume() -> None:
        try:
            consumer.execute_command("GETJOB", "FROM", "q")
        except redis.ResponseError as err:
            errors.append(str(err))

    thread = threading.Thread(target=consume)
    thread.start()
    wait_for(lambda: blocked(r) == 1, 5, message="blocked")
    assert r.execute_command("CLUSTER", "LEAVING", "yes") == b"OK"
    thread.join(5)
    assert errors and errors[0].startswith("LEAVING ")
    assert r.execute_command("CLUSTER", "LEAVING") == b"yes"
    hello = r.execute_command("HELLO")
    assert hello[2][3] == b"100"  # worst priority: clients pick another node
    assert r.execute_command("CLUSTER", "LEAVING", "no") == b"OK"
    assert r.execute_command("HELLO")[2][3] == b"1"


def test_many_commands_behind_a_block_all_answer_in_order(server: DisqueProcess) -> None:
    """Megabytes of replies queued behind a blocked GETJOB go out over several loop turns."""
    from tests.server.test_protocol_raw import Resp, pack

    payload = b"p" * 1024
    count = 3000  # ~3 MB of replies: many times the node's per-turn drain limit
    with Resp(server.port) as waiter, Resp(server.port) as producer:
        waiter.send(pack("GETJOB", "FROM", "drain-q")
                    + b"".join(pack("ECHO", b"%d:" % i + payload) for i in range(count)))
        r = redis.Redis(port=server.port, protocol=2)
        wait_for(lambda: blocked(r) == 1, message="the GETJOB to block")
        job_id = producer.call("ADDJOB", "drain-q", "job", 0)
        assert waiter.read() == [[b"drain-q", job_id, b"job"]]
        for i in range(count):
            assert waiter.read() == b"%d:" % i + payload
        assert waiter.call("PING") == b"PONG"
        r.close()


def test_a_job_handed_to_a_waiting_client_is_queued_again_after_its_retry(
        server: DisqueProcess) -> None:
    """The hand-over answers the consumer first and schedules the job after:
    the job must still come back to its queue when RETRY passes unacked."""
    r = server.client()
    consumer_client = server.client()
    out: list[object] = []
    consumer = threading.Thread(target=lambda: out.append(consumer_client.execute_command(
        "GETJOB", "TIMEOUT", 10_000, "FROM", "qr")))
    consumer.start()
    wait_for(lambda: blocked(r) == 1, 5, message="the consumer blocked")
    handed = r.execute_command("ADDJOB", "qr", "body", 0, "RETRY", 1)
    consumer.join(5)
    assert out == [[[b"qr", handed, b"body"]]]
    assert r.execute_command("QLEN", "qr") == 0
    # RETRY 1 s, with the original's jitter of up to half a second either way.
    wait_for(lambda: r.execute_command("QLEN", "qr") == 1, 5,
             message="the unacked job queued again after its RETRY")
    again = r.execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "qr")
    assert again[0][1] == handed
    entry = dict(zip(again[0][3::2], again[0][4::2], strict=True))
    assert entry[b"additional-deliveries"] == 1


def test_a_job_handed_to_a_waiting_client_is_counted_as_one_fetched(
        server: DisqueProcess) -> None:
    """A job added to an empty queue a client waits on goes straight to the
    client: the queue's counters, the job's state and the memory it counts
    are those of a job queued and then fetched."""
    r = server.client()
    consumer_client = server.client()
    out: list[object] = []

    def consume(queue: str) -> None:
        out.append(consumer_client.execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", queue))

    memory = [r.info("memory")["used_memory"]]
    consumer = threading.Thread(target=consume, args=("qa",))
    consumer.start()
    wait_for(lambda: blocked(r) == 1, 5, message="the consumer blocked")
    handed = r.execute_command("ADDJOB", "qa", "body", 0, "RETRY", 30)
    consumer.join(5)
    assert out == [[[b"qa", handed, b"body"]]]
    reply = r.execute_command("QSTAT", "qa")
    stat = dict(zip(reply[::2], reply[1::2], strict=True))
    assert (stat[b"len"], stat[b"jobs-in"], stat[b"jobs-out"], stat[b"blocked"]) == (0, 1, 1, 0)
    show = r.execute_command("SHOW", handed)
    assert dict(zip(show[::2], show[1::2], strict=True))[b"state"] == b"active"
    assert r.execute_command("ACKJOB", handed) == 1
    memory.append(r.info("memory")["used_memory"])
    # The same through the queue: added, then fetched.
    queued = r.execute_command("ADDJOB", "qb", "body", 0, "RETRY", 30)
    consume("qb")
    assert out[-1] == [[b"qb", queued, b"body"]]
    assert r.execute_command("ACKJOB", queued) == 1
    memory.append(r.info("memory")["used_memory"])
    assert memory[1] - memory[0] == memory[2] - memory[1]
