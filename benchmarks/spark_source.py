"""Spark source benchmark (not a test): jobs/s drained from one node into ``noop``, vs ``rate``.

Throughput (default)::

    python3 -m benchmarks.spark_source [--jobs 200000] [--body-bytes 100] [--json PATH]
    python3 -m benchmarks.spark_source --smoke            # a few thousand jobs, < 60 s
    python3 -m benchmarks.spark_source --standalone [--staging s3]   # see spark_standalone.py
    python3 -m benchmarks.spark_source --pyspark-zips keep   # Spark as pip installs it

starts one real node (``appendonly no``) and one local Spark session
(``local[2]``; by default from a ``SPARK_HOME`` without PySpark's zips, as
the Spark image runs it: spark_standalone.py) and, in the same run:

1. for every source configuration (``--config``, repeatable; by default
   driver fetch with maxJobsPerTrigger 20000 and 100000, FASTACK, executor
   fetch, and 50000 with ``minJobRetry=60s``, with and without
   ``fetchAhead``), pre-fills a fresh queue with ``--jobs`` jobs of
   ``--body-bytes`` bytes (pipelined ADDJOBs, not timed), then times
   ``spark.readStream.format("disque")`` into ``noop`` with
   ``trigger(availableNow=True)``, a fresh checkpoint and stagingPath, from
   ``start()`` until every job is acknowledged (QLEN and the node's
   ``registered_jobs`` are checked to be 0 and printed); this is repeated
   for ``--rounds`` rounds, each ending with the node's fetch + ACK ceiling
   (the client's GETJOB loop then ``ack_many``, Spark idle), and each
   configuration's median run is reported with its per-round ratio to that
   round's ceiling (the target: >= 0.6x);
2. times Spark's built-in ``rate-micro-batch`` source into ``noop`` for the
   same number of rows, in batches of the same sizes (``rowsPerBatch`` =
   ``maxJobsPerTrigger``; median of ``--rate-repeats`` runs), and prints
   disque/rate;
3. sums the query progress' ``durationMs`` per phase (``latestOffset`` is
   ACK of the previous batch + fetch + staging on the driver, ``addBatch``
   the executors reading the rows, ``walCommit``/``commitOffsets`` the
   checkpoint), and what Spark spends outside triggers (query start-up,
   and the final ACK-only ``latestOffset``, which has no progress); per
   run also the node's CPU time and command count (WORKING heartbeats go
   a thousand per WORKINGS) and the busy CPU of the whole machine;
4. measures ceilings without Spark against the same node: the client's
   GETJOB loop alone (``spark_connector.fetch.fetch_jobs``, WITHLEASE as
   the source asks it) followed by
   ``ack_many``, and the source's driver path alone (a
   ``DisqueStreamReader`` driven like Spark drives it, with each step timed).

Before the rounds, ``--warmup-drains`` whole drains (8 by default) let the
JVM's JIT compile Spark's code, as it has in any application that has run
for a while: in a young JVM the compiler threads take ~1 CPU-s per drain
from the query on two cores (each round prints theirs).  ``0`` measures a
young JVM.

``rate`` produces its rows inside the JVM (two columns, no I/O); the disque
rows cross a socket from the node, are staged with fsync, go through a
Python worker as Arrow, and every job is acknowledged.  The ratio is
therefore the cost of a real, at-least-once source relative to a source
that costs nothing; both run the same number of rows in the same batch
sizes on the same session, after a warm-up of both.

``--profile`` adds a cProfile of the driver path (top functions by own time).
The stderr of Spark and of the source (its log lines) goes to ``--log``, so
that the table stays readable; the report counts its lines.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pickle
import pstats
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.redis_tools import jit_cpu_s, machine_cpu_ticks, process_cpu_s
from benchmarks.spark_standalone import Placement, add_arguments, placement, pyspark_zips, zips_line
from disque.client import Client
from tests.support.process import DisqueProcess, wait_for

TARGET_RATIO = 0.15
#: The target of the source's drain against the node's fetch + ACK ceiling.
CEILING_TARGET = 0.6
DEFAULT_CONFIGS = [
    "fetchMode=driver,ackMode=ackjob,maxJobsPerTrigger=20000",
    "fetchMode=driver,ackMode=ackjob,maxJobsPerTrigger=100000",
    "fetchMode=driver,ackMode=fastack,maxJobsPerTrigger=100000",
    "fetchMode=executor,ackMode=ackjob,maxJobsPerTrigger=100000,numPartitions=2",
    # What a user who knows that no job has a RETRY below a minute runs:
    # batches staged ahead without heartbeats, 2 partitions each.
    "fetchMode=driver,ackMode=ackjob,maxJobsPerTrigger=50000,minJobRetry=60s,"
    "jobsPerPartition=25000",
    # The same with each batch fetched when Spark asks for it (and the
    # committed one acknowledged first), not while Spark runs the last one.
    "fetchMode=driver,ackMode=ackjob,maxJobsPerTrigger=50000,minJobRetry=60s,"
    "jobsPerPartition=25000,fetchAhead=false",
]
SMOKE_CONFIGS = ["fetchMode=driver,ackMode=ackjob,maxJobsPerTrigger=1000"]
#: Progress phases in the order they happen in a trigger.
PHASES = ["latestOffset", "getBatch", "walCommit", "queryPlanning", "addBatch",
          "commitOffsets", "triggerExecution"]


def parse_config(spec: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for item in spec.split(","):
        if item.strip():
            key, sep, value = item.partition("=")
            if not sep:
                raise SystemExit(f"--config items are option=value, got {item!r} in {spec!r}")
            options[key.strip()] = value.strip()
    return options


def short_name(options: dict[str, str]) -> str:
    abbrev = {"fetchMode": "", "ackMode": "", "maxJobsPerTrigger": "max=",
              "numPartitions": "parts=", "fetchBatchSize": "fbs="}
    return " ".join(f"{abbrev.get(k, k + '=')}{v}" for k, v in options.items())


def bodies(count: int, size: int, tag: str) -> Iterator[bytes]:
    for i in range(count):
        head = f"{tag}-{i:09d}-".encode()
        yield head + b"x" * max(0, size - len(head))


def prefill(client: Client, queue: str, jobs: int, size: int) -> float:
    t0 = time.perf_counter()
    client.add_jobs(queue, bodies(jobs, size, queue))
    seconds = time.perf_counter() - t0
    queued = client.qlen(queue)
    if queued != jobs:
        raise RuntimeError(f"pre-fill: expected {jobs} jobs in {queue}, found {queued}")
    return seconds


def registered(client: Client) -> int:
    return int(client.info("jobs")["jobs"]["registered_jobs"])


def machine_busy_s() -> float:
    """CPU seconds all cores spent not idle so far (from /proc/stat)."""
    values = machine_cpu_ticks()
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def commands_processed(node: DisqueProcess) -> int:
    with Client(f"127.0.0.1:{node.port}") as client:
        return int(client.info("stats")["stats"]["total_commands_processed"])


@contextmanager
def cpu_usage(node: DisqueProcess, into: dict[str, Any], jvm_pid: int | None = None
              ) -> Iterator[None]:
    """Record the node's CPU seconds and commands, the machine's busy CPU
    seconds, and (``jvm_pid``) the CPU seconds of the JVM's JIT compiler threads."""
    commands0 = commands_processed(node)
    node0, busy0 = process_cpu_s(node.pid), machine_busy_s()
    jit0 = jit_cpu_s(jvm_pid) if jvm_pid is not None else 0.0
    try:
        yield
    finally:
        into["node_cpu_s"] = process_cpu_s(node.pid) - node0
        into["machine_busy_s"] = machine_busy_s() - busy0
        if jvm_pid is not None:
            into["jit_cpu_s"] = jit_cpu_s(jvm_pid) - jit0
        # Minus the INFO of the first reading (the second one is not counted yet).
        into["node_commands"] = commands_processed(node) - commands0 - 1


