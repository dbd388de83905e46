"""The cluster secret (``cluster-secret``, an extension): nodes that share it
form a cluster as usual; a process that can reach the bus port without it
cannot join, inject or delete jobs, and is logged.

Each attack is first run against a pair of nodes *without* the secret, where
it works (the bus trusts the sender ID a message claims), so the refusals
below are the secret's doing, not a badly forged message.
"""

from __future__ import annotations

import socket

import pytest

from disque.cluster import messages as m
from disque.cluster.auth import BusAuth
from disque.job import Job, JobIdGenerator, serialize_job
from tests.support.cluster import (
    ReferenceProcess,
    cluster_view,
    holders,
    meet,
    node_id,
    reference_server,
    show,
)
from tests.support.process import DisqueProcess, closed_by_peer, wait_for

SECRET = "correct horse battery staple"
STRANGER = "ab" * 20


def bus(node: DisqueProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.port + 10000), timeout=10)



def forged_repljob(target: DisqueProcess, impersonated: str) -> tuple[bytes, bytes]:
    """A REPLJOB claiming to come from ``impersonated``: (its job ID, the message)."""
    job_id = JobIdGenerator(impersonated).next_id(600, 60)
    job = Job(job_id, b"forged", b"rm -rf /", repl=2, etime=600_000, retry=60,
              delivered=frozenset((impersonated, node_id(target))))
    blob = serialize_job(job, bus_now_ms=0)
    return job_id, m.jobs_message(m.REPLJOB, impersonated, 7000, 0, [blob])


def deljob(job_id: bytes, impersonated: str) -> bytes:
    return m.job_id_message(m.DELJOB, impersonated, 7000, 0, job_id, 0)


def still_serving(node: DisqueProcess) -> None:
    client = node.client()
    job = client.execute_command("ADDJOB", "q", "body", 0)
    assert client.execute_command("SHOW", job) is not None


def refusals(node: DisqueProcess) -> list[str]:
    return [line for line in node.log_text().splitlines() if "Refused cluster bus" in line]


@pytest.fixture
def pair(make_cluster):
    def make(*args: str) -> tuple[DisqueProcess, DisqueProcess]:
        a, b = make_cluster(2, *args)
        return a, b
    return make


def test_nodes_sharing_the_secret_form_a_cluster_and_replicate(pair) -> None:
    a, b = pair("--cluster-secret", SECRET)
    job = a.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    assert {n.port for n in holders([a, b], job)} == {a.port, b.port}
    assert b.client().execute_command("GETJOB", "FROM", "q")[0][1] == job
    b.client().execute_command("ACKJOB", job)
    wait_for(lambda: not holders([a, b], job), message="the ACK to reach both copies")
    assert refusals(a) == [] and refusals(b) == []


def test_without_the_secret_the_forgeries_work(pair) -> None:
    """The control: the same forged messages, to nodes that have no secret."""
    a, b = pair()
    job_id, repljob = forged_repljob(a, node_id(b))
    real = b.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    with bus(a) as sock:
        sock.sendall(repljob + deljob(real, node_id(b)))
        wait_for(lambda: show(a, job_id) is not None, message="the forged copy to be stored")
        wait_for(lambda: show(a, real) is None, message="the forged DELJOB to delete the job")


def test_a_process_without_the_secret_cannot_meet_inject_or_delete(pair) -> None:
    a, b = pair("--cluster-secret", SECRET)
    real = b.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    assert show(a, real) is not None

    # MEET: no PONG, the link is closed, the stranger is not in the table.
    with bus(a) as sock:
        sock.sendall(m.gossip_message(m.MEET, STRANGER, 7000, 0, []))
        assert closed_by_peer(sock)
    assert STRANGER not in cluster_view(a)

    # REPLJOB and DELJOB impersonating b, unsigned, then signed with another secret.
    wrong = BusAuth(b"not the secret, but long enough")
    job_id, repljob = forged_repljob(a, node_id(b))
    for attempt in (repljob + deljob(real, node_id(b)),
                    wrong.sign(repljob) + wrong.sign(deljob(real, node_id(b)))):
        with bus(a) as sock:
            sock.sendall(attempt)
            assert closed_by_peer(sock)
    # The link was closed before the messages were read: they were refused,
    # not merely slow.  b's copy keeps a's alive, and nothing was stored.
    assert show(a, real) is not None and show(a, job_id) is None
    assert a.alive()
    still_serving(a)
    # Each attack was logged (rate-limited: the first report, then counts).
    lines = refusals(a)
    assert lines and "MEET" in lines[0] and "no cluster secret" in lines[0], lines
    # The cluster itself is unharmed.
    again = a.client().execute_command("ADDJOB", "q2", "body", 0, "REPLICATE", 2)
    assert {n.port for n in holders([a, b], again)} == {a.port, b.port}


