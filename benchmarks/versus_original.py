"""The ``original`` scenario: one of our nodes against the original Disque, same run.

The node's speed targets are ratios to the original, measured
side by side.  Each round starts a fresh lone node of each implementation
(``appendonly no``), in alternating order, and runs against it:

* ``redis-benchmark``, 50 clients, unpipelined and ``-P 16``:
  ``ADDJOB q body 0`` and ``GETJOB NOHANG FROM q`` (the queue is pre-filled,
  not timed, with more jobs than the run pops; QLEN is checked > 0 after);
* the batched produce/get/ack cycle (100 000 jobs of 100 bytes): on ours
  with our client (``add_jobs`` in batches of 100, which sends ADDJOBS;
  ``get_jobs(count=100, nohang=True)``; ``ack_many``), on the original with
  redis-py pipelines of 100 ADDJOBs, ``GETJOB NOHANG COUNT 100`` and one
  ACKJOB per batch: the fastest way each can be driven from Python;
* memory per job: 1 000 000 jobs of 100 distinct bytes added with
  ``redis-benchmark -P 16``, ``used_memory`` (and RSS) after minus before,
  per job.

Ours also runs the same ``redis-benchmark`` loads through the extensions
of the second round, each divided by the original's *plain* figure of the
same round (the original has none of them): ``ADDJOB q body 0 PRIORITY 5``
and ``GETJOB NOHANG`` from a queue of such jobs; ADDJOB with 3 and 10 small
headers (``HEADER name value``: a ``traceparent``, then short tags) and
``GETJOB NOHANG WITHHEADERS`` from queues of jobs with 0, 3 and 10; and plain ADDJOB and
GETJOB sent by a user limited to some commands and queues (``aclfile``:
``user bench on >bench ~q* +@read +@write``; ``redis-benchmark --user``),
which pays the permission check on every command.

Where ``redis-server`` is installed, each round also runs a fresh Redis
through the same loads on its closest structures: ``XADD s * f body`` for
ADDJOB, ``RPOP l`` from a pre-filled list for GETJOB NOHANG, the redis-py
stream cycle of the ``cycle`` scenario (pipelines of 100 XADD, XREADGROUP
COUNT 100 + XACK) and the memory of a stream entry: one table of ours, the
original and Redis from the same run.

Every figure of ours is divided by the original's (and Redis's) of the
same round; the tables show medians and the per-round ratios.  The three
servers take turns, the order rotating each round.  Targets (ours /
original): ADDJOB >= 0.8x unpipelined and >= 0.5x with -P 16, GETJOB
NOHANG >= 1.0x both, the cycle >= 1.0x, memory per job <= 1.0x.  Needs
``DISQUE_REFERENCE_SERVER``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from benchmarks.cluster import NODE_ARGS, cycle, start_nodes
from benchmarks.redis_tools import RedisProcess, benchmark_command, run_benchmark
from tests.support.cluster import reference_server
from tests.support.process import DisqueProcess, raw_command

ADDJOB = ["ADDJOB", "q", "body", "0"]
GETJOB = ["GETJOB", "NOHANG", "FROM", "q"]
PRIORITY_ADDJOB = ["ADDJOB", "pq", "body", "0", "PRIORITY", "5"]
PRIORITY_GETJOB = ["GETJOB", "NOHANG", "FROM", "pq"]
#: Small headers as a traced producer sends them: a W3C trace context, then tags.
SMALL_HEADERS = [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
                 ("tenant", "acme"), ("schema", "v3"), *((f"tag{i}", f"value{i}")
                                                         for i in range(4, 11))]


def header_loads(count: int) -> tuple[list[str], list[str]]:
    """ADDJOB with ``count`` of :data:`SMALL_HEADERS`, and its GETJOB NOHANG WITHHEADERS."""
    queue = f"h{count}q"
    add = ["ADDJOB", queue, "body", "0"]
    for name, value in SMALL_HEADERS[:count]:
        add += ["HEADER", name, value]
    return add, ["GETJOB", "NOHANG", "WITHHEADERS", "FROM", queue]


#: 100 bytes; redis-benchmark -r replaces __rand_int__ with a 12-digit number.
MEMORY_BODY = "__rand_int__" + "x" * 88
#: Redis's counterparts of ADDJOB and GETJOB NOHANG (RPOP from a pre-filled list).
XADD = ["XADD", "s", "*", "f", "body"]
RPOP = ["RPOP", "l"]


def _rates(port: int, requests: dict[int, int], fill: list[str],
           loads: tuple[tuple[str, list[str]], ...], length: list[str],
           user: str | None = None) -> dict[str, float]:
    """``redis-benchmark`` rates of each ``(name, command)`` of ``loads`` at each
    pipeline depth of ``requests``, after a pre-fill (not timed) with ``fill``
    of more entries than the loads take out; ``length`` must show some left
    afterwards (the takes never ran dry).  ``user`` authenticates the loads
    (its password is its name)."""
    from benchmarks.run import prefill

    prefill(port, fill, sum(requests.values()) + 1000)
    out: dict[str, float] = {}
    for pipeline, count in requests.items():
        for name, command in loads:
            result = run_benchmark(benchmark_command(port, command, requests=count,
                                                     pipeline=pipeline, user=user,
                                                     password=user))
            out[f"{name} P{pipeline}"] = float(result["rps"])
    left = raw_command(port, *length)
    if not isinstance(left, int) or left <= 0:
        raise RuntimeError(f"{loads[-1][0]}: {' '.join(length)} ran dry ({left!r} left)")
    return out


def _redis_benchmarks(port: int, requests: dict[int, int]) -> dict[str, float]:
    from benchmarks.run import PIPELINE

    assert PIPELINE in requests
    return _rates(port, requests, ADDJOB, (("ADDJOB", ADDJOB), ("GETJOB NOHANG", GETJOB)),
                  ["QLEN", "q"])


#: The header counts of the header loads (0: WITHHEADERS on plain jobs).
HEADER_COUNTS = (0, 3, 10)

#: The user the ACL runs authenticate as, and its rules.
BENCH_USER = "user bench on >bench ~q* +@read +@write\n"


def _extension_benchmarks(port: int, root: Path, tag: str,
                          requests: dict[int, int]) -> dict[str, float]:
    """Ours only: the loads of _redis_benchmarks with priorities, and as a user."""
    out = _rates(port, requests, PRIORITY_ADDJOB,
                 (("ADDJOB PRIORITY", PRIORITY_ADDJOB),
                  ("GETJOB NOHANG, priorities", PRIORITY_GETJOB)), ["QLEN", "pq"])
    for count in HEADER_COUNTS:
        add, get = header_loads(count)
        out.update(_rates(port, requests, add,
                          ((f"ADDJOB {count} headers", add),
                           (f"GETJOB NOHANG WITHHEADERS, {count} headers", get)),
                          ["QLEN", add[1]]))
    aclfile = root / f"{tag}-users.acl"
    aclfile.write_text(BENCH_USER)
    node = DisqueProcess(root / f"{tag}-acl", *NODE_ARGS, "--aclfile", str(aclfile)).start()
    try:
        out.update(_rates(node.port, requests, ADDJOB,
                          (("ADDJOB as a user", ADDJOB), ("GETJOB NOHANG as a user", GETJOB)),
                          ["QLEN", "q"], user="bench"))
    finally:
        node.kill()
    return out


def _round(impl: str, root: Path, tag: str, requests: dict[int, int], cycle_jobs: int,
           memory_jobs: int) -> dict[str, float]:
    from benchmarks.run import disque_cycle

    (node,) = start_nodes(root, impl, 1, f"{tag}-bench")
    try:
        out = _redis_benchmarks(node.port, requests)
        if impl == "ours":
            out.update(_extension_benchmarks(node.port, root, tag, requests))
        # Not timed; the original frees a million jobs one by one, which
        # took more than raw_command's default 10 s on a busy VM.
        raw_command(node.port, "DEBUG", "FLUSHALL", timeout=120)
        if impl == "ours":
            out["cycle"] = disque_cycle(node.port, cycle_jobs, batched=True)["jobs_per_s"]
        else:
            out["cycle"] = cycle([node], cycle_jobs)["jobs_per_s"]
    finally:
        node.kill()
    (node,) = start_nodes(root, impl, 1, f"{tag}-memory")  # a fresh heap for the memory
    out.update(_memory_figures(node, ["ADDJOB", "mq", MEMORY_BODY, "0"], memory_jobs,
                               ["QLEN", "mq"]))
    return out


def _memory_figures(server: DisqueProcess | RedisProcess, fill: list[str], jobs: int,
                    count: list[str]) -> dict[str, float]:
    """``used_memory`` and RSS per job of ``jobs`` ``fill`` commands on a fresh
    ``server``, which is stopped afterwards."""
    from benchmarks.run import memory_fill

    try:
        filled = memory_fill(server.port, server.pid, fill, jobs, count)
        return {"memory B/job": filled["used_per_job"], "RSS B/job": filled["rss_per_job"]}
    finally:
        server.kill()


def _redis_round(root: Path, tag: str, requests: dict[int, int], cycle_jobs: int,
                 memory_jobs: int) -> dict[str, float]:
    """The figures of _round on a fresh Redis (XADD, RPOP, a stream cycle, a stream's memory)."""
    from benchmarks.run import redis_cycle, start_redis

    server = start_redis(root, f"{tag}-bench")
    try:
        out = _rates(server.port, requests, ["LPUSH", "l", "body"],
                     (("ADDJOB", XADD), ("GETJOB NOHANG", RPOP)), ["LLEN", "l"])
        raw_command(server.port, "FLUSHALL", timeout=120)
        out["cycle"] = redis_cycle(server.port, cycle_jobs, batched=True)["jobs_per_s"]
    finally:
        server.kill()
    out.update(_memory_figures(start_redis(root, f"{tag}-memory"),
                               ["XADD", "ms", "*", "f", MEMORY_BODY], memory_jobs,
                               ["XLEN", "ms"]))
    return out


#: (figure, target ratio, whether higher is better)
TARGETS = [("ADDJOB P1", 0.8, True), ("ADDJOB P16", 0.5, True),
           ("GETJOB NOHANG P1", 1.0, True), ("GETJOB NOHANG P16", 1.0, True),
           ("cycle", 1.0, True), ("memory B/job", 1.0, False), ("RSS B/job", None, False)]
#: Ours through the extensions -> the original's plain figure it is divided by.
EXTENSION_FIGURES = {
    "ADDJOB PRIORITY P1": "ADDJOB P1", "ADDJOB PRIORITY P16": "ADDJOB P16",
    "GETJOB NOHANG, priorities P1": "GETJOB NOHANG P1",
    "GETJOB NOHANG, priorities P16": "GETJOB NOHANG P16",
    **{f"ADDJOB {n} headers P{p}": f"ADDJOB P{p}" for n in HEADER_COUNTS if n for p in (1, 16)},
    **{f"GETJOB NOHANG WITHHEADERS, {n} headers P{p}": f"GETJOB NOHANG P{p}"
       for n in HEADER_COUNTS for p in (1, 16)},
    "ADDJOB as a user P1": "ADDJOB P1", "ADDJOB as a user P16": "ADDJOB P16",
    "GETJOB NOHANG as a user P1": "GETJOB NOHANG P1",
    "GETJOB NOHANG as a user P16": "GETJOB NOHANG P16",
}


def scenario_original(args: argparse.Namespace, root: Path,
                      requests: dict[int, int]) -> dict[str, Any]:
    if reference_server() is None:
        raise SystemExit("the original scenario needs DISQUE_REFERENCE_SERVER (the original "
                         "disque-server binary)")
    from benchmarks.run import median, print_table

    cycle_jobs = 2_000 if args.smoke else 100_000
    memory_jobs = 20_000 if args.smoke else 1_000_000
    with_redis = shutil.which("redis-server") is not None
    if not with_redis:
        print("redis-server is not installed: ours and the original only")
    impls = ["ours", "original", "redis"] if with_redis else ["ours", "original"]
    rounds: list[dict[str, Any]] = []
    for rnd in range(args.rounds):
        shift = rnd % len(impls)
        order = impls[shift:] + impls[:shift]
        this: dict[str, Any] = {"order": order}
        for impl in order:
            print(f"round {rnd + 1}/{args.rounds}: {impl} ...", flush=True)
            if impl == "redis":
                this[impl] = _redis_round(root, f"r{rnd}-redis", requests, cycle_jobs,
                                          memory_jobs)
            else:
                this[impl] = _round(impl, root, f"r{rnd}-{impl}", requests, cycle_jobs,
                                    memory_jobs)
        rounds.append(this)

    table: list[dict[str, Any]] = []
    for figure, target, higher in TARGETS:
        ours = [r["ours"][figure] for r in rounds]
        theirs = [r["original"][figure] for r in rounds]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        ratio = median(ratios)
        met = None if target is None else (ratio >= target if higher else ratio <= target)
        row = {"figure": figure, "ours": median(ours), "original": median(theirs),
               "ratio": ratio, "ratios": [round(x, 3) for x in ratios],
               "target": target, "higher_is_better": higher, "met": met}
        if with_redis:
            redis_figures = [r["redis"][figure] for r in rounds]
            redis_ratios = [a / b for a, b in zip(ours, redis_figures, strict=True)]
            row.update({"redis": median(redis_figures), "redis_ratio": median(redis_ratios),
                        "redis_ratios": [round(x, 3) for x in redis_ratios]})
        table.append(row)
    for figure, reference in EXTENSION_FIGURES.items():
        ours = [r["ours"][figure] for r in rounds]
        theirs = [r["original"][reference] for r in rounds]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        table.append({"figure": f"{figure} (vs plain)", "ours": median(ours),
                      "original": median(theirs), "ratio": median(ratios),
                      "ratios": [round(x, 3) for x in ratios], "target": None,
                      "higher_is_better": True, "met": None})
    print()
    print(f"ours vs the original: medians of {args.rounds} round(s); ratio = ours / original "
          "of the same round (rps, jobs/s; bytes per job for memory)")
    print_table(["figure", "ours", "original", "ratio", "per round", "target", "met"],
                [[t["figure"], t["ours"], t["original"], t["ratio"],
                  " ".join(f"{x:.2f}" for x in t["ratios"]),
                  "-" if t["target"] is None else
                  f"{'>=' if t['higher_is_better'] else '<='} {t['target']}",
                  "-" if t["met"] is None else ("yes" if t["met"] else "no")] for t in table])
    if with_redis:
        print()
        print("ours vs Redis, same rounds (XADD for ADDJOB, RPOP for GETJOB NOHANG, a stream "
              "cycle, a stream entry's memory); ratio = ours / Redis")
        print_table(["figure", "ours", "Redis", "ratio", "per round"],
                    [[t["figure"], t["ours"], t["redis"], t["redis_ratio"],
                      " ".join(f"{x:.2f}" for x in t["redis_ratios"])]
                     for t in table if "redis" in t])
    return {"requests": {str(k): v for k, v in requests.items()}, "cycle_jobs": cycle_jobs,
            "memory_jobs": memory_jobs, "with_redis": with_redis, "table": table,
            "rounds": rounds}
