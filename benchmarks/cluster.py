"""The ``cluster`` scenario: ADDJOB on a 3-node cluster against one node.

For each implementation (ours, and the original when
``DISQUE_REFERENCE_SERVER`` names its binary), in rotating order per round:

* one lone node: ``ADDJOB q body 0`` (a lone node replicates to nobody);
* three joined nodes, load on the first: ``ADDJOB q body 0`` (the default
  REPLICATE, 3: every copy confirmed before the reply), ``... REPLICATE 2``
  and ``... ASYNC`` (replicated after the reply).

``redis-benchmark``, 50 clients, unpipelined and ``-P 16``.  Each cluster
figure is divided by the same implementation's lone-node figure of the same
round (the target for ours: >= 0.6x unpipelined, >= 0.4x with -P 16),
and every run is checked: the first node must hold one job per request
(redis-benchmark counts ``-NOREPL`` answers as successes).

Then, on the same nodes, the produce/get/ack cycle: one redis-py client (the
same code for both implementations) adds ``--cycle-jobs`` jobs in pipelines
of 100 ADDJOBs, then takes them with ``GETJOB NOHANG COUNT 100`` and
acknowledges each batch with one ACKJOB, all on the first node; jobs/s over
the whole cycle.  On three nodes every job is replicated and every ACK
collected cluster-wide; the run is checked: every node's job table must be
empty within 30 s of the last ACKJOB.

Every run also records the CPU each process spent per request (the node
the load goes to and each peer, their main threads' time on a CPU from
``/proc/PID/schedstat``; ``redis-benchmark``, from ``getrusage``) and the
machine's steal time: on a small machine the rates follow the CPU the
processes need together, and the second table shows where it goes.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.redis_tools import (
    benchmark_command,
    machine_cpu_ticks,
    main_thread_cpu_s,
    run_benchmark,
)
from tests.support.cluster import ReferenceProcess, join, reference_server, wait_joined
from tests.support.process import DisqueProcess, raw_command, wait_for

CLUSTER_TESTS: list[tuple[str, list[str]]] = [
    ("ADDJOB q body 0 (REPLICATE 3)", ["ADDJOB", "q", "body", "0"]),
    ("ADDJOB q body 0 REPLICATE 2", ["ADDJOB", "q", "body", "0", "REPLICATE", "2"]),
    ("ADDJOB q body 0 ASYNC (REPLICATE 3)", ["ADDJOB", "q", "body", "0", "ASYNC"]),
]
SINGLE = ["ADDJOB", "q", "body", "0"]
NODE_ARGS = ("--appendonly", "no", "--maxmemory", "20gb")


def start_nodes(root: Path, impl: str, size: int, tag: str) -> list[DisqueProcess]:
    nodes: list[DisqueProcess] = []
    for i in range(size):
        workdir = root / f"{tag}-{impl}-{size}-{i}"
        node = (ReferenceProcess(workdir, *NODE_ARGS) if impl == "original"
                else DisqueProcess(workdir, *NODE_ARGS))
        nodes.append(node.start())
    if size > 1:
        join(nodes)
        wait_joined(nodes)
    return nodes


#: Seconds a node may take to answer INFO or DEBUG FLUSHALL between runs:
#: after -P 16 runs of the default size the original still works through
#: its backlog of ASYNC copies, and empties over a million jobs.
ADMIN_TIMEOUT_S = 120.0


def registered_jobs(port: int) -> int:
    text = raw_command(port, "INFO", "jobs", timeout=ADMIN_TIMEOUT_S)
    assert isinstance(text, bytes)
    for line in text.decode().splitlines():
        if line.startswith("registered_jobs:"):
            return int(line.split(":")[1])
    raise RuntimeError("no registered_jobs in INFO")


def machine_steal() -> tuple[int, int]:
    """(steal ticks, all ticks) of the whole machine."""
    ticks = machine_cpu_ticks()
    return ticks[7], sum(ticks)


def measured_run(nodes: list[DisqueProcess], cmd: list[str], count: int,
                 pipeline: int) -> dict[str, Any]:
    """One redis-benchmark run, with the CPU each process spent per request.

    The ratio of two rates moves with whatever else the machine does; the
    CPU per request of the node, of each peer and of the load generator
    does much less, and shows which process bounds the rate. ``steal`` is
    the share of the machine's time the hypervisor gave to others.
    """
    before = [main_thread_cpu_s(n.pid) for n in nodes]
    load_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    steal_before = machine_steal()
    result = run_benchmark(benchmark_command(nodes[0].port, cmd, requests=count,
                                             pipeline=pipeline))
    steal_after = machine_steal()
    load_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = [main_thread_cpu_s(n.pid) for n in nodes]
    load = (load_after.ru_utime + load_after.ru_stime) - (load_before.ru_utime
                                                          + load_before.ru_stime)
    result["cpu_us_per_request"] = [round((b - a) / count * 1e6, 2)
                                    for a, b in zip(before, after, strict=True)]
    result["load_generator_cpu_us_per_request"] = round(load / count * 1e6, 2)
    result["steal"] = round((steal_after[0] - steal_before[0])
                            / max(1, steal_after[1] - steal_before[1]), 4)
    return result


def run_tests(nodes: list[DisqueProcess], tests: list[tuple[str, list[str]]],
              requests: dict[int, int]) -> dict[str, Any]:
    port = nodes[0].port
    results: dict[str, Any] = {}
    expected = 0
    for pipeline, count in requests.items():
        for label, cmd in tests:
            results[f"{label} P{pipeline}"] = measured_run(nodes, cmd, count, pipeline)
            expected += count
            held = registered_jobs(port)
            if held != expected:
                raise RuntimeError(f"{label} -P {pipeline}: the node holds {held} jobs, "
                                   f"expected {expected}: some ADDJOBs failed")
    return results


CYCLE_BATCH = 100


def cycle(nodes: list[DisqueProcess], jobs: int) -> dict[str, Any]:
    """Produce, get and ack ``jobs`` jobs through the first node (redis-py pipelines)."""
    import redis

    r = redis.Redis(host="127.0.0.1", port=nodes[0].port, protocol=2)
    try:
        start = time.perf_counter()
        for first in range(0, jobs, CYCLE_BATCH):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(CYCLE_BATCH, jobs - first)):
                pipe.execute_command("ADDJOB", "cycle", b"x" * 100, 0)
            pipe.execute()
        produced = time.perf_counter()
        done = 0
        while done < jobs:
            got = r.execute_command("GETJOB", "NOHANG", "COUNT", CYCLE_BATCH, "FROM", "cycle")
            if not got:
                raise RuntimeError(f"queue empty after {done} of {jobs} jobs")
            r.execute_command("ACKJOB", *[job[1] for job in got])
            done += len(got)
        end = time.perf_counter()
    finally:
        r.close()
    wait_for(lambda: all(registered_jobs(n.port) == 0 for n in nodes), timeout=30,
             message="the ACKs to remove every job from every node")
    return {"jobs": jobs, "produce_s": produced - start, "consume_s": end - produced,
            "jobs_per_s": jobs / (end - start)}


def _flushed(nodes: list[DisqueProcess]) -> bool:
    """DEBUG FLUSHALL on every node (it is local), then whether all are empty.

    Again until they are: copies still on their way when a node flushed
    (the original's ASYNC REPLJOBs, queued behind a -P 16 run's) land
    after it and stay.
    """
    for node in nodes:
        raw_command(node.port, "DEBUG", "FLUSHALL", timeout=ADMIN_TIMEOUT_S)
    return all(registered_jobs(n.port) == 0 for n in nodes)


def scenario_cluster(args: argparse.Namespace, root: Path,
                     request_counts: dict[int, int]) -> dict[str, Any]:
    impls = ["ours"] + (["original"] if reference_server() else [])
    if len(impls) == 1:
        print("DISQUE_REFERENCE_SERVER is not set: measuring ours only")
    sides = [(impl, size) for impl in impls for size in (1, 3)]
    rounds: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        shift = rnd % len(sides)
        order = sides[shift:] + sides[:shift]
        this: dict[str, Any] = {"order": [f"{i}/{s}" for i, s in order]}
        for impl, size in order:
            print(f"round {rnd + 1}/{args.rounds}: {impl}, {size} node(s) ...", flush=True)
            nodes = start_nodes(root, impl, size, f"r{rnd}")
            try:
                tests = CLUSTER_TESTS if size > 1 else [("single", SINGLE)]
                this[f"{impl}/{size}"] = run_tests(nodes, tests, request_counts)
                wait_for(partial(_flushed, nodes), timeout=30, interval=0.5,
                         message="DEBUG FLUSHALL to empty every node")
                this[f"{impl}/{size}"]["cycle"] = cycle(nodes, args.cycle_jobs)
            finally:
                for node in nodes:
                    node.kill()
        rounds.append(this)

    from benchmarks.run import median, print_table

    table: list[dict[str, Any]] = []
    for impl in impls:
        for pipeline in request_counts:
            singles = [r[f"{impl}/1"][f"single P{pipeline}"]["rps"] for r in rounds]
            table.append({"impl": impl, "test": "ADDJOB q body 0, one node",
                          "pipeline": pipeline, "rps": median(singles), "ratio": 1.0})
            for label, _ in CLUSTER_TESTS:
                figures = [r[f"{impl}/3"][f"{label} P{pipeline}"]["rps"] for r in rounds]
                ratios = [c / s for c, s in zip(figures, singles, strict=True)]
                table.append({"impl": impl, "test": f"3 nodes: {label}", "pipeline": pipeline,
                              "rps": median(figures), "ratio": median(ratios),
                              "ratios": [round(x, 3) for x in ratios]})
    for impl in impls:
        singles = [r[f"{impl}/1"]["cycle"]["jobs_per_s"] for r in rounds]
        figures = [r[f"{impl}/3"]["cycle"]["jobs_per_s"] for r in rounds]
        ratios = [c / s for c, s in zip(figures, singles, strict=True)]
        table.append({"impl": impl, "test": "produce/get/ack cycle, one node (jobs/s)",
                      "pipeline": CYCLE_BATCH, "rps": median(singles), "ratio": 1.0})
        table.append({"impl": impl, "test": "produce/get/ack cycle, 3 nodes (jobs/s)",
                      "pipeline": CYCLE_BATCH, "rps": median(figures), "ratio": median(ratios),
                      "ratios": [round(x, 3) for x in ratios]})
    print()
    print(f"cluster: redis-benchmark, 50 clients, medians of {args.rounds} round(s); "
          "ratio = 3-node figure / the same implementation's one-node figure, same round")
    print_table(["implementation", "test", "-P", "rps", "ratio"],
                [[t["impl"], t["test"], t["pipeline"], t["rps"], t["ratio"]] for t in table])
    cpu = cpu_table(rounds, impls, request_counts)
    print()
    print("CPU per request (us, medians of the rounds; time on a CPU of each process): "
          "the node the load goes to, each peer, redis-benchmark; steal = the share of the "
          "machine's time the hypervisor gave elsewhere")
    print_table(["implementation", "test", "-P", "node", "peers", "load gen.", "steal"],
                [[c["impl"], c["test"], c["pipeline"], c["node"], c["peers"], c["load"],
                  c["steal"]] for c in cpu])
    return {"requests": {str(k): v for k, v in request_counts.items()}, "table": table,
            "cpu": cpu, "rounds": rounds}


def cpu_table(rounds: list[dict[str, Any]], impls: list[str],
              request_counts: dict[int, int]) -> list[dict[str, Any]]:
    """Each run's CPU per request, as the medians of the rounds."""
    rows: list[dict[str, Any]] = []
    for impl in impls:
        for pipeline in request_counts:
            tests = [("one node", "1", "single")] + [
                (f"3 nodes: {label}", "3", label) for label, _ in CLUSTER_TESTS]
            for test, size, key in tests:
                runs = [r[f"{impl}/{size}"][f"{key} P{pipeline}"] for r in rounds]
                per_node = [run["cpu_us_per_request"] for run in runs]
                rows.append({
                    "impl": impl, "test": test, "pipeline": pipeline,
                    "node": round(statistics.median(n[0] for n in per_node), 1),
                    "peers": " ".join(f"{statistics.median(n[i] for n in per_node):.1f}"
                                      for i in range(1, len(per_node[0]))) or "-",
                    "load": round(statistics.median(
                        run["load_generator_cpu_us_per_request"] for run in runs), 1),
                    "steal": round(statistics.median(run["steal"] for run in runs), 3),
                })
    return rows