def source_revision() -> str:
    """The git commit measured (and whether the connector or client differ from it)."""
    import subprocess

    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "spark_connector",
                                "disque"], cwd=repo, text=True, capture_output=True,
                               check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + uncommitted changes in spark_connector/ or disque/" if dirty else "")


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# ---------------------------------------------------------------------------
# Spark
# ---------------------------------------------------------------------------

#: Where runs happen (``--standalone``, ``--staging``): set by main().
PLACEMENT = Placement(master="local[2]")


def spark_session(master: str):
    from spark_connector.session import local_session

    return local_session("disque-source-benchmark", master, {
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
        "spark.driver.memory": "2g",
        **PLACEMENT.conf,
    })


def edges_ms(progress: list[Any], started: float, ended: float) -> dict[str, float]:
    """Start-up (start() to the first trigger) and tail (end of the last trigger to the end).

    ``started``/``ended`` are ``time.time()`` values; progress timestamps are
    the JVM's wall clock on the same machine.
    """
    from datetime import datetime

    if not progress:
        return {"start-up": (ended - started) * 1000, "after last trigger": 0.0}
    first = datetime.fromisoformat(progress[0].timestamp).timestamp()
    last = progress[-1]
    last_end = (datetime.fromisoformat(last.timestamp).timestamp()
                + (last.durationMs or {}).get("triggerExecution", 0) / 1000)
    return {"start-up": (first - started) * 1000, "after last trigger": (ended - last_end) * 1000}


def phase_sums(progress: list[Any]) -> dict[str, int]:
    sums: dict[str, int] = defaultdict(int)
    for p in progress:
        for key, value in (p.durationMs or {}).items():
            sums[key] += int(value)
    return dict(sums)


