"""Batched bus messages between our nodes (messages.CAP_BATCH).

Under load a node sends its peers many GOTJOB/QUEUED/SETACK/... and
single-job REPLJOBs per event-loop turn; between our nodes they travel
merged (a job-ID message with a count, a REPLJOB with several jobs).  What
must hold: every job still gets its copies and its GC, and an original
node, which drops a REPLJOB of more than one job, never receives a batch
(tests/cluster/test_interop.py).
"""

from __future__ import annotations

from typing import Any

from tests.support.cluster import cluster_info, holders, show
from tests.support.process import DisqueProcess, wait_for


def _pipeline(node: DisqueProcess, commands: list[tuple]) -> list[Any]:
    pipe = node.client().pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute(raise_on_error=False)


def _merged(node: DisqueProcess) -> int:
    return int(cluster_info(node)["cluster_stats_messages_merged"])


def test_bursts_travel_batched_and_every_job_gets_its_copies_and_gc(make_cluster) -> None:
    nodes = make_cluster(3)
    a = nodes[0]
    job_ids: list[bytes] = []

    def burst() -> bool:
        replies = _pipeline(a, [("ADDJOB", "q", f"job-{len(job_ids) + i}", 5000)
                                for i in range(200)])
        assert all(isinstance(r, bytes) and r.startswith(b"D-") for r in replies), replies
        job_ids.extend(replies)
        # The peers' PONGs tell a that they take batches; then they do.
        return _merged(a) > 0 and all(_merged(peer) > 0 for peer in nodes[1:])

    wait_for(burst, timeout=20, message="REPLJOBs and GOTJOBs to travel batched")
    info = cluster_info(a)
    assert int(info["cluster_stats_batches_received"]) > 0  # the peers' GOTJOBs
    for job_id in job_ids[::37]:
        assert holders(nodes, job_id) == nodes
        assert show(nodes[2], job_id)[b"body"] == show(a, job_id)[b"body"]
    assert a.client().execute_command("QLEN", "q") == len(job_ids)

    # One ACKJOB of every job: SETACK, GOTACK and DELJOB travel batched too,
    # and each job is gone from every node.
    before = [_merged(node) for node in nodes]
    assert a.client().execute_command("ACKJOB", *job_ids) == len(job_ids)
    wait_for(lambda: all(node.client().execute_command("INFO", "jobs")
                         .get("registered_jobs") == 0 for node in nodes),
             timeout=20, message="the ACK GC to remove every copy")
    assert all(_merged(node) > was for node, was in zip(nodes, before, strict=True))
