"""AOF benchmarks (not tests): ADDJOB throughput by fsync policy, and rewrite stalls.

Throughput (default)::

    python -m benchmarks.aof_throughput [--jobs 30000] [--clients 8] [--pipeline 1,32]

starts one real node per configuration (``appendonly no``, ``everysec``,
``always``), sends the same ADDJOB load to each, and prints jobs/s and each
configuration's throughput relative to ``appendonly no``, all in one run.
The client side uses raw sockets with pre-encoded commands and hiredis, in
threads, so that it is not the bottleneck.

Rewrite stall::

    python -m benchmarks.aof_throughput --rewrite-stall 1000000 [--writer]

writes an AOF of N jobs directly (with the node's own encoder, much faster
than N ADDJOBs), starts a node on it (reports the load time), then runs
BGREWRITEAOF while a client sends PING after PING on its own connection and
records every round trip: the worst one is the longest time the event loop
did not serve clients.  The same is measured for as long without a rewrite
(baseline) to separate the rewrite's stalls from other ones (such as
Python's garbage collector).  ``--writer`` adds a client doing ADDJOB+ACKJOB
during the rewrite.  It also times ``os.fork()`` of a process holding the
same N jobs, the cost a fork-based rewrite would pay in the event loop.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import hiredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.process import DisqueProcess, wait_for


def encode(*args: bytes | str | int) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        raw = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(parts)


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()

    def call_many(self, payload: bytes, count: int) -> list:
        self.sock.sendall(payload)
        replies: list = []
        while len(replies) < count:
            reply = self.reader.gets()
            if reply is False:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("server closed the connection")
                self.reader.feed(data)
                continue
            replies.append(reply)
        return replies

    def call(self, *args: bytes | str | int) -> Any:
    # Any: a RESP reply is bytes, int, a list or an error, by command.
        return self.call_many(encode(*args), 1)[0]

    def close(self) -> None:
        self.sock.close()


def info(client: RawClient, section: str = "persistence") -> dict[str, str]:
    text = client.call("INFO", section).decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


# --------------------------------------------------------------------------
# Throughput
# --------------------------------------------------------------------------

def run_load(port: int, jobs: int, clients: int, pipeline: int, body: bytes) -> float:
    per_client = jobs // clients
    command = encode("ADDJOB", "bench", body, 0)
    errors: list[str] = []

    def worker() -> None:
        client = RawClient(port)
        try:
            done = 0
            while done < per_client:
                n = min(pipeline, per_client - done)
                for reply in client.call_many(command * n, n):
                    if not isinstance(reply, bytes) or not reply.startswith(b"D-"):
                        errors.append(repr(reply))
                done += n
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} bad replies, e.g. {errors[0]}")
    return per_client * clients / elapsed


def throughput(args: argparse.Namespace) -> None:
    configs = [("appendonly no", ["--appendonly", "no"]),
               ("everysec", ["--appendonly", "yes", "--appendfsync", "everysec"]),
               ("always", ["--appendonly", "yes", "--appendfsync", "always"])]
    body = b"x" * args.body_size
    pipelines = [int(p) for p in args.pipeline.split(",")]
    root = Path(tempfile.mkdtemp(prefix="aof-bench-"))
    results: dict[tuple[str, int], float] = {}
    try:
        for pipeline in pipelines:
            for name, flags in configs:
                best = 0.0
                for attempt in range(args.repeat):
                    node = DisqueProcess(root / f"{name.split()[0]}-{pipeline}-{attempt}", *flags)
                    node.start()
                    try:
                        run_load(node.port, min(2000, args.jobs), args.clients, pipeline, body)
                        best = max(best, run_load(node.port, args.jobs, args.clients, pipeline,
                                                  body))
                    finally:
                        node.kill()
                results[(name, pipeline)] = best
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"ADDJOB throughput, {args.jobs} jobs of {args.body_size} bytes, "
          f"{args.clients} clients, best of {args.repeat}")
    print(f"{'config':<16}{'pipeline':>9}{'jobs/s':>12}{'vs no AOF':>11}")
    for pipeline in pipelines:
        base = results[("appendonly no", pipeline)]
        for name, _ in configs:
            value = results[(name, pipeline)]
            print(f"{name:<16}{pipeline:>9}{value:>12.0f}{value / base:>10.0%}")


# --------------------------------------------------------------------------
# Rewrite stalls
# --------------------------------------------------------------------------

def write_aof(path: Path, jobs: int, body_size: int) -> None:
    from disque.aof import loadjob_record
    from disque.job import FLAG_BCAST_QUEUED, Job, JobIdGenerator, JobState

    node_id = "ab" * 20
    ids = JobIdGenerator(node_id)
    now = int(time.time() * 1000)
    delivered = frozenset([node_id])
    body = b"x" * body_size
    with open(path, "wb", buffering=1 << 20) as fh:
        for i in range(jobs):
            job = Job(ids.next_id(86400, 300), b"queue%d" % (i % 100), body,
                      state=JobState.QUEUED, repl=1, ctime=now * 1_000_000 + i,
                      etime=now + 86_400_000, retry=300, delivered=delivered)
            job.flags = FLAG_BCAST_QUEUED
            fh.write(loadjob_record(job))


class Pinger(threading.Thread):
    """PING after PING on its own connection, recording each round trip."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port)
        self.samples: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        ping = encode("PING")
        while not self.stop.is_set():
            t0 = time.perf_counter()
            self.client.call_many(ping, 1)
            self.samples.append(time.perf_counter() - t0)

    def report(self, label: str) -> str:
        samples = sorted(self.samples)
        if not samples:
            return f"{label}: no samples"
        def pct(p: float) -> float:
            return samples[min(len(samples) - 1, int(len(samples) * p))] * 1000
        return (f"{label}: {len(samples)} PINGs, p50 {pct(0.5):.2f} ms, p99 {pct(0.99):.2f} ms, "
                f"p99.9 {pct(0.999):.2f} ms, max {samples[-1] * 1000:.2f} ms")