def drain_with_spark(spark, node: DisqueProcess, client: Client, root: Path, queue: str,
                     options: dict[str, str]) -> dict[str, Any]:
    """Time one availableNow drain of ``queue`` into noop, until all is ACKed.

    ``seconds`` (and ``rate``) is the whole query, ``start()`` until every job
    is acknowledged: what a user waits for.  ``steady_s`` (``steady_rate``)
    starts at the first trigger instead, leaving out Spark's query start-up
    (the first ``latestOffset`` and its fetch are in), the rate a long-running
    query drains at.  The option ``format`` (not passed to the source) names
    another registered build of the source, for before/after in one run.
    """
    jobs = client.qlen(queue)
    options = dict(options)
    source_format = options.pop("format", "disque")
    opts = {"nodes": f"127.0.0.1:{node.port}", "queues": queue,
            "stagingPath": PLACEMENT.staging(root, queue), **options}
    reader = spark.readStream.format(source_format)
    for key, value in opts.items():
        reader = reader.option(key, value)
    started = time.time()
    t0 = time.perf_counter()
    query = (reader.load().writeStream.format("noop")
             .option("checkpointLocation", str(root / f"checkpoint-{queue}"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    terminated = time.perf_counter() - t0
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    # availableNow ACKs the last batch in its final latestOffset, before the
    # query ends: this wait should return at once.  It is timed anyway.
    wait_for(lambda: registered(client) == 0, timeout=60, interval=0.005,
             message="every job acknowledged")
    seconds = time.perf_counter() - t0
    ended = time.time()
    progress = list(query.recentProgress)
    rows = sum(p.numInputRows for p in progress)
    metrics: dict[str, Any] = {}
    if progress and progress[-1].sources:
        raw = progress[-1].sources[0].latestOffset
        metrics = json.loads(raw) if raw else {}
    phases = {**phase_sums(progress), **edges_ms(progress, started, ended)}
    steady = seconds - phases["start-up"] / 1000
    return {"jobs": jobs, "rows": rows, "seconds": seconds, "terminated_s": terminated,
            "rate": jobs / seconds, "steady_s": steady, "steady_rate": jobs / steady,
            "batches": sum(1 for p in progress if p.numInputRows),
            "qlen_after": client.qlen(queue), "registered_after": registered(client),
            "phases_ms": phases, "outside_triggers_ms":
                seconds * 1000 - phases.get("triggerExecution", 0),
            "source_metrics": metrics}


def rate_with_spark(spark, root: Path, rows: int, per_batch: int, name: str,
                    body_bytes: int = 0) -> dict[str, Any]:
    """Time ``rate-micro-batch`` into noop until ``rows`` rows went through.

    ``rate-micro-batch`` under availableNow runs a single batch, so the
    query runs with the default trigger (next batch as soon as one ends)
    and is stopped once the progress shows ``rows`` rows; the rows counted
    are those of the completed batches at that moment.
    """
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per_batch)
          .option("numPartitions", 2).load())
    if body_bytes:
        df = df.selectExpr("timestamp", "value",
                           f"cast(rpad(cast(value as string), {body_bytes}, 'x') as binary)"
                           " as body")
    started = time.time()
    t0 = time.perf_counter()
    query = (df.writeStream.format("noop")
             .option("checkpointLocation", str(root / f"checkpoint-{name}")).start())
    done = 0
    try:
        while done < rows:
            if query.exception() is not None:
                raise RuntimeError(f"rate query failed: {query.exception()}")
            time.sleep(0.02)
            progress = list(query.recentProgress)
            done = sum(p.numInputRows for p in progress)
        seconds = time.perf_counter() - t0
        ended = time.time()
    finally:
        # Stopping interrupts a running batch, which Spark logs as an ERROR
        # ("... is aborting"): expected here, so not shown.
        spark.sparkContext.setLogLevel("OFF")
        query.stop()
        spark.sparkContext.setLogLevel("ERROR")
    phases = {**phase_sums(progress), **edges_ms(progress, started, ended)}
    return {"rows": done, "seconds": seconds, "rate": done / seconds,
            "batches": sum(1 for p in progress if p.numInputRows), "phases_ms": phases,
            "outside_triggers_ms": seconds * 1000 - phases.get("triggerExecution", 0)}


# ---------------------------------------------------------------------------
# Without Spark: the node/client ceiling and the source's driver path
# ---------------------------------------------------------------------------

def client_ceiling(port: int, queue: str, batch_size: int, ack_mode: str) -> dict[str, Any]:
    """The GETJOB loop the source uses (fetch_jobs, with the leases), then
    ack_many: no Spark, no staging."""
    from spark_connector.fetch import fetch_jobs

    with Client(f"127.0.0.1:{port}") as client:
        t0 = time.perf_counter()
        table = fetch_jobs(client, [queue], None, batch_size=batch_size, lease=True).table
        fetched = time.perf_counter() - t0
        ids = table.column("id").to_pylist()
        t1 = time.perf_counter()
        (client.fastack_many if ack_mode == "fastack" else client.ack_many)(ids)
        acked = time.perf_counter() - t1
    n = table.num_rows
    return {"jobs": n, "fetch_s": fetched, "ack_s": acked, "fetch_rate": n / fetched,
            "ack_rate": n / acked, "rate": n / (fetched + acked)}


class StepTimer:
    """Wall time spent in selected functions (wrapped in place, for one run)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        original = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(owner, attr, timed)
        self._undo.append(lambda: setattr(owner, attr, original))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[label] += time.perf_counter() - t0
            self.calls[label] += 1


DRIVER_STEPS = [
    "latestOffset",
    "  ACK (ack_through)",
    "  fetch (GETJOB loop + Arrow table)",
    "  stage (IPC write, fsync)",
    "  lease bookkeeping (hold)",
    "  QLEN",
    "partitions (Arrow IPC per partition)",
    "pickle partitions (what Spark ships)",
    "read (executor side: rows as Arrow)",
    "keeper thread: WORKING heartbeats",
    "stop (joins the lease keeper thread)",
]


def driver_path(port: int, root: Path, queue: str, options: dict[str, str],
                profile: bool) -> dict[str, Any]:
    """Drive a DisqueStreamReader like Spark's driver + executors do, timing each step.

    availableNow, driver fetch mode: latestOffset (ACK of the previous
    batch, fetch, stage, lease), partitions (Arrow IPC of the rows), the
    pickling Spark does to ship partitions, read (what executors run), and
    the final latestOffset that ACKs the last batch.  The lease keeper runs
    in its thread as in Spark; its WORKING heartbeats are timed too.
    """
    from spark_connector import driver as driver_mod
    from spark_connector import staging as staging_mod
    from spark_connector.leases import LeaseKeeper
    from spark_connector.options import SourceConfig
    from spark_connector.schema import source_schema
    from spark_connector.stream_reader import DisqueStreamReader

    opts = {"nodes": f"127.0.0.1:{port}", "queues": queue,
            "stagingPath": PLACEMENT.staging(root, queue), **options}
    config = SourceConfig.from_options(opts, streaming=True)
    timer = StepTimer()
    timer.wrap(driver_mod, "fetch_jobs", "  fetch (GETJOB loop + Arrow table)")
    timer.wrap(staging_mod.StagingArea, "stage_driver_batch", "  stage (IPC write, fsync)")
    timer.wrap(LeaseKeeper, "hold", "  lease bookkeeping (hold)")
    timer.wrap(driver_mod.DriverSide, "_queue_length", "  QLEN")
    timer.wrap(driver_mod.DriverSide, "ack_through", "  ACK (ack_through)")
    timer.wrap(Client, "working_many", "keeper thread: WORKING heartbeats")
    profiler = cProfile.Profile() if profile else None
    rows = 0
    t0 = time.perf_counter()
    try:
        if profiler is not None:
            profiler.enable()
        reader = DisqueStreamReader(config, source_schema(config.body_format))
        reader.prepareForTriggerAvailableNow()
        limit = reader.getDefaultReadLimit()
        start = reader.initialOffset()
        while True:
            with timer.step("latestOffset"):
                end = reader.latestOffset(start, limit)
            if end == start:
                break
            with timer.step("partitions (Arrow IPC per partition)"):
                parts = reader.partitions(start, end)
            with timer.step("pickle partitions (what Spark ships)"):
                shipped = [pickle.dumps(p) for p in parts]
            with timer.step("read (executor side: rows as Arrow)"):
                for blob in shipped:
                    for batch in reader.read(pickle.loads(blob)):
                        rows += batch.num_rows
            start = end
        # Drained and acknowledged: the final latestOffset ACKed the last batch.
        seconds = time.perf_counter() - t0
        if profiler is not None:
            profiler.disable()
        keeper = reader.driver.keeper
        with timer.step("stop (joins the lease keeper thread)"):
            reader.stop()
    finally:
        timer.restore()
    out: dict[str, Any] = {"rows": rows, "seconds": seconds, "rate": rows / seconds,
                           "heartbeats_sent": keeper.heartbeats_sent,
                           "leases_lost": keeper.leases_lost,
                           "steps": {k: {"seconds": v, "calls": timer.calls[k]}
                                     for k, v in timer.seconds.items()}}
    if profiler is not None:
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(25)
        out["profile"] = stream.getvalue()
    return out


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

HEADER = (f"{'source':<46}{'rows':>8}{'batches':>8}{'seconds':>9}{'rows/s':>10}"
          f"{'node cpu':>9}{'2 cores':>8}{'node cmds':>10}{'vs rate':>9}{'QLEN':>6}{'reg':>6}")


def cpu_cells(run: dict[str, Any]) -> str:
    if "node_cpu_s" not in run:
        return f"{'':>27}"
    node = run["node_cpu_s"] / run["seconds"]
    machine = run["machine_busy_s"] / (run["seconds"] * (os.cpu_count() or 1))
    commands = run["node_commands"] if "jobs" in run else ""
    return f"{node:>9.0%}{machine:>8.0%}{commands:>10}"


def run_line(run: dict[str, Any]) -> str:
    if "jobs" in run:  # a disque run
        ratio = f"{run['ratio']:>8.3f}x" if "ratio" in run else f"{'':>9}"
        return (f"{run['name']:<46}{run['jobs']:>8}{run['batches']:>8}{run['seconds']:>9.2f}"
                f"{run['rate']:>10.0f}{cpu_cells(run)}{ratio}{run['qlen_after']:>6}{run['registered_after']:>6}")
    return (f"{run['name']:<46}{run['rows']:>8}{run['batches']:>8}{run['seconds']:>9.2f}"
            f"{run['rate']:>10.0f}{cpu_cells(run)}")


@contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Send file descriptor 2 (ours, and the JVM's and its Python workers') to ``path``.

    Spark's JVM and the source's driver-side Python process inherit it: their
    log lines (the source logs on stderr) go to the file instead of between
    the benchmark's lines.  Restored on exit, before any traceback prints.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def log_summary(path: Path) -> dict[str, int]:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return {"lines": len(lines),
            "lease_lost_warnings": sum(1 for line in lines
                                       if "lease on job" in line and " lost " in line)}


def print_report(args: argparse.Namespace, result: dict[str, Any]) -> None:
    print()
    print(f"command: {result['command']}")
    print(f"revision: {result['revision']} (at start), {result['revision_after']} (at end)")
    print(f"machine: {result['cpus']} CPUs; load average (1/5/15 min) before "
          f"{result['load_before']}, after {result['load_after']}; Spark "
          f"{result['spark_version']}, master {args.master}")
    print(zips_line(result["pyspark_zips"]))
    print(f"{args.jobs} jobs of {args.body_bytes} bytes per run, fresh pre-fill each "
          f"(pipelined ADDJOB, not timed: {result['prefill_rate']:.0f} jobs/s)")
    print()
    print(HEADER)
    print("-" * len(HEADER))
    for run in result["rate"] + result["disque"]:
        print(run_line(run))
    for run in result["rate"]:
        print(f"  {run['name']}: median of rows/s {run['repeats']}")
    print("node cpu: the node's CPU time / wall time; 2 cores: busy CPU time of the whole "
          "machine / (wall x cores);\nnode cmds: commands the node processed during the run "
          "(GETJOB COUNT n, ACKJOB and WORKINGS of n IDs are one each;\n"
          "against an original node WORKING is one per job).")
    print("QLEN, reg: the queue's QLEN and INFO jobs registered_jobs after the run (0, 0 = "
          "drained and every job acknowledged).\n'vs rate': against rate-micro-batch with "
          "rowsPerBatch = maxJobsPerTrigger.  rate rows are made in the JVM (2 columns, no "
          "I/O);\ndisque rows come from a socket, are staged with fsync, cross a Python "
          "worker as Arrow, and are ACKed.")
    best = result["best"]
    verdict = "meets" if best["ratio"] >= TARGET_RATIO else "MISSES"
    print(f"\nbest disque / best rate = {best['disque_rate']:.0f} / {best['rate_rate']:.0f} "
          f"= {best['ratio']:.3f}x ({verdict} the target of >= {TARGET_RATIO}x)\n"
          f"  best disque: {best['disque_name']}; best rate: {best['rate_name']}")

    print("\nwhere the time goes: query progress durationMs summed over all triggers, ms")
    runs = result["disque"] + result["rate"]
    labels = [f"run {i + 1}" for i in range(len(runs))]
    for label, run in zip(labels, runs, strict=True):
        print(f"  {label}: {run['name']}")
    print(f"{'phase':<18}" + "".join(f"{label:>9}" for label in labels))
    for phase in [*PHASES, "start-up", "after last trigger", "outside triggers", "wall"]:
        cells = []
        for run in runs:
            if phase == "outside triggers":
                value = run["outside_triggers_ms"]
            elif phase == "wall":
                value = run["seconds"] * 1000
            else:
                value = run["phases_ms"].get(phase, 0)
            cells.append(f"{value:>9.0f}")
        print(f"{phase:<18}" + "".join(cells))
    print("latestOffset (disque) = on the driver: ACK of the previous batch + GETJOB loop + "
          "staging (fsync) + lease;\naddBatch = executors reading the rows into noop; "
          "start-up = start() to the first trigger; after last trigger\n= for disque the "
          "final, ACK-only latestOffset (Spark reports no progress for it), for rate the "
          "polling lag;\noutside triggers = wall - sum of triggerExecution (start-up, tail, "
          "gaps between triggers).")
    for run in result["disque"]:
        m = run.get("source_metrics") or {}
        if m:
            print(f"  {run['name']}: source metrics at the last progress (before the final "
                  f"ACK): jobsFetched={m.get('jobsFetched')} "
                  f"jobsAcked={m.get('jobsAcked')} leasesLost={m.get('leasesLost')}")

    ceilings = [c["rate"] for c in result["round_ceilings"]]
    print(f"\nagainst the node's fetch + ACK ceiling, per round ({result['rounds']} rounds; "
          f"ceiling: the client's GETJOB loop then ack_many, Spark idle; ceilings jobs/s "
          f"{[round(c) for c in ceilings]}, median {statistics.median(ceilings):.0f}):")
    print("  whole query (start() until every job is acknowledged: what the target "
          "measures):")
    for run in result["disque"]:
        verdict = "meets" if run["ceiling_ratio"] >= CEILING_TARGET else "MISSES"
        print(f"  {run['name']:<62} jobs/s {[round(r) for r in run['round_rates']]}  "
              f"ratios {[round(r, 2) for r in run['round_ratios']]}  median "
              f"{run['ceiling_ratio']:.2f}x ({verdict} {CEILING_TARGET}x)")
    print("  steady state (the first trigger until every job is acknowledged; Spark's query "
          "start-up left out, per round ms in brackets):")
    for run in result["disque"]:
        print(f"  {run['name']:<62} jobs/s {[round(r) for r in run['round_steady_rates']]}  "
              f"ratios {[round(r, 2) for r in run['round_steady_ratios']]}  median "
              f"{run['steady_ceiling_ratio']:.2f}x  (start-up "
              f"{[round(ms) for ms in run['round_startup_ms']]})")
    warmup = result.get("warmup_drains") or []
    print(f"  JIT: {len(warmup)} warm-up drains before the rounds (--warmup-drains), the "
          f"driver JVM's JIT compiler CPU s {[round(d['jit_cpu_s'], 2) for d in warmup]}; "
          "in the rounds:")
    for run in result["disque"]:
        print(f"  {run['name']:<62} JIT compiler CPU s per round "
              f"{[round(s, 2) for s in run['round_jit_cpu_s']]}")

    print("\nceilings without Spark, same node (Spark stopped):")
    for c in result["ceilings"]:
        print(f"  client GETJOB loop alone (fetch_jobs, COUNT {c['batch_size']}), {c['jobs']} "
              f"jobs: {c['fetch_rate']:.0f} jobs/s; then {c['ack_mode']} (ack_many): "
              f"{c['ack_rate']:.0f} jobs/s; fetch + ack: {c['rate']:.0f} jobs/s; node CPU "
              f"{c['node_cpu_s'] / (c['fetch_s'] + c['ack_s']):.0%} of the time")
    d = result["driver_path"]
    print(f"  source driver path alone ({d['name']}, DisqueStreamReader driven in-process "
          f"as Spark does, executor read included{', under cProfile' if 'profile' in d else ''}"
          f"):\n    {d['rows']} rows in "
          f"{d['seconds']:.2f} s = {d['rate']:.0f} rows/s; WORKING heartbeats sent: "
          f"{d['heartbeats_sent']}; leases reported lost: {d['leases_lost']}; node CPU "
          f"{d['node_cpu_s']:.2f} s, {d['node_commands']} commands")
    for label in DRIVER_STEPS:
        step = d["steps"].get(label)
        if step is not None:
            print(f"    {label:<46}{step['seconds']:>8.2f} s{step['calls']:>7} calls")
    logs = result["stderr_log"]
    print(f"\nstderr of Spark and the source: {logs['lines']} lines, of which "
          f"{logs['lease_lost_warnings']} 'lease on job ... lost' warnings "
          f"(kept in {logs['path']})")
    if "profile" in d:
        print("\ncProfile of the source driver path (top functions by own time):")
        print(d["profile"])


def cluster_main(args: argparse.Namespace) -> None:
    """``--cluster``: the same drain from 3 nodes and from 1 node, alternating."""
    from benchmarks.spark_cluster import compare_drain

    jobs = 3000 if args.smoke else (args.jobs if args.jobs != 200_000 else 30_000)
    rounds = 1 if args.smoke else args.rounds
    print(f"stderr of Spark and the source -> {args.log}; load {loadavg()}", flush=True)
    with stderr_to(args.log):
        spark = spark_session(args.master)
        try:
            rows = compare_drain(spark, jobs, args.body_bytes, rounds)
        finally:
            spark.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"cluster": rows, "jobs": jobs, "rounds": rounds, "smoke": args.smoke,
             "revision": source_revision(), "cpus": os.cpu_count(),
             "load_after": loadavg()}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200_000, help="jobs per run")
    parser.add_argument("--body-bytes", type=int, default=100)
    parser.add_argument("--config", action="append", metavar="OPT=V,OPT=V",
                        help="source options of one run (repeatable); default: "
                             + " | ".join(DEFAULT_CONFIGS))
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--fetch-batch-size", type=int, default=1000,
                        help="COUNT of the GETJOB loop in the client ceiling")
    parser.add_argument("--rate-repeats", type=int, default=3,
                        help="rate runs per batch size; the median is reported")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the driver path and print the top functions")
    parser.add_argument("--warmup-drains", type=int, default=8, metavar="N",
                        help="whole drains (--jobs jobs, default options) before the measured "
                             "rounds, so that the JVM's JIT compilation is mostly done, as in "
                             "a long-running application; 0 measures a young JVM (default 8; "
                             "--smoke: at most 1)")
    parser.add_argument("--smoke", action="store_true",
                        help="a few thousand jobs, one configuration (< 60 s)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--log", metavar="PATH", type=Path,
                        default=Path(tempfile.gettempdir()) / "spark_source_bench.stderr.log",
                        help="where stderr of Spark and the source goes (default: %(default)s)")
    parser.add_argument("--cluster", action="store_true",
                        help="instead: drain from a 3-node cluster against 1 node, same run "
                             "(benchmarks/spark_cluster.py; --jobs default 30000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every --config then the fetch + ACK ceiling (each "
                             "config's median run is reported, and its per-round ratio to "
                             "the ceiling); --cluster: rounds per target")
    add_arguments(parser)
    args = parser.parse_args()
    global PLACEMENT
    with placement(args) as PLACEMENT:
        args.master = PLACEMENT.master
        run(args)


def run(args: argparse.Namespace) -> None:
    if args.cluster:
        cluster_main(args)
        return
    if args.smoke:
        args.jobs = min(args.jobs, 3000)
        args.rate_repeats = 1
        args.rounds = 1
        args.warmup_drains = min(args.warmup_drains, 1)
        args.config = args.config or SMOKE_CONFIGS
    configs = [parse_config(spec) for spec in (args.config or DEFAULT_CONFIGS)]

    result: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in
                            ["python3", "-m", "benchmarks.spark_source", *sys.argv[1:]]),
        "revision": source_revision(), "cpus": os.cpu_count(), "load_before": loadavg(),
        "jobs": args.jobs,
        "body_bytes": args.body_bytes, "master": args.master, "smoke": args.smoke,
        "standalone": args.standalone, "staging": args.staging,
        "pyspark_zips": pyspark_zips(),
        "rate": [], "disque": [], "ceilings": [], "round_ceilings": [],
        "rounds": args.rounds}
    root = Path(tempfile.mkdtemp(prefix="spark-source-bench-"))
    node = DisqueProcess(root / "node", "--maxmemory", "8gb")
    node.start()
    client = Client(f"127.0.0.1:{node.port}")
    print(f"node on port {node.port}; stderr of Spark and the source -> {args.log}",
          flush=True)
    try:
        with stderr_to(args.log):
            measure(args, configs, result, root, node, client)
    except BaseException:
        tail = args.log.read_text(errors="replace").splitlines()[-40:]
        print("\n".join(["--- last lines of " + str(args.log), *tail, "---"]),
              file=sys.stderr)
        raise
    finally:
        client.close()
        node.kill()
        shutil.rmtree(root, ignore_errors=True)
    result["revision_after"] = source_revision()
    result["stderr_log"] = {"path": str(args.log), **log_summary(args.log)}
    print_report(args, result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))
        print(f"results written to {args.json}")


def median_rate(args: argparse.Namespace, spark, root: Path, node: DisqueProcess, size: int,
                body_bytes: int) -> dict[str, Any]:
    """The median of ``--rate-repeats`` rate runs (each lasts well under a second)."""
    runs = []
    for i in range(args.rate_repeats):
        cpu: dict[str, Any] = {}
        with cpu_usage(node, cpu):
            run = rate_with_spark(spark, root, args.jobs, size, f"rate-{size}-{body_bytes}-{i}",
                                  body_bytes=body_bytes)
        run.update(cpu)
        runs.append(run)
    runs.sort(key=lambda r: r["rate"])
    median = runs[len(runs) // 2]
    median["repeats"] = [round(r["rate"]) for r in runs]
    return median


def warm_up_the_jit(args: argparse.Namespace, spark, root: Path, node: DisqueProcess,
                    client: Client, jvm_pid: int) -> list[dict[str, float]]:
    """``--warmup-drains`` whole drains (default options) before the measured ones.

    A young JVM compiles Spark's code as its methods get hot, over its first
    drains; its compiler threads' CPU is taken from the query (and its fetch
    ahead) where cores are few.  A long-running application has done this
    long ago; the measured rounds model it.  ``--warmup-drains 0`` measures
    a young JVM instead.  The compiler CPU is the driver's JVM's: with
    ``--standalone`` the executors' JVMs compile too, uncounted.
    """
    drains = []
    for i in range(args.warmup_drains):
        queue = f"jit-warmup{i}"
        prefill(client, queue, args.jobs, args.body_bytes)
        jit0 = jit_cpu_s(jvm_pid)
        run = drain_with_spark(spark, node, client, root, queue, {})
        drains.append({"seconds": run["seconds"], "jit_cpu_s": jit_cpu_s(jvm_pid) - jit0})
        print(f"warm-up drain {i + 1}/{args.warmup_drains}: {run['seconds']:.2f} s, the "
              f"driver JVM's JIT compiler CPU {drains[-1]['jit_cpu_s']:.2f} s", flush=True)
    return drains


def measure(args: argparse.Namespace, configs: list[dict[str, str]], result: dict[str, Any],
            root: Path, node: DisqueProcess, client: Client) -> None:
    spark = spark_session(args.master)
    try:
        result["spark_version"] = spark.version
        prefill_s = 0.0
        # Warm-up: JVM code paths, the data source lookup, and a Python
        # worker for each task slot (as many partitions a batch as slots,
        # run at once: the first real batch would start them otherwise).
        warm = min(2000, args.jobs)
        slots = spark.sparkContext.defaultParallelism
        prefill(client, "warmup", warm, args.body_bytes)
        drain_with_spark(spark, node, client, root, "warmup",
                         {"maxJobsPerTrigger": str(max(1, warm // 2)),
                          "numPartitions": str(slots)})
        rate_with_spark(spark, root, warm, max(1, warm // 2), "rate-warmup")
        jvm_pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
        result["warmup_drains"] = warm_up_the_jit(args, spark, root, node, client, jvm_pid)
        print(HEADER, flush=True)

        sizes: list[int] = []
        by_config: list[list[dict[str, Any]]] = [[] for _ in configs]
        for rnd in range(args.rounds):
            # One round: every configuration, then the fetch + ACK ceiling
            # (Spark idle), so each ratio compares runs minutes apart at most.
            for index, options in enumerate(configs):
                queue = f"bench{rnd}-{index}"
                prefill_s += prefill(client, queue, args.jobs, args.body_bytes)
                cpu: dict[str, Any] = {}
                with cpu_usage(node, cpu, jvm_pid):
                    run = drain_with_spark(spark, node, client, root, queue, options)
                run.update(cpu)
                run["name"] = f"disque {short_name(options)}"
                run["options"] = options
                run["load"] = loadavg()
                print(f"{run_line(run)}   (round {rnd + 1}, load {run['load']})", flush=True)
                if run["qlen_after"] or run["registered_after"]:
                    raise RuntimeError(f"not drained: {run}")
                by_config[index].append(run)
                size = int(options.get("maxJobsPerTrigger", 100_000))
                if size not in sizes:
                    sizes.append(size)
            queue = f"ceiling{rnd}"
            prefill_s += prefill(client, queue, args.jobs, args.body_bytes)
            ceiling = client_ceiling(node.port, queue, args.fetch_batch_size, "ackjob")
            print(f"{'fetch + ACK ceiling (ackjob, Spark idle)':<46}{ceiling['jobs']:>8}"
                  f"{'':>8}{ceiling['fetch_s'] + ceiling['ack_s']:>9.2f}{ceiling['rate']:>10.0f}"
                  f"   (round {rnd + 1})", flush=True)
            result["round_ceilings"].append(ceiling)
        for runs in by_config:
            rates = [r["rate"] for r in runs]
            ratios = [r["rate"] / c["rate"]
                      for r, c in zip(runs, result["round_ceilings"], strict=True)]
            steady = [r["steady_rate"] / c["rate"]
                      for r, c in zip(runs, result["round_ceilings"], strict=True)]
            median = sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]
            median["round_rates"] = rates
            median["round_ratios"] = ratios
            median["ceiling_ratio"] = statistics.median(ratios)
            median["round_steady_rates"] = [r["steady_rate"] for r in runs]
            median["round_steady_ratios"] = steady
            median["steady_ceiling_ratio"] = statistics.median(steady)
            median["round_startup_ms"] = [r["phases_ms"]["start-up"] for r in runs]
            median["round_jit_cpu_s"] = [r["jit_cpu_s"] for r in runs]
            result["disque"].append(median)
        result["prefill_rate"] = (args.jobs * (len(configs) + 1) * args.rounds) / prefill_s

        rate_by_size: dict[int, dict[str, Any]] = {}
        for size in sizes:
            run = median_rate(args, spark, root, node, size, 0)
            run["name"] = f"rate-micro-batch rowsPerBatch={size}"
            run["load"] = loadavg()
            print(f"{run_line(run)}   (load {run['load']})", flush=True)
            rate_by_size[size] = run
            result["rate"].append(run)
        if not args.smoke:
            size = sizes[-1]
            run = median_rate(args, spark, root, node, size, args.body_bytes)
            run["name"] = f"rate-micro-batch {size} + {args.body_bytes}B body col"
            run["load"] = loadavg()
            print(f"{run_line(run)}   (load {run['load']})", flush=True)
            result["rate"].append(run)
        for run in result["disque"]:
            size = int(run["options"].get("maxJobsPerTrigger", 100_000))
            run["ratio"] = run["rate"] / rate_by_size[size]["rate"]
        best_disque = max(result["disque"], key=lambda r: r["rate"])
        best_rate = max(rate_by_size.values(), key=lambda r: r["rate"])
        result["best"] = {"disque_name": best_disque["name"], "disque_rate": best_disque["rate"],
                          "rate_name": best_rate["name"], "rate_rate": best_rate["rate"],
                          "ratio": best_disque["rate"] / best_rate["rate"]}
    finally:
        spark.stop()

    # Ceilings without Spark (the JVM is stopped: the node and the client
    # have the machine to themselves, as a ceiling should).
    driver_runs = [r for r in result["disque"]
                   if r["options"].get("fetchMode", "driver") == "driver"]
    chosen = max(driver_runs, key=lambda r: r["rate"])["options"] if driver_runs else configs[0]
    ack_mode = chosen.get("ackMode", "ackjob")
    prefill(client, "ceiling", args.jobs, args.body_bytes)
    cpu = {}
    with cpu_usage(node, cpu):
        ceiling = client_ceiling(node.port, "ceiling", args.fetch_batch_size, ack_mode)
    ceiling.update(cpu)
    ceiling.update(batch_size=args.fetch_batch_size, ack_mode=ack_mode)
    result["ceilings"].append(ceiling)
    prefill(client, "driverpath", args.jobs, args.body_bytes)
    driver_opts = {**chosen, "fetchMode": "driver"}
    with cpu_usage(node, cpu):
        path = driver_path(node.port, root, "driverpath", driver_opts, args.profile)
    path.update(cpu)
    path["name"] = short_name(driver_opts)
    if client.qlen("driverpath") or registered(client):
        raise RuntimeError("driver path run left jobs behind")
    result["driver_path"] = path
    result["load_after"] = loadavg()


if __name__ == "__main__":
    main()
