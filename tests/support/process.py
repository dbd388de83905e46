"""Start real ``disque-server`` processes for tests (and benchmarks).

Servers listen on port 0: the kernel picks a free port and the node logs it
("Ready to accept connections on 127.0.0.1:PORT"), so tests never race for
ports.  Waiting is always a poll with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis
import redis

READY = re.compile(rb"Ready to accept connections on \S+:(\d+)")


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01,
             message: str | Callable[[], str] = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes.

    ``message`` may be a callable, evaluated only on timeout, to describe the
    state the test was stuck in.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            described = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout}s waiting for {described}")
        time.sleep(interval)


#: A node's cluster bus listens on port + 10000, so client ports above this
#: are refused by the server (as by the original).
MAX_NODE_PORT = 55535


def free_port() -> int:
    """A loopback port nobody listens on now, usable as a node's client port."""
    return free_ports(1)[0]


def port_free_on(addresses: list[str]) -> int:
    """A port free for a node (client and bus) on every one of ``addresses``
    (nodes on several loopback addresses that must share one port, as pods do)."""
    while True:
        port = free_port()
        socks = []
        try:
            for address in addresses:
                for p in (port, port + 10000):
                    sock = socket.socket()
                    socks.append(sock)
                    sock.bind((address, p))
            return port
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nobody listens on now, each usable
    as a node's client port (at most MAX_NODE_PORT: the bus is at + 10000).

    Each is held bound until all are picked: two free_port() calls in a row
    may get the same port back (it was released in between), and a node
    given it twice (TLS and metrics) cannot start.  Its bus port (+ 10000)
    must be free too: it lies in the kernel's ephemeral range, where another
    process's connection may hold it ("address already in use" at start).
    """
    picked: list[socket.socket] = []
    held: list[socket.socket] = []  # every socket bound here, rejected ports' too
    try:
        while len(picked) < count:
            sock = socket.socket()
            held.append(sock)
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port > MAX_NODE_PORT:
                continue
            bus = socket.socket()
            held.append(bus)
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            picked.append(sock)
        return [sock.getsockname()[1] for sock in picked]
    finally:
        for sock in held:
            sock.close()


class DisqueProcess:
    """One disque-server process in its own directory."""

    def __init__(self, workdir: Path, *args: str, config_file: Path | None = None,
                 program: list[str] | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.args = list(args)
        self.config_file = config_file
        # What to run instead of ``python -m disque.server`` (the benchmarks' floor node).
        self.program = program or [sys.executable, "-m", "disque.server"]
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "server.log"
        self._clients: list[redis.Redis] = []

    def start(self, timeout: float = 15.0, port: int | None = None) -> DisqueProcess:
        cmd = list(self.program)
        if self.config_file is not None:
            cmd.append(str(self.config_file))
        use_port = self.port if port is None and self.port else (port or 0)
        cmd += ["--port", str(use_port), "--dir", str(self.workdir), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        # The log may hold earlier runs: only accept a line written by this process.
        before = self.log_path.read_bytes().count(b"Ready to accept")

        def ready() -> int | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"disque-server exited with {self.proc.returncode}:\n"
                                     f"{self.log_text()}")
            log = self.log_path.read_bytes()
            ports = READY.findall(log)
            return int(ports[-1]) if ports and log.count(b"Ready to accept") > before else None

        self.port = wait_for(ready, timeout, message="disque-server to be ready")
        return self

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client (RESP2 unless told otherwise)."""
        kwargs.setdefault("protocol", 2)
        kwargs.setdefault("socket_timeout", 30)
        client = redis.Redis(host="127.0.0.1", port=self.port, **kwargs)
        self._clients.append(client)
        return client

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait (graceful shutdown)."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("disque-server did not stop on SIGTERM") from None
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def restart(self, timeout: float = 15.0) -> DisqueProcess:
        """Start again on the same port and directory."""
        port = self.port
        self.stop()
        return self.start(timeout, port=port)


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the node closes ``sock`` within ``timeout`` (reading whatever it sends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True
    return False


def raw_command(port: int, *args: object, timeout: float = 10.0) -> object:
    """Send one command over a fresh socket and return the parsed reply as is.

    For replies that redis-py would post-process (INFO, PING, COMMAND...).
    Error replies come back as ``hiredis.ReplyError`` instances.
    """
    import socket

    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    reader = hiredis.Reader()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        while True:
            reply = reader.gets()
            if reply is not False:
                return reply
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed before a reply")
            reader.feed(chunk)
