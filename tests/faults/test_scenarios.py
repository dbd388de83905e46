"""Minimal reproductions of the node's defects the harness found (faults.scenarios).

Each runs a 3-node cluster in its own namespace and exits 1 when the
defect shows.  All are fixed; the scenarios guard the fixes (and
tests/server/test_copies_state.py pins each at the state-machine level).
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


def test_a_paused_copy_does_not_leave_the_job_queued_twice() -> None:
    scenario("requeue-after-pause")


def test_an_acked_copy_whose_deljob_was_lost_is_collected() -> None:
    scenario("acked-copy-after-lost-deljob")


def test_a_replicated_copy_keeps_the_jobs_ttl() -> None:
    scenario("replica-ttl")


def test_a_job_collected_while_in_flight_is_not_delivered() -> None:
    scenario("yourjobs-after-gc")


def test_acked_copies_go_soon_after_a_partition_heals() -> None:
    """The GC resets its backoff when the node it waits for is back: the
    copies go within seconds, not at the end of a 30 s+ backoff."""
    out = scenario("gc-after-heal")
    assert "lingered" in out, out
