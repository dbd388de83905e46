"""``disque redrive``: dead letters back to their queue, none lost, none added twice.

Against real nodes and the real CLI process.  The crash tests put a move in
the state a crash leaves it in (claimed, maybe added, not acknowledged),
with the same commands and journal records the redrive itself writes, then
run the CLI again and count the jobs in the target queue; one test kills
the CLI with SIGKILL in the middle of a run instead.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from disque.console.bulk import IDMP_WINDOW, TaskSpec, idmp_key
from tests.console.workload import (
    Consumer,
    assert_each_once,
    make_dead_letters,
    node_client,
    queue_length,
    registered_jobs,
)
from tests.support.cluster import TEST_NODE_TIMEOUT_MS, join, wait_joined
from tests.support.process import DisqueProcess, wait_for


def redrive(port: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(port), "redrive",
                           *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DISQUE_INTERPRETED": "1"})


def jobs_of(node: DisqueProcess, queue: str) -> list[dict]:
    with node_client(node) as c:
        return list(c.jscan(queue=queue, reply="all"))


def test_redrive_sends_each_job_back_to_the_queue_it_died_in(server: DisqueProcess) -> None:
    orders = [f"order-{i}".encode() for i in range(30)]
    invoices = [f"invoice-{i}".encode() for i in range(10)]
    make_dead_letters(server, "orders", orders)
    # Jobs of another queue dead-lettered into the same named queue.
    make_dead_letters(server, "invoices", invoices, dead_letter="orders:dead")
    result = redrive(server.port, "orders:dead", "--rate", "1000")
    assert result.returncode == 0, result.stderr
    assert "redrive orders:dead: finished: moved 40" in result.stdout
    with node_client(server) as c:
        assert c.qlen("orders:dead") == 0
        assert c.qlen("orders") == 30 and c.qlen("invoices") == 10
    moved = {j["body"]: j for j in jobs_of(server, "orders")}
    assert set(moved) == set(orders)
    job = next(iter(moved.values()))
    # The delivery limit comes along, counters start again; the dead-letter
    # mark is gone (it is a job of orders again).
    assert job["max-deliveries"] == 1 and job["nacks"] == 0
    assert job["dead-lettered-from"] is None and job["dead-letter-queue"] == "orders:dead"
    # An invoice dead-lettered into orders:dead keeps that dead-letter queue.
    invoice = jobs_of(server, "invoices")[0]
    assert invoice["dead-letter-queue"] == "orders:dead"


def test_a_redriven_job_keeps_its_headers(server: DisqueProcess) -> None:
    """A trace context or a tenant tag must survive the trip through the
    dead-letter queue and back: the move's ADDJOB carries SHOW's headers."""
    headers = [("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
               ("tenant", b"\x00acme\xff")]
    make_dead_letters(server, "traced", [b"job"], headers=headers)
    make_dead_letters(server, "plain", [b"other"], dead_letter="traced:dead")
    result = redrive(server.port, "traced:dead", "--rate", "1000")
    assert result.returncode == 0, result.stderr
    assert "finished: moved 2" in result.stdout
    with node_client(server) as c:
        traced = c.get_jobs("traced", nohang=True, with_headers=True)
        plain = c.get_jobs("plain", nohang=True, with_headers=True)
    assert [j.body for j in traced] == [b"job"]
    assert traced[0].headers == dict(headers)
    assert [j.body for j in plain] == [b"other"] and plain[0].headers == {}


def test_to_origin_contains_and_limit_choose_the_jobs(server: DisqueProcess) -> None:
    make_dead_letters(server, "a", [b"keep-1", b"move-1", b"move-2", b"move-3"])
    result = redrive(server.port, "a:dead", "--to", "elsewhere", "--contains", "move",
                     "--limit", "2")
    assert result.returncode == 0, result.stderr
    assert "moved 2" in result.stdout and "not matching 1" in result.stdout
    with node_client(server) as c:
        assert c.qlen("elsewhere") == 2 and c.qlen("a:dead") == 2 and c.qlen("a") == 0
    assert {j["body"] for j in jobs_of(server, "elsewhere")} <= {b"move-1", b"move-2",
                                                                 b"move-3"}
    make_dead_letters(server, "b", [b"from-b"])
    result = redrive(server.port, "a:dead", "--origin", "zzz*")
    assert "moved 0" in result.stdout and "not matching 2" in result.stdout


def test_the_rate_holds_the_redrive_back(server: DisqueProcess) -> None:
    make_dead_letters(server, "slow", [f"s{i}".encode() for i in range(40)])
    started = time.monotonic()
    result = redrive(server.port, "slow:dead", "--rate", "20")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert "moved 40" in result.stdout
    # 40 jobs at 20/s in batches of 2: the first batch at once, 19 more at
    # 0.1 s intervals (the process's own start-up comes on top).
    assert elapsed >= 1.9, elapsed


def test_bad_input_is_refused_with_a_clear_message(server: DisqueProcess, tmp_path) -> None:
    result = redrive(server.port, "x:dead", "--rate", "0")
    assert result.returncode == 2 and "rate must be between 0.1 and 10000" in result.stderr
    result = redrive(server.port, "x:dead", "--to", "x:dead")
    assert result.returncode == 2 and "must not be the queue the jobs are in" in result.stderr
    result = redrive(server.port, "x:dead", "--limit", "many")
    assert result.returncode == 2 and "limit must be a whole number" in result.stderr
    journal = tmp_path / "j.jsonl"
    assert redrive(server.port, "x:dead", "--journal", str(journal)).returncode == 0
    other = redrive(server.port, "y:dead", "--journal", str(journal))
    assert other.returncode == 2 and "is the journal of another task" in other.stderr
    down = subprocess.run([sys.executable, "-m", "disque.cli", "-p", "1", "redrive", "q:dead"],
                          capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and "Could not connect to Disque at 127.0.0.1:1" in down.stderr
    # A job in a dead-letter queue that never died anywhere: no origin to go back to.
    with node_client(server) as c:
        c.add_job("plain:dead", b"put here by hand", retry=5)
    orphan = redrive(server.port, "plain:dead")
    assert orphan.returncode == 0 and "skipped 1" in orphan.stdout
    assert "has no dead-letter origin: give a target queue" in orphan.stderr


# --------------------------------------------------------------------------
# Crashes in the middle of a move
# --------------------------------------------------------------------------

def _crash_after_add(server: DisqueProcess, journal: Path | None,
                     journal_added: bool) -> tuple[str, str, bytes]:
    """One dead letter moved as far as a crash lets it: claimed (DEQUEUE),
    journaled, added to its queue with the move's IDMP key, not acknowledged."""
    (old,) = make_dead_letters(server, "crash", [b"the only one"])
    address = f"127.0.0.1:{server.port}"
    with node_client(server) as c:
        assert c.dequeue(old) == 1
        shown = c.show(old)
        assert shown is not None
        new = c.add_job("crash", shown["body"], retry=shown["retry"], ttl=shown["ttl"],
                        max_deliveries=1, idmp=idmp_key(old), idmp_window=IDMP_WINDOW)
    if journal is not None:
        spec = TaskSpec.parse({"kind": "redrive", "queue": "crash:dead"})
        records = [{"r": "start", "id": "crashed", "user": "default", "created": time.time(),
                    "spec": spec.as_json()},
                   {"r": "claim", "old": old, "source": address, "add_on": address,
                    "target": "crash"}]
        if journal_added:
            records.append({"r": "added", "old": old, "new": new})
        journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    return old, new, shown["body"]


