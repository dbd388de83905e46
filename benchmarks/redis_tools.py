"""Helpers for the benchmark harness: a real ``redis-server``, ``redis-benchmark`` runs, INFO.

Kept apart from :mod:`benchmarks.run` so other benchmarks can reuse them.
"""

from __future__ import annotations

import csv
import io
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.support.process import free_port, raw_command, wait_for

REDIS_SERVER = "redis-server"
REDIS_BENCHMARK = "redis-benchmark"


def missing_tools() -> list[str]:
    """The Redis executables the harness needs that are not on PATH."""
    return [name for name in (REDIS_SERVER, REDIS_BENCHMARK) if shutil.which(name) is None]


def tool_version(name: str) -> str:
    try:
        out = subprocess.run([name, "--version"], capture_output=True, text=True, timeout=10)
    except OSError:
        return "missing"
    return out.stdout.strip()


class RedisProcess:
    """A throw-away ``redis-server`` on a free port, no persistence, in its own directory.

    ``wrapper`` runs it under another program (``valgrind --tool=callgrind
    ...``, whose output then goes to ``wrapper.log``); ``args`` are more
    configuration arguments (``--hz 1``).
    """

    def __init__(self, workdir: Path, *args: str, wrapper: tuple[str, ...] = ()) -> None:
        self.workdir = Path(workdir)
        self.args = list(args)
        self.wrapper = list(wrapper)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "redis.log"

    def start(self, timeout: float = 15.0) -> RedisProcess:
        self.port = free_port()
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
               "--logfile", str(self.log_path), *self.args]
        # The wrapper's report (valgrind's) goes to wrapper.log.
        with open(self.workdir / "wrapper.log", "ab") as output:
            self.proc = subprocess.Popen([*self.wrapper, *cmd],
                                         stdout=output if self.wrapper else subprocess.DEVNULL,
                                         stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited with {self.proc.returncode}")
            try:
                return raw_command(self.port, "PING", timeout=1.0) == b"PONG"
            except OSError:
                return False

        wait_for(ready, timeout, interval=0.02, message="redis-server to answer PING")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def info(port: int, section: str) -> dict[str, str]:
    """INFO ``section`` of a node or a Redis server, as a dict of strings."""
    text = raw_command(port, "INFO", section, timeout=60.0)
    assert isinstance(text, bytes), text
    return dict(line.split(":", 1) for line in text.decode().splitlines()
                if ":" in line and not line.startswith("#"))


def rss_of(pid: int) -> int:
    """Resident set size of ``pid`` in bytes, from /proc (0 if unknown)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used so far,
    from /proc/PID/stat: 10 ms ticks."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_s(pid: int, name_part: str) -> float:
    """CPU seconds used so far by a process's threads whose name contains
    ``name_part`` (/proc/PID/task/*/comm, e.g. the JVM's "C2 CompilerThre").

    Live threads only: a thread that ended took its CPU time with it (HotSpot
    ends compiler threads it started beyond the first ones on machines with
    many cores), so a difference of two readings can fall short.
    """
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if name_part not in (task / "comm").read_text():
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def jit_cpu_s(jvm_pid: int) -> float:
    """CPU seconds a JVM's JIT compiler threads (C1 and C2) have used so far."""
    return threads_cpu_s(jvm_pid, "CompilerThre")


def main_thread_cpu_s(pid: int) -> float:
    """CPU seconds a process's main thread has used so far, in nanoseconds'
    resolution (/proc/PID/schedstat), where short runs need more than
    :func:`process_cpu_s`'s ticks; that is the fallback without schedstat."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, IndexError, ValueError):
        return process_cpu_s(pid)


def machine_cpu_ticks() -> list[int]:
    """The machine's CPU time so far by state (/proc/stat's "cpu" line:
    user, nice, system, idle, iowait, irq, softirq, steal, ...), in ticks."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


def benchmark_command(port: int, command: list[str], *, requests: int, clients: int = 50,
                      pipeline: int = 1, keyspace: int = 0,
                      user: str | None = None, password: str | None = None) -> list[str]:
    """``user`` (with ``password``): every connection sends ``AUTH user password``."""
    cmd = [REDIS_BENCHMARK, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
           "-n", str(requests)]
    if user is not None:
        cmd += ["--user", user]
    if password is not None:
        cmd += ["-a", password]
    if pipeline > 1:
        cmd += ["-P", str(pipeline)]
    if keyspace:
        cmd += ["-r", str(keyspace)]
    return [*cmd, "-q", "--csv", *command]


def run_benchmark(cmd: list[str], timeout: float = 600.0) -> dict[str, Any]:
    """Run one ``redis-benchmark --csv`` command and parse its single result row.

    Redis 7 prints ``"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms",
    "p95_latency_ms","p99_latency_ms","max_latency_ms"`` then one row per test.
    """
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}): {proc.stderr}")
    rows = list(csv.reader(io.StringIO(proc.stdout)))
    header = next((i for i, row in enumerate(rows) if row and row[0] == "test"), None)
    if header is None or header + 1 >= len(rows):
        raise RuntimeError(f"no CSV result from {shlex.join(cmd)}:\n{proc.stdout}{proc.stderr}")
    fields = dict(zip(rows[header], rows[header + 1], strict=False))
    result: dict[str, Any] = {"command": shlex.join(cmd), "wall_s": round(elapsed, 3)}
    for key, value in fields.items():
        if key == "test":
            continue
        result[key] = float(value)
    if result.get("rps", 0) <= 0:
        raise RuntimeError(f"no throughput from {shlex.join(cmd)}:\n{proc.stdout}")
    return result
