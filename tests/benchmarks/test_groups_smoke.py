"""``python3 -m benchmarks.run groups --smoke`` runs end to end (no
performance asserted), and its check of the groups' promise can fail."""

from __future__ import annotations

from pathlib import Path

from benchmarks.groups import breaches
from tests.benchmarks.test_run_smoke import run_smoke


def test_groups_smoke_drains_both_loads_and_finds_no_breach(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "groups")
    (rnd,) = result["rounds"]
    assert rnd["groups"]["groups"] == 500 and rnd["no groups"]["groups"] == 0
    for run in rnd.values():
        assert run["acknowledged"] == result["jobs"] == 5_000, run
        assert run["drain_jobs_per_s"] > 0 and run["fill_jobs_per_s"] > 0, run
    assert rnd["groups"]["groups_out_of_order"] == 0
    assert rnd["groups"]["overlapping_holds"] == 0
    assert "groups / no groups, drain_jobs_per_s" in stdout


def test_the_check_counts_groups_out_of_order_and_overlapping_holds() -> None:
    order = {"a": ["1", "2", "3"], "b": ["4", "5"]}
    clean = [("1", "a", 0.0, 1.0), ("2", "a", 1.5, 2.0), ("4", "b", 0.5, 3.0),
             ("3", "a", 2.5, 2.6), ("5", "b", 3.5, 4.0)]
    assert breaches(order, clean) == {"groups_out_of_order": 0, "overlapping_holds": 0}
    swapped = [("2", "a", 0.0, 1.0), ("1", "a", 1.5, 2.0)]
    assert breaches(order, swapped) == {"groups_out_of_order": 1, "overlapping_holds": 0}
    overlapping = [("4", "b", 0.0, 2.0), ("5", "b", 1.0, 3.0)]
    assert breaches(order, overlapping) == {"groups_out_of_order": 0, "overlapping_holds": 1}
