"""The ``bulk`` scenario: ADDJOBS (our bulk ADDJOB) against pipelined ADDJOBs.

One lone node per run, ``redis-benchmark`` with 50 clients:

* ours: ``ADDJOBS q 0 BODIES body x 100`` unpipelined (100 jobs per command),
  and ``ADDJOB q body 0`` with ``-P 100`` (what a producer without the
  extension sends);
* the original (when ``DISQUE_REFERENCE_SERVER`` names its binary):
  ``ADDJOB q body 0`` with ``-P 100``, the fastest way to add jobs to it.

Figures are jobs per second; the ratio is ours (bulk) / the original's
pipelined ADDJOB of the same round (the target: >= 0.8x).  Every run
is checked: the node must hold one job per body sent.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.cluster import registered_jobs, start_nodes
from benchmarks.redis_tools import benchmark_command, run_benchmark
from tests.support.cluster import reference_server

BATCH = 100
BULK = ["ADDJOBS", "q", "0", "BODIES", *(["body"] * BATCH)]
SINGLE = ["ADDJOB", "q", "body", "0"]


def _jobs_per_second(port: int, command: list[str], commands: int, pipeline: int,
                     jobs_per_command: int) -> float:
    before = registered_jobs(port)
    result = run_benchmark(benchmark_command(port, command, requests=commands,
                                             pipeline=pipeline))
    added = registered_jobs(port) - before
    if added != commands * jobs_per_command:
        raise RuntimeError(f"{command[0]}: {added} jobs added, expected "
                           f"{commands * jobs_per_command}")
    return float(result["rps"]) * jobs_per_command


def scenario_bulk(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    jobs = args.requests or (4_000 if args.smoke else 400_000)
    runs = [("ours", "ADDJOBS x100", BULK, 1, BATCH), ("ours", "ADDJOB -P 100", SINGLE, BATCH, 1)]
    if reference_server():
        runs.append(("original", "ADDJOB -P 100", SINGLE, BATCH, 1))
    else:
        print("DISQUE_REFERENCE_SERVER is not set: measuring ours only")
    rounds: list[dict[str, float]] = []
    for rnd in range(args.rounds):
        shift = rnd % len(runs)
        this: dict[str, float] = {}
        for impl, label, command, pipeline, per_command in runs[shift:] + runs[:shift]:
            print(f"round {rnd + 1}/{args.rounds}: {impl} {label} ...", flush=True)
            (node,) = start_nodes(root, impl, 1, f"bulk{rnd}-{label.split()[0]}")
            try:
                this[f"{impl} {label}"] = _jobs_per_second(node.port, command,
                                                           jobs // per_command, pipeline,
                                                           per_command)
            finally:
                node.kill()
        rounds.append(this)

    from benchmarks.run import median, print_table

    rows: list[dict[str, Any]] = []
    reference = "original ADDJOB -P 100"
    for key in rounds[0]:
        figures = [r[key] for r in rounds]
        ratios = [r[key] / r[reference] for r in rounds] if reference in rounds[0] else []
        rows.append({"run": key, "jobs_per_s": median(figures),
                     "ratio": median(ratios) if ratios else None,
                     "ratios": [round(x, 3) for x in ratios]})
    print()
    print(f"bulk: one node, redis-benchmark, 50 clients, {jobs} jobs per run, medians of "
          f"{args.rounds} round(s); ratio = / the original's pipelined ADDJOB, same round")
    print_table(["run", "jobs/s", "ratio to the original", "per round"],
                [[r["run"], round(r["jobs_per_s"]), r["ratio"] if r["ratio"] else "-",
                  " ".join(str(x) for x in r["ratios"])] for r in rows])
    return {"jobs": jobs, "rows": rows, "rounds": rounds}