def _only_the_first_copy_is_left(server: DisqueProcess, old: str, new: str,
                                 body: bytes) -> None:
    jobs = jobs_of(server, "crash")
    assert [(j["id"], j["body"]) for j in jobs] == [(new, body)], jobs
    with node_client(server) as c:
        assert c.qlen("crash:dead") == 0
        wait_for(lambda: c.show(old) is None, 10, message="the old job to be collected")


@pytest.mark.parametrize("journal_added", [False, True], ids=["claim-journaled",
                                                              "add-journaled"])
def test_a_resumed_journal_finishes_the_move_without_a_second_job(
        server: DisqueProcess, tmp_path: Path, journal_added: bool) -> None:
    journal = tmp_path / "redrive.jsonl"
    old, new, body = _crash_after_add(server, journal, journal_added)
    result = redrive(server.port, "crash:dead", "--journal", str(journal))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "resuming: 1 moves started before are finished first" in result.stderr
    assert "moved 1" in result.stdout
    _only_the_first_copy_is_left(server, old, new, body)


def test_a_rerun_without_journal_finishes_the_move_without_a_second_job(
        server: DisqueProcess) -> None:
    old, new, body = _crash_after_add(server, None, False)
    # The claim lapses: the old job is queued again after its RETRY.
    with node_client(server) as c:
        wait_for(lambda: c.qlen("crash:dead") == 1, 10, message="the old job queued again")
    result = redrive(server.port, "crash:dead")
    assert result.returncode == 0, result.stderr
    assert "moved 1" in result.stdout
    _only_the_first_copy_is_left(server, old, new, body)


