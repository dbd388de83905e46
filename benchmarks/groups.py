"""Ordered groups under load: 50 consumers draining 10,000 groups against the
same load without groups (``python3 -m benchmarks.run groups``).

Each round starts a fresh node and runs both loads on it, alternating
which goes first:

* **fill**: ``--jobs`` jobs (default 100,000) added in pipelines of 100,
  ``ADDJOB q <body> 0`` with ``GROUP g<i mod groups>`` or without: with
  groups every key gets ``jobs / groups`` jobs, interleaved, so a key's next
  job is always behind jobs of other keys;
* **drain**: ``--consumers`` connections (default 50, in 5 processes of
  threads so that the client's GIL is not the bottleneck) each loop
  ``GETJOB TIMEOUT 100 WITHGROUP FROM q`` then ``ACKJOB`` of the job
  (a worker's cycle, one job at a time), until every job was acknowledged.

Reported per load: fill and drain rates (jobs/s) and the node's CPU
seconds spent draining (``INFO`` ``used_cpu_user + used_cpu_sys``), and the
ratio of groups to no groups per round.  The drain also checks the groups'
promise on the way, from the consumers' records (``CLOCK_MONOTONIC`` is one
clock for every process): per group, jobs acknowledged in add order and no
two held at once (a job is held from GETJOB's reply until its ACKJOB is sent); any
breach is reported, and makes the run fail.

On this 2-core machine the node, the producer and the consumers share the
cores: the drain rate is the whole system's, the CPU seconds are the
node's alone.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.process import DisqueProcess, wait_for

QUEUE = "grouped"
BODY = "x" * 64
NODE_ARGS = ("--appendonly", "no", "--maxmemory", "20gb")
CONSUMER_PROCESSES = 5
#: (job ID, group or "", monotonic seconds at GETJOB's reply, before ACKJOB)
Record = tuple[str, str, float, float]


def _consume(port: int, records: list[Record], go: Any, done: threading.Event) -> None:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    try:
        client.ping()
        go.wait()
        while not done.is_set():
            jobs = client.execute_command("GETJOB", "TIMEOUT", 100, "WITHGROUP", "FROM", QUEUE)
            if not jobs:
                continue
            got = time.monotonic()
            job = jobs[0]
            job_id = job[1].decode()
            group = job[-1]  # WITHGROUP: the key comes last (nil without one)
            # Held until the ACKJOB is sent: the node may hand the group's
            # next job out before this thread reads the ACKJOB's reply.
            records.append((job_id, group.decode() if group else "", got, time.monotonic()))
            client.execute_command("ACKJOB", job_id)
    finally:
        client.close()


def consumer_process(port: int, threads: int, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """``threads`` consumers on ``port``, connected, then taking jobs from
    ``go`` until ``stop``; their records go to ``out``."""
    done = threading.Event()
    records: list[list[Record]] = [[] for _ in range(threads)]
    workers = [threading.Thread(target=_consume, args=(port, records[i], go, done))
               for i in range(threads)]
    for worker in workers:
        worker.start()
    with ready.get_lock():
        ready.value += 1
    stop.wait()
    done.set()
    for worker in workers:
        worker.join()
    out.put([record for part in records for record in part])


def fill(port: int, jobs: int, groups: int) -> tuple[float, dict[str, list[str]]]:
    """Add ``jobs`` jobs (grouped when ``groups``); seconds taken, and each
    group's job IDs in add order."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    order: dict[str, list[str]] = defaultdict(list)
    started = time.perf_counter()
    for start in range(0, jobs, 100):
        pipe = client.pipeline(transaction=False)
        keys = [f"g{number % groups}" if groups else "" for number in range(start,
                                                                           min(jobs, start + 100))]
        for key in keys:
            if key:
                pipe.execute_command("ADDJOB", QUEUE, BODY, 0, "GROUP", key)
            else:
                pipe.execute_command("ADDJOB", QUEUE, BODY, 0)
        for key, job_id in zip(keys, pipe.execute(), strict=True):
            if key:
                order[key].append(job_id.decode())
    elapsed = time.perf_counter() - started
    client.close()
    return elapsed, order


def cpu_seconds(node: DisqueProcess) -> float:
    cpu = node.client().info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def breaches(order: dict[str, list[str]], records: list[Record]) -> dict[str, int]:
    """Per group: acknowledgements out of add order, and pairs of jobs held
    at once (each consumer acknowledges a job before it asks for the next)."""
    by_group: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        if record[1]:
            by_group[record[1]].append(record)
    out_of_order = overlapping = 0
    for group, held in by_group.items():
        held.sort(key=lambda record: record[2])
        if [record[0] for record in held] != order[group][:len(held)]:
            out_of_order += 1
        overlapping += sum(1 for before, after in itertools.pairwise(held) if after[2] < before[3])
    return {"groups_out_of_order": out_of_order, "overlapping_holds": overlapping}


