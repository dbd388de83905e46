"""The cluster under test: real disque-server processes, one loopback address each.

Node i listens on 127.0.0.(i+2), client port 7711 and bus port 17711 (the
namespace is ours, so every node can use the default ports).  Processes are
started with PR_SET_PDEATHSIG: if the harness dies, so do its nodes, and the
namespace goes with them.

For the clock faults a node runs with libfaketime preloaded (Debian's
``faketime`` package), reading its offset from a file the nemesis writes
(``+45`` seconds ahead, ``-30`` behind, ``+0``); its monotonic clock stays
real, as a stepped system clock leaves CLOCK_MONOTONIC alone.  For the disk
faults an AOF node's directory is a :class:`~faults.disk.SmallDisk`.
"""

from __future__ import annotations

import ctypes
import glob
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from faults.disk import SmallDisk

PORT = 7711
BUS_PORT = PORT + 10000
_PR_SET_PDEATHSIG = 1


def faketime_library() -> str | None:
    """libfaketime's preload library, or None (Debian package ``faketime``)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                   + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    return found[0] if found else None


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def wait_until(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until truthy; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@dataclass
class Node:
    """One node: its address, directory, persistence, and process."""

    name: str
    ip: str
    workdir: Path
    aof: bool
    node_timeout_ms: int
    proc: subprocess.Popen[bytes] | None = None
    paused: bool = False
    node_id: str = ""
    #: The data directory's own small filesystem (disk faults), if any.
    disk: SmallDisk | None = None
    #: libfaketime's offset file (clock faults), if the node runs under it.
    clock_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    _client: redis.Redis | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.ip}:{PORT}"

    @property
    def datadir(self) -> Path:
        return self.disk.data if self.disk is not None else self.workdir

    def command_line(self) -> list[str]:
        args = [sys.executable, "-m", "disque.server", "--bind", self.ip,
                "--port", str(PORT), "--dir", str(self.datadir),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--loglevel", "verbose", *self.extra_args]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        return args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.clock_file is not None:
            library = faketime_library()
            assert library is not None
            if not self.clock_file.exists():
                self.clock_file.write_text("+0\n")
            env.update(LD_PRELOAD=library, FAKETIME_TIMESTAMP_FILE=str(self.clock_file),
                       FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_CACHE_DURATION="1")
        return env

    def set_clock_offset(self, seconds: int) -> None:
        """The node's wall clock from now on: ``seconds`` off the real one."""
        assert self.clock_file is not None
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+d}\n")
        tmp.replace(self.clock_file)   # libfaketime never reads half a file

    def wall_clock(self) -> float:
        """The node's wall clock (TIME), in seconds."""
        sec, usec = self.client().execute_command("TIME")
        return int(sec) + int(usec) / 1e6

    def rss_bytes(self) -> int:
        """The process's resident memory (VmRSS), 0 if it is not running."""
        if not self.alive():
            return 0
        assert self.proc is not None
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "server.log", "ab") as log:
            self.proc = subprocess.Popen(self.command_line(), stdout=log,
                                         stderr=subprocess.STDOUT, env=self.environment(),
                                         preexec_fn=_die_with_parent)
        self.paused = False
        wait_until(self._answers, timeout, what=f"{self.name} to answer")
        self.node_id = self.client().execute_command("CLUSTER", "MYID").decode()

    def _answers(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            lines = (self.workdir / "server.log").read_text(errors="replace").splitlines()
            raise RuntimeError(f"{self.name} exited: {lines[-1] if lines else '?'}")
        try:
            return bool(self.client().ping())
        except redis.RedisError:
            return False

    def client(self, timeout: float = 5.0) -> redis.Redis:
        """The harness's own connection (not the workload's)."""
        if self._client is None:
            self._client = redis.Redis(host=self.ip, port=PORT, protocol=2,
                                       socket_timeout=timeout, socket_connect_timeout=timeout)
        return self._client

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: a crash (a paused process dies too)."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()
        self.paused = False
        self._reset_client()

    def pause(self) -> None:
        if self.alive() and not self.paused:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.alive() and self.paused:
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGCONT)
            self.paused = False

    def stop(self) -> None:
        """SIGTERM (after SIGCONT), then SIGKILL if it does not exit."""
        if self.alive():
            assert self.proc is not None
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reset_client()

    def _reset_client(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def info(self) -> dict[str, str]:
        # redis-py parses INFO into a dict (numbers as ints).
        return {k: str(v) for k, v in self.client().info("all").items()}


class Cluster:
    """``n`` nodes on 127.0.0.2 ... joined into one cluster.

    ``disks``: each AOF node's directory is a small filesystem of its own
    (the caller must be in a private mount namespace); ``faketime``: every
    node runs under libfaketime; ``extra_args``: more directives for all.
    """

    def __init__(self, root: Path, n: int, node_timeout_ms: int, aof: list[bool],
                 disks: bool = False, faketime: bool = False,
                 extra_args: list[str] | None = None) -> None:
        self.nodes = [Node(f"n{i + 1}", f"127.0.0.{i + 2}", root / f"n{i + 1}", aof[i],
                           node_timeout_ms, extra_args=list(extra_args or []))
                      for i in range(n)]
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            if faketime:
                node.clock_file = node.workdir / "faketime.offset"
            if disks and node.aof:
                node.disk = SmallDisk(node.workdir / "disk")

    def start(self, timeout: float = 40.0) -> None:
        for node in self.nodes:
            node.start()
        first = self.nodes[0]
        for node in self.nodes[1:]:
            first.client().execute_command("CLUSTER", "MEET", node.ip, PORT)
        self.wait_healthy(timeout)

    def healthy(self) -> bool:
        """Every node is up, sees all the others reachable, and has no failure flag."""
        want = len(self.nodes) - 1
        try:
            for node in self.nodes:
                if not node.alive() or node.paused:
                    return False
                nodes = node.client().execute_command("CLUSTER", "NODES").decode()
                if any("fail" in line.split()[2] or "handshake" in line.split()[2]
                       for line in nodes.splitlines() if line.strip()):
                    return False
                if int(node.info().get("cluster_reachable_nodes", -1)) != want:
                    return False
        except redis.RedisError:
            return False
        return True

    def wait_healthy(self, timeout: float) -> None:
        wait_until(self.healthy, timeout, interval=0.1, what="a healthy full mesh")

    def flags(self, observer: Node, about: Node) -> set[str]:
        """Flags ``observer`` has for ``about`` in CLUSTER NODES (empty if unknown)."""
        text = observer.client().execute_command("CLUSTER", "NODES").decode()
        for line in text.splitlines():
            fields = line.split()
            if fields and fields[0] == about.node_id:
                return set(fields[2].split(","))
        return set()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        for node in self.nodes:
            if node.disk is not None:
                node.disk.close()