def test_sigkill_in_the_middle_then_the_same_command_loses_and_duplicates_nothing(
        server_factory, tmp_path: Path) -> None:
    nodes = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
             for _ in range(3)]
    join(nodes)
    wait_joined(nodes)
    bodies = [f"killed-{n}-{i}".encode() for n in range(3) for i in range(100)]
    for n, node in enumerate(nodes):
        make_dead_letters(node, "kq", bodies[n * 100:(n + 1) * 100])
    journal = tmp_path / "kill.jsonl"
    command = [sys.executable, "-m", "disque.cli", "-p", str(nodes[0].port), "redrive",
               "kq:dead", "--rate", "100", "--journal", str(journal)]
    env = {**os.environ, "DISQUE_INTERPRETED": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        def done_records() -> int:
            text = journal.read_text() if journal.exists() else ""
            return text.count('"r":"done"')

        wait_for(lambda: done_records() >= 60, 60, message="the redrive to move 60 jobs")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert 0 < queue_length(nodes, "kq:dead") < 300  # stopped in the middle
    consumer = Consumer(nodes, "kq").start()
    try:
        again = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
        assert again.returncode == 0, (again.stdout, again.stderr)
        wait_for(lambda: consumer.received() >= 300, 60,
                 message=lambda: f"300 jobs consumed, got {consumer.received()}")
        # Every copy acknowledged and collected: nothing left to come back.
        wait_for(lambda: registered_jobs(nodes) == 0, 30,
                 message=lambda: f"no job left, {registered_jobs(nodes)} are")
    finally:
        received = consumer.stop()
    assert_each_once(received, bodies)
    assert queue_length(nodes, "kq:dead") == 0


def test_a_resumed_claim_of_an_at_most_once_job_is_finished(server: DisqueProcess,
                                                            tmp_path: Path) -> None:
    # RETRY 0: a claimed (dequeued) job is never queued again, so the resume
    # cannot wait for that, as it does for a job a consumer may hold by now:
    # it would stay out of every queue until its TTL ends.
    address = f"127.0.0.1:{server.port}"
    with node_client(server) as c:
        old = c.add_job("amo", b"at most once", retry=0, replicate=1, ttl=3600)
        assert c.dequeue(old) == 1  # the claim, then a crash
    spec = TaskSpec.parse({"kind": "redrive", "queue": "amo", "to": "amo-next"})
    journal = tmp_path / "amo.jsonl"
    journal.write_text("".join(json.dumps(r) + "\n" for r in [
        {"r": "start", "id": "crashed", "user": "default", "created": time.time(),
         "spec": spec.as_json()},
        {"r": "claim", "old": old, "source": address, "add_on": address,
         "target": "amo-next"}]))
    result = redrive(server.port, "amo", "--to", "amo-next", "--journal", str(journal))
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert "moved 1" in result.stdout
    moved = jobs_of(server, "amo-next")
    assert [j["body"] for j in moved] == [b"at most once"] and moved[0]["retry"] == 0
    with node_client(server) as c:
        wait_for(lambda: c.show(old) is None, 10, message="the old job to be collected")


@pytest.mark.parametrize("claim", ["older-than-the-idmp-window", "node-restarted-without-aof"])
def test_a_resumed_claim_whose_idmp_key_may_be_gone_is_flagged_not_added_again(
        server: DisqueProcess, tmp_path: Path, claim: str) -> None:
    # The claim's ADDJOB may have happened (here it did), and the journal
    # does not say: its IDMP key is what makes a repeat add nothing, and it
    # may be gone (its window ended, or its node restarted without AOF).
    # The resume must not add the job again blindly: it says what to check.
    journal = tmp_path / "redrive.jsonl"
    old, new, _body = _crash_after_add(server, journal, journal_added=False)
    with node_client(server) as c:
        run_id = c.info("server")["server"]["run_id"]
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    if claim == "older-than-the-idmp-window":
        records[1].update({"t": time.time() - IDMP_WINDOW - 3600, "aof": True, "run": run_id})
    else:
        records[1].update({"t": time.time() - 60, "aof": False, "run": "f" * 40})
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = redrive(server.port, "crash:dead", "--journal", str(journal))
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert "to check 1" in result.stdout, result.stdout
    assert f"move of {old} to crash not verified" in result.stderr, result.stderr
    assert "Check whether crash holds a job with its body" in result.stderr
    # Nothing added a second time, nor the old job acknowledged.
    assert [j["id"] for j in jobs_of(server, "crash")] == [new]
    with node_client(server) as c:
        assert c.show(old) is not None
    assert '"r":"unverified"' in journal.read_text()
    # Run again: the journal keeps it flagged, and does not try it again.
    again = redrive(server.port, "crash:dead", "--journal", str(journal))
    assert "to check 1" in again.stdout and [j["id"] for j in jobs_of(server, "crash")] == [new]


def test_a_moves_added_record_is_on_disk_before_its_acknowledgement(
        server: DisqueProcess, tmp_path: Path) -> None:
    # A crash (of the machine, not only the process) between the ACKJOB and
    # an "added" record still in the page cache would leave a resume without
    # the new job's ID: the record is fsynced, like the claim before it.
    from disque.console.bulk import Journal, Task, new_task_id
    from disque.console.nodes import Credentials, Pool
    from disque.console.settings import Settings

    make_dead_letters(server, "synced", [b"s1", b"s2", b"s3"])
    written: list[tuple[str, bool]] = []

    class Recording(Journal):
        def append(self, records, sync: bool = False) -> None:  # type: ignore[no-untyped-def]
            records = list(records)
            written.extend((str(r.get("r")), sync) for r in records)
            super().append(records, sync)

    async def run() -> Task:
        address = f"127.0.0.1:{server.port}"
        pool = Pool((address,), Credentials(), Settings(nodes=(address,)))
        task = Task(new_task_id(), TaskSpec.parse({"kind": "redrive", "queue": "synced:dead"}),
                    "default", pool, Recording(tmp_path / "synced.jsonl"))
        await task.run()
        return task

    task = asyncio.run(run())
    assert task.state == "finished" and task.counts.done == 3, task.as_json()
    steps = [(kind, sync) for kind, sync in written if kind in ("claim", "added", "done")]
    assert steps.count(("added", True)) == 3 and ("added", False) not in steps, steps
    assert steps.index(("added", True)) < steps.index(("done", True)), steps


def test_redrive_over_tls_reaches_every_node_listed(server_factory, tmp_path: Path) -> None:
    """Two nodes with a tls-port (client certificates required): the CLI
    given --cacert/--cert/--key and both TLS addresses in --nodes moves the
    dead letters of both, each once (a TLS client cannot use the plain
    ports HELLO lists, so it dials only those)."""
    from tests.support.tls import make_certificates, tls_cluster

    certs = make_certificates(tmp_path / "certs")
    nodes, tls_ports = tls_cluster(server_factory, certs)
    bodies = {i: [f"tls-{i}-{n}".encode() for n in range(15)] for i in range(2)}
    for i, node in enumerate(nodes):
        make_dead_letters(node, "secure", bodies[i], replicate=1)
    seeds = ",".join(f"127.0.0.1:{p}" for p in tls_ports)
    tls = ["--cacert", str(certs.ca), "--cert", str(certs.client.cert),
           "--key", str(certs.client.key)]
    result = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(tls_ports[0]), *tls,
                             "redrive", "secure:dead", "--nodes", seeds, "--rate", "1000"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "DISQUE_INTERPRETED": "1"})
    assert result.returncode == 0, result.stderr
    assert "finished: moved 30" in result.stdout, result.stdout
    assert queue_length(nodes, "secure:dead") == 0
    moved = {j["id"]: j["body"] for node in nodes for j in jobs_of(node, "secure")}
    assert sorted(moved.values()) == sorted(bodies[0] + bodies[1])  # copies: one ID each
    # Without the certificate the node refuses the handshake: a clear error.
    refused = subprocess.run([sys.executable, "-m", "disque.cli", "-p", str(tls_ports[0]),
                              "--cacert", str(certs.ca), "redrive", "secure:dead"],
                             capture_output=True, text=True, timeout=60,
                             env={**os.environ, "DISQUE_INTERPRETED": "1"})
    assert refused.returncode == 1 and "Could not connect" in refused.stderr, refused.stderr
