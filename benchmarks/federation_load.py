"""Federation under load: bus messages per job while a producer's jobs move
to consumers on other nodes, run on demand.

    python3 -m benchmarks.federation_load [--jobs 10000] [--consumers 4] [--pipeline 1]

Three joined nodes A, B and C.  A consumer process holds ``--consumers``
redis-py connections on each of B and C, each looping ``GETJOB TIMEOUT
1000 COUNT 10 FROM q`` then one ``ACKJOB`` of what it got.  Once every
consumer is blocked, the producer adds ``--jobs`` jobs on A (``REPLICATE
1``) as fast as it can: one ADDJOB at a time, or in pipelines of
``--pipeline``.  A has no consumer, so every job crosses the bus.

Once every job was taken: the NEEDJOBS and YOURJOBS messages the three nodes
received (their metrics endpoints, summed: each message is received once),
per job; the same for the job-ID messages (QUEUED, SETACK, GOTACK, DELJOB,
...), per job; the run's time and how the jobs split between B and C.
Every figure comes from the nodes' own counters of received messages, so
it measures any version of the node the same way.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import tempfile
import threading
import time
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.cluster import join, wait_joined
from tests.support.metrics import scrape
from tests.support.process import DisqueProcess, free_ports, wait_for

QUEUE = "load"
NODE_ARGS = ("--appendonly", "no", "--maxmemory", "20gb")
#: Bus message types reported on their own; the rest of the job state
#: machine's messages are summed (gossip is left out).
FEDERATION = ("needjobs", "yourjobs")
JOB_MESSAGES = ("repljob", "gotjob", "enqueue", "queued", "setack", "willqueue", "gotack",
                "deljob", "working")


def _consumer(port: int, taken: Synchronized, stop: Any) -> None:  # type: ignore[type-arg]
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    try:
        while not stop.is_set():
            jobs = client.execute_command("GETJOB", "TIMEOUT", 1000, "COUNT", 10, "FROM", QUEUE)
            if not jobs:
                continue
            client.execute_command("ACKJOB", *[job[1] for job in jobs])
            with taken.get_lock():
                taken.value += len(jobs)
    finally:
        client.close()


def consume(ports: list[int], consumers: int, counters: list[Synchronized],  # type: ignore[type-arg]
            stop: Any) -> None:
    """The consumer process: ``consumers`` threads on each of ``ports``."""
    threads = [threading.Thread(target=_consumer, args=(port, counter, stop))
               for port, counter in zip(ports, counters, strict=True) for _ in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def received(metrics_port: int) -> dict[str, float]:
    """Bus messages the node received, by type."""
    out: dict[str, float] = {}
    for (name, labels), value in scrape(metrics_port).items():
        if name == "disque_cluster_messages_received_total":
            out[dict(labels)["type"]] = value
    return out


def total(nodes_received: list[dict[str, float]], types: tuple[str, ...]) -> float:
    return sum(counts.get(t, 0.0) for counts in nodes_received for t in types)


def run(root: Path, jobs: int, consumers: int, pipeline: int) -> dict[str, Any]:
    import redis

    metrics = free_ports(3)
    nodes = [DisqueProcess(root / f"n{i}", *NODE_ARGS, "--metrics-port", str(metrics[i])).start()
             for i in range(3)]
    spawn = multiprocessing.get_context("spawn")
    counters = [spawn.Value("l", 0), spawn.Value("l", 0)]
    stop = spawn.Event()
    process = None
    try:
        join(nodes)
        wait_joined(nodes)
        process = spawn.Process(target=consume,
                                args=([nodes[1].port, nodes[2].port], consumers, counters, stop))
        process.start()
        watchers = [nodes[i].client() for i in (1, 2)]
        wait_for(lambda: sum(int(w.info("clients")["blocked_clients"]) for w in watchers)
                 == 2 * consumers, timeout=30, message="every consumer to block")
        before = [received(port) for port in metrics]
        producer = redis.Redis(host="127.0.0.1", port=nodes[0].port, protocol=2)
        started = time.perf_counter()
        if pipeline <= 1:
            for number in range(jobs):
                producer.execute_command("ADDJOB", QUEUE, f"j{number}", 0, "REPLICATE", 1)
        else:
            for start in range(0, jobs, pipeline):
                pipe = producer.pipeline(transaction=False)
                for number in range(start, min(jobs, start + pipeline)):
                    pipe.execute_command("ADDJOB", QUEUE, f"j{number}", 0, "REPLICATE", 1)
                pipe.execute()
        added = time.perf_counter() - started
        wait_for(lambda: sum(c.value for c in counters) >= jobs, timeout=300, interval=0.05,
                 message=lambda: f"every job taken ({sum(c.value for c in counters)} of {jobs})")
        elapsed = time.perf_counter() - started
        after = [received(port) for port in metrics]
        producer.close()
    finally:
        stop.set()
        if process is not None:
            process.join(10)
            if process.is_alive():
                process.kill()
        for node in nodes:
            node.kill()
    delta = [{t: a.get(t, 0.0) - b.get(t, 0.0) for t in a} for a, b in zip(after, before,
                                                                             strict=True)]
    return {
        "jobs": jobs, "consumers_per_node": consumers, "pipeline": pipeline,
        "add_s": round(added, 3), "elapsed_s": round(elapsed, 3),
        "taken_b": counters[0].value, "taken_c": counters[1].value,
        "needjobs": total(delta, ("needjobs",)), "yourjobs": total(delta, ("yourjobs",)),
        "federation_per_job": total(delta, FEDERATION) / jobs,
        "job_messages_per_job": total(delta, JOB_MESSAGES) / jobs,
        "by_type": {t: total(delta, (t,)) for t in (*FEDERATION, *JOB_MESSAGES)},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--consumers", type=int, default=4, help="consumers on each of B and C")
    parser.add_argument("--pipeline", type=int, default=1, help="ADDJOBs per pipeline (1: none)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-federation-load-"))
    result = run(root, args.jobs, args.consumers, args.pipeline)
    how = "unpipelined" if args.pipeline <= 1 else f"pipelines of {args.pipeline}"
    print(f"{result['jobs']} jobs added on A ({how}) in {result['add_s']:.2f} s, all taken on B "
          f"({result['taken_b']}) and C ({result['taken_c']}) after {result['elapsed_s']:.2f} s")
    print(f"NEEDJOBS {result['needjobs']:.0f}, YOURJOBS {result['yourjobs']:.0f}: "
          f"{result['federation_per_job']:.3f} federation messages per job "
          f"({result['jobs'] / max(1.0, result['yourjobs']):.1f} jobs per YOURJOBS)")
    others = ", ".join(f"{t} {v:.0f}" for t, v in result["by_type"].items()
                       if v and t not in FEDERATION)
    print(f"job-ID messages: {result['job_messages_per_job']:.2f} per job ({others})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
