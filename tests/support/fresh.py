"""Run code in a fresh interpreter: what an import loads shows only there."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_fresh(code: str, timeout: float = 120) -> Any:
    """Run ``code`` with this interpreter from the repository root; the JSON
    its last printed line holds."""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])
