"""Discovery by DNS and announced addresses with real nodes, in a network
namespace of their own (tests/cluster/netns_scenarios.py says what each
scenario does): a DNS stub the resolver is pointed at, nft address
translation in front of the nodes.  They need root (or CAP_SYS_ADMIN and
CAP_NET_ADMIN) and nft: without them the scenario exits 77 and the test is
skipped with its reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from faults import EXIT_SKIPPED

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, timeout: float) -> dict:
    result = subprocess.run([sys.executable, "-m", "tests.cluster.netns_scenarios", *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if result.returncode == EXIT_SKIPPED:
        pytest.skip(result.stderr.strip() or "cannot create a network namespace here")
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_discovery_scale_up_down_restart_and_reschedule() -> None:
    """Scale up (joined), scale down (drained, forgotten by all), a restart
    at a new address silent for 3x the forget time (not forgotten), every
    node rescheduled at new addresses (same IDs, cluster reformed)."""
    report = run("discovery", timeout=240)
    assert report["scale_down_forgotten_s"] < 30
    assert report["dns_queries"] > 0


def test_clients_reach_nodes_behind_address_translation_by_announced_addresses() -> None:
    """Peers, the Python client and the Spark connectors (sink, batch and
    streaming source) reach the nodes only through their announced
    addresses; a real partition (nft drops between one node and the
    others) leaves every node ready (/readyz)."""
    pytest.importorskip("pyspark", reason="needs the 'spark' extra: pip install -e '.[spark]'")
    report = run("nat", "--spark", timeout=600)
    assert report["ready_through_partition"]
    assert report["client_jobs"] == 20
    assert report["spark"]["written"] == 200
    assert report["spark"]["listed"] == 200
    assert report["spark"]["streamed"] == 200
