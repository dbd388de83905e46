"""Minimal reproductions of the node's defects the harness found (faults.scenarios).

Each runs a 3-node cluster in its own namespace and exits 1 when the
defect shows.  All are fixed; the scenarios guard the fixes (and
tests/server/test_copies_state.py pins each at the state-machine level).
Also here: the harness's workload with ordered groups and no fault, whose
groups must go out in add order, one job at a time.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

from tests.faults.conftest import run_harness, run_module

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


def test_groups_without_faults_go_out_in_add_order_one_job_at_a_time(
        tmp_path: Path) -> None:
    """The harness's workload with ordered groups (routed by disque.Client)
    and no fault: no delivery out of order, none overlapping, and each
    group's jobs first went out exactly in the order they were added."""
    report, result = run_harness(tmp_path, "none", "--groups", "6", "--time", "8",
                                 "--retry", "2", "--node-timeout", "1500",
                                 "--drain-timeout", "30", "--gc-timeout", "8", "--seed", "3")
    figures = report["none"]
    context = f"{figures}\n{result.stdout[-3000:]}"
    groups = figures["groups"]
    assert figures["defects"] == [] and result.returncode == 0, context
    assert groups["keys"] == 6 and groups["jobs"] >= 60, context
    assert groups["out_of_order"] == {} and groups["overlapping"] == {}, context
    assert groups["delivered"] == 6 and groups["in_order"] == 6, context
    # The same from the history itself: per group, the jobs' first
    # deliveries (in the order their GETJOB replies came) are its ADDJOBs'
    # replies in order, every job of the group included.
    history = json.loads((tmp_path / "history-none.json").read_text())
    added: dict[str, list[tuple[int, str]]] = defaultdict(list)
    group_of = {}
    for op in history["ops"]:
        if op["kind"] == "add" and op["extra"].get("group") and op["outcome"] == "ok":
            added[op["extra"]["group"]].append((op["extra"]["seq"], op["job_id"]))
            group_of[op["job_id"]] = op["extra"]["group"]
    gets = sorted((o for o in history["ops"] if o["kind"] == "get" and o["outcome"] == "ok"
                   and o["job_id"] in group_of),
                  key=lambda o: (o["end"], o["extra"]["pos"]))
    delivered: dict[str, list[str]] = defaultdict(list)
    for get in gets:
        assert get["extra"]["group"] == group_of[get["job_id"]], get
        if get["job_id"] not in delivered[group_of[get["job_id"]]]:
            delivered[group_of[get["job_id"]]].append(get["job_id"])
    assert len(added) == 6
    for group, jobs in added.items():
        assert delivered[group] == [job for _, job in sorted(jobs)], group
