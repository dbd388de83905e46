"""``python3 -m benchmarks.console --smoke`` runs end to end (no performance asserted).

Needs ``redis-benchmark`` (Debian package redis-tools) for the ADDJOB
throughput, and the console extra with httpx (the dev extra).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(
    shutil.which("redis-benchmark") is None,
    reason="redis-benchmark not installed: the benchmark measures the node's ADDJOB "
           "throughput with it (apt-get install redis-tools)")


def test_console_smoke_reports_every_page_the_sampling_cost_and_the_load(
        tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="the console needs the 'console' extra")
    pytest.importorskip("httpx", reason="the benchmark calls the console with httpx (dev)")
    out = tmp_path / "console.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.console", "--smoke", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "DISQUE_INTERPRETED": "1"})
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    report = json.loads(out.read_text())
    assert report["smoke"] is True
    fill = report["fill"]
    assert fill["jobs"] == 20_000 and fill["queues"] == 200
    # Every job stored, dead letters included.
    assert fill["registered_jobs"] == fill["jobs"] + fill["dead_letters"]
    pages = report["pages"]["pages"]
    assert set(pages) == {"/ (overview)", "/queues (by length)", "/queues (by name, page 100)",
                          "/queues (pattern q:012*)", "/queues/<name>", "/jobs/<id>",
                          "/dead-letters", "/nodes"}
    for label, figures in pages.items():
        assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"], label
        assert figures["requests"] == 5 and figures["bytes"] > 0
    # 200 queues filled and 50 dead-letter queues (and their origins).
    assert report["pages"]["queues_in_table"] == 200 + 2 * 50
    sampling = report["sampling"]
    assert len(sampling["with_console_pct"]) == len(sampling["without_pct"]) == 1
    assert sampling["cost_pct_of_core"] == pytest.approx(
        sampling["with_console_pct"][0] - sampling["without_pct"][0], abs=0.01)
    pages_open = report["pages_open"]
    assert len(pages_open["with_console_pct"]) == 1
    assert pages_open["console_cpu_pct_of_core"][0] > 0  # its pages did work
    load = report["load"]
    for figure in ("addjob_rps", "pickup_p50_us", "pickup_p99_us"):
        assert load[figure]["with"] > 0 and load[figure]["without"] > 0
        # One round: its own ratio is the median.
        assert load[figure]["ratio"] == pytest.approx(
            load[figure]["with"] / load[figure]["without"], rel=0.01)
        assert len(load[figure]["ratios"]) == 1
    # Every live page sent updates while the node was measured.
    assert set(load["updates_seen"]) == set(load["streams"]) and len(load["streams"]) == 6
    assert all(n > 0 for n in load["updates_seen"].values())
    assert "ADDJOB" in proc.stdout and "pickup p50" in proc.stdout
