"""``python3 -m benchmarks.abuse --smoke`` runs and reports each attack's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_abuse_smoke_reports_each_attack(tmp_path: Path) -> None:
    out = tmp_path / "abuse.json"
    attacks = ["preauth-bulk", "reply-amplification", "acl-pattern", "getjob-queues"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.abuse", "--smoke", "--json", str(out),
         *[arg for name in attacks for arg in ("--only", name)]],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    report = json.loads(out.read_text())
    assert report["smoke"] is True
    results = report["results"]
    assert sorted(results) == sorted(attacks)
    for name in attacks:
        after = results[name]["after"]
        assert after["alive"] is True, (name, after)
        assert f"{name} (after)" in proc.stdout
    # The figures the attacks are about, on this checkout's node.
    assert results["preauth-bulk"]["after"]["connections_left"] == 0
    assert results["getjob-queues"]["after"]["queues_left"] == 0
    assert results["reply-amplification"]["after"]["used_memory_delta_mb"] < 8
    assert results["acl-pattern"]["after"]["reply"].startswith("-NOPERM")
