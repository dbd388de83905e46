"""Health on the metrics port: ``GET /healthz`` (live) and ``GET /readyz`` (ready).

Answered by the node itself (``metrics.py``'s HTTP endpoint, on
``metrics-port``), so a probe costs an HTTP request, not a process.
docs/CLUSTER.md, "Health endpoints", is the guide.  What they mean:

* ``/healthz`` 200 ``ok`` when the event loop answers (a stuck loop does
  not: the probe times out).  While the AOF loads, before the loop runs,
  a thread answers on the same port: ``/healthz`` 200 ``loading``, so a
  startupProbe tells a long load from a dead node.
* ``/readyz`` 200 ``ready`` once the node serves and has *reached the
  cluster once* since it started; 503 with the reason otherwise:
  ``loading`` (the AOF), ``joining`` (not reached yet), ``stopping`` (the
  drain on SIGTERM, or a shutdown).  Reached the cluster means: a PONG
  from any peer; or, for a node with no peer in its table and no handshake
  under way, at once (with ``cluster-discovery``: once its first
  resolution found no one else); or, whatever else, one
  ``cluster-node-timeout`` after the listeners opened (a node whose peers
  are all gone must serve alone).  Once reached it stays: links to peers
  that drop later (a partition, a peer's restart) do not make the node
  unready, only stopping does.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .cluster.node import FLAG_HANDSHAKE

if TYPE_CHECKING:
    from .cluster.discovery import Discovery
    from .state import ServerState

__all__ = ["Health", "LoadingResponder", "bind_sockets"]

log = logging.getLogger("disque.metrics")

#: The longest request head the loading responder reads.
_MAX_HEAD = 8192


class Health:
    """Whether the node is ready (``/readyz``); live is the loop answering."""

    def __init__(self, state: ServerState, stopping: Callable[[], bool],
                 discovery: Callable[[], Discovery | None]) -> None:
        self.state = state
        self.stopping = stopping
        self.discovery = discovery
        self.started_ms = state.clock.now_ms()
        #: Set once: the node reached the cluster (see the module's doc).
        self.reached = False
        #: When and how it was reached (INFO, tests).
        self.reached_ms = 0
        self.reached_by = ""

    def pong(self, node_id: str) -> None:
        """Membership's on_pong: any PONG from a peer reaches the cluster."""
        if not self.reached:
            self._reach("a peer answered")

    def _reach(self, how: str) -> None:
        self.reached = True
        self.reached_ms = self.state.clock.now_ms()
        self.reached_by = how
        log.info("Ready: %s (%d ms after start)", how, self.reached_ms - self.started_ms)

    def ready(self) -> tuple[bool, str]:
        if self.stopping():
            return False, "stopping"
        if not self.reached:
            cluster = self.state.cluster
            alone = not cluster.handshakes and all(
                n is cluster.myself or FLAG_HANDSHAKE in n.flags for n in cluster.nodes.values())
            discovery = self.discovery()
            if alone and (discovery is None or discovery.rounds > 0):
                self._reach("no peer to reach")
            elif (self.state.clock.now_ms() - self.started_ms
                  >= self.state.config.cluster_node_timeout):
                self._reach("no peer answered within cluster-node-timeout")
        if not self.reached:
            return False, "joining"
        return True, "ready"


def bind_sockets(bind: list[str], port: int) -> list[socket.socket]:
    """The metrics port's listening sockets, made before the AOF loads so
    that the probes are answered during the load (LoadingResponder), then
    handed to the event loop."""
    sockets: list[socket.socket] = []
    try:
        for address in bind:
            host = None if address == "*" else address
            for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                           flags=socket.AI_PASSIVE):
                sock = socket.socket(info[0], socket.SOCK_STREAM)
                sockets.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if info[0] == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind(info[4])
                sock.listen(128)
                sock.setblocking(False)
                if host is None:
                    break  # "*": one wildcard socket
    except OSError as err:
        for sock in sockets:
            sock.close()
        raise SystemExit(f"Could not create the metrics TCP listening socket "
                         f"{address}:{port}: {err.strerror}") from None
    return sockets


class LoadingResponder:
    """Answers the metrics port from a thread while the AOF loads (the event
    loop does not run yet): ``/healthz`` 200 ``loading``, ``/readyz`` and
    everything else 503 ``loading``.  One short request at a time, each
    connection closed after its answer."""

    def __init__(self, sockets: list[socket.socket]) -> None:
        self.sockets = sockets
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="disque-loading-health",
                                        daemon=True)
        self.answered = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                readable, _, _ = select.select(self.sockets, [], [], 0.05)
            except (OSError, ValueError):
                return
            for listener in readable:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    continue
                try:
                    self._answer(conn)
                except OSError:
                    pass
                finally:
                    conn.close()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(1.0)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < _MAX_HEAD:
            chunk = conn.recv(4096)
            if not chunk:
                break
            head += chunk
        words = head.split(b"\r\n", 1)[0].split()
        target = words[1].split(b"?", 1)[0] if len(words) == 3 else b""
        if target == b"/healthz":
            status, body = "200 OK", b"loading\n"
        else:
            status, body = "503 Service Unavailable", b"loading\n"
        body_out = b"" if words and words[0] == b"HEAD" else body
        conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body_out)
        self.answered += 1
