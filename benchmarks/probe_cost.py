"""CPU per health probe: a probe that starts a process against one the node answers.

    python3 -m benchmarks.probe_cost [--entrypoint docker/entrypoint.sh] [--probes 2000]

Two nodes, joined; the first serves ``metrics-port``.

* **exec probes**: the container entrypoint's ``healthcheck`` and ``ready``
  commands (``--entrypoint``, any version of the script: they start Python
  processes), 10 runs each, CPU from ``getrusage(RUSAGE_CHILDREN)`` (user +
  system of the shell and everything it started), median;
* **HTTP probes**: ``GET /healthz`` and ``GET /readyz`` ``--probes`` times in
  a row: the node's CPU (``/proc/PID/stat``) per probe, and this client's
  (urllib: what a kubelet pays is its own).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import join, wait_joined
from tests.support.process import DisqueProcess, free_port

ROOT = Path(__file__).resolve().parent.parent


def node_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(entrypoint: Path, probes: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    port = free_port()
    a = DisqueProcess(root / "a", "--metrics-port", str(port)).start()
    b = DisqueProcess(root / "b").start()
    out: dict[str, Any] = {}
    try:
        join([a, b])
        wait_joined([a, b])
        env = dict(os.environ, DISQUE_CONFIG_FILE="none", DISQUE_PORT=str(a.port),
                   DISQUE_JOIN=f"127.0.0.1:{b.port}")
        for command in ("healthcheck", "ready"):
            runs = []
            for _ in range(10):
                before = _children_cpu()
                done = subprocess.run(["sh", str(entrypoint), command], env=env,
                                      capture_output=True, text=True, check=False)
                runs.append(_children_cpu() - before)
                if done.returncode != 0:
                    raise SystemExit(f"{entrypoint} {command} failed: {done.stdout}{done.stderr}")
            runs.sort()
            out[f"exec {command}"] = {"cpu_ms": round(runs[len(runs) // 2] * 1000, 1)}
        for path in ("/healthz", "/readyz"):
            node_before, self_before = node_cpu_s(a.pid), _self_cpu()
            started = time.perf_counter()
            for _ in range(probes):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                            timeout=5) as response:
                    response.read()
            wall = time.perf_counter() - started
            out[f"GET {path}"] = {
                "node_cpu_ms": round((node_cpu_s(a.pid) - node_before) * 1000 / probes, 3),
                "client_cpu_ms": round((_self_cpu() - self_before) * 1000 / probes, 3),
                "wall_ms": round(wall * 1000 / probes, 3)}
    finally:
        a.kill()
        b.kill()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entrypoint", type=Path, default=ROOT / "docker" / "entrypoint.sh")
    parser.add_argument("--probes", type=int, default=2000)
    args = parser.parse_args()
    print(json.dumps(run(args.entrypoint, args.probes), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
