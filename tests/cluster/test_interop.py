"""Mixed clusters: our nodes and the original C server in one cluster.

The original is found through ``DISQUE_REFERENCE_SERVER`` (``.ci/run`` sets
it when the reference build is beside the checkout); without it these tests
skip.  This is the migration path of every existing Disque user: join our
nodes to a running cluster of originals, or the other way round.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.cluster import (
    TEST_NODE_TIMEOUT_MS,
    ReferenceProcess,
    cluster_info,
    flags_of,
    meet,
    node_id,
    reference_server,
    show,
    wait_joined,
)
from tests.support.process import DisqueProcess, wait_for

pytestmark = pytest.mark.skipif(
    reference_server() is None,
    reason="needs the original server: set DISQUE_REFERENCE_SERVER to its disque-server")

TIMEOUT_ARGS = ("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))


@pytest.fixture
def mixed(server_factory, tmp_path) -> tuple[list[DisqueProcess], list[ReferenceProcess]]:
    ours = [server_factory(*TIMEOUT_ARGS) for _ in range(2)]
    originals = [ReferenceProcess(tmp_path / f"ref{i}", *TIMEOUT_ARGS).start() for i in range(2)]
    yield ours, originals
    for ref in originals:
        ref.kill()


def join_everybody(ours: list[DisqueProcess],
                   originals: list[ReferenceProcess]) -> list[DisqueProcess]:
    """All four nodes introduced to the first (one of ours); the mesh formed."""
    everybody = [*ours, *originals]
    for other in everybody[1:]:
        meet(everybody[0], other)
    wait_joined(everybody)
    return everybody


def test_ours_and_originals_join_both_ways(mixed) -> None:
    ours, originals = mixed
    meet(ours[0], originals[0])      # ours introduces an original
    meet(originals[1], ours[1])      # an original introduces ours
    meet(ours[0], ours[1])           # the rest is gossip
    everybody = [*ours, *originals]
    wait_joined(everybody)
    for node in everybody:
        hello = node.client().execute_command("HELLO")
        assert len(hello) - 2 == 4 and {int(e[3]) for e in hello[2:]} == {1}


def test_failures_and_leaving_are_seen_across_implementations(mixed) -> None:
    ours, originals = mixed
    everybody = join_everybody(ours, originals)

    leaving = node_id(ours[0])
    ours[0].client().execute_command("CLUSTER", "LEAVING", "yes")
    for ref in originals:
        wait_for(lambda ref=ref: "leaving" in flags_of(ref, leaving), timeout=10,
                 message="the original to see our LEAVING flag")
    ours[0].client().execute_command("CLUSTER", "LEAVING", "no")

    # An original dies: ours flag it fail? then (with the other original) fail.
    dead_original = node_id(originals[1])
    originals[1].kill()
    for node in (*ours, originals[0]):
        wait_for(lambda node=node: "fail" in (flags_of(node, dead_original) or set()),
                 timeout=20, message="FAIL of the killed original")
    # It comes back (its nodes.conf keeps the ID) and our nodes clear the flag.
    originals[1].start()
    for node in (*ours, originals[0]):
        wait_for(lambda node=node: flags_of(node, dead_original) <= {"noflags"}, timeout=20,
                 message="our nodes to clear FAIL of the restarted original")
    # One of ours dies: the originals agree with our survivor (3 of 4 is a majority).
    dead_ours = node_id(ours[1])
    ours[1].kill()
    for node in (ours[0], *originals):
        wait_for(lambda node=node: "fail" in (flags_of(node, dead_ours) or set()),
                 timeout=20, message="FAIL of our killed node")
    # It comes back with its ID and the originals clear the flag on its PONG.
    ours[1].start(port=ours[1].port)
    assert node_id(ours[1]) == dead_ours
    wait_joined(everybody)


def test_jobs_replicate_and_gc_across_implementations(mixed) -> None:
    ours, originals = mixed
    everybody = join_everybody(ours, originals)
    for creator, acker in ((ours[0], originals[1]), (originals[0], ours[1])):
        job_id = creator.client().execute_command("ADDJOB", "q", "mixed", 5000,
                                                  "REPLICATE", 4, "RETRY", 30)
        copies = {n.port: show(n, job_id) for n in everybody}
        assert all(copies.values()), copies  # the job blob travels both ways
        assert {c[b"body"] for c in copies.values()} == {b"mixed"}
        assert {c[b"queue"] for c in copies.values()} == {b"q"}
        assert acker.client().execute_command("ACKJOB", job_id) == 1
        wait_for(lambda job_id=job_id: not any(show(n, job_id) for n in everybody),
                 timeout=20, message="the ACK GC to reach every implementation")


def test_consumers_get_jobs_queued_on_the_other_implementation(mixed) -> None:
    ours, originals = mixed
    join_everybody(ours, originals)
    for holder, consumer in ((originals[0], ours[0]), (ours[1], originals[1])):
        job_id = holder.client().execute_command("ADDJOB", "fed", "x", 0, "REPLICATE", 1)
        job = consumer.client().execute_command("GETJOB", "TIMEOUT", 10000, "FROM", "fed")
        assert job and job[0][1] == job_id, (holder.port, consumer.port, job)
        assert consumer.client().execute_command("ACKJOB", job_id) == 1
        pair = (holder, consumer)
        wait_for(lambda job_id=job_id, pair=pair: not any(show(n, job_id) for n in pair),
                 timeout=20, message="the ACK to reach both implementations")


def test_jobs_are_pushed_to_waiting_consumers_across_implementations(mixed) -> None:
    """A consumer that waits before the job exists: our node remembers the
    original's NEEDJOBS and pushes the job at once (a YOURJOBS the original
    did not ask for at that moment, which it takes); the original answers the
    NEEDJOBS our node renews every second while its consumer waits.  Our
    node sends the original no withdrawal (NEEDJOBS(0) would ask it for a
    job), and the cluster never loses or doubles a job."""
    ours, originals = mixed
    join_everybody(ours, originals)
    a, ref = ours[0], originals[0]
    for holder, waiter, within_s in ((a, ref, 1.0), (ref, a, 5.0)):
        queue = f"push-{holder.port}"
        result: list[object] = []
        consumer = threading.Thread(target=lambda q=queue, w=waiter, r=result: r.append(
            w.client().execute_command("GETJOB", "TIMEOUT", 15_000, "FROM", q)))
        consumer.start()
        wait_for(lambda w=waiter: int(w.client().info("clients")["blocked_clients"]) == 1,
                 timeout=10, message="the consumer to block")
        if holder is a:  # the original's NEEDJOBS reached our node
            wait_for(lambda: cluster_info(a)["cluster_federation_asks"] != "0", timeout=10,
                     message="our node to remember the original's ask")
        pushed = int(cluster_info(a)["cluster_stats_yourjobs_pushed"])
        started = time.monotonic()
        job_id = holder.client().execute_command("ADDJOB", queue, "x", 0, "REPLICATE", 1)
        consumer.join(15)
        took = time.monotonic() - started
        assert result and result[0] and result[0][0][1] == job_id, (holder.port, result)
        # The original's own polling would take 2 s or more (its broadcast back-off).
        assert took < within_s, took
        if holder is a:
            assert int(cluster_info(a)["cluster_stats_yourjobs_pushed"]) > pushed
        assert waiter.client().execute_command("ACKJOB", job_id) == 1
    assert "unknown" not in ref.log_text().lower()


def test_withdrawals_never_reach_an_original(mixed) -> None:
    """Our node withdraws its asks when its consumer is served (NEEDJOBS(0))
    from our nodes only: the original would read it as an ask for one job."""
    ours, originals = mixed
    a, ref = ours[0], originals[0]
    meet(a, ref)
    wait_joined([a, ref])
    for i in range(3):
        ref.client().execute_command("ADDJOB", "wq", f"j{i}", 0, "REPLICATE", 1)
    got = a.client().execute_command("GETJOB", "TIMEOUT", 10_000, "FROM", "wq")
    assert got and got[0][0] == b"wq"
    started = time.monotonic()

    def nothing_more_came() -> bool:
        # Polled for a second: a withdrawal sent to the original would bring a job.
        assert a.client().execute_command("QLEN", "wq") == 0
        assert ref.client().execute_command("QLEN", "wq") == 2
        return time.monotonic() - started > 1.0

    wait_for(nothing_more_came, timeout=5, interval=0.05, message="a second")


def test_extensions_in_a_mixed_cluster(mixed) -> None:
    """WAITJOB on one of ours sees an ACK made on an original (through the
    original's SETACK); an IDMP job replicates to originals as a plain job;
    an original refuses IDMP as the syntax error it is for it."""
    ours, originals = mixed
    everybody = join_everybody(ours, originals)
    creator = ours[0]
    job_id = creator.client().execute_command("ADDJOB", "q", "request", 5000, "REPLICATE", 4,
                                              "RETRY", 30, "IDMP", "k")
    assert all(show(n, job_id) for n in everybody)
    assert creator.client().execute_command("ADDJOB", "q", "request", 5000, "REPLICATE", 4,
                                            "IDMP", "k") == job_id
    results: list[object] = []
    waiter = threading.Thread(
        target=lambda: results.append(creator.client().execute_command("WAITJOB", job_id,
                                                                       15_000)))
    waiter.start()
    wait_for(lambda: creator.client().info("extensions")["waitjob_clients"] == 1, 5,
             message="WAITJOB blocked")
    assert originals[1].client().execute_command("ACKJOB", job_id) == 1
    waiter.join(15)
    assert results == [b"ACKED"]
    with pytest.raises(Exception, match="syntax error"):
        originals[0].client().execute_command("ADDJOB", "q", "x", 0, "IDMP", "k")


def test_bursts_to_an_original_are_never_batched(mixed) -> None:
    """Our node merges neighbouring bus messages only for peers that said
    they take batches (messages.CAP_BATCH): the original drops a REPLJOB of
    more than one job, so every job of a pipelined burst replicating to it
    would time out (-NOREPL) if one reached it."""
    ours, originals = mixed
    a, ref = ours[0], originals[0]
    meet(a, ref)
    wait_joined([a, ref])
    for creator in (a, ref):
        pipe = creator.client().pipeline(transaction=False)
        for i in range(300):
            pipe.execute_command("ADDJOB", "burst", f"job-{i}", 5000, "REPLICATE", 2)
        replies = pipe.execute(raise_on_error=False)
        assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies), [
            r for r in replies if not isinstance(r, bytes)][:3]
        for job_id in replies[::29]:
            assert show(a, job_id) and show(ref, job_id)
    assert cluster_info(a)["cluster_stats_messages_merged"] == "0"
