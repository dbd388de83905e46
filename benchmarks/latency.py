"""The ``latency`` scenario: how long a job takes to reach a consumer blocked in GETJOB.

One producer process adds jobs one at a time with redis-py; a consumer
process holds redis-py connections blocked in ``GETJOB TIMEOUT ... FROM
queue``.  Before each ADDJOB the producer waits for the consumer process
to report the previous pickup, then polls the consumers' nodes until INFO's
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
* ``3 nodes, added on one, taken on another``: three joined nodes (the
  original's in a cluster of its own), the job added on the first with
  REPLICATE 1, the consumer blocked on the second: the job reaches it
  through federation (NEEDJOBS / YOURJOBS);
* ``3 nodes, added on a random other node``: the same, each job added on
  the first or the third node, at random (a seeded choice, the same for
  both implementations in a round): every pickup crosses nodes, from
  whichever node the job happens to be added on;
* ``3 nodes, 50 consumers, 10 queues``: the consumers of queue *i* (five
  per queue) on node *i* mod 3, so every node has consumers; each job
  goes round the queues and is added on one of the two nodes without
  consumers of its queue, at random: every pickup crosses nodes.

The cross-node cases run fewer jobs per round on the original
(``Case.original_jobs``): its federation takes about a second per pickup
(its NEEDJOBS polling), where ours pushes the job to the waiting node.
``--case TEXT`` runs only the cases whose label contains it.

Figures are the p50 and p99 of the pickups in µs, the medians of the
rounds; ratios are ours / the original of the same round (lower is better
for us).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from benchmarks.cluster import start_nodes
from tests.support.cluster import reference_server
from tests.support.process import DisqueProcess, wait_for

#: A consumer's GETJOB TIMEOUT (it then blocks again), and how long the
#: producer waits for a job to be taken before it gives up.
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
    #: Where jobs are added: "first" (node 0), or "random" (a random node
    #: without consumers of the job's queue).
    producer: str = "first"
    #: Consumers of queue i on node i mod nodes, rather than all on one node
    #: (the second of a cluster, the only one of a lone node).
    spread: bool = False
    #: Jobs per round on the original, where fewer than ``jobs`` (0: as many).
    original_jobs: int = 0
    original_smoke_jobs: int = 0

    def consumer_node(self, queue: int) -> int:
        """The node the consumers of queue ``queue`` block on."""
        if self.nodes == 1:
            return 0
        return queue % self.nodes if self.spread else 1

    def producer_nodes(self, queue: int) -> list[int]:
        """The nodes a job of queue ``queue`` may be added on."""
        if self.producer == "first":
            return [0]
        return [n for n in range(self.nodes) if n != self.consumer_node(queue)]

    def job_count(self, impl: str, smoke: bool) -> int:
        if impl == "original":
            count = self.original_smoke_jobs if smoke else self.original_jobs
            if count:
                return count
        return self.smoke_jobs if smoke else self.jobs


CASES = (Case("1 consumer", 1, 1, 1, 2000, 200),
         Case("50 consumers, 10 queues", 1, 50, 10, 2000, 200),
         Case("3 nodes, added on one, taken on another", 3, 1, 1, 1000, 20,
              original_jobs=30, original_smoke_jobs=5),
         Case("3 nodes, added on a random other node", 3, 1, 1, 1000, 20, producer="random",
              original_jobs=30, original_smoke_jobs=3),
         Case("3 nodes, 50 consumers, 10 queues", 3, 50, 10, 1000, 20, producer="random",
              spread=True, original_jobs=30, original_smoke_jobs=3))


def queue_name(index: int) -> str:
    return f"latency-{index}"


def _consumer(port: int, queue: str, report: Connection, lock: threading.Lock,
              seen: set[bytes]) -> None:
    import redis

    # redis-py 8 times a read out after 5 s by default: a consumer of one of
    # ten queues waits ten pickups, seconds each on the original's federation.
    client = redis.Redis(host="127.0.0.1", port=port, protocol=2,
                         socket_timeout=CONSUMER_TIMEOUT_MS / 1000 + 10)
    try:
        while True:
            reply = client.execute_command("GETJOB", "TIMEOUT", CONSUMER_TIMEOUT_MS,
                                           "FROM", queue)
            now = time.perf_counter_ns()
            if not reply:
                # One of many consumers of a queue may wait longer than this
                # (on the original's federation, seconds a pickup): wait again.
                # The producer gives up on a job not taken in time.
                continue
            _, job_id, body = reply[0]
            if body == STOP:
                return
            with lock:
                # Jobs are not acknowledged: one still unacked after its
                # RETRY (300 s, a run of seconds per pickup) comes again.
                if job_id not in seen:
                    seen.add(job_id)
                    report.send(now - int(body))
    finally:
        client.close()


def consume(ports: list[int], consumers: int, queues: int, report: Connection) -> None:
    """The consumer process: ``consumers`` threads round the queues, consumer
    ``i`` on queue ``i % queues`` at ``ports[i % queues]``, each pickup (ns)
    reported."""
    lock = threading.Lock()
    seen: set[bytes] = set()
    failures: list[BaseException] = []

    def run(port: int, queue: str) -> None:
        try:
            _consumer(port, queue, report, lock, seen)
        except BaseException as exc:
            failures.append(exc)
            raise

    threads = [threading.Thread(target=run, args=(ports[i % queues], queue_name(i % queues)))
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


def produce(nodes: list[DisqueProcess], case: Case, jobs: int, seed: int = 0) -> list[int]:
    """Add ``jobs`` jobs one at a time, each once every consumer is blocked; the pickups (ns)."""
    import redis

    replicate = ["REPLICATE", "1"] if case.nodes > 1 else []
    ports = [nodes[case.consumer_node(q)].port for q in range(case.queues)]
    watched = sorted({case.consumer_node(q) for q in range(case.queues)})
    spawn = multiprocessing.get_context("spawn")
    receive, send = spawn.Pipe(duplex=False)
    process = spawn.Process(target=consume, args=(ports, case.consumers, case.queues, send))
    process.start()
    producers = [redis.Redis(host="127.0.0.1", port=node.port, protocol=2) for node in nodes]
    watchers = [redis.Redis(host="127.0.0.1", port=nodes[n].port, protocol=2) for n in watched]
    choose = random.Random(seed)
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
            wait_for(lambda: sum(blocked_clients(w) for w in watchers) == case.consumers,
                     timeout=30, interval=0, message="every consumer to block in GETJOB")
            index = number % case.queues
            producer = producers[choose.choice(case.producer_nodes(index))]
            producer.execute_command("ADDJOB", queue_name(index), str(time.perf_counter_ns()),
                                     0, *replicate)
        pickups.append(taken())
        # One STOP per consumer of each queue, added where its consumers are
        # (no federation to wait for): each consumer takes one and returns.
        for number in range(case.consumers):
            index = number % case.queues
            producers[case.consumer_node(index)].execute_command(
                "ADDJOB", queue_name(index), STOP, 0, *replicate)
        process.join(CONSUMER_TIMEOUT_MS / 1000)
    finally:
        for client in (*producers, *watchers):
            client.close()
        if process.is_alive():
            process.kill()
            process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"{case.label}: the consumer process exited with {process.exitcode}")
    return pickups[WARM_UP:]


def percentile(values: list[int], share: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(share * len(ordered)))])


def _round(impl: str, root: Path, tag: str, case: Case, jobs: int,
           seed: int) -> dict[str, Any]:
    nodes = start_nodes(root, impl, case.nodes, tag)
    try:
        pickups = produce(nodes, case, jobs, seed)
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
    cases = [case for case in CASES if not args.case or args.case in case.label]
    rounds: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        order = impls if rnd % 2 == 0 else impls[::-1]
        this: dict[str, Any] = {"order": order}
        for number, case in enumerate(cases):
            for impl in order:
                jobs = args.requests or case.job_count(impl, args.smoke)
                print(f"round {rnd + 1}/{args.rounds}: {case.label}, {impl}, {jobs} jobs ...",
                      flush=True)
                result = _round(impl, root, f"r{rnd}-{number}", case, jobs, seed=rnd)
                print(f"  p50 {result['p50_us']:.0f} µs, p99 {result['p99_us']:.0f} µs, "
                      f"load {' '.join(map(str, result['loadavg']))}", flush=True)
                this[f"{case.label}/{impl}"] = result
        rounds.append(this)

    table: list[dict[str, Any]] = []
    for case in cases:
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
                              # Across nodes ours is thousands of times faster:
                              # three significant digits, not two decimals.
                              f"{row['ratio_p50_us']:.3g}", f"{row['ratio_p99_us']:.3g}"]
                             if "original" in impls else [])
                          for row in table])
    return {"table": table, "rounds": rounds}
