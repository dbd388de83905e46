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

    from disque.client import Client

    from . import produce_events, stream_aggregates
    from ._common import spark_session

    workdir: Path = args.workdir.resolve()
    for name in ("dataset", "aggregates", "checkpoint", "staging", "node"):
        shutil.rmtree(workdir / name, ignore_errors=True)
    port = args.port
    if port and not port_free(port):
        print(f"port {port} is taken; using a free port instead")
        port = 0
    console = Console()
    with disque_node(workdir / "node", port) as (port, pid):
        nodes = f"127.0.0.1:{port}"
        print(f"1/3 node up on {nodes} (pid {pid}, AOF in {workdir / 'node'})", flush=True)
        with step(console, "starting Spark (a local JVM: a few seconds, more the first time)"):
            spark = spark_session("disque-demo")
        try:
            with step(console, f"writing {args.events} order events to '{QUEUE}' with the "
                               "Spark sink"):
                dataset = produce_events.write_dataset(workdir / "dataset", args.events, 30)
                began = time.monotonic()
                produced = produce_events.produce(spark, dataset, nodes, QUEUE)
            produce_s = time.monotonic() - began
            print(f"2/3 produced {produced} jobs into '{QUEUE}' with the Spark sink "
                  f"in {produce_s:.1f}s", flush=True)

            began = time.monotonic()
            query = stream_aggregates.build_query(
                spark, nodes=nodes, queue=QUEUE, output=workdir / "aggregates",
                checkpoint=workdir / "checkpoint", staging=workdir / "staging",
                available_now=True, max_jobs_per_trigger=args.max_jobs_per_trigger)
            print("3/3 consuming with the streaming source (availableNow):", flush=True)
            watch_consumption(query, produced, console)
            consume_s = time.monotonic() - began
            if query.exception() is not None:
                print(f"the streaming query failed: {query.exception()}")
                return 1
            metrics = stream_aggregates.source_metrics(query)
            windows = spark.read.parquet(str(workdir / "aggregates"))
            window_rows = windows.count()
            in_windows = windows.groupBy().sum("orders").collect()[0][0] or 0
        finally:
            spark.stop()
        with Client(nodes) as client:
            queued = client.qlen(QUEUE)
            registered = int(client.info("jobs")["jobs"]["registered_jobs"])
        consumed = metrics.get("jobsFetched", 0)
        acked = produced - registered
        ok = consumed == produced and registered == 0 and queued == 0
        print("\nsummary")
        print(f"  produced:   {produced} jobs ({produced / produce_s:.0f} jobs/s)")
        print(f"  consumed:   {consumed} jobs ({consumed / consume_s:.0f} jobs/s, "
              f"{metrics.get('redeliveredSeen', 0)} redelivered)")
        print(f"  acked:      {acked} jobs; {queued} still queued, {registered} on the node")
        print(f"  output:     {workdir / 'aggregates'} ({window_rows} window rows, "
              f"{in_windows} orders in closed windows; the newest windows stay open "
              "until later events move the watermark)")
        print(f"  result:     {'OK: every job consumed and acknowledged' if ok else 'INCOMPLETE'}")
    print("stopped the node; nothing left running")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--short", action="store_true", help="2 000 events (CI)")
    parser.add_argument("--port", type=int, default=7711, help="0: any free port")
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