def test_a_signed_message_altered_on_the_way_is_refused(pair) -> None:
    a, b = pair("--cluster-secret", SECRET)
    real = b.client().execute_command("ADDJOB", "q", "body", 0, "REPLICATE", 2)
    signed = BusAuth(SECRET.encode()).sign(deljob(b"D-00000000-" + b"0" * 29, node_id(b)))
    altered = signed[:-44] + real + signed[-4:]  # another job ID, the same tag
    with bus(a) as sock:
        sock.sendall(altered)
        assert closed_by_peer(sock)
    assert show(a, real) is not None
    # The same tag on the message it was made for is accepted (the link stays).
    with bus(a) as sock:
        sock.sendall(signed)
        assert not closed_by_peer(sock, timeout=0.5)


@pytest.mark.parametrize("args", [("--cluster-secret", "another secret, just as long"), ()],
                         ids=["wrong-secret", "no-secret"])
def test_a_node_without_the_right_secret_cannot_join(server_factory, args) -> None:
    a = server_factory("--cluster-secret", SECRET, "--cluster-node-timeout", "2000")
    b = server_factory(*args, "--cluster-node-timeout", "2000")
    meet(b, a)  # b says MEET to a: refused
    reason = "a wrong cluster secret" if args else "no cluster secret"
    wait_for(lambda: any(reason in line for line in refusals(a)),
             message="a to log the refused MEET")
    assert list(cluster_view(a)) == [node_id(a)]
    # a says MEET to b: b refuses a's signature (another secret) or answers
    # unsigned (none), a refuses that, and the handshake times out.
    meet(a, b)
    views: list[dict] = []

    def handshake_dropped() -> bool:
        views.append(cluster_view(a))
        return len(views[-1]) == 1

    wait_for(handshake_dropped, timeout=30, interval=0.05, message="a's handshake to time out")
    assert any(len(view) == 2 for view in views), "CLUSTER MEET started no handshake"
    assert all(info["flags"] & {"handshake", "myself"} for view in views
               for info in view.values()), views
    assert a.alive() and b.alive()


def test_the_secret_directive_is_checked(server_factory, tmp_path) -> None:
    import subprocess
    import sys

    for value, expected in (("short", "at least 16 characters"),):
        result = subprocess.run(
            [sys.executable, "-m", "disque.server", "--port", "0", "--dir", str(tmp_path),
             "--cluster-secret", value], capture_output=True, text=True, timeout=30)
        assert result.returncode == 1
        assert expected in result.stderr and "cluster-secret" in result.stderr
    node = server_factory("--cluster-secret", SECRET)
    client = node.client()
    with pytest.raises(Exception, match="Unsupported CONFIG parameter"):
        client.execute_command("CONFIG", "SET", "cluster-secret", "x" * 20)
    assert client.execute_command("CONFIG", "GET", "cluster-secret") == [
        b"cluster-secret", SECRET.encode()]


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server (DISQUE_REFERENCE_SERVER)")
def test_an_original_node_cannot_join_a_node_with_the_secret(server_factory, tmp_path) -> None:
    """The original ignores the reserved bytes (it takes our signed MEET), but
    its own messages are unsigned: it never joins, and neither side crashes."""
    ours = server_factory("--cluster-secret", SECRET, "--cluster-node-timeout", "2000")
    original = ReferenceProcess(tmp_path / "ref", "--cluster-node-timeout", "2000").start()
    try:
        meet(ours, original)
        meet(original, ours)
        wait_for(lambda: refusals(ours), message="our node to refuse the original's messages")
        views: list[dict] = []

        def alone() -> bool:
            views.append(cluster_view(ours))
            return len(views[-1]) == 1

        wait_for(alone, timeout=30, interval=0.1,
                 message="the handshake with the original to be dropped")
        assert all(info["flags"] & {"handshake", "myself"} for view in views
                   for info in view.values()), views
        assert ours.alive() and original.alive()
        assert original.client().ping()
        still_serving(ours)
    finally:
        original.kill()
