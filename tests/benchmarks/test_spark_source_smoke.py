"""The Spark source benchmark's ``--smoke`` mode runs end to end (no performance asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark benchmark needs the 'spark' extra")

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_mode_drains_the_queue_and_reports_throughput(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.spark_source", "--smoke", "--json", str(out),
         "--log", str(tmp_path / "stderr.log")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    # By default Spark runs from a SPARK_HOME without PySpark's zips.
    assert result["pyspark_zips"] == []
    assert "PySpark's zips on the path of Spark's Python processes: none" in proc.stdout
    assert result["disque"], "no disque run reported"
    for run in result["disque"]:
        assert run["rows"] == run["jobs"] == result["jobs"]
        assert run["rate"] > 0
        assert run["qlen_after"] == 0 and run["registered_after"] == 0
    assert all(run["rate"] > 0 for run in result["rate"])
    assert result["best"]["ratio"] > 0
    assert "best disque / best rate" in proc.stdout
    # One round of every config, then the fetch + ACK ceiling it is compared with.
    assert result["rounds"] == 1 and len(result["round_ceilings"]) == 1
    assert result["round_ceilings"][0]["rate"] > 0
    for run in result["disque"]:
        assert len(run["round_ratios"]) == 1 and run["ceiling_ratio"] > 0
    assert "against the node's fetch + ACK ceiling, per round" in proc.stdout
    # One whole drain warms the JIT first (--warmup-drains, at most 1 in smoke
    # mode); the compiler threads' CPU is read from /proc for it and each run
    # (live threads only: a difference may fall short, see threads_cpu_s).
    assert len(result["warmup_drains"]) == 1
    assert isinstance(result["warmup_drains"][0]["jit_cpu_s"], float)
    assert "warm-up drain 1/1" in proc.stdout
    for run in result["disque"]:
        assert len(run["round_jit_cpu_s"]) == 1
        assert isinstance(run["round_jit_cpu_s"][0], float)
    # The driver path without Spark times each step of the source; a step
    # whose function moved would silently drop out of the report.
    steps = result["driver_path"]["steps"]
    for label in ("  fetch (GETJOB loop + Arrow table)", "  ACK (ack_through)"):
        assert steps[label]["calls"] > 0, (label, steps)
