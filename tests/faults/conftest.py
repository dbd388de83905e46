"""Run the harness (``python3 -m faults``) and its scenarios as subprocesses.

They re-execute themselves in a network namespace of their own, so these
tests need root (or the capabilities for ``unshare -n`` and nft): exit
status 77 is their "cannot run here", turned into a skip with its reason.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from faults import EXIT_SKIPPED

ROOT = Path(__file__).resolve().parents[2]


def run_module(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode == EXIT_SKIPPED:
        pytest.skip(result.stderr.strip() or "the fault harness cannot run here")
    return result


def run_harness(out: Path, kinds: str, *options: str, timeout: float = 240) -> tuple[
        dict[str, Any], subprocess.CompletedProcess[str]]:
    result = run_module(["faults", "--faults", kinds, "--out", str(out), *options], timeout)
    report = out / "report.json"
    assert report.exists(), f"no report:\n{result.stdout}\n{result.stderr}"
    return json.loads(report.read_text()), result
