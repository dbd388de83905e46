"""How fast a cluster forms and notices a dead node (run on demand).

    python3 -m benchmarks.membership_timing [--trials 3] [--nodes 5] [--node-timeout 2000]

Starts ``--nodes`` real nodes, joins them in a chain (A-B, B-C, ...) so the
rest must come by gossip, and times the full mesh; then kills one with
SIGKILL and times ``fail?`` and ``fail`` as the survivors see it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import flags_of, fully_joined, join, node_id
from tests.support.process import DisqueProcess


def trial(root: Path, size: int, node_timeout: int) -> dict[str, float]:
    nodes = [DisqueProcess(root / f"n{i}", "--cluster-node-timeout", str(node_timeout)).start()
             for i in range(size)]
    try:
        started = time.monotonic()
        join(nodes, chain=True)
        while not fully_joined(nodes):
            time.sleep(0.02)
        result = {"joined": time.monotonic() - started}
        dead = node_id(nodes[-1])
        nodes[-1].kill()
        killed = time.monotonic()
        while True:
            flags = [flags_of(n, dead) or set() for n in nodes[:-1]]
            for flag in ("fail?", "fail"):
                if any(flag in f for f in flags):
                    result.setdefault(flag, time.monotonic() - killed)
            if all("fail" in f for f in flags):
                result["fail everywhere"] = time.monotonic() - killed
                return result
            time.sleep(0.02)
    finally:
        for node in nodes:
            node.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--node-timeout", type=int, default=2000)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-membership-"))
    for i in range(args.trials):
        result = trial(root / f"t{i}", args.nodes, args.node_timeout)
        print(f"trial {i + 1}: {args.nodes} nodes joined in a chain, full mesh after "
              f"{result['joined']:.2f} s; after kill -9 (node timeout {args.node_timeout} ms): "
              + ", ".join(f"{k} at {v:.2f} s" for k, v in result.items() if k != "joined"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
