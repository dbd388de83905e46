"""The web console against a big node: page times, sampling cost, and its effect on the node.

One node (this checkout's ``disque-server``) is filled with ``--jobs`` jobs
(1,000,000) in ``--queues`` queues (10,000), with pipelined ADDJOBS (100
bodies each, 50 commands per round trip), plus 50 dead-letter queues of 20
jobs each (ADDJOB ... MAXDELIVERIES 1, GETJOB, NACK).  Then a real
``disque-console`` process (``python -m disque.console``) runs over it, and:

``pages``
    every page (``/``, ``/queues`` sorted by length, by name on page 100,
    filtered by a pattern, ``/queues/<name>``, ``/jobs/<id>``,
    ``/dead-letters``, ``/nodes``) is requested ``--requests`` times (40)
    one after the other, each whole response timed at the client: p50, p95
    and max in ms.  The queue table is built once before (its time is
    reported); pages then read it while it is rebuilt in the background, as
    in use.
``sampling``
    the node's CPU (``/proc/<pid>/stat``, user + system) over ``--window``
    seconds (60) with the console running and sampling but no page open,
    and over the same time without the console process, alternating
    ``--rounds`` times (3): the difference is the sampling's cost, in % of
    one core.
``pages_open``
    the same with the busiest pages open (below): the node's CPU the
    console's live pages cost.  Unlike a throughput, CPU time is little
    moved by other processes on the machine, so this is the steadier
    measure of the console's weight on the node.
``load``
    the node's ADDJOB throughput (``redis-benchmark -c 50 -n 100000 ADDJOB
    bench body 0``) and pickup latency (the ``1 consumer`` case of
    :mod:`benchmarks.latency`: an ADDJOB to a consumer blocked in GETJOB,
    ``--pickups`` jobs, 1,000), with the console open on the busiest pages (server-sent
    events connected: the overview, the queues sorted by length and by
    name, a queue, the dead letters, the nodes) and without the console,
    alternating ``--load-rounds`` times (5).  Ratios are with / without of
    the same round, their median reported.

Usage (from the repository root)::

    python3 -m benchmarks.console [--smoke] [--jobs N] [--queues N] [--steps LIST]
                                  [--json PATH]

``--steps`` runs some of ``pages``, ``sampling`` (with ``pages_open``) and
``load`` (all by default).

``--smoke`` fills 20,000 jobs in 200 queues and runs every step briefly: it
keeps the harness working (``tests/benchmarks/test_console_smoke.py``) and
measures nothing worth quoting.  The machine's other load moves these
figures: run it on a quiet machine, and compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from benchmarks.latency import Case, percentile, produce
from benchmarks.redis_tools import (
    REDIS_BENCHMARK,
    benchmark_command,
    info,
    process_cpu_s,
    rss_of,
    run_benchmark,
)
from tests.support.console import ConsoleProcess
from tests.support.process import DisqueProcess, wait_for

#: Bodies per ADDJOBS, and ADDJOBS per round trip, while filling.
PER_QUEUE_BATCH = 100
PIPELINE = 50
DEAD_QUEUES = 50
DEAD_PER_QUEUE = 20
#: The queue the queue and job pages look at (one of the filled ones).
WATCHED = 4242


def queue_name(index: int) -> str:
    return f"q:{index:05d}"


def watched(queues: int) -> str:
    return queue_name(min(WATCHED, queues - 1))


def fill(port: int, jobs: int, queues: int) -> dict[str, Any]:
    """``jobs`` jobs spread evenly over ``queues`` queues, and the dead letters."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, protocol=2, socket_timeout=300)
    started = time.perf_counter()
    per_queue = max(1, jobs // queues)
    pipe = client.pipeline(transaction=False)
    pending = 0
    added = 0
    for q in range(queues):
        name = queue_name(q)
        for start in range(0, per_queue, PER_QUEUE_BATCH):
            count = min(PER_QUEUE_BATCH, per_queue - start)
            bodies = [f'{{"order":{start + i},"queue":"{name}","sku":"A-{i % 17}"}}'
                      for i in range(count)]
            pipe.execute_command("ADDJOBS", name, 0, "BODIES", *bodies)
            pending += 1
            added += count
            if pending >= PIPELINE:
                for reply in pipe.execute():
                    assert isinstance(reply, list), reply
                pending = 0
    if pending:
        pipe.execute()
    filled_s = time.perf_counter() - started
    for d in range(DEAD_QUEUES):
        name = f"d:{d:02d}"
        client.execute_command("ADDJOBS", name, 0, "RETRY", 1, "MAXDELIVERIES", 1, "BODIES",
                               *[f'{{"poison":{i}}}' for i in range(DEAD_PER_QUEUE)])
        taken = client.execute_command("GETJOB", "NOHANG", "COUNT", DEAD_PER_QUEUE, "FROM", name)
        client.execute_command("NACK", *[job[1] for job in taken])
    wait_for(lambda: all(client.execute_command("QLEN", f"d:{d:02d}:dead") == DEAD_PER_QUEUE
                         for d in range(DEAD_QUEUES)), 60, interval=0.1,
             message="the dead letters")
    registered = int(info(port, "jobs")["registered_jobs"])
    client.close()
    return {"jobs": added, "queues": queues, "dead_letters": DEAD_QUEUES * DEAD_PER_QUEUE,
            "registered_jobs": registered, "fill_s": round(filled_s, 1),
            "fill_jobs_per_s": round(added / filled_s)}


def start_console(root: Path, node_port: int) -> ConsoleProcess:
    """A ``disque-console`` process over the node, its data under ``root``."""
    return ConsoleProcess(root, "--nodes", f"127.0.0.1:{node_port}", "--data-dir",
                          str(root / "data")).start()


def pages_of(job_id: str, queue: str) -> dict[str, str]:
    name = quote(queue, safe="")
    return {
        "/ (overview)": "/",
        "/queues (by length)": "/queues",
        "/queues (by name, page 100)": "/queues?sort=name&order=asc&page=100",
        "/queues (pattern q:012*)": "/queues?pattern=q:012*&min_length=1",
        "/queues/<name>": f"/queues/{name}",
        "/jobs/<id>": f"/jobs/{quote(job_id, safe='')}",
        "/dead-letters": "/dead-letters",
        "/nodes": "/nodes",
    }


def time_pages(console: ConsoleProcess, node_port: int, requests: int,
               queue: str) -> dict[str, Any]:
    import httpx
    import redis

    client = redis.Redis(host="127.0.0.1", port=node_port, protocol=2)
    peeked = client.execute_command("QPEEK", queue, 1)
    client.close()
    job_id = peeked[0][1].decode()
    results: dict[str, Any] = {}
    with httpx.Client(base_url=console.url, timeout=120) as web:
        web.get("/")  # the open console's session cookie
        started = time.perf_counter()
        reply = web.get("/api/queues", params={"fresh": "1", "per_page": 1})
        first_table_s = time.perf_counter() - started
        total = reply.json()["total"]
        for label, path in pages_of(job_id, queue).items():
            times: list[float] = []
            sizes: list[int] = []
            for _ in range(requests):
                t0 = time.perf_counter()
                page = web.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                if page.status_code != 200:
                    raise RuntimeError(f"{path}: {page.status_code} {page.text[:300]}")
                sizes.append(len(page.content))
            results[label] = {"p50_ms": round(statistics.median(times), 1),
                              "p95_ms": round(percentile([int(t * 1000) for t in times],
                                                         0.95) / 1000, 1),
                              "max_ms": round(max(times), 1), "bytes": max(sizes),
                              "requests": requests}
            print(f"  {label:<30} p50 {results[label]['p50_ms']:7.1f} ms   "
                  f"p95 {results[label]['p95_ms']:7.1f} ms   max {results[label]['max_ms']:7.1f}"
                  f" ms   {max(sizes) // 1024} KiB", flush=True)
    return {"pages": results, "first_table_s": round(first_table_s, 2),
            "queues_in_table": total}


def node_cpu_over(pid: int, seconds: float) -> float:
    """The node's CPU seconds over the next ``seconds``."""
    before = process_cpu_s(pid)
    time.sleep(seconds)  # a measuring window, not a wait for a condition
    return process_cpu_s(pid) - before


def node_cost(node: DisqueProcess, root: Path, window: float, rounds: int,
              queue: str | None) -> dict[str, Any]:
    """The node's CPU with the console running and without it, alternating;
    with ``queue``, the busiest pages are open (their streams connected)
    while it is measured, else the console only samples."""
    import httpx

    with_console: list[float] = []
    without: list[float] = []
    console_cpu: list[float] = []
    label = "the busiest pages open" if queue else "the console sampling"
    for rnd in range(rounds):
        console = start_console(root / f"cost-{'pages' if queue else 'sampling'}-{rnd}",
                                node.port)
        try:
            def sampled(url: str = console.url) -> bool:
                points = httpx.get(url + "/api/history", params={"series": "used_memory"},
                                   timeout=30).json()["total"]
                return len(points) >= 2

            # Measure once it samples: history has points.
            wait_for(sampled, 60, interval=0.2, message="the sampler's first samples")
            cpu0 = process_cpu_s(console.pid)
            if queue is None:
                with_console.append(node_cpu_over(node.pid, window) / window)
            else:
                with Streams(console.url, queue):
                    with_console.append(node_cpu_over(node.pid, window) / window)
            console_cpu.append((process_cpu_s(console.pid) - cpu0) / window)
        finally:
            console.stop()
        without.append(node_cpu_over(node.pid, window) / window)
        print(f"  round {rnd + 1}: node CPU {with_console[-1] * 100:.2f}% of a core with "
              f"{label}, {without[-1] * 100:.2f}% without; the console itself "
              f"{console_cpu[-1] * 100:.1f}%", flush=True)
    cost = statistics.median(w - o for w, o in zip(with_console, without, strict=True))
    return {"window_s": window, "rounds": rounds,
            "with_console_pct": [round(x * 100, 3) for x in with_console],
            "without_pct": [round(x * 100, 3) for x in without],
            "cost_pct_of_core": round(cost * 100, 3),
            "console_cpu_pct_of_core": [round(x * 100, 2) for x in console_cpu]}


class Streams:
    """Server-sent event streams held open on the busiest pages, read as they come."""

    @staticmethod
    def paths(queue: str) -> tuple[str, ...]:
        return ("/events/overview", "/events/queues", "/events/queues?sort=name&order=asc&page=50",
                f"/events/queue/{quote(queue, safe='')}", "/events/dead-letters",
                "/events/nodes")

    def __init__(self, url: str, queue: str) -> None:
        self.url = url
        self.PATHS = self.paths(queue)
        self.stop = threading.Event()
        self.events = dict.fromkeys(self.PATHS, 0)
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._read, args=(p,), daemon=True)
                        for p in self.PATHS]

    def _read(self, path: str) -> None:
        import httpx

        try:
            with httpx.Client(base_url=self.url, timeout=None) as web:
                web.get("/")
                with web.stream("GET", path) as stream:
                    for line in stream.iter_lines():
                        if line.startswith("event: swap"):
                            self.events[path] += 1
                        if self.stop.is_set():
                            return
        except Exception as exc:  # reported with the results
            self.errors.append(f"{path}: {exc!r}")

    def __enter__(self) -> Streams:
        for thread in self.threads:
            thread.start()
        def updated() -> bool:
            return all(self.events.values())

        def described() -> str:
            return f"every stream's first update: {self.events} {self.errors}"

        wait_for(updated, 60, interval=0.1, message=described)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def load_round(node: DisqueProcess, requests: int, pickups: int) -> dict[str, Any]:
    result = run_benchmark(benchmark_command(node.port, ["ADDJOB", "bench", "body", "0"],
                                             requests=requests))
    case = Case("1 consumer", 1, 1, 1, pickups, pickups)
    times = produce([node], case, pickups)
    return {"addjob_rps": result["rps"], "addjob_p50_ms": result.get("p50_latency_ms"),
            "pickup_p50_us": percentile(times, 0.5) / 1000,
            "pickup_p99_us": percentile(times, 0.99) / 1000}


