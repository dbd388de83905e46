"""The ``latency`` scenario: how long a job takes to reach a consumer blocked in GETJOB.

One producer process adds jobs one at a time with redis-py; a consumer
process holds redis-py connections blocked in ``GETJOB TIMEOUT ... FROM
queue``.  Before each ADDJOB the producer waits for the consumer process
to report the previous pickup, then polls the consumers' node until INFO's
``blocked_clients`` shows every consumer blocked again (not timed): each
job goes through the blocked-client path, one at a time.  The producer
writes ``time.perf_counter_ns()``, taken just before it sends the ADDJOB,
into the body; the consumer subtracts it from the same clock read as
GETJOB's reply is parsed (CLOCK_MONOTONIC is one clock for the whole
machine).  A pickup is thus the producer's
redis-py sending the command, the node reading and running it, waking the
consumer and writing its reply, and the consumer's redis-py parsing it.

The first pickup of each run is not counted (see ``WARM_UP``).  Cases,
each on a fresh node (or cluster) per round, ours and the original
(``DISQUE_REFERENCE_SERVER``) alternating:

* ``1 consumer``: one consumer blocked on one queue;
* ``50 consumers, 10 queues``: five blocked consumers per queue, the
  producer's jobs go round the queues;
* ``3 nodes``: three joined nodes (the original's in a cluster of its
  own), the job added on the first with REPLICATE 1, the consumer blocked
  on the second: the job reaches it through federation (NEEDJOBS /
  YOURJOBS), whose polling sets the figure: milliseconds, so 50 jobs
  per round.

Figures are the p50 and p99 of the pickups in µs, the medians of the
rounds; ratios are ours / the original of the same round (lower is better
for us).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.cluster import start_nodes
from tests.support.cluster import reference_server
from tests.support.process import DisqueProcess, wait_for

#: A consumer gives up when GETJOB has returned nothing for this long.
CONSUMER_TIMEOUT_MS = 60_000
STOP = b"stop"
#: Pickups not counted: the first, through fresh connections (and on a
#: cluster, the NEEDJOBS broadcast that finds the producing node at all).
WARM_UP = 1


@dataclass(frozen=True)
class Case:
    label: str
    nodes: int
    consumers: int
    queues: int
    jobs: int
    smoke_jobs: int


CASES = (Case("1 consumer", 1, 1, 1, 2000, 200),
         Case("50 consumers, 10 queues", 1, 50, 10, 2000, 200),
         Case("3 nodes, added on one, taken on another", 3, 1, 1, 50, 5))


def queue_name(index: int) -> str:
    return f"latency-{index}"


def _consumer(port: int, queue: str, report: Connection, lock: threading.Lock) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    try:
        while True:
            reply = client.execute_command("GETJOB", "TIMEOUT", CONSUMER_TIMEOUT_MS,
                                           "FROM", queue)
            now = time.perf_counter_ns()
            if not reply:
                raise RuntimeError(f"GETJOB FROM {queue}: no job within "
                                   f"{CONSUMER_TIMEOUT_MS} ms")
            body = reply[0][2]
            if body == STOP:
                return
            with lock:
                report.send(now - int(body))
    finally:
        client.close()


def consume(port: int, consumers: int, queues: int, report: Connection) -> None:
    """The consumer process: ``consumers`` threads round the queues, each pickup (ns) reported."""
    lock = threading.Lock()
    failures: list[BaseException] = []

    def run(queue: str) -> None:
        try:
            _consumer(port, queue, report, lock)
        except BaseException as exc:
            failures.append(exc)
            raise

    threads = [threading.Thread(target=run, args=(queue_name(i % queues),))
               for i in range(consumers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{len(failures)} consumer(s) failed: {failures[0]!r}")


def blocked_clients(client: Any) -> int:
    """INFO's ``blocked_clients``, through a connection kept open (no connect per poll)."""
    return int(client.info("clients")["blocked_clients"])


