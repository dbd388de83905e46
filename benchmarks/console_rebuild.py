"""What one rebuild of the console's queue table costs the console, profiled.

A real node (this checkout's) holds ``--queues`` queues (10,000) of 10 jobs
each; the console's own :class:`~disque.console.queue_index.QueueIndex`
rebuilds its table over it ``--rounds`` times (after one to warm up), in
this process: the wall time of each rebuild, the console's CPU time (its
parsing of the QSTAT replies, the client's reading of them), the sorts the
pages then ask for, and with ``--profile`` cProfile's top functions over
the timed rebuilds.  It is the part of ``benchmarks.console`` that
competes with a node for the cores when both run on one machine.

Usage (from the repository root)::

    DISQUE_INTERPRETED=1 python3 -m benchmarks.console_rebuild [--queues N] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from disque.client import Client
from disque.console.nodes import Credentials, Pool
from disque.console.queue_index import QueueIndex
from disque.console.settings import Settings
from tests.support.process import DisqueProcess


async def measure(port: int, rounds: int, profile: cProfile.Profile | None
                  ) -> list[tuple[float, float, float]]:
    address = f"127.0.0.1:{port}"
    pool = Pool((address,), Credentials(), Settings(nodes=(address,)))
    index = QueueIndex(pool)
    await index.get(fresh=True)  # connections made, nodes found
    out = []
    try:
        for _ in range(rounds):
            wall, cpu = time.perf_counter(), time.process_time()
            if profile is not None:
                profile.enable()
            snapshot = await index._rebuild()
            if profile is not None:
                profile.disable()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            sorts = time.process_time()
            for column in ("length", "name"):
                snapshot.ordered(column, column != "name")
            out.append((wall, cpu, time.process_time() - sorts))
    finally:
        await pool.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="What one rebuild of the console's queue table costs the console.")
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile the rebuilds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="console-rebuild-") as tmp:
        node = DisqueProcess(Path(tmp) / "node").start()
        try:
            with Client(f"127.0.0.1:{node.port}", randomize=False) as c:
                for q in range(args.queues):
                    c.add_jobs(f"q:{q:05d}", [b"x"] * 10, retry=3600)
            profile = cProfile.Profile() if args.profile else None
            times = asyncio.run(measure(node.port, args.rounds, profile))
        finally:
            node.kill()
    print(f"{args.queues} queues, {args.rounds} rebuilds (ms): wall, console CPU, two sorts")
    for wall, cpu, sorts in times:
        print(f"  {wall * 1000:7.1f} {cpu * 1000:7.1f} {sorts * 1000:6.1f}")
    print(f"  median wall {statistics.median(t[0] for t in times) * 1000:.1f} ms, "
          f"CPU {statistics.median(t[1] for t in times) * 1000:.1f} ms")
    if profile is not None:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(15)
        print(text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
