"""Spark sink benchmarks (not tests): jobs/s into one node, and duplicates after a crash.

Throughput (default)::

    python -m benchmarks.spark_sink [--rows 1000000] [--partitions 2] [--master local[2]]
    python -m benchmarks.spark_sink --standalone    # on a standalone cluster (spark_standalone.py)
    python -m benchmarks.spark_sink --pyspark-zips keep   # Spark as pip installs it

starts one real node and a local Spark session, builds one DataFrame of
``--rows`` small rows (``body = "job-<id>"``), writes it to the ``noop``
sink and then, in ``--rounds`` rounds, to ``format("disque")`` and to the
node's own ceilings: the jobs/s the node takes from raw sockets (one per
partition, no Spark, commands encoded in advance, one round trip of
``batchSize`` jobs in flight per socket as in the sink) as ``ADDJOBS`` (the
bulk ceiling the sink is measured against, target >= 0.8x) and as pipelined
``ADDJOB``s (the ceiling of an original node's protocol, for context).  The
order of the three rotates every round; the node is flushed before each
step.  It also counts the commands the node ran per sink write (ADDJOBS:
about rows / batchSize) and the sink's rate into a null node that does no
work (the sink's own cost).

Crash duplicates::

    python -m benchmarks.spark_sink --kill [--rows 200000]

writes with ``dedupKey=true`` on ``local[2,4]`` (tasks may be retried), and
SIGKILLs the Python worker of one partition once a quarter of the rows are
queued; Spark re-runs that task.  It prints how many jobs were added twice
(total minus distinct keys) and checks that none is missing.  In local mode
the Python worker is the process that holds the connection, so killing it
is what a lost executor looks like to Disque.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import hiredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.aof_throughput import RawClient, encode
from benchmarks.redis_tools import jit_cpu_s
from benchmarks.spark_standalone import Placement, add_arguments, placement, pyspark_zips, zips_line
from tests.support.process import DisqueProcess, wait_for

SINK_CLIENT = re.compile(r"name=spark-disque-sink-p(\d+)-(\d+) ")


def null_node(listener: socket.socket) -> None:
    """Just enough of a Disque node to take ADDJOB(S) without doing anything.

    Answers HELLO/CLIENT/AUTH/PING and gives every job the same made-up
    ID (an array of them for ADDJOBS).  Writing to it measures what the sink
    itself costs (Spark -> Arrow -> commands -> socket) once the node is not
    the bottleneck.
    """
    port = listener.getsockname()[1]
    node_id = "0" * 40
    addr = b"127.0.0.1"
    hello = (b"*3\r\n:1\r\n$40\r\n%s\r\n*4\r\n$40\r\n%s\r\n$%d\r\n%s\r\n:%d\r\n:1\r\n"
             % (node_id.encode(), node_id.encode(), len(addr), addr, port))
    job_id = b"$40\r\nD-00000000-000000000000000000000000-0000\r\n"

    def ids(command: list[bytes]) -> bytes:
        bodies = len(command) - [a.upper() for a in command].index(b"BODIES") - 1
        return b"*%d\r\n%s" % (bodies, job_id * bodies)

    def serve(conn: socket.socket) -> None:
        reader = hiredis.Reader()
        # Replies go out per received chunk: without NODELAY, Nagle holds
        # the small ones back and the benchmark measures delayed ACKs.
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while data := conn.recv(1 << 16):
                reader.feed(data)
                out = []
                while (command := reader.gets()) is not False:
                    name = command[0].upper()
                    out.append(job_id if name == b"ADDJOB" else ids(command)
                               if name == b"ADDJOBS" else hello if name == b"HELLO"
                               else b"+OK\r\n")
                conn.sendall(b"".join(out))

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


#: Where runs happen (``--standalone``): set by main().
PLACEMENT = Placement(master="local[2]")


def spark_session(master: str):
    from spark_connector.session import local_session

    return local_session("disque-sink-benchmark", master,
                         {"spark.driver.memory": "2g", **PLACEMENT.conf})


def timed(action) -> float:
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def ceiling_payloads(rows: int, clients: int, batch: int,
                     bulk: bool) -> list[list[tuple[bytes, int]]]:
    """Per socket, the round trips of a raw producer, encoded in advance.

    ``bulk``: one ``ADDJOBS ceiling 5000 BODIES`` of ``batch`` bodies per
    round trip (what the sink sends); else ``batch`` pipelined ``ADDJOB``s
    (what it sent before, and still sends to an original node).  Each round
    trip is ``(payload, replies to read)``.
    """
    per_client = rows // clients
    out = []
    for index in range(clients):
        trips = []
        for done in range(0, per_client, batch):
            bodies = [f"job-{index * per_client + done + i}"
                      for i in range(min(batch, per_client - done))]
            if bulk:
                trips.append((encode("ADDJOBS", "ceiling", 5000, "BODIES", *bodies), 1))
            else:
                trips.append((b"".join(encode("ADDJOB", "ceiling", body, 5000)
                                       for body in bodies), len(bodies)))
        out.append(trips)
    return out


def node_ceiling(port: int, rows: int, clients: int, batch: int, bulk: bool) -> float:
    """Jobs/s the node takes from ``clients`` raw sockets, one round trip of
    ``batch`` jobs in flight on each (as the sink's partitions do), with the
    commands encoded before the clock starts: the bound any client shares."""
    payloads = ceiling_payloads(rows, clients, batch, bulk)
    failures: list[object] = []

    def worker(trips: list[tuple[bytes, int]]) -> None:
        client = RawClient(port)
        try:
            for payload, count in trips:
                replies = client.call_many(payload, count)
                ids = replies[0] if bulk else replies
                if not all(isinstance(reply, bytes) for reply in ids):
                    failures.append(ids)
                    return
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(trips,)) for trips in payloads]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"the ceiling's jobs were refused: {failures[0]!r:.200}")
    return rows // clients * clients / seconds


def flush(port: int) -> None:
    """An empty node before each measurement: no step pays for another's jobs."""
    client = RawClient(port)
    try:
        if client.call("DEBUG", "FLUSHALL") != b"OK":
            raise RuntimeError("DEBUG FLUSHALL failed")
    finally:
        client.close()


def commands_processed(port: int) -> int:
    client = RawClient(port)
    try:
        text = client.call("INFO", "stats").decode()
    finally:
        client.close()
    found = re.search(r"total_commands_processed:(\d+)", text)
    assert found, text
    return int(found.group(1))


def throughput(args: argparse.Namespace, node: DisqueProcess) -> None:
    from benchmarks.run import median, print_table
    from disque.client import Client

    zips_at_start = pyspark_zips()
    spark = spark_session(args.master)
    address = f"127.0.0.1:{node.port}"
    client = Client(address)
    rounds: list[dict[str, float]] = []
    commands: list[int] = []
    try:
        df = (spark.range(0, args.rows, numPartitions=args.partitions)
              .selectExpr("concat('job-', cast(id as string)) as body"))

        def to_noop() -> None:
            df.write.format("noop").mode("overwrite").save()

        def to_disque(queue: str, frame=df, nodes: str = address) -> None:
            (frame.write.format("disque").mode("append").option("nodes", nodes)
             .option("queue", queue).option("batchSize", str(args.batch_size)).save())

        def sink() -> float:
            before = commands_processed(node.port)
            seconds = timed(lambda: to_disque("bench"))
            commands.append(commands_processed(node.port) - before)
            queued = client.qlen("bench")
            if queued != args.rows:
                raise RuntimeError(f"expected {args.rows} jobs in the queue, found {queued}")
            return args.rows / seconds

        steps = {
            "sink": sink,
            "ADDJOBS ceiling": lambda: node_ceiling(node.port, args.ceiling_rows,
                                                    args.partitions, args.batch_size, True),
            "ADDJOB ceiling": lambda: node_ceiling(node.port, args.ceiling_rows,
                                                   args.partitions, args.batch_size, False),
        }
        # Warm up: JVM code paths, Python workers, the data source lookup.
        warm = df.limit(2000)
        warm.write.format("noop").mode("overwrite").save()
        to_disque("warmup", warm.repartition(args.partitions))
        jvm_pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
        warmup_jit = []
        for i in range(args.warmup_writes):
            # Whole writes, so that the JIT has compiled Spark's code as in an
            # application that has run for a while (see spark_source's
            # --warmup-drains): a young JVM's compiler threads take CPU
            # from the sink and the node on the same cores.
            jit0 = jit_cpu_s(jvm_pid)
            seconds = timed(lambda: to_disque("warmup"))
            flush(node.port)
            warmup_jit.append(jit_cpu_s(jvm_pid) - jit0)
            print(f"warm-up write {i + 1}/{args.warmup_writes}: {seconds:.2f} s, the driver "
                  f"JVM's JIT compiler CPU {warmup_jit[-1]:.2f} s", flush=True)
        noop_s = timed(to_noop)
        sink_jit: list[float] = []
        names = list(steps)
        for rnd in range(args.rounds):
            shift = rnd % len(names)  # alternate the order: no step always goes first
            this: dict[str, float] = {}
            for name in names[shift:] + names[:shift]:
                flush(node.port)
                jit0 = jit_cpu_s(jvm_pid)
                this[name] = steps[name]()
                if name == "sink":
                    sink_jit.append(jit_cpu_s(jvm_pid) - jit0)
            rounds.append(this)
            print(f"round {rnd + 1}/{args.rounds}: " + ", ".join(
                f"{name} {rate:.0f}/s" for name, rate in this.items()), flush=True)
        flush(node.port)

        listener = socket.create_server(("127.0.0.1", 0))
        fake = multiprocessing.get_context("fork").Process(target=null_node, args=(listener,),
                                                           daemon=True)
        fake.start()
        try:
            null_address = f"127.0.0.1:{listener.getsockname()[1]}"
            null_s = timed(lambda: to_disque("bench", nodes=null_address))
        finally:
            fake.kill()
            listener.close()
    finally:
        client.close()
        spark.stop()

    print()
    print(f"{args.rows} rows of ~{len('job-') + len(str(args.rows - 1))} bytes, "
          f"{args.partitions} partitions, master {args.master}, batchSize {args.batch_size}, "
          f"{os.cpu_count()} CPUs; ceilings: {args.ceiling_rows} jobs from "
          f"{args.partitions} raw sockets, one round trip of {args.batch_size} jobs in flight "
          f"each, commands encoded in advance; {args.rounds} rounds, order rotated")
    print(zips_line(zips_at_start))
    rows = []
    for name in names:
        figures = [r[name] for r in rounds]
        ratios = [r["sink"] / r[name] for r in rounds]
        rows.append([name, round(median(figures)), " ".join(f"{x:.0f}" for x in figures),
                     "-" if name == "sink" else f"{median(ratios):.3f}x",
                     "" if name == "sink" else " ".join(f"{x:.3f}" for x in ratios)])
    print_table(["run", "median jobs/s", "per round", "sink / this", "per round"], rows)
    print(f"commands the node ran per sink write: {commands} "
          f"({args.rows / median([float(c) for c in commands]):.0f} rows per command)")
    bulk_ratio = median([r["sink"] / r["ADDJOBS ceiling"] for r in rounds])
    print(f"the sink reaches {bulk_ratio:.3f}x the node's ADDJOBS ceiling (target >= 0.8x)")
    print(f"the driver JVM's JIT compiler CPU s: {len(warmup_jit)} warm-up writes "
          "(--warmup-writes) "
          f"{[round(s, 2) for s in warmup_jit]}; sink writes of the rounds "
          f"{[round(s, 2) for s in sink_jit]}")
    print(f"{'noop':<28}{noop_s:>9.2f} s{args.rows / noop_s:>12.0f} rows/s")
    print(f"{'disque, null node':<28}{null_s:>9.2f} s{args.rows / null_s:>12.0f} rows/s "
          "(the sink's own cost)")


def kill_test(args: argparse.Namespace, node: DisqueProcess) -> None:
    from disque.client import Client
    from spark_connector.writer import split_key

    # local[N,F]: F task failures allowed, so the killed task is re-run.
    spark = spark_session("local[2,4]")
    address = f"127.0.0.1:{node.port}"
    client = Client(address)
    killed: list[tuple[int, int, int]] = []

    def killer() -> None:
        wait_for(lambda: client.qlen("crash") >= args.rows // 4, timeout=600, interval=0.005,
                 message="a quarter of the rows")
        listing = node.client().execute_command("CLIENT", "LIST").decode()
        partition, pid = (int(x) for x in SINK_CLIENT.findall(listing)[0])
        os.kill(pid, signal.SIGKILL)
        killed.append((partition, pid, client.qlen("crash")))

    try:
        df = (spark.range(0, args.rows, numPartitions=2)
              .selectExpr("concat('job-', cast(id as string)) as body"))
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        seconds = timed(lambda: df.write.format("disque").mode("append")
                        .option("nodes", address).option("queue", "crash")
                        .option("dedupKey", "true").save())
        thread.join(10)
        total = client.qlen("crash")
        keys: set[str] = set()
        while jobs := client.get_jobs("crash", count=1000, nohang=True):
            keys.update(split_key(job.body)[0] for job in jobs)
    finally:
        client.close()
        spark.stop()
    if not killed:
        raise RuntimeError("the write finished before a worker could be killed; use more --rows")
    partition, pid, at = killed[0]
    print(f"{args.rows} rows in 2 partitions, dedupKey=true, finished in {seconds:.1f} s")
    print(f"killed the Python worker of partition {partition} (pid {pid}) when "
          f"{at} jobs were queued; Spark re-ran the task")
    print(f"jobs queued: {total}; distinct keys: {len(keys)}; missing: {args.rows - len(keys)}; "
          f"duplicates: {total - len(keys)} ({(total - len(keys)) / args.rows:.1%} of the rows)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--batch-size", type=int, default=1000, help="the sink's batchSize")
    parser.add_argument("--ceiling-rows", type=int, default=400_000,
                        help="jobs for each raw node ceiling")
    parser.add_argument("--kill", action="store_true", help="measure crash duplicates instead")
    parser.add_argument("--cluster", action="store_true",
                        help="instead: write to a 3-node cluster against 1 node, same run "
                             "(benchmarks/spark_cluster.py; --rows default 60000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds (sink, ADDJOBS and ADDJOB ceilings; --cluster: per target)")
    parser.add_argument("--warmup-writes", type=int, default=8, metavar="N",
                        help="whole writes (--rows rows) before the rounds, so that the JVM's "
                             "JIT compilation is mostly done, as in a long-running "
                             "application; 0 measures a young JVM (default 8)")
    add_arguments(parser, staging=False)
    args = parser.parse_args()
    global PLACEMENT
    with placement(args) as PLACEMENT:
        args.master = PLACEMENT.master
        run(args)


def run(args: argparse.Namespace) -> None:
    if args.cluster:
        from benchmarks.spark_cluster import compare_sink

        spark = spark_session(args.master)
        try:
            compare_sink(spark, args.rows if args.rows != 1_000_000 else 60_000, args.rounds)
        finally:
            spark.stop()
        return
    root = Path(tempfile.mkdtemp(prefix="spark-sink-bench-"))
    # 1M jobs of a few bytes fit in the default 1gb, but leave room.
    node = DisqueProcess(root / "node", "--maxmemory", "8gb")
    node.start()
    try:
        if args.kill:
            if args.rows == 1_000_000:
                args.rows = 200_000
            kill_test(args, node)
        else:
            throughput(args, node)
    finally:
        node.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