def produce(nodes: list[DisqueProcess], case: Case, jobs: int) -> list[int]:
    """Add ``jobs`` jobs one at a time, each once every consumer is blocked; the pickups (ns)."""
    import redis

    consumer_node = nodes[1] if case.nodes > 1 else nodes[0]
    replicate = ["REPLICATE", "1"] if case.nodes > 1 else []
    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    process = spawn.Process(target=consume,
                            args=(consumer_node.port, case.consumers, case.queues, send))
    process.start()
    producer = redis.Redis(host="127.0.0.1", port=nodes[0].port, protocol=2)
    watcher = redis.Redis(host="127.0.0.1", port=consumer_node.port, protocol=2)
    pickups: list[int] = []

    def taken() -> int:
        if not receive.poll(CONSUMER_TIMEOUT_MS / 1000):
            raise RuntimeError(f"{case.label}: job {len(pickups) + 1} was not taken")
        pickup: int = receive.recv()
        return pickup

    try:
        for number in range(WARM_UP + jobs):
            # The previous job was taken, and its consumer is blocked again.
            if number:
                pickups.append(taken())
            wait_for(lambda: blocked_clients(watcher) == case.consumers, timeout=30,
                     interval=0, message="every consumer to block in GETJOB")
            queue = queue_name(number % case.queues)
            producer.execute_command("ADDJOB", queue, str(time.perf_counter_ns()), 0,
                                     *replicate)
        pickups.append(taken())
        # One STOP per consumer of each queue: each consumer takes one and returns.
        for number in range(case.consumers):
            producer.execute_command("ADDJOB", queue_name(number % case.queues), STOP, 0,
                                     *replicate)
        process.join(CONSUMER_TIMEOUT_MS / 1000)
    finally:
        producer.close()
        watcher.close()
        if process.is_alive():
            process.kill()
            process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"{case.label}: the consumer process exited with {process.exitcode}")
    return pickups[WARM_UP:]


def percentile(values: list[int], share: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(share * len(ordered)))])


def _round(impl: str, root: Path, tag: str, case: Case, jobs: int) -> dict[str, Any]:
    nodes = start_nodes(root, impl, case.nodes, tag)
    try:
        pickups = produce(nodes, case, jobs)
    finally:
        for node in nodes:
            node.kill()
    return {"p50_us": percentile(pickups, 0.5) / 1000, "p99_us": percentile(pickups, 0.99) / 1000,
            "max_us": max(pickups) / 1000, "jobs": len(pickups),
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


def scenario_latency(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.run import median, print_table

    impls = ["ours"] + (["original"] if reference_server() else [])
    if len(impls) == 1:
        print("DISQUE_REFERENCE_SERVER is not set: measuring ours only")
    rounds: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = impls if rnd % 2 == 0 else impls[::-1]
        this: dict[str, Any] = {"order": order}
        for case in CASES:
            jobs = args.requests or (case.smoke_jobs if args.smoke else case.jobs)
            for impl in order:
                print(f"round {rnd + 1}/{args.rounds}: {case.label}, {impl} ...", flush=True)
                result = _round(impl, root, f"r{rnd}-{case.nodes}-{case.consumers}", case, jobs)
                print(f"  p50 {result['p50_us']:.0f} µs, p99 {result['p99_us']:.0f} µs, "
                      f"load {' '.join(map(str, result['loadavg']))}", flush=True)
                this[f"{case.label}/{impl}"] = result
        rounds.append(this)

    table: list[dict[str, Any]] = []
    for case in CASES:
        row: dict[str, Any] = {"case": case.label}
        for impl in impls:
            for figure in ("p50_us", "p99_us"):
                row[f"{impl}_{figure}"] = median([r[f"{case.label}/{impl}"][figure]
                                                  for r in rounds])
        if "original" in impls:
            for figure in ("p50_us", "p99_us"):
                ratios = [r[f"{case.label}/ours"][figure] / r[f"{case.label}/original"][figure]
                          for r in rounds]
                row[f"ratio_{figure}"] = median(ratios)
                row[f"ratios_{figure}"] = [round(x, 3) for x in ratios]
        table.append(row)
    print()
    print(f"latency: ADDJOB to a consumer blocked in GETJOB (redis-py), µs, medians of "
          f"{args.rounds} round(s); ratio = ours / the original of the same round")
    headers = ["case", "ours p50", "ours p99"]
    if "original" in impls:
        headers += ["original p50", "original p99", "ratio p50", "ratio p99"]
    print_table(headers, [[row["case"], row["ours_p50_us"], row["ours_p99_us"]]
                          + ([row["original_p50_us"], row["original_p99_us"],
                              row["ratio_p50_us"], row["ratio_p99_us"]]
                             if "original" in impls else [])
                          for row in table])
    return {"table": table, "rounds": rounds}
