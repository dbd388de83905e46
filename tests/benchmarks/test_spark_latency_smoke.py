"""The Spark latency benchmark's ``--smoke`` mode runs end to end (no performance asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark benchmark needs the 'spark' extra")

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_mode_reports_the_first_batch_and_end_to_end_latency(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.spark_latency", "--smoke", "--triggers", "0",
         "--json", str(out), "--log", str(tmp_path / "stderr.log")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert run["trigger_s"] == 0
    first = run["first_batch"]
    assert first["rows"] == 100 and first["seconds"] > 0, first
    phases = first["phases"]
    assert {"source: fetch (GETJOB loop)", "source: staging"} <= set(phases), phases
    assert sum(phases.values()) <= first["seconds"] * 1.01, first
    e2e = run["end_to_end"]
    assert e2e["jobs"] > 0, e2e
    assert 0 < e2e["p50"] <= e2e["p99"] <= e2e["max"], e2e
