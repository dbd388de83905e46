"""``python3 -m benchmarks.run latency --smoke`` runs end to end (no performance asserted):
ours, and the original beside it when ``DISQUE_REFERENCE_SERVER`` is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks.test_run_smoke import run_smoke
from tests.support.cluster import reference_server

#: Each case's jobs per round with --smoke: ours, the original.
CASES = {"1 consumer": (200, 200), "50 consumers, 10 queues": (200, 200),
         "3 nodes, added on one, taken on another": (20, 5),
         "3 nodes, added on a random other node": (20, 3),
         "3 nodes, 50 consumers, 10 queues": (20, 3)}


def test_latency_smoke_times_every_pickup_of_every_case(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "latency")
    impls = ["ours"] + (["original"] if reference_server() else [])
    table = {row["case"]: row for row in result["table"]}
    assert set(table) == set(CASES)
    (rnd,) = result["rounds"]
    for case, counts in CASES.items():
        for impl, jobs in zip(("ours", "original"), counts, strict=True):
            if impl not in impls:
                continue
            run = rnd[f"{case}/{impl}"]
            # Every job added was taken by a blocked consumer and timed.
            assert run["jobs"] == jobs, run
            assert 0 < run["p50_us"] <= run["p99_us"] <= run["max_us"], run
            assert len(run["loadavg"]) == 3
        if "original" in impls:
            row = table[case]
            assert row["ratio_p50_us"] == pytest.approx(row["ours_p50_us"] / row["original_p50_us"])
    assert "ADDJOB to a consumer blocked in GETJOB" in stdout