def load_with_and_without(node: DisqueProcess, root: Path, rounds: int, requests: int,
                          pickups: int, queue: str) -> dict[str, Any]:
    sides: dict[str, list[dict[str, Any]]] = {"with": [], "without": []}
    streams_seen: dict[str, int] = {}
    console_cpu: list[float] = []
    for rnd in range(rounds):
        order = ("without", "with") if rnd % 2 == 0 else ("with", "without")
        for side in order:
            if side == "without":
                sides[side].append(load_round(node, requests, pickups))
            else:
                console = start_console(root / f"load-{rnd}", node.port)
                try:
                    with Streams(console.url, queue) as streams:
                        cpu0, t0 = process_cpu_s(console.pid), time.monotonic()
                        sides[side].append(load_round(node, requests, pickups))
                        console_cpu.append((process_cpu_s(console.pid) - cpu0)
                                           / (time.monotonic() - t0))
                        streams_seen = dict(streams.events)
                        if streams.errors:
                            raise RuntimeError(f"streams failed: {streams.errors}")
                finally:
                    console.stop()
            last = sides[side][-1]
            print(f"  round {rnd + 1}, {side:<7} console: ADDJOB {last['addjob_rps']:9.0f}/s, "
                  f"pickup p50 {last['pickup_p50_us']:6.0f} µs p99 "
                  f"{last['pickup_p99_us']:6.0f} µs", flush=True)
    summary: dict[str, Any] = {"rounds": rounds, "requests": requests, "pickups": pickups,
                               "streams": list(Streams.paths(queue)),
                               "updates_seen": streams_seen,
                               "console_cpu_pct_of_core": [round(c * 100, 1)
                                                           for c in console_cpu]}
    for figure in ("addjob_rps", "pickup_p50_us", "pickup_p99_us"):
        with_values = [r[figure] for r in sides["with"]]
        without_values = [r[figure] for r in sides["without"]]
        # Each round's with / without, then their median (as benchmarks.run
        # does): the two sides of a round ran minutes apart at most, so the
        # machine's drift cancels out better than in a ratio of medians.
        ratios = [w / o for w, o in zip(with_values, without_values, strict=True)]
        summary[figure] = {"with": round(statistics.median(with_values), 1),
                           "without": round(statistics.median(without_values), 1),
                           "ratio": round(statistics.median(ratios), 3),
                           "ratios": [round(r, 3) for r in ratios],
                           "with_all": with_values, "without_all": without_values}
    return summary


