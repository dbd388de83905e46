"""What the client's OpenTelemetry support costs a producer, per ``add_job``.

    python3 -m benchmarks.client_tracing [--tree PATH] [--small 200] [--large 2200]

A client process under ``valgrind --tool=callgrind`` adds ``--small`` and then
``--large`` jobs (``add_job(queue, body, async_=True)``) to a node on
loopback; the difference of the two counts, divided by the difference of the
calls, is the client's instructions per ``add_job`` (start-up and exit cancel
out).  Each of these set-ups is counted:

* ``none``: OpenTelemetry cannot be imported (as if not installed);
* ``api``: the API imported, no tracer or meter provider set;
* ``sdk``: the SDK's tracer provider set (spans made and dropped: no
  processor), the cost of tracing itself.

``--tree`` runs the client of another checkout (a ``git worktree`` of an
older commit), so a change is measured before and after in the same run.
The CPU time per call (the same loop without valgrind, 20,000 calls, best of
three) is printed beside each count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.instructions import EXIT_FUNCTION, SUMMARY
from tests.support.process import DisqueProcess

ROOT = Path(__file__).resolve().parent.parent

#: The client process: ``python -c CLIENT TREE MODE ADDRESS COUNT``.
CLIENT = """
import sys, time, resource
tree, mode, address, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, tree)
if mode == "none":
    sys.modules["opentelemetry"] = None  # its imports fail, as if not installed
elif mode == "api":
    import opentelemetry.metrics, opentelemetry.trace
elif mode == "sdk":
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    trace.set_tracer_provider(TracerProvider())
from disque import Client
c = Client(address)
c.add_job("warm", b"x", async_=True)
started = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(count):
    c.add_job("bench", b"x" * 32, async_=True)
done = resource.getrusage(resource.RUSAGE_SELF)
cpu = (done.ru_utime + done.ru_stime) - (started.ru_utime + started.ru_stime)
print(cpu / count * 1e6)
c.close()
"""


def instructions(tree: Path, mode: str, address: str, count: int, workdir: Path) -> int:
    out = workdir / f"{mode}-{count}.out"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    f"--dump-before={EXIT_FUNCTION}", sys.executable, "-c", CLIENT,
                    str(tree), mode, address, str(count)],
                   check=True, capture_output=True, timeout=1800)
    summary = SUMMARY.search(out.with_name(out.name + ".1").read_bytes())
    if summary is None:
        raise RuntimeError(f"no summary line in callgrind's profile {out}.1")
    return int(summary.group(1))


def cpu_us(tree: Path, mode: str, address: str, count: int) -> float:
    runs = [float(subprocess.run([sys.executable, "-c", CLIENT, str(tree), mode, address,
                                  str(count)], check=True, capture_output=True, text=True,
                                 timeout=600).stdout)
            for _ in range(3)]
    return min(runs)


def run(tree: Path, modes: list[str], small: int, large: int,
        cpu_calls: int = 20_000) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-client-tracing-"))
    node = DisqueProcess(workdir / "node").start()
    address = f"127.0.0.1:{node.port}"
    out: dict[str, Any] = {"tree": str(tree)}
    try:
        for mode in modes:
            low = instructions(tree, mode, address, small, workdir)
            high = instructions(tree, mode, address, large, workdir)
            out[mode] = {"instructions_per_add_job": round((high - low) / (large - small)),
                         "cpu_us_per_add_job": round(cpu_us(tree, mode, address, cpu_calls),
                                                     1)}
    finally:
        node.kill()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT,
                        help="the checkout whose client is measured (default: this one)")
    parser.add_argument("--modes", default="none,api,sdk")
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=2200)
    args = parser.parse_args()
    if not (args.tree / "disque" / "client").is_dir():
        parser.error(f"{args.tree} holds no disque/client")
    modes = [m for m in args.modes.split(",") if m]
    print(json.dumps(run(args.tree.resolve(), modes, args.small, args.large), indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