class Writer(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.client = RawClient(port)
        self.stop = threading.Event()
        self.added = 0

    def run(self) -> None:
        while not self.stop.is_set():
            replies = self.client.call_many(encode("ADDJOB", "w", "y" * 100, 0) * 16, 16)
            self.client.call_many(encode("ACKJOB", *replies[:8]), 1)
            self.added += 16


def rewrite_stall(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="aof-stall-"))
    try:
        node_dir = root / "node"
        node_dir.mkdir()
        t0 = time.perf_counter()
        write_aof(node_dir / "appendonly.aof", args.rewrite_stall, args.body_size)
        size = (node_dir / "appendonly.aof").stat().st_size
        print(f"wrote an AOF of {args.rewrite_stall} jobs, {size / 1e6:.0f} MB, in "
              f"{time.perf_counter() - t0:.1f} s")
        node = DisqueProcess(node_dir, "--appendonly", "yes", "--appendfsync", args.fsync,
                             "--maxmemory", "20gb")
        t0 = time.perf_counter()
        node.start(timeout=600)
        print(f"node started (AOF loaded) in {time.perf_counter() - t0:.1f} s")
        try:
            control = RawClient(node.port)
            print("registered_jobs:", info(control, "jobs")["registered_jobs"])
            # Baseline: the same measurement without a rewrite.
            pinger = Pinger(node.port)
            writer = Writer(node.port) if args.writer else None
            pinger.start()
            if writer:
                writer.start()
            time.sleep(args.baseline)
            pinger.stop.set()
            pinger.join()
            if writer:
                writer.stop.set()
                writer.join()
            print(pinger.report(f"baseline {args.baseline:.0f} s, no rewrite"
                                + (", with the writer" if writer else "")))

            pinger = Pinger(node.port)
            writer = Writer(node.port) if args.writer else None
            pinger.start()
            if writer:
                writer.start()
            t0 = time.perf_counter()
            assert control.call("BGREWRITEAOF").startswith(b"Background")
            wait_for(lambda: info(control)["aof_rewrite_in_progress"] == "0", timeout=600,
                     interval=0.05, message="the rewrite to finish")
            elapsed = time.perf_counter() - t0
            pinger.stop.set()
            pinger.join()
            if writer:
                writer.stop.set()
                writer.join()
            fields = info(control)
            print(f"rewrite of {fields['aof_last_rewrite_jobs']} jobs took {elapsed:.1f} s; "
                  f"AOF {size / 1e6:.0f} MB -> {int(fields['aof_current_size']) / 1e6:.0f} MB; "
                  f"longest step in the server {fields['aof_last_rewrite_max_step_ms']} ms"
                  + (f"; writer added {writer.added} jobs meanwhile" if writer else ""))
            print(pinger.report("during the rewrite"))
            control.close()
        finally:
            node.kill()
            for line in node.log_text().splitlines():
                if "rewrit" in line or "loaded" in line:
                    print("  server log:", line.split(" ", 4)[-1])
        if args.fork:
            fork_cost(node_dir / "appendonly.aof")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fork_cost(path: Path) -> None:
    """Time os.fork() in a process holding the jobs (what a forking rewrite costs)."""
    import gc

    from disque.aof import read_aof

    gc.disable()
    jobs = read_aof(str(path)).jobs
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        samples.append(time.perf_counter() - t0)
        os.waitpid(pid, 0)
    print(f"os.fork() with {len(jobs)} jobs in memory: "
          + ", ".join(f"{s * 1000:.1f} ms" for s in samples)
          + " (the parent is stopped for this long; then every page the child touches — "
          "reference counts make that all of them — is copied)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--pipeline", default="1,32", help="comma-separated depths")
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--rewrite-stall", type=int, metavar="N", default=0,
                        help="measure the rewrite of an AOF of N jobs instead")
    parser.add_argument("--writer", action="store_true", help="with --rewrite-stall")
    parser.add_argument("--fsync", default="everysec", help="with --rewrite-stall")
    parser.add_argument("--baseline", type=float, default=5.0, help="with --rewrite-stall")
    parser.add_argument("--fork", action="store_true", help="with --rewrite-stall: time fork()")
    args = parser.parse_args()
    if args.rewrite_stall:
        rewrite_stall(args)
    else:
        throughput(args)


if __name__ == "__main__":
    main()
