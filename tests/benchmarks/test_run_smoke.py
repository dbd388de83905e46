"""``python3 -m benchmarks.run SCENARIO --smoke`` runs end to end (no performance asserted).

Needs ``redis-server`` and ``redis-benchmark`` (Debian packages redis-server
and redis-tools): the harness compares the node with a real Redis.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.versus_original import EXTENSION_FIGURES
from tests.support.cluster import reference_server

ROOT = Path(__file__).resolve().parents[2]

MISSING = [tool for tool in ("redis-server", "redis-benchmark") if shutil.which(tool) is None]
pytestmark = pytest.mark.skipif(
    bool(MISSING),
    reason=f"{' and '.join(MISSING)} not installed: the benchmark harness compares against "
           "Redis (apt-get install redis-server redis-tools)")


def run_smoke(tmp_path: Path, scenario: str, rounds: int = 1) -> tuple[dict[str, Any], str]:
    out = tmp_path / f"{scenario}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", scenario, "--smoke", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    report = json.loads(out.read_text())
    assert report["scenario"] == scenario
    assert report["smoke"] is True and report["rounds"] == rounds
    assert report["machine"]["cores"] >= 1
    assert len(report["machine"]["loadavg"]) == 3
    return report["result"], proc.stdout


def test_server_smoke_reports_rates_latencies_and_ratios(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "server")
    table = result["table"]
    assert {row["pipeline"] for row in table} == {1, 16}
    assert len(table) == 10
    for row in table:
        assert row["disque_rps"] > 0 and row["redis_rps"] > 0, row
        assert row["ratio"] > 0, row
        assert row["disque_p50_ms"] >= 0 and row["disque_p99_ms"] > 0, row
        assert row["disque_command"].startswith("redis-benchmark ")
        assert row["redis_command"].startswith("redis-benchmark ")
    (rnd,) = result["rounds"]
    # The pre-filled queue / list never ran dry during the pops.
    assert rnd["disque"]["left_after_pops"] > 0
    assert rnd["redis"]["left_after_pops"] > 0
    assert "redis-benchmark -h 127.0.0.1" in stdout and "ratio" in stdout


def test_cycle_smoke_drains_both_queues(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "cycle")
    modes = {row["mode"]: row for row in result["table"]}
    assert set(modes) == {"batched", "one-at-a-time"}
    for row in modes.values():
        assert row["disque_jobs_per_s"] > 0 and row["redis_jobs_per_s"] > 0, row
        assert row["ratio"] > 0
        assert row["disque_left_after"] == [0]
        assert row["redis_pending_after"] == [0]
    assert "jobs/s" in stdout


def test_bulk_smoke_reports_jobs_per_second(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "bulk")
    runs = {row["run"]: row for row in result["rows"]}
    assert {"ours ADDJOBS x100", "ours ADDJOB -P 100"} <= set(runs)
    for row in runs.values():
        assert row["jobs_per_s"] > 0, row
    assert "jobs/s" in stdout


def test_memory_smoke_reports_bytes_per_job(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "memory")
    assert result["jobs"] == 20_000 and result["body_bytes"] == 100
    for side in ("disque", "redis"):
        assert result[side]["used_per_job"] > 0, result[side]
        assert result[side]["fill_rps"] > 0
    # RSS grows by whole pages (and allocators keep reserves): only the node's must show it.
    assert result["disque"]["rss_per_job"] > 0, result["disque"]
    assert result["ratio_used"] > 0 and result["ratio_rss"] > 0
    assert "B/job" in stdout


def test_soak_smoke_cycles_jobs_and_reports_memory_per_round(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "soak", rounds=2)
    rows = result["rounds"]
    assert [row["round"] for row in rows] == [1, 2]
    for row in rows:
        # Every job added was fetched and acked: nothing is left in the node.
        assert row["registered_jobs"] == 0 and row["qlen"] == 0, row
        assert row["rss"] > 0 and row["used_memory"] > 0 and row["jobs_per_s"] > 0, row
    assert result["rss_growth_after_first_round"] == rows[1]["rss"] - rows[0]["rss"]
    assert "RSS growth after the first round" in stdout


def test_floor_smoke_compares_the_node_with_its_floor_and_redis(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "floor")
    table = result["table"]
    assert {(row["test"], row["pipeline"]) for row in table} == {
        ("ADDJOB q body 0 / XADD", 1), ("ADDJOB q body 0 / XADD", 16),
        ("PING / PING", 1), ("PING / PING", 16)}
    for row in table:
        for side in ("disque", "floor", "redis"):
            assert row[f"{side}_rps"] > 0, row
        assert row["disque_vs_floor"] == pytest.approx(row["disque_rps"] / row["floor_rps"])
        assert len(row["commands"]) == 3
    (rnd,) = result["rounds"]
    assert rnd["order"] == ["disque", "floor", "redis"]
    # The memory fill grew each node's RSS, the floor node's included.
    for side in ("disque", "floor"):
        assert result["memory"][side]["rss_per_job"] > 0, result["memory"]
    assert rnd["redis"]["memory"]["used_per_job"] > 0
    assert "FLOORLEN" not in stdout and "floor/redis" in stdout and "RSS B/job" in stdout


def test_cluster_smoke_compares_three_nodes_with_one(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "cluster")
    table = result["table"]
    impls = {row["impl"] for row in table}
    assert "ours" in impls  # and "original" when DISQUE_REFERENCE_SERVER is set
    for impl in impls:
        rows = [row for row in table if row["impl"] == impl]
        # (one node + 3 cluster tests) x (unpipelined, -P 16), and the cycle
        # on one node and on three
        assert len(rows) == 10
        assert all(row["rps"] > 0 and row["ratio"] > 0 for row in rows), rows
    assert "3 nodes: ADDJOB q body 0 (REPLICATE 3)" in stdout
    assert "produce/get/ack cycle, 3 nodes" in stdout
    rnd = result["rounds"][0]
    assert rnd["ours/3"]["cycle"]["jobs"] == 2_000
    # The CPU each process spent per request: the node, then each peer.
    run = rnd["ours/3"]["ADDJOB q body 0 (REPLICATE 3) P1"]
    assert len(run["cpu_us_per_request"]) == 3 and all(x > 0 for x in run["cpu_us_per_request"])
    assert run["load_generator_cpu_us_per_request"] > 0 and 0 <= run["steal"] < 1
    cpu = [row for row in result["cpu"] if row["impl"] == "ours"]
    assert len(cpu) == 8 and all(row["node"] > 0 for row in cpu), cpu
    assert [len(row["peers"].split()) for row in cpu] == [1, 2, 2, 2] * 2  # "-" for one node
    assert "CPU per request" in stdout


def test_membership_timing_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.membership_timing", "--trials", "1", "--nodes", "3",
         "--node-timeout", "1000"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "full mesh after" in proc.stdout and "fail everywhere at" in proc.stdout


def test_federation_latency_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.federation_latency", "--trials",
                           "3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "got a job queued on another node in median" in proc.stdout


def test_federation_load_runs() -> None:
    proc = subprocess.run([sys.executable, "-m", "benchmarks.federation_load", "--jobs", "300",
                           "--consumers", "2"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "300 jobs added on A" in proc.stdout
    assert "federation messages per job" in proc.stdout


@pytest.mark.skipif(reference_server() is None,
                    reason="needs the original server: set DISQUE_REFERENCE_SERVER")
def test_original_smoke_reports_every_target_against_the_original(tmp_path: Path) -> None:
    result, stdout = run_smoke(tmp_path, "original")
    figures = {row["figure"]: row for row in result["table"]}
    targets = {"ADDJOB P1", "ADDJOB P16", "GETJOB NOHANG P1", "GETJOB NOHANG P16", "cycle",
               "memory B/job", "RSS B/job"}
    # Ours through the extensions, each against the original's plain figure.
    extensions = {f"{figure} (vs plain)" for figure in EXTENSION_FIGURES}
    assert set(figures) == targets | extensions
    for row in figures.values():
        assert row["ours"] > 0 and row["original"] > 0
        assert row["ratio"] == pytest.approx(row["ours"] / row["original"])
    assert figures["memory B/job"]["higher_is_better"] is False
    assert "ours vs the original" in stdout and "per round" in stdout
    # Redis in the same rounds, where it is installed (the CI installs it).
    assert result["with_redis"] == (shutil.which("redis-server") is not None)
    if result["with_redis"]:
        for figure in targets:
            row = figures[figure]
            assert row["redis"] > 0
            assert row["redis_ratio"] == pytest.approx(row["ours"] / row["redis"])
        assert "ours vs Redis" in stdout
