"""Spark sink benchmarks (not tests): jobs/s into one node, and duplicates after a crash.

Throughput (default)::

    python -m benchmarks.spark_sink [--rows 1000000] [--partitions 2] [--master local[2]]

starts one real node and a local Spark session, builds one DataFrame of
``--rows`` small rows (``body = "job-<id>"``), writes it to the ``noop``
sink and then to ``format("disque")`` in the same run, and prints both
rates and their ratio.  For context it also measures the node's own
ceiling: the same number of pipelined, pre-encoded ADDJOBs sent from raw
sockets (one per partition, no Spark), so the sink's cost can be told
apart from the node's.

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
from tests.support.process import DisqueProcess, wait_for

SINK_CLIENT = re.compile(r"name=spark-disque-sink-p(\d+)-(\d+) ")


def null_node(listener: socket.socket) -> None:
    """Just enough of a Disque node to take ADDJOBs without doing anything.

    Answers HELLO/CLIENT/AUTH/PING and gives every ADDJOB the same made-up
    ID.  Writing to it measures what the sink itself costs (Spark -> Arrow
    -> ADDJOB commands -> socket) once the node is not the bottleneck.
    """
    port = listener.getsockname()[1]
    node_id = "0" * 40
    addr = b"127.0.0.1"
    hello = (b"*3\r\n:1\r\n$40\r\n%s\r\n*4\r\n$40\r\n%s\r\n$%d\r\n%s\r\n:%d\r\n:1\r\n"
             % (node_id.encode(), node_id.encode(), len(addr), addr, port))
    job_id = b"$40\r\nD-00000000-000000000000000000000000-0000\r\n"

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
                    out.append(job_id if name == b"ADDJOB" else hello if name == b"HELLO"
                               else b"+OK\r\n")
                conn.sendall(b"".join(out))

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def spark_session(master: str):
    from spark_connector.session import local_session

    return local_session("disque-sink-benchmark", master, {"spark.driver.memory": "2g"})


def timed(action) -> float:
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def node_ceiling(port: int, rows: int, clients: int, pipeline: int = 1000) -> float:
    """ADDJOB/s the node takes from raw sockets: the bound any client shares."""
    per_client = rows // clients

    def worker(index: int) -> None:
        client = RawClient(port)
        try:
            done = 0
            while done < per_client:
                n = min(pipeline, per_client - done)
                payload = b"".join(
                    encode("ADDJOB", "ceiling", f"job-{index * per_client + done + i}", 5000)
                    for i in range(n))
                for reply in client.call_many(payload, n):
                    if not isinstance(reply, bytes):
                        raise RuntimeError(f"ADDJOB failed: {reply!r}")
                done += n
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return per_client * clients / (time.perf_counter() - t0)


def throughput(args: argparse.Namespace, node: DisqueProcess) -> None:
    from disque.client import Client

    spark = spark_session(args.master)
    address = f"127.0.0.1:{node.port}"
    client = Client(address)
    try:
        df = (spark.range(0, args.rows, numPartitions=args.partitions)
              .selectExpr("concat('job-', cast(id as string)) as body"))

        def to_noop() -> None:
            df.write.format("noop").mode("overwrite").save()

        def to_disque(queue: str, frame=df, nodes: str = address) -> None:
            (frame.write.format("disque").mode("append").option("nodes", nodes)
             .option("queue", queue).option("batchSize", str(args.batch_size)).save())

        # Warm up: JVM code paths, Python workers, the data source lookup.
        warm = df.limit(2000)
        warm.write.format("noop").mode("overwrite").save()
        to_disque("warmup", warm.repartition(args.partitions))
        noop_s = timed(to_noop)
        disque_s = timed(lambda: to_disque("bench"))
        queued = client.qlen("bench")
        if queued != args.rows:
            raise RuntimeError(f"expected {args.rows} jobs in the queue, found {queued}")
        ceiling = node_ceiling(node.port, args.ceiling_rows, args.partitions)

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

    noop_rate, disque_rate = args.rows / noop_s, args.rows / disque_s
    print(f"{args.rows} rows of ~{len('job-') + len(str(args.rows - 1))} bytes, "
          f"{args.partitions} partitions, master {args.master}, batchSize {args.batch_size}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'sink':<28}{'seconds':>9}{'rows/s':>12}")
    print(f"{'noop':<28}{noop_s:>9.2f}{noop_rate:>12.0f}")
    print(f"{'disque':<28}{disque_s:>9.2f}{disque_rate:>12.0f}")
    print(f"{'disque, null node':<28}{null_s:>9.2f}{args.rows / null_s:>12.0f}")
    print(f"disque / noop: {disque_rate / noop_rate:.3f}x (target >= 0.3x); "
          f"with a node that does no work: {noop_s / null_s:.3f}x")
    print(f"node ceiling (raw pipelined ADDJOB, {args.partitions} sockets, "
          f"{args.ceiling_rows} jobs): {ceiling:.0f} jobs/s; "
          f"the sink reaches {disque_rate / ceiling:.0%} of it")


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
    parser.add_argument("--ceiling-rows", type=int, default=200_000,
                        help="ADDJOBs for the raw node ceiling")
    parser.add_argument("--kill", action="store_true", help="measure crash duplicates instead")
    parser.add_argument("--cluster", action="store_true",
                        help="instead: write to a 3-node cluster against 1 node, same run "
                             "(benchmarks/spark_cluster.py; --rows default 60000)")
    parser.add_argument("--rounds", type=int, default=3, help="--cluster: rounds per target")
    args = parser.parse_args()
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
