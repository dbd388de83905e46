"""The Spark benchmarks' ``--standalone`` (and the source's ``--staging s3``) run end to end.

No performance asserted: these keep benchmarks/spark_standalone.py from
rotting. Each starts a standalone master and two workers, and the source a
moto_server, for the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark benchmarks need the 'spark' extra")
pytest.importorskip("moto", reason="--staging s3 needs moto[server] (the dev extra)")

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_the_source_on_a_standalone_cluster_with_s3_staging(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.spark_source", "--smoke", "--standalone",
         "--staging", "s3", "--json", str(out), "--log", str(tmp_path / "stderr.log")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    result = json.loads(out.read_text())
    assert (result["standalone"], result["staging"]) == (True, "s3")
    assert result["master"].startswith("spark://127.0.0.1:")
    for run in result["disque"]:
        assert run["rows"] == run["jobs"] == result["jobs"]
        assert run["qlen_after"] == 0 and run["registered_after"] == 0


def test_the_sink_on_a_standalone_cluster(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.spark_sink", "--standalone", "--rows", "3000",
         "--rounds", "1", "--ceiling-rows", "3000", "--warmup-writes", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "master spark://127.0.0.1:" in proc.stdout
    assert "the sink reaches" in proc.stdout
    assert "warm-up write 1/1" in proc.stdout
    assert "the driver JVM's JIT compiler CPU s: 1 warm-up writes" in proc.stdout
