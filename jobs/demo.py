"""The whole product in one command: node -> Spark producer -> Spark streaming consumer.

Starts a Disque node (127.0.0.1:7711 unless taken or ``--port`` says
otherwise, AOF on, in ``<workdir>/node``), writes a generated order-events
dataset to the ``orders`` queue with the Spark sink, drains the queue with
the streaming source (``trigger(availableNow=True)``) into windowed
aggregates in Parquet, shows progress, prints a summary, and stops
everything it started, also on Ctrl-C.

    python -m jobs.demo                   # 20 000 events
    python -m jobs.demo --events 200000
    python -m jobs.demo --short           # 2 000 events, what CI runs
    python -m jobs.demo --nodes 3         # a local 3-node cluster (7711-7713)

With ``--nodes 3`` it starts three nodes and joins them into one cluster
(CLUSTER MEET, then waits until each sees the others), the sink spreads
its partitions over them, the source fetches from all of them in Spark
tasks (``fetchMode=executor``), and the summary says how many jobs each
node received and delivered.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

QUEUE = "orders"


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def join_cluster(ports: list[int], timeout: float = 30.0) -> None:
    """CLUSTER MEET every node with the first; wait until each one reaches all others."""
    from disque.client import Client

    clients = [Client(f"127.0.0.1:{port}") for port in ports]
    try:
        for port in ports[1:]:
            clients[0].cluster_meet("127.0.0.1", port)
        deadline = time.monotonic() + timeout
        while not all(int(c.cluster_info()["cluster_reachable_nodes"]) == len(ports) - 1
                      for c in clients):
            if time.monotonic() > deadline:
                raise SystemExit(f"the {len(ports)} nodes did not join within {timeout:.0f}s")
            time.sleep(0.05)
    finally:
        for client in clients:
            client.close()


@contextlib.contextmanager
def disque_cluster(workdir: Path, ports: list[int]) -> Iterator[list[tuple[int, int]]]:
    """``len(ports)`` nodes (in ``workdir/node``, ``node2``...), joined; yields (port, pid)s."""
    with contextlib.ExitStack() as stack:
        started = [stack.enter_context(disque_node(workdir / node_dir(i), port))
                   for i, port in enumerate(ports)]
        if len(started) > 1:
            join_cluster([port for port, _ in started])
        yield started


def node_dir(index: int) -> str:
    return "node" if index == 0 else f"node{index + 1}"


@contextlib.contextmanager
def disque_node(workdir: Path, port: int) -> Iterator[tuple[int, int]]:
    """A disque-server child in its own process group; yields (port, pid)."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "server.log"
    log_path.write_bytes(b"")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "disque.server", "--port", str(port), "--dir", str(workdir),
             "--appendonly", "yes"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        marker = b"Ready to accept connections on 127.0.0.1:"
        while marker not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"disque-server did not start:\n{log_path.read_text()}")
            time.sleep(0.05)
        text = log_path.read_bytes()
        actual = int(text.split(marker)[-1].split()[0])
        yield actual, proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()  # graceful: SHUTDOWN semantics, AOF flushed
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


FIRST_BATCH = ("waiting for the first batch (Spark plans the query, then the source "
               "fetches and stages the first jobs)")
#: The same, short enough to leave room for the bar on an 80-column terminal.
FIRST_BATCH_SHORT = "first batch: Spark is starting the query"


def progress_line(elapsed: float, metrics: dict, produced: int) -> str:
    fetched = metrics.get("jobsFetched", 0)
    width = 30
    done = int(width * min(fetched, produced) / max(produced, 1))
    return (f"  [{'#' * done}{'.' * (width - done)}] {fetched}/{produced} consumed, "
            f"{metrics.get('jobsAcked', 0)} acked, {metrics.get('queueLength', 0)} queued "
            f"({elapsed:.0f}s)")


def step(console: Any, message: str) -> contextlib.AbstractContextManager:
    """Show what the demo is doing while it does it: a spinner on a terminal."""
    if console.is_terminal:
        return console.status(message)
    print(f"  {message}", flush=True)
    return contextlib.nullcontext()


