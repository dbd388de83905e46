"""The console over TLS: nodes with a ``tls-port`` that require client
certificates, the console given its certificate and every node's TLS
address (HELLO lists plain ports, which a TLS client cannot use)."""

from __future__ import annotations

from contextlib import closing

import httpx

from tests.console.conftest import api, csrf_of
from tests.console.workload import make_dead_letters, node_client, queue_length
from tests.support.process import wait_for
from tests.support.tls import make_certificates, tls_cluster


def test_pages_redrive_and_bulk_move_over_tls(server_factory, console_factory,
                                              tmp_path) -> None:
    certs = make_certificates(tmp_path / "certs")
    nodes, tls_ports = tls_cluster(server_factory, certs)
    bodies = {i: [f"tls-{i}-{n}".encode() for n in range(10)] for i in range(2)}
    for i, node in enumerate(nodes):
        make_dead_letters(node, "vault", bodies[i], replicate=1)
        with node_client(node) as c:
            c.add_jobs("outbox", [f"out-{i}-{n}".encode() for n in range(5)], replicate=1)
    ids = {node_client(n).cluster_myid() for n in nodes}
    seeds = ",".join(f"127.0.0.1:{p}" for p in tls_ports)
    console = console_factory([], "--nodes", seeds, "--cacert", str(certs.ca),
                              "--cert", str(certs.client.cert), "--key", str(certs.client.key))
    with closing(httpx.Client(base_url=console.url, timeout=30)) as web:
        overview = api(web, "/api/overview")
        assert {n["id"] for n in overview["nodes"]} == ids
        assert all(n["state"] == "ok" for n in overview["nodes"]), overview["nodes"]
        assert {n["address"] for n in overview["nodes"]} == {
            f"127.0.0.1:{p}" for p in tls_ports}
        token = csrf_of(web, "/dead-letters")
        started = web.post("/api/actions/redrive", json={"queue": "vault:dead", "rate": 1000},
                           headers={"X-CSRF-Token": token})
        assert started.status_code == 202, started.text
        task_id = started.json()["id"]

        def finished(task_id: str) -> dict | None:
            task = api(web, f"/api/tasks/{task_id}")
            return task if task["state"] in ("finished", "failed", "cancelled") else None

        task = wait_for(lambda: finished(task_id), 60, message="the redrive over TLS")
        assert task["state"] == "finished" and task["counts"]["done"] == 20, task
        moved = web.post("/api/actions/bulk", json={"op": "move", "queue": "outbox",
                                                    "to": "sent", "rate": 1000},
                         headers={"X-CSRF-Token": token})
        assert moved.status_code == 202, moved.text
        task = wait_for(lambda: finished(moved.json()["id"]), 60, message="the bulk move")
        assert task["state"] == "finished" and task["counts"]["done"] == 10, task
    assert queue_length(nodes, "vault:dead") == 0 and queue_length(nodes, "outbox") == 0
    assert queue_length(nodes, "vault") == 20 and queue_length(nodes, "sent") == 10