#: What a run measures (``--steps``): page times, the node's CPU with the
#: console sampling and with the busiest pages open, ADDJOB and pickups.
STEPS = ("pages", "sampling", "load")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="20,000 jobs in 200 queues, every step briefly")
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=40, help="requests per page")
    parser.add_argument("--window", type=float, default=60.0,
                        help="seconds of node CPU measured per side of a sampling round")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternations with / without the console for each measure")
    parser.add_argument("--load-rounds", type=int, default=5,
                        help="alternations for ADDJOB throughput and pickup latency")
    parser.add_argument("--addjobs", type=int, default=100_000,
                        help="ADDJOBs per redis-benchmark run")
    parser.add_argument("--pickups", type=int, default=1000,
                        help="pickups timed per round (1000: the p99 is the tenth worst)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"the steps to run, of {','.join(STEPS)} (all)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    steps = {s.strip() for s in args.steps.split(",") if s.strip()}
    if not steps or steps - set(STEPS):
        parser.error(f"--steps takes some of {','.join(STEPS)}")
    if args.smoke:
        args.jobs, args.queues, args.requests = 20_000, 200, 5
        args.window, args.rounds, args.addjobs, args.pickups = 2.0, 1, 2000, 50
        args.load_rounds = 1
    # Only redis-benchmark: no Redis server is compared here.
    missing = [] if shutil.which(REDIS_BENCHMARK) else ["redis-benchmark (redis-tools)"]
    try:
        import httpx  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        missing.append(f"{exc.name} (pip install -e '.[console,dev]')")
    if missing:
        print(f"missing {', '.join(missing)}", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-console-"))
    node = DisqueProcess(root / "node", "--appendonly", "no", "--maxmemory", "20gb")
    report: dict[str, Any] = {"smoke": args.smoke, "argv": sys.argv,
                              "cores": os.cpu_count(), "loadavg_before": os.getloadavg()}
    t0 = time.perf_counter()
    try:
        node.start()
        report["node_core"] = info(node.port, "server").get("disque_core", "?")
        print(f"node on port {node.port} ({report['node_core']} core); filling "
              f"{args.jobs} jobs in {args.queues} queues ...", flush=True)
        report["fill"] = fill(node.port, args.jobs, args.queues)
        report["node_rss_mb"] = round(rss_of(node.pid) / 2**20)
        print(f"  {report['fill']}, node RSS {report['node_rss_mb']} MB", flush=True)

        if "pages" in steps:
            pages(args, node, root, report)
        if "sampling" in steps:
            sampling(args, node, root, report)
        if "load" in steps:
            load(args, node, root, report)
    finally:
        node.kill()
        shutil.rmtree(root, ignore_errors=True)
    report["elapsed_s"] = round(time.perf_counter() - t0, 1)
    report["loadavg_after"] = os.getloadavg()
    print(f"\n{report['elapsed_s']} s; load average after: "
          f"{' '.join(f'{x:.2f}' for x in report['loadavg_after'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


def pages(args: argparse.Namespace, node: DisqueProcess, root: Path,
          report: dict[str, Any]) -> None:
    print(f"pages ({args.requests} requests each):", flush=True)
    console = start_console(root / "pages", node.port)
    try:
        report["pages"] = time_pages(console, node.port, args.requests, watched(args.queues))
        report["console_rss_mb"] = round(rss_of(console.pid) / 2**20)
    finally:
        console.stop()
    print(f"  first queue table: {report['pages']['first_table_s']} s for "
          f"{report['pages']['queues_in_table']} queues; console RSS "
          f"{report['console_rss_mb']} MB", flush=True)


def sampling(args: argparse.Namespace, node: DisqueProcess, root: Path,
             report: dict[str, Any]) -> None:
    print(f"sampling cost ({args.rounds} x {args.window:.0f} s each side):", flush=True)
    report["sampling"] = node_cost(node, root, args.window, args.rounds, None)
    print(f"  cost: {report['sampling']['cost_pct_of_core']:.2f}% of a core", flush=True)
    print(f"the node's CPU with the busiest pages open ({args.rounds} x "
          f"{args.window:.0f} s each side):", flush=True)
    report["pages_open"] = node_cost(node, root, args.window, args.rounds,
                                     watched(args.queues))
    print(f"  cost: {report['pages_open']['cost_pct_of_core']:.2f}% of a core", flush=True)


def load(args: argparse.Namespace, node: DisqueProcess, root: Path,
         report: dict[str, Any]) -> None:
    print(f"ADDJOB throughput and pickup latency, console open on "
          f"{len(Streams.paths(''))} live pages vs no console ({args.load_rounds} rounds):",
          flush=True)
    report["load"] = load_with_and_without(node, root, args.load_rounds, args.addjobs,
                                           args.pickups, watched(args.queues))
    figures = report["load"]
    print(f"  ADDJOB {figures['addjob_rps']['with']:.0f}/s with, "
          f"{figures['addjob_rps']['without']:.0f}/s without "
          f"(x{figures['addjob_rps']['ratio']}); pickup p50 x{figures['pickup_p50_us']['ratio']}"
          f", p99 x{figures['pickup_p99_us']['ratio']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