def watch_consumption(query: Any, produced: int, console: Any) -> None:
    """Follow the streaming query until it ends: say what it waits for, then a bar.

    Until the first batch is staged Spark is still planning and starting
    the query (seconds on a cold JVM), and the counters are all 0: say so
    rather than repeat "0 consumed".  On a terminal a progress bar follows
    the consumed and acknowledged counts; in a log, one line per change.
    """
    from .stream_aggregates import source_metrics

    began = time.monotonic()
    if not console.is_terminal:
        print(f"  {FIRST_BATCH}", flush=True)
        last = None
        while not query.awaitTermination(2):
            metrics = source_metrics(query)
            counts = (metrics.get("jobsFetched", 0), metrics.get("jobsAcked", 0))
            if counts[0] and counts != last:
                print(progress_line(time.monotonic() - began, metrics, produced), flush=True)
                last = counts
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("  {task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total} consumed, {task.fields[acked]} acked, "
                          "{task.fields[queued]} queued"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(FIRST_BATCH_SHORT, total=produced, acked=0, queued=produced)
        while True:
            done = query.awaitTermination(0.5)
            metrics = source_metrics(query)
            fetched = metrics.get("jobsFetched", 0)
            bar.update(task, completed=min(fetched, produced),
                       description="consuming" if fetched else FIRST_BATCH_SHORT,
                       acked=metrics.get("jobsAcked", 0),
                       queued=metrics.get("queueLength", produced if not fetched else 0))
            if done:
                return


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from . import produce_events, stream_aggregates
    from ._common import spark_session

    workdir: Path = args.workdir.resolve()
    for name in ("dataset", "aggregates", "checkpoint", "staging",
                 *(node_dir(i) for i in range(args.nodes))):
        shutil.rmtree(workdir / name, ignore_errors=True)
    ports = []
    for i in range(args.nodes):
        port = args.port + i if args.port else 0
        if port and not port_free(port):
            print(f"port {port} is taken; using a free port instead")
            port = 0
        ports.append(port)
    console = Console()
    with disque_cluster(workdir, ports) as started:
        nodes = ",".join(f"127.0.0.1:{port}" for port, _ in started)
        if len(started) == 1:
            (port, pid), = started
            print(f"1/3 node up on {nodes} (pid {pid}, AOF in {workdir / 'node'})", flush=True)
        else:
            print(f"1/3 {len(started)} nodes up and joined in one cluster: {nodes} "
                  f"(pids {', '.join(str(pid) for _, pid in started)}, AOF in "
                  f"{workdir}/node*)", flush=True)
        with step(console, "starting Spark (a local JVM: a few seconds, more the first time)"):
            spark = spark_session("disque-demo")
        try:
            with step(console, f"writing {args.events} order events to '{QUEUE}' with the "
                               "Spark sink"):
                dataset = produce_events.write_dataset(workdir / "dataset", args.events, 30)
                began = time.monotonic()
                produced = produce_events.produce(
                    spark, dataset, nodes, QUEUE,
                    partitions=len(started) if len(started) > 1 else None)
            produce_s = time.monotonic() - began
            print(f"2/3 produced {produced} jobs into '{QUEUE}' with the Spark sink "
                  f"in {produce_s:.1f}s", flush=True)
            queued_at = queued_per_node(nodes) if len(started) > 1 else {}

            began = time.monotonic()
            started_at = time.time()
            query = stream_aggregates.build_query(
                spark, nodes=nodes, queue=QUEUE, output=workdir / "aggregates",
                checkpoint=workdir / "checkpoint", staging=workdir / "staging",
                available_now=True, max_jobs_per_trigger=args.max_jobs_per_trigger,
                fetch_mode="executor" if len(started) > 1 else "driver")
            print("3/3 consuming with the streaming source (availableNow):", flush=True)
            watch_consumption(query, produced, console)
            consume_s = time.monotonic() - began
            first_trigger, ended_at = triggers_span(query)
            if query.exception() is not None:
                print(f"the streaming query failed: {query.exception()}")
                return 1
            metrics = stream_aggregates.source_metrics(query)
            windows = spark.read.parquet(str(workdir / "aggregates"))
            window_rows = windows.count()
            in_windows = windows.groupBy().sum("orders").collect()[0][0] or 0
        finally:
            spark.stop()
        queued, registered = settled_counts(nodes)
        consumed = metrics.get("jobsFetched", 0)
        acked = produced - registered
        ok = consumed == produced and registered == 0 and queued == 0
        print("\nsummary")
        print(f"  produced:   {produced} jobs in {produce_s:.1f}s (one Spark batch write, "
              "its planning and task start-up included)")
        print(f"  consumed:   {consumed} jobs in {consume_s:.1f}s, "
              f"{metrics.get('redeliveredSeen', 0)} redelivered")
        if first_trigger is not None and ended_at is not None and ended_at > first_trigger:
            steady_s = ended_at - first_trigger
            print(f"              Spark's query start-up {first_trigger - started_at:.1f}s "
                  "(before it asks the source for a batch), then "
                  f"{consumed / steady_s:,.0f} jobs/s for {steady_s:.1f}s: the stream's rate")
        on_the = "on the node" if len(started) == 1 else "on the nodes"
        print(f"  acked:      {acked} jobs; {queued} still queued, {registered} {on_the}")
        if len(started) > 1:
            fetched_from = {a: n.get("fetched", 0)
                            for a, n in metrics.get("nodes", {}).items()}
            print("  per node:   (queued there by the sink / delivered to the source)")
            for address in nodes.split(","):
                print(f"    {address}  {queued_at.get(address, 0):>7} / "
                      f"{fetched_from.get(address, 0):>7}")
        print(f"  output:     {workdir / 'aggregates'} ({window_rows} window rows, "
              f"{in_windows} orders in closed windows; the newest windows stay open "
              "until later events move the watermark)")
        print(f"  result:     {'OK: every job consumed and acknowledged' if ok else 'INCOMPLETE'}")
    print(f"stopped the {'node' if args.nodes == 1 else 'nodes'}; nothing left running")
    return 0 if ok else 1


def triggers_span(query: Any) -> tuple[float | None, float | None]:
    """When the query's first trigger began and its last one ended (Unix time),
    from its progress reports: before the first, Spark starts the query
    (planning, the source's driver process); between them, batches run.
    (None, None) when the first report is no longer kept (over 100 batches).
    """
    from datetime import datetime

    def at(report: Any) -> float:
        return datetime.fromisoformat(report["timestamp"].replace("Z", "+00:00")).timestamp()

    reports = query.recentProgress
    if not reports or reports[0]["batchId"] != 0:
        return None, None
    last = reports[-1]
    return at(reports[0]), at(last) + last["durationMs"].get("triggerExecution", 0) / 1000


def queued_per_node(nodes: str) -> dict[str, int]:
    """QLEN of the queue on each node: where the sink's partitions put the jobs."""
    from disque.client import Client

    out = {}
    for address in nodes.split(","):
        with Client(address, route_by_job_id=False) as client:
            out[address] = client.qlen(QUEUE)
    return out


def settled_counts(nodes: str, timeout: float = 15.0) -> tuple[int, int]:
    """(jobs queued, jobs registered) summed over the nodes, once the ACKs settled.

    On a cluster an ACK is garbage-collected on every copy's node by
    messages between the nodes, a few milliseconds after the source's
    ACKJOB; wait (bounded) for the counts to reach zero before reporting.
    """
    from disque.client import Client

    deadline = time.monotonic() + timeout
    while True:
        queued = registered = 0
        for address in nodes.split(","):
            with Client(address, route_by_job_id=False) as client:
                queued += client.qlen(QUEUE)
                registered += int(client.info("jobs")["jobs"]["registered_jobs"])
        if (queued == 0 and registered == 0) or time.monotonic() > deadline:
            return queued, registered
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--short", action="store_true", help="2 000 events (CI)")
    parser.add_argument("--port", type=int, default=7711,
                        help="the first node's port, the next nodes' follow; 0: free ports")
    parser.add_argument("--nodes", type=int, default=1, choices=range(1, 10), metavar="N",
                        help="run a local cluster of N nodes (1-9)")
    parser.add_argument("--workdir", type=Path, default=Path("demo-output"))
    parser.add_argument("--max-jobs-per-trigger", type=int, default=5000)
    args = parser.parse_args(argv)
    if args.short:
        args.events = 2000
        args.max_jobs_per_trigger = 500
    # SIGTERM (e.g. from a CI runner) takes the same clean-up path as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        code = run(args)
    except KeyboardInterrupt:
        print("\ninterrupted: stopped the node and Spark", flush=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