def drain(node: DisqueProcess, jobs: int, consumers: int) -> tuple[float, float, list[Record]]:
    """Run the consumers until ``jobs`` jobs were acknowledged: seconds,
    the node's CPU seconds, the records."""
    spawn = multiprocessing.get_context("spawn")
    ready, go, stop, out = spawn.Value("i", 0), spawn.Event(), spawn.Event(), spawn.Queue()
    per_process = [consumers // CONSUMER_PROCESSES + (i < consumers % CONSUMER_PROCESSES)
                   for i in range(CONSUMER_PROCESSES)]
    processes = [spawn.Process(target=consumer_process,
                               args=(node.port, n, ready, go, stop, out))
                 for n in per_process if n]
    for process in processes:
        process.start()
    watcher = node.client()
    try:
        wait_for(lambda: ready.value == len(processes), timeout=60,
                 message="the consumer processes to start")
        cpu_before = cpu_seconds(node)
        started = time.perf_counter()
        go.set()
        # A single node forgets a job when it is acknowledged.
        wait_for(lambda: int(watcher.info("jobs")["registered_jobs"]) == 0,
                 timeout=600, interval=0.02, message="every job acknowledged")
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(node) - cpu_before
    finally:
        stop.set()
    records = [record for _ in processes for record in out.get(timeout=60)]
    for process in processes:
        process.join(10)
        if process.is_alive():
            process.kill()
    return elapsed, cpu, records


def one_load(root: Path, name: str, jobs: int, groups: int, consumers: int) -> dict[str, Any]:
    node = DisqueProcess(root / name, *NODE_ARGS).start()
    try:
        fill_s, order = fill(node.port, jobs, groups)
        drain_s, cpu, records = drain(node, jobs, consumers)
    finally:
        node.kill()
    acked = {record[0] for record in records}
    result: dict[str, Any] = {
        "jobs": jobs, "groups": groups, "acknowledged": len(acked),
        "fill_jobs_per_s": round(jobs / fill_s), "drain_jobs_per_s": round(jobs / drain_s),
        "node_cpu_s": round(cpu, 2), "node_cpu_us_per_job": round(cpu / jobs * 1e6, 1),
    }
    if groups:
        result.update(breaches(order, records))
    return result


def scenario_groups(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    jobs = 5_000 if args.smoke else args.requests or 100_000
    groups = 500 if args.smoke else 10_000
    consumers = 50
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        loads = [("groups", groups), ("no groups", 0)]
        if number % 2:
            loads.reverse()
        rnd = {label: one_load(root, f"r{number}-{count}", jobs, count, consumers)
               for label, count in loads}
        for label, run in rnd.items():
            print(f"round {number + 1} {label}: fill {run['fill_jobs_per_s']:,} jobs/s, drain "
                  f"{run['drain_jobs_per_s']:,} jobs/s, node {run['node_cpu_us_per_job']} µs "
                  f"CPU/job" + (f", groups out of order {run['groups_out_of_order']}, "
                                f"overlapping holds {run['overlapping_holds']}"
                                if label == "groups" else ""), flush=True)
        rounds.append(rnd)
    summary: dict[str, Any] = {"jobs": jobs, "groups": groups, "consumers": consumers,
                               "rounds": rounds}
    for key in ("fill_jobs_per_s", "drain_jobs_per_s", "node_cpu_us_per_job"):
        ratios = [rnd["groups"][key] / rnd["no groups"][key] for rnd in rounds]
        summary[f"ratio_{key}"] = {"median": round(statistics.median(ratios), 3),
                                   "rounds": [round(r, 3) for r in ratios]}
        print(f"groups / no groups, {key}: median {summary[f'ratio_{key}']['median']} "
              f"(rounds {' '.join(f'{r:.2f}' for r in ratios)})")
    failed = [rnd["groups"] for rnd in rounds
              if rnd["groups"]["groups_out_of_order"] or rnd["groups"]["overlapping_holds"]
              or any(run["acknowledged"] != jobs for run in rnd.values())]
    if failed:
        print(f"the groups' promise or a job was broken: {failed}", file=sys.stderr)
        raise SystemExit(1)
    return summary
