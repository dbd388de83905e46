"""A short schedule of every fault kind, checked: no lost job, no delivery after a completed ACK.

One harness run (a fresh 3-node cluster per kind, ~15-20 s each) shared by
the tests below.  Jobs queued twice and acked jobs left behind after
healing are known defects of the node, reproduced on their own in
test_scenarios.py; here they are reported, not asserted.  Long schedules:
``python3 -m faults --faults partition,pause,kill,lossy,slow --time 120``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from faults.nemesis import KINDS
from tests.faults.conftest import run_harness

pytestmark = pytest.mark.slow

SHORT = ["--time", "5", "--node-timeout", "1500", "--retry", "2", "--drain-timeout", "30",
         "--gc-timeout", "8", "--seed", "7"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[
        dict[str, Any], subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("faults")
    report, result = run_harness(out, ",".join(KINDS), *SHORT)
    return report, result, out


@pytest.mark.parametrize("kind", KINDS)
def test_short_schedule(short_run, kind: str) -> None:
    report, result, _ = short_run
    figures = report[kind]
    context = f"{kind}: {figures}\n{result.stdout[-3000:]}"
    # The faults happened and visibly did something (a node flagged, packets
    # dropped, bytes delayed): otherwise the rest proves nothing.
    assert figures["faults"] >= 1 and figures["faults_with_effect"] == figures["faults"], context
    assert figures["adds"].get("sync ok", 0) > 20, context
    assert figures["delivered_jobs"] >= figures["adds"]["sync ok"], context
    assert figures["lost"] == [], context
    # Never a delivery after an ACK completed its GC (a YOURJOBS held back
    # on a bad link used to bring a collected job back: fixed, and guarded
    # by test_scenarios.py's test_a_job_collected_while_in_flight_is_not_delivered).
    assert figures["delivered_after_gc"] == [], context
    assert figures["phantom"] == [], context


def test_report_table_and_timeline(short_run) -> None:
    _, result, out = short_run
    assert "| schedule" in result.stdout and "max unavail" in result.stdout
    for kind in KINDS:
        assert f"| {kind} 5s" in result.stdout
        assert (out / f"history-{kind}.json").exists()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "not drawn (matplotlib not installed)" in result.stdout
    else:
        assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nothing_is_left_behind(short_run) -> None:
    """Every node the harness started is gone with its namespace."""
    _, _, out = short_run
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps
