"""How long a consumer on an empty node waits for a job queued on another
node (federation), run on demand.

    python3 -m benchmarks.federation_latency [--trials 30] [--nodes 3]

Joins ``--nodes`` real nodes; each trial adds one job (REPLICATE 1) to a
fresh queue on the second node and times a blocking GETJOB on the first:
the NEEDJOBS broadcast, the YOURJOBS answer and the delivery.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import join, wait_joined
from tests.support.process import DisqueProcess


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-federation-"))
    nodes = [DisqueProcess(root / f"n{i}").start() for i in range(args.nodes)]
    try:
        join(nodes)
        wait_joined(nodes)
        consumer, producer = nodes[0].client(), nodes[1].client()
        waits = []
        for trial in range(args.trials):
            queue = f"federation-{trial}"  # fresh: the first NEEDJOBS is a broadcast
            producer.execute_command("ADDJOB", queue, "x", 0, "REPLICATE", 1)
            started = time.perf_counter()
            job = consumer.execute_command("GETJOB", "TIMEOUT", 10000, "FROM", queue)
            waits.append((time.perf_counter() - started) * 1000)
            if not job:
                raise SystemExit(f"trial {trial}: no job within 10 s")
    finally:
        for node in nodes:
            node.kill()
    print(f"{args.nodes} nodes, {args.trials} trials: blocked GETJOB on an empty node got a "
          f"job queued on another node in median {statistics.median(waits):.1f} ms, "
          f"max {max(waits):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
