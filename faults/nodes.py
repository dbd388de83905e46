"""The cluster under test: real disque-server processes, one loopback address each.

Node i listens on 127.0.0.(i+2), client port 7711 and bus port 17711 (the
namespace is ours, so every node can use the default ports).  Processes are
started with PR_SET_PDEATHSIG: if the harness dies, so do its nodes, and the
namespace goes with them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

PORT = 7711
BUS_PORT = PORT + 10000
_PR_SET_PDEATHSIG = 1


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
    _client: redis.Redis | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"{self.ip}:{PORT}"

    def command_line(self) -> list[str]:
        args = [sys.executable, "-m", "disque.server", "--bind", self.ip,
                "--port", str(PORT), "--dir", str(self.workdir),
                "--cluster-node-timeout", str(self.node_timeout_ms),
                "--loglevel", "verbose"]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        return args

    def start(self, timeout: float = 30.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "server.log", "ab") as log:
            self.proc = subprocess.Popen(self.command_line(), stdout=log,
                                         stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
        self.paused = False
        wait_until(self._answers, timeout, what=f"{self.name} to answer")
        self.node_id = self.client().execute_command("CLUSTER", "MYID").decode()

    def _answers(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: see {self.workdir / 'server.log'}")
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
    """``n`` nodes on 127.0.0.2 ... joined into one cluster."""

    def __init__(self, root: Path, n: int, node_timeout_ms: int, aof: list[bool]) -> None:
        self.nodes = [Node(f"n{i + 1}", f"127.0.0.{i + 2}", root / f"n{i + 1}", aof[i],
                           node_timeout_ms) for i in range(n)]

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
