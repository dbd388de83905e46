"""Minimal reproductions of the node's defects the harness found (faults.scenarios).

Each runs a 3-node cluster in its own namespace and exits 1 when the
defect shows.  The xfails are strict: when the node is fixed they fail,
so the marker is removed and the scenario guards the fix.
"""

from __future__ import annotations

import pytest

from tests.faults.conftest import run_module

pytestmark = pytest.mark.slow


def scenario(name: str) -> str:
    result = run_module(["faults.scenarios", name], timeout=120)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr[-2000:]}"
    return result.stdout


def test_ack_during_a_partition_reaches_every_copy_after_healing() -> None:
    assert "ack-during-partition: ok" in scenario("ack-during-partition")


@pytest.mark.xfail(strict=True, reason=(
    "a node resumed after SIGSTOP past RETRY requeues its due copy at once (WILLQUEUE and "
    "enqueue in one processJob pass) and its QUEUED is lost: the job stays queued on two "
    "nodes until consumed twice"))
def test_a_paused_copy_does_not_leave_the_job_queued_twice() -> None:
    scenario("requeue-after-pause")


@pytest.mark.xfail(strict=True, reason=(
    "a copy acked on SETACK gets no GC attempt of its own (acknowledge_job sets qtime 0), so "
    "when the DELJOB of the node that completed the GC is lost the acked copy stays until "
    "its TTL; the original retries the GC of every acked copy"))
def test_an_acked_copy_whose_deljob_was_lost_is_collected() -> None:
    scenario("acked-copy-after-lost-deljob")


@pytest.mark.xfail(strict=True, reason=(
    "a copy received by REPLJOB gets 1000x the job's TTL: deserialize_job already turns the "
    "bus's remaining seconds into ms and adopt_copy multiplies by 1000 again"))
def test_a_replicated_copy_keeps_the_jobs_ttl() -> None:
    scenario("replica-ttl")


@pytest.mark.xfail(strict=True, reason=(
    "a YOURJOBS still in flight when the job is acked on another node and its GC completes "
    "makes the importing node adopt and queue the collected job: it is delivered after a "
    "completed ACK (nothing remembers the deleted ID)"))
def test_a_job_collected_while_in_flight_is_not_delivered() -> None:
    scenario("yourjobs-after-gc")
