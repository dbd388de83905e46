"""The probes on the metrics port (disque/health.py): /healthz and /readyz,
during an AOF load, in a cluster, through a peer's outage, and a drain."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

from tests.support.cluster import TEST_NODE_TIMEOUT_MS, flags_of, join, node_id, wait_joined
from tests.support.process import free_port, wait_for


def probe(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET path; (0, "") when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def test_single_node_is_live_and_ready(server_factory) -> None:
    port = free_port()
    server_factory("--metrics-port", str(port))
    assert probe(port, "/healthz") == (200, "ok\n")
    assert wait_for(lambda: probe(port, "/readyz") == (200, "ready\n"), timeout=10)
    assert probe(port, "/nothing")[0] == 404


def test_probes_answer_during_a_long_aof_load(server_factory, tmp_path) -> None:
    """The metrics port is up while the AOF loads: /healthz 200 "loading"
    (a startupProbe sees a live node), /readyz 503 "loading"."""
    writer = server_factory("--appendonly", "yes", "--appendfsync", "no", name="data")
    client = writer.client()
    pipe = client.pipeline(transaction=False)
    body = "x" * 200
    for i in range(40_000):
        pipe.execute_command("ADDJOB", "q", body, 0)
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    writer.stop()

    port = free_port()
    with open(tmp_path / "loading.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "disque.server", "--port", "0", "--dir",
                                 str(writer.workdir), "--appendonly", "yes", "--metrics-port",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        seen: set[tuple[str, int, str]] = set()

        def loading_seen() -> bool:
            for path in ("/healthz", "/readyz"):
                status, text = probe(port, path)
                if status:
                    seen.add((path, status, text))
            return ("/healthz", 200, "ok\n") in seen
        wait_for(loading_seen, timeout=60, interval=0.02, message="the node to finish loading")
        assert ("/healthz", 200, "loading\n") in seen, seen
        assert ("/readyz", 503, "loading\n") in seen, seen
        assert wait_for(lambda: probe(port, "/readyz") == (200, "ready\n"), timeout=10)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_ready_stays_through_a_peer_outage_and_ends_with_the_drain(server_factory) -> None:
    """Ready once the cluster was reached; a peer that stops answering (a
    partition, as this node sees it) leaves it ready; SIGTERM's drain makes
    it unready while it still answers /healthz."""
    port = free_port()
    timeout = str(TEST_NODE_TIMEOUT_MS)
    a = server_factory("--cluster-node-timeout", timeout, "--metrics-port", str(port),
                       "--shutdown-timeout", "5")
    b = server_factory("--cluster-node-timeout", timeout)
    join([a, b])
    wait_joined([a, b])
    assert wait_for(lambda: probe(port, "/readyz") == (200, "ready\n"), timeout=10)
    b_id = node_id(b)

    os.kill(b.pid, signal.SIGSTOP)  # b stops answering: a's links to it stall
    try:
        wait_for(lambda: flags_of(a, b_id) & {"fail?", "fail"}, timeout=30, interval=0.1,
                 message="a to see b failing")
        assert probe(port, "/readyz") == (200, "ready\n")
        assert probe(port, "/healthz") == (200, "ok\n")
    finally:
        os.kill(b.pid, signal.SIGCONT)
    wait_for(lambda: not flags_of(a, b_id) & {"fail?", "fail"}, timeout=30,
             interval=0.1, message="b back")
    assert probe(port, "/readyz") == (200, "ready\n")

    # The drain: an ADDJOB waiting for its copy on b (stopped again, not yet
    # seen failing) keeps a draining; it is unready and still live meanwhile.
    os.kill(b.pid, signal.SIGSTOP)
    try:
        adder = socket.create_connection(("127.0.0.1", a.port))
        adder.sendall(b"ADDJOB q j 5000 REPLICATE 2\r\n")
        wait_for(lambda: a.client().info("clients")["blocked_clients"] == 1, timeout=10,
                 message="the ADDJOB to wait")
        os.kill(a.pid, signal.SIGTERM)
        assert wait_for(lambda: probe(port, "/readyz") == (503, "stopping\n"), timeout=5,
                        interval=0.005)
        assert probe(port, "/healthz") == (200, "ok\n")
    finally:
        os.kill(b.pid, signal.SIGCONT)
    adder.close()


def test_a_restarted_member_is_joining_until_it_reaches_a_peer(server_factory) -> None:
    """A node whose nodes.conf lists peers is not ready before one answers
    (or a node timeout passed: then it serves alone)."""
    port = free_port()
    a = server_factory("--cluster-node-timeout", "3000", "--metrics-port", str(port))
    b = server_factory("--cluster-node-timeout", "3000")
    join([a, b])
    wait_joined([a, b])
    b.kill()
    a.stop()
    a.start()
    assert probe(port, "/readyz") == (503, "joining\n")
    assert wait_for(lambda: probe(port, "/readyz") == (200, "ready\n"), timeout=15)
    assert "no peer answered within cluster-node-timeout" in a.log_text()
