"""BGREWRITEAOF and automatic rewrites: compaction while the node keeps serving."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tests.persistence.conftest import (
    aof_file,
    crash_and_restart,
    persistence,
    present,
    wait_rewrite_done,
)
from tests.support.process import wait_for


def add_many(r: redis.Redis, count: int, queue: str = "q", body: bytes = b"x" * 100,
             batch: int = 500) -> list[bytes]:
    ids: list[bytes] = []
    for start in range(0, count, batch):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(batch, count - start)):
            pipe.execute_command("ADDJOB", queue, body, 0, "RETRY", 300)
        ids.extend(pipe.execute())
    return ids


def test_bgrewriteaof_compacts_and_reloads(aof_node) -> None:
    r = aof_node.client()
    ids = add_many(r, 2000)
    assert r.execute_command("ACKJOB", *ids[:1500]) == 1500
    before = persistence(r)["aof_current_size"]
    assert r.execute_command("BGREWRITEAOF") is True  # redis-py parses the status
    info = wait_rewrite_done(r)
    assert info["aof_last_bgrewrite_status"] == "ok"
    assert info["aof_rewrites"] == 1 and info["aof_last_rewrite_jobs"] == 500
    assert info["aof_current_size"] == info["aof_base_size"] < before / 3
    assert aof_file(aof_node).stat().st_size == info["aof_current_size"]
    assert not list(aof_node.workdir.glob("temp-rewriteaof-*"))
    r = crash_and_restart(aof_node)
    assert r.info("jobs")["registered_jobs"] == 500
    assert present(r, ids) == set(ids[1500:])


def test_bgrewriteaof_with_appendonly_off_writes_a_file(server_factory) -> None:
    node = server_factory()
    r = node.client()
    ids = add_many(r, 10)
    assert r.execute_command("BGREWRITEAOF")
    info = wait_rewrite_done(r)
    assert info["aof_state"] == "off" and info["aof_rewrites"] == 1
    assert aof_file(node).stat().st_size > 0
    node.kill()
    node.args += ["--appendonly", "yes"]
    node.start()
    assert present(node.client(), ids) == set(ids)


def test_automatic_rewrite_on_growth(server_factory) -> None:
    node = server_factory("--appendonly", "yes", "--auto-aof-rewrite-min-size", "100kb",
                          "--auto-aof-rewrite-percentage", "100")
    r = node.client()
    ids = add_many(r, 600)          # ~170 KB from an empty file: over the minimum
    wait_for(lambda: persistence(r)["aof_rewrites"] >= 1, timeout=10,
             message="an automatic rewrite")
    assert "Starting automatic rewriting of AOF" in node.log_text()
    wait_rewrite_done(r)
    r.execute_command("ACKJOB", *ids)
    r = crash_and_restart(node)
    assert r.info("jobs")["registered_jobs"] == 0


class Writer(threading.Thread):
    """Adds jobs in pipelines and acknowledges half of them, recording answers."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis(port=port, protocol=2, socket_timeout=30)
        self.alive_ids: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            ids = add_many(self.client, 64, queue="w", batch=64)
            self.alive_ids.update(ids)
            gone = ids[::2]
            pipe = self.client.pipeline(transaction=False)
            pipe.execute_command("ACKJOB", *gone[:16])
            pipe.execute_command("DELJOB", *gone[16:])
            pipe.execute()
            self.alive_ids.difference_update(gone)
            self.acked.update(gone)
        self.client.close()


class Pinger(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis(port=port, protocol=2, socket_timeout=30)
        self.worst = 0.0
        self.count = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.client.ping()
            self.worst = max(self.worst, time.perf_counter() - t0)
            self.count += 1
        self.client.close()


@pytest.mark.slow
def test_rewrite_racing_with_a_heavy_writer(server_factory, record_property) -> None:
    node = server_factory("--appendonly", "yes", "--appendfsync", "everysec")
    r = node.client()
    base = add_many(r, 60_000, body=b"b" * 64, batch=1000)
    r.execute_command("ACKJOB", *base[:20_000])
    writer = Writer(node.port)
    pinger = Pinger(node.port)
    writer.start()
    pinger.start()
    wait_for(lambda: len(writer.acked) > 1000, timeout=30, message="the writer")
    rewrites = 3
    for n in range(rewrites):
        assert r.execute_command("BGREWRITEAOF")
        info = wait_rewrite_done(r)
        assert info["aof_rewrites"] == n + 1 and info["aof_last_bgrewrite_status"] == "ok"
    pinger.stop.set()
    writer.stop.set()
    pinger.join()
    writer.join()
    result = {"writer_jobs": len(writer.alive_ids) + len(writer.acked),
              "worst_ping_ms": round(pinger.worst * 1000, 1), "pings": pinger.count,
              "max_step_ms": info["aof_last_rewrite_max_step_ms"]}
    record_property("rewrite_race", result)
    print(f"\nrewrite racing with a writer: {result}")
    r = crash_and_restart(node)
    expected = set(base[20_000:]) | writer.alive_ids
    assert r.info("jobs")["registered_jobs"] == len(expected)
    assert present(r, sorted(expected)) == expected
    assert not present(r, sorted(writer.acked | set(base[:20_000])))
    # The node was serving throughout (one event-loop stall would show here).
    assert pinger.worst < 1.0


def test_shutdown_during_a_rewrite_keeps_the_old_file(aof_node) -> None:
    r = aof_node.client()
    ids = add_many(r, 20_000, batch=1000)
    assert r.execute_command("BGREWRITEAOF")
    aof_node.restart()     # SIGTERM, probably in the middle of the rewrite
    r = aof_node.client()
    assert not list(aof_node.workdir.glob("temp-rewriteaof-*"))
    assert present(r, ids) == set(ids)
