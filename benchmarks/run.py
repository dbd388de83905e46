"""Benchmark harness (not a test): one entry point for named scenarios, disque vs Redis.

Usage::

    python3 -m benchmarks.run SCENARIO [--smoke] [--rounds N] [--json PATH]

Scenarios:

``server``
    ``redis-benchmark`` (the C load generator, so the Python being measured
    is not also the load) with 50 clients, unpipelined and ``-P 16``, against
    a fresh node: ``ADDJOB q body 0 REPLICATE 1 RETRY 0``, ``ADDJOB q body
    0``, ``GETJOB NOHANG FROM q`` on a queue pre-filled with more jobs than
    the run takes (QLEN is checked afterwards), ``PING``; and against a fresh
    ``redis-server`` (``--save '' --appendonly no``): ``XADD s * f body``,
    ``LPUSH l body``, ``RPOP l`` (pre-filled), ``PING``.  The servers
    alternate per round (disque, Redis, disque, Redis ...), every disque
    figure is divided by the Redis figure of the same round, and the table
    shows the medians over the rounds.
``cycle``
    produce -> GETJOB COUNT n -> ACKJOB with the Python client
    (:class:`disque.client.Client`), batched (pipelined ``add_jobs``, GETJOB
    COUNT 100, ``ack_many``) and one job at a time, vs Redis Streams with
    redis-py (pipelined XADD, XREADGROUP COUNT 100 + XACK; one at a time).
    jobs/s is jobs / (produce + consume time).
``memory``
    1 M jobs of 100 bytes (smoke: 20 k), added by ``redis-benchmark -P 16``
    (bodies made distinct with ``-r``): the node's INFO ``used_memory``
    (the node's own estimate) and its measured RSS, per job, vs a Redis
    stream of the same entries (``used_memory`` and RSS per entry).
``soak``
    memory under churn, disque only: ``--rounds`` rounds (default 10) of the
    batched cycle (100 k jobs added, fetched and acked per round) against
    one node; after each round the node's RSS, ``used_memory`` and
    registered jobs.  The queue is empty after every round, so RSS must stay
    flat after the first (allocator warm-up); growth means something keeps
    forgotten jobs alive.
``floor``
    how far ADDJOB is from the least any ADDJOB of this design can cost:
    ``ADDJOB q body 0`` and ``PING`` (unpipelined and ``-P 16``) against the
    real node, against a node whose ADDJOB does only the unavoidable work
    (``benchmarks/floor_node.py``: a new ID, one Job object, its place in
    an ID map, a FIFO and a time bucket, the reply) and ``XADD``/``PING``
    against Redis; the three alternate per round.  The floor's ratio to
    Redis is the best any tuning of the real handler could reach.
``cluster``
    ``ADDJOB`` on a 3-node cluster (default REPLICATE 3, REPLICATE 2, ASYNC)
    against one node, for ours and, when ``DISQUE_REFERENCE_SERVER`` is
    set, the original; ratios are cluster / lone node of the same
    implementation (``benchmarks/cluster.py``).
``bulk``
    jobs/s of ``ADDJOBS`` (100 bodies per command) against pipelined
    ``ADDJOB`` (``-P 100``) on ours and, with ``DISQUE_REFERENCE_SERVER``, on
    the original (``benchmarks/bulk_add.py``).
``original``
    one of our nodes against the original (``DISQUE_REFERENCE_SERVER``), the
    speed targets side by side: ADDJOB and GETJOB NOHANG with
    ``redis-benchmark``, the batched produce/get/ack cycle (our client
    against redis-py on the original), memory per job
    (``benchmarks/versus_original.py``).
``latency``
    the time from a producer's ADDJOB to a consumer blocked in GETJOB
    receiving the job (redis-py, one job at a time): one consumer, 50
    consumers on 10 queues, and 3-node clusters where every pickup crosses
    nodes (added on one node and taken on another; added on a random other
    node; 50 consumers on 10 queues spread over the nodes); ours and, with
    ``DISQUE_REFERENCE_SERVER``, the original, alternating
    (``benchmarks/latency.py``; ``--case TEXT`` for some cases only).
``groups``
    50 consumers (``GETJOB`` + ``ACKJOB``, one job at a time) draining
    100,000 jobs in 10,000 ordered groups, against the same load without
    groups, on one node; checks the groups' order and exclusivity on the way
    (``benchmarks/groups.py``).
``spark-source`` / ``spark-sink``
    run ``benchmarks.spark_source`` / ``benchmarks.spark_sink`` in a
    subprocess (``--smoke`` becomes the source's ``--smoke`` and the sink's
    ``--rows 5000 --ceiling-rows 5000``); their own report is the output.

``spark-source-cluster`` / ``spark-sink-cluster``
    the same with ``--cluster``: a 3-node cluster against one node in the
    same run (``benchmarks/spark_cluster.py``).

``--smoke`` runs a few thousand operations, one round, well under a minute
per scenario: it keeps the harness from rotting (see
``tests/benchmarks/test_run_smoke.py``) and measures nothing worth quoting.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.redis_tools import (
    RedisProcess,
    benchmark_command,
    info,
    missing_tools,
    rss_of,
    run_benchmark,
    tool_version,
)
from tests.support.process import DisqueProcess, raw_command

CLIENTS = 50
PIPELINE = 16
SCENARIOS = ("server", "cycle", "memory", "soak", "floor", "cluster", "bulk", "original",
             "latency", "groups",
             "spark-source",
             "spark-sink", "spark-source-cluster", "spark-sink-cluster")
FLOOR_NODE = Path(__file__).resolve().parent / "floor_node.py"


# --------------------------------------------------------------------------
# Machine, table, JSON
# --------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "platform": platform.platform(), "loadavg": [round(x, 2) for x in os.getloadavg()],
            "redis_server": tool_version("redis-server"),
            "redis_benchmark": tool_version("redis-benchmark")}


def print_table(headers: list[str], rows: list[list[Any]]) -> None:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"
        if isinstance(value, int):
            return f"{value:,}"
        return str(value)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                    for i, (h, w) in enumerate(zip(headers, widths, strict=True))))
    for row in text:
        print("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths, strict=True))))


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


#: How every benchmarked node runs: no persistence, no memory limit in the way.
NODE_ARGS = ("--appendonly", "no", "--maxmemory", "20gb")


def start_node(root: Path, name: str) -> DisqueProcess:
    return DisqueProcess(root / name, *NODE_ARGS).start()


def start_redis(root: Path, name: str) -> RedisProcess:
    return RedisProcess(root / name).start()


def start_floor_node(root: Path, name: str) -> DisqueProcess:
    """A node whose ADDJOB does only the unavoidable work (see ``benchmarks/floor_node.py``)."""
    return DisqueProcess(root / name, *NODE_ARGS,
                         program=[sys.executable, str(FLOOR_NODE)]).start()


STARTERS: dict[str, Callable[[Path, str], DisqueProcess | RedisProcess]] = {
    "disque": start_node, "floor": start_floor_node, "redis": start_redis}


def alternating_rounds(root: Path, rounds: int, prefix: str,
                       run: Callable[[str, DisqueProcess | RedisProcess], Any],
                       sides: tuple[str, ...] = ("disque", "redis")) -> list[dict[str, Any]]:
    """``run(side, server)`` on a fresh server of each side, once per round.

    The order of the sides rotates every round (disque, Redis; Redis,
    disque; ... and with three sides each takes each place once in three
    rounds), so drift of the machine inside a round cancels out.  Each round
    is ``{"order": [...], side: result, ...}``.
    """
    out = []
    for rnd in range(rounds):
        shift = rnd % len(sides)
        order = list(sides[shift:] + sides[:shift])
        this: dict[str, Any] = {"order": order}
        for side in order:
            print(f"round {rnd + 1}/{rounds}: {side} ...", flush=True)
            server = STARTERS[side](root, f"{prefix}{side}-{rnd}")
            try:
                this[side] = run(side, server)
            finally:
                server.kill()
        out.append(this)
    return out


# --------------------------------------------------------------------------
# server: redis-benchmark against both servers
# --------------------------------------------------------------------------

#: (label, disque command, redis command used as its reference)
SERVER_TESTS: list[tuple[str, list[str], list[str]]] = [
    ("ADDJOB q body 0 REPLICATE 1 RETRY 0 / XADD",
     ["ADDJOB", "q", "body", "0", "REPLICATE", "1", "RETRY", "0"], ["XADD", "s", "*", "f", "body"]),
    ("ADDJOB q body 0 / XADD", ["ADDJOB", "q", "body", "0"], ["XADD", "s", "*", "f", "body"]),
    ("ADDJOB q body 0 / LPUSH", ["ADDJOB", "q", "body", "0"], ["LPUSH", "l", "body"]),
    ("GETJOB NOHANG FROM q / RPOP", ["GETJOB", "NOHANG", "FROM", "q"], ["RPOP", "l"]),
    ("PING / PING", ["PING"], ["PING"]),
]


def prefill(port: int, command: list[str], count: int) -> None:
    """Pre-fill with ``redis-benchmark -P 16`` (fast, and not timed)."""
    run_benchmark(benchmark_command(port, command, requests=count, pipeline=PIPELINE))


def server_round(port: int, side: str, requests: dict[int, int]) -> dict[str, Any]:
    """All tests of one side (``disque`` or ``redis``) against one fresh server."""
    results: dict[str, Any] = {}
    commands: dict[str, list[str]] = {}
    for _, disque_cmd, redis_cmd in SERVER_TESTS:
        cmd = disque_cmd if side == "disque" else redis_cmd
        commands[" ".join(cmd)] = cmd
    pop = "GETJOB NOHANG FROM q" if side == "disque" else "RPOP l"
    push = (["ADDJOB", "q", "body", "0"] if side == "disque" else ["LPUSH", "l", "body"])
    # Pre-fill the queue / list so that the pops never find it empty.
    needed = sum(requests.values()) + 1000
    prefill(port, push, needed)
    for pipeline, count in requests.items():
        for name, cmd in commands.items():
            res = run_benchmark(benchmark_command(port, cmd, requests=count, pipeline=pipeline))
            results[f"{name} P{pipeline}"] = res
    left = raw_command(port, "QLEN" if side == "disque" else "LLEN", "q" if side == "disque"
                       else "l")
    results["left_after_pops"] = left
    if not isinstance(left, int) or left <= 0:
        raise RuntimeError(f"{pop}: the queue ran dry ({left!r} left): results are invalid")
    return results


def request_counts(args: argparse.Namespace) -> dict[int, int]:
    """Requests per redis-benchmark run, by pipeline depth (``-P 16`` gets 4x)."""
    if args.smoke:
        return {1: 2000, PIPELINE: 4000}
    unpipelined = args.requests or 100_000
    return {1: unpipelined, PIPELINE: unpipelined * 4}


def scenario_server(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    requests = request_counts(args)
    rounds = alternating_rounds(root, args.rounds, "",
                                lambda side, server: server_round(server.port, side, requests))
    for this in rounds:
        this["disque_qlen_after"] = this["disque"]["left_after_pops"]

    table: list[dict[str, Any]] = []
    for pipeline in requests:
        for label, disque_cmd, redis_cmd in SERVER_TESTS:
            dkey = f"{' '.join(disque_cmd)} P{pipeline}"
            rkey = f"{' '.join(redis_cmd)} P{pipeline}"
            d = [r["disque"][dkey] for r in rounds]
            x = [r["redis"][rkey] for r in rounds]
            ratios = [a["rps"] / b["rps"] for a, b in zip(d, x, strict=True)]
            table.append({
                "test": label, "pipeline": pipeline, "requests": requests[pipeline],
                "disque_rps": median([a["rps"] for a in d]),
                "disque_p50_ms": median([a.get("p50_latency_ms", 0.0) for a in d]),
                "disque_p99_ms": median([a.get("p99_latency_ms", 0.0) for a in d]),
                "redis_rps": median([b["rps"] for b in x]),
                "redis_p50_ms": median([b.get("p50_latency_ms", 0.0) for b in x]),
                "redis_p99_ms": median([b.get("p99_latency_ms", 0.0) for b in x]),
                "ratio": median(ratios), "ratios": [round(r, 3) for r in ratios],
                "disque_command": d[0]["command"], "redis_command": x[0]["command"],
            })
    print()
    print(f"server: redis-benchmark, {CLIENTS} clients, medians of {args.rounds} round(s); "
          "ratio = disque / Redis of the same round")
    print_table(["test", "-P", "disque rps", "p50 ms", "p99 ms", "redis rps", "p50 ms",
                 "p99 ms", "ratio"],
                [[t["test"], t["pipeline"], t["disque_rps"], t["disque_p50_ms"],
                  t["disque_p99_ms"], t["redis_rps"], t["redis_p50_ms"], t["redis_p99_ms"],
                  t["ratio"]] for t in table])
    print("\nload commands (port varies per round):")
    for t in table:
        print("  " + t["disque_command"])
        print("  " + t["redis_command"])
    print(f"queue left after the pops (disque QLEN, per round): "
          f"{[r['disque_qlen_after'] for r in rounds]}; Redis LLEN: "
          f"{[r['redis']['left_after_pops'] for r in rounds]}")
    return {"requests": {str(k): v for k, v in requests.items()}, "clients": CLIENTS,
            "table": table, "rounds": rounds}


# --------------------------------------------------------------------------
# cycle: produce -> get -> ack with Python clients
# --------------------------------------------------------------------------

BATCH = 100


def disque_cycle(port: int, jobs: int, batched: bool) -> dict[str, Any]:
    from disque.client import Client

    body = b"x" * 100
    queue = "cq-batched" if batched else "cq-single"
    client = Client(f"127.0.0.1:{port}")
    try:
        t0 = time.perf_counter()
        if batched:
            client.add_jobs(queue, [body] * jobs, batch_size=BATCH)
        else:
            for _ in range(jobs):
                client.add_job(queue, body)
        t1 = time.perf_counter()
        done = 0
        count = BATCH if batched else 1
        while done < jobs:
            got = client.get_jobs(queue, count=count, nohang=True)
            if not got:
                raise RuntimeError(f"queue empty after {done} of {jobs} jobs")
            if batched:
                client.ack_many([job.id for job in got])
            else:
                client.ack(got[0].id)
            done += len(got)
        t2 = time.perf_counter()
        qlen = client.execute_command("QLEN", queue)
    finally:
        client.close()
    return {"jobs": jobs, "produce_s": t1 - t0, "consume_s": t2 - t1,
            "jobs_per_s": jobs / (t2 - t0), "left_after": qlen}


def redis_cycle(port: int, jobs: int, batched: bool) -> dict[str, Any]:
    import redis

    body = b"x" * 100
    stream = "cs-batched" if batched else "cs-single"
    r = redis.Redis(host="127.0.0.1", port=port, protocol=2)
    try:
        r.xgroup_create(stream, "g", id="0", mkstream=True)
        t0 = time.perf_counter()
        if batched:
            for start in range(0, jobs, BATCH):
                pipe = r.pipeline(transaction=False)
                for _ in range(min(BATCH, jobs - start)):
                    pipe.xadd(stream, {"f": body})
                pipe.execute()
        else:
            for _ in range(jobs):
                r.xadd(stream, {"f": body})
        t1 = time.perf_counter()
        done = 0
        count = BATCH if batched else 1
        while done < jobs:
            # redis-py types the reply loosely: [[stream, [(id, fields), ...]]].
            reply: Any = r.xreadgroup("g", "c", {stream: ">"}, count=count)
            entries = reply[0][1] if reply else []
            if not entries:
                raise RuntimeError(f"stream empty after {done} of {jobs} entries")
            r.xack(stream, "g", *[entry_id for entry_id, _ in entries])
            done += len(entries)
        t2 = time.perf_counter()
        pending = r.xpending(stream, "g")["pending"]
    finally:
        r.close()
    return {"jobs": jobs, "produce_s": t1 - t0, "consume_s": t2 - t1,
            "jobs_per_s": jobs / (t2 - t0), "left_after": pending}


def scenario_cycle(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    sizes = ({"batched": 3000, "one-at-a-time": 1000} if args.smoke else
             {"batched": args.requests or 100_000, "one-at-a-time": (args.requests or 100_000)
              // 5})
    cycles = {"disque": disque_cycle, "redis": redis_cycle}
    rounds = alternating_rounds(
        root, args.rounds, "cycle-",
        lambda side, server: {mode: cycles[side](server.port, jobs, mode == "batched")
                              for mode, jobs in sizes.items()})
    runs = {mode: {side: [this[side][mode] for this in rounds] for side in cycles}
            for mode in sizes}
    table = []
    for mode, jobs in sizes.items():
        d, x = runs[mode]["disque"], runs[mode]["redis"]
        ratios = [a["jobs_per_s"] / b["jobs_per_s"] for a, b in zip(d, x, strict=True)]
        table.append({"mode": mode, "jobs": jobs,
                      "disque_jobs_per_s": median([a["jobs_per_s"] for a in d]),
                      "disque_produce_s": median([a["produce_s"] for a in d]),
                      "disque_consume_s": median([a["consume_s"] for a in d]),
                      "redis_jobs_per_s": median([b["jobs_per_s"] for b in x]),
                      "redis_produce_s": median([b["produce_s"] for b in x]),
                      "redis_consume_s": median([b["consume_s"] for b in x]),
                      "ratio": median(ratios), "ratios": [round(r, 3) for r in ratios],
                      "disque_left_after": [a["left_after"] for a in d],
                      "redis_pending_after": [b["left_after"] for b in x]})
    print()
    print(f"cycle: produce -> get -> ack, one Python client, batch {BATCH}, medians of "
          f"{args.rounds} round(s)")
    print("  disque: Client.add_jobs(batch_size=100) | get_jobs(count=100, nohang=True) + "
          "ack_many; one-at-a-time: add_job, get_jobs(count=1), ack")
    print("  redis:  redis-py pipeline of 100 XADD | XREADGROUP COUNT 100 + XACK; "
          "one-at-a-time: XADD, XREADGROUP COUNT 1, XACK")
    print_table(["mode", "jobs", "disque jobs/s", "produce s", "consume s", "redis jobs/s",
                 "produce s", "consume s", "ratio"],
                [[t["mode"], t["jobs"], t["disque_jobs_per_s"], t["disque_produce_s"],
                  t["disque_consume_s"], t["redis_jobs_per_s"], t["redis_produce_s"],
                  t["redis_consume_s"], t["ratio"]] for t in table])
    return {"batch": BATCH, "table": table, "runs": runs}


# --------------------------------------------------------------------------
# memory: bytes per stored job
# --------------------------------------------------------------------------

#: 100 bytes; redis-benchmark -r replaces __rand_int__ with a 12-digit number.
BODY = "__rand_int__" + "x" * 88


def memory_fill(port: int, pid: int, command: list[str], jobs: int,
                count_cmd: list[str]) -> dict[str, Any]:
    before = info(port, "memory")
    rss_before = rss_of(pid)
    cmd = benchmark_command(port, command, requests=jobs, pipeline=PIPELINE, keyspace=1_000_000)
    bench = run_benchmark(cmd)
    time.sleep(0.5)
    after = info(port, "memory")
    rss_after = rss_of(pid)
    stored = raw_command(port, *count_cmd)
    if stored != jobs:
        raise RuntimeError(f"{count_cmd}: {stored!r} stored, expected {jobs}")
    used = int(after["used_memory"]) - int(before["used_memory"])
    rss = rss_after - rss_before
    return {"jobs": jobs, "command": bench["command"], "fill_rps": bench["rps"],
            "used_memory_before": int(before["used_memory"]),
            "used_memory_after": int(after["used_memory"]),
            "rss_before": rss_before, "rss_after": rss_after,
            "used_per_job": used / jobs, "rss_per_job": rss / jobs}


def scenario_memory(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    jobs = 20_000 if args.smoke else (args.requests or 1_000_000)
    node = start_node(root, "mem-disque")
    try:
        disque = memory_fill(node.port, node.pid, ["ADDJOB", "mq", BODY, "0"], jobs,
                             ["QLEN", "mq"])
    finally:
        node.kill()
    server = start_redis(root, "mem-redis")
    try:
        redis_side = memory_fill(server.port, server.pid, ["XADD", "ms", "*", "f", BODY], jobs,
                                 ["XLEN", "ms"])
    finally:
        server.kill()
    result = {"jobs": jobs, "body_bytes": len(BODY), "disque": disque, "redis": redis_side,
              "ratio_used": disque["used_per_job"] / redis_side["used_per_job"],
              "ratio_rss": disque["rss_per_job"] / redis_side["used_per_job"],
              "ratio_rss_rss": disque["rss_per_job"] / max(1.0, redis_side["rss_per_job"])}
    print()
    print(f"memory: {jobs:,} jobs of {len(BODY)} bytes (distinct bodies), "
          "delta over the fill / jobs")
    print_table(["server", "used_memory B/job", "RSS B/job", "fill rps"],
                [["disque", disque["used_per_job"], disque["rss_per_job"], disque["fill_rps"]],
                 ["redis (stream)", redis_side["used_per_job"], redis_side["rss_per_job"],
                  redis_side["fill_rps"]]])
    print(f"ratio disque/redis: used_memory {result['ratio_used']:.2f}x, disque RSS vs redis "
          f"used_memory {result['ratio_rss']:.2f}x, RSS vs RSS {result['ratio_rss_rss']:.2f}x")
    print("load commands:\n  " + disque["command"] + "\n  " + redis_side["command"])
    return result


# --------------------------------------------------------------------------
# soak: memory under produce/ack churn
# --------------------------------------------------------------------------

def scenario_soak(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    jobs = 2_000 if args.smoke else (args.requests or 100_000)
    rounds = args.rounds
    node = start_node(root, "soak-disque")
    rows: list[dict[str, Any]] = []
    try:
        rss_start = rss_of(node.pid)
        for number in range(1, rounds + 1):
            cycle = disque_cycle(node.port, jobs, batched=True)
            memory = info(node.port, "memory")
            registered = int(info(node.port, "jobs")["registered_jobs"])
            rows.append({"round": number, "jobs_per_s": cycle["jobs_per_s"],
                         "rss": rss_of(node.pid), "used_memory": int(memory["used_memory"]),
                         "registered_jobs": registered, "qlen": cycle["left_after"]})
            print(f"round {number}/{rounds}: {cycle['jobs_per_s']:,.0f} jobs/s, "
                  f"RSS {rows[-1]['rss'] / 2**20:.1f} MiB, registered jobs {registered}",
                  flush=True)
    finally:
        node.kill()
    growth = rows[-1]["rss"] - rows[0]["rss"]
    result = {"jobs_per_round": jobs, "rounds": rows, "rss_start": rss_start,
              "rss_growth_after_first_round": growth,
              "rss_growth_per_job": growth / max(1, jobs * (rounds - 1))}
    print()
    print(f"soak: {rounds} rounds of {jobs:,} jobs added, fetched and acked (batched cycle)")
    print_table(["round", "jobs/s", "RSS MiB", "used_memory MiB", "registered", "QLEN"],
                [[r["round"], r["jobs_per_s"], r["rss"] / 2**20, r["used_memory"] / 2**20,
                  r["registered_jobs"], r["qlen"]] for r in rows])
    print(f"RSS growth after the first round: {growth / 2**20:.1f} MiB "
          f"({result['rss_growth_per_job']:.1f} B per job cycled)")
    return result


# --------------------------------------------------------------------------
# floor: the real ADDJOB against the least an ADDJOB can do, and Redis
# --------------------------------------------------------------------------

#: (label, command of both disque nodes, Redis reference)
FLOOR_TESTS: list[tuple[str, list[str], list[str]]] = [
    ("ADDJOB q body 0 / XADD", ["ADDJOB", "q", "body", "0"], ["XADD", "s", "*", "f", "body"]),
    ("PING / PING", ["PING"], ["PING"]),
]
#: How each side counts what its ADDJOB / XADD tests stored, and what its memory fill stored.
STORED = {"disque": ["QLEN", "q"], "floor": ["FLOORLEN"], "redis": ["XLEN", "s"]}
FILLED = {"disque": ["QLEN", "mq"], "floor": ["FLOORLEN"], "redis": ["XLEN", "ms"]}


#: What each side's memory fill adds (100-byte bodies, as in ``memory``).
FLOOR_FILL = {"disque": ["ADDJOB", "mq", BODY, "0"], "floor": ["ADDJOB", "mq", BODY, "0"],
              "redis": ["XADD", "ms", "*", "f", BODY]}


def floor_round(server: DisqueProcess | RedisProcess, side: str, requests: dict[int, int],
                fill: int) -> dict[str, Any]:
    port = server.port
    # Memory first, on the fresh server; the throughput tests then run with
    # the filled jobs resident, as the server scenario's do.
    results: dict[str, Any] = {"memory": memory_fill(port, server.pid, FLOOR_FILL[side], fill,
                                                     FILLED[side])}
    for pipeline, count in requests.items():
        for _, disque_cmd, redis_cmd in FLOOR_TESTS:
            cmd = redis_cmd if side == "redis" else disque_cmd
            results[f"{cmd[0]} P{pipeline}"] = run_benchmark(
                benchmark_command(port, cmd, requests=count, pipeline=pipeline))
    stored = raw_command(port, *STORED[side])
    if side == "floor" and isinstance(stored, int):
        stored -= fill  # FLOORLEN counts the memory fill's jobs too
    # redis-benchmark rounds -n up to whole pipelines: at least every request stored.
    if not isinstance(stored, int) or stored < sum(requests.values()):
        raise RuntimeError(f"{side}: {stored!r} entries stored after "
                           f"{sum(requests.values())} adds: results are invalid")
    results["stored"] = stored
    return results


def scenario_floor(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    requests = request_counts(args)
    fill = 20_000 if args.smoke else 1_000_000
    sides = ("disque", "floor", "redis")
    rounds = alternating_rounds(root, args.rounds, "floor-",
                                lambda side, server: floor_round(server, side, requests, fill),
                                sides)
    table: list[dict[str, Any]] = []
    for pipeline in requests:
        for label, disque_cmd, redis_cmd in FLOOR_TESTS:
            key = {side: f"{(redis_cmd if side == 'redis' else disque_cmd)[0]} P{pipeline}"
                   for side in sides}
            rps = {side: [r[side][key[side]]["rps"] for r in rounds] for side in sides}
            row: dict[str, Any] = {"test": label, "pipeline": pipeline,
                                   "requests": requests[pipeline]}
            for side in sides:
                row[f"{side}_rps"] = median(rps[side])
            for num, den in (("disque", "redis"), ("floor", "redis"), ("disque", "floor")):
                ratios = [a / b for a, b in zip(rps[num], rps[den], strict=True)]
                row[f"{num}_vs_{den}"] = median(ratios)
                row[f"{num}_vs_{den}_rounds"] = [round(r, 3) for r in ratios]
            row["commands"] = [rounds[0][side][key[side]]["command"] for side in sides]
            table.append(row)
    print()
    print(f"floor: redis-benchmark, {CLIENTS} clients, medians of {args.rounds} round(s). "
          "'floor' is a node whose ADDJOB does only the unavoidable work "
          "(benchmarks/floor_node.py): no tuning of the ADDJOB handler can beat it.")
    print_table(["test", "-P", "disque rps", "floor rps", "redis rps", "disque/redis",
                 "floor/redis", "disque/floor"],
                [[t["test"], t["pipeline"], t["disque_rps"], t["floor_rps"], t["redis_rps"],
                  t["disque_vs_redis"], t["floor_vs_redis"], t["disque_vs_floor"]]
                 for t in table])
    # RSS only: the floor node accounts no memory, so its used_memory says nothing.
    memory = {side: {"rss_per_job": median([r[side]["memory"]["rss_per_job"] for r in rounds])}
              for side in sides}
    redis_entry = memory["redis"]["rss_per_job"]
    print(f"\nmemory, {fill:,} entries of {len(BODY)} bytes (RSS delta / entries, medians):")
    print_table(["side", "RSS B/job", "vs Redis RSS"],
                [[side, memory[side]["rss_per_job"],
                  memory[side]["rss_per_job"] / max(1.0, redis_entry)] for side in sides])
    print("\nload commands (port varies per round):")
    for t in table:
        for line in t["commands"]:
            print("  " + line)
    return {"requests": {str(k): v for k, v in requests.items()}, "clients": CLIENTS,
            "fill": fill, "memory": memory, "table": table, "rounds": rounds}


# --------------------------------------------------------------------------
# Spark: delegate
# --------------------------------------------------------------------------

def delegate(module: str, *extra: str) -> Callable[[argparse.Namespace, Path], dict[str, Any]]:
    def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
        cmd = [sys.executable, "-m", module, *extra]
        if extra and args.smoke:  # --cluster: a small run, one round
            cmd += (["--rows", "3000", "--rounds", "1"] if module == "benchmarks.spark_sink"
                    else ["--smoke"])
        elif args.smoke and module == "benchmarks.spark_sink":
            # It has no --smoke: small writes, one of them to warm up.
            cmd += ["--rows", "5000", "--ceiling-rows", "5000", "--warmup-writes", "1"]
        elif args.smoke:
            cmd.append("--smoke")
        if module == "benchmarks.spark_source":
            out = root / "spark.json"
            cmd += ["--json", str(out)]
        print("$ " + shlex.join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent)
        result: dict[str, Any] = {"command": shlex.join(cmd), "returncode": proc.returncode}
        if module == "benchmarks.spark_source" and (root / "spark.json").exists():
            result["result"] = json.loads((root / "spark.json").read_text())
        if proc.returncode != 0:
            raise SystemExit(proc.returncode)
        return result
    return run


def scenario_cluster(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.cluster import scenario_cluster as run

    args.cycle_jobs = 2_000 if args.smoke else 20_000
    return run(args, root, request_counts(args))


def scenario_original(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.versus_original import scenario_original as run

    return run(args, root, request_counts(args))


def scenario_bulk(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.bulk_add import scenario_bulk as run

    return run(args, root)


def scenario_latency(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.latency import scenario_latency as run

    return run(args, root)


def scenario_groups(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from benchmarks.groups import scenario_groups as run

    return run(args, root)


RUNNERS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "server": scenario_server,
    "cycle": scenario_cycle,
    "memory": scenario_memory,
    "soak": scenario_soak,
    "floor": scenario_floor,
    "cluster": scenario_cluster,
    "bulk": scenario_bulk,
    "latency": scenario_latency,
    "groups": scenario_groups,
    "original": scenario_original,
    "spark-source": delegate("benchmarks.spark_source"),
    "spark-sink": delegate("benchmarks.spark_sink"),
    "spark-source-cluster": delegate("benchmarks.spark_source", "--cluster"),
    "spark-sink-cluster": delegate("benchmarks.spark_sink", "--cluster"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("--smoke", action="store_true",
                        help="a few thousand operations, one round (keeps the harness alive)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternations disque/Redis (default 3); soak: cycles (default 10)")
    parser.add_argument("--requests", type=int, default=0,
                        help="override the operation count (server: unpipelined requests; "
                             "cycle: batched jobs; memory: jobs)")
    parser.add_argument("--case", default="",
                        help="latency: only the cases whose label contains this text")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds = 2 if args.scenario == "soak" else 1  # soak: growth needs two rounds
    elif args.rounds is None:
        args.rounds = 10 if args.scenario == "soak" else 3
    if args.scenario in ("server", "cycle", "memory", "floor", "cluster", "bulk", "original"):
        missing = missing_tools()
        if missing:
            print(f"missing {', '.join(missing)}: install the Debian packages redis-server "
                  "and redis-tools", file=sys.stderr)
            return 2
    info_before = machine()
    print(f"scenario {args.scenario}{' (smoke)' if args.smoke else ''}: "
          f"{info_before['cores']} cores ({info_before['cpu']}), load average "
          f"{' '.join(map(str, info_before['loadavg']))}; {info_before['redis_server']}",
          flush=True)
    root = Path(tempfile.mkdtemp(prefix=f"bench-{args.scenario}-"))
    t0 = time.perf_counter()
    try:
        result = RUNNERS[args.scenario](args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    elapsed = time.perf_counter() - t0
    load_after = [round(x, 2) for x in os.getloadavg()]
    print(f"\n{elapsed:.1f} s; load average after: {' '.join(map(str, load_after))}")
    report = {"scenario": args.scenario, "smoke": args.smoke, "rounds": args.rounds,
              "machine": info_before, "loadavg_after": load_after,
              "elapsed_s": round(elapsed, 2), "argv": sys.argv, "result": result}
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
