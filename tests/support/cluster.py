"""Multi-node helpers: start real nodes, join them, read their view.

A node's cluster bus listens on its client port + 10000; our nodes pick a
client port whose bus port is free themselves (``--port 0``).  The original
server (``DISQUE_REFERENCE_SERVER``) needs an explicit port: :func:`bus_free_port`.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from tests.support.process import DisqueProcess, free_port, wait_for

#: Node timeout for cluster tests: short enough for failure tests, long
#: enough that a busy 2-core machine does not flag healthy nodes.
TEST_NODE_TIMEOUT_MS = 2000


def reference_server() -> str | None:
    """The original server's binary, if the environment names an existing one."""
    path = os.environ.get("DISQUE_REFERENCE_SERVER")
    return path if path and os.access(path, os.X_OK) else None


def bus_free_port() -> int:
    """A loopback port free for a client and at + 10000 for the bus."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class ReferenceProcess(DisqueProcess):
    """The original C server, started like ours (``--port``, ``--dir``)."""

    def __init__(self, workdir: Path, *args: str) -> None:
        binary = reference_server()
        assert binary is not None
        super().__init__(workdir, "--bind", "127.0.0.1", *args, program=[binary])

    def start(self, timeout: float = 15.0, port: int | None = None) -> ReferenceProcess:
        self.port = port or self.port or bus_free_port()
        cmd = [*self.program, "--port", str(self.port), "--dir", str(self.workdir), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"reference server exited:\n{self.log_text()}")
            try:
                return redis.Redis(port=self.port, protocol=2).ping()
            except redis.ConnectionError:
                return False

        wait_for(answers, timeout, message="the reference server to answer")
        return self


def node_id(node: DisqueProcess) -> str:
    return node.client().execute_command("CLUSTER", "MYID").decode()


def cluster_view(node: DisqueProcess) -> dict[str, dict[str, Any]]:
    """CLUSTER NODES of ``node``: node ID -> {addr, flags, link}."""
    text = node.client().execute_command("CLUSTER", "NODES").decode()
    view = {}
    for line in text.strip().splitlines():
        fields = line.split()
        view[fields[0]] = {"addr": fields[1], "flags": set(fields[2].split(",")),
                           "ping_sent": int(fields[3]), "pong_received": int(fields[4]),
                           "link": fields[5]}
    return view


def cluster_info(node: DisqueProcess) -> dict[str, str]:
    text = node.client().execute_command("CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def meet(node: DisqueProcess, other: DisqueProcess) -> None:
    assert node.client().execute_command("CLUSTER", "MEET", "127.0.0.1", other.port) == b"OK"


def join(nodes: Sequence[DisqueProcess], chain: bool = False) -> None:
    """Introduce the nodes: all to the first one, or each to the next (a chain)."""
    for i in range(1, len(nodes)):
        meet(nodes[i - 1] if chain else nodes[0], nodes[i])


def fully_joined(nodes: Sequence[DisqueProcess]) -> bool:
    """Every node knows every other one, out of handshake, linked and healthy."""
    ids = {node_id(n) for n in nodes}
    for node in nodes:
        view = cluster_view(node)
        if set(view) != ids:
            return False
        for info in view.values():
            if info["flags"] - {"myself", "noflags"} or info["link"] != "connected":
                return False
        # The original recomputes this in its cron, a little after its view.
        if cluster_info(node)["cluster_reachable_nodes"] != str(len(nodes) - 1):
            return False
    return True


def describe(nodes: Sequence[DisqueProcess]) -> str:
    """Each live node's view, short, for timeout messages."""
    views = []
    for node in nodes:
        if node.alive():
            view = [(k[:6], sorted(v["flags"]), v["link"]) for k, v in cluster_view(node).items()]
            views.append(f"{node.port}: {view}")
    return "; ".join(views)


def wait_joined(nodes: Sequence[DisqueProcess], timeout: float = 20.0) -> None:
    wait_for(lambda: fully_joined(nodes), timeout,
             message=lambda: "a full mesh: " + describe(nodes))


@contextmanager
def with_original(server_factory: Callable[..., DisqueProcess], workdir: Path,
                  ours: int = 2) -> Iterator[tuple[list[DisqueProcess], ReferenceProcess]]:
    """``ours`` of our nodes and one original node (DISQUE_REFERENCE_SERVER),
    fully joined: a mixed cluster, the original killed at the end."""
    mine = [server_factory("--cluster-node-timeout", str(TEST_NODE_TIMEOUT_MS))
            for _ in range(ours)]
    original = ReferenceProcess(workdir / "ref", "--cluster-node-timeout",
                                str(TEST_NODE_TIMEOUT_MS)).start()
    try:
        for node in [original, *mine[1:]]:
            meet(mine[0], node)
        wait_joined([*mine, original])
        yield mine, original
    finally:
        original.kill()


def show(node: DisqueProcess, job_id: bytes) -> dict[bytes, Any] | None:
    """SHOW of ``job_id`` on ``node`` as a dict (None: the node has no copy)."""
    reply = node.client().execute_command("SHOW", job_id)
    return None if reply is None else dict(zip(reply[::2], reply[1::2], strict=True))


def holders(nodes: Sequence[DisqueProcess], job_id: bytes) -> list[DisqueProcess]:
    """The live nodes among ``nodes`` that hold a copy of ``job_id``."""
    return [n for n in nodes if n.alive() and show(n, job_id) is not None]


def hello_priorities(node: DisqueProcess) -> dict[str, int]:
    """HELLO of ``node``: node ID -> priority."""
    return {e[0].decode(): int(e[3]) for e in node.client().execute_command("HELLO")[2:]}


def flags_of(node: DisqueProcess, about: str) -> set[str] | None:
    """The flags ``node`` shows for node ID ``about`` (None if unknown)."""
    info = cluster_view(node).get(about)
    return None if info is None else info["flags"]
