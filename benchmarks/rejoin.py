"""How soon a restarted node is a replication target again (run on demand).

    python3 -m benchmarks.rejoin [--trials 5] [--node-timeout 1000] [--json out.json]

For ours, and the original beside it when ``DISQUE_REFERENCE_SERVER`` names
its binary (same run, same machine, alternating trials): three nodes
joined; one is killed (SIGKILL) and restarted once both peers flag it
failing (``fail?`` or ``fail``); then, polling every 2 ms from a peer:

* ``up``: the restarted node answers PING on its client port;
* ``addjob``: ``ADDJOB ... REPLICATE 3`` on the peer succeeds (it needs the
  restarted node: -NOREPL until the peer counts it reachable and linked);
* ``flags``: the peer's CLUSTER NODES shows it with no flag, connected.

Times are in ms from ``up``: what the cluster adds to the node's own start
(the interpreter's start-up is ours alone, the C server starts in a few ms:
``start`` gives it too, from the restart's fork).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from tests.support.cluster import (
    ReferenceProcess,
    flags_of,
    join,
    node_id,
    reference_server,
    wait_joined,
)
from tests.support.process import DisqueProcess, wait_for

POLL_S = 0.002


def _fresh(port: int) -> redis.Redis:
    return redis.Redis(port=port, protocol=2, socket_timeout=5, socket_connect_timeout=1)


def trial(root: Path, impl: str, node_timeout: int) -> dict[str, Any]:
    make = ReferenceProcess if impl == "original" else DisqueProcess
    nodes = [make(root / f"n{i}", "--cluster-node-timeout", str(node_timeout)).start()
             for i in range(3)]
    try:
        join(nodes)
        wait_joined(nodes, timeout=30)
        peer, restarted = nodes[0], nodes[2]
        client = peer.client()
        wait_for(lambda: client.execute_command("ADDJOB", "rejoin", "x", 0, "REPLICATE", 3),
                 timeout=10, message="ADDJOB REPLICATE 3 before the restart")
        target = node_id(restarted)
        restarted.kill()
        wait_for(lambda: all((flags_of(n, target) or set()) & {"fail?", "fail"}
                             for n in nodes[:2]),
                 timeout=10 * node_timeout / 1000 + 30, interval=0.05,
                 message="both peers to flag it failing")
        flagged = sorted(",".join(sorted(flags_of(n, target) or ())) for n in nodes[:2])

        port = restarted.port
        forked = time.monotonic()
        restarted.start(port=port)
        fresh = _fresh(port)
        wait_for(lambda: _answers(fresh), timeout=30, interval=POLL_S)
        up = time.monotonic()
        times: dict[str, Any] = {"start": (up - forked) * 1000, "flagged": flagged}
        deadline = up + 30
        while len(times) < 4 and time.monotonic() < deadline:
            now = time.monotonic()
            if "addjob" not in times:
                try:
                    client.execute_command("ADDJOB", "rejoin", "x", 1000, "REPLICATE", 3)
                    times["addjob"] = (now - up) * 1000
                except redis.ResponseError as err:
                    if "NOREPL" not in str(err):
                        raise
            if "flags" not in times:
                line = next(line for line in client.execute_command(
                    "CLUSTER", "NODES").decode().splitlines() if line.startswith(target))
                fields = line.split()
                if fields[2] == "noflags" and fields[5] == "connected":
                    times["flags"] = (now - up) * 1000
            time.sleep(POLL_S)
        return times
    finally:
        for node in nodes:
            node.kill()


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def run(trials: int, node_timeout: int) -> dict[str, Any]:
    impls = ["ours"] + (["original"] if reference_server() else [])
    root = Path(tempfile.mkdtemp(prefix="bench-rejoin-"))
    results: dict[str, list[dict[str, Any]]] = {impl: [] for impl in impls}
    for i in range(trials):
        for impl in impls:
            results[impl].append(trial(root / f"{impl}{i}", impl, node_timeout))
    summary = {}
    for impl, runs in results.items():
        summary[impl] = {key: statistics.median([r[key] for r in runs if key in r] or [-1])
                         for key in ("start", "addjob", "flags")}
        summary[impl]["addjob_from_fork"] = statistics.median(
            [r["start"] + r["addjob"] for r in runs if "addjob" in r] or [-1])
        summary[impl]["misses"] = sum(1 for r in runs if len(r) < 4)
    return {"trials": results, "median_ms": summary, "node_timeout_ms": node_timeout}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--node-timeout", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args.trials, args.node_timeout)
    for impl, med in result["median_ms"].items():
        print(f"{impl:9} median of {args.trials}: up {med['start']:.0f} ms after the fork; "
              f"then ADDJOB REPLICATE 3 ok after {med['addjob']:.0f} ms, no flags after "
              f"{med['flags']:.0f} ms; ADDJOB ok {med['addjob_from_fork']:.0f} ms after the fork "
              f"({med['misses']} trials without both)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
