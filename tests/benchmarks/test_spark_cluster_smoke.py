"""The 3-nodes-against-1 Spark benchmarks run end to end (no performance asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the Spark benchmarks need the 'spark' extra")

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_source_drains_one_node_and_three_nodes(tmp_path: Path) -> None:
    out = tmp_path / "cluster.json"
    stdout = run("benchmarks.spark_source", "--cluster", "--smoke", "--json", str(out),
                 "--log", str(tmp_path / "stderr.log"))
    result = json.loads(out.read_text())
    assert result["smoke"] is True and result["jobs"] == 3000
    assert [row["target"] for row in result["cluster"]] == ["1 node", "3 nodes"]
    assert all(row["rate"] > 0 and len(row["seconds"]) == 1 for row in result["cluster"])
    assert "Spark source drain" in stdout and "vs 1 node" in stdout


def test_sink_writes_to_one_node_and_three_nodes() -> None:
    stdout = run("benchmarks.spark_sink", "--cluster", "--rows", "3000", "--rounds", "1")
    assert "Spark sink (df.write, 3 partitions): 3000 jobs" in stdout
    for target in ("1 node", "3 nodes, REPLICATE 3", "3 nodes, replicate=1"):
        assert target in stdout
